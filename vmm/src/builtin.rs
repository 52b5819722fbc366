//! The built-in test-guest kernel (`farvm_images::TESTGUEST_ELF`), booted when `farvm run` has
//! no `--kernel`.

/// The embedded test-guest ELF.
pub fn test_guest_elf() -> &'static [u8] {
    farvm_images::TESTGUEST_ELF
}
