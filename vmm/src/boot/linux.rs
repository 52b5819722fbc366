//! Linux boot per the x86 64-bit boot protocol: a bzImage or vmlinux loaded with linux-loader,
//! `boot_params` (zero page) with the setup header, e820 map, command line and initrd, and
//! identity-mapped page tables, entered at `startup_64` with `rsi` = boot_params.
//!
//! Linux cannot run at a usable speed on this host (PVM emulates all guest ring-0 code, about
//! 1 µs per instruction, and the emulator lacks CMPXCHG16B/XRSTOR): this path is implemented to
//! the protocol and tested up to the entry point.

use std::io::Cursor;

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress};

use super::{sniff_kernel, BootError, EntryState, KernelKind};
use crate::layout::LOW_RAM_MAX;
use crate::vstate::memory::GuestRam;

/// Guest-physical layout of the Linux boot data.
pub const GDT_GPA: u64 = 0x500;
pub const ZERO_PAGE_GPA: u64 = 0x7000;
pub const PML4_GPA: u64 = 0x9000;
const PDPT_GPA: u64 = 0xa000;
const PD_GPA: u64 = 0xb000; // four PDs: 0xb000..0xf000 identity-map 0..4 GiB
pub const CMDLINE_GPA: u64 = 0x20000;
pub const CMDLINE_MAX: usize = 0x10000;
/// Lowest address a kernel may be loaded at (1 MiB).
pub const HIMEM_START: u64 = 0x100000;
/// The Linux boot GDT selectors (`__BOOT_CS`, `__BOOT_DS`).
pub const BOOT_CS: u16 = 0x10;
pub const BOOT_DS: u16 = 0x18;
const GDT: [u64; 4] = [0, 0, 0x00af_9a00_0000_ffff, 0x00cf_9200_0000_ffff];

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
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
    pub kind: &'static str,
    pub protocol_version: u16,
    pub kernel_load: u64,
    pub kernel_end: u64,
    pub entry: u64,
    pub boot_params_gpa: u64,
    pub cmdline_gpa: u64,
    pub cmdline_len: usize,
    pub initrd_gpa: Option<u64>,
    pub initrd_len: u64,
    /// `(addr, size, type)` e820 entries.
    pub e820: Vec<(u64, u64, u32)>,
}

fn setup_err(msg: impl Into<String>) -> BootError {
    BootError::Setup(msg.into())
}

/// Loads a Linux kernel (bzImage or vmlinux), initrd and command line; returns the entry state
/// (vCPU 0, `rsi` = boot_params) and the placement.
pub fn setup(
    ram: &GuestRam,
    kernel: &[u8],
    initrd: Option<&[u8]>,
    cmdline: &str,
) -> Result<(EntryState, LinuxBootInfo), BootError> {
    // The loader writes through vm-memory directly: Linux guests run on local RAM only.
    let mem = ram.direct()?;
    let low_end = ram.regions()[0].len().min(LOW_RAM_MAX);
    let kind = sniff_kernel(kernel).ok_or_else(|| {
        BootError::Malformed(
            "not a Linux kernel: neither an ELF vmlinux nor a bzImage (no \"HdrS\" at 0x202)"
                .into(),
        )
    })?;
    let mut params = boot_params::default();
    let (kernel_load, kernel_end, entry) = match kind {
        KernelKind::BzImage => {
            let hdr = bz_header(kernel)?;
            // Relocatable kernels go to their preferred address when it fits, else code32_start.
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
    };
    if kernel_end > low_end {
        return Err(BootError::DoesNotFit(format!(
            "the kernel ends at {kernel_end:#x}, beyond low RAM ({low_end:#x})"
        )));
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;

    // Command line.
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

    // e820.
    let mut e820 = vec![
        (0, EBDA_START, E820_RAM),
        (EBDA_START, HIMEM_START - EBDA_START, E820_RESERVED),
        (HIMEM_START, low_end - HIMEM_START, E820_RAM),
    ];
    for r in &ram.regions()[1..] {
        e820.push((r.gpa(), r.len(), E820_RAM));
    }
    for (i, &(addr, size, ty)) in e820.iter().enumerate() {
        params.e820_table[i] = boot_e820_entry {
            addr,
            size,
            r#type: ty,
        };
    }
    params.e820_entries = e820.len() as u8;

    LinuxBootConfigurator::write_bootparams::<vm_memory::GuestMemoryMmap>(
        &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE_GPA)),
        mem,
    )
    .map_err(|e| setup_err(format!("writing boot_params: {e}")))?;

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
        e820,
    };
    Ok((entry_state, info))
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
    if image.len() <= (setup_sects + 1) * 512 {
        return Err(BootError::Malformed(format!(
            "bzImage of {} bytes has no protected-mode kernel after {} setup sectors",
            image.len(),
            setup_sects
        )));
    }
    Ok(hdr)
}
