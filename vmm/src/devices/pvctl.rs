//! The paravirtual control device (ports 0x500..0x50F, `farvm_guest_agent::pv`): guest log
//! lines, process mailboxes with host timestamps, CPU-done, shutdown, bulk memory operations
//! done by the VMM on the guest's behalf, agent-slot registration and kernel panics.
//!
//! All guest memory accesses go through [`GuestRam`]; every guest-supplied address and length
//! is validated and a bad request is refused (`BulkOp::status != 0`), never trusted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use farvm_ept::{CounterValues, ProcessCounterValues};
use farvm_guest_agent::boot::MemRange;
use farvm_guest_agent::frames::FrameOrder;
use farvm_guest_agent::pv::{self, BulkOp, LogRecord, Mailbox, LOG_MAX, MAILBOX_MAGIC};
use farvm_guest_agent::slot::{AgentSlot, SLOT_MAGIC};
use farvm_guest_agent::PAGE_SIZE;
use serde::{Deserialize, Serialize};

use vm_memory::{Bytes, GuestAddress};

use crate::vstate::memory::GuestRam;

/// `BulkOp::status` values written by the VMM (`farvm_guest_agent::pv::status`).
pub mod bulk_status {
    pub use farvm_guest_agent::pv::status::{BAD_RANGE, OK, UNKNOWN_OP};
}

/// What the vCPU loop must do after a PV port write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PvAction {
    /// Keep running the vCPU.
    Continue,
    /// The guest asked to power off with this status.
    Shutdown(u32),
    /// The guest kernel panicked (message from its record).
    Panic(String),
}

/// One mailbox doorbell, timestamped by the host.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PhaseEvent {
    /// The mailbox phase after the doorbell (`pv::phase::*`).
    pub phase: u32,
    /// The mailbox state after the doorbell (`pv::state::*`).
    pub state: u32,
    /// Host monotonic time since the VM started, ns.
    pub host_ns: u64,
    /// The vCPU that rang it.
    pub cpu: u32,
    /// The paging engine's counters at the doorbell (VMs with remote memory only), so each
    /// phase of a workload gets its own fault and prefetch counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paging: Option<CounterValues>,
    /// The engine's counters of this process alone at the doorbell (its CR3 and pid in the
    /// mailbox), exact whatever else runs meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_paging: Option<ProcessCounterValues>,
}

/// Reads the paging engine's counters (`None` once the engine is gone).
pub type PagingCountersFn = Box<dyn Fn() -> Option<CounterValues> + Send + Sync>;

/// Reads the paging engine's counters of process (`cr3`, `pid`) (`None` if it has none).
pub type ProcessCountersFn = Box<dyn Fn(u64, u64) -> Option<ProcessCounterValues> + Send + Sync>;

/// What the VMM knows about one guest process, from its mailbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Guest process id.
    pub pid: u32,
    /// The vCPU it ran on.
    pub cpu: u32,
    /// Its workload id.
    pub workload: u32,
    /// Last mailbox state (`pv::state::*`).
    pub state: u32,
    /// Last mailbox phase.
    pub phase: u32,
    /// Guest-timed duration of the measured phase.
    pub elapsed_ns: u64,
    /// The workload's checksum.
    pub checksum: u64,
    /// Operations in the measured phase.
    pub ops: u64,
    /// Its page-table root.
    pub cr3: u64,
    /// Exception vector if it was killed.
    pub fault_vector: u64,
    /// Exception error code if it was killed.
    pub fault_error: u64,
    /// CR2 if it was killed.
    pub fault_cr2: u64,
    /// RIP if it was killed.
    pub fault_rip: u64,
    /// Workload-defined counters (e.g. page-access latency percentiles).
    pub counters: [u64; 8],
    /// `farvm_workloads::Error` code when `state == FAILED`.
    pub error: u64,
    /// Heap size the kernel mapped for the process.
    pub heap_bytes: u64,
    /// GPA of the mailbox page.
    pub mailbox_gpa: u64,
    /// Every doorbell, in order, with its host timestamp (host times and paging counters of
    /// one VMM run: a snapshot does not keep them).
    #[serde(default, skip_deserializing)]
    pub events: Vec<PhaseEvent>,
}

impl ProcessRecord {
    /// Process `pid` (workload `workload` on vCPU `cpu`) as first seen, in `state` and
    /// `phase`, its mailbox at `mailbox_gpa`: nothing measured or reported yet.
    pub fn new(
        pid: u32,
        cpu: u32,
        workload: u32,
        state: u32,
        phase: u32,
        mailbox_gpa: u64,
    ) -> Self {
        Self {
            pid,
            cpu,
            workload,
            state,
            phase,
            elapsed_ns: 0,
            checksum: 0,
            ops: 0,
            cr3: 0,
            fault_vector: 0,
            fault_error: 0,
            fault_cr2: 0,
            fault_rip: 0,
            counters: [0; 8],
            error: 0,
            heap_bytes: 0,
            mailbox_gpa,
            events: Vec::new(),
        }
    }

    /// What the paging engine counted between this process's MEASURE and MEASURED doorbells
    /// (None without remote memory or before the phase ended). The counters are the VM's:
    /// other processes running meanwhile are counted too.
    pub fn measured_phase_paging(&self) -> Option<CounterValues> {
        let at = |ph: u32| {
            self.events
                .iter()
                .find(|e| e.phase == ph)
                .and_then(|e| e.paging.as_ref())
        };
        Some(at(pv::phase::MEASURED)?.since(at(pv::phase::MEASURE)?))
    }

    /// What the paging engine counted for this process alone between its MEASURE and
    /// MEASURED doorbells (None without remote memory or before the phase ended).
    pub fn measured_phase_own_paging(&self) -> Option<ProcessCounterValues> {
        let at = |ph: u32| {
            self.events
                .iter()
                .find(|e| e.phase == ph)
                .and_then(|e| e.process_paging.as_ref())
        };
        Some(at(pv::phase::MEASURED)?.since(at(pv::phase::MEASURE)?))
    }

    fn update(&mut self, m: &Mailbox) {
        self.pid = m.pid;
        self.cpu = m.cpu;
        self.workload = m.workload;
        self.state = m.state;
        self.phase = m.phase;
        self.elapsed_ns = m.elapsed_ns;
        self.checksum = m.checksum;
        self.ops = m.ops;
        self.cr3 = m.cr3;
        self.fault_vector = m.fault_vector;
        self.fault_error = m.fault_error;
        self.fault_cr2 = m.fault_cr2;
        self.fault_rip = m.fault_rip;
        self.counters = m.counters;
        self.error = m.error;
        self.heap_bytes = m.heap_bytes;
    }
}

/// Counters of PV traffic.
#[derive(Debug, Default)]
pub struct PvCounters {
    /// Guest log lines received.
    pub logs: AtomicU64,
    /// Mailbox doorbells handled.
    pub doorbells: AtomicU64,
    /// Doorbells whose mailbox address or contents were refused.
    pub bad_doorbells: AtomicU64,
    /// Bulk operations performed.
    pub bulk_ops: AtomicU64,
    /// Bulk operations refused (bad range, unknown op).
    pub bulk_refused: AtomicU64,
    /// Bytes the bulk operations covered.
    pub bulk_bytes: AtomicU64,
}

/// A snapshot of [`PvCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvCounterValues {
    /// Guest log lines received.
    pub logs: u64,
    /// Mailbox doorbells handled.
    pub doorbells: u64,
    /// Doorbells whose mailbox address or contents were refused.
    pub bad_doorbells: u64,
    /// Bulk operations performed.
    pub bulk_ops: u64,
    /// Bulk operations refused (bad range, unknown op).
    pub bulk_refused: u64,
    /// Bytes the bulk operations covered.
    pub bulk_bytes: u64,
}

impl PvCounters {
    /// The counts now.
    pub fn snapshot(&self) -> PvCounterValues {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PvCounterValues {
            logs: l(&self.logs),
            doorbells: l(&self.doorbells),
            bad_doorbells: l(&self.bad_doorbells),
            bulk_ops: l(&self.bulk_ops),
            bulk_refused: l(&self.bulk_refused),
            bulk_bytes: l(&self.bulk_bytes),
        }
    }
}

/// The PV control device of one VM.
pub struct PvCtl {
    ram: Arc<GuestRam>,
    /// RAM ranges as the guest sees them in `BootInfo::ram` (for FRAME_BATCH).
    ram_ranges: Vec<MemRange>,
    start: Instant,
    slots: Vec<AtomicU64>,
    cpu_done: Vec<AtomicBool>,
    procs: Mutex<BTreeMap<u32, ProcessRecord>>,
    log_lines: Mutex<Vec<String>>,
    /// PV traffic counters.
    pub counters: PvCounters,
    /// Print guest log lines on stderr (besides tracing).
    echo_logs: bool,
    /// Stamps each phase event with the paging counters ([`Self::set_paging_counters`]).
    paging_counters: OnceLock<PagingCountersFn>,
    /// And with the process's own ([`Self::set_process_counters`]).
    process_counters: OnceLock<ProcessCountersFn>,
    /// Told of every agent-slot change (vCPU, new slot GPA or None).
    slot_listener: OnceLock<SlotListener>,
}

/// What the device holds for the guest across a snapshot: the agent slots, the CPU-done
/// flags, the process records (without their per-run phase events), the kept log lines and
/// the traffic counters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PvState {
    /// Each vCPU's agent-slot GPA (0: none).
    pub slots: Vec<u64>,
    /// Each vCPU's CPU-done flag.
    pub cpu_done: Vec<bool>,
    /// The process records, by pid.
    pub processes: Vec<ProcessRecord>,
    /// The guest log lines kept so far.
    pub log_lines: Vec<String>,
    /// PV traffic so far.
    pub counters: PvCounterValues,
}

/// Called on every agent-slot change: (vCPU, the slot's GPA, or `None` once unregistered).
pub type SlotListener = Box<dyn Fn(u32, Option<u64>) + Send + Sync>;

/// Keeps at most this many guest log lines for `stats`.
const MAX_KEPT_LOG_LINES: usize = 256;

impl PvCtl {
    /// The device for `ncpus` vCPUs over `ram`; `echo_logs` also prints guest log lines on stderr.
    pub fn new(ram: Arc<GuestRam>, ncpus: u32, echo_logs: bool) -> Self {
        let ram_ranges = ram
            .regions()
            .iter()
            .map(|r| MemRange {
                gpa: r.gpa(),
                len: r.len(),
            })
            .collect();
        PvCtl {
            ram,
            ram_ranges,
            start: Instant::now(),
            slots: (0..ncpus).map(|_| AtomicU64::new(0)).collect(),
            cpu_done: (0..ncpus).map(|_| AtomicBool::new(false)).collect(),
            procs: Mutex::new(BTreeMap::new()),
            log_lines: Mutex::new(Vec::new()),
            counters: PvCounters::default(),
            echo_logs,
            paging_counters: OnceLock::new(),
            process_counters: OnceLock::new(),
            slot_listener: OnceLock::new(),
        }
    }

    /// The number of vCPUs the device serves.
    pub fn ncpus(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Makes every later phase event carry the counters `f` returns. Returns false if a
    /// source was already set.
    pub fn set_paging_counters(&self, f: PagingCountersFn) -> bool {
        self.paging_counters.set(f).is_ok()
    }

    /// Makes every later phase event carry the process's own counters as `f(cr3, pid)`
    /// returns them. Returns false if a source was already set.
    pub fn set_process_counters(&self, f: ProcessCountersFn) -> bool {
        self.process_counters.set(f).is_ok()
    }

    /// Calls `f` on every later agent-slot change, synchronously (so that a slot the guest
    /// unregistered stops being read before its page is reused). Returns false if one was set.
    pub fn set_slot_listener(&self, f: SlotListener) -> bool {
        self.slot_listener.set(f).is_ok()
    }

    /// Registers (`Some(gpa)`, a 4 KiB-aligned RAM page) or forgets (`None`) vCPU `cpu`'s agent
    /// slot: the test guest's port 0x507 and the agent device's slot array both land here.
    /// Returns false (and changes nothing) for a bad vCPU or page.
    pub fn set_agent_slot(&self, cpu: u32, gpa: Option<u64>) -> bool {
        let Some(s) = self.slots.get(cpu as usize) else {
            return false;
        };
        match gpa {
            Some(g) if g == 0 || g % PAGE_SIZE != 0 || !self.ram.contains(g, PAGE_SIZE) => false,
            _ => {
                s.store(gpa.unwrap_or(0), Ordering::Release);
                if let Some(f) = self.slot_listener.get() {
                    f(cpu, gpa);
                }
                true
            }
        }
    }

    /// Whether `port` belongs to this device.
    pub fn owns(port: u16) -> bool {
        (pv::PORT_BASE..pv::PORT_BASE + 16).contains(&port)
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Guest `out` of `value` to `port` from vCPU `cpu`.
    pub fn write(&self, cpu: u32, port: u16, value: u32) -> PvAction {
        let gpa = u64::from(value);
        match port {
            pv::PORT_LOG => {
                self.counters.logs.fetch_add(1, Ordering::Relaxed);
                match self.read_log(gpa) {
                    Some((c, text)) => {
                        tracing::info!(target: "guest", cpu = c, "{text}");
                        if self.echo_logs {
                            eprintln!("guest[{c}]: {text}");
                        }
                        let mut lines = self.log_lines.lock().unwrap_or_else(|p| p.into_inner());
                        if lines.len() < MAX_KEPT_LOG_LINES {
                            lines.push(text);
                        }
                    }
                    None => tracing::warn!(cpu, "guest log record at {gpa:#x} is not in RAM"),
                }
                PvAction::Continue
            }
            pv::PORT_MAILBOX => {
                self.doorbell(cpu, gpa);
                PvAction::Continue
            }
            pv::PORT_CPU_DONE => {
                if let Some(d) = self.cpu_done.get(cpu as usize) {
                    d.store(true, Ordering::Release);
                }
                tracing::debug!(cpu, "guest cpu done");
                PvAction::Continue
            }
            pv::PORT_SHUTDOWN => PvAction::Shutdown(value),
            pv::PORT_BULK => {
                self.bulk(gpa);
                PvAction::Continue
            }
            pv::PORT_AGENT_SLOT => {
                if !self.set_agent_slot(cpu, Some(gpa)) {
                    tracing::warn!(cpu, "agent slot GPA {gpa:#x} is not a RAM page; ignored");
                }
                PvAction::Continue
            }
            pv::PORT_PANIC => {
                let msg = self
                    .read_log(gpa)
                    .map(|(c, t)| format!("cpu {c}: {t}"))
                    .unwrap_or_else(|| format!("cpu {cpu}: (panic record at {gpa:#x} unreadable)"));
                PvAction::Panic(msg)
            }
            other => {
                tracing::debug!(cpu, "write {value:#x} to unused PV port {other:#x}");
                PvAction::Continue
            }
        }
    }

    /// Guest `in` from a PV port: reads return the ABI version on the base port, else 0.
    pub fn read(&self, port: u16) -> u32 {
        if port == pv::PORT_BASE {
            farvm_guest_agent::ABI_VERSION
        } else {
            0
        }
    }

    fn read_log(&self, gpa: u64) -> Option<(u32, String)> {
        let rec: LogRecord = self.ram.read_obj(GuestAddress(gpa)).ok()?;
        let len = (rec.len as usize).min(LOG_MAX);
        let text = String::from_utf8_lossy(&rec.bytes[..len])
            .trim_end()
            .to_string();
        Some((rec.cpu, text))
    }

    fn doorbell(&self, cpu: u32, gpa: u64) {
        let host_ns = self.now_ns();
        let paging = self.paging_counters.get().and_then(|f| f());
        let process_counters = self.process_counters.get();
        self.counters.doorbells.fetch_add(1, Ordering::Relaxed);
        let m: Mailbox = match self.ram.read_obj::<Mailbox>(GuestAddress(gpa)) {
            Ok(m) if m.magic == MAILBOX_MAGIC => m,
            _ => {
                self.counters.bad_doorbells.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(cpu, "mailbox doorbell for {gpa:#x}: no valid mailbox there");
                return;
            }
        };
        let mut procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        let rec = procs
            .entry(m.pid)
            .or_insert_with(|| ProcessRecord::new(m.pid, m.cpu, m.workload, m.state, m.phase, gpa));
        rec.update(&m);
        rec.mailbox_gpa = gpa;
        rec.events.push(PhaseEvent {
            phase: m.phase,
            state: m.state,
            host_ns,
            cpu,
            paging,
            process_paging: process_counters.and_then(|f| f(m.cr3, u64::from(m.pid))),
        });
    }

    fn bulk(&self, gpa: u64) {
        self.counters.bulk_ops.fetch_add(1, Ordering::Relaxed);
        let op: BulkOp = match self.ram.read_obj(GuestAddress(gpa)) {
            Ok(op) => op,
            Err(_) => {
                // Nowhere to write a status: the record itself is out of RAM.
                self.counters.bulk_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("bulk op record at {gpa:#x} is outside RAM");
                return;
            }
        };
        let status = self.do_bulk(&op);
        if status != bulk_status::OK {
            self.counters.bulk_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?op, status, "bulk op refused");
        } else {
            self.counters
                .bulk_bytes
                .fetch_add(op.len, Ordering::Relaxed);
        }
        // `status` is the u32 right after `op`.
        let _ = self.ram.write_obj(status, GuestAddress(gpa + 4));
    }

    /// Performs one bulk operation; returns its status.
    pub fn do_bulk(&self, op: &BulkOp) -> u32 {
        match op.op {
            pv::bulk::ZERO => match self.ram.fill(GuestAddress(op.dst), op.len, 0) {
                Ok(()) => bulk_status::OK,
                Err(_) => bulk_status::BAD_RANGE,
            },
            pv::bulk::COPY => {
                match self
                    .ram
                    .copy_within(GuestAddress(op.dst), GuestAddress(op.src), op.len)
                {
                    Ok(()) => bulk_status::OK,
                    Err(_) => bulk_status::BAD_RANGE,
                }
            }
            pv::bulk::FILL_PTES => self.fill_ptes(op),
            pv::bulk::FRAME_BATCH => self.frame_batch(op),
            _ => bulk_status::UNKNOWN_OP,
        }
    }

    fn fill_ptes(&self, op: &BulkOp) -> u32 {
        const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
        let n = op.len as usize;
        // `dst` may point into the table (entry `first` of a 2 MiB chunk); the entries must
        // stay inside that one page-table page.
        if !op.dst.is_multiple_of(8)
            || n == 0
            || n > 512
            || (op.dst % PAGE_SIZE) as usize + n * 8 > PAGE_SIZE as usize
            || !self.ram.contains(op.dst, n as u64 * 8)
            || !op.src.is_multiple_of(8)
        {
            return bulk_status::BAD_RANGE;
        }
        if op.pte_flags & ADDR_MASK != 0 {
            return bulk_status::BAD_RANGE;
        }
        let mut frames = [0u8; 4096];
        if self
            .ram
            .read_slice(&mut frames[..n * 8], GuestAddress(op.src))
            .is_err()
        {
            return bulk_status::BAD_RANGE;
        }
        let mut table = [0u8; 4096];
        for i in 0..n {
            let f = u64::from_le_bytes(frames[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            if f & !ADDR_MASK != 0 || !self.ram.contains(f, PAGE_SIZE) {
                return bulk_status::BAD_RANGE;
            }
            table[i * 8..i * 8 + 8].copy_from_slice(&(f | op.pte_flags).to_le_bytes());
        }
        match self.ram.write_slice(&table[..n * 8], GuestAddress(op.dst)) {
            Ok(()) => bulk_status::OK,
            Err(_) => bulk_status::BAD_RANGE,
        }
    }

    /// Writes `len` frame GPAs of the guest's shuffled free-frame order, positions `src..`, at
    /// `dst` (the permutation is cheap natively and ~1 µs/instruction in emulated ring 0).
    fn frame_batch(&self, op: &BulkOp) -> u32 {
        let n = op.len as usize;
        if n == 0 || n > 512 || !op.dst.is_multiple_of(8) {
            return bulk_status::BAD_RANGE;
        }
        let order = FrameOrder::new(op.aux[0], op.aux[1] as u32, op.aux[2], &self.ram_ranges);
        let mut out = [0u8; 4096];
        for i in 0..n {
            let Some(f) = op
                .src
                .checked_add(i as u64)
                .and_then(|pos| order.frame_gpa(pos))
            else {
                return bulk_status::BAD_RANGE;
            };
            out[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        match self.ram.write_slice(&out[..n * 8], GuestAddress(op.dst)) {
            Ok(()) => bulk_status::OK,
            Err(_) => bulk_status::BAD_RANGE,
        }
    }

    /// GPA of vCPU `cpu`'s agent slot, once announced.
    pub fn agent_slot_gpa(&self, cpu: u32) -> Option<u64> {
        match self.slots.get(cpu as usize)?.load(Ordering::Acquire) {
            0 => None,
            g => Some(g),
        }
    }

    /// Reads vCPU `cpu`'s agent slot consistently (seqlock); `None` before it is announced or
    /// if the guest keeps writing it (gives up after a bounded number of retries).
    pub fn read_agent_slot(&self, cpu: u32) -> Option<AgentSlot> {
        let gpa = self.agent_slot_gpa(cpu)?;
        for _ in 0..1000 {
            let g1 = self
                .ram
                .load::<u64>(GuestAddress(gpa + 8), Ordering::Acquire)
                .ok()?;
            if g1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            std::sync::atomic::fence(Ordering::Acquire);
            let slot: AgentSlot = self.ram.read_obj(GuestAddress(gpa)).ok()?;
            std::sync::atomic::fence(Ordering::Acquire);
            let g2 = self
                .ram
                .load::<u64>(GuestAddress(gpa + 8), Ordering::Acquire)
                .ok()?;
            if g1 == g2 {
                return (slot.magic == SLOT_MAGIC).then_some(slot);
            }
        }
        None
    }

    /// The pid running on vCPU `cpu` now (0 = kernel/idle), from its agent slot.
    pub fn current_pid(&self, cpu: u32) -> Option<u64> {
        self.read_agent_slot(cpu).map(|s| s.pid)
    }

    /// Whether vCPU `cpu` reported CPU-done.
    pub fn cpu_done(&self, cpu: u32) -> bool {
        self.cpu_done
            .get(cpu as usize)
            .is_some_and(|d| d.load(Ordering::Acquire))
    }

    /// Snapshot of every process record, by pid.
    pub fn processes(&self) -> Vec<ProcessRecord> {
        let procs = self.procs.lock().unwrap_or_else(|p| p.into_inner());
        procs.values().cloned().collect()
    }

    /// The guest log lines kept so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log_lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The device's state for a snapshot (see [`PvState`]).
    pub fn save_state(&self) -> PvState {
        let mut processes = self.processes();
        for p in &mut processes {
            p.events.clear();
        }
        PvState {
            slots: self
                .slots
                .iter()
                .map(|s| s.load(Ordering::Acquire))
                .collect(),
            cpu_done: self
                .cpu_done
                .iter()
                .map(|d| d.load(Ordering::Acquire))
                .collect(),
            processes,
            log_lines: self.log_lines(),
            counters: self.counters.snapshot(),
        }
    }

    /// Loads a snapshot's state into a device of as many vCPUs that the guest has not used
    /// yet. Agent slots go through [`Self::set_agent_slot`], so the paging engine follows
    /// them again; a slot the device refuses (not a RAM page) is an error naming the vCPU.
    pub fn restore_state(&self, s: &PvState) -> Result<(), String> {
        let n = self.slots.len();
        if s.slots.len() != n || s.cpu_done.len() != n {
            return Err(format!(
                "the PV device state is for {} vCPUs, the VM has {n}",
                s.slots.len()
            ));
        }
        for (cpu, &gpa) in (0u32..).zip(&s.slots) {
            if gpa != 0 && !self.set_agent_slot(cpu, Some(gpa)) {
                return Err(format!(
                    "vCPU {cpu}'s agent slot {gpa:#x} is not a RAM page"
                ));
            }
        }
        for (d, &done) in self.cpu_done.iter().zip(&s.cpu_done) {
            d.store(done, Ordering::Release);
        }
        *self.procs.lock().unwrap_or_else(|p| p.into_inner()) =
            s.processes.iter().map(|p| (p.pid, p.clone())).collect();
        *self.log_lines.lock().unwrap_or_else(|p| p.into_inner()) = s.log_lines.clone();
        let c = &self.counters;
        let v = &s.counters;
        for (a, x) in [
            (&c.logs, v.logs),
            (&c.doorbells, v.doorbells),
            (&c.bad_doorbells, v.bad_doorbells),
            (&c.bulk_ops, v.bulk_ops),
            (&c.bulk_refused, v.bulk_refused),
            (&c.bulk_bytes, v.bulk_bytes),
        ] {
            a.store(x, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_guest_agent::pv::bulk;

    fn dev() -> PvCtl {
        let ram = Arc::new(GuestRam::local(&[(0, 4 << 20)]).unwrap());
        PvCtl::new(ram, 2, false)
    }

    fn run_bulk(d: &PvCtl, op: BulkOp) -> u32 {
        d.ram.write_obj(op, GuestAddress(0x8000)).unwrap();
        assert_eq!(d.write(0, pv::PORT_BULK, 0x8000), PvAction::Continue);
        d.ram
            .read_obj::<BulkOp>(GuestAddress(0x8000))
            .unwrap()
            .status
    }

    #[test]
    fn bulk_zero_copy_fill() {
        let d = dev();
        d.ram.fill(GuestAddress(0x10000), 0x2000, 0x5a).unwrap();
        let z = BulkOp {
            op: bulk::ZERO,
            dst: 0x10000,
            len: 0x1000,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, z), 0);
        assert_eq!(d.ram.read_obj::<u64>(GuestAddress(0x10ff8)).unwrap(), 0);
        assert_eq!(d.ram.read_obj::<u8>(GuestAddress(0x11000)).unwrap(), 0x5a);
        let c = BulkOp {
            op: bulk::COPY,
            dst: 0x20000,
            src: 0x11000,
            len: 0x1000,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, c), 0);
        assert_eq!(d.ram.read_obj::<u8>(GuestAddress(0x20fff)).unwrap(), 0x5a);
        for (i, f) in [0x30_0000u64, 0x1000, 0x3f_f000].iter().enumerate() {
            d.ram
                .write_obj(*f, GuestAddress(0x9000 + 8 * i as u64))
                .unwrap();
        }
        let f = BulkOp {
            op: bulk::FILL_PTES,
            dst: 0x40000,
            src: 0x9000,
            len: 3,
            pte_flags: 0x8000_0000_0000_0007,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, f), 0);
        assert_eq!(
            d.ram.read_obj::<u64>(GuestAddress(0x40008)).unwrap(),
            0x8000_0000_0000_1007
        );
        assert_eq!(
            d.ram.read_obj::<u64>(GuestAddress(0x40010)).unwrap(),
            0x8000_0000_003f_f007
        );
        // Into the middle of a table: entries 510 and 511.
        let f = BulkOp {
            op: bulk::FILL_PTES,
            dst: 0x40ff0,
            src: 0x9000,
            len: 2,
            pte_flags: 1,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, f), 0);
        assert_eq!(
            d.ram.read_obj::<u64>(GuestAddress(0x40ff8)).unwrap(),
            0x1001
        );
    }

    #[test]
    fn bulk_refuses_bad_requests() {
        let d = dev();
        let cases = [
            (
                BulkOp {
                    op: bulk::ZERO,
                    dst: 4 << 20,
                    len: 1,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: bulk::ZERO,
                    dst: 0,
                    len: u64::MAX,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: bulk::COPY,
                    dst: 0x1000,
                    src: 0x1800,
                    len: 0x1000,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: 99,
                    ..Default::default()
                },
                bulk_status::UNKNOWN_OP,
            ),
            (
                BulkOp {
                    op: bulk::FILL_PTES,
                    dst: 0x40001,
                    src: 0x9000,
                    len: 1,
                    pte_flags: 3,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: bulk::FILL_PTES,
                    dst: 0x40ff8,
                    src: 0x9000,
                    len: 2,
                    pte_flags: 3,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: bulk::FILL_PTES,
                    dst: 0x40000,
                    src: 0x9000,
                    len: 513,
                    pte_flags: 3,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
            (
                BulkOp {
                    op: bulk::FILL_PTES,
                    dst: 0x40000,
                    src: 0x9000,
                    len: 1,
                    pte_flags: 0x5000,
                    ..Default::default()
                },
                bulk_status::BAD_RANGE,
            ),
        ];
        for (op, want) in cases {
            assert_eq!(run_bulk(&d, op), want, "{op:?}");
        }
        d.ram.write_obj(64u64 << 20, GuestAddress(0x9000)).unwrap();
        let f = BulkOp {
            op: bulk::FILL_PTES,
            dst: 0x40000,
            src: 0x9000,
            len: 1,
            pte_flags: 3,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, f), bulk_status::BAD_RANGE, "frame outside RAM");
        assert_eq!(d.counters.bulk_refused.load(Ordering::Relaxed), 9);
    }

    #[test]
    fn frame_batch_matches_frame_order() {
        let d = dev();
        let aux = [0x1234, 0, 0x20_0000, 0];
        let op = BulkOp {
            op: bulk::FRAME_BATCH,
            dst: 0x9000,
            src: 5,
            len: 16,
            aux,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, op), 0);
        let ranges = [MemRange {
            gpa: 0,
            len: 4 << 20,
        }];
        let order = FrameOrder::new(0x1234, 0, 0x20_0000, &ranges);
        for i in 0..16u64 {
            let got: u64 = d.ram.read_obj(GuestAddress(0x9000 + 8 * i)).unwrap();
            assert_eq!(Some(got), order.frame_gpa(5 + i));
            assert!((0x20_0000..4 << 20).contains(&got));
        }
        let past = BulkOp {
            op: bulk::FRAME_BATCH,
            dst: 0x9000,
            src: order.len() - 1,
            len: 2,
            aux,
            ..Default::default()
        };
        assert_eq!(run_bulk(&d, past), bulk_status::BAD_RANGE);
    }

    #[test]
    fn mailbox_and_agent_slot() {
        let d = dev();
        let m = Mailbox {
            magic: MAILBOX_MAGIC,
            pid: 7,
            cpu: 1,
            workload: 1,
            state: 2,
            phase: 2,
            checksum: 99,
            ..Default::default()
        };
        d.ram.write_obj(m, GuestAddress(0x50000)).unwrap();
        d.write(1, pv::PORT_MAILBOX, 0x50000);
        d.write(1, pv::PORT_MAILBOX, 0x60000); // no mailbox there
        let p = d.processes();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].pid, p[0].checksum, p[0].events.len()), (7, 99, 1));
        assert_eq!(d.counters.bad_doorbells.load(Ordering::Relaxed), 1);

        assert_eq!(d.current_pid(1), None);
        let s = AgentSlot {
            magic: SLOT_MAGIC,
            generation: 4,
            cpu: 1,
            version: 1,
            pid: 7,
            cr3: 0x5000,
            switches: 2,
        };
        d.ram.write_obj(s, GuestAddress(0x70000)).unwrap();
        d.write(1, pv::PORT_AGENT_SLOT, 0x70001); // misaligned: ignored
        assert_eq!(d.agent_slot_gpa(1), None);
        d.write(1, pv::PORT_AGENT_SLOT, 0x70000);
        assert_eq!(d.current_pid(1), Some(7));
        d.ram.write_obj(5u64, GuestAddress(0x70008)).unwrap(); // writer in progress
        assert_eq!(d.current_pid(1), None);
    }

    #[test]
    fn phase_events_carry_the_paging_counters_of_their_moment() {
        let d = dev();
        let m = Mailbox {
            magic: MAILBOX_MAGIC,
            pid: 3,
            phase: 2,
            ..Default::default()
        };
        d.ram.write_obj(m, GuestAddress(0x50000)).unwrap();
        d.write(0, pv::PORT_MAILBOX, 0x50000);
        let faults = Arc::new(AtomicU64::new(10));
        let f = faults.clone();
        assert!(d.set_paging_counters(Box::new(move || {
            Some(CounterValues {
                demand_faults: f.load(Ordering::Relaxed),
                ..Default::default()
            })
        })));
        assert!(!d.set_paging_counters(Box::new(|| None)), "set once");
        d.write(0, pv::PORT_MAILBOX, 0x50000);
        faults.store(25, Ordering::Relaxed);
        d.ram
            .write_obj(Mailbox { phase: 3, ..m }, GuestAddress(0x50000))
            .unwrap();
        d.write(0, pv::PORT_MAILBOX, 0x50000);
        let ev = &d.processes()[0].events;
        let at: Vec<_> = ev
            .iter()
            .map(|e| (e.phase, e.paging.as_ref().map(|c| c.demand_faults)))
            .collect();
        assert_eq!(at, [(2, None), (2, Some(10)), (3, Some(25))]);
        let json = serde_json::to_value(&ev[0]).unwrap();
        assert!(json.get("paging").is_none(), "no engine, no paging key");
        assert!(json.get("process_paging").is_none());
    }

    #[test]
    fn shutdown_and_panic() {
        let d = dev();
        assert_eq!(d.write(0, pv::PORT_SHUTDOWN, 3), PvAction::Shutdown(3));
        let mut rec = LogRecord {
            len: 9,
            cpu: 1,
            bytes: [0; LOG_MAX],
        };
        rec.bytes[..9].copy_from_slice(b"main.rs:4");
        d.ram.write_obj(rec, GuestAddress(0x3000)).unwrap();
        assert_eq!(
            d.write(1, pv::PORT_PANIC, 0x3000),
            PvAction::Panic("cpu 1: main.rs:4".into())
        );
    }
}
