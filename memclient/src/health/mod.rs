//! Server health: taking a failed server out of service, the maintenance thread (free-space
//! refresh, stall reports, reconnecting to servers out of service), re-replication after a
//! failure ([`recovery`]) and putting a server that answers again back in service
//! ([`rejoin`]); and the replication-health counters ([`ClientStats`]).

mod missed;
mod recovery;
mod rejoin;
mod relocate;

pub use relocate::RelocateError;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::core::Core;

/// Counters about replication health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Servers taken out of service.
    pub dead_servers: u64,
    /// Reads retried on another replica.
    pub read_failovers: u64,
    /// Slabs copied onto a new replica.
    pub slabs_rereplicated: u64,
    /// Slabs currently with fewer than R live replicas.
    pub degraded_slabs: u64,
    /// Slabs whose every replica is out of service right now: their requests fail until a
    /// replica comes back.
    pub suspended_slabs: u64,
    /// Servers put back in service after answering again.
    pub rejoined_servers: u64,
    /// Slab replicas moved to another server (off a full or draining server).
    pub replicas_moved: u64,
    /// Replicas dropped from their slab because they missed a write another replica stored
    /// (their server failed or was out of service meanwhile); the slab is re-replicated.
    pub replicas_dropped: u64,
    /// Replicas dropped from their slab because a read from them returned a page older
    /// than its last write (rejected by the paging engine's fingerprint check).
    pub replicas_rejected: u64,
    /// Bytes of read pages (with their crc32c) the open connections copied through their
    /// receive buffer (bytes that had already arrived there with what came before them).
    pub read_bytes_copied: u64,
    /// Bytes of read pages received straight into their destination (no copy).
    pub read_bytes_in_place: u64,
}

/// What the maintenance thread is told.
pub(crate) enum Event {
    Dead(u16),
    /// A write to this slab found this server full.
    Full(crate::placement::SlabKey, u16),
    Stop,
}

/// Health state of the client.
pub(crate) struct Health {
    events: Sender<Event>,
    /// Set by `close`: connections going down are not server failures then.
    pub closing: AtomicBool,
    pub dead_servers: AtomicU64,
    pub read_failovers: AtomicU64,
    pub slabs_rereplicated: AtomicU64,
    pub rejoined_servers: AtomicU64,
    /// Replicas moved to another server (off a full or draining server).
    pub replicas_moved: AtomicU64,
    /// See [`ClientStats::replicas_dropped`].
    pub replicas_dropped: AtomicU64,
    /// See [`ClientStats::replicas_rejected`].
    pub replicas_rejected: AtomicU64,
    /// A one-shot injected fault (`ClientConfig::fault`) has not fired yet.
    pub fault_armed: AtomicBool,
    /// `Fault::StaleCopy` fired: this replica of this slab gets no writes (it stays stale).
    pub fault_deaf: std::sync::Mutex<Option<(crate::placement::SlabKey, u16)>>,
}

impl Health {
    /// The state, and the receiving end of its events for [`maintenance`].
    pub fn new() -> (Self, Receiver<Event>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            Self {
                events: tx,
                closing: AtomicBool::new(false),
                dead_servers: AtomicU64::new(0),
                read_failovers: AtomicU64::new(0),
                slabs_rereplicated: AtomicU64::new(0),
                rejoined_servers: AtomicU64::new(0),
                replicas_moved: AtomicU64::new(0),
                replicas_dropped: AtomicU64::new(0),
                replicas_rejected: AtomicU64::new(0),
                fault_armed: AtomicBool::new(true),
                fault_deaf: std::sync::Mutex::new(None),
            },
            rx,
        )
    }

    /// Asks the maintenance thread to stop.
    pub fn stop(&self) {
        let _ = self.events.send(Event::Stop);
    }
}

impl Core {
    pub fn mark_dead(&self, s: u16) {
        self.mark_dead_from(s, None);
    }

    /// Takes server `s` out of service. `generation`: the connection set that saw the failure
    /// (`None`: the current one); a failure seen by an older set is stale (the server has
    /// rejoined since) and ignored.
    pub fn mark_dead_from(&self, s: u16, generation: Option<u32>) {
        let Some(st) = self.servers.get(s) else {
            return;
        };
        if generation.is_some_and(|g| g != st.generation.load(Ordering::Acquire)) {
            return;
        }
        if self.health.closing.load(Ordering::Acquire) || st.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(server = %st.addr(), "memserver taken out of service");
        self.health.dead_servers.fetch_add(1, Ordering::Relaxed);
        self.servers.close_conns(s);
        let _ = self.health.events.send(Event::Dead(s));
    }

    /// A write to slab `key` found server `s` full: the maintenance thread moves that replica
    /// to a server with room (called from a completion path: only queues the event).
    pub fn report_full(&self, key: crate::placement::SlabKey, s: u16) {
        if let Some(st) = self.servers.get(s) {
            st.free_pages.store(0, Ordering::Relaxed);
        }
        let _ = self.health.events.send(Event::Full(key, s));
    }

    /// Closes every connection; their failures are not taken as server failures.
    pub fn close_all(&self) {
        self.health.closing.store(true, Ordering::Release);
        for s in 0..self.servers.len() {
            self.servers.close_conns(s as u16);
        }
    }

    /// Logs every connection with a request unanswered for 5 s (or half the timeout).
    fn report_stalls(&self) {
        let stale = (self.cfg.timeout / 2).min(Duration::from_secs(5));
        for (s, st) in self.servers.iter().enumerate() {
            if self.servers.is_dead(s as u16) {
                continue;
            }
            for (k, c) in self.servers.conns(s as u16).iter().enumerate() {
                if let Some(r) = c.stall_report(stale) {
                    tracing::warn!(server = %st.addr(), connection = k, "stalled: {r}");
                }
            }
        }
    }

    /// Refreshes server `s`'s free capacity and checks it did not restart under us.
    pub fn refresh_free(&self, s: u16) {
        if self.servers.is_dead(s) {
            return;
        }
        if let Ok(st) = self.blocking_stat(s, 0, None) {
            let free = st.capacity_pages.saturating_sub(st.used_pages);
            let Some(server) = self.servers.get(s) else {
                return;
            };
            server.free_pages.store(free, Ordering::Relaxed);
            let known = server.instance.swap(st.instance, Ordering::AcqRel);
            if known != 0 && known != st.instance {
                // Restarted between two of our requests without us seeing a connection drop
                // (it cannot keep a TCP connection across a restart, but be sure): the
                // rejoin path sorts out what it lost.
                server.instance.store(known, Ordering::Release);
                tracing::error!(server = %server.addr(), "memserver restarted under us");
                self.mark_dead(s);
            }
        }
    }

    /// Replication health right now.
    pub fn stats(&self) -> ClientStats {
        let (mut degraded, mut suspended) = (0, 0);
        for m in self.placements.read_all() {
            for p in m.values() {
                let live = p
                    .servers()
                    .iter()
                    .filter(|&&s| !self.servers.is_dead(s))
                    .count();
                if live < self.r || p.filling != 0 {
                    degraded += 1;
                }
                if self.live_source(p, None).is_none() {
                    suspended += 1;
                }
            }
        }
        let (mut copied, mut in_place) = (0, 0);
        for s in 0..self.servers.len() as u16 {
            for c in self.servers.conns(s).iter() {
                let (a, b) = c.landed();
                copied += a;
                in_place += b;
            }
        }
        let h = &self.health;
        ClientStats {
            dead_servers: h.dead_servers.load(Ordering::Relaxed),
            read_failovers: h.read_failovers.load(Ordering::Relaxed),
            slabs_rereplicated: h.slabs_rereplicated.load(Ordering::Relaxed),
            degraded_slabs: degraded,
            suspended_slabs: suspended,
            rejoined_servers: h.rejoined_servers.load(Ordering::Relaxed),
            replicas_moved: h.replicas_moved.load(Ordering::Relaxed),
            replicas_dropped: h.replicas_dropped.load(Ordering::Relaxed),
            replicas_rejected: h.replicas_rejected.load(Ordering::Relaxed),
            read_bytes_copied: copied,
            read_bytes_in_place: in_place,
        }
    }
}

/// The maintenance thread: handles servers taken out of service, and every second refreshes
/// free capacity, reports stalls, tries to bring servers out of service back and
/// re-replicates slabs left with fewer than R replicas (a replica dropped for a missed
/// write, a copy that stopped), then discards the copies such dropped replicas left on
/// servers in service.
pub(crate) fn maintenance(core: Weak<Core>, rx: Receiver<Event>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Event::Stop) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Ok(Event::Dead(s)) => {
                let Some(c) = core.upgrade() else { return };
                c.handle_dead(s);
            }
            Ok(Event::Full(key, s)) => {
                let Some(c) = core.upgrade() else { return };
                c.relocate_full(key, s);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                let Some(c) = core.upgrade() else { return };
                for s in 0..c.servers.len() {
                    c.refresh_free(s as u16);
                }
                c.report_stalls();
                for s in 0..c.servers.len() as u16 {
                    if c.servers.is_dead(s) && !c.health.closing.load(Ordering::Acquire) {
                        c.try_rejoin(s);
                    }
                }
                if !c.health.closing.load(Ordering::Acquire) {
                    c.rereplicate_degraded();
                    c.scrub_left_behind_in_service();
                }
            }
        }
    }
}
