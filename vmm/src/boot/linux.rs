//! Linux boot per the x86 64-bit boot protocol: a bzImage or vmlinux loaded with linux-loader,
//! `boot_params` (zero page) with the setup header, e820 map, command line, initrd and the
//! ACPI RSDP address, and identity-mapped page tables, entered at `startup_64` on the
//! bootstrap processor with `rsi` = boot_params (the other vCPUs wait for the kernel's
//! INIT/SIPI).
//!
//! Everything is written through [`GuestRam`], so guest RAM may be local or paged by the
//! paging engine; linux-loader, which needs a vm-memory view, loads the kernel image straight
//! into local RAM, or into a scratch mapping copied into paged RAM.
//!
//! A stock kernel boots to userspace on a host with two-dimensional paging (VMX/SVM); on a
//! PVM host (guest ring 0 emulated, about 1 µs per instruction) it is too slow to use.

use std::io::Cursor;

use farvm_devices::acpi::AcpiTables;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::{sniff_kernel, BootError, EntryState, KernelKind};
use crate::layout::LOW_RAM_MAX;
use crate::vstate::memory::GuestRam;

/// Guest-physical layout of the Linux boot data.
pub const GDT_GPA: u64 = 0x500;
/// The zero page (`boot_params`).
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// The identity-mapping PML4 (its PDPT and PDs follow).
pub const PML4_GPA: u64 = 0x9000;
const PDPT_GPA: u64 = 0xa000;
const PD_GPA: u64 = 0xb000; // four PDs: 0xb000..0xf000 identity-map 0..4 GiB
/// The kernel command line.
pub const CMDLINE_GPA: u64 = 0x20000;
/// Longest command line, with its NUL.
pub const CMDLINE_MAX: usize = 0x10000;
/// Lowest address a kernel may be loaded at (1 MiB).
pub const HIMEM_START: u64 = 0x100000;
/// The Linux boot GDT selectors (`__BOOT_CS`, `__BOOT_DS`).
pub const BOOT_CS: u16 = 0x10;
/// `__BOOT_DS`.
pub const BOOT_DS: u16 = 0x18;
const GDT: [u64; 4] = [0, 0, 0x00af_9a00_0000_ffff, 0x00cf_9200_0000_ffff];

/// E820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// E820 type of a reserved range.
pub const E820_RESERVED: u32 = 2;
/// End of conventional memory below the EBDA.
const EBDA_START: u64 = 0x9fc00;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const XLF_KERNEL_64: u16 = 1;
/// bzImage 64-bit entry is 0x200 past the protected-mode kernel's load address.
const STARTUP_64_OFFSET: u64 = 0x200;

/// Where everything went (for `--stop-at-entry` and tests).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LinuxBootInfo {
    /// `bzImage` or `vmlinux`.
    pub kind: &'static str,
    /// The setup header's boot protocol version (0 when the image has no setup header).
    pub protocol_version: u16,
    /// Guest-physical load address of the kernel.
    pub kernel_load: u64,
    /// End of the loaded kernel.
    pub kernel_end: u64,
    /// The 64-bit entry point.
    pub entry: u64,
    /// Where `boot_params` is.
    pub boot_params_gpa: u64,
    /// Where the command line is.
    pub cmdline_gpa: u64,
    /// Its length without the NUL.
    pub cmdline_len: usize,
    /// Where the initrd is, if any.
    pub initrd_gpa: Option<u64>,
    /// Its length (0: none).
    pub initrd_len: u64,
    /// `boot_params.acpi_rsdp_addr` (None: no ACPI tables).
    pub acpi_rsdp_addr: Option<u64>,
    /// `(addr, size, type)` e820 entries.
    pub e820: Vec<(u64, u64, u32)>,
}

fn setup_err(msg: impl Into<String>) -> BootError {
    BootError::Setup(msg.into())
}

/// Loads a Linux kernel (bzImage or vmlinux), initrd and command line, with `acpi` (tables
/// already in guest RAM: their RSDP address and reserved ranges go into boot_params); returns
/// the entry state (the bootstrap processor, `rsi` = boot_params) and the placement.
pub fn setup(
    ram: &GuestRam,
    kernel: &[u8],
    initrd: Option<&[u8]>,
    cmdline: &str,
    acpi: Option<&AcpiTables>,
) -> Result<(EntryState, LinuxBootInfo), BootError> {
    let low_end = ram.regions()[0].len().min(LOW_RAM_MAX);
    let kind = sniff_kernel(kernel).ok_or_else(|| {
        BootError::Malformed(
            "not a Linux kernel: neither an ELF vmlinux nor a bzImage (no \"HdrS\" at 0x202)"
                .into(),
        )
    })?;
    let mut params = boot_params::default();
    let (kernel_load, kernel_end, entry) = with_loader_memory(ram, low_end, |mem| {
        Ok(match kind {
            KernelKind::BzImage => {
                let hdr = bz_header(kernel)?;
                // Relocatable kernels go to their preferred address when it fits, else
                // code32_start.
                let pref = hdr.pref_address;
                let init = u64::from(hdr.init_size).max(kernel.len() as u64);
                let load = if hdr.relocatable_kernel != 0
                    && pref >= HIMEM_START
                    && pref.saturating_add(init) <= low_end
                {
                    Some(GuestAddress(pref))
                } else {
                    None
                };
                let res = BzImage::load(
                    mem,
                    load,
                    &mut Cursor::new(kernel),
                    Some(GuestAddress(HIMEM_START)),
                )
                .map_err(|e| BootError::Malformed(format!("bzImage: {e}")))?;
                params.hdr = res.setup_header.unwrap_or(hdr);
                let load = res.kernel_load.raw_value();
                (load, res.kernel_end, load + STARTUP_64_OFFSET)
            }
            KernelKind::Elf => {
                let res = Elf::load(
                    mem,
                    None,
                    &mut Cursor::new(kernel),
                    Some(GuestAddress(HIMEM_START)),
                )
                .map_err(|e| BootError::Malformed(format!("vmlinux ELF: {e}")))?;
                params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
                params.hdr.header = KERNEL_HDR_MAGIC;
                params.hdr.version = 0x020f;
                params.hdr.kernel_alignment = 0x0100_0000;
                let load = res.kernel_load.raw_value();
                (load, res.kernel_end, load)
            }
        })
    })?;
    if kernel_end > low_end {
        return Err(BootError::DoesNotFit(format!(
            "the kernel ends at {kernel_end:#x}, beyond low RAM ({low_end:#x})"
        )));
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;

    // Command line.
    let cmdline = &with_reboot_method(cmdline);
    let max_cmdline = match params.hdr.cmdline_size {
        0 => 255,
        n => (n as usize).min(CMDLINE_MAX - 1),
    };
    if cmdline.len() > max_cmdline {
        return Err(setup_err(format!(
            "command line is {} bytes; this kernel accepts at most {max_cmdline}",
            cmdline.len()
        )));
    }
    if cmdline.bytes().any(|b| b == 0) {
        return Err(setup_err("command line contains a NUL byte"));
    }
    ram.write_slice(cmdline.as_bytes(), GuestAddress(CMDLINE_GPA))?;
    ram.write_slice(&[0], GuestAddress(CMDLINE_GPA + cmdline.len() as u64))?;
    params.hdr.cmd_line_ptr = CMDLINE_GPA as u32;
    params.hdr.cmdline_size = cmdline.len() as u32 + 1;

    // Initrd: as high as allowed, page aligned, above the kernel.
    let mut initrd_gpa = None;
    let mut initrd_len = 0;
    if let Some(rd) = initrd {
        super::initrd::check(rd)?;
        let max_addr = match params.hdr.initrd_addr_max {
            0 => 0x37ff_ffff,
            m => u64::from(m),
        };
        let top = low_end.min(max_addr + 1);
        let len = rd.len() as u64;
        let start = top
            .checked_sub(len)
            .map(|s| s & !0xfff)
            .filter(|s| *s >= kernel_end.max(HIMEM_START))
            .ok_or_else(|| {
                BootError::DoesNotFit(format!(
                    "initrd of {len} bytes does not fit between the kernel end {kernel_end:#x} \
                     and {top:#x}"
                ))
            })?;
        ram.write_slice(rd, GuestAddress(start))?;
        params.hdr.ramdisk_image = start as u32;
        params.hdr.ramdisk_size = len as u32;
        initrd_gpa = Some(start);
        initrd_len = len;
    }

    // ACPI and e820.
    let reserved = acpi.map_or(&[][..], |t| &t.reserved[..]);
    let ram_ranges: Vec<(u64, u64)> = ram.regions().iter().map(|r| (r.gpa(), r.len())).collect();
    let e820 = e820_map(&ram_ranges, reserved);
    if e820.len() > params.e820_table.len() {
        return Err(setup_err(format!(
            "the e820 map has {} entries; boot_params holds {}",
            e820.len(),
            params.e820_table.len()
        )));
    }
    for (i, &(addr, size, ty)) in e820.iter().enumerate() {
        params.e820_table[i] = boot_e820_entry {
            addr,
            size,
            r#type: ty,
        };
    }
    params.e820_entries = e820.len() as u8;
    params.acpi_rsdp_addr = acpi.map_or(0, |t| t.rsdp_addr);
    ram.write_obj(params, GuestAddress(ZERO_PAGE_GPA))?;

    // GDT and identity page tables (0..4 GiB, 2 MiB pages).
    for (i, d) in GDT.iter().enumerate() {
        ram.write_obj(*d, GuestAddress(GDT_GPA + 8 * i as u64))?;
    }
    ram.write_obj(PDPT_GPA | 0x3, GuestAddress(PML4_GPA))?;
    for g in 0..4u64 {
        ram.write_obj((PD_GPA + g * 0x1000) | 0x3, GuestAddress(PDPT_GPA + 8 * g))?;
        let mut pd = [0u8; 4096];
        for j in 0..512u64 {
            let e = ((g << 30) | (j << 21)) | 0x83;
            pd[(j * 8) as usize..(j * 8 + 8) as usize].copy_from_slice(&e.to_le_bytes());
        }
        ram.write_slice(&pd, GuestAddress(PD_GPA + g * 0x1000))?;
    }

    let entry_state = EntryState {
        rip: entry,
        rsi: ZERO_PAGE_GPA,
        rdi: 0,
        rsp: 0,
        cr3: PML4_GPA,
        code_selector: BOOT_CS,
        data_selector: BOOT_DS,
        gdt_base: GDT_GPA,
        gdt_limit: (GDT.len() * 8 - 1) as u16,
    };
    let info = LinuxBootInfo {
        kind: match kind {
            KernelKind::BzImage => "bzImage",
            KernelKind::Elf => "vmlinux",
        },
        protocol_version: params.hdr.version,
        kernel_load,
        kernel_end,
        entry,
        boot_params_gpa: ZERO_PAGE_GPA,
        cmdline_gpa: CMDLINE_GPA,
        cmdline_len: cmdline.len(),
        initrd_gpa,
        initrd_len,
        acpi_rsdp_addr: acpi.map(|t| t.rsdp_addr),
        e820,
    };
    Ok((entry_state, info))
}

/// Runs `load` (linux-loader) on a vm-memory view of low RAM: local RAM itself, or for paged
/// RAM a scratch anonymous mapping (`MAP_NORESERVE`: only what the loader writes costs memory)
/// whose `kernel_load..kernel_end` is then copied into guest RAM through the engine.
fn with_loader_memory(
    ram: &GuestRam,
    low_end: u64,
    load: impl FnOnce(&GuestMemoryMmap) -> Result<(u64, u64, u64), BootError>,
) -> Result<(u64, u64, u64), BootError> {
    if let Ok(mem) = ram.direct() {
        return load(mem);
    }
    let scratch = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), low_end as usize)])
        .map_err(|e| setup_err(format!("scratch memory for the kernel image: {e}")))?;
    let (start, end, entry) = load(&scratch)?;
    if end > low_end {
        return Ok((start, end, entry)); // refused by the caller's bounds check
    }
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = start;
    while at < end {
        let n = (end - at).min(chunk.len() as u64) as usize;
        scratch
            .read_slice(&mut chunk[..n], GuestAddress(at))
            .map_err(|e| setup_err(format!("reading the loaded kernel at {at:#x}: {e}")))?;
        ram.write_slice(&chunk[..n], GuestAddress(at))?;
        at += n as u64;
    }
    Ok((start, end, entry))
}

/// The e820 map of RAM `regions` (`(gpa, len)`): the legacy hole from the EBDA to 1 MiB and the
/// `reserved` ranges (ACPI tables) are taken out of RAM and listed as reserved; sorted by
/// address, overlapping or adjacent reserved ranges merged.
pub fn e820_map(regions: &[(u64, u64)], reserved: &[(u64, u64)]) -> Vec<(u64, u64, u32)> {
    let mut holes: Vec<(u64, u64)> = std::iter::once((EBDA_START, HIMEM_START))
        .chain(reserved.iter().map(|&(a, l)| (a, a.saturating_add(l))))
        .filter(|(a, e)| e > a)
        .collect();
    holes.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, e) in holes {
        match merged.last_mut() {
            Some((_, me)) if a <= *me => *me = (*me).max(e),
            _ => merged.push((a, e)),
        }
    }
    let mut map: Vec<(u64, u64, u32)> = merged
        .iter()
        .map(|&(a, e)| (a, e - a, E820_RESERVED))
        .collect();
    for &(gpa, len) in regions {
        let mut at = gpa;
        let end = gpa + len;
        for &(a, e) in &merged {
            if e <= at || a >= end {
                continue;
            }
            if a > at {
                map.push((at, a - at, E820_RAM));
            }
            at = at.max(e);
        }
        if at < end {
            map.push((at, end - at, E820_RAM));
        }
    }
    map.sort_unstable();
    map
}

/// `cmdline` with `reboot=acpi` appended unless it names a reboot method itself. farvm's ACPI
/// platform is hardware-reduced, and for such a platform Linux picks the EFI reset (its
/// `reboot_init`), which a guest booted without firmware does not have: it then jumps to the
/// BIOS in real mode and spins there for good. Told `reboot=acpi`, it writes the FADT's reset
/// register, which ends the VM as a reboot (exit 75). A `reboot=` the operator gives is kept.
pub fn with_reboot_method(cmdline: &str) -> String {
    if cmdline.split_whitespace().any(|w| w.starts_with("reboot=")) {
        return cmdline.to_string();
    }
    match cmdline.trim_end() {
        "" => "reboot=acpi".to_string(),
        c => format!("{c} reboot=acpi"),
    }
}

/// Reads and checks a bzImage's setup header for the 64-bit boot protocol.
fn bz_header(image: &[u8]) -> Result<linux_loader::loader::bootparam::setup_header, BootError> {
    use vm_memory::ByteValued;
    let mut hdr = linux_loader::loader::bootparam::setup_header::default();
    let n = std::mem::size_of_val(&hdr);
    let bytes = image
        .get(0x1f1..0x1f1 + n)
        .ok_or_else(|| BootError::Malformed("bzImage is shorter than its setup header".into()))?;
    hdr.as_mut_slice().copy_from_slice(bytes);
    let version = hdr.version;
    let xloadflags = hdr.xloadflags;
    if version < 0x020c {
        return Err(BootError::Malformed(format!(
            "boot protocol {}.{:02} is too old for 64-bit entry (needs 2.12)",
            version >> 8,
            version & 0xff
        )));
    }
    if xloadflags & XLF_KERNEL_64 == 0 {
        return Err(BootError::Malformed(
            "bzImage has no 64-bit entry point (XLF_KERNEL_64 clear)".into(),
        ));
    }
    let setup_sects = if hdr.setup_sects == 0 {
        4
    } else {
        hdr.setup_sects
    } as usize;
    let setup_bytes = (setup_sects + 1) * 512;
    if image.len() <= setup_bytes {
        return Err(BootError::Malformed(format!(
            "bzImage of {} bytes has no protected-mode kernel after {} setup sectors",
            image.len(),
            setup_sects
        )));
    }
    // syssize: the protected-mode kernel's size in 16-byte units. A file shorter than the
    // header says was cut off (an interrupted copy or download); the kernel would fault or
    // hang partway through decompressing itself.
    let expected = setup_bytes as u64 + u64::from(hdr.syssize) * 16;
    if (image.len() as u64) < expected {
        return Err(BootError::Malformed(format!(
            "bzImage is truncated: its setup header says {expected} bytes, the file has {}",
            image.len()
        )));
    }
    Ok(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acpi_reset_is_the_reboot_method_unless_the_operator_names_one() {
        assert_eq!(with_reboot_method(""), "reboot=acpi");
        assert_eq!(
            with_reboot_method("console=ttyS0 panic=-1"),
            "console=ttyS0 panic=-1 reboot=acpi"
        );
        assert_eq!(with_reboot_method("reboot=k quiet"), "reboot=k quiet");
    }

    #[test]
    fn e820_reserves_the_legacy_hole_and_acpi_and_keeps_ram_around_them() {
        let mem = 512u64 << 20;
        // The ACPI tables in the BIOS area: inside the legacy hole, so the map is unchanged.
        let m = e820_map(&[(0, mem)], &[(0xe0000, 0x2000)]);
        assert_eq!(
            m,
            vec![
                (0, 0x9fc00, E820_RAM),
                (0x9fc00, 0x100000 - 0x9fc00, E820_RESERVED),
                (0x100000, mem - 0x100000, E820_RAM),
            ]
        );
        // Tables elsewhere split RAM; adjacent or overlapping ranges merge.
        let m = e820_map(
            &[(0, 3 << 30), (4 << 30, 1 << 30)],
            &[(0x200000, 0x1000), (0x201000, 0x1000), (0x9f000, 0x2000)],
        );
        assert_eq!(
            m,
            vec![
                (0, 0x9f000, E820_RAM),
                (0x9f000, 0x100000 - 0x9f000, E820_RESERVED),
                (0x100000, 0x100000, E820_RAM),
                (0x200000, 0x2000, E820_RESERVED),
                (0x202000, (3 << 30) - 0x202000, E820_RAM),
                (4 << 30, 1 << 30, E820_RAM),
            ]
        );
        // No RAM byte is both RAM and reserved, and all RAM is listed.
        let ram: u64 = m.iter().filter(|e| e.2 == E820_RAM).map(|e| e.1).sum();
        assert_eq!(ram, (4 << 30) - 0x100000 + 0x9f000 - 0x2000);
    }
}
