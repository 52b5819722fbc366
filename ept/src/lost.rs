//! Lost pages: what happens when something needs a page whose data the memory servers lost
//! (state `LOST`). Owns the VMM's handler ([`crate::Engine::on_page_lost`]); every access is
//! counted and reported to it, or logged without one.

use std::sync::{Arc, OnceLock};

use crate::installer::Installer;
use crate::stats::{Counter, Counters};
use crate::PAGE_SIZE;

/// What the engine does with vCPUs blocked on a lost page, as decided by the VMM's
/// [`crate::Engine::on_page_lost`] handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostPage {
    /// Keep them blocked in the fault.
    Hold,
    /// The VM is stopping and every vCPU has been kicked: map a page of zeros and wake them so
    /// their threads can return from KVM_RUN. Only safe when the guest cannot run again.
    Release,
}

type Handler = Box<dyn Fn(u64) -> LostPage + Send + Sync>;

pub(crate) struct LostPages {
    handler: OnceLock<Handler>,
    installer: Arc<Installer>,
    counters: Arc<Counters>,
}

impl LostPages {
    pub fn new(installer: Arc<Installer>, counters: Arc<Counters>) -> Self {
        Self {
            handler: OnceLock::new(),
            installer,
            counters,
        }
    }

    /// Sets the VMM's handler; false if one was set already.
    pub fn set_handler(&self, f: Handler) -> bool {
        self.handler.set(f).is_ok()
    }

    /// Something needs page `p`, whose data is lost: counted, and reported to the VMM's
    /// handler (which stops the VM) or, without one, logged.
    ///
    /// On [`LostPage::Release`], vCPUs blocked on `p` are let out of the fault so their threads
    /// can return from KVM_RUN once the VM is stopping: a page of zeros is mapped at `p` and
    /// they are woken. The page stays `LOST` (VMM accesses fail, nothing is written back). The
    /// guest never runs on those zeros: the VMM kicked its vCPUs before saying `Release`, and
    /// KVM checks for the pending signal before entering the guest again. (Without this, the
    /// shadow-MMU fault path here retries the fault forever and KVM_RUN never returns.)
    pub fn accessed(&self, p: u64) {
        self.counters.inc(Counter::LostAccesses);
        let gpa = p * PAGE_SIZE as u64;
        let action = match self.handler.get() {
            Some(f) => f(gpa),
            None => {
                tracing::error!(
                    "guest page {gpa:#x} is needed but its data is lost; nothing can serve it"
                );
                LostPage::Hold
            }
        };
        if action == LostPage::Release {
            self.installer.release_lost(p);
        }
    }
}
