//! Fuzz target: a guest driving the farvm agent device with anything — register reads and
//! writes, negotiations, ring registrations, doorbells, and scribbles over guest RAM (its slot
//! pages, its ring, its page tables) — then the VMM reading what the slots say the way the
//! paging engine does at a fault: the slot's seqlock read, then a walk of the page tables of
//! whatever CR3 it holds.
//!
//! Must hold for every input: nothing panics; every slot array the device hands the VMM lies
//! inside guest RAM (so the engine's slot reads stay in guest memory); the device still
//! answers and a fresh negotiation still succeeds. The walker reads guest memory only through
//! `GuestPages`, which here — as in the engine — answers only for pages inside guest RAM.
#![no_main]

use std::sync::{Arc, Mutex};

use farvm_devices::agent::{AgentDevice, AgentHost, SlotArray};
use farvm_ept::translate::{GuestPages, GuestPaging, PageSpace, VirtualPages};
use farvm_guest_agent::device::ring::{self, RingHeader, RING_MAGIC};
use farvm_guest_agent::device::{
    cmd, negotiate, reg, result, AGENT_VERSION, DEVICE_MAGIC, MAX_SLOTS,
};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM: 0..1 MiB and 2..3 MiB, with a hole between them.
const RAM: [(u64, u64); 2] = [(0, 1 << 20), (2 << 20, 1 << 20)];
const RING: u64 = 0x20000;
const NCPUS: u32 = 4;

#[derive(Clone, Default)]
struct Host(Arc<Mutex<Vec<Option<SlotArray>>>>);

impl AgentHost for Host {
    fn slots_changed(&self, slots: Option<SlotArray>) {
        self.0.lock().unwrap().push(slots);
    }
}

fn in_ram(a: u64, len: u64) -> bool {
    RAM.iter()
        .any(|&(b, l)| a >= b && a.checked_add(len).is_some_and(|e| e <= b + l))
}

/// Guest memory as the engine's walker sees it: only pages inside RAM answer.
struct Pages<'a>(&'a GuestMemoryMmap);

impl GuestPages for Pages<'_> {
    fn read_u64(&self, gpa: u64) -> Option<u64> {
        let gpa = gpa & !7;
        in_ram(gpa, 8).then(|| self.0.read_obj(GuestAddress(gpa)).unwrap())
    }
    fn copy_page(&self, gpn: u64, out: &mut [u64; 512]) -> bool {
        let Some(gpa) = gpn.checked_mul(4096) else {
            return false;
        };
        if !in_ram(gpa, 4096) {
            return false;
        }
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.0.read_obj(GuestAddress(gpa + i as u64 * 8)).unwrap();
        }
        true
    }
}

#[repr(C, align(4096))]
struct Page([u8; 4096]);

/// Input bytes, consumed front to back (zeros once exhausted).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

fuzz_target!(|data: &[u8]| {
    let ranges: Vec<_> = RAM
        .iter()
        .map(|&(a, l)| (GuestAddress(a), l as usize))
        .collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).unwrap();
    let host = Host::default();
    let dev = AgentDevice::new(mem.clone(), RAM.to_vec(), NCPUS, Box::new(host.clone()));
    let mut input = Input(data);
    let mut gpns = Vec::new();
    while !input.0.is_empty() {
        match input.u8() % 8 {
            0 => {
                dev.read_register(u64::from(input.u8()) * 4);
            }
            1 | 2 => {
                let off = u64::from(input.u8() % 0x20) * 4;
                dev.write_register(off, input.u32());
            }
            3 => {
                // Any offset at all, any value.
                dev.write_register(input.u64(), input.u32());
            }
            4 => {
                // Scribble 8 bytes anywhere in (or around) RAM.
                let a = u64::from(input.u32()) % (4 << 20) & !7;
                let v = input.u64();
                if in_ram(a, 8) {
                    mem.write_obj(v, GuestAddress(a)).unwrap();
                }
            }
            5 => {
                // What the module does at probe, from the agent's version range.
                let (amin, amax) = (u32::from(input.u8() % 3), u32::from(input.u8() % 3));
                let chosen = negotiate(
                    amin,
                    amax,
                    dev.read_register(reg::VERSION_MIN),
                    dev.read_register(reg::VERSION_MAX),
                );
                dev.write_register(reg::VERSION, chosen.unwrap_or(amax));
            }
            6 => {
                // A well-formed ring header of any capacity, registered, then the doorbell.
                let capacity = u32::from(input.u8());
                let h = RingHeader {
                    magic: RING_MAGIC,
                    version: ring::RING_VERSION,
                    capacity,
                    head: u64::from(input.u8()),
                    ..RingHeader::default()
                };
                mem.write_obj(h, GuestAddress(RING)).unwrap();
                dev.write_register(reg::RING_LO, RING as u32);
                dev.write_register(reg::RING_HI, 0);
                dev.write_register(reg::RING_BYTES, ring::ring_bytes(capacity) as u32);
                dev.write_register(reg::COMMAND, cmd::REGISTER_RING);
                dev.write_register(reg::DOORBELL, 1);
            }
            _ => gpns.push(u64::from(input.u32()) % 1024),
        }
    }

    let calls = host.0.lock().unwrap().clone();
    for s in calls.iter().flatten() {
        assert!(
            s.count >= 1 && s.count <= MAX_SLOTS,
            "slot count {} handed to the VMM",
            s.count
        );
        assert!(
            in_ram(s.base, u64::from(s.count) * 4096) && s.base % 4096 == 0,
            "slots {s:?} outside guest RAM"
        );
    }
    // What the engine does at a fault on each vCPU: read the slot, walk the CR3 it names.
    if let Some(Some(slots)) = calls.last() {
        let paging = Arc::new(GuestPaging::new(true));
        let mut space = VirtualPages::with_paging(paging);
        let pages = Pages(&mem);
        for cpu in 0..NCPUS {
            let Some(gpa) = slots.slot(cpu) else {
                continue;
            };
            let mut page = Page([0; 4096]);
            mem.read_slice(&mut page.0, GuestAddress(gpa)).unwrap();
            // SAFETY: `page` is 4 KiB, 4096-aligned, alive for the call.
            let Some((_pid, cr3)) = (unsafe { farvm_ept::vcpu::read_slot(page.0.as_ptr()) }) else {
                continue;
            };
            let key = space.process_key(cr3);
            for &g in gpns.iter().chain([gpa / 4096, cr3 >> 12 & 0x3ff].iter()) {
                let (k, p) = space.to_prefetch(&pages, key, g);
                space.to_guest(&pages, k, p);
                space.to_guest(&pages, key, p.wrapping_add(1));
            }
        }
    }
    assert_eq!(dev.read_register(reg::MAGIC), DEVICE_MAGIC);
    dev.write_register(reg::COMMAND, cmd::RESET);
    let chosen = negotiate(
        1,
        AGENT_VERSION,
        dev.read_register(reg::VERSION_MIN),
        dev.read_register(reg::VERSION_MAX),
    )
    .expect("this release's agent and device agree");
    dev.write_register(reg::VERSION, chosen);
    assert_eq!(dev.read_register(reg::RESULT), result::OK);
});
