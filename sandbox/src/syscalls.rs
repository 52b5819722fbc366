//! The system calls of each thread class (x86-64 numbers): for a thread class the calls it
//! may make, for a process class the calls nobody in it may make. The lists come from
//! `strace -f` of the test suites grouped by thread (docs/security.md says how to redo it);
//! a comment says why an unusual call is there.

use std::collections::BTreeMap;

use libc::c_long;
use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

use crate::ThreadClass;

/// A filter's rules: a call and the argument conditions it is allowed (or forbidden) under;
/// no conditions: any arguments.
pub(crate) type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// What a class's list means.
pub(crate) enum List {
    /// The calls allowed; every other call is denied.
    Allowed(Rules),
    /// The calls denied; every other call is allowed.
    Denied(Rules),
}

/// Errors building a rule: seccompiler rejects only malformed conditions, which these
/// constant lists never contain; the error is kept rather than unwrapped.
pub(crate) type BuildResult<T> = Result<T, seccompiler::BackendError>;

/// The list of `class`.
pub(crate) fn list(class: ThreadClass) -> BuildResult<List> {
    let mut r = Rules::new();
    match class {
        ThreadClass::Vmm | ThreadClass::MemServer => {
            any(&mut r, FORBIDDEN_IN_PROCESS);
            return Ok(List::Denied(r));
        }
        ThreadClass::Vcpu => {
            thread_runtime(&mut r)?;
            any(&mut r, SOCKET_IO);
            // KVM_RUN and the vCPU's register ioctls; UFFDIO_CONTINUE/WAKE when a page is
            // installed inline on the faulting vCPU; a tap's ioctls never run here.
            any(&mut r, &[libc::SYS_ioctl]);
            // virtio-blk requests are served on the vCPU that kicks the queue.
            any(&mut r, BLOCK_IO);
            // Kicking another vCPU out of KVM_RUN: pthread_kill.
            any(&mut r, &[libc::SYS_tgkill, libc::SYS_getpid]);
        }
        ThreadClass::FaultHandler => {
            thread_runtime(&mut r)?;
            any(&mut r, SOCKET_IO);
            // UFFDIO_* and KVM_PRE_FAULT_MEMORY (stage-2 injection); verbs' ioctls with RDMA.
            any(&mut r, &[libc::SYS_ioctl]);
            any(&mut r, PAGE_DROP);
            // The CPU count (available_parallelism) is read once from /sys.
            read_only_open(&mut r)?;
        }
        ThreadClass::Evictor => {
            thread_runtime(&mut r)?;
            // Write-backs go out inline on the store's demand lane when it is idle.
            any(&mut r, SOCKET_IO);
            // UFFDIO_WRITEPROTECT / UFFDIO_MOVE (anonymous guest memory).
            any(&mut r, &[libc::SYS_ioctl]);
            any(&mut r, PAGE_DROP);
            // A page a fault waits on is read again when its eviction gives it up; after a
            // lazy restore that read may come from the snapshot's page file, already open.
            any(&mut r, &[libc::SYS_pread64]);
        }
        ThreadClass::StoreConnection => {
            thread_runtime(&mut r)?;
            any(&mut r, SOCKET_IO);
            // Receivers complete reads: UFFDIO_CONTINUE, KVM_PRE_FAULT_MEMORY; verbs' ioctls.
            any(&mut r, &[libc::SYS_ioctl]);
            // The maintenance thread reconnects a server out of service: a new socket (or
            // verbs device) and the new connection's threads (clone3: glibc's
            // pthread_create; its flags sit in a struct seccomp cannot read).
            any(
                &mut r,
                &[libc::SYS_socket, libc::SYS_connect, libc::SYS_clone3],
            );
            r.insert(libc::SYS_clone, threads_only()?);
            any(&mut r, VERBS_OPEN);
        }
        ThreadClass::Device => {
            thread_runtime(&mut r)?;
            // A tap's or the console input's reads, the guest's interrupt eventfd writes.
            any(&mut r, SOCKET_IO);
            any(&mut r, &[libc::SYS_ioctl]);
            // A received packet written into a page of a lazily restored VM that is still in
            // the snapshot's page file brings it in from there (the file already open).
            any(&mut r, &[libc::SYS_pread64]);
        }
        ThreadClass::Metrics => {
            thread_runtime(&mut r)?;
            any(&mut r, SOCKET_IO);
            any(&mut r, &[libc::SYS_accept4, libc::SYS_accept]);
            // tokio's blocking pool (`tokio-rt-worker`): a scrape starts one thread, which
            // inherits this filter (clone3: glibc's pthread_create, flags in a struct).
            any(&mut r, &[libc::SYS_clone3]);
            r.insert(libc::SYS_clone, threads_only()?);
            // FIONBIO on accepted sockets (tokio).
            any(&mut r, &[libc::SYS_ioctl]);
            // The process collectors read /proc/self/{stat,status,io,fd}.
            read_only_open(&mut r)?;
            any(
                &mut r,
                &[
                    libc::SYS_getdents64,
                    libc::SYS_getrusage,
                    libc::SYS_sysinfo,
                    libc::SYS_prlimit64,
                    libc::SYS_uname,
                ],
            );
        }
        ThreadClass::MemServerConnection => {
            thread_runtime(&mut r)?;
            any(&mut r, SOCKET_IO);
            // Verbs' ioctls (RDMA connections); FIONBIO.
            any(&mut r, &[libc::SYS_ioctl]);
            // Freed pages of the arena are given back (MADV_DONTNEED / MADV_REMOVE).
            any(&mut r, PAGE_DROP);
            // --connection-cpu pins the thread.
            any(&mut r, &[libc::SYS_sched_setaffinity]);
            read_only_open(&mut r)?;
            // An RDMA connection opens the verbs device of its local address (rdma-core
            // enumerates devices over an AF_NETLINK socket).
            r.insert(libc::SYS_socket, vec![arg0_is(libc::AF_NETLINK as u64)?]);
            any(&mut r, VERBS_OPEN);
        }
    }
    Ok(List::Allowed(r))
}

/// What every Rust thread needs from glibc and std: memory, futexes, signals (the alternate
/// stack, the SIGSYS handler's return), time, its own name (`prctl` PR_SET_NAME/PR_GET_NAME:
/// the SIGSYS handler reads the name with it), `getrandom` (std's hash keys, ring's nonces
/// when sealing pages), a panic's abort (`tgkill`, `rt_sigaction`), exiting, and entering a
/// class of its own (one more filter).
fn thread_runtime(r: &mut Rules) -> BuildResult<()> {
    any(
        r,
        &[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_close,
            libc::SYS_futex,
            libc::SYS_mmap,
            libc::SYS_munmap,
            libc::SYS_mprotect,
            libc::SYS_madvise,
            libc::SYS_mremap,
            libc::SYS_brk,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigreturn,
            libc::SYS_sigaltstack,
            libc::SYS_clock_gettime,
            libc::SYS_clock_getres,
            libc::SYS_gettimeofday,
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_tgkill,
            libc::SYS_sched_yield,
            libc::SYS_sched_getaffinity,
            libc::SYS_getcpu,
            libc::SYS_getrandom,
            libc::SYS_rseq,
            libc::SYS_set_robust_list,
            libc::SYS_restart_syscall,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ],
    );
    // A thread started by a thread that already entered its class inherits that filter, and
    // must still be able to enter its own (seccompiler's `apply_filter`: no-new-privileges,
    // then one more filter). A filter can only narrow what a thread may do: allowing these
    // gives nothing away. (The store connections' maintenance thread starts the threads of a
    // server it reconnects: without them those died of SIGSYS at their first line.)
    r.insert(
        libc::SYS_prctl,
        vec![
            arg0_is(libc::PR_SET_NAME as u64)?,
            arg0_is(libc::PR_GET_NAME as u64)?,
            arg0_is(libc::PR_SET_NO_NEW_PRIVS as u64)?,
        ],
    );
    r.insert(
        libc::SYS_seccomp,
        vec![arg0_is(u64::from(libc::SECCOMP_SET_MODE_FILTER))?],
    );
    Ok(())
}

/// Data on sockets, pipes, eventfds and files already open, and waiting for it.
const SOCKET_IO: &[c_long] = &[
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_fcntl,
];

/// A disk image already open: reads, writes, flushes, discards.
const BLOCK_IO: &[c_long] = &[
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
];

/// Opening an RDMA device (rdma-core): `/dev/infiniband/uverbs*` and `rdma_cm` read-write,
/// `/sys/class/infiniband*` listed and read, the netlink socket bound; the device's event
/// descriptors; the identity and limits it checks first (`getuid` against `geteuid` before
/// reading its environment, RLIMIT_MEMLOCK before pinning memory; the KVM lab's Soft-RoCE
/// showed `getuid`).
const VERBS_OPEN: &[c_long] = &[
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_prlimit64,
    libc::SYS_getrlimit,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_access,
    libc::SYS_fstatfs,
    libc::SYS_readlinkat,
    libc::SYS_dup,
    libc::SYS_openat,
    libc::SYS_bind,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_pipe2,
    libc::SYS_uname,
];

/// Dropping a page's memory: `process_madvise` (batched MADV_DONTNEED on the guest view),
/// `fallocate` (punching a hole in the guest memfd).
const PAGE_DROP: &[c_long] = &[libc::SYS_process_madvise, libc::SYS_fallocate];

/// What neither the VMM nor the memory server ever does: debugging or writing other
/// processes, loading kernels or modules, mounting, changing identity or capabilities,
/// namespaces, BPF and perf, the kernel keyring, the clock and the host's name, swap, reboot.
const FORBIDDEN_IN_PROCESS: &[c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_capset,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_personality,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
    libc::SYS_uselib,
];

/// Adds `calls` with any arguments.
fn any(r: &mut Rules, calls: &[c_long]) {
    for &c in calls {
        r.insert(c, Vec::new());
    }
}

/// `openat` without write access, creation or truncation, and what reading a small file
/// needs (stat, seek, positioned reads, a directory's entries).
fn read_only_open(r: &mut Rules) -> BuildResult<()> {
    let writes = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
    r.insert(
        libc::SYS_openat,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(writes),
            0,
        )?])?],
    );
    any(
        r,
        &[
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_lseek,
            libc::SYS_pread64,
        ],
    );
    Ok(())
}

/// `clone` making a thread (CLONE_THREAD set), never a process.
fn threads_only() -> BuildResult<Vec<SeccompRule>> {
    let thread = libc::CLONE_THREAD as u64;
    Ok(vec![SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(thread),
        thread,
    )?])?])
}

/// A rule matching when the first argument is `value`.
fn arg0_is(value: u64) -> BuildResult<SeccompRule> {
    SeccompRule::new(vec![SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}
