//! A real KVM guest on anonymous guest RAM whose pages are moved in and out with
//! `UFFDIO_MOVE`: the guest reads a page's new contents after its frame was moved out and
//! another moved in (KVM's mapping of the old frame was dropped by the mmu notifier), the
//! guest's writes move out with the frame, and a guest access to a moved-out page faults into
//! the userfaultfd and resumes when the handler moves a page in.
//!
//! The guest is a 16-bit real-mode loop at 0x1000 over the data page at 0x2000:
//! read the word at 0x2000, `out 0x10`; write 0xBEEF at 0x2002, `out 0x11`; repeat.

mod common;

use std::sync::Arc;

use common::kvm_available;
use farvm_ept::sys::poll::Epoll;
use farvm_ept::sys::uffd::{self, Fault, RawMsg, Uffd, MAX_EVENTS};
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};

const PG: u64 = 4096;
const PAGES: u64 = 16;
const CODE_PAGE: u64 = 1;
const DATA_PAGE: u64 = 2;

/// mov ax,[0x2000]; out 0x10,ax; mov word [0x2002],0xBEEF; out 0x11,al; jmp back to the start.
const CODE: [u8; 15] = [
    0xA1, 0x00, 0x20, 0xE7, 0x10, 0xC7, 0x06, 0x02, 0x20, 0xEF, 0xBE, 0xE6, 0x11, 0xEB, 0xF1,
];

/// Private anonymous guest RAM (registered MISSING) and a staging area (registered WP only:
/// a valid MOVE destination whose missing faults stay the kernel's), one uffd for both.
struct Ram {
    guest: u64,
    staging: u64,
    uffd: Arc<Uffd>,
}

fn anon(len: usize) -> u64 {
    // SAFETY: a fresh private anonymous mapping; the test leaks it (process exit frees it).
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    // SAFETY: advisory call on our own mapping (4 KiB pages only).
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    p as u64
}

impl Ram {
    fn new() -> Self {
        let len = (PAGES * PG) as usize;
        let (guest, staging) = (anon(len), anon(len));
        let uffd = Uffd::open(uffd::feature::MOVE)
            .expect("userfaultfd with UFFD_FEATURE_MOVE (Linux >= 6.8, root)");
        uffd.register(guest, len as u64, uffd::mode::MISSING)
            .expect("register guest RAM");
        uffd.register(staging, len as u64, uffd::mode::WP)
            .expect("register the staging area");
        Self {
            guest,
            staging,
            uffd: Arc::new(uffd),
        }
    }

    /// Writes `bytes` at the start of staging slot `s` (the kernel allocates it if empty).
    fn land(&self, s: u64, bytes: &[u8]) {
        // SAFETY: in bounds of the staging area, which only this test uses.
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (self.staging + s * PG) as *mut u8,
                bytes.len(),
            )
        };
    }

    fn slot_word(&self, s: u64, off: u64) -> u16 {
        // SAFETY: slot `s` holds a page (the caller moved one there).
        unsafe { core::ptr::read_volatile((self.staging + s * PG + off) as *const u16) }
    }

    fn move_in(&self, slot: u64, page: u64) {
        let n = self
            .uffd
            .move_range(self.guest + page * PG, self.staging + slot * PG, PG, true)
            .expect("UFFDIO_MOVE into guest RAM");
        assert_eq!(n, PG);
    }

    fn move_out(&self, page: u64, slot: u64) {
        let n = self
            .uffd
            .move_range(self.staging + slot * PG, self.guest + page * PG, PG, false)
            .expect("UFFDIO_MOVE out of guest RAM");
        assert_eq!(n, PG);
    }
}

/// Runs the vCPU to its next port write; returns (port, first data byte(s) as a word).
fn next_out(vcpu: &mut VcpuFd) -> (u16, u16) {
    loop {
        match vcpu.run().expect("KVM_RUN") {
            VcpuExit::IoOut(port, data) => {
                let w = if data.len() >= 2 {
                    u16::from_le_bytes([data[0], data[1]])
                } else {
                    data[0] as u16
                };
                return (port, w);
            }
            VcpuExit::Intr => continue,
            other => panic!("unexpected exit {other:?}"),
        }
    }
}

#[test]
fn a_kvm_guest_sees_pages_moved_in_and_out_with_uffdio_move() {
    if !kvm_available() {
        return;
    }
    let ram = Ram::new();
    ram.land(CODE_PAGE, &CODE);
    ram.move_in(CODE_PAGE, CODE_PAGE);
    ram.land(DATA_PAGE, &0x1111u16.to_le_bytes());
    ram.move_in(DATA_PAGE, DATA_PAGE);

    let kvm = Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: PAGES * PG,
        userspace_addr: ram.guest,
        flags: 0,
    };
    // SAFETY: the region is a live mapping of PAGES pages that outlives the VM (leaked).
    unsafe { vm.set_user_memory_region(region) }.expect("KVM_SET_USER_MEMORY_REGION");
    let mut vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
    let mut sregs = vcpu.get_sregs().expect("get sregs");
    for seg in [
        &mut sregs.cs,
        &mut sregs.ds,
        &mut sregs.es,
        &mut sregs.ss,
        &mut sregs.fs,
        &mut sregs.gs,
    ] {
        seg.base = 0;
        seg.selector = 0;
    }
    vcpu.set_sregs(&sregs).expect("set sregs");
    let mut regs = vcpu.get_regs().expect("get regs");
    regs.rip = CODE_PAGE * PG;
    regs.rflags = 2;
    vcpu.set_regs(&regs).expect("set regs");

    // The guest reads the moved-in page and writes into it.
    assert_eq!(next_out(&mut vcpu), (0x10, 0x1111));
    assert_eq!(next_out(&mut vcpu).0, 0x11);
    // Move the frame out: the guest's write went with it.
    ram.move_out(DATA_PAGE, DATA_PAGE);
    assert_eq!(ram.slot_word(DATA_PAGE, 0), 0x1111);
    assert_eq!(
        ram.slot_word(DATA_PAGE, 2),
        0xBEEF,
        "the guest's write moved out"
    );
    // Another frame moves in at the same address: KVM must not read the old one.
    ram.land(3, &0x2222u16.to_le_bytes());
    ram.move_in(3, DATA_PAGE);
    assert_eq!(
        next_out(&mut vcpu),
        (0x10, 0x2222),
        "the guest reads the frame moved in, not the one moved out"
    );
    assert_eq!(next_out(&mut vcpu).0, 0x11);
    ram.move_out(DATA_PAGE, 3);
    assert_eq!(
        ram.slot_word(3, 2),
        0xBEEF,
        "the write went to the new frame"
    );
    assert_eq!(
        ram.slot_word(DATA_PAGE, 0),
        0x1111,
        "the old frame is untouched"
    );

    // Now the data page is missing: the guest's read faults into the uffd, and a handler
    // thread resolves it by moving a staging page in (with wake).
    ram.land(4, &0x3333u16.to_le_bytes());
    let handler = {
        let uffd = ram.uffd.clone();
        let (guest, staging) = (ram.guest, ram.staging);
        std::thread::spawn(move || -> u64 {
            let ep = Epoll::new().expect("epoll");
            ep.add(uffd.raw_fd(), 0).expect("epoll add");
            let mut raw = [RawMsg::default(); MAX_EVENTS];
            let mut faults = [Fault::default(); MAX_EVENTS];
            for _ in 0..600 {
                if ep.wait(100).expect("epoll wait") == 0 {
                    continue;
                }
                let n = uffd.read_faults(&mut raw, &mut faults).expect("read uffd");
                if n == 0 {
                    continue;
                }
                let addr = faults[0].address & !(PG - 1);
                uffd.move_range(addr, staging + 4 * PG, PG, true)
                    .expect("UFFDIO_MOVE resolving the fault");
                return (addr - guest) / PG;
            }
            panic!("no userfaultfd fault within 60 s");
        })
    };
    assert_eq!(
        next_out(&mut vcpu),
        (0x10, 0x3333),
        "the faulting read resumes on the page moved in"
    );
    assert_eq!(handler.join().expect("handler"), DATA_PAGE);
}
