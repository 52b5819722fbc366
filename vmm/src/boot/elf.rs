//! A strict ELF64 loader for the test-guest kernel: copies each PT_LOAD to its `p_paddr`.
//!
//! Own code rather than linux-loader's `Elf` because the test guest needs `p_paddr` placement
//! with full validation (clear errors on a malformed or truncated image) and the copy must go
//! through the guest-memory access layer.

use super::BootError;
use vm_memory::{Bytes, GuestAddress};

use crate::vstate::memory::GuestRam;

const PT_LOAD: u32 = 1;
const EM_X86_64: u16 = 62;
const ET_EXEC: u16 = 2;

/// Where a loaded ELF went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedElf {
    /// `e_entry` (a virtual address).
    pub entry: u64,
    /// Lowest guest-physical byte written.
    pub phys_start: u64,
    /// One past the highest guest-physical byte of any segment (including .bss).
    pub phys_end: u64,
}

/// One validated PT_LOAD segment.
#[derive(Clone, Copy, Debug)]
struct Segment {
    offset: u64,
    vaddr: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap_or([0; 8]))
}

fn malformed(msg: impl Into<String>) -> BootError {
    BootError::Malformed(msg.into())
}

/// Parses and validates the ELF header and program headers; returns entry and segments.
fn parse(image: &[u8]) -> Result<(u64, Vec<Segment>), BootError> {
    if image.len() < 64 {
        return Err(malformed(format!(
            "{} bytes is too short for an ELF64 header (64 bytes)",
            image.len()
        )));
    }
    if &image[..4] != b"\x7fELF" {
        return Err(malformed("not an ELF file (bad magic)"));
    }
    if image[4] != 2 || image[5] != 1 {
        return Err(malformed("not a little-endian ELF64 file"));
    }
    if u16_at(image, 18) != EM_X86_64 {
        return Err(malformed(format!(
            "ELF machine {} is not x86-64",
            u16_at(image, 18)
        )));
    }
    if u16_at(image, 16) != ET_EXEC {
        return Err(malformed(
            "ELF is not a static executable (ET_EXEC); link the kernel with -static -no-pie",
        ));
    }
    let entry = u64_at(image, 24);
    let phoff = u64_at(image, 32);
    let phentsize = u16_at(image, 54) as u64;
    let phnum = u16_at(image, 56) as u64;
    if phentsize < 56 {
        return Err(malformed(format!("program header size {phentsize} < 56")));
    }
    let ph_end = phnum
        .checked_mul(phentsize)
        .and_then(|n| n.checked_add(phoff))
        .ok_or_else(|| malformed("program header table overflows"))?;
    if ph_end > image.len() as u64 {
        return Err(malformed(format!(
            "program headers end at {ph_end} but the file has {} bytes (truncated?)",
            image.len()
        )));
    }
    let mut segs = Vec::new();
    for i in 0..phnum {
        let h = (phoff + i * phentsize) as usize;
        if u32_at(image, h) != PT_LOAD {
            continue;
        }
        let s = Segment {
            offset: u64_at(image, h + 8),
            vaddr: u64_at(image, h + 16),
            paddr: u64_at(image, h + 24),
            filesz: u64_at(image, h + 32),
            memsz: u64_at(image, h + 40),
        };
        if s.filesz > s.memsz {
            return Err(malformed(format!(
                "segment {i}: file size {:#x} > memory size {:#x}",
                s.filesz, s.memsz
            )));
        }
        let file_end = s.offset.checked_add(s.filesz);
        if file_end.is_none_or(|e| e > image.len() as u64) {
            return Err(malformed(format!(
                "segment {i}: bytes {:#x}+{:#x} lie beyond the end of the file (truncated?)",
                s.offset, s.filesz
            )));
        }
        if s.paddr.checked_add(s.memsz).is_none() || s.vaddr.checked_add(s.memsz).is_none() {
            return Err(malformed(format!("segment {i}: address range overflows")));
        }
        segs.push(s);
    }
    if segs.is_empty() {
        return Err(malformed("ELF has no PT_LOAD segment"));
    }
    if !segs
        .iter()
        .any(|s| entry >= s.vaddr && entry < s.vaddr + s.memsz.max(1))
    {
        return Err(malformed(format!(
            "entry point {entry:#x} is not inside any loaded segment"
        )));
    }
    Ok((entry, segs))
}

/// The guest-physical range `[start, end)` the PT_LOAD segments of `image` occupy once loaded.
pub fn phys_range(image: &[u8]) -> Result<(u64, u64), BootError> {
    let (_, segs) = parse(image)?;
    let start = segs.iter().map(|s| s.paddr).min().unwrap_or(0);
    let end = segs.iter().map(|s| s.paddr + s.memsz).max().unwrap_or(0);
    Ok((start, end))
}

/// Loads `image` into guest RAM; every segment must land at or above `min_paddr`.
pub fn load(ram: &GuestRam, image: &[u8], min_paddr: u64) -> Result<LoadedElf, BootError> {
    let (entry, segs) = parse(image)?;
    let mut start = u64::MAX;
    let mut end = 0;
    for s in &segs {
        if s.paddr < min_paddr || !ram.contains(s.paddr, s.memsz) {
            return Err(BootError::DoesNotFit(format!(
                "segment at physical {:#x}+{:#x} is outside usable RAM ({min_paddr:#x}..{:#x})",
                s.paddr,
                s.memsz,
                ram.end_gpa()
            )));
        }
        start = start.min(s.paddr);
        end = end.max(s.paddr + s.memsz);
    }
    for s in &segs {
        let bytes = &image[s.offset as usize..(s.offset + s.filesz) as usize];
        ram.write_slice(bytes, GuestAddress(s.paddr))?;
        if s.memsz > s.filesz {
            ram.fill(GuestAddress(s.paddr + s.filesz), s.memsz - s.filesz, 0)?;
        }
    }
    Ok(LoadedElf {
        entry,
        phys_start: start,
        phys_end: end,
    })
}

/// Builds a minimal ELF64 executable with one PT_LOAD holding `code` (for tests and probes).
pub fn build_test_elf(code: &[u8], vaddr: u64, paddr: u64) -> Vec<u8> {
    let mut f = vec![0u8; 0x1000];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    f[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
    f[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&vaddr.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes());
    f[52..54].copy_from_slice(&64u16.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = 64;
    f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
    f[ph + 4..ph + 8].copy_from_slice(&7u32.to_le_bytes());
    f[ph + 8..ph + 16].copy_from_slice(&0x1000u64.to_le_bytes());
    f[ph + 16..ph + 24].copy_from_slice(&vaddr.to_le_bytes());
    f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
    f[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    f[ph + 40..ph + 48].copy_from_slice(&((code.len() as u64 + 0xfff) & !0xfff).to_le_bytes());
    f.extend_from_slice(code);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_segment_and_zeroes_bss() {
        let ram = GuestRam::local(&[(0, 4 << 20)]).unwrap();
        ram.fill(GuestAddress(0x100000), 0x1000, 0xff).unwrap();
        let elf = build_test_elf(&[0x90, 0xf4], 0xffff_ffff_8010_0000, 0x100000);
        let l = load(&ram, &elf, 0x100000).unwrap();
        assert_eq!(l.entry, 0xffff_ffff_8010_0000);
        assert_eq!((l.phys_start, l.phys_end), (0x100000, 0x101000));
        assert_eq!(ram.read_obj::<u16>(GuestAddress(0x100000)).unwrap(), 0xf490);
        assert_eq!(
            ram.read_obj::<u8>(GuestAddress(0x100002)).unwrap(),
            0,
            ".bss zeroed"
        );
    }

    #[test]
    fn rejects_malformed_images() {
        let ram = GuestRam::local(&[(0, 4 << 20)]).unwrap();
        let good = build_test_elf(&[0xf4], 0x200000, 0x200000);
        let err = |img: &[u8]| load(&ram, img, 0x100000).unwrap_err().to_string();
        assert!(err(b"hello").contains("too short"));
        assert!(err(&[0u8; 128]).contains("bad magic"));
        assert!(err(&good[..0x1000]).contains("beyond the end"), "truncated");
        let mut bad_entry = good.clone();
        bad_entry[24..32].copy_from_slice(&0x999_0000u64.to_le_bytes());
        assert!(err(&bad_entry).contains("entry point"));
        let mut bad_machine = good.clone();
        bad_machine[18] = 3;
        assert!(err(&bad_machine).contains("not x86-64"));
        let low = build_test_elf(&[0xf4], 0x1000, 0x1000);
        assert!(err(&low).contains("outside usable RAM"));
        let high = build_test_elf(&[0xf4], 0x900_0000, 0x900_0000);
        assert!(err(&high).contains("outside usable RAM"));
    }
}
