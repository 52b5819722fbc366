//! The engine's public error type: what [`crate::Engine`] calls return and what
//! [`crate::Engine::take_errors`] reports from its threads. Modules with failure modes of their
//! own keep their own enums ([`crate::config::ConfigError`], [`crate::store::StoreError`],
//! [`crate::stage2::PreFaultError`]) and are wrapped here.

use crate::config::ConfigError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("guest range {gpa:#x}+{len:#x} is outside guest RAM ({mem:#x} bytes)")]
    OutOfRange { gpa: u64, len: u64, mem: u64 },
    #[error("agent slot GPA {0:#x} is not 4 KiB aligned")]
    MisalignedSlot(u64),
    #[error("memory store {op} of guest page {gpa:#x} failed: {error}")]
    Store {
        op: &'static str,
        gpa: u64,
        error: StoreError,
    },
    #[error(
        "guest page {gpa:#x} was written back but the memory server no longer has it \
         (data lost on the server side)"
    )]
    PageLost { gpa: u64 },
    #[error("vCPU index {0} is out of range (max {max})", max = crate::vcpu::MAX_VCPUS - 1)]
    BadVcpu(u32),
    #[error("the paging engine has stopped")]
    Stopped,
    #[error("timed out after {0:?} waiting for guest page {1:#x} to become resident")]
    Timeout(std::time::Duration, u64),
}

impl EngineError {
    pub(crate) fn os(what: &'static str, source: std::io::Error) -> Self {
        Self::Os { what, source }
    }
}
