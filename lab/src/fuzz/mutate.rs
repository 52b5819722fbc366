//! Mutations of a stream of valid frames: what a broken or hostile peer sends instead. Each
//! returns its name, counted in the run's summary. Frame-aware mutations take the offsets of
//! the frames' headers; a length-changing one is applied after every in-place one (offsets
//! then no longer hold).

use farvm_memproto::frame::{HEADER_LEN, WIRE_PAGE};
use farvm_memproto::page_crc;
use farvm_prefetch::trace::rng::SplitMix64;

/// The opcode bytes a mutation writes: the known ones (requests and responses) and a few that
/// are not.
const OPCODES: [u8; 14] = [
    0x7e, 0x01, 0x02, 0x03, 0x04, 0x05, 0x81, 0x82, 0x83, 0x84, 0x85, 0x00, 0x06, 0xff,
];

fn pick(rng: &mut SplitMix64, n: usize) -> usize {
    rng.below(n as u64) as usize
}

/// A value near the interesting edges of a 32-bit length or count field.
fn lie_u32(rng: &mut SplitMix64, truth: u32) -> u32 {
    match rng.below(6) {
        0 => 0,
        1 => truth.wrapping_add(1),
        2 => truth.wrapping_sub(1),
        3 => truth.wrapping_add(rng.below(WIRE_PAGE as u64 * 2) as u32),
        4 => u32::MAX - rng.below(4) as u32,
        _ => rng.next_u64() as u32,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One in-place change of a header field of the frame at `at`: opcode, flags, status, count,
/// body length, namespace, version or magic.
pub fn header_lie(rng: &mut SplitMix64, buf: &mut [u8], at: usize, other_ns: u64) -> &'static str {
    if at + HEADER_LEN > buf.len() {
        return "header lie (past the end)";
    }
    let h = &mut buf[at..at + HEADER_LEN];
    match rng.below(8) {
        0 => {
            h[5] = OPCODES[pick(rng, OPCODES.len())];
            "opcode"
        }
        1 => {
            h[6] = 1 << rng.below(8);
            "flags"
        }
        2 => {
            h[7] = rng.below(12) as u8;
            "status"
        }
        3 => {
            let v = lie_u32(rng, u32_at(h, 24));
            h[24..28].copy_from_slice(&v.to_le_bytes());
            "count lie"
        }
        4 => {
            let v = lie_u32(rng, u32_at(h, 28));
            h[28..32].copy_from_slice(&v.to_le_bytes());
            "body length lie"
        }
        5 => {
            let ns = if rng.below(2) == 0 {
                other_ns
            } else {
                rng.below(1 << 12)
            };
            h[16..24].copy_from_slice(&ns.to_le_bytes());
            "namespace"
        }
        6 => {
            h[4] = h[4].wrapping_add(1 + rng.below(3) as u8);
            "protocol version"
        }
        _ => {
            h[rng.below(4) as usize] ^= 1 << rng.below(8);
            "magic"
        }
    }
}

/// Flips one bit of `buf`.
pub fn bit_flip(rng: &mut SplitMix64, buf: &mut [u8]) -> &'static str {
    if !buf.is_empty() {
        let i = pick(rng, buf.len());
        buf[i] ^= 1 << rng.below(8);
    }
    "bit flip"
}

/// Sets one byte of `buf` to a drawn value.
pub fn byte_set(rng: &mut SplitMix64, buf: &mut [u8]) -> &'static str {
    if !buf.is_empty() {
        let i = pick(rng, buf.len());
        buf[i] = rng.next_u64() as u8;
    }
    "byte set"
}

/// Changes the wire page at `at` (its seal or its data, one bit) and fixes its crc32c, so that
/// only the seal can tell.
pub fn page_flip_crc_fixed(rng: &mut SplitMix64, buf: &mut [u8], at: usize) -> &'static str {
    let wp = &mut buf[at..at + WIRE_PAGE];
    let (i, name) = if rng.below(2) == 0 {
        (
            4 + pick(rng, farvm_memproto::SEAL_LEN),
            "seal bit, crc fixed",
        )
    } else {
        (
            4 + farvm_memproto::SEAL_LEN + pick(rng, farvm_memproto::PAGE_SIZE),
            "data bit, crc fixed",
        )
    };
    wp[i] ^= 1 << rng.below(8);
    fix_crc(wp);
    name
}

/// Recomputes a wire page's crc32c over its seal and data.
pub fn fix_crc(wire_page: &mut [u8]) {
    let crc = page_crc(&wire_page[4..]);
    wire_page[..4].copy_from_slice(&crc.to_le_bytes());
}

/// A length-changing mutation: cut the stream short, drop a range, or splice in a copy of a
/// range (a frame's, or any) at a frame boundary or anywhere.
pub fn reshape(rng: &mut SplitMix64, buf: &mut Vec<u8>, frames: &[usize]) -> &'static str {
    if buf.is_empty() {
        return "empty";
    }
    match rng.below(4) {
        0 => {
            buf.truncate(pick(rng, buf.len()));
            "truncation"
        }
        1 => {
            let from = pick(rng, buf.len());
            let len = 1 + pick(rng, (buf.len() - from).min(2 * WIRE_PAGE));
            buf.drain(from..from + len);
            "range dropped"
        }
        2 => {
            // A whole frame again (a replayed request), at a frame boundary.
            let k = pick(rng, frames.len());
            let end = frames.get(k + 1).copied().unwrap_or(buf.len());
            let frame = buf[frames[k]..end].to_vec();
            let to = frames[pick(rng, frames.len())];
            buf.splice(to..to, frame);
            "frame duplicated"
        }
        _ => {
            let from = pick(rng, buf.len());
            let len = 1 + pick(rng, (buf.len() - from).min(HEADER_LEN * 4));
            let piece = buf[from..from + len].to_vec();
            let to = pick(rng, buf.len() + 1);
            buf.splice(to..to, piece);
            "range spliced"
        }
    }
}
