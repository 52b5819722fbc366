//! The fields of a [`super::VmSpec`] a problem can be about, the error that names one, and how
//! each front door spells a field: a problem is found once, in the spec, and reported in the
//! caller's own terms (`--vcpus`, `<vcpu> (line 4)`, `cpus.boot_vcpus`).

use std::fmt;

/// A field of the VM description, as far as an error needs to name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// The VM's name.
    Name,
    /// Guest RAM size.
    Memory,
    /// vCPU count.
    Vcpus,
    /// The kernel to boot (a file, or the built-in test guest).
    Kernel,
    /// Linux's initial ramdisk.
    Initrd,
    /// The kernel command line.
    Cmdline,
    /// The test guest's workloads.
    Workloads,
    /// Disks.
    Disks,
    /// Network interfaces.
    Nets,
    /// The local-memory budget.
    LocalMemory,
    /// The prefetcher.
    Prefetcher,
    /// Where remote pages live: memory servers, a pool, or the embedded server.
    Servers,
    /// The pool's slab size.
    PoolSlab,
    /// The host CPU of the fault path.
    FaultPathCpu,
    /// The Prometheus endpoint.
    Metrics,
}

impl Field {
    /// A plain name, for a caller with no terms of its own (and for `Display`).
    pub fn plain(self) -> &'static str {
        match self {
            Field::Name => "name",
            Field::Memory => "memory",
            Field::Vcpus => "vcpus",
            Field::Kernel => "kernel",
            Field::Initrd => "initrd",
            Field::Cmdline => "cmdline",
            Field::Workloads => "workloads",
            Field::Disks => "disks",
            Field::Nets => "network interfaces",
            Field::LocalMemory => "local memory",
            Field::Prefetcher => "prefetcher",
            Field::Servers => "memory servers",
            Field::PoolSlab => "pool slab",
            Field::FaultPathCpu => "fault-path CPU",
            Field::Metrics => "metrics",
        }
    }
}

/// What kind of problem, which decides `farvm run`'s exit status (64, 65, 66) and the API's
/// answer (400, or 500 for a host failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecErrorKind {
    /// The description is inconsistent or out of range.
    Invalid,
    /// A file it names cannot be read.
    Unreadable,
    /// The kernel is not a kernel, or does not fit.
    BadKernel,
}

/// A problem with one field of a VM description.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", field.plain())]
pub struct SpecError {
    /// The field the problem is about.
    pub field: Field,
    /// Its kind.
    pub kind: SpecErrorKind,
    /// What is wrong, without the field's name (the front door puts its own before it).
    pub problem: String,
}

impl SpecError {
    /// An [`SpecErrorKind::Invalid`] problem with `field`.
    pub fn invalid(field: Field, problem: impl Into<String>) -> Self {
        Self {
            field,
            kind: SpecErrorKind::Invalid,
            problem: problem.into(),
        }
    }

    /// An [`SpecErrorKind::Unreadable`] problem with `field`.
    pub fn unreadable(field: Field, problem: impl Into<String>) -> Self {
        Self {
            field,
            kind: SpecErrorKind::Unreadable,
            problem: problem.into(),
        }
    }

    /// An [`SpecErrorKind::BadKernel`] problem with `field`.
    pub fn bad_kernel(field: Field, problem: impl Into<String>) -> Self {
        Self {
            field,
            kind: SpecErrorKind::BadKernel,
            problem: problem.into(),
        }
    }

    /// The message with the field named by `names`.
    pub fn render(&self, names: &dyn FieldNames) -> String {
        format!("{}: {}", names.name(self.field), self.problem)
    }
}

/// How one front door names the fields of a VM description.
pub trait FieldNames {
    /// `field` in this front door's terms.
    fn name(&self, field: Field) -> String;
}

/// `farvm run`'s flags.
pub struct CliNames;

impl FieldNames for CliNames {
    fn name(&self, field: Field) -> String {
        match field {
            Field::Name => "--name",
            Field::Memory => "--memory",
            Field::Vcpus => "--vcpus",
            Field::Kernel => "--kernel",
            Field::Initrd => "--initrd",
            Field::Cmdline => "--cmdline",
            Field::Workloads => "--workload",
            Field::Disks => "--disk",
            Field::Nets => "--net",
            Field::LocalMemory => "--local-memory",
            Field::Prefetcher => "--prefetcher",
            Field::Servers => "--memserver/--pool",
            Field::PoolSlab => "--pool-slab",
            Field::FaultPathCpu => "--fault-path-cpu",
            Field::Metrics => "--metrics",
        }
        .to_string()
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.plain())
    }
}
