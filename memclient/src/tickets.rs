//! Preallocated request tickets: the state of one request across its replicas, and where its
//! result goes.
//!
//! The table is allocated once; a lock-free queue hands out free ticket numbers, and each
//! ticket has its own mutex, so the request path takes no global lock and allocates nothing.

use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;
use farvm_memproto::StatInfo;

use crate::{ClientError, Finished, FinishedSink, IoBuf, Priority};

/// Most replicas per slab.
pub const MAX_REPLICAS: usize = 4;

/// What a ticket asks of the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TicketOp {
    Read,
    Write,
    Discard,
    Stat,
}

/// Where a finished ticket's result goes.
pub(crate) enum Reply {
    /// Nothing attached yet.
    None,
    /// A completion channel (the caller's, or a blocking call's).
    Channel(Sender<Finished>),
    /// A sink called on the thread that finishes the request (the page store).
    Sink(Arc<dyn FinishedSink>),
    /// An internal blocking waiter (stat, re-replication).
    Internal(Sender<InternalDone>),
}

/// Result handed to an internal waiter.
pub(crate) struct InternalDone {
    pub result: Result<u32, ClientError>,
    pub stat: StatInfo,
    pub io: Option<IoBuf>,
}

pub(crate) struct Ticket {
    /// Set from submission until the result is delivered.
    pub active: bool,
    /// Bumped every time the ticket finishes (lets recovery wait for older requests).
    pub seq: u64,
    pub op: TicketOp,
    pub ns: u64,
    pub prio: Priority,
    pub user_data: u64,
    pub io: Option<IoBuf>,
    pub reply: Reply,
    pub replicas: [u16; MAX_REPLICAS],
    pub nrep: u8,
    /// Reads: index in `replicas` of the current attempt.
    pub attempt: u8,
    /// Writes/discards: completions still expected (plus one submission guard).
    pub pending: u8,
    pub acked: u8,
    /// Writes/discards: bit i set when `replicas[i]` did not store it (a server failure, or
    /// out of service): that replica lacks this write (see `health::missed`).
    pub missed: u8,
    pub err: Option<ClientError>,
    pub count: u32,
    /// Writes/discards to a slab being re-replicated: counted in its fill's in-flight writes.
    pub in_fill: bool,
    /// With `in_fill`: the id of that copy (`fills::FillState::id`).
    pub fill_id: u64,
    pub stat: StatInfo,
    pub slab: u64,
    /// Reads: the slab's placement is `lost` (an absent page is a lost one).
    pub lost_slab: bool,
}

impl Ticket {
    fn empty() -> Self {
        Self {
            active: false,
            seq: 0,
            op: TicketOp::Read,
            ns: 0,
            prio: Priority::Demand,
            user_data: 0,
            io: None,
            reply: Reply::None,
            replicas: [0; MAX_REPLICAS],
            nrep: 0,
            attempt: 0,
            pending: 0,
            acked: 0,
            missed: 0,
            err: None,
            count: 0,
            in_fill: false,
            fill_id: 0,
            stat: StatInfo::default(),
            slab: 0,
            lost_slab: false,
        }
    }

    /// Records that replica server `s` of this write/discard did not store it.
    pub fn mark_missed(&mut self, s: u16) {
        if let Some(i) = self.replicas[..self.nrep as usize]
            .iter()
            .position(|&x| x == s)
        {
            self.missed |= 1 << i;
        }
    }

    /// The replica servers that did not store this write/discard, into `out`; how many.
    pub fn missed_servers(&self, out: &mut [u16; MAX_REPLICAS]) -> usize {
        let mut n = 0;
        for i in 0..self.nrep as usize {
            if self.missed & (1 << i) != 0 {
                out[n] = self.replicas[i];
                n += 1;
            }
        }
        n
    }

    pub fn reset(&mut self) {
        let seq = self.seq;
        *self = Self::empty();
        self.seq = seq;
    }
}

pub(crate) struct Tickets {
    pub slots: Box<[Mutex<Ticket>]>,
    free: ArrayQueue<u32>,
}

impl Tickets {
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let free = ArrayQueue::new(n);
        for i in 0..n as u32 {
            let _ = free.push(i);
        }
        Self {
            slots: (0..n).map(|_| Mutex::new(Ticket::empty())).collect(),
            free,
        }
    }

    pub fn alloc(&self) -> Option<u32> {
        self.free.pop()
    }

    pub fn release(&self, t: u32) {
        // Cannot overflow: each number is pushed back exactly once per alloc.
        let _ = self.free.push(t);
    }

    pub fn lock(&self, t: u32) -> MutexGuard<'_, Ticket> {
        self.slots[t as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// Hands a finished request to where its reply goes; `server` answered a read's pages
/// (`u16::MAX`: none, or not a read).
pub(crate) fn deliver(
    reply: Reply,
    user_data: u64,
    io: IoBuf,
    result: Result<u32, ClientError>,
    server: u16,
) {
    match reply {
        // The caller owns the receiver; if it dropped it, it no longer wants the result.
        Reply::Channel(tx) => {
            let _ = tx.send(Finished {
                user_data,
                io,
                result,
                server,
            });
        }
        Reply::Sink(sink) => sink.finished(Finished {
            user_data,
            io,
            result,
            server,
        }),
        Reply::Internal(tx) => {
            let _ = tx.send(InternalDone {
                result,
                stat: StatInfo::default(),
                io: Some(io),
            });
        }
        Reply::None => {}
    }
}
