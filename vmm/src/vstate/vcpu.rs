//! vCPUs: creation with per-vCPU CPUID, the 64-bit entry registers, and the vCPU threads — one
//! per vCPU, named `vcpu0`, `vcpu1`, … (libvirt and the paging engine rely on the names) — that
//! run KVM_RUN and handle exits: port I/O to the PV device or the board's I/O bus (a port
//! nobody owns reads all-ones, writes are dropped, as on an empty ISA bus), MMIO to the bus (a
//! miss stops the VM); anything else stops the VM with a clear message. A thread leaves KVM_RUN when kicked (a signal whose
//! handler sets `kvm_run.immediate_exit`, so no kick is lost), then stops, or parks while the
//! VM is paused. With HLT exits disabled, a test-guest vCPU that has nothing left to run is
//! put in KVM's halted state, so its thread blocks in the host kernel.

use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

use super::vm::{ioctl, KvmError, KvmVm};
use super::{cpuid, regs};
use crate::boot::testguest;
use crate::boot::EntryState;
use crate::devices::board::Board;
use crate::devices::pvctl::{PvAction, PvCtl};
use crate::signals;
use crate::stats::ExitStats;
use crate::vm::{VmOutcome, VmShared};

/// The agent device's command register (see the MMIO write exit).
const AGENT_COMMAND_GPA: u64 =
    farvm_devices::layout::AGENT_MMIO_BASE + farvm_guest_agent::device::reg::COMMAND;

/// How the guest brings up its vCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApStart {
    /// Every vCPU enters the kernel at the same entry point, `rsi` = its index (the test
    /// guest, which has no INIT/SIPI code).
    AllAtEntry,
    /// Only vCPU 0 (the bootstrap processor) runs at the entry point; the others wait for
    /// INIT/SIPI from the guest, which finds them in the MADT (Linux).
    WaitForSipi,
}

/// Creates `ncpus` vCPUs with CPUID set (KVM's supported set, this vCPU's APIC id patched in,
/// and without KVM's paravirtual async page faults if `hide_pv_async_pf`: see
/// [`cpuid::hide_async_pf`]).
pub fn create(vm: &KvmVm, ncpus: u32, hide_pv_async_pf: bool) -> Result<Vec<VcpuFd>, KvmError> {
    let max = vm.kvm.get_max_vcpus();
    if ncpus == 0 || ncpus as usize > max {
        return Err(KvmError::Unsupported(format!(
            "{ncpus} vCPUs requested; KVM supports 1..={max}"
        )));
    }
    let supported = vm
        .kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
    if hide_pv_async_pf && !cpuid::has_kvmclock(&supported) {
        tracing::warn!(
            "KVM offers no kvmclock here: a Linux guest falls back to calibrating its clocks \
             against the PIT"
        );
    }
    let mut vcpus = Vec::with_capacity(ncpus as usize);
    for i in 0..ncpus {
        let vcpu = vm
            .fd
            .create_vcpu(u64::from(i))
            .map_err(ioctl("KVM_CREATE_VCPU"))?;
        let mut c = supported.clone();
        cpuid::patch(&mut c, i, ncpus);
        if hide_pv_async_pf {
            cpuid::hide_async_pf(&mut c);
        }
        vcpu.set_cpuid2(&c).map_err(ioctl("KVM_SET_CPUID2"))?;
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

/// KVM_GET_TSC_KHZ of a vCPU.
pub fn tsc_khz(vcpu: &VcpuFd) -> Result<u64, KvmError> {
    Ok(u64::from(
        vcpu.get_tsc_khz().map_err(ioctl("KVM_GET_TSC_KHZ"))?,
    ))
}

/// Sets the entry registers per `start`: every vCPU's (vCPU `i` gets `rsi = i`) and the APs
/// made runnable, or the bootstrap processor's only, the APs left in KVM's wait-for-SIPI state.
pub fn set_entry(vcpus: &[VcpuFd], entry: &EntryState, start: ApStart) -> Result<(), KvmError> {
    for (i, vcpu) in vcpus.iter().enumerate() {
        let mut e = *entry;
        match start {
            ApStart::AllAtEntry => e.rsi = i as u64,
            // With the in-kernel irqchip KVM creates APs in "wait for SIPI"
            // (KVM_MP_STATE_UNINITIALIZED); the guest's INIT/SIPI starts them in real mode.
            ApStart::WaitForSipi if i > 0 => break,
            ApStart::WaitForSipi => {}
        }
        regs::set_entry(vcpu, &e)?;
        if i > 0 {
            // With an in-kernel irqchip APs start in "wait for SIPI"; the test guest has no
            // INIT/SIPI code, so the VMM starts them directly.
            vcpu.set_mp_state(kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            })
            .map_err(ioctl("KVM_SET_MP_STATE"))?;
        }
    }
    Ok(())
}

/// The registers of a vCPU as KVM holds them.
pub fn registers(vcpu: &VcpuFd) -> Result<(kvm_regs, kvm_sregs), KvmError> {
    let r = vcpu.get_regs().map_err(ioctl("KVM_GET_REGS"))?;
    let s = vcpu.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    Ok((r, s))
}

/// Starts the thread `vcpu{index}` running vCPU `fd` of the VM whose state is `shared`.
/// `hlt_in_guest`: the VM's HLT exits are disabled ([`KvmVm::hlt_in_guest`]), so a finished
/// test-guest vCPU is halted in KVM ([`halt_finished_vcpu`]).
pub(crate) fn spawn(
    index: u32,
    fd: VcpuFd,
    shared: Arc<VmShared>,
    hlt_in_guest: bool,
) -> std::io::Result<(JoinHandle<()>, libc::pthread_t)> {
    let h = std::thread::Builder::new()
        .name(format!("vcpu{index}"))
        .spawn(move || run(index, fd, shared, hlt_in_guest))?;
    let pthread = h.as_pthread_t();
    Ok((h, pthread))
}

enum ExitAction {
    Continue,
    /// The guest agent registered this vCPU's slot: learn the guest's paging depth from CR4.
    AgentSlot,
    Interrupted,
    Stop(VmOutcome),
    InternalError,
    TripleFault,
    FailEntry(u64),
}

fn run(index: u32, mut fd: VcpuFd, shared: Arc<VmShared>, hlt_in_guest: bool) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    shared.publish_tid(index, tid);
    shared.wait_gate();
    signals::set_thread_kvm_run(fd.get_kvm_run() as *mut _);
    let mut halted = false;
    loop {
        if shared.stopping() {
            break;
        }
        if shared.pause_requested() {
            shared.park_while_paused();
            continue;
        }
        if shared.take_dump_request(index) {
            let report = describe_state(&fd, &shared);
            tracing::warn!("vcpu{index}: {report}");
            shared.put_dump(index, report);
        }
        if hlt_in_guest && !halted && shared.pv.cpu_done(index) {
            halt_finished_vcpu(index, &fd);
            halted = true;
        }
        let action = match fd.run() {
            Ok(exit) => handle_exit(index, exit, &shared),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                ExitAction::Interrupted
            }
            Err(e) => ExitAction::Stop(VmOutcome::HostError {
                message: format!("vCPU {index}: KVM_RUN failed: {e}"),
            }),
        };
        let exits = &shared.exits;
        let crash = |message| VmOutcome::Crash {
            cpu: index,
            message,
        };
        match action {
            ExitAction::Continue => {}
            ExitAction::AgentSlot => {
                if let Ok(sregs) = fd.get_sregs() {
                    shared.note_guest_cr4(index, sregs.cr4);
                }
            }
            ExitAction::Interrupted => {
                ExitStats::bump(&exits.interrupted);
                fd.set_kvm_immediate_exit(0);
            }
            ExitAction::Stop(o) => {
                shared.request_stop(o);
                break;
            }
            ExitAction::InternalError => {
                ExitStats::bump(&exits.internal_error);
                let message = describe_internal_error(&mut fd, &shared);
                shared.request_stop(crash(message));
                break;
            }
            ExitAction::TripleFault => {
                ExitStats::bump(&exits.shutdown);
                let message = format!(
                    "the guest triple-faulted (KVM_EXIT_SHUTDOWN){}",
                    describe_position(&fd, &shared)
                );
                shared.request_stop(crash(message));
                break;
            }
            ExitAction::FailEntry(reason) => {
                ExitStats::bump(&exits.fail_entry);
                let message = format!(
                    "KVM_EXIT_FAIL_ENTRY, hardware entry failure reason {reason:#x}{}",
                    describe_position(&fd, &shared)
                );
                shared.request_stop(crash(message));
                break;
            }
        }
    }
    // A VM that ran out of time is usually stuck: say where each vCPU was.
    if matches!(shared.outcome(), Some(VmOutcome::Timeout { .. })) {
        let mp_state = fd.get_mp_state().map_or(u32::MAX, |m| m.mp_state);
        tracing::warn!(
            "vcpu{index} at the timeout: mp_state {mp_state}{}",
            describe_position(&fd, &shared)
        );
    }
    signals::set_thread_kvm_run(std::ptr::null_mut());
}

/// Puts a vCPU whose guest has nothing left to run on it (it reported PORT_CPU_DONE and halts
/// with interrupts off for good) in KVM's halted state, so that KVM_RUN blocks its thread in
/// the host kernel until the VM stops (a kick's signal ends the block). Called only with HLT
/// exits disabled (`vm::disable_async_page_faults`), where the guest's own HLT would halt in
/// guest mode and keep the thread on a host CPU for the rest of the run.
fn halt_finished_vcpu(index: u32, fd: &VcpuFd) {
    let halted = kvm_bindings::kvm_mp_state {
        mp_state: kvm_bindings::KVM_MP_STATE_HALTED,
    };
    if let Err(e) = fd.set_mp_state(halted) {
        tracing::warn!(
            vcpu = index,
            "cannot halt the finished vCPU in KVM (KVM_SET_MP_STATE): {e}"
        );
    }
}

fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

fn handle_exit(cpu: u32, exit: VcpuExit<'_>, shared: &VmShared) -> ExitAction {
    let exits = &shared.exits;
    let bus = shared.board.bus();
    let count_port = |port: u16| {
        ExitStats::bump(if Board::is_console_port(port) {
            &exits.io_serial
        } else {
            &exits.io_other
        })
    };
    match exit {
        VcpuExit::IoOut(port, data) if PvCtl::owns(port) => {
            ExitStats::bump(&exits.io_pv);
            match shared.pv.write(cpu, port, le_value(data)) {
                PvAction::Continue if port == farvm_guest_agent::pv::PORT_AGENT_SLOT => {
                    ExitAction::AgentSlot
                }
                PvAction::Continue => ExitAction::Continue,
                PvAction::Shutdown(status) => ExitAction::Stop(VmOutcome::GuestShutdown { status }),
                PvAction::Panic(message) => ExitAction::Stop(VmOutcome::GuestPanic { message }),
            }
        }
        VcpuExit::IoOut(port, data) => {
            count_port(port);
            // A port nobody owns drops the write (as an empty ISA bus does).
            let _ = bus.pio_write(port, data);
            ExitAction::Continue
        }
        VcpuExit::IoIn(port, data) if PvCtl::owns(port) => {
            ExitStats::bump(&exits.io_pv);
            let v = shared.pv.read(port).to_le_bytes();
            for (i, d) in data.iter_mut().enumerate() {
                *d = v.get(i).copied().unwrap_or(0);
            }
            ExitAction::Continue
        }
        VcpuExit::IoIn(port, data) => {
            count_port(port);
            if bus.pio_read(port, data).is_err() {
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            ExitStats::bump(&exits.mmio);
            match bus.mmio_read(addr, data) {
                Ok(()) => ExitAction::Continue,
                Err(_) => unmapped(cpu, addr),
            }
        }
        VcpuExit::MmioWrite(addr, data) => {
            ExitStats::bump(&exits.mmio);
            match bus.mmio_write(addr, data) {
                // A guest agent command (slot registration among them): learn the guest's
                // paging from this vCPU's CR4, as for the test guest's slot port.
                Ok(()) if addr == AGENT_COMMAND_GPA => ExitAction::AgentSlot,
                Ok(()) => ExitAction::Continue,
                Err(_) => unmapped(cpu, addr),
            }
        }
        VcpuExit::Hlt => {
            // Only without an in-kernel irqchip; nothing will wake this vCPU but a stop.
            ExitStats::bump(&exits.hlt);
            std::thread::sleep(Duration::from_millis(1));
            ExitAction::Continue
        }
        VcpuExit::Intr => ExitAction::Interrupted,
        VcpuExit::Shutdown => ExitAction::TripleFault,
        VcpuExit::InternalError => ExitAction::InternalError,
        VcpuExit::FailEntry(reason, _) => ExitAction::FailEntry(reason),
        other => {
            ExitStats::bump(&exits.other);
            ExitAction::Stop(VmOutcome::Crash {
                cpu,
                message: format!("unexpected KVM exit {other:?}"),
            })
        }
    }
}

fn unmapped(cpu: u32, addr: u64) -> ExitAction {
    ExitAction::Stop(VmOutcome::Crash {
        cpu,
        message: format!(
            "access to unmapped guest-physical address {addr:#x} (MMIO; no device there)"
        ),
    })
}

fn describe_position(fd: &VcpuFd, shared: &VmShared) -> String {
    let Ok((regs, sregs)) = registers(fd) else {
        return String::new();
    };
    let mut s = format!(
        " at RIP {:#x} (CPL {}, CR3 {:#x}, CR2 {:#x}, RSP {:#x})",
        regs.rip,
        sregs.cs.selector & 3,
        sregs.cr3,
        sregs.cr2,
        regs.rsp
    );
    if let Some(bytes) = instruction_bytes(shared, sregs.cr3, regs.rip) {
        s.push_str(&format!("; instruction bytes: {bytes}"));
    }
    s
}

/// A vCPU's state for a stall report: MP state, position, RFLAGS, pending events and the local
/// APIC's priority, service and request registers and timer.
fn describe_state(fd: &VcpuFd, shared: &VmShared) -> String {
    let mp_state = fd.get_mp_state().map_or(u32::MAX, |m| m.mp_state);
    let mut s = format!("mp_state {mp_state}{}", describe_position(fd, shared));
    if let Ok(regs) = fd.get_regs() {
        s.push_str(&format!(
            "; RFLAGS {:#x} (IF {})",
            regs.rflags,
            (regs.rflags >> 9) & 1
        ));
    }
    if let Ok(e) = fd.get_vcpu_events() {
        s.push_str(&format!(
            "; events: interrupt injected {} nr {} shadow {}, nmi injected {} pending {} \
             masked {}, exception injected {} pending {} nr {}",
            e.interrupt.injected,
            e.interrupt.nr,
            e.interrupt.shadow,
            e.nmi.injected,
            e.nmi.pending,
            e.nmi.masked,
            e.exception.injected,
            e.exception.pending,
            e.exception.nr
        ));
    }
    if let Ok(lapic) = fd.get_lapic() {
        let reg = |off: usize| {
            let b = &lapic.regs[off..off + 4];
            u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
        };
        // 256-bit registers: eight 32-bit words, 16 bytes apart; printed high word first.
        let bits = |base: usize| {
            (0..8)
                .rev()
                .map(|i| format!("{:08x}", reg(base + i * 0x10)))
                .collect::<Vec<_>>()
                .join("")
        };
        s.push_str(&format!(
            "; lapic: id {:#x} TPR {:#x} PPR {:#x} SVR {:#x} ISR {} IRR {} LVT timer {:#x} \
             TMICT {:#x} TMCCT {:#x} TDCR {:#x} LINT0 {:#x} LINT1 {:#x}",
            reg(0x20) >> 24,
            reg(0x80),
            reg(0xa0),
            reg(0xf0),
            bits(0x100),
            bits(0x200),
            reg(0x320),
            reg(0x380),
            reg(0x390),
            reg(0x3e0),
            reg(0x350),
            reg(0x360)
        ));
    }
    s
}

fn instruction_bytes(shared: &VmShared, cr3: u64, rip: u64) -> Option<String> {
    let gpa = testguest::translate(&shared.ram, cr3, rip)?;
    let n = (0x1000 - (gpa & 0xfff)).min(15) as usize;
    let mut b = [0u8; 15];
    shared.ram.read_slice(&mut b[..n], GuestAddress(gpa)).ok()?;
    Some(
        b[..n]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn describe_internal_error(fd: &mut VcpuFd, shared: &VmShared) -> String {
    // SAFETY: exit_reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the active union field.
    let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let kind = match internal.suberror {
        1 => "emulation failure (an instruction KVM's emulator cannot execute)",
        2 => "exception while delivering an exception",
        3 => "event delivery failed",
        4 => "unexpected exit reason",
        _ => "unknown suberror",
    };
    let nd = (internal.ndata as usize).min(internal.data.len());
    let data: Vec<String> = internal.data[..nd]
        .iter()
        .map(|d| format!("{d:#x}"))
        .collect();
    format!(
        "KVM_EXIT_INTERNAL_ERROR suberror {} ({kind}){}{}",
        internal.suberror,
        describe_position(fd, shared),
        if data.is_empty() {
            String::new()
        } else {
            format!("; data [{}]", data.join(", "))
        }
    )
}
