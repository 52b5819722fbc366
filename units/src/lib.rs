//! Byte sizes as people write and read them, for every farvm crate and the test guest
//! (`no_std`, no allocation): [`parse_size`] reads `4096`, `512M`, `64KiB`, `1.5G` (binary
//! units; a fraction must come to whole bytes), [`format_size`] writes the shortest exact form
//! (`256M`, `4097`) that [`parse_size`] reads back, and [`Human`] the rounded form for tables
//! and errors (`1.5 GiB`).

#![no_std]

use core::fmt;

/// Why a size was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing, or no digits where the number should be.
    NotANumber,
    /// A suffix other than K, M, G or T (each optionally followed by `iB` or `B`), or `B`.
    UnknownUnit,
    /// More than `u64::MAX` bytes.
    TooLarge,
    /// A fraction that does not come to whole bytes (`1.5` bytes, `0.3K`).
    NotWholeBytes,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeError::NotANumber => "not a number (e.g. 4096, 512M, 64G)",
            SizeError::UnknownUnit => "unknown unit (use K, M, G or T: powers of 1024)",
            SizeError::TooLarge => "too large",
            SizeError::NotWholeBytes => "not a whole number of bytes",
        })
    }
}

impl core::error::Error for SizeError {}

/// The multiplier a unit suffix stands for: `""`/`B` 1, `K` 2^10, `M` 2^20, `G` 2^30,
/// `T` 2^40, each also as `KB`/`KiB` (any case).
fn unit(suffix: &str) -> Option<u64> {
    let b = suffix.as_bytes();
    let shift = match b.first().map(u8::to_ascii_uppercase) {
        None => return Some(1),
        Some(b'B') if b.len() == 1 => return Some(1),
        Some(b'K') => 10,
        Some(b'M') => 20,
        Some(b'G') => 30,
        Some(b'T') => 40,
        Some(_) => return None,
    };
    let rest = &suffix[1..];
    (rest.is_empty() || rest.eq_ignore_ascii_case("b") || rest.eq_ignore_ascii_case("ib"))
        .then_some(1u64 << shift)
}

/// Reads a size (module doc): decimal digits, an optional fraction, an optional unit;
/// whitespace around the number and between it and its unit is allowed.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(num_end);
    if num.is_empty() {
        return Err(SizeError::NotANumber);
    }
    let mult = unit(suffix.trim()).ok_or(SizeError::UnknownUnit)?;
    let (whole, frac) = match num.split_once('.') {
        Some((w, f)) => (w, f),
        None => (num, ""),
    };
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(SizeError::NotANumber);
    }
    let mut bytes: u64 = 0;
    for d in whole.bytes() {
        bytes = bytes
            .checked_mul(10)
            .and_then(|b| b.checked_add(u64::from(d - b'0')))
            .ok_or(SizeError::TooLarge)?;
    }
    bytes = bytes.checked_mul(mult).ok_or(SizeError::TooLarge)?;
    // The fraction, exactly: digits × mult / 10^k must be a whole number (u128: no overflow
    // for up to 19 digits times 2^40).
    let frac = frac.trim_end_matches('0');
    if !frac.is_empty() {
        if frac.len() > 19 {
            return Err(SizeError::NotWholeBytes);
        }
        let mut digits: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac.bytes() {
            digits = digits * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        let part = digits * u128::from(mult);
        if !part.is_multiple_of(scale) {
            return Err(SizeError::NotWholeBytes);
        }
        let part = u64::try_from(part / scale).map_err(|_| SizeError::TooLarge)?;
        bytes = bytes.checked_add(part).ok_or(SizeError::TooLarge)?;
    }
    Ok(bytes)
}

/// The shortest exact form of `bytes` with the largest unit that divides it: `256M`, `1G`,
/// `4097`, `0` ([`parse_size`] reads it back).
pub fn format_size(bytes: u64) -> Exact {
    Exact(bytes)
}

/// See [`format_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exact(pub u64);

/// A formatted size on the stack, so that width and alignment (`{:>8}`) apply to it whole.
struct Text {
    buf: [u8; 32],
    len: usize,
}

impl fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes `args` into a [`Text`] and pads that as `f` asks.
fn pad(f: &mut fmt::Formatter<'_>, args: fmt::Arguments<'_>) -> fmt::Result {
    let mut t = Text {
        buf: [0; 32],
        len: 0,
    };
    fmt::Write::write_fmt(&mut t, args)?;
    f.pad(core::str::from_utf8(&t.buf[..t.len]).map_err(|_| fmt::Error)?)
}

impl fmt::Display for Exact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if n != 0 && n.is_multiple_of(1u64 << shift) {
                return pad(f, format_args!("{}{suffix}", n >> shift));
            }
        }
        pad(f, format_args!("{n}"))
    }
}

/// `bytes` for people: the largest binary unit it reaches, with one decimal unless exact
/// (`1.5 GiB`, `3 GiB`, `0 B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Human(pub u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let bytes = self.0;
        let mut unit = 0;
        let mut scale = 1u64;
        while unit + 1 < UNITS.len() && bytes >= scale << 10 {
            scale <<= 10;
            unit += 1;
        }
        if bytes.is_multiple_of(scale) {
            pad(f, format_args!("{} {}", bytes / scale, UNITS[unit]))
        } else {
            // One decimal, rounded, in integers (no float formatting in the guest).
            let tenths = (u128::from(bytes) * 10 + u128::from(scale) / 2) / u128::from(scale);
            pad(
                f,
                format_args!("{}.{} {}", tenths / 10, tenths % 10, UNITS[unit]),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn reads_what_people_write() {
        for (s, want) in [
            ("4096", 4096),
            ("0", 0),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("512M", 512 << 20),
            ("2MB", 2 << 20),
            ("1GiB", 1 << 30),
            ("1gib", 1 << 30),
            ("3T", 3 << 40),
            ("1.5G", 1536 << 20),
            ("0.5K", 512),
            ("2.0", 2),
            (" 8 M ", 8 << 20),
            ("16B", 16),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s:?}");
        }
        for (s, why) in [
            ("", SizeError::NotANumber),
            ("M", SizeError::NotANumber),
            (".", SizeError::NotANumber),
            ("1.2.3", SizeError::NotANumber),
            ("-5M", SizeError::NotANumber),
            ("lots", SizeError::NotANumber),
            ("12Q", SizeError::UnknownUnit),
            ("1Mi", SizeError::UnknownUnit),
            ("1KiBB", SizeError::UnknownUnit),
            ("1.5", SizeError::NotWholeBytes),
            ("0.3K", SizeError::NotWholeBytes),
            ("99999999999999999999", SizeError::TooLarge),
            ("99999999T", SizeError::TooLarge),
        ] {
            assert_eq!(parse_size(s), Err(why), "{s:?}");
        }
    }

    #[test]
    fn formats_read_back() {
        for (n, exact, human) in [
            (0, "0", "0 B"),
            (4096, "4K", "4 KiB"),
            (4097, "4097", "4.0 KiB"),
            (256 << 20, "256M", "256 MiB"),
            (1536 << 20, "1536M", "1.5 GiB"),
            (3 << 30, "3G", "3 GiB"),
            (5 << 40, "5T", "5 TiB"),
        ] {
            assert_eq!(format_size(n).to_string(), exact);
            assert_eq!(Human(n).to_string(), human);
            assert_eq!(parse_size(exact), Ok(n));
        }
        assert_eq!(std::format!("[{:>6}]", format_size(4096)), "[    4K]");
        assert_eq!(std::format!("[{:<9}]", Human(3 << 30)), "[3 GiB    ]");
    }
}
