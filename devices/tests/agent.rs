//! The farvm agent device driven the way the Linux agent module drives it: version
//! negotiation (old agent on a new VMM and the reverse: downgraded or refused), slot and ring
//! registration with every guest address checked, process events named in the table, and random
//! register and ring traffic that never panics and never hands the VMM a slot outside guest RAM.

use std::sync::{Arc, Mutex};

use farvm_devices::agent::{AgentDevice, AgentHost, SlotArray};
use farvm_guest_agent::device::ring::{self, kind, ProcEvent, RingHeader, RING_MAGIC};
use farvm_guest_agent::device::{
    cmd, negotiate, reg, result, status, AGENT_VERSION, DEVICE_MAGIC, MAX_SLOTS,
};
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM: 0..1 MiB and 2..3 MiB, a hole between them.
const RAM: [(u64, u64); 2] = [(0, 1 << 20), (2 << 20, 1 << 20)];
const SLOTS: u64 = 0x10000;
const RING: u64 = 0x20000;
const NCPUS: u32 = 2;

/// Records every `slots_changed` call.
#[derive(Clone, Default)]
struct Host(Arc<Mutex<Vec<Option<SlotArray>>>>);

impl AgentHost for Host {
    fn slots_changed(&self, slots: Option<SlotArray>) {
        self.0.lock().unwrap().push(slots);
    }
}

impl Host {
    fn calls(&self) -> Vec<Option<SlotArray>> {
        self.0.lock().unwrap().clone()
    }
}

struct Rig {
    dev: AgentDevice<GuestMemoryMmap>,
    mem: GuestMemoryMmap,
    host: Host,
}

fn rig_versions(min: u32, max: u32) -> Rig {
    let ranges: Vec<_> = RAM
        .iter()
        .map(|&(a, l)| (GuestAddress(a), l as usize))
        .collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    let host = Host::default();
    let dev = AgentDevice::with_versions(
        mem.clone(),
        RAM.to_vec(),
        NCPUS,
        Box::new(host.clone()),
        min,
        max,
    );
    Rig { dev, mem, host }
}

fn rig() -> Rig {
    let ranges: Vec<_> = RAM
        .iter()
        .map(|&(a, l)| (GuestAddress(a), l as usize))
        .collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    let host = Host::default();
    let dev = AgentDevice::new(mem.clone(), RAM.to_vec(), NCPUS, Box::new(host.clone()));
    Rig { dev, mem, host }
}

impl Rig {
    fn rd(&self, r: u64) -> u32 {
        self.dev.read_register(r)
    }
    fn wr(&self, r: u64, v: u32) {
        self.dev.write_register(r, v)
    }
    fn command(&self, c: u32) -> u32 {
        self.wr(reg::COMMAND, c);
        self.rd(reg::RESULT)
    }
    /// What the module does at probe: negotiate from the agent's range `amin..=amax`.
    fn attach(&self, amin: u32, amax: u32) -> u32 {
        assert_eq!(self.rd(reg::MAGIC), DEVICE_MAGIC);
        let chosen = negotiate(
            amin,
            amax,
            self.rd(reg::VERSION_MIN),
            self.rd(reg::VERSION_MAX),
        );
        self.wr(reg::VERSION, chosen.unwrap_or(amax));
        self.rd(reg::RESULT)
    }
    fn register_slots(&self, base: u64, count: u32) -> u32 {
        self.wr(reg::SLOTS_LO, base as u32);
        self.wr(reg::SLOTS_HI, (base >> 32) as u32);
        self.wr(reg::SLOTS_COUNT, count);
        self.command(cmd::REGISTER_SLOTS)
    }
    fn register_ring(&self, base: u64, capacity: u32) -> u32 {
        let h = RingHeader {
            magic: RING_MAGIC,
            version: ring::RING_VERSION,
            capacity,
            ..RingHeader::default()
        };
        self.mem.write_obj(h, GuestAddress(base)).unwrap();
        self.wr(reg::RING_LO, base as u32);
        self.wr(reg::RING_HI, (base >> 32) as u32);
        self.wr(reg::RING_BYTES, ring::ring_bytes(capacity) as u32);
        self.command(cmd::REGISTER_RING)
    }
    /// The module's ring_push + doorbell.
    fn push(&self, base: u64, events: &[ProcEvent]) {
        let h: RingHeader = self.mem.read_obj(GuestAddress(base)).unwrap();
        let mut head = h.head;
        for e in events {
            self.mem
                .write_obj(*e, GuestAddress(ring::record_gpa(base, h.capacity, head)))
                .unwrap();
            head += 1;
        }
        self.mem.write_obj(head, GuestAddress(base + 16)).unwrap();
        self.wr(reg::DOORBELL, 1);
    }
}

fn ev(k: u32, pid: u32, name: &str, t: u64) -> ProcEvent {
    let mut e = ProcEvent {
        kind: k,
        pid,
        ppid: 1,
        uid: 0,
        time_ns: t,
        ..ProcEvent::default()
    };
    e.set_name(name);
    e
}

#[test]
fn same_version_attaches_and_registers_slots() {
    let r = rig();
    assert_eq!(r.rd(reg::NCPUS), NCPUS);
    assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
    assert_eq!(r.dev.version(), AGENT_VERSION);
    assert_eq!(r.register_slots(SLOTS, NCPUS), result::OK);
    let want = SlotArray {
        base: SLOTS,
        count: NCPUS,
    };
    assert_eq!(r.host.calls(), vec![Some(want)]);
    assert_eq!(r.dev.slots(), Some(want));
    assert_eq!(want.slot(1), Some(SLOTS + 4096));
    assert_eq!(want.slot(2), None);
    assert_eq!(
        r.rd(reg::STATUS),
        status::NEGOTIATED | status::SLOTS,
        "negotiated, slots, no ring"
    );
    assert_eq!(r.command(cmd::UNREGISTER_SLOTS), result::OK);
    assert_eq!(r.host.calls(), vec![Some(want), None]);
    assert_eq!(r.dev.slots(), None);
}

#[test]
fn an_old_agent_on_a_newer_vmm_is_downgraded_and_a_too_old_one_refused() {
    // VMM speaks v1..=v2; an agent that only knows v1 runs at v1.
    let r = rig_versions(1, 2);
    assert_eq!(r.attach(1, 1), result::OK);
    assert_eq!(r.dev.version(), 1);
    assert_eq!(r.register_slots(SLOTS, NCPUS), result::OK);

    // VMM dropped v1 (speaks v2..=v3): a v1 agent is refused, and stays unattached.
    let r = rig_versions(2, 3);
    assert_eq!(r.attach(1, 1), result::BAD_VERSION);
    assert_eq!(r.dev.version(), 0);
    assert_eq!(r.register_slots(SLOTS, NCPUS), result::NOT_NEGOTIATED);
    assert!(r.host.calls().is_empty(), "no slots reach the engine");
    let c = r.dev.counters();
    assert_eq!((c.refused_versions, c.refused_commands), (1, 1));
}

#[test]
fn a_new_agent_on_an_older_vmm_meets_it_or_is_refused() {
    // Agent speaks v1..=v3, VMM only v1: the agent chooses v1.
    let r = rig_versions(1, 1);
    assert_eq!(r.attach(1, 3), result::OK);
    assert_eq!(r.dev.version(), 1);
    // An agent that wrote its own newest version anyway is refused: the VMM never runs a
    // version outside its range.
    let r = rig_versions(1, 1);
    r.wr(reg::VERSION, 3);
    assert_eq!(r.rd(reg::RESULT), result::BAD_VERSION);
    assert_eq!(r.dev.version(), 0);
    // An agent that no longer speaks v1 against a v1-only VMM: nothing in common.
    let r = rig_versions(1, 1);
    assert_eq!(r.attach(2, 3), result::BAD_VERSION);
    r.wr(reg::VERSION, 0);
    assert_eq!(
        r.rd(reg::RESULT),
        result::BAD_VERSION,
        "0 is never a version"
    );
}

#[test]
fn slot_addresses_outside_ram_or_misaligned_are_refused_keeping_the_old_registration() {
    let r = rig();
    assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
    assert_eq!(r.register_slots(SLOTS, NCPUS), result::OK);
    let hole = 1 << 20;
    for (base, count, want) in [
        (0, NCPUS, result::BAD_ADDRESS),         // null
        (SLOTS + 8, NCPUS, result::BAD_ADDRESS), // misaligned
        (hole, 1, result::BAD_ADDRESS),          // in the hole
        (hole - 4096, 2, result::BAD_ADDRESS),   // straddles into the hole
        (3 << 20, 1, result::BAD_ADDRESS),       // past the end of RAM
        (!4095, 1, result::BAD_ADDRESS),         // overflows
        (SLOTS, 0, result::BAD_COUNT),
        (SLOTS, MAX_SLOTS + 1, result::BAD_COUNT),
    ] {
        assert_eq!(
            r.register_slots(base, count),
            want,
            "base {base:#x} count {count}"
        );
    }
    assert_eq!(
        r.dev.slots(),
        Some(SlotArray {
            base: SLOTS,
            count: NCPUS
        })
    );
    assert_eq!(r.host.calls().len(), 1, "refusals never reach the engine");
    assert_eq!(r.command(99), result::UNKNOWN_COMMAND);
    // RESET unregisters and forgets the version.
    assert_eq!(r.command(cmd::RESET), result::OK);
    assert_eq!(r.host.calls().last(), Some(&None));
    assert_eq!(r.dev.version(), 0);
    assert_eq!(r.register_slots(SLOTS, NCPUS), result::NOT_NEGOTIATED);
}

#[test]
fn process_events_name_processes_and_exits_are_remembered() {
    let r = rig();
    assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
    assert_eq!(r.register_ring(RING, 7), result::OK);
    r.push(
        RING,
        &[
            ev(kind::PRESENT, 1, "init", 10),
            ev(kind::START, 40, "sh", 20),
            ev(kind::RENAME, 40, "sqlite3", 30),
            ev(kind::START, 41, "bad\u{1}name", 35),
        ],
    );
    assert_eq!(r.dev.process_name(40).as_deref(), Some("sqlite3"));
    // The name it ran under before its exec is kept, newest first.
    assert_eq!(r.dev.process_names(40), ["sqlite3", "sh"]);
    assert_eq!(r.dev.process_names(1), ["init"]);
    assert!(r.dev.process_names(99).is_empty());
    assert_eq!(r.dev.process_name(41).as_deref(), Some("bad\u{fffd}name"));
    assert_eq!(r.rd(reg::RING_TAKEN), 4);
    // More than the ring's capacity over several doorbells (wraps around).
    for i in 0..5u32 {
        r.push(
            RING,
            &[
                ev(kind::START, 100 + i, "w", 40),
                ev(kind::EXIT, 100 + i, "w", 50),
            ],
        );
    }
    r.push(RING, &[ev(kind::EXIT, 40, "sqlite3", 60)]);
    let (live, exited) = r.dev.with_processes(|p| {
        (
            p.live().map(|p| p.pid).collect::<Vec<_>>(),
            p.exited().count(),
        )
    });
    assert_eq!(live, vec![1, 41]);
    assert_eq!(exited, 6);
    let p = r.dev.with_processes(|p| p.get(40).cloned()).unwrap();
    assert_eq!(
        (p.name.as_str(), p.started_ns, p.exited_ns),
        ("sqlite3", 20, Some(60))
    );
    let tail: u64 = r.mem.read_obj(GuestAddress(RING + 24)).unwrap();
    assert_eq!(tail, 4 + 10 + 1, "the VMM publishes its tail");
    // Garbage records are refused one by one; the rest still land.
    r.push(
        RING,
        &[
            ev(9, 5, "x", 0),
            ev(kind::START, 0, "x", 0),
            ev(kind::START, 7, "ok", 1),
        ],
    );
    assert_eq!(r.dev.process_name(7).as_deref(), Some("ok"));
    assert_eq!(r.rd(reg::RING_REFUSED), 2);
}

#[test]
fn malformed_rings_are_refused_or_resynchronised() {
    let r = rig();
    assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
    // Capacity too large for the bytes given, bad magic, outside RAM.
    r.mem
        .write_obj(
            RingHeader {
                magic: RING_MAGIC,
                version: 1,
                capacity: 4096,
                ..Default::default()
            },
            GuestAddress(RING),
        )
        .unwrap();
    r.wr(reg::RING_LO, RING as u32);
    r.wr(reg::RING_HI, 0);
    r.wr(reg::RING_BYTES, 4096);
    assert_eq!(r.command(cmd::REGISTER_RING), result::BAD_RING);
    r.mem.write_obj(0u64, GuestAddress(RING)).unwrap();
    r.wr(reg::RING_BYTES, 64 * 8);
    assert_eq!(r.command(cmd::REGISTER_RING), result::BAD_RING);
    r.wr(reg::RING_LO, (1 << 20) as u32);
    assert_eq!(r.command(cmd::REGISTER_RING), result::BAD_ADDRESS);
    // A head far ahead of the tail: nothing taken, resynchronised, later records still taken.
    assert_eq!(r.register_ring(RING, 7), result::OK);
    r.mem
        .write_obj(1_000_000u64, GuestAddress(RING + 16))
        .unwrap();
    r.wr(reg::DOORBELL, 0);
    assert_eq!(r.rd(reg::RING_TAKEN), 0);
    r.push(RING, &[ev(kind::START, 9, "after", 1)]);
    assert_eq!(r.dev.process_name(9).as_deref(), Some("after"));
}

#[derive(Clone, Debug)]
enum Op {
    Read(u64),
    Write(u64, u32),
    /// Guest scribbles 8 bytes somewhere in RAM (its slots, its ring, anything).
    Scribble(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let offsets = prop_oneof![
        4 => (0u64..0x14).prop_map(|i| i * 4),
        1 => any::<u64>(),
    ];
    let values = prop_oneof![
        3 => proptest::sample::select(vec![
            0u32, 1, 2, 3, 4, 5, 0x10000, 0x20000, 0x100000, 0xff000, 4096, 16384, 7, 255,
        ]),
        1 => any::<u32>(),
    ];
    prop_oneof![
        1 => offsets.clone().prop_map(Op::Read),
        3 => (offsets, values).prop_map(|(o, v)| Op::Write(o, v)),
        1 => (prop_oneof![RING..RING + 0x4000, 0u64..(1 << 20) - 8], any::<u64>())
            .prop_map(|(a, v)| Op::Scribble(a & !7, v)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_register_and_ring_traffic_never_escapes_guest_ram(
        ops in proptest::collection::vec(op(), 1..200)
    ) {
        let r = rig();
        // Half the runs start from a correctly attached agent with a ring, so the fuzz reaches
        // the doorbell path too.
        if ops.len() % 2 == 0 {
            prop_assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
            prop_assert_eq!(r.register_ring(RING, 63), result::OK);
        }
        for op in &ops {
            match *op {
                Op::Read(o) => { r.rd(o); }
                Op::Write(o, v) => r.wr(o, v),
                Op::Scribble(a, v) => r.mem.write_obj(v, GuestAddress(a)).unwrap(),
            }
        }
        for s in r.host.calls().into_iter().flatten() {
            let end = s.base + u64::from(s.count) * 4096;
            prop_assert!(s.count >= 1 && s.count <= MAX_SLOTS);
            prop_assert!(RAM.iter().any(|&(a, l)| s.base >= a && end <= a + l),
                "slots {s:?} outside RAM");
        }
        // Still answering, and a fresh negotiation still works.
        prop_assert_eq!(r.rd(reg::MAGIC), DEVICE_MAGIC);
        r.command(cmd::RESET);
        prop_assert_eq!(r.attach(1, AGENT_VERSION), result::OK);
        r.dev.with_processes(|p| p.live().count());
    }
}
