//! Pinning connection-serving threads to one host CPU (`--connection-cpu`).

use std::io;

fn allowed() -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed; 0 is this thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

/// Checks that this process may run on `cpu`.
pub(super) fn check(cpu: usize) -> Result<(), String> {
    let set = allowed().map_err(|e| format!("cannot read the CPU affinity: {e}"))?;
    // SAFETY: `cpu` is checked against CPU_SETSIZE, the bit count of `set`, first.
    if cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &set) } {
        Ok(())
    } else {
        Err("not a CPU this process may run on".into())
    }
}

/// Pins the calling thread to `cpu`.
pub(super) fn pin_current(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
