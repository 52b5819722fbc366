//! Re-sealing one page under the client's current key (the middle step of a key rotation,
//! docs/sealing.md "Rotation"): the page is read through the normal read path (opened under
//! whichever key its seal names) and written back with the same version, which seals it under
//! the current key on every replica.

use farvm_pageio::{GuestPage, Version};

use crate::store::PageStore;
use crate::{ClientError, IoBuf, Op};

/// What re-sealing one page found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resealed {
    /// The page was read and written back under the current key.
    Written,
    /// No server holds the page (never written, or discarded): nothing to re-seal.
    Absent,
}

impl PageStore {
    /// Reads `page` (expected at `version`) and writes it back with that version, sealed under
    /// the client's current key. The caller makes sure no other write of `page` is in flight
    /// or issued until this returns (the engine's re-seal sweep runs on the thread that
    /// writes pages back): a write-back of newer content overtaken by this one would leave
    /// the older content on the servers. Blocks the calling thread for two round trips; not
    /// for the fault path.
    pub fn reseal(&self, page: GuestPage, version: Version) -> Result<Resealed, ClientError> {
        let client = self.client();
        let mut io = IoBuf::new(1);
        io.set_run(page, 1)?;
        io.set_versions(&[version])?;
        let read = client.submit_wait(Op::Read, self.ns, io);
        match read.result {
            Ok(_) if read.io.is_present(0) => {}
            // No copy holds the page (or none that opens): nothing to re-seal; the engine
            // finds the page lost when it next reads it.
            Ok(_) | Err(ClientError::Lost | ClientError::Reclaimed) => return Ok(Resealed::Absent),
            Err(e) => return Err(e),
        }
        let mut io = read.io;
        io.set_run(page, 1)?;
        io.set_versions(&[version])?;
        let written = client.submit_wait(Op::Write, self.ns, io);
        written.result?;
        Ok(Resealed::Written)
    }
}
