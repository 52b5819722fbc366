//! The vCPU thread: KVM_RUN in a loop, each exit handed to the VM ([`VcpuExits`]) or handled
//! here (kicks, crashes, entry failures), requests from the owner ([`VcpuEvent`]) taken between
//! two KVM_RUNs, and the VM's end ([`OutcomeLatch`]) checked before each. A paused thread parks
//! in a `select!` on its requests and the latch, so a stop wakes it too. With HLT exits
//! disabled, a test-guest vCPU that has nothing left to run is put in KVM's halted state, so
//! its thread blocks in the host kernel.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{select, Receiver, Sender};
use kvm_ioctls::{VcpuExit, VcpuFd};

use super::describe::{describe_internal_error, describe_position, describe_state};
use super::exits::{DeviceAction, VcpuExits};
use super::handle::{SavedState, VcpuEvent, VcpuResponse};
use super::state::VcpuState;
use crate::signals;
use crate::stats::ExitStats;
use crate::vstate::outcome::{OutcomeLatch, VmOutcome};

/// Everything one vCPU thread owns.
pub(super) struct VcpuThread {
    pub index: u32,
    pub fd: VcpuFd,
    pub exits: Arc<dyn VcpuExits>,
    pub latch: Arc<OutcomeLatch>,
    pub events: Receiver<VcpuEvent>,
    pub responses: Sender<VcpuResponse>,
    /// The VM's HLT exits are disabled ([`crate::vstate::vm::KvmVm::hlt_in_guest`]): a finished
    /// test-guest vCPU is halted in KVM ([`halt_finished_vcpu`]).
    pub hlt_in_guest: bool,
}

/// What the loop does after an exit.
enum Next {
    Run,
    Stop(VmOutcome),
}

/// Whether the thread goes on after taking its requests.
#[derive(PartialEq, Eq)]
enum Requests {
    Run,
    /// The VM's end was decided (or the owner is gone) while the thread was parked.
    Stop,
}

impl VcpuThread {
    /// The thread's body: report ready, wait for the start, run until the VM ends.
    pub fn run(mut self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.answer(VcpuResponse::Ready { tid });
        if !self.wait_for_start() {
            return;
        }
        signals::set_thread_kvm_run(self.fd.get_kvm_run() as *mut _);
        self.run_guest();
        // A VM that ran out of time is usually stuck: say where each vCPU was.
        if matches!(self.latch.outcome(), Some(VmOutcome::Timeout { .. })) {
            let mp_state = self.fd.get_mp_state().map_or(u32::MAX, |m| m.mp_state);
            tracing::warn!(
                "vcpu{} at the timeout: mp_state {mp_state}{}",
                self.index,
                describe_position(&self.fd, self.exits.ram())
            );
        }
        signals::set_thread_kvm_run(std::ptr::null_mut());
    }

    fn answer(&self, r: VcpuResponse) {
        // The owner may have stopped listening (it is gone): nothing to tell.
        let _ = self.responses.send(r);
    }

    fn report_state(&self) {
        let report = describe_state(&self.fd, self.exits.ram());
        tracing::warn!("vcpu{}: {report}", self.index);
        self.answer(VcpuResponse::State(report));
    }

    fn save_state(&self) {
        let state = VcpuState::read(&self.fd).map_err(|e| e.to_string());
        self.answer(VcpuResponse::Saved(SavedState(Arc::new(state))));
    }

    /// Blocks until [`VcpuEvent::Start`] (and, if a pause came first, its resume); false if
    /// the VM ended first. A thread not in the guest yet is as good as parked.
    fn wait_for_start(&self) -> bool {
        let (mut started, mut paused) = (false, false);
        while !started || paused {
            select! {
                recv(self.events) -> ev => match ev {
                    Ok(VcpuEvent::Start) => started = true,
                    Ok(VcpuEvent::DumpState) => self.report_state(),
                    Ok(VcpuEvent::SaveState) => self.save_state(),
                    Ok(VcpuEvent::Pause) => {
                        paused = true;
                        self.answer(VcpuResponse::Paused);
                    }
                    Ok(VcpuEvent::Resume) => {
                        paused = false;
                        self.answer(VcpuResponse::Resumed);
                    }
                    Err(_) => return false,
                },
                recv(self.latch.closed()) -> _ => return false,
            }
        }
        true
    }

    /// Takes the requests queued since the last KVM_RUN.
    fn take_requests(&self) -> Requests {
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                VcpuEvent::Pause => {
                    if self.park() == Requests::Stop {
                        return Requests::Stop;
                    }
                }
                VcpuEvent::Resume => self.answer(VcpuResponse::Resumed),
                VcpuEvent::DumpState => self.report_state(),
                VcpuEvent::SaveState => self.save_state(),
                VcpuEvent::Start => {}
            }
        }
        Requests::Run
    }

    /// Parks outside the guest until resumed or the VM ends.
    fn park(&self) -> Requests {
        self.answer(VcpuResponse::Paused);
        loop {
            select! {
                recv(self.events) -> ev => match ev {
                    Ok(VcpuEvent::Resume) => {
                        self.answer(VcpuResponse::Resumed);
                        return Requests::Run;
                    }
                    Ok(VcpuEvent::Pause) => self.answer(VcpuResponse::Paused),
                    Ok(VcpuEvent::DumpState) => self.report_state(),
                    Ok(VcpuEvent::SaveState) => self.save_state(),
                    Ok(VcpuEvent::Start) => {}
                    Err(_) => return Requests::Stop,
                },
                recv(self.latch.closed()) -> _ => return Requests::Stop,
            }
        }
    }

    fn run_guest(&mut self) {
        let mut halted = false;
        loop {
            if self.latch.stopping() || self.take_requests() == Requests::Stop {
                return;
            }
            if self.hlt_in_guest && !halted && self.exits.cpu_done(self.index) {
                halt_finished_vcpu(self.index, &self.fd);
                halted = true;
            }
            let next = match self.fd.run() {
                Ok(exit) => handle_exit(self.index, exit, &*self.exits),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    Exit::Interrupted
                }
                Err(e) => Exit::Stop(VmOutcome::HostError {
                    message: format!("vCPU {}: KVM_RUN failed: {e}", self.index),
                }),
            };
            if let Next::Stop(outcome) = self.after(next) {
                self.latch.decide(outcome);
                return;
            }
        }
    }

    /// Finishes an exit that needs the vCPU's registers.
    fn after(&mut self, exit: Exit) -> Next {
        let cpu = self.index;
        let crash = |message| Next::Stop(VmOutcome::Crash { cpu, message });
        let stats = self.exits.clone();
        let stats = stats.exit_stats();
        match exit {
            Exit::Continue => Next::Run,
            Exit::Interrupted => {
                ExitStats::bump(&stats.interrupted);
                self.fd.set_kvm_immediate_exit(0);
                Next::Run
            }
            Exit::Device(DeviceAction::Continue) => Next::Run,
            Exit::Device(DeviceAction::AgentRegistered) => {
                if let Ok(sregs) = self.fd.get_sregs() {
                    self.exits.guest_cr4(self.index, sregs.cr4);
                }
                Next::Run
            }
            Exit::Device(DeviceAction::Stop(o)) | Exit::Stop(o) => Next::Stop(o),
            Exit::InternalError => {
                ExitStats::bump(&stats.internal_error);
                crash(describe_internal_error(&mut self.fd, self.exits.ram()))
            }
            Exit::TripleFault => {
                ExitStats::bump(&stats.shutdown);
                crash(format!(
                    "the guest triple-faulted (KVM_EXIT_SHUTDOWN){}",
                    describe_position(&self.fd, self.exits.ram())
                ))
            }
            Exit::FailEntry(reason) => {
                ExitStats::bump(&stats.fail_entry);
                crash(format!(
                    "KVM_EXIT_FAIL_ENTRY, hardware entry failure reason {reason:#x}{}",
                    describe_position(&self.fd, self.exits.ram())
                ))
            }
        }
    }
}

/// An exit as KVM_RUN returned it, with the borrow of `kvm_run` ended.
enum Exit {
    Continue,
    /// A kick (or another signal) ended KVM_RUN.
    Interrupted,
    Device(DeviceAction),
    Stop(VmOutcome),
    InternalError,
    TripleFault,
    FailEntry(u64),
}

fn handle_exit(cpu: u32, exit: VcpuExit<'_>, vm: &dyn VcpuExits) -> Exit {
    let stats = vm.exit_stats();
    match exit {
        VcpuExit::IoOut(port, data) => Exit::Device(vm.port_out(cpu, port, data)),
        VcpuExit::IoIn(port, data) => {
            vm.port_in(cpu, port, data);
            Exit::Continue
        }
        VcpuExit::MmioRead(addr, data) => Exit::Device(vm.mmio_read(cpu, addr, data)),
        VcpuExit::MmioWrite(addr, data) => Exit::Device(vm.mmio_write(cpu, addr, data)),
        VcpuExit::Hlt => {
            // Only without an in-kernel irqchip; nothing will wake this vCPU but a stop.
            ExitStats::bump(&stats.hlt);
            std::thread::sleep(Duration::from_millis(1));
            Exit::Continue
        }
        VcpuExit::Intr => Exit::Interrupted,
        VcpuExit::Shutdown => Exit::TripleFault,
        VcpuExit::InternalError => Exit::InternalError,
        VcpuExit::FailEntry(reason, _) => Exit::FailEntry(reason),
        other => {
            ExitStats::bump(&stats.other);
            Exit::Stop(VmOutcome::Crash {
                cpu,
                message: format!("unexpected KVM exit {other:?}"),
            })
        }
    }
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
