//! A working copy of every live server's load, updated as a plan places replicas, and the rule
//! for which servers take new slabs.

use std::collections::BTreeMap;

use crate::ids::{RackId, ServerId};
use crate::record::ServerHealth;
use crate::view::PoolView;

/// One server in the ledger.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub id: ServerId,
    pub rack: RackId,
    /// Whether its rack is declared in the pool (servers of other racks take no slab).
    pub declared: bool,
    pub capacity: u64,
    /// max(stored bytes, reserved bytes), plus what this plan added.
    pub load: u64,
    pub health: ServerHealth,
    pub wire_version: u8,
}

impl Entry {
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.load)
    }
}

/// Loads of the view's live servers, in id order.
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    pub entries: Vec<Entry>,
    index: BTreeMap<ServerId, usize>,
    min_wire_version: u8,
}

impl Ledger {
    pub fn new(view: &PoolView, min_wire_version: u8) -> Self {
        let committed = view.committed_by_server();
        let entries: Vec<Entry> = view
            .servers
            .values()
            .map(|s| Entry {
                id: s.id.clone(),
                rack: s.rack.clone(),
                declared: view.rack_declared(&s.rack),
                capacity: s.capacity_bytes,
                load: s.used_bytes.max(committed.get(&s.id).copied().unwrap_or(0)),
                health: s.health,
                wire_version: s.wire_version,
            })
            .collect();
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.clone(), i))
            .collect();
        Self {
            entries,
            index,
            min_wire_version,
        }
    }

    pub fn get(&self, id: &ServerId) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// Whether entry `i` takes new slabs at all (room is checked separately).
    pub fn takes_new(&self, i: usize) -> bool {
        let e = &self.entries[i];
        e.health == ServerHealth::Up && e.declared && e.wire_version >= self.min_wire_version
    }

    /// Why entry `i` cannot take a `bytes` slab, or None if it can.
    pub fn refusal(&self, i: usize, bytes: u64) -> Option<String> {
        let e = &self.entries[i];
        if e.health != ServerHealth::Up {
            Some(format!("{} {}", e.id, e.health.as_str()))
        } else if !e.declared {
            Some(format!("{} is in undeclared rack {}", e.id, e.rack))
        } else if e.wire_version < self.min_wire_version {
            Some(format!(
                "{} speaks wire version {} < {}",
                e.id, e.wire_version, self.min_wire_version
            ))
        } else if e.free() < bytes {
            Some(format!("{} full", e.id))
        } else {
            None
        }
    }

    /// The rack of a server, if it is live.
    pub fn rack_of(&self, id: &ServerId) -> Option<&RackId> {
        self.get(id).map(|i| &self.entries[i].rack)
    }

    /// The live server with the most free bytes that can take a `bytes` slab, is not in
    /// `skip` and whose rack is not in `busy_racks`.
    pub fn best_target(
        &self,
        bytes: u64,
        skip: &[ServerId],
        busy_racks: &[&RackId],
    ) -> Option<usize> {
        (0..self.entries.len())
            .filter(|&i| {
                let e = &self.entries[i];
                self.takes_new(i)
                    && e.free() >= bytes
                    && !skip.contains(&e.id)
                    && !busy_racks.contains(&&e.rack)
            })
            .max_by(|&a, &b| {
                let (ea, eb) = (&self.entries[a], &self.entries[b]);
                ea.free().cmp(&eb.free()).then(eb.id.cmp(&ea.id))
            })
    }
}
