//! libvirt's scaled integers (`<memory unit='GiB'>4</memory>`), with the units and rounding of
//! libvirt's own `virScaleInteger` and `virDomainParseMemory`.
//!
//! Units (case-insensitive): `b`, `byte`, `bytes`; `k`, `KiB`, `M`, `MiB`, ... up to `E`/`EiB`
//! are powers of 1024; `KB`, `MB`, ... `EB` are powers of 1000. Domain memory without a unit is
//! in KiB and is rounded up to whole KiB.

/// Bytes per unit, or `None` for a unit libvirt does not know.
pub fn unit_scale(unit: &str) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    if matches!(u.as_str(), "b" | "byte" | "bytes") {
        return Some(1);
    }
    let mut chars = u.chars();
    let prefix = chars.next()?;
    let base: u64 = match chars.as_str() {
        "" | "ib" => 1024,
        "b" => 1000,
        _ => return None,
    };
    let power = match prefix {
        'k' => 1,
        'm' => 2,
        'g' => 3,
        't' => 4,
        'p' => 5,
        'e' => 6,
        _ => return None,
    };
    Some(base.pow(power))
}

/// The libvirt units this module knows, in their canonical spelling (for tests and generators).
pub const UNITS: &[&str] = &[
    "b", "bytes", "KB", "k", "KiB", "MB", "M", "MiB", "GB", "G", "GiB", "TB", "T", "TiB", "PB",
    "P", "PiB", "EB", "E", "EiB",
];

/// Parses `value` (decimal digits) scaled by `unit` (or `default_scale` without one) into
/// bytes. Errors say what is wrong, without naming the element (the caller does).
pub fn parse_scaled(value: &str, unit: Option<&str>, default_scale: u64) -> Result<u64, String> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{value}` is not a non-negative integer"));
    }
    let n: u64 = v
        .parse()
        .map_err(|_| format!("`{v}` is too large for a 64-bit count"))?;
    let scale = match unit {
        Some(u) => unit_scale(u).ok_or_else(|| {
            format!("unknown unit `{u}` (use b, KiB, MiB, GiB, TiB, ... or KB, MB, GB, ...)")
        })?,
        None => default_scale,
    };
    n.checked_mul(scale).ok_or_else(|| {
        format!(
            "{v} {} does not fit in 64 bits of bytes",
            unit.unwrap_or("")
        )
    })
}

/// Domain memory: KiB by default, rounded up to a whole KiB as libvirt stores it.
pub fn parse_memory(value: &str, unit: Option<&str>) -> Result<u64, String> {
    let bytes = parse_scaled(value, unit, 1024)?;
    bytes
        .div_ceil(1024)
        .checked_mul(1024)
        .ok_or_else(|| format!("`{value}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn units_match_libvirt() {
        assert_eq!(unit_scale("b"), Some(1));
        assert_eq!(unit_scale("Bytes"), Some(1));
        assert_eq!(unit_scale("k"), Some(1024));
        assert_eq!(unit_scale("KiB"), Some(1024));
        assert_eq!(unit_scale("kib"), Some(1024));
        assert_eq!(unit_scale("KB"), Some(1000));
        assert_eq!(unit_scale("MiB"), Some(1 << 20));
        assert_eq!(unit_scale("GB"), Some(1_000_000_000));
        assert_eq!(unit_scale("EiB"), Some(1 << 60));
        assert_eq!(unit_scale("E"), Some(1 << 60));
        for bad in ["", "x", "KiBB", "Ki", "kbb", "Q", "iB"] {
            assert_eq!(unit_scale(bad), None, "{bad}");
        }
    }

    #[test]
    fn memory_defaults_to_kib_and_rounds_up() {
        assert_eq!(parse_memory("524288", None), Ok(512 << 20));
        assert_eq!(parse_memory("1", Some("GiB")), Ok(1 << 30));
        assert_eq!(parse_memory("1000", Some("b")), Ok(1024));
        assert_eq!(parse_memory("1", Some("KB")), Ok(1024));
        assert_eq!(parse_memory(" 64 ", Some("M")), Ok(64 << 20));
        assert!(parse_memory("-1", None)
            .unwrap_err()
            .contains("not a non-negative"));
        assert!(parse_memory("1.5", Some("G")).is_err());
        assert!(parse_memory("16", Some("EiB"))
            .unwrap_err()
            .contains("64 bits"));
        assert!(parse_memory("1", Some("furlong"))
            .unwrap_err()
            .contains("unknown unit"));
    }

    proptest! {
        /// Any byte count written as `count << shift` in the matching binary unit, or as a
        /// multiple of a decimal unit, parses back to the same bytes.
        #[test]
        fn scaled_round_trip(unit in proptest::sample::select(UNITS), n in 0u64..1_000_000) {
            let scale = unit_scale(unit).unwrap();
            let expect = n.checked_mul(scale);
            let got = parse_scaled(&n.to_string(), Some(unit), 1);
            match expect {
                Some(b) => prop_assert_eq!(got, Ok(b)),
                None => prop_assert!(got.is_err()),
            }
        }

        /// Memory of any KiB count, written in the largest binary unit dividing it, reads back
        /// as that count.
        #[test]
        fn memory_round_trip(kib in 1u64..(1 << 40)) {
            let bytes = kib * 1024;
            let (value, unit) = ["EiB", "PiB", "TiB", "GiB", "MiB", "KiB"]
                .iter()
                .map(|u| (unit_scale(u).unwrap(), *u))
                .find(|(s, _)| bytes % s == 0)
                .map(|(s, u)| (bytes / s, u))
                .unwrap();
            prop_assert_eq!(parse_memory(&value.to_string(), Some(unit)), Ok(bytes));
            prop_assert_eq!(parse_memory(&kib.to_string(), None), Ok(bytes));
        }

        /// Case does not matter.
        #[test]
        fn units_are_case_insensitive(unit in proptest::sample::select(UNITS)) {
            prop_assert_eq!(unit_scale(&unit.to_uppercase()), unit_scale(unit));
            prop_assert_eq!(unit_scale(&unit.to_lowercase()), unit_scale(unit));
        }
    }
}
