//! Guest RAM owned by the paging engine, as the VMM's memory layer sees it
//! ([`crate::memory::ExternalRam`]): KVM gets the engine's uffd-registered guest view; every
//! VMM read or write goes through the engine, which makes the pages resident, pins them for the
//! copy and copies through its private alias mapping.

use std::sync::Arc;

use farvm_ept::Engine;

use crate::memory::ExternalRam;

/// [`ExternalRam`] over a running [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineRam(pub Arc<Engine>);

impl ExternalRam for EngineRam {
    fn guest_view(&self) -> (u64, u64) {
        self.0.guest_ram()
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), String> {
        self.0.read_bytes(gpa, buf).map_err(|e| e.to_string())
    }

    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        self.0.write_bytes(gpa, data).map_err(|e| e.to_string())
    }
}
