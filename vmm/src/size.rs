//! Parsing of human-written byte sizes (`512M`, `2G`, `64KiB`, `4096`).

/// Parses a size with an optional binary suffix K/M/G/T (optionally followed by `iB` or `B`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "invalid size `{s}`: expected a number with an optional K, M, G or T suffix (e.g. 512M)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size `{s}`: number too large"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "invalid size `{s}`: unknown suffix `{suffix}` (use K, M, G or T)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size `{s}`: too large"))
}

/// Formats a byte count with the largest exact binary suffix (`256M`, `1G`, `4097`).
pub fn format_size(n: u64) -> String {
    for (shift, suf) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{suf}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(256 << 20), "256M");
        assert_eq!(format_size(4097), "4097");
    }
}
