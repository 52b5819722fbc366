//! What a freestanding binary on the host target must supply itself: `memcpy`, `memmove`,
//! `memset`, `memcmp`, `bcmp` (the host's compiler_builtins expects libc to have them) and a
//! dummy `rust_eh_personality` (the precompiled libcore's unwind tables reference it), plus
//! the syscall numbers shared by the kernel and the ring-3 program.
//!
//! `rep movsb`/`rep stosb` are fast natively (ring 3) and at least correct when emulated
//! (ring 0, where the kernel avoids bulk copies and asks the VMM instead).
#![no_std]

/// Syscalls through the `int3` gate (`int 0x80` also works via the #UD fix-up): number in
/// `rax`, argument in `rdi`, result in `rax`.
pub mod sys {
    /// End the process. Its mailbox (state DONE/FAILED) says how it went.
    pub const EXIT: u64 = 0;
    /// Give the CPU to the next runnable process on this vCPU.
    pub const YIELD: u64 = 1;
    /// Returned in `rax` for an unknown syscall number.
    pub const ENOSYS: u64 = u64::MAX;
}

/// # Safety
/// `dst` and `src` must be valid for `n` bytes and not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid and disjoint; `rep movsb` copies
    // exactly `n` bytes forward (DF is clear: the kernel clears it on entry, ring 3 never sets it).
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _,
            inout("rsi") src => _, options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `dst` and `src` must be valid for `n` bytes (they may overlap).
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // dst is below src or past its end: a forward copy never reads an overwritten byte.
        // SAFETY: validity is the caller's guarantee; forward order is overlap-safe here.
        unsafe { memcpy(dst, src, n) };
    } else {
        let mut i = n;
        while i > 0 {
            i -= 1;
            // SAFETY: i < n, so both pointers stay inside the caller's ranges; copying from the
            // end backwards is overlap-safe when dst is above src.
            unsafe { dst.add(i).write_volatile(src.add(i).read_volatile()) };
        }
    }
    dst
}

/// # Safety
/// `dst` must be valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `dst..dst+n` is writable; `rep stosb` writes exactly `n`
    // bytes of `al`.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _,
            in("al") c as u8, options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `a` and `b` must be valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n and the caller guarantees both ranges are readable. Volatile keeps
        // LLVM from turning this loop back into a memcmp call.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// # Safety
/// `a` and `b` must be valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// Never called (panic = abort); referenced by libcore's precompiled `.eh_frame`.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
