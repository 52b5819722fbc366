//! A real KVM guest on anonymous guest RAM whose pages are moved in and out with
//! `UFFDIO_MOVE`: the guest reads a page's new contents after its frame was moved out and
//! another moved in (KVM's mapping of the old frame was dropped by the mmu notifier), the
//! guest's writes move out with the frame, and a guest access to a moved-out page faults into
//! the userfaultfd and resumes when the handler moves a page in.
//!
//! Guest RAM is `farvm_ept::sys::anon::AnonRam` (guest view, staging mirror, free pool). The
//! guest is a 16-bit real-mode loop at 0x1000 over the data page at 0x2000:
//! read the word at 0x2000, `out 0x10`; write 0xBEEF at 0x2002, `out 0x11`; repeat.

mod common;

use std::sync::Arc;

use common::kvm_available;
use farvm_ept::sys::anon::AnonRam;
use farvm_ept::sys::poll::Epoll;
use farvm_ept::sys::uffd::{Fault, RawMsg, MAX_EVENTS};
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

/// Takes pool frame `slot` into page `p`'s staging slot, writes `bytes` at its start and moves
/// it into the guest.
fn install(ram: &AnonRam, slot: u64, p: u64, bytes: &[u8]) {
    ram.take(slot, p, 1).expect("UFFDIO_MOVE pool -> staging");
    // SAFETY: staging slot `p` holds the frame just taken; `bytes` is shorter than a page.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), ram.staging_page(p), bytes.len()) };
    ram.move_in(p, 1, true).expect("UFFDIO_MOVE into guest RAM");
}

fn word(ptr: *const u8, off: usize) -> u16 {
    // SAFETY: callers pass a staging or pool slot that holds a frame.
    unsafe { core::ptr::read_volatile(ptr.add(off) as *const u16) }
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
    let ram = Arc::new(
        AnonRam::new((PAGES * PG) as usize, 8, 0)
            .expect("anonymous RAM with UFFD_FEATURE_MOVE (Linux >= 6.8, root)"),
    );
    // Frames in pool slots 0-3; slots 4-7 stay free for frames given back.
    ram.fill_pool(0, 4).expect("pool");
    install(&ram, 0, CODE_PAGE, &CODE);
    install(&ram, 1, DATA_PAGE, &0x1111u16.to_le_bytes());

    let kvm = Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: PAGES * PG,
        userspace_addr: ram.guest_base(),
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
    // Move the frame out: the guest's write went with it. Park it in pool slot 5.
    ram.move_out(DATA_PAGE, 1)
        .expect("UFFDIO_MOVE out of guest RAM");
    assert_eq!(word(ram.staging_page(DATA_PAGE), 0), 0x1111);
    assert_eq!(
        word(ram.staging_page(DATA_PAGE), 2),
        0xBEEF,
        "the guest's write moved out"
    );
    ram.give(DATA_PAGE, 5, 1)
        .expect("UFFDIO_MOVE staging -> pool");
    // Another frame moves in at the same address: KVM must not read the old one.
    install(&ram, 2, DATA_PAGE, &0x2222u16.to_le_bytes());
    assert_eq!(
        next_out(&mut vcpu),
        (0x10, 0x2222),
        "the guest reads the frame moved in, not the one moved out"
    );
    assert_eq!(next_out(&mut vcpu).0, 0x11);
    ram.move_out(DATA_PAGE, 1)
        .expect("UFFDIO_MOVE out of guest RAM");
    assert_eq!(
        word(ram.staging_page(DATA_PAGE), 2),
        0xBEEF,
        "the write went to the new frame"
    );
    assert_eq!(
        word(ram.pool_page(5), 0),
        0x1111,
        "the old frame is untouched"
    );
    ram.give(DATA_PAGE, 6, 1)
        .expect("UFFDIO_MOVE staging -> pool");

    // Now the data page is missing: the guest's read faults into the uffd, and a handler
    // thread resolves it by moving a staging page in (with wake).
    ram.take(3, DATA_PAGE, 1)
        .expect("UFFDIO_MOVE pool -> staging");
    // SAFETY: staging slot DATA_PAGE holds the frame just taken.
    unsafe { core::ptr::write_volatile(ram.staging_page(DATA_PAGE) as *mut u16, 0x3333) };
    let handler = {
        let ram = ram.clone();
        std::thread::spawn(move || -> u64 {
            let uffd = ram.uffd();
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
                let p = (faults[0].address - ram.guest_base()) / PG;
                ram.move_in(p, 1, true)
                    .expect("UFFDIO_MOVE resolving the fault");
                return p;
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
