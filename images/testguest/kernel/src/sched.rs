//! Scheduling: per-vCPU run queues (processes are pinned, no migration), round robin on yield
//! and on the LAPIC timer (armed only while more than one process is runnable), eager FPU
//! switching, the agent slot written on every switch, process exit/kill (each ended process's
//! result goes to the serial console), and the VM's end.

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{compiler_fence, AtomicU32, Ordering};

use farvm_guest_agent::boot::{exit, flags, user, workload};
use farvm_guest_agent::pv::{self, state};
use farvm_guest_agent::slot::{AgentSlot, SLOT_MAGIC};
use farvm_guest_agent::{ABI_VERSION, PAGE_SIZE};

use crate::arch::{self, image_gpa, outl, rdmsr, MSR_GS_BASE};
use crate::console::Line;
use crate::global::Global;
use crate::mm::{self, PTE_NX, PTE_U, PTE_W};
use crate::proc::{self, Process, EXITED, RUNNABLE};
use crate::trap::{TrapFrame, FRAME_SIZE};
use crate::{cpu, lapic, MAX_CPUS, MAX_PROCS};

/// One per vCPU; GS base points at it (`gs:[0]` is `self_ptr`).
#[repr(C)]
pub struct PerCpu {
    self_ptr: u64,
    cpu: u32,
    /// Processes pinned here (indices into the process table), in round-robin order.
    nqueue: u32,
    queue: [u8; MAX_PROCS],
    /// Queue position of the running process.
    cur: u32,
    /// Runnable processes in the queue.
    nrun: u32,
    /// Process index + 1 whose FPU state is in the registers (0 = none).
    fpu_owner: u32,
    timer_armed: bool,
    cr3: u64,
    switches: u64,
}

static PERCPU: Global<[PerCpu; MAX_CPUS]> = Global::new(
    [const {
        PerCpu {
            self_ptr: 0,
            cpu: 0,
            nqueue: 0,
            queue: [0; MAX_PROCS],
            cur: 0,
            nrun: 0,
            fpu_owner: 0,
            timer_armed: false,
            cr3: 0,
            switches: 0,
        }
    }; MAX_CPUS],
);

#[repr(C, align(4096))]
struct SlotPage(AgentSlot);
static SLOTS: Global<[SlotPage; MAX_CPUS]> = Global::new(
    [const {
        SlotPage(AgentSlot {
            magic: 0,
            generation: 0,
            cpu: 0,
            version: 0,
            pid: 0,
            cr3: 0,
            switches: 0,
        })
    }; MAX_CPUS],
);

static NPROCS: AtomicU32 = AtomicU32::new(0);
static FINISHED: AtomicU32 = AtomicU32::new(0);
static FAILED: AtomicU32 = AtomicU32::new(0);
static TIMER_HZ: AtomicU32 = AtomicU32::new(0);
static BOOT_FLAGS: Global<u64> = Global::new(0);

/// Boot-time configuration (BSP, before the APs start).
pub fn configure(nprocs: u32, timer_hz: u32, boot_flags: u64) {
    NPROCS.store(nprocs, Ordering::Relaxed);
    TIMER_HZ.store(timer_hz, Ordering::Relaxed);
    // SAFETY: single writer before the APs start.
    unsafe { *BOOT_FLAGS.get() = boot_flags };
}

/// Pins process `idx` to `cpu` (BSP, at boot).
pub fn enqueue(cpu: usize, idx: usize) {
    // SAFETY: boot-time single writer; nqueue < MAX_PROCS since idx < MAX_PROCS processes.
    unsafe {
        let pc = addr_of_mut!((*PERCPU.get())[cpu]);
        (*pc).queue[(*pc).nqueue as usize] = idx as u8;
        (*pc).nqueue += 1;
        (*pc).nrun += 1;
    }
}

#[inline(always)]
fn this() -> &'static mut PerCpu {
    let p: u64;
    // SAFETY: GS base is this vCPU's PerCpu (set in `start` before any trap can happen) and
    // its first field is a pointer to itself.
    unsafe {
        core::arch::asm!("mov {}, gs:[0]", out(reg) p, options(nostack, readonly, preserves_flags));
        &mut *(p as *mut PerCpu)
    }
}

/// This vCPU's index, for messages (works before GS is set: 0 then).
pub fn cpu_index() -> usize {
    let gs = rdmsr(MSR_GS_BASE);
    if gs == 0 {
        0
    } else {
        // SAFETY: a non-zero GS base is always this vCPU's PerCpu.
        unsafe { (*(gs as *const PerCpu)).cpu as usize }
    }
}

fn current(pc: &PerCpu) -> (usize, &'static mut Process) {
    let idx = pc.queue[pc.cur as usize] as usize;
    // SAFETY: the running process is pinned to this vCPU, which alone writes it.
    (idx, unsafe { &mut *proc::get(idx) })
}

/// Brings this vCPU up and enters its first process (never returns).
pub fn start(cpu_no: usize) -> ! {
    // SAFETY: cpu_no < MAX_CPUS (checked by kmain); only this vCPU touches its PerCpu.
    let pc = unsafe { &mut *addr_of_mut!((*PERCPU.get())[cpu_no]) };
    pc.self_ptr = pc as *mut PerCpu as u64;
    pc.cpu = cpu_no as u32;
    cpu::init(cpu_no, pc.self_ptr);
    lapic::init();
    if cpu_no == 0 {
        crate::console::init_input();
    }
    // SAFETY: this vCPU's own slot page.
    unsafe {
        let s = addr_of_mut!((*SLOTS.get())[cpu_no].0);
        addr_of_mut!((*s).magic).write_volatile(SLOT_MAGIC);
        addr_of_mut!((*s).cpu).write_volatile(cpu_no as u32);
        addr_of_mut!((*s).version).write_volatile(ABI_VERSION);
        outl(pv::PORT_AGENT_SLOT, image_gpa(s) as u32);
    }
    if pc.nrun == 0 {
        cpu_done(pc);
    }
    update_timer(pc);
    pc.cur = 0;
    let f = switch_in(pc, 0);
    crate::trap::resume(f)
}

/// Makes queue position `pos` the running process; returns its frame.
fn switch_in(pc: &mut PerCpu, pos: u32) -> *mut TrapFrame {
    let idx = pc.queue[pos as usize] as usize;
    // SAFETY: pinned to this vCPU.
    let p = unsafe { &*proc::get(idx) };
    if pc.cr3 != p.pml4 {
        arch::write_cr3(p.pml4);
        pc.cr3 = p.pml4;
    }
    cpu::set_rsp0(pc.cpu as usize, p.kstack_top);
    // Eager FPU switch: this host's PVM backend does not raise #NM for CR0.TS in ring 3 (a
    // lazy switch silently shares the SSE registers between processes), so the state moves
    // on every switch between processes: two emulated instructions.
    if pc.fpu_owner != idx as u32 + 1 {
        if pc.fpu_owner != 0 {
            // SAFETY: fpu_owner - 1 is a valid process index (cleared when it exits).
            arch::fxsave(unsafe { (*proc::get(pc.fpu_owner as usize - 1)).fpu_va });
        }
        arch::fxrstor(p.fpu_va);
        pc.fpu_owner = idx as u32 + 1;
    }
    pc.switches += 1;
    publish(pc.cpu as usize, p.pid as u64, p.pml4, pc.switches);
    pc.cur = pos;
    (p.kstack_top - FRAME_SIZE) as *mut TrapFrame
}

/// Seqlock write of this vCPU's agent slot.
fn publish(cpu_no: usize, pid: u64, cr3: u64, switches: u64) {
    // SAFETY: this vCPU is the slot's only writer. x86 keeps stores in order; the compiler
    // fences keep the compiler from reordering them around the generation bumps.
    unsafe {
        let s = addr_of_mut!((*SLOTS.get())[cpu_no].0);
        let g = addr_of!((*s).generation).read_volatile();
        addr_of_mut!((*s).generation).write_volatile(g + 1);
        compiler_fence(Ordering::SeqCst);
        addr_of_mut!((*s).pid).write_volatile(pid);
        addr_of_mut!((*s).cr3).write_volatile(cr3);
        addr_of_mut!((*s).switches).write_volatile(switches);
        compiler_fence(Ordering::SeqCst);
        addr_of_mut!((*s).generation).write_volatile(g + 2);
    }
}

/// Next runnable queue position after the current one (round robin), if any.
fn next_runnable(pc: &PerCpu) -> Option<u32> {
    for k in 1..=pc.nqueue {
        let pos = (pc.cur + k) % pc.nqueue;
        // SAFETY: queue entries are valid process indices.
        if unsafe { (*proc::get(pc.queue[pos as usize] as usize)).state } == RUNNABLE {
            return Some(pos);
        }
    }
    None
}

fn update_timer(pc: &mut PerCpu) {
    let hz = TIMER_HZ.load(Ordering::Relaxed);
    let want = pc.nrun > 1 && hz > 0;
    if want != pc.timer_armed {
        if want {
            lapic::arm(hz);
        } else {
            lapic::disarm();
        }
        pc.timer_armed = want;
    }
}

/// Round robin to the next runnable process (or stay).
fn rotate(pc: &mut PerCpu, f: *mut TrapFrame) -> *mut TrapFrame {
    match next_runnable(pc) {
        Some(pos) if pos != pc.cur => switch_in(pc, pos),
        _ => f,
    }
}

pub fn timer_tick(f: *mut TrapFrame) -> *mut TrapFrame {
    lapic::eoi();
    let pc = this();
    if pc.nrun > 1 {
        rotate(pc, f)
    } else {
        f
    }
}

pub fn syscall(f: *mut TrapFrame) -> *mut TrapFrame {
    // SAFETY: the frame of the current process, on its kernel stack.
    let fr = unsafe { &mut *f };
    let pc = this();
    match fr.rax {
        farvm_testguest_rt::sys::EXIT => finish(pc, false),
        farvm_testguest_rt::sys::YIELD => {
            fr.rax = 0;
            rotate(pc, f)
        }
        _ => {
            fr.rax = farvm_testguest_rt::sys::ENOSYS;
            f
        }
    }
}

/// Not-present #PF inside the heap window: map the faulting 2 MiB chunk (or 4 KiB page with
/// `DEMAND_4K`) of the heap; outside the heap's size it is a bad access.
pub fn heap_fault(f: *mut TrapFrame, cr2: u64) -> *mut TrapFrame {
    let pc = this();
    let (_, p) = current(pc);
    let end = user::HEAP_BASE + p.heap_bytes;
    if cr2 >= end {
        return kill(f, cr2);
    }
    // SAFETY: written once at boot.
    let bf = unsafe { *BOOT_FLAGS.get() };
    let mapped = if bf & flags::DEMAND_4K != 0 {
        let va = cr2 & !(PAGE_SIZE - 1);
        mm::alloc_frame(pc.cpu as usize)
            .and_then(|frame| mm::map_page(p.pml4, va, frame, PTE_W | PTE_U | PTE_NX))
    } else {
        let c = cr2 & !((2 << 20) - 1);
        let len = (c + (2 << 20)).min(end) - c;
        mm::map_fresh(pc.cpu as usize, p.pml4, c, len, PTE_W | PTE_U | PTE_NX)
    };
    if mapped.is_err() {
        crate::pv::Msg::new(pc.cpu as usize)
            .s(b"out of memory: demand fault of pid ")
            .dec(p.pid as u64)
            .s(b" at ")
            .hex(cr2)
            .log();
        crate::pv::shutdown(exit::OUT_OF_MEMORY);
    }
    f
}

/// Kills the current process after an exception in ring 3 (`cr2` for #PF, else 0).
pub fn kill(f: *mut TrapFrame, cr2: u64) -> *mut TrapFrame {
    // SAFETY: the frame of the current process.
    let fr = unsafe { &*f };
    let pc = this();
    let (_, p) = current(pc);
    let mb = proc::mailbox(p);
    // SAFETY: the process's mailbox page (direct map); it no longer runs, the VMM reads it
    // after the doorbell.
    unsafe {
        addr_of_mut!((*mb).fault_vector).write_volatile(fr.vector);
        addr_of_mut!((*mb).fault_error).write_volatile(fr.error);
        addr_of_mut!((*mb).fault_cr2).write_volatile(cr2);
        addr_of_mut!((*mb).fault_rip).write_volatile(fr.rip);
        addr_of_mut!((*mb).state).write_volatile(state::KILLED);
    }
    outl(pv::PORT_MAILBOX, p.mailbox_gpa as u32);
    finish(pc, true)
}

/// The current process ended (exit or kill): account for it, end the VM after the last one,
/// and run the next process here (or retire this vCPU).
fn finish(pc: &mut PerCpu, killed: bool) -> *mut TrapFrame {
    let (idx, p) = current(pc);
    p.state = EXITED;
    pc.nrun -= 1;
    if pc.fpu_owner == idx as u32 + 1 {
        pc.fpu_owner = 0;
    }
    // SAFETY: the process's mailbox page.
    let st = unsafe { addr_of!((*proc::mailbox(p)).state).read_volatile() };
    let ok = if p.workload == workload::CRASH {
        killed
    } else {
        !killed && st == state::DONE
    };
    if !ok {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    report(p);
    let nprocs = NPROCS.load(Ordering::Relaxed);
    if FINISHED.fetch_add(1, Ordering::AcqRel) + 1 == nprocs {
        let failed = FAILED.load(Ordering::Relaxed);
        let status = if failed == 0 {
            exit::OK
        } else {
            exit::PROCESS_FAILED
        };
        Line::start()
            .s(b"all ")
            .dec(nprocs as u64)
            .s(b" processes ended, ")
            .dec(failed as u64)
            .s(b" failed: powering off with status ")
            .dec(status as u64);
        crate::pv::shutdown(status);
    }
    update_timer(pc);
    match next_runnable(pc) {
        Some(pos) => switch_in(pc, pos),
        None => cpu_done(pc),
    }
}

/// Writes an ended process's result on the console: its spec, then `done ops N checksum 0xH
/// elapsed_ns T`, `killed vector V cr2 0xA rip 0xA` or `failed error E`.
fn report(p: &Process) {
    let mb = proc::mailbox(p);
    // SAFETY: the process's mailbox page (direct map); the process no longer runs.
    let (st, ops, checksum, ns, error, ws, seed, vector, cr2, rip) = unsafe {
        (
            addr_of!((*mb).state).read_volatile(),
            addr_of!((*mb).ops).read_volatile(),
            addr_of!((*mb).checksum).read_volatile(),
            addr_of!((*mb).elapsed_ns).read_volatile(),
            addr_of!((*mb).error).read_volatile(),
            addr_of!((*mb).spec.ws_bytes).read_volatile(),
            addr_of!((*mb).spec.seed).read_volatile(),
            addr_of!((*mb).fault_vector).read_volatile(),
            addr_of!((*mb).fault_cr2).read_volatile(),
            addr_of!((*mb).fault_rip).read_volatile(),
        )
    };
    let line = Line::start()
        .s(b"process ")
        .dec(p.pid as u64)
        .s(b" workload ")
        .dec(p.workload as u64)
        .s(b" cpu ")
        .dec(p.cpu as u64)
        .s(b" ws ")
        .dec(ws)
        .s(b" seed ")
        .dec(seed);
    match st {
        state::DONE => line
            .s(b" done ops ")
            .dec(ops)
            .s(b" checksum ")
            .hex(checksum)
            .s(b" elapsed_ns ")
            .dec(ns),
        state::KILLED => line
            .s(b" killed vector ")
            .dec(vector)
            .s(b" cr2 ")
            .hex(cr2)
            .s(b" rip ")
            .hex(rip),
        state::FAILED => line.s(b" failed error ").dec(error),
        other => line.s(b" ended in state ").dec(other as u64),
    };
}

/// Nothing left to run on this vCPU.
fn cpu_done(pc: &mut PerCpu) -> ! {
    publish(pc.cpu as usize, 0, 0, pc.switches);
    lapic::disarm();
    outl(pv::PORT_CPU_DONE, pc.cpu);
    arch::halt_forever()
}
