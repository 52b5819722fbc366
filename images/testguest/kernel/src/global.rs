//! `Global<T>`: a static the kernel mutates through raw pointers.
//!
//! The kernel's shared state is either written once by the BSP before `BOOT_DONE` is published
//! (Release/Acquire on that flag orders it for the APs) or owned by one vCPU (per-CPU data, the
//! processes pinned to it). `static mut` would work but references to it are linted against;
//! this wrapper makes every access an explicit raw-pointer operation.

use core::cell::UnsafeCell;

#[repr(transparent)]
pub struct Global<T>(UnsafeCell<T>);

// SAFETY: see the module comment: each Global has a single writer at a time by construction
// (boot-time initialisation before the APs start, or per-CPU ownership).
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    pub const fn new(v: T) -> Self {
        Global(UnsafeCell::new(v))
    }

    pub fn get(&self) -> *mut T {
        self.0.get()
    }
}
