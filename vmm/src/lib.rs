//! farvm-vmm: the farvm KVM virtual machine monitor as a library (the `farvm` binary, the
//! integration tests, the lab's benchmarks and an API server use it).
//!
//! Module map, laid out like Firecracker's:
//! - [`builder`]: one [`builder::VmConfig`] → a [`vm::Vm`] (RAM, KVM, boot, devices, remote
//!   memory) — the only way a VM is made.
//! - [`vm`]: the built VM's control surface (start, pause, resume, shutdown, state, counters,
//!   report) and the state its threads share.
//! - [`vstate`]: KVM-facing state — [`vstate::vm`] (VM fd, memslots), [`vstate::vcpu`] (vCPU
//!   setup, threads `vcpu0`… and exit handling), [`vstate::memory`] (guest RAM through
//!   vm-memory, local or paged by the engine).
//! - [`boot`] (test-guest ELF and Linux boot), [`devices`] (serial console, PV control
//!   device), [`layout`] (where RAM goes).
//! - [`remote`]: remote memory — the paging engine, its memory-server store, stage-2 injection.
//! - [`snapshot`]: saving a running VM into a snapshot directory and restoring it.
//! - [`control`] (the per-VM JSON control socket), [`metrics`] (Prometheus, via farvm-httpd),
//!   [`api`] (the Cloud-Hypervisor-compatible API server libvirt drives),
//!   [`process_stats`] (per-process paging statistics with guest process names).
//! - Small helpers: [`affinity`], [`builtin`], [`exit_code`], [`signals`],
//!   [`stats`], [`workload_spec`].

pub mod affinity;
pub mod api;
pub mod boot;
pub mod builder;
pub mod builtin;
pub mod control;
pub mod devices;
pub mod exit_code;
pub mod layout;
pub mod metrics;
pub mod migration;
pub mod process_stats;
pub mod remote;
pub mod signals;
pub mod snapshot;
pub mod spec;
pub mod stats;
pub mod vm;
pub mod vstate;
pub mod workload_spec;
