//! Linux boot up to the entry point (a stock kernel cannot run at a usable speed where guest
//! ring 0 is emulated; tests/tests/linux_guest.rs boots one): a synthetic bzImage (and a vmlinux
//! ELF) with initrd and command line; checks the entry registers, boot_params (setup header,
//! cmdline, initrd, e820, ACPI RSDP), the page tables, the ACPI tables, and that only the
//! bootstrap processor starts, on local RAM and on remote memory.

mod common;

use std::sync::Arc;

use common::kvm_available;
use farvm_vmm::boot::linux::{CMDLINE_GPA, ZERO_PAGE_GPA};
use farvm_vmm::builder::{build, BootConfig, BuildError, VmConfig};
use farvm_vmm::vstate::memory::GuestRam;
use farvm_vmm::vstate::pagewalk::translate;
use vm_memory::{Bytes, GuestAddress};

const PREF: u64 = 0x100_0000;

/// An initramfs as far as farvm checks one: a cpio (newc) magic, then `len - 6` bytes of `fill`.
fn initramfs(len: usize, fill: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut rd: Vec<u8> = (0..len).map(fill).collect();
    rd[..6].copy_from_slice(b"070701");
    rd
}

/// A minimal bzImage: 4 setup sectors with a 2.15 setup header, then `payload`.
fn bzimage(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 5 * 512];
    let put = |f: &mut Vec<u8>, off: usize, b: &[u8]| f[off..off + b.len()].copy_from_slice(b);
    put(&mut f, 0x1f1, &[4]);
    put(&mut f, 0x1fe, &0xaa55u16.to_le_bytes());
    put(&mut f, 0x202, b"HdrS");
    put(&mut f, 0x206, &version.to_le_bytes());
    put(&mut f, 0x211, &[1]); // LOADED_HIGH
    put(&mut f, 0x214, &0x100000u32.to_le_bytes());
    put(&mut f, 0x22c, &0x7fff_ffffu32.to_le_bytes());
    put(&mut f, 0x230, &0x20_0000u32.to_le_bytes());
    put(&mut f, 0x234, &[1]); // relocatable
    put(&mut f, 0x236, &1u16.to_le_bytes()); // XLF_KERNEL_64
    put(&mut f, 0x238, &2048u32.to_le_bytes());
    put(&mut f, 0x258, &PREF.to_le_bytes());
    put(&mut f, 0x260, &0x40_0000u32.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn config(mem: u64, kernel: Vec<u8>, initrd: Option<Vec<u8>>, cmdline: &str) -> VmConfig {
    let boot = BootConfig::Linux {
        kernel: Arc::from(kernel),
        initrd: initrd.map(Arc::from),
        cmdline: cmdline.into(),
    };
    VmConfig::new("linux-test", mem, 1, boot)
}

fn u32_at(ram: &GuestRam, gpa: u64) -> u32 {
    ram.read_obj(GuestAddress(gpa)).unwrap()
}

fn e820(ram: &GuestRam) -> Vec<(u64, u64, u32)> {
    let n: u8 = ram.read_obj(GuestAddress(ZERO_PAGE_GPA + 0x1e8)).unwrap();
    (0..n as u64)
        .map(|i| {
            let e = ZERO_PAGE_GPA + 0x2d0 + 20 * i;
            (
                ram.read_obj(GuestAddress(e)).unwrap(),
                ram.read_obj(GuestAddress(e + 8)).unwrap(),
                ram.read_obj(GuestAddress(e + 16)).unwrap(),
            )
        })
        .collect()
}

#[test]
fn bzimage_entry_state_and_boot_params() {
    if !kvm_available() {
        return;
    }
    let payload: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let initrd = initramfs(300_000, |i| (i % 13) as u8);
    let cmdline = "console=ttyS0 root=/dev/ram0 farvm.test=1";
    let mem = 512u64 << 20;
    let vm = build(&config(
        mem,
        bzimage(0x020f, &payload),
        Some(initrd.clone()),
        cmdline,
    ))
    .expect("bzImage setup");
    let ram = vm.ram().clone();

    // Entry: startup_64 = load address + 0x200, rsi = boot_params, 64-bit boot GDT.
    let (regs, sregs) = vm.vcpu_regs(0).unwrap();
    assert_eq!(regs.rip, PREF + 0x200);
    assert_eq!(regs.rsi, ZERO_PAGE_GPA);
    assert_eq!((sregs.cs.selector, sregs.ds.selector), (0x10, 0x18));
    assert_eq!(sregs.cs.l, 1);
    assert_ne!(sregs.efer & (1 << 10), 0, "EFER.LMA");
    assert_ne!(sregs.cr0 & (1 << 31), 0, "paging on");
    // Identity-mapped page tables cover the kernel, boot_params and cmdline.
    for va in [PREF + 0x200, ZERO_PAGE_GPA, CMDLINE_GPA, mem - 8] {
        assert_eq!(translate(&ram, sregs.cr3, va), Some(va));
    }

    // The protected-mode kernel is at its preferred address.
    let mut got = vec![0u8; payload.len()];
    ram.read_slice(&mut got, GuestAddress(PREF)).unwrap();
    assert_eq!(got, payload);

    // Setup header in the zero page.
    let zp = ZERO_PAGE_GPA;
    assert_eq!(&u32_at(&ram, zp + 0x202).to_le_bytes(), b"HdrS");
    assert_eq!(
        ram.read_obj::<u8>(GuestAddress(zp + 0x210)).unwrap(),
        0xff,
        "type_of_loader"
    );
    assert_eq!(
        ram.read_obj::<u16>(GuestAddress(zp + 0x206)).unwrap(),
        0x020f
    );

    // Command line: pointer, NUL-terminated text, the ACPI reset named as the reboot method.
    let cmdline = farvm_vmm::boot::linux::with_reboot_method(cmdline);
    assert!(cmdline.ends_with(" reboot=acpi"), "{cmdline}");
    assert_eq!(u64::from(u32_at(&ram, zp + 0x228)), CMDLINE_GPA);
    let mut c = vec![0u8; cmdline.len() + 1];
    ram.read_slice(&mut c, GuestAddress(CMDLINE_GPA)).unwrap();
    assert_eq!(&c[..cmdline.len()], cmdline.as_bytes());
    assert_eq!(c[cmdline.len()], 0);

    // Initrd: page aligned, above the kernel, below initrd_addr_max and RAM end, intact.
    let rd = u64::from(u32_at(&ram, zp + 0x218));
    let rd_len = u64::from(u32_at(&ram, zp + 0x21c));
    assert_eq!(rd_len, initrd.len() as u64);
    assert_eq!(rd % 4096, 0);
    assert!(rd >= PREF + payload.len() as u64);
    assert!(rd + rd_len <= mem);
    assert!(mem - (rd + rd_len) < 4096, "placed as high as possible");
    let mut got = vec![0u8; initrd.len()];
    ram.read_slice(&mut got, GuestAddress(rd)).unwrap();
    assert_eq!(got, initrd);

    // e820: low RAM, the EBDA/BIOS hole, RAM from 1 MiB.
    assert_eq!(
        e820(&ram),
        vec![
            (0, 0x9fc00, 1),
            (0x9fc00, 0x100000 - 0x9fc00, 2),
            (0x100000, mem - 0x100000, 1)
        ]
    );
    let info = vm.linux_boot().unwrap();
    assert_eq!(info.kind, "bzImage");
    assert_eq!(info.initrd_gpa, Some(rd));
}

#[test]
fn large_memory_e820_has_high_ram() {
    if !kvm_available() {
        return;
    }
    let vm = build(&config(5 << 30, bzimage(0x020f, &[0xf4; 4096]), None, "x")).unwrap();
    let ram = vm.ram();
    let map = e820(ram);
    assert_eq!(map.len(), 4);
    assert_eq!(map[2], (0x100000, (3 << 30) - 0x100000, 1));
    assert_eq!(map[3], (4 << 30, 2 << 30, 1));
    assert_eq!(
        ram.read_obj::<u32>(GuestAddress(ZERO_PAGE_GPA + 0x218))
            .unwrap(),
        0,
        "no initrd"
    );
}

#[test]
fn vmlinux_elf_entry() {
    if !kvm_available() {
        return;
    }
    let elf = farvm_vmm::boot::elf::build_test_elf(&[0xf4; 64], PREF, PREF);
    let vm = build(&config(256 << 20, elf, None, "console=ttyS0")).unwrap();
    let (regs, _) = vm.vcpu_regs(0).unwrap();
    assert_eq!(regs.rip, PREF);
    assert_eq!(regs.rsi, ZERO_PAGE_GPA);
    assert_eq!(vm.linux_boot().unwrap().kind, "vmlinux");
}

#[test]
fn bad_linux_inputs_are_refused() {
    if !kvm_available() {
        return;
    }
    let err = |cfg| match build(&cfg) {
        Err(BuildError::Boot(e)) => e.to_string(),
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("accepted a bad Linux setup"),
    };
    let e = err(config(256 << 20, bzimage(0x0209, &[0; 4096]), None, ""));
    assert!(e.contains("too old"), "{e}");
    let e = err(config(
        256 << 20,
        bzimage(0x020f, &[0; 4096]),
        Some(initramfs(300 << 20, |_| 1)),
        "",
    ));
    assert!(e.contains("initrd of") && e.contains("does not fit"), "{e}");
    let long = "x".repeat(5000);
    let e = err(config(256 << 20, bzimage(0x020f, &[0; 4096]), None, &long));
    assert!(e.contains("command line"), "{e}");
    let e = err(config(256 << 20, bzimage(0x020f, &[]), None, ""));
    assert!(e.contains("no protected-mode kernel"), "{e}");
}

#[test]
fn cli_stop_at_entry_reports_linux_setup() {
    if !kvm_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("farvm-linux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let k = dir.join("bzImage");
    let rd = dir.join("initrd");
    std::fs::write(&k, bzimage(0x020f, &[0x90; 8192])).unwrap();
    std::fs::write(&rd, initramfs(10000, |_| 7)).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args([
            "run",
            "--kernel",
            k.to_str().unwrap(),
            "--initrd",
            rd.to_str().unwrap(),
        ])
        .args(["--cmdline", "console=ttyS0", "--stop-at-entry", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rip"], PREF + 0x200);
    assert_eq!(v["rsi"], ZERO_PAGE_GPA);
    assert_eq!(v["linux"]["kind"], "bzImage");
    assert_eq!(v["linux"]["initrd_len"], 10000);
    assert_eq!(v["linux"]["cmdline_len"], "console=ttyS0 reboot=acpi".len());
}

/// The ACPI table with signature `sig` reached from the RSDP at `rsdp` through the XSDT (or
/// the DSDT through the FADT): its bytes.
fn acpi_table(ram: &GuestRam, rsdp: u64, sig: &[u8; 4]) -> Option<Vec<u8>> {
    let read = |gpa: u64, len: usize| {
        let mut b = vec![0u8; len];
        ram.read_slice(&mut b, GuestAddress(gpa)).unwrap();
        b
    };
    let table = |gpa: u64| {
        let len = u32::from_le_bytes(read(gpa + 4, 4).try_into().unwrap()) as usize;
        read(gpa, len)
    };
    assert_eq!(&read(rsdp, 8), b"RSD PTR ");
    let xsdt = table(u64::from_le_bytes(read(rsdp + 24, 8).try_into().unwrap()));
    assert_eq!(&xsdt[..4], b"XSDT");
    let tables: Vec<Vec<u8>> = xsdt[36..]
        .chunks(8)
        .map(|c| table(u64::from_le_bytes(c.try_into().unwrap())))
        .collect();
    if sig == b"DSDT" {
        let fadt = tables.iter().find(|t| &t[..4] == b"FACP")?;
        return Some(table(u64::from_le_bytes(
            fadt[140..148].try_into().unwrap(),
        )));
    }
    tables.into_iter().find(|t| &t[..4] == sig)
}

#[test]
fn smp_linux_on_remote_memory_starts_the_bsp_only_and_describes_every_vcpu_in_acpi() {
    if !kvm_available() {
        return;
    }
    let payload: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 31 % 253) as u8).collect();
    let dir = std::env::temp_dir().join(format!("farvm-linux-smp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let mut cfg = config(
        256 << 20,
        bzimage(0x020f, &payload),
        Some(initramfs(100_000, |_| 5)),
        "console=ttyS0",
    );
    cfg.vcpus = 4;
    cfg.remote = Some(farvm_vmm::remote::RemoteSpec::new("linux-smp"));
    cfg.disks = vec![disk.to_str().unwrap().parse().unwrap()];
    let vm = build(&cfg).expect("Linux on remote memory with 4 vCPUs and a disk");
    assert!(vm.remote().is_some(), "guest RAM is the paging engine's");
    let ram = vm.ram().clone();

    // The kernel image went into paged RAM intact (loaded in a scratch mapping, copied in).
    let mut got = vec![0u8; payload.len()];
    ram.read_slice(&mut got, GuestAddress(PREF)).unwrap();
    assert!(
        got == payload,
        "the kernel image in remote-backed guest RAM"
    );

    // vCPU 0 at startup_64; the APs wait for the kernel's INIT/SIPI.
    assert_eq!(vm.vcpu_regs(0).unwrap().0.rip, PREF + 0x200);
    assert_eq!(
        vm.vcpu_mp_state(0).unwrap(),
        kvm_bindings::KVM_MP_STATE_RUNNABLE
    );
    for i in 1..4 {
        assert_eq!(
            vm.vcpu_mp_state(i).unwrap(),
            kvm_bindings::KVM_MP_STATE_UNINITIALIZED,
            "AP {i} must wait for SIPI"
        );
    }

    // boot_params.acpi_rsdp_addr → XSDT → MADT: one enabled local APIC per vCPU, APIC ID =
    // index; the DSDT announces the disk (LNRO0005) and COM1 (PNP0501).
    let rsdp: u64 = ram.read_obj(GuestAddress(ZERO_PAGE_GPA + 0x70)).unwrap();
    assert_eq!(Some(rsdp), vm.linux_boot().unwrap().acpi_rsdp_addr);
    let madt = acpi_table(&ram, rsdp, b"APIC").expect("an MADT");
    let mut lapics = Vec::new();
    let mut at = 44;
    while at + 2 <= madt.len() {
        let (kind, len) = (madt[at], madt[at + 1] as usize);
        assert!(len >= 2, "MADT entry length");
        if kind == 0 {
            let flags = u32::from_le_bytes(madt[at + 4..at + 8].try_into().unwrap());
            lapics.push((madt[at + 3], flags & 1));
        }
        at += len;
    }
    assert_eq!(lapics, vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    let dsdt = acpi_table(&ram, rsdp, b"DSDT").expect("a DSDT");
    let has = |s: &[u8]| dsdt.windows(s.len()).any(|w| w == s);
    // The disk's _HID is a string; COM1's is EISAID("PNP0501") = 0x0105D041 (a DWord).
    assert!(has(b"LNRO0005"), "the disk in the DSDT");
    assert!(has(&[0x0c, 0x41, 0xd0, 0x05, 0x01]), "COM1 in the DSDT");
    drop(vm);
    std::fs::remove_dir_all(&dir).ok();
}

/// A network interface end to end up to the guest's entry: `farvm run --disk --net` builds the
/// VM (the tap opened, the device in the slot after the disk, both in the DSDT), stops at
/// entry and exits cleanly, taking the tap it created with it. Needs root (it creates a tap,
/// under a name of its own in this namespace).
#[test]
fn a_network_interface_follows_the_disks_in_the_dsdt() {
    if !kvm_available() {
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test creates a tap device: run it as root (CI does)"
    );
    let dir = std::env::temp_dir().join(format!("farvm-linux-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let tap = format!("fvl{}", std::process::id() % 1_000_000);
    let mut cfg = config(
        256 << 20,
        bzimage(0x020f, &[0x90; 8192]),
        None,
        "console=ttyS0",
    );
    cfg.disks = vec![disk.to_str().unwrap().parse().unwrap()];
    cfg.nets = vec![format!("tap={tap},mac=52:54:00:12:34:56").parse().unwrap()];
    let vm = build(&cfg).expect("Linux with a disk and a network interface");
    let board = &vm.shared().board;
    let slots = board.virtio_mmio();
    assert_eq!(slots.len(), 2);
    assert_eq!((slots[1].base, slots[1].gsi), (0xd000_1000, 6));
    assert_eq!(board.nets().count(), 1);
    let ram = vm.ram().clone();
    let rsdp: u64 = ram.read_obj(GuestAddress(ZERO_PAGE_GPA + 0x70)).unwrap();
    let dsdt = acpi_table(&ram, rsdp, b"DSDT").expect("a DSDT");
    let count = dsdt.windows(8).filter(|w| w == b"LNRO0005").count();
    assert_eq!(count, 2, "the disk and the network device in the DSDT");
    // The second device's window, as the _CRS's 32-bit memory descriptor spells its base.
    assert!(
        dsdt.windows(4).any(|w| w == 0xd000_1000u32.to_le_bytes()),
        "the network device's window in the DSDT"
    );
    assert!(std::path::Path::new(&format!("/sys/class/net/{tap}")).exists());
    drop(vm);
    assert!(
        !std::path::Path::new(&format!("/sys/class/net/{tap}")).exists(),
        "the tap farvm created goes with the VM"
    );

    // The same through the CLI, to the entry point and out.
    let k = dir.join("bzImage");
    std::fs::write(&k, bzimage(0x020f, &[0x90; 8192])).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args(["run", "--kernel", k.to_str().unwrap()])
        .args(["--disk", disk.to_str().unwrap()])
        .args(["--net", &format!("tap={tap}")])
        .args([
            "--cmdline",
            "console=ttyS0",
            "--stop-at-entry",
            "--local-only",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args(["run", "--kernel", k.to_str().unwrap()])
        .args(["--net", "tap=no/slash"])
        .args(["--stop-at-entry"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(64),
        "a bad --net is a usage error (EX_USAGE)"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a network interface name"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}
