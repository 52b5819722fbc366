//! The interrupt seam: devices raise an edge on a guest interrupt line (a GSI of the in-kernel
//! IOAPIC) through [`InterruptController`]; the VMM implements it with KVM irqfds
//! ([`EventFdInterrupts`] owns one eventfd per line, ready for `KVM_IRQFD`) or with
//! `KVM_IRQ_LINE`. Every device interrupt here is edge-triggered, active-high.

use std::collections::BTreeMap;
use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Why an interrupt could not be raised.
#[derive(Debug, thiserror::Error)]
pub enum InterruptError {
    /// No line with this number was set up.
    #[error("interrupt line {gsi} is not connected")]
    NotConnected {
        /// The line.
        gsi: u32,
    },
    /// The host mechanism (eventfd write, ioctl) failed.
    #[error("raising interrupt line {gsi}: {source}")]
    Host {
        /// The line.
        gsi: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Raises edges on guest interrupt lines (GSIs). Called from vCPU threads and device worker
/// threads, so implementations are `Send + Sync` and must not block for long.
pub trait InterruptController: Send + Sync {
    /// Raises one edge on line `gsi`.
    fn trigger(&self, gsi: u32) -> Result<(), InterruptError>;
}

/// One device's interrupt line: a controller and a line number.
#[derive(Clone)]
pub struct IrqLine {
    controller: Arc<dyn InterruptController>,
    gsi: u32,
}

impl IrqLine {
    /// The line `gsi` of `controller`.
    pub fn new(controller: Arc<dyn InterruptController>, gsi: u32) -> Self {
        IrqLine { controller, gsi }
    }

    /// The line number.
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// Raises one edge on this line.
    pub fn trigger(&self) -> Result<(), InterruptError> {
        self.controller.trigger(self.gsi)
    }
}

impl fmt::Debug for IrqLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IrqLine").field("gsi", &self.gsi).finish()
    }
}

impl vm_superio::Trigger for IrqLine {
    type E = InterruptError;
    fn trigger(&self) -> Result<(), InterruptError> {
        IrqLine::trigger(self)
    }
}

/// An [`InterruptController`] with one eventfd per line. The VMM registers each with
/// `VmFd::register_irqfd(fd, gsi)`; a trigger is then one `write(2)` and KVM injects the edge
/// into the in-kernel IOAPIC without a VM exit.
pub struct EventFdInterrupts {
    lines: BTreeMap<u32, EventFd>,
}

impl EventFdInterrupts {
    /// Creates a non-blocking eventfd for each line in `gsis` (duplicates are ignored).
    pub fn new(gsis: &[u32]) -> std::io::Result<Self> {
        let mut lines = BTreeMap::new();
        for &gsi in gsis {
            if let std::collections::btree_map::Entry::Vacant(e) = lines.entry(gsi) {
                e.insert(EventFd::new(EFD_NONBLOCK)?);
            }
        }
        Ok(EventFdInterrupts { lines })
    }

    /// The eventfd of line `gsi`, for `KVM_IRQFD`.
    pub fn eventfd(&self, gsi: u32) -> Option<&EventFd> {
        self.lines.get(&gsi)
    }

    /// `(gsi, eventfd)` for every line, in line order.
    pub fn lines(&self) -> impl Iterator<Item = (u32, &EventFd)> {
        self.lines.iter().map(|(gsi, fd)| (*gsi, fd))
    }
}

impl fmt::Debug for EventFdInterrupts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.lines.iter().map(|(g, fd)| (g, fd.as_raw_fd())))
            .finish()
    }
}

impl InterruptController for EventFdInterrupts {
    fn trigger(&self, gsi: u32) -> Result<(), InterruptError> {
        let fd = self
            .lines
            .get(&gsi)
            .ok_or(InterruptError::NotConnected { gsi })?;
        fd.write(1)
            .map_err(|source| InterruptError::Host { gsi, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_lines_count_edges_per_line() {
        let irqs = Arc::new(EventFdInterrupts::new(&[4, 5, 5]).unwrap());
        assert_eq!(irqs.lines().map(|(g, _)| g).collect::<Vec<_>>(), [4, 5]);
        let com1 = IrqLine::new(irqs.clone(), 4);
        com1.trigger().unwrap();
        com1.trigger().unwrap();
        assert_eq!(irqs.eventfd(4).unwrap().read().unwrap(), 2);
        // Line 5 saw nothing: a non-blocking read reports EAGAIN.
        assert!(irqs.eventfd(5).unwrap().read().is_err());
    }

    #[test]
    fn unknown_line_is_an_error() {
        let irqs = Arc::new(EventFdInterrupts::new(&[4]).unwrap());
        let err = IrqLine::new(irqs, 9).trigger().unwrap_err();
        assert!(
            matches!(err, InterruptError::NotConnected { gsi: 9 }),
            "{err}"
        );
    }
}
