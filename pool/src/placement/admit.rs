//! Admission: place every slab of a VM's remote share at its replication factor, or refuse it
//! naming the shortfall.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ledger::Ledger;
use super::{PlacementError, MAX_REPLICATION};
use crate::ids::{RackId, ServerId, VmId};
use crate::record::{SlabRecord, VmRecord};
use crate::units::fmt_bytes;
use crate::view::PoolView;

/// What a VM asks of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionRequest {
    /// The instance id (its namespace is derived from it).
    pub vm: VmId,
    /// The operator's name for the VM.
    pub name: String,
    /// The host that runs it.
    pub host: String,
    /// Guest RAM in bytes.
    pub guest_ram_bytes: u64,
    /// Host RAM it may keep resident; the rest is remote.
    pub local_budget_bytes: u64,
    /// Replicas per slab (1..=8), each on its own rack.
    pub replication: u8,
    /// Bytes per slab (a non-zero multiple of 4096).
    pub slab_bytes: u64,
    /// Servers speaking an older wire version get no slabs.
    pub min_wire_version: u8,
}

/// The largest slab [`fitted_slab_bytes`] chooses (and the usual `--pool-slab`).
pub const MAX_FITTED_SLAB: u64 = 1 << 30;
/// The smallest slab [`fitted_slab_bytes`] chooses.
pub const MIN_FITTED_SLAB: u64 = 2 << 20;

/// The slab size for a VM whose remote share is `remote_bytes` when the operator names none:
/// the share rounded up to a power of two, between 2 MiB and 1 GiB. The slabs reserved then
/// hold at most twice the share (for a share of 1 MiB or more): a 48 MiB share reserves one
/// 64 MiB slab per replica, where a fixed 1 GiB slab reserved 1 GiB.
pub fn fitted_slab_bytes(remote_bytes: u64) -> u64 {
    remote_bytes
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(MAX_FITTED_SLAB)
        .clamp(MIN_FITTED_SLAB, MAX_FITTED_SLAB)
}

impl AdmissionRequest {
    /// Bytes of guest RAM on memory servers (one copy).
    pub fn remote_bytes(&self) -> u64 {
        self.guest_ram_bytes.saturating_sub(self.local_budget_bytes)
    }

    /// Slabs covering the remote share.
    pub fn slab_count(&self) -> u64 {
        self.remote_bytes().div_ceil(self.slab_bytes.max(1))
    }

    fn validate(&self) -> Result<(), PlacementError> {
        let bad = |m: String| Err(PlacementError::Invalid(m));
        if self.replication == 0 || self.replication > MAX_REPLICATION {
            return bad(format!(
                "replication {} is outside 1..={MAX_REPLICATION}",
                self.replication
            ));
        }
        if self.slab_bytes == 0 || !self.slab_bytes.is_multiple_of(4096) {
            return bad(format!(
                "slab size {} is not a non-zero multiple of 4096",
                self.slab_bytes
            ));
        }
        if self.local_budget_bytes > self.guest_ram_bytes {
            return bad(format!(
                "local budget {} exceeds guest RAM {}",
                fmt_bytes(self.local_budget_bytes),
                fmt_bytes(self.guest_ram_bytes)
            ));
        }
        if self.slab_count() > u32::MAX as u64 {
            return bad("too many slabs".into());
        }
        Ok(())
    }

    /// The VM record this request registers, with `slabs` placed.
    pub fn record(&self, slabs: u32) -> VmRecord {
        VmRecord {
            uuid: self.vm,
            namespace: self.vm.namespace(),
            name: self.name.clone(),
            host: self.host.clone(),
            guest_ram_bytes: self.guest_ram_bytes,
            local_budget_bytes: self.local_budget_bytes,
            replication: self.replication,
            slab_bytes: self.slab_bytes,
            slabs,
        }
    }
}

/// Where a VM's slabs go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmPlacement {
    /// The VM.
    pub vm: VmId,
    /// Slab `i`'s replicas, primary first.
    pub slabs: Vec<SlabRecord>,
}

impl VmPlacement {
    /// Every server holding a replica of some slab, each once, in id order.
    pub fn servers(&self) -> Vec<ServerId> {
        let mut all: Vec<ServerId> = self
            .slabs
            .iter()
            .flat_map(|s| s.replicas.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }
}

/// Room for slabs in one rack, as seen by a refused admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RackRoom {
    /// The rack.
    pub rack: RackId,
    /// Bytes of whole slabs its eligible servers could take.
    pub usable_bytes: u64,
    /// More bytes this rack could usefully take for this VM (a rack holds at most one replica
    /// of each slab, so at most one copy of the share).
    pub could_add_bytes: u64,
    /// Servers that took no new slab, and why (draining, degraded, full, old wire version).
    pub refused: Vec<String>,
}

/// Why a VM was refused: the share at its replication does not fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortfall {
    /// The VM.
    pub vm: VmId,
    /// Slabs needed.
    pub slabs: u64,
    /// Bytes per slab.
    pub slab_bytes: u64,
    /// Replicas per slab.
    pub replication: u8,
    /// Bytes needed: slabs × slab bytes × replication.
    pub needed_bytes: u64,
    /// Bytes of it the pool could place keeping replicas on distinct racks.
    pub placeable_bytes: u64,
    /// needed − placeable.
    pub short_bytes: u64,
    /// Every rack with a live server, in name order.
    pub racks: Vec<RackRoom>,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_room = self.racks.iter().filter(|r| r.usable_bytes > 0).count();
        write!(
            f,
            "cannot admit VM {}: its remote share needs {} ({} slab(s) of {} × replication {}, \
             on {} distinct racks) but the pool can place {}; short by {}",
            self.vm,
            fmt_bytes(self.needed_bytes),
            self.slabs,
            fmt_bytes(self.slab_bytes),
            self.replication,
            self.replication,
            fmt_bytes(self.placeable_bytes),
            fmt_bytes(self.short_bytes),
        )?;
        if with_room < self.replication as usize {
            write!(
                f,
                " (only {with_room} rack(s) have room, replication {} needs {})",
                self.replication, self.replication
            )?;
        }
        write!(f, ". Per rack:")?;
        if self.racks.is_empty() {
            write!(f, " no memory server is registered")?;
        }
        for (i, r) in self.racks.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(
                f,
                "{sep}{} has room for {}, could take {} more",
                r.rack,
                fmt_bytes(r.usable_bytes),
                fmt_bytes(r.could_add_bytes)
            )?;
            if !r.refused.is_empty() {
                write!(f, " ({})", r.refused.join(", "))?;
            }
        }
        Ok(())
    }
}

/// Places every slab of `req`'s remote share on `req.replication` servers in distinct racks,
/// spreading load: each slab goes to the racks with the most room left, and within a rack to
/// the server with the most free bytes. Refuses with [`PlacementError::Shortfall`] when the
/// share does not fit (nothing is placed then).
pub fn admit(view: &PoolView, req: &AdmissionRequest) -> Result<VmPlacement, PlacementError> {
    req.validate()?;
    let mut ledger = Ledger::new(view, req.min_wire_version);
    let n = req.slab_count();
    let b = req.slab_bytes;
    let r = req.replication as u64;
    if n == 0 {
        return Ok(VmPlacement {
            vm: req.vm,
            slabs: Vec::new(),
        });
    }

    // Servers that take new slabs, per rack.
    let mut racks: BTreeMap<RackId, Vec<usize>> = BTreeMap::new();
    let mut refused: BTreeMap<RackId, Vec<String>> = BTreeMap::new();
    for (i, e) in ledger.entries.iter().enumerate() {
        match ledger.refusal(i, b) {
            None => racks.entry(e.rack.clone()).or_default().push(i),
            Some(why) => {
                racks.entry(e.rack.clone()).or_default();
                refused.entry(e.rack.clone()).or_default().push(why);
            }
        }
    }
    let room = |ledger: &Ledger, servers: &[usize]| -> u64 {
        servers
            .iter()
            .map(|&i| ledger.entries[i].free() / b)
            .sum::<u64>()
    };

    let placeable: u64 = racks.values().map(|s| room(&ledger, s).min(n)).sum();
    if placeable < n * r {
        let rooms = racks
            .iter()
            .map(|(rack, servers)| {
                let c = room(&ledger, servers);
                RackRoom {
                    rack: rack.clone(),
                    usable_bytes: c.saturating_mul(b),
                    could_add_bytes: (n - c.min(n)) * b,
                    refused: refused.remove(rack).unwrap_or_default(),
                }
            })
            .collect();
        return Err(PlacementError::Shortfall(Box::new(Shortfall {
            vm: req.vm,
            slabs: n,
            slab_bytes: b,
            replication: req.replication,
            needed_bytes: n * r * b,
            placeable_bytes: placeable * b,
            short_bytes: (n * r - placeable) * b,
            racks: rooms,
        })));
    }

    // Greedy: the R racks with the most room left take each slab. With room c_r per rack this
    // keeps Σ min(c_r, slabs left) ≥ slabs left × R, so it never gets stuck when the check
    // above passed.
    let mut slabs = Vec::with_capacity(n as usize);
    for index in 0..n {
        let mut order: Vec<(&RackId, u64)> = racks
            .iter()
            .map(|(rack, servers)| (rack, room(&ledger, servers)))
            .filter(|&(_, c)| c > 0)
            .collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        if order.len() < r as usize {
            return Err(PlacementError::Invalid(format!(
                "internal: slab {index} found only {} rack(s) with room",
                order.len()
            )));
        }
        let mut replicas = Vec::with_capacity(r as usize);
        for (rack, _) in order.into_iter().take(r as usize) {
            let best = racks[rack]
                .iter()
                .copied()
                .filter(|&i| ledger.entries[i].free() >= b)
                .max_by(|&x, &y| {
                    let (ex, ey) = (&ledger.entries[x], &ledger.entries[y]);
                    ex.free().cmp(&ey.free()).then(ey.id.cmp(&ex.id))
                });
            let Some(i) = best else {
                return Err(PlacementError::Invalid(format!(
                    "internal: rack {rack} counted room but has no server with room"
                )));
            };
            ledger.entries[i].load += b;
            replicas.push(ledger.entries[i].id.clone());
        }
        slabs.push(SlabRecord { bytes: b, replicas });
    }
    Ok(VmPlacement { vm: req.vm, slabs })
}
