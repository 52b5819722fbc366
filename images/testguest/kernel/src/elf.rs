//! The few ELF64 fields needed to load the embedded ring-3 program: entry and PT_LOAD segments.
//! Validated once at boot; every process gets its own copy of the segments.

use farvm_guest_agent::boot::user::IMAGE_BASE;

pub const MAX_SEGS: usize = 8;
/// The program must fit in 64 MiB above IMAGE_BASE.
const IMAGE_SPAN: u64 = 64 << 20;

#[derive(Clone, Copy, Default)]
pub struct Seg {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub memsz: u64,
    /// PF_X = 1, PF_W = 2, PF_R = 4.
    pub flags: u32,
}

#[derive(Clone, Copy, Default)]
pub struct Image {
    pub entry: u64,
    pub segs: [Seg; MAX_SEGS],
    pub nsegs: usize,
}

fn u16_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u16::from_le_bytes([*b.get(o)?, *b.get(o + 1)?]) as u64)
}

fn u32_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u16_at(b, o)? | u16_at(b, o + 2)? << 16)
}

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u32_at(b, o)? | u32_at(b, o + 4)? << 32)
}

/// Parses and checks the program: 64-bit little-endian x86-64 executable, at most
/// [`MAX_SEGS`] PT_LOADs inside `IMAGE_BASE .. IMAGE_BASE + 64 MiB`, file ranges in bounds,
/// offsets congruent to addresses modulo 4 KiB.
pub fn parse(b: &[u8]) -> Option<Image> {
    if b.len() < 64 || b[0..4] != [0x7F, b'E', b'L', b'F'] || b[4] != 2 || b[5] != 1 {
        return None;
    }
    if u16_at(b, 16)? != 2 || u16_at(b, 18)? != 62 {
        return None; // ET_EXEC, EM_X86_64
    }
    let mut img = Image {
        entry: u64_at(b, 24)?,
        ..Image::default()
    };
    let phoff = u64_at(b, 32)? as usize;
    let phentsize = u16_at(b, 54)? as usize;
    let phnum = u16_at(b, 56)? as usize;
    if phentsize < 56 {
        return None;
    }
    for i in 0..phnum {
        let o = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(b, o)? != 1 {
            continue; // not PT_LOAD
        }
        let s = Seg {
            flags: u32_at(b, o + 4)? as u32,
            offset: u64_at(b, o + 8)?,
            vaddr: u64_at(b, o + 16)?,
            filesz: u64_at(b, o + 32)?,
            memsz: u64_at(b, o + 40)?,
        };
        let end = s.vaddr.checked_add(s.memsz)?;
        if img.nsegs == MAX_SEGS
            || s.vaddr < IMAGE_BASE
            || end > IMAGE_BASE + IMAGE_SPAN
            || s.filesz > s.memsz
            || s.offset.checked_add(s.filesz)? > b.len() as u64
            || s.offset % 4096 != s.vaddr % 4096
        {
            return None;
        }
        img.segs[img.nsegs] = s;
        img.nsegs += 1;
    }
    let entry_ok = img.segs[..img.nsegs]
        .iter()
        .any(|s| s.flags & 1 != 0 && (s.vaddr..s.vaddr + s.memsz).contains(&img.entry));
    (img.nsegs > 0 && entry_ok).then_some(img)
}
