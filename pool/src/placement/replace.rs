//! Moving replicas off a server: one at a time ([`replace_replica`]), off dead and overfull
//! servers ([`repair_plan`]) and off a server being drained ([`drain_plan`]).

use serde::{Deserialize, Serialize};

use super::ledger::Ledger;
use super::{Move, PlacementError};
use crate::ids::{RackId, ServerId};
use crate::record::{ServerHealth, SlabRecord};
use crate::units::fmt_bytes;
use crate::view::{PoolView, SlabRef};

/// A replica that cannot move, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unmovable {
    /// The slab.
    pub slab: SlabRef,
    /// The server it should leave.
    pub from: ServerId,
    /// Why no server can take it.
    pub reason: String,
}

/// Moves that take replicas off servers, and the replicas no server can take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainPlan {
    /// Moves, to be committed in order.
    pub moves: Vec<Move>,
    /// Replicas left where they are.
    pub unmovable: Vec<Unmovable>,
}

impl DrainPlan {
    /// Whether every replica found a new server.
    pub fn is_complete(&self) -> bool {
        self.unmovable.is_empty()
    }
}

/// Picks a new server for the replica of `slab` (currently `replicas`) on `from`, records the
/// move in `ledger` and `replicas`, and returns it.
fn move_replica(
    ledger: &mut Ledger,
    slab: SlabRef,
    bytes: u64,
    replicas: &mut [ServerId],
    from: &ServerId,
) -> Result<Move, PlacementError> {
    let busy: Vec<&RackId> = replicas
        .iter()
        .filter(|s| *s != from)
        .filter_map(|s| ledger.rack_of(s))
        .collect();
    let Some(to) = ledger.best_target(bytes, replicas, &busy) else {
        let mut why: Vec<String> = Vec::new();
        for (i, e) in ledger.entries.iter().enumerate() {
            if e.id == *from {
                continue;
            }
            if replicas.contains(&e.id) {
                why.push(format!("{} holds a replica already", e.id));
                continue;
            }
            if busy.contains(&&e.rack) {
                why.push(format!("{} shares rack {} with a replica", e.id, e.rack));
            } else if let Some(r) = ledger.refusal(i, bytes) {
                why.push(r);
            }
        }
        let reason = if why.is_empty() {
            "no other live server".to_owned()
        } else {
            why.join(", ")
        };
        return Err(PlacementError::NoTarget {
            slab,
            from: from.clone(),
            bytes,
            reason,
        });
    };
    let to_id = ledger.entries[to].id.clone();
    ledger.entries[to].load += bytes;
    if let Some(f) = ledger.get(from) {
        ledger.entries[f].load = ledger.entries[f].load.saturating_sub(bytes);
    }
    for r in replicas.iter_mut() {
        if r == from {
            *r = to_id.clone();
        }
    }
    Ok(Move {
        slab,
        from: from.clone(),
        to: to_id,
        bytes,
    })
}

/// A new server for the replica of `slab` on `from` (a server that is full, draining or
/// gone): an `up` server with room for the slab, in a rack holding none of its other
/// replicas, the one with the most free bytes.
pub fn replace_replica(
    view: &PoolView,
    slab: SlabRef,
    from: &ServerId,
    min_wire_version: u8,
) -> Result<Move, PlacementError> {
    let rec = view
        .slabs
        .get(&slab)
        .ok_or(PlacementError::UnknownSlab(slab))?;
    if !rec.replicas.contains(from) {
        return Err(PlacementError::NotAReplica {
            slab,
            server: from.clone(),
        });
    }
    let mut ledger = Ledger::new(view, min_wire_version);
    let mut replicas = rec.replicas.clone();
    move_replica(&mut ledger, slab, rec.bytes, &mut replicas, from)
}

fn plan_moves<'a>(
    ledger: &mut Ledger,
    work: impl IntoIterator<Item = (SlabRef, &'a SlabRecord, ServerId)>,
    current: &mut std::collections::BTreeMap<SlabRef, Vec<ServerId>>,
) -> DrainPlan {
    let mut plan = DrainPlan::default();
    for (slab, rec, from) in work {
        let replicas = current.entry(slab).or_insert_with(|| rec.replicas.clone());
        match move_replica(ledger, slab, rec.bytes, replicas, &from) {
            Ok(m) => plan.moves.push(m),
            Err(e) => plan.unmovable.push(Unmovable {
                slab,
                from,
                reason: match e {
                    PlacementError::NoTarget { reason, .. } => reason,
                    other => other.to_string(),
                },
            }),
        }
    }
    plan
}

/// Moves every replica off server `server` (which takes no new slabs meanwhile), keeping each
/// slab's replicas on distinct racks. Replicas no server can take are listed as unmovable.
/// Slabs of VMs whose record is gone are left to the garbage collector (here and in every
/// plan): their reservations still count as load until they are discarded.
pub fn drain_plan(
    view: &PoolView,
    server: &ServerId,
    min_wire_version: u8,
) -> Result<DrainPlan, PlacementError> {
    let mut ledger = Ledger::new(view, min_wire_version);
    let i = ledger
        .get(server)
        .ok_or_else(|| PlacementError::UnknownServer(server.clone()))?;
    ledger.entries[i].health = ServerHealth::Draining;
    let work = view
        .slabs
        .iter()
        .filter(|(s, r)| view.vms.contains_key(&s.vm) && r.replicas.contains(server))
        .map(|(s, r)| (*s, r, server.clone()));
    Ok(plan_moves(&mut ledger, work, &mut Default::default()))
}

/// Re-places every replica on a server that is gone from the pool (its lease expired), then
/// enough replicas off each overfull server (load above capacity) to bring it back under.
pub fn repair_plan(view: &PoolView, min_wire_version: u8) -> DrainPlan {
    let mut ledger = Ledger::new(view, min_wire_version);
    let mut current = Default::default();
    let live = view
        .slabs
        .iter()
        .filter(|(s, _)| view.vms.contains_key(&s.vm));
    let dead = live.clone().flat_map(|(s, r)| {
        r.replicas
            .iter()
            .filter(|id| !view.servers.contains_key(*id))
            .map(move |id| (*s, r, id.clone()))
    });
    let mut plan = plan_moves(&mut ledger, dead.collect::<Vec<_>>(), &mut current);

    let overfull: Vec<(ServerId, u64)> = ledger
        .entries
        .iter()
        .filter(|e| e.load > e.capacity)
        .map(|e| (e.id.clone(), e.load - e.capacity))
        .collect();
    for (server, mut over) in overfull {
        for (slab, rec) in live.clone() {
            if over == 0 {
                break;
            }
            let holds = current.get(slab).unwrap_or(&rec.replicas).contains(&server);
            if !holds {
                continue;
            }
            let part = plan_moves(&mut ledger, [(*slab, rec, server.clone())], &mut current);
            if !part.moves.is_empty() {
                over = over.saturating_sub(rec.bytes);
            }
            plan.moves.extend(part.moves);
            plan.unmovable.extend(part.unmovable);
        }
        if over > 0 {
            tracing::debug!(%server, over = %fmt_bytes(over), "overfull server stays overfull");
        }
    }
    plan
}
