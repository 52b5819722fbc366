//! The guest's clocks after a live migration: moved forward by the time the VM was paused,
//! so the guest sees the pause as time that passed (as it did for everyone talking to it),
//! not as time that never happened. A snapshot restored from disk keeps the clocks it saved:
//! its guest does not see the time it spent on disk (as with QEMU's and Cloud Hypervisor's
//! restore; the guest's NTP corrects its wall clock).
//!
//! KVM's documented migration of the TSC (Documentation/virt/kvm/devices/vcpu.rst,
//! KVM_VCPU_TSC_OFFSET) advances the destination's guest TSC by the host wall-clock time
//! elapsed since the source read it; this does the same with the `IA32_TSC` write the
//! restore already makes, and kvmclock by the same nanoseconds, which is what
//! `KVM_SET_CLOCK` with `KVM_CLOCK_REALTIME` would compute. Both assume the two hosts' wall
//! clocks agree (NTP); a gap that reads negative or over an hour is not applied.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvm_bindings::kvm_clock_data;

use super::{Snapshot, SnapshotError};
use crate::vm::Vm;
use crate::vstate::vm::ioctl;

/// `IA32_TSC`.
const MSR_IA32_TSC: u32 = 0x10;
/// A longer gap than this between the source's reading and now means the hosts' clocks
/// disagree: the clocks are left as saved.
const MAX_GAP: Duration = Duration::from_secs(3600);

/// Now, in nanoseconds since the Unix epoch (CLOCK_REALTIME).
pub fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The time from `then` (a [`realtime_ns`] of another host) to now, if it is plausible.
pub fn since(then: u64) -> Option<Duration> {
    let now = realtime_ns();
    let gap = Duration::from_nanos(now.checked_sub(then)?);
    (gap <= MAX_GAP).then_some(gap)
}

impl Snapshot {
    /// Moves the loaded VM's kvmclock and every vCPU's TSC forward by `by` from what the
    /// snapshot saved (call after [`Snapshot::restore_into`], before the vCPUs run).
    pub fn advance_clocks(&self, vm: &Vm, by: Duration) -> Result<(), SnapshotError> {
        let m = &self.manifest;
        let ns = by.as_nanos() as u64;
        let clock = kvm_clock_data {
            clock: m.kvm.clock.clock.saturating_add(ns),
            flags: 0,
            ..m.kvm.clock
        };
        vm.kvm_vm()
            .set_clock(&clock)
            .map_err(ioctl("KVM_SET_CLOCK"))?;
        for (state, fd) in m.vcpus.iter().zip(vm.vcpus()) {
            let Some(&(_, tsc)) = state.msrs.iter().find(|(i, _)| *i == MSR_IA32_TSC) else {
                continue;
            };
            let khz = crate::vstate::vcpu::tsc_khz(fd)?;
            let ticks = (ns as u128 * khz as u128 / 1_000_000) as u64;
            crate::vstate::vcpu::state::write_msrs(fd, &[(MSR_IA32_TSC, tsc.wrapping_add(ticks))])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_from_the_future_or_over_an_hour_is_not_applied() {
        let now = realtime_ns();
        assert!(
            since(now + 10_000_000_000).is_none(),
            "another host's clock ahead"
        );
        assert!(since(now - 7_200_000_000_000).is_none(), "two hours");
        let g = since(now - 50_000_000).expect("50 ms ago");
        assert!(g >= Duration::from_millis(50) && g < MAX_GAP, "{g:?}");
    }
}
