//! Thread classes: which farvm threads run under which filter, and each class's name in the
//! SIGSYS message and the docs (docs/security.md).

/// A kind of thread, each with its own seccomp filter ([`crate::syscalls`] lists the calls).
///
/// A thread enters its class with [`crate::enter`] first thing; filters stack, so a thread's
/// calls must pass its process's filter too, and a thread spawned afterwards inherits the
/// filter of the thread that spawned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ThreadClass {
    /// The VMM process (`farvm run`, `farvm api`, `cloud-hypervisor`): installed on the main
    /// thread before any other thread exists, so every thread runs under it. The main, API
    /// and control threads run under it alone: they build VMs, write snapshots and start the
    /// local memory server, so it forbids only what farvm never does.
    Vmm = 0,
    /// A vCPU thread (`vcpuN`): `KVM_RUN`, exits, the devices it emulates inline.
    Vcpu,
    /// The paging engine's fault handler (`ept-fault`): userfaultfd events and demand reads.
    FaultHandler,
    /// The paging engine's evictor (`ept-evict`): write-back and dropping pages.
    Evictor,
    /// The memory-server client's threads (`memclient-tx-S`, `memclient-rx-S`,
    /// `memclient-rdma-S`, `memclient-maint`): sockets (or verbs) to the memory servers.
    StoreConnection,
    /// Device back-end threads (the serial console's input, virtio-net's receive side).
    Device,
    /// A metrics endpoint's HTTP thread (`metrics`, `memserver-metrics`).
    Metrics,
    /// The memory-server process (`farvm-memserver`): installed on its main thread before any
    /// other thread exists; accept threads, pool membership and etcd run under it alone.
    MemServer,
    /// A memory server's connection thread (`memserver-conn-N`).
    MemServerConnection,
}

impl ThreadClass {
    /// Every class, in declaration order (`ALL[c as usize] == c`).
    pub const ALL: [ThreadClass; 9] = [
        ThreadClass::Vmm,
        ThreadClass::Vcpu,
        ThreadClass::FaultHandler,
        ThreadClass::Evictor,
        ThreadClass::StoreConnection,
        ThreadClass::Device,
        ThreadClass::Metrics,
        ThreadClass::MemServer,
        ThreadClass::MemServerConnection,
    ];

    /// The class's name in messages and the docs.
    pub fn name(self) -> &'static str {
        match self {
            ThreadClass::Vmm => "vmm",
            ThreadClass::Vcpu => "vcpu",
            ThreadClass::FaultHandler => "fault-handler",
            ThreadClass::Evictor => "evictor",
            ThreadClass::StoreConnection => "store-connection",
            ThreadClass::Device => "device",
            ThreadClass::Metrics => "metrics",
            ThreadClass::MemServer => "memserver",
            ThreadClass::MemServerConnection => "memserver-connection",
        }
    }

    /// The class named `name` ([`ThreadClass::name`]).
    pub fn from_name(name: &str) -> Option<ThreadClass> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether this class is a process's filter (installed by [`crate::start`], a list of
    /// forbidden calls) rather than a thread's (installed by [`crate::enter`], a list of the
    /// calls it needs).
    pub fn is_process(self) -> bool {
        matches!(self, ThreadClass::Vmm | ThreadClass::MemServer)
    }
}
