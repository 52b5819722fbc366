//! The guest-physical memory layout: where RAM goes for a given size, and the MMIO hole.
//!
//! RAM starts at GPA 0. Everything above [`LOW_RAM_MAX`] is placed from [`HIGH_RAM_BASE`] up, so
//! the 32-bit MMIO window (IOAPIC at 0xFEC0_0000, LAPIC at 0xFEE0_0000) is never RAM.

/// Highest amount of RAM placed below 4 GiB (the rest of 3..4 GiB is the MMIO hole).
pub const LOW_RAM_MAX: u64 = 3 << 30;
/// Where RAM above [`LOW_RAM_MAX`] continues.
pub const HIGH_RAM_BASE: u64 = 4 << 30;
/// Largest guest the VMM accepts (the test guest's boot tables map at most 240 GiB).
pub const MAX_RAM: u64 = 240 << 30;
/// Smallest guest the VMM accepts (boot tables + kernel + a few frames).
pub const MIN_RAM: u64 = 16 << 20;

/// `(gpa, len)` RAM ranges for `mem_bytes` of guest RAM (rounded down to 4 KiB).
pub fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    let mem = mem_bytes & !0xfff;
    if mem <= LOW_RAM_MAX {
        vec![(0, mem)]
    } else {
        vec![(0, LOW_RAM_MAX), (HIGH_RAM_BASE, mem - LOW_RAM_MAX)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_above_three_gib() {
        assert_eq!(ram_ranges(512 << 20), vec![(0, 512 << 20)]);
        assert_eq!(ram_ranges(3 << 30), vec![(0, 3 << 30)]);
        assert_eq!(ram_ranges(5 << 30), vec![(0, 3 << 30), (4 << 30, 2 << 30)]);
    }
}
