//! Rebalancing: even out load relative to capacity across the servers that take new slabs,
//! with few moves.

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::Ledger;
use super::Move;
use crate::ids::{RackId, ServerId};
use crate::view::{PoolView, SlabRef};

/// Moves that bring every `up` server's load close to its fair share,
/// `capacity × (total load / total capacity)` over those servers.
///
/// A replica of `b` bytes moves from a server more than `b/2` above its share to one that stays
/// within `b/2` of its share after taking it, keeping the slab's replicas on distinct racks;
/// each move lowers the total distance from the fair shares. A server either gives or receives,
/// never both, so no replica moves twice and no move undoes another. Draining, degraded and
/// dead servers take no part (see `drain_plan` and `repair_plan`), nor do slabs of VMs whose
/// record is gone (the garbage collector's).
pub fn rebalance_plan(view: &PoolView, min_wire_version: u8) -> Vec<Move> {
    let mut ledger = Ledger::new(view, min_wire_version);
    let part: Vec<usize> = (0..ledger.entries.len())
        .filter(|&i| ledger.takes_new(i))
        .collect();
    let total_load: u128 = part.iter().map(|&i| ledger.entries[i].load as u128).sum();
    let total_cap: u128 = part
        .iter()
        .map(|&i| ledger.entries[i].capacity as u128)
        .sum();
    if total_cap == 0 || part.len() < 2 {
        return Vec::new();
    }
    let share = |cap: u64| -> f64 { cap as f64 * (total_load as f64 / total_cap as f64) };
    let target: BTreeMap<usize, f64> = part
        .iter()
        .map(|&i| (i, share(ledger.entries[i].capacity)))
        .collect();

    let mut replicas: BTreeMap<SlabRef, Vec<ServerId>> = view
        .slabs
        .iter()
        .filter(|(s, _)| view.vms.contains_key(&s.vm))
        .map(|(s, r)| (*s, r.replicas.clone()))
        .collect();
    let mut on_server: BTreeMap<ServerId, BTreeSet<SlabRef>> = BTreeMap::new();
    for (s, reps) in &replicas {
        for r in reps {
            on_server.entry(r.clone()).or_default().insert(*s);
        }
    }
    let mut gave: BTreeSet<usize> = BTreeSet::new();
    let mut received: BTreeSet<usize> = BTreeSet::new();
    let mut moves = Vec::new();
    let limit = view.slabs.values().map(|s| s.replicas.len()).sum::<usize>();

    while moves.len() < limit {
        let excess = |i: usize, l: &Ledger| l.entries[i].load as f64 - target[&i];
        let mut donors: Vec<usize> = part
            .iter()
            .copied()
            .filter(|i| !received.contains(i) && excess(*i, &ledger) > 0.0)
            .collect();
        donors.sort_by(|&a, &b| {
            excess(b, &ledger)
                .total_cmp(&excess(a, &ledger))
                .then(a.cmp(&b))
        });
        let mut found = None;
        'donors: for d in donors {
            let did = ledger.entries[d].id.clone();
            let Some(slabs) = on_server.get(&did) else {
                continue;
            };
            for slab in slabs {
                let bytes = view.slabs[slab].bytes;
                if excess(d, &ledger) <= bytes as f64 / 2.0 {
                    continue;
                }
                let reps = &replicas[slab];
                let busy: Vec<&RackId> = reps
                    .iter()
                    .filter(|s| **s != did)
                    .filter_map(|s| ledger.rack_of(s))
                    .collect();
                let best = part
                    .iter()
                    .copied()
                    .filter(|&r| {
                        let e = &ledger.entries[r];
                        r != d
                            && !gave.contains(&r)
                            && !reps.contains(&e.id)
                            && !busy.contains(&&e.rack)
                            && e.free() >= bytes
                            && (e.load + bytes) as f64 <= target[&r] + bytes as f64 / 2.0
                    })
                    .max_by(|&a, &b| {
                        excess(b, &ledger)
                            .total_cmp(&excess(a, &ledger))
                            .then(b.cmp(&a))
                    });
                if let Some(r) = best {
                    found = Some((d, r, *slab, bytes));
                    break 'donors;
                }
            }
        }
        let Some((d, r, slab, bytes)) = found else {
            break;
        };
        let (from, to) = (ledger.entries[d].id.clone(), ledger.entries[r].id.clone());
        ledger.entries[d].load = ledger.entries[d].load.saturating_sub(bytes);
        ledger.entries[r].load += bytes;
        gave.insert(d);
        received.insert(r);
        for s in replicas.get_mut(&slab).into_iter().flatten() {
            if *s == from {
                *s = to.clone();
            }
        }
        on_server.entry(from.clone()).or_default().remove(&slab);
        on_server.entry(to.clone()).or_default().insert(slab);
        moves.push(Move {
            slab,
            from,
            to,
            bytes,
        });
    }
    moves
}
