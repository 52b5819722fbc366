//! farvm-images: guest images built from this repository.
//!
//! [`TESTGUEST_ELF`] is the test-guest kernel (images/testguest/kernel) with its ring-3 program
//! (images/testguest/user) embedded, built by this crate's build script with the pinned
//! toolchain. `farvm run` boots it when no `--kernel` is given.

/// The test-guest kernel ELF (x86-64, PT_LOADs at physical 1 MiB, entry in the kernel window).
pub static TESTGUEST_ELF: &[u8] = include_bytes!(env!("FARVM_TESTGUEST_ELF"));

/// The ring-3 program alone (already inside [`TESTGUEST_ELF`]; exposed for inspection tests).
pub static TESTGUEST_USER_ELF: &[u8] = include_bytes!(env!("FARVM_TESTGUEST_USER_ELF"));

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes([b[o], b[o + 1]])
    }

    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    /// PT_LOAD (vaddr, paddr, filesz, memsz, flags) of an ELF64.
    fn loads(b: &[u8]) -> Vec<(u64, u64, u64, u64, u32)> {
        let phoff = u64_at(b, 32) as usize;
        let n = u16_at(b, 56) as usize;
        (0..n)
            .map(|i| phoff + i * 56)
            .filter(|&o| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) == 1)
            .map(|o| {
                let flags = u32::from_le_bytes(b[o + 4..o + 8].try_into().unwrap());
                (
                    u64_at(b, o + 16),
                    u64_at(b, o + 24),
                    u64_at(b, o + 32),
                    u64_at(b, o + 40),
                    flags,
                )
            })
            .collect()
    }

    #[test]
    fn kernel_is_linked_where_the_boot_protocol_expects() {
        use farvm_guest_agent::boot::{KERNEL_PHYS_BASE, KERNEL_WINDOW_BASE};
        let b = TESTGUEST_ELF;
        assert_eq!(&b[..4], b"\x7fELF");
        assert_eq!(u16_at(b, 18), 62, "x86-64");
        let entry = u64_at(b, 24);
        assert_eq!(
            entry,
            KERNEL_WINDOW_BASE + KERNEL_PHYS_BASE,
            "entry = _start at 1 MiB"
        );
        let segs = loads(b);
        assert!(segs.len() >= 2);
        for (vaddr, paddr, filesz, memsz, _) in segs {
            assert_eq!(
                vaddr - KERNEL_WINDOW_BASE,
                paddr,
                "vaddr/paddr follow the kernel window"
            );
            assert!(paddr >= KERNEL_PHYS_BASE && memsz >= filesz);
            assert!(paddr + memsz < 16 << 20, "kernel image stays small");
        }
    }

    #[test]
    fn user_program_is_linked_at_its_image_base() {
        use farvm_guest_agent::boot::user::IMAGE_BASE;
        let b = TESTGUEST_USER_ELF;
        assert_eq!(
            u64_at(b, 24),
            IMAGE_BASE,
            "entry = _start at the image base"
        );
        let segs = loads(b);
        assert!(
            segs.iter().any(|s| s.4 & 1 != 0 && s.0 == IMAGE_BASE),
            "text is executable"
        );
        assert!(
            segs.iter().all(|s| !(s.4 & 1 != 0 && s.4 & 2 != 0)),
            "no W+X segment"
        );
    }
}
