//! Byte counts as people read them (binary units), for errors and tables: `farvm-units` with
//! the pool's error type (text).

/// `1536 MiB` → "1.5 GiB"; exact multiples print without decimals ("3 GiB", "0 B").
pub fn fmt_bytes(bytes: u64) -> String {
    farvm_units::Human(bytes).to_string()
}

/// Parses "4096", "512M", "64G", "1.5G", "3GiB" (powers of 1024; [`farvm_units::parse_size`]),
/// with the input in the error.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    farvm_units::parse_size(s).map_err(|e| format!("`{s}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(3 << 30), "3 GiB");
        assert_eq!(fmt_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(parse_bytes("64G").unwrap(), 64 << 30);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 1536 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
