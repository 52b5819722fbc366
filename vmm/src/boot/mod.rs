//! Loading a guest kernel and building its entry state: the test-guest ELF (direct 64-bit entry,
//! VMM-built page tables), recognising a kernel file as the test guest, and Linux (bzImage /
//! vmlinux through linux-loader, with its ACPI tables); and the test guest's boot data for VMMs
//! other than farvm (`pvh`: QEMU).

pub mod acpi;
pub mod elf;
pub mod initrd;
pub mod linux;
pub mod pvh;
pub mod testguest;
pub mod testguest_file;

use crate::vstate::memory::MemError;
pub use crate::vstate::regs::EntryState;

/// Errors while loading a kernel or building its boot data.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel or initrd is not what it claims to be.
    #[error("kernel image is malformed: {0}")]
    Malformed(String),
    /// The initrd is nothing a kernel could unpack or mount.
    #[error("initrd is unusable: {0}")]
    BadInitrd(String),
    /// The kernel or initrd does not fit guest RAM.
    #[error("kernel image does not fit guest RAM: {0}")]
    DoesNotFit(String),
    /// Something else in the boot setup failed.
    #[error("boot setup: {0}")]
    Setup(String),
    /// Writing guest memory failed.
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// What kind of kernel a file holds, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// An ELF64 image (the test guest, or a Linux vmlinux when it has Linux notes / is given
    /// an initrd or cmdline).
    Elf,
    /// A Linux bzImage (setup header magic "HdrS" at 0x202).
    BzImage,
}

/// Sniffs the kernel kind: ELF magic or the Linux setup-header magic.
pub fn sniff_kernel(image: &[u8]) -> Option<KernelKind> {
    if image.len() >= 4 && &image[..4] == b"\x7fELF" {
        return Some(KernelKind::Elf);
    }
    if image.len() >= 0x206 && &image[0x202..0x206] == b"HdrS" {
        return Some(KernelKind::BzImage);
    }
    None
}
