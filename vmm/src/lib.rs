//! farvm-vmm: the farvm KVM virtual machine monitor as a library (the `farvm` binary and the
//! integration tests use it).
//!
//! Module map: [`memory`] (guest RAM and the single access layer), [`layout`] (where RAM goes),
//! [`kvm`] (VM/vCPU setup), [`boot`] (test-guest ELF and Linux boot), [`devices`] (serial and
//! the PV control device), [`vm`] (vCPU threads, exits, stop), [`control`] (the per-VM Unix
//! socket), [`workload_spec`] (the `--workload` syntax), [`signals`], [`stats`], [`size`].

pub mod affinity;
pub mod boot;
pub mod builtin;
pub mod control;
pub mod devices;
pub mod exit_code;
pub mod kvm;
pub mod layout;
pub mod memory;
pub mod metrics;
pub mod remote;
pub mod signals;
pub mod size;
pub mod stats;
pub mod vm;
pub mod workload_spec;
