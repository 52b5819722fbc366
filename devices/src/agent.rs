//! The farvm agent device (`farvm_guest_agent::device`): an MMIO register window through which a
//! guest agent (farvm's Linux kernel module, found by ACPI `_HID` "FARV0001") agrees on a
//! protocol version, registers its per-vCPU agent slots and its process-event ring, and rings
//! the VMM when process events are queued.
//!
//! The device validates everything the guest writes: a version outside the VMM's range is
//! refused (and logged); an address must lie in guest RAM (checked against the RAM ranges before
//! any access, and every access goes through vm-memory's bounds-checked `Bytes`); ring records
//! are checked one by one and at most one ring's worth is taken per doorbell. What it accepts it
//! hands on: slot changes to the [`AgentHost`] (the VMM points the paging engine at them), process
//! events into its own bounded [`GuestProcesses`] table (names for per-process statistics).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use farvm_guest_agent::device::ring::{self, kind, ProcEvent, RingHeader, RING_MAGIC};
use farvm_guest_agent::device::{
    cmd, feature, reg, result, status, DEVICE_MAGIC, MAX_SLOTS, SLOT_STRIDE,
};
use vm_device::bus::{MmioAddress, MmioAddressOffset};
use vm_device::DeviceMmio;
use vm_memory::{Bytes, GuestAddress};

/// A registered slot array: the slot of vCPU `i` is the page at `base + i * SLOT_STRIDE`, for
/// `i < count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotArray {
    /// Guest-physical address of slot 0.
    pub base: u64,
    /// Number of slots.
    pub count: u32,
}

impl SlotArray {
    /// The slot page of vCPU `cpu`, if the array has one.
    pub fn slot(&self, cpu: u32) -> Option<u64> {
        (cpu < self.count).then(|| self.base + u64::from(cpu) * SLOT_STRIDE)
    }
}

/// What the VMM does with the agent's registrations. Called on the vCPU thread that wrote the
/// register, before the write returns to the guest.
pub trait AgentHost: Send + Sync {
    /// The agent registered a slot array (`Some`), or unregistered it (`None`: from now on its
    /// pages may be reused by the guest, so stop reading them before returning).
    fn slots_changed(&self, slots: Option<SlotArray>);
}

/// One guest process as the agent reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestProcess {
    /// Its pid (thread-group id).
    pub pid: u32,
    /// Its parent's pid.
    pub ppid: u32,
    /// Its user id.
    pub uid: u32,
    /// UTF-8 (invalid bytes and control characters replaced).
    pub name: String,
    /// The names it had before its renames (an `exec` is one, with a new address space), oldest
    /// first, at most [`MAX_EARLIER_NAMES`]: statistics of an address space it left keep the
    /// name that address space ran under.
    pub earlier_names: Vec<String>,
    /// Guest boot time (ns) when it started, and when it exited.
    pub started_ns: u64,
    /// When it exited, if it did.
    pub exited_ns: Option<u64>,
}

/// Processes the table keeps alive at most (beyond that, `START` events are counted and
/// dropped).
pub const MAX_LIVE_PROCESSES: usize = 65536;
/// Exited processes kept for naming (oldest forgotten first).
pub const MAX_EXITED_PROCESSES: usize = 1024;
/// Earlier names kept per process (oldest forgotten first).
pub const MAX_EARLIER_NAMES: usize = 8;

/// The guest's processes as the agent's ring told them (bounded, see the constants).
#[derive(Debug, Default)]
pub struct GuestProcesses {
    live: BTreeMap<u32, GuestProcess>,
    exited: VecDeque<GuestProcess>,
    /// Events refused because the live table was full.
    pub overflow: u64,
}

impl GuestProcesses {
    /// Applies one event whose fields were validated.
    fn apply(&mut self, e: &ProcEvent, name: String) {
        match e.kind {
            kind::PRESENT | kind::START | kind::RENAME => {
                if let Some(p) = self.live.get_mut(&e.pid) {
                    if e.kind != kind::RENAME {
                        // A pid reused without the exit seen (a ring overflow): a new process.
                        p.ppid = e.ppid;
                        p.uid = e.uid;
                        p.started_ns = e.time_ns;
                        p.earlier_names.clear();
                    } else if p.name != name {
                        if p.earlier_names.len() == MAX_EARLIER_NAMES {
                            p.earlier_names.remove(0);
                        }
                        p.earlier_names.push(std::mem::take(&mut p.name));
                    }
                    p.name = name;
                    return;
                }
                if self.live.len() >= MAX_LIVE_PROCESSES {
                    self.overflow += 1;
                    return;
                }
                self.live.insert(
                    e.pid,
                    GuestProcess {
                        pid: e.pid,
                        ppid: e.ppid,
                        uid: e.uid,
                        name,
                        earlier_names: Vec::new(),
                        started_ns: e.time_ns,
                        exited_ns: None,
                    },
                );
            }
            kind::EXIT => {
                let mut p = self.live.remove(&e.pid).unwrap_or(GuestProcess {
                    pid: e.pid,
                    ppid: e.ppid,
                    uid: e.uid,
                    name,
                    earlier_names: Vec::new(),
                    started_ns: 0,
                    exited_ns: None,
                });
                p.exited_ns = Some(e.time_ns);
                if self.exited.len() == MAX_EXITED_PROCESSES {
                    self.exited.pop_front();
                }
                self.exited.push_back(p);
            }
            _ => {}
        }
    }

    /// The live process `pid`, else the most recent exited one.
    pub fn get(&self, pid: u32) -> Option<&GuestProcess> {
        self.live
            .get(&pid)
            .or_else(|| self.exited.iter().rev().find(|p| p.pid == pid))
    }

    /// Live processes, by pid.
    pub fn live(&self) -> impl Iterator<Item = &GuestProcess> {
        self.live.values()
    }

    /// Exited processes still remembered, oldest first.
    pub fn exited(&self) -> impl Iterator<Item = &GuestProcess> {
        self.exited.iter()
    }
}

/// Counters of the device (for the VMM's stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentCounters {
    /// Versions agreed.
    pub negotiations: u64,
    /// Version writes refused (no common version).
    pub refused_versions: u64,
    /// Commands refused (see the result codes).
    pub refused_commands: u64,
    /// Doorbell writes.
    pub doorbells: u64,
    /// Ring records taken and applied.
    pub records: u64,
    /// Ring records refused (unknown kind, pid 0) or skipped (a malformed head).
    pub refused_records: u64,
    /// Records the guest said it dropped (its ring was full), as of the last doorbell.
    pub guest_dropped: u64,
}

#[derive(Debug, Default)]
struct Ring {
    base: u64,
    capacity: u32,
    /// Records taken so far (the VMM's own copy; the header's is never trusted).
    tail: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Negotiated version, 0 = none.
    version: u32,
    result: u32,
    slots_lo: u32,
    slots_hi: u32,
    slots_count: u32,
    ring_lo: u32,
    ring_hi: u32,
    ring_bytes: u32,
    slots: Option<SlotArray>,
    ring: Option<Ring>,
    counters: AgentCounters,
    procs: GuestProcesses,
}

/// The agent device of one VM.
pub struct AgentDevice<M> {
    mem: M,
    /// Guest RAM as `(gpa, len)` ranges: every address the guest names must lie in one.
    ram: Vec<(u64, u64)>,
    ncpus: u32,
    version_min: u32,
    version_max: u32,
    host: Box<dyn AgentHost>,
    state: Mutex<State>,
}

impl<M> std::fmt::Debug for AgentDevice<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDevice")
            .field("ncpus", &self.ncpus)
            .field("versions", &(self.version_min..=self.version_max))
            .finish()
    }
}

fn join(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

impl<M: Bytes<GuestAddress> + Send + Sync> AgentDevice<M> {
    /// The device of a VM with `ncpus` vCPUs and guest RAM `mem` made of `ram` ranges
    /// (`(gpa, len)`), speaking agent-protocol versions
    /// `farvm_guest_agent::device::{AGENT_VERSION_MIN..=AGENT_VERSION}`.
    pub fn new(mem: M, ram: Vec<(u64, u64)>, ncpus: u32, host: Box<dyn AgentHost>) -> Self {
        use farvm_guest_agent::device::{AGENT_VERSION, AGENT_VERSION_MIN};
        Self::with_versions(mem, ram, ncpus, host, AGENT_VERSION_MIN, AGENT_VERSION)
    }

    /// As [`AgentDevice::new`], speaking versions `min..=max` (tests of old and new agents).
    pub fn with_versions(
        mem: M,
        ram: Vec<(u64, u64)>,
        ncpus: u32,
        host: Box<dyn AgentHost>,
        min: u32,
        max: u32,
    ) -> Self {
        AgentDevice {
            mem,
            ram,
            ncpus,
            version_min: min,
            version_max: max,
            host,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `gpa..gpa+len` lies inside one RAM range (no overflow).
    fn in_ram(&self, gpa: u64, len: u64) -> bool {
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        self.ram
            .iter()
            .any(|&(a, l)| gpa >= a && a.checked_add(l).is_some_and(|e| end <= e))
    }

    /// The slot array the guest registered, if any.
    pub fn slots(&self) -> Option<SlotArray> {
        self.lock().slots
    }

    /// The negotiated agent-protocol version (0 = none).
    pub fn version(&self) -> u32 {
        self.lock().version
    }

    /// The device's counters so far.
    pub fn counters(&self) -> AgentCounters {
        self.lock().counters
    }

    /// Runs `f` on the process table (under the device's lock: keep it short).
    pub fn with_processes<T>(&self, f: impl FnOnce(&GuestProcesses) -> T) -> T {
        f(&self.lock().procs)
    }

    /// The name of guest process `pid`, if the agent reported it.
    pub fn process_name(&self, pid: u32) -> Option<String> {
        self.with_processes(|p| p.get(pid).map(|p| p.name.clone()))
    }

    /// The names guest process `pid` ran under, newest first (its name now, then the ones it
    /// had before each rename); empty if the agent never reported it.
    pub fn process_names(&self, pid: u32) -> Vec<String> {
        self.with_processes(|p| {
            p.get(pid).map_or_else(Vec::new, |p| {
                std::iter::once(&p.name)
                    .chain(p.earlier_names.iter().rev())
                    .cloned()
                    .collect()
            })
        })
    }

    /// A guest read of register `offset`.
    pub fn read_register(&self, offset: u64) -> u32 {
        let s = self.lock();
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        let status = bit(s.version != 0, status::NEGOTIATED)
            | bit(s.slots.is_some(), status::SLOTS)
            | bit(s.ring.is_some(), status::RING);
        match offset {
            reg::MAGIC => DEVICE_MAGIC,
            reg::VERSION_MAX => self.version_max,
            reg::VERSION_MIN => self.version_min,
            reg::NCPUS => self.ncpus,
            reg::FEATURES => feature::SLOTS | feature::PROCESS_RING,
            reg::VERSION => s.version,
            reg::STATUS => status,
            reg::RESULT => s.result,
            reg::SLOTS_LO => s.slots_lo,
            reg::SLOTS_HI => s.slots_hi,
            reg::SLOTS_COUNT => s.slots_count,
            reg::RING_LO => s.ring_lo,
            reg::RING_HI => s.ring_hi,
            reg::RING_BYTES => s.ring_bytes,
            reg::RING_TAKEN => s.counters.records as u32,
            reg::RING_REFUSED => s.counters.refused_records as u32,
            _ => 0,
        }
    }

    /// A guest write of `value` to register `offset`.
    pub fn write_register(&self, offset: u64, value: u32) {
        let mut s = self.lock();
        match offset {
            reg::VERSION => self.negotiate(&mut s, value),
            reg::SLOTS_LO => s.slots_lo = value,
            reg::SLOTS_HI => s.slots_hi = value,
            reg::SLOTS_COUNT => s.slots_count = value,
            reg::RING_LO => s.ring_lo = value,
            reg::RING_HI => s.ring_hi = value,
            reg::RING_BYTES => s.ring_bytes = value,
            reg::COMMAND => {
                s.result = self.command(&mut s, value);
                if s.result != result::OK {
                    s.counters.refused_commands += 1;
                    tracing::warn!(
                        command = value,
                        result = s.result,
                        "guest agent command refused ({})",
                        describe_result(s.result)
                    );
                }
            }
            reg::DOORBELL => {
                s.counters.doorbells += 1;
                self.drain(&mut s);
            }
            _ => {}
        }
    }

    fn negotiate(&self, s: &mut State, v: u32) {
        s.counters.negotiations += 1;
        if v == 0 || v < self.version_min || v > self.version_max {
            s.counters.refused_versions += 1;
            s.result = result::BAD_VERSION;
            tracing::warn!(
                "guest agent asked for agent protocol v{v}; this VMM speaks v{}..=v{}: refused \
                 (per-process attribution stays off until an agent of a common version loads)",
                self.version_min,
                self.version_max
            );
            return;
        }
        if v < self.version_max {
            tracing::info!(
                "guest agent speaks agent protocol v{v} (older than this VMM's v{}): using v{v}",
                self.version_max
            );
        } else {
            tracing::info!("guest agent: agent protocol v{v}");
        }
        s.version = v;
        s.result = result::OK;
    }

    fn command(&self, s: &mut State, c: u32) -> u32 {
        if s.version == 0 && c != cmd::RESET {
            return result::NOT_NEGOTIATED;
        }
        match c {
            cmd::REGISTER_SLOTS => {
                let base = join(s.slots_lo, s.slots_hi);
                let count = s.slots_count;
                if count == 0 || count > MAX_SLOTS {
                    return result::BAD_COUNT;
                }
                if base == 0
                    || !base.is_multiple_of(SLOT_STRIDE)
                    || !self.in_ram(base, u64::from(count) * SLOT_STRIDE)
                {
                    return result::BAD_ADDRESS;
                }
                if count < self.ncpus {
                    tracing::warn!(
                        "guest agent registered {count} slots for {} vCPUs: the others' faults \
                         stay unattributed",
                        self.ncpus
                    );
                }
                let slots = SlotArray { base, count };
                tracing::info!(
                    "guest agent slots at {base:#x} for {} vCPUs",
                    count.min(self.ncpus)
                );
                s.slots = Some(slots);
                self.host.slots_changed(Some(slots));
                result::OK
            }
            cmd::UNREGISTER_SLOTS => {
                if s.slots.take().is_some() {
                    self.host.slots_changed(None);
                    tracing::info!("guest agent unregistered its slots");
                }
                result::OK
            }
            cmd::REGISTER_RING => self.register_ring(s),
            cmd::UNREGISTER_RING => {
                s.ring = None;
                result::OK
            }
            cmd::RESET => {
                if s.slots.take().is_some() {
                    self.host.slots_changed(None);
                }
                s.ring = None;
                s.version = 0;
                result::OK
            }
            _ => result::UNKNOWN_COMMAND,
        }
    }

    fn register_ring(&self, s: &mut State) -> u32 {
        let base = join(s.ring_lo, s.ring_hi);
        let bytes = u64::from(s.ring_bytes);
        if base == 0 || !base.is_multiple_of(64) || !self.in_ram(base, bytes) {
            return result::BAD_ADDRESS;
        }
        let Ok(h) = self.mem.read_obj::<RingHeader>(GuestAddress(base)) else {
            return result::BAD_ADDRESS;
        };
        if h.magic != RING_MAGIC
            || h.version != ring::RING_VERSION
            || h.capacity == 0
            || h.capacity > ring::MAX_CAPACITY
            || ring::ring_bytes(h.capacity) > bytes
        {
            return result::BAD_RING;
        }
        // Start from the guest's tail if it is sane (it may have queued records already).
        let tail = if h.head >= h.tail && h.head - h.tail <= u64::from(h.capacity) {
            h.tail
        } else {
            h.head
        };
        s.ring = Some(Ring {
            base,
            capacity: h.capacity,
            tail,
        });
        tracing::info!(
            "guest agent process ring at {base:#x}, {} records",
            h.capacity
        );
        self.drain(s);
        result::OK
    }

    /// Takes the records `tail..head` of the ring (at most its capacity) into the table.
    fn drain(&self, s: &mut State) {
        let Some(r) = s.ring.as_mut() else {
            return;
        };
        let head_gpa = GuestAddress(r.base + core::mem::offset_of!(RingHeader, head) as u64);
        let Ok(head) = self.mem.read_obj::<u64>(head_gpa) else {
            return;
        };
        if let Ok(d) = self.mem.read_obj::<u64>(GuestAddress(
            r.base + core::mem::offset_of!(RingHeader, dropped) as u64,
        )) {
            s.counters.guest_dropped = d;
        }
        if head < r.tail || head - r.tail > u64::from(r.capacity) {
            // Not a head this ring can have: take nothing, start again from it.
            s.counters.refused_records += 1;
            tracing::warn!(
                head,
                tail = r.tail,
                "guest agent process ring: head out of range; resynchronised"
            );
            r.tail = head;
        }
        let (base, capacity) = (r.base, r.capacity);
        let mut n = r.tail;
        while n < head {
            let gpa = ring::record_gpa(base, capacity, n);
            n += 1;
            let Ok(e) = self.mem.read_obj::<ProcEvent>(GuestAddress(gpa)) else {
                s.counters.refused_records += 1;
                continue;
            };
            if !(kind::PRESENT..=kind::EXIT).contains(&e.kind) || e.pid == 0 {
                s.counters.refused_records += 1;
                continue;
            }
            let name = clean_name(e.name_bytes());
            s.procs.apply(&e, name);
            s.counters.records += 1;
        }
        if let Some(r) = s.ring.as_mut() {
            r.tail = n;
        }
        let tail_gpa = GuestAddress(base + core::mem::offset_of!(RingHeader, tail) as u64);
        let _ = self.mem.write_obj(n, tail_gpa);
    }
}

/// A guest-supplied name made printable: invalid UTF-8 and control characters become U+FFFD.
fn clean_name(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// What a [`reg::RESULT`] value means, for logs.
pub fn describe_result(r: u32) -> &'static str {
    match r {
        result::OK => "ok",
        result::BAD_VERSION => "no agent-protocol version in common",
        result::NOT_NEGOTIATED => "no version negotiated yet",
        result::BAD_ADDRESS => "address not in guest RAM (or misaligned)",
        result::BAD_COUNT => "slot count out of range",
        result::UNKNOWN_COMMAND => "unknown command",
        result::BAD_RING => "malformed process ring header",
        _ => "unknown result",
    }
}

impl<M: Bytes<GuestAddress> + Send + Sync> DeviceMmio for AgentDevice<M> {
    fn mmio_read(&self, _base: MmioAddress, offset: MmioAddressOffset, data: &mut [u8]) {
        if data.len() == 4 && offset.is_multiple_of(4) {
            data.copy_from_slice(&self.read_register(offset).to_le_bytes());
        } else {
            data.fill(0);
        }
    }

    fn mmio_write(&self, _base: MmioAddress, offset: MmioAddressOffset, data: &[u8]) {
        if let (Ok(b), true) = (<[u8; 4]>::try_from(data), offset.is_multiple_of(4)) {
            self.write_register(offset, u32::from_le_bytes(b));
        }
    }
}
