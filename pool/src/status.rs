//! The pool's status: racks (declared ones, also those with no server) → servers (capacity, used, reserved, free, VMs, health), hosts →
//! VMs, snapshots of pool VMs, namespaces awaiting collection, and the fleet's oversubscription ratio (guest RAM over
//! the host RAM VMs keep resident). Serialises to JSON and renders as a table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::gc;
use crate::ids::{RackId, ServerId, VmId};
use crate::record::ServerHealth;
use crate::units::fmt_bytes;
use crate::view::PoolView;

/// One memory server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Its id.
    pub id: ServerId,
    /// Where clients connect.
    pub address: SocketAddr,
    /// Arena bytes.
    pub capacity_bytes: u64,
    /// Bytes of pages stored (the server's count).
    pub used_bytes: u64,
    /// Bytes reserved by slab replicas placed there.
    pub reserved_bytes: u64,
    /// capacity − max(used, reserved); 0 while draining (it takes no new slabs).
    pub free_bytes: u64,
    /// VMs with a replica there (live or awaiting collection).
    pub vms: Vec<VmId>,
    /// Whether it takes new slabs.
    pub health: ServerHealth,
    /// Highest wire version it speaks.
    pub wire_version: u8,
}

/// One rack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RackStatus {
    /// Its name.
    pub rack: RackId,
    /// Whether it is declared in the pool. A rack that is not (only seen as the rack of a
    /// server that registered before it was removed) takes no slabs.
    pub declared: bool,
    /// Sum over its servers.
    pub capacity_bytes: u64,
    /// Sum over its servers.
    pub used_bytes: u64,
    /// Sum over its servers.
    pub reserved_bytes: u64,
    /// Sum over its servers.
    pub free_bytes: u64,
    /// Its servers, in id order.
    pub servers: Vec<ServerStatus>,
}

/// One VM host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// The host name VMs registered with.
    pub host: String,
    /// Its VMs.
    pub vms: Vec<VmId>,
    /// Guest RAM of its VMs.
    pub guest_ram_bytes: u64,
    /// Resident budgets of its VMs.
    pub local_ram_bytes: u64,
    /// guest / local (None with no local RAM).
    pub oversubscription: Option<f64>,
}

/// One live VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmStatus {
    /// Its id.
    pub uuid: VmId,
    /// The operator's name.
    pub name: String,
    /// Its host.
    pub host: String,
    /// Its namespace.
    pub namespace: u64,
    /// Guest RAM.
    pub guest_ram_bytes: u64,
    /// Resident budget.
    pub local_budget_bytes: u64,
    /// Remote share (one copy).
    pub remote_bytes: u64,
    /// Replicas per slab.
    pub replication: u8,
    /// Slabs placed.
    pub slabs: u32,
    /// Slabs with a replica on a server that is gone.
    pub degraded_slabs: u32,
}

/// One snapshot of a pool VM (it owns the VM's namespace until restored or deleted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotStatus {
    /// The saved VM's id (the snapshot's id: `farvm pool snapshot-delete ID`).
    pub uuid: VmId,
    /// The VM's name.
    pub name: String,
    /// The host that saved it.
    pub host: String,
    /// Its directory there.
    pub dir: String,
    /// Its namespace on the memory servers.
    pub namespace: u64,
    /// Guest RAM.
    pub guest_ram_bytes: u64,
    /// Bytes the memory servers hold for it (one copy).
    pub remote_bytes: u64,
    /// Bytes of resident pages its directory holds.
    pub local_bytes: u64,
    /// Slabs placed.
    pub slabs: u32,
    /// When it was saved (Unix milliseconds).
    pub created_unix_ms: u64,
}

/// Fleet totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// Live servers.
    pub servers: usize,
    /// Racks with a live server.
    pub racks: usize,
    /// Racks declared in the pool (with or without a live server).
    pub declared_racks: usize,
    /// Live VMs.
    pub vms: usize,
    /// Pool capacity.
    pub capacity_bytes: u64,
    /// Stored bytes.
    pub used_bytes: u64,
    /// Reserved bytes.
    pub reserved_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Guest RAM of live VMs.
    pub guest_ram_bytes: u64,
    /// Host RAM live VMs keep resident.
    pub local_ram_bytes: u64,
    /// Guest RAM over host-local RAM (None with no VMs).
    pub oversubscription: Option<f64>,
}

/// The whole status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// The etcd revision it was built from.
    pub revision: i64,
    /// Declared racks and racks with a live server, in name order.
    pub racks: Vec<RackStatus>,
    /// Hosts in name order.
    pub hosts: Vec<HostStatus>,
    /// Live VMs in id order.
    pub vms: Vec<VmStatus>,
    /// Snapshots of pool VMs in id order.
    pub snapshots: Vec<SnapshotStatus>,
    /// (server, namespace) pairs of dead VMs awaiting collection.
    pub orphans: Vec<gc::Orphan>,
    /// Totals.
    pub fleet: FleetStatus,
}

fn ratio(guest: u64, local: u64) -> Option<f64> {
    (local > 0).then(|| guest as f64 / local as f64)
}

impl PoolStatus {
    /// The status of `view`.
    pub fn from_view(view: &PoolView) -> Self {
        let committed = view.committed_by_server();
        let mut vms_on: BTreeMap<&ServerId, BTreeSet<VmId>> = BTreeMap::new();
        for (slab, rec) in &view.slabs {
            for s in &rec.replicas {
                vms_on.entry(s).or_default().insert(slab.vm);
            }
        }
        let empty = |rack: &RackId| RackStatus {
            rack: rack.clone(),
            declared: view.rack_declared(rack),
            capacity_bytes: 0,
            used_bytes: 0,
            reserved_bytes: 0,
            free_bytes: 0,
            servers: Vec::new(),
        };
        let mut racks: BTreeMap<RackId, RackStatus> =
            view.racks.iter().map(|r| (r.clone(), empty(r))).collect();
        for s in view.servers.values() {
            let reserved = committed.get(&s.id).copied().unwrap_or(0);
            // A draining server takes no new slab: its room is not the pool's to give.
            let free = if s.health == ServerHealth::Draining {
                0
            } else {
                s.capacity_bytes.saturating_sub(s.used_bytes.max(reserved))
            };
            let rack = racks
                .entry(s.rack.clone())
                .or_insert_with(|| empty(&s.rack));
            rack.capacity_bytes += s.capacity_bytes;
            rack.used_bytes += s.used_bytes;
            rack.reserved_bytes += reserved;
            rack.free_bytes += free;
            rack.servers.push(ServerStatus {
                id: s.id.clone(),
                address: s.address,
                capacity_bytes: s.capacity_bytes,
                used_bytes: s.used_bytes,
                reserved_bytes: reserved,
                free_bytes: free,
                vms: vms_on
                    .get(&s.id)
                    .map(|v| v.iter().copied().collect())
                    .unwrap_or_default(),
                health: s.health,
                wire_version: s.wire_version,
            });
        }
        let mut hosts: BTreeMap<&str, HostStatus> = BTreeMap::new();
        let mut vms = Vec::new();
        for v in view.vms.values() {
            let h = hosts.entry(&v.host).or_insert_with(|| HostStatus {
                host: v.host.clone(),
                vms: Vec::new(),
                guest_ram_bytes: 0,
                local_ram_bytes: 0,
                oversubscription: None,
            });
            h.vms.push(v.uuid);
            h.guest_ram_bytes += v.guest_ram_bytes;
            h.local_ram_bytes += v.local_budget_bytes;
            let degraded = view
                .vm_slabs(v.uuid)
                .filter(|(_, r)| r.replicas.iter().any(|s| !view.servers.contains_key(s)))
                .count() as u32;
            vms.push(VmStatus {
                uuid: v.uuid,
                name: v.name.clone(),
                host: v.host.clone(),
                namespace: v.namespace,
                guest_ram_bytes: v.guest_ram_bytes,
                local_budget_bytes: v.local_budget_bytes,
                remote_bytes: v.remote_bytes(),
                replication: v.replication,
                slabs: v.slabs,
                degraded_slabs: degraded,
            });
        }
        for h in hosts.values_mut() {
            h.oversubscription = ratio(h.guest_ram_bytes, h.local_ram_bytes);
        }
        let racks: Vec<RackStatus> = racks.into_values().collect();
        let guest: u64 = vms.iter().map(|v| v.guest_ram_bytes).sum();
        let local: u64 = vms.iter().map(|v| v.local_budget_bytes).sum();
        let fleet = FleetStatus {
            servers: view.servers.len(),
            racks: racks.iter().filter(|r| !r.servers.is_empty()).count(),
            declared_racks: view.racks.len(),
            vms: vms.len(),
            capacity_bytes: racks.iter().map(|r| r.capacity_bytes).sum(),
            used_bytes: racks.iter().map(|r| r.used_bytes).sum(),
            reserved_bytes: racks.iter().map(|r| r.reserved_bytes).sum(),
            free_bytes: racks.iter().map(|r| r.free_bytes).sum(),
            guest_ram_bytes: guest,
            local_ram_bytes: local,
            oversubscription: ratio(guest, local),
        };
        let snapshots = view
            .snapshots
            .values()
            .map(|s| SnapshotStatus {
                uuid: s.vm.uuid,
                name: s.vm.name.clone(),
                host: s.host.clone(),
                dir: s.dir.clone(),
                namespace: s.vm.namespace,
                guest_ram_bytes: s.vm.guest_ram_bytes,
                remote_bytes: s.remote_pages * 4096,
                local_bytes: s.local_pages * 4096,
                slabs: s.vm.slabs,
                created_unix_ms: s.created_unix_ms,
            })
            .collect();
        Self {
            revision: view.revision,
            racks,
            hosts: hosts.into_values().collect(),
            vms,
            snapshots,
            orphans: gc::sweep(view),
            fleet,
        }
    }

    /// The status as JSON (pretty-printed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The status as text tables for a terminal.
    pub fn render_table(&self) -> String {
        let f = &self.fleet;
        let mut out = String::new();
        let ratio = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            out,
            "pool: {} server(s) in {} rack(s) ({} declared), {} VM(s); capacity {}, used {}, \
             reserved {}, free {}; oversubscription {} (guest {} / local {})",
            f.servers,
            f.racks,
            f.declared_racks,
            f.vms,
            fmt_bytes(f.capacity_bytes),
            fmt_bytes(f.used_bytes),
            fmt_bytes(f.reserved_bytes),
            fmt_bytes(f.free_bytes),
            ratio(f.oversubscription),
            fmt_bytes(f.guest_ram_bytes),
            fmt_bytes(f.local_ram_bytes),
        );
        let _ = writeln!(
            out,
            "\n{:<10} {:<12} {:<21} {:>10} {:>10} {:>10} {:>10} {:>4} {:<8}",
            "RACK", "SERVER", "ADDRESS", "CAPACITY", "USED", "RESERVED", "FREE", "VMS", "HEALTH"
        );
        for r in &self.racks {
            if r.servers.is_empty() {
                let _ = writeln!(out, "{:<10} (no server)", r.rack.as_str());
                continue;
            }
            for s in &r.servers {
                let _ = writeln!(
                    out,
                    "{:<10} {:<12} {:<21} {:>10} {:>10} {:>10} {:>10} {:>4} {:<8}",
                    r.rack.as_str(),
                    s.id.as_str(),
                    s.address.to_string(),
                    fmt_bytes(s.capacity_bytes),
                    fmt_bytes(s.used_bytes),
                    fmt_bytes(s.reserved_bytes),
                    fmt_bytes(s.free_bytes),
                    s.vms.len(),
                    s.health.as_str()
                );
            }
            let _ = writeln!(
                out,
                "{:<10} {:<12} {:<21} {:>10} {:>10} {:>10} {:>10}{}",
                "",
                "(rack)",
                "",
                fmt_bytes(r.capacity_bytes),
                fmt_bytes(r.used_bytes),
                fmt_bytes(r.reserved_bytes),
                fmt_bytes(r.free_bytes),
                if r.declared {
                    ""
                } else {
                    "  NOT DECLARED: its servers take no slabs"
                }
            );
        }
        if !self.hosts.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<16} {:>4} {:>10} {:>10} {:>8}",
                "HOST", "VMS", "GUEST", "LOCAL", "OVERSUB"
            );
            for h in &self.hosts {
                let _ = writeln!(
                    out,
                    "{:<16} {:>4} {:>10} {:>10} {:>8}",
                    h.host,
                    h.vms.len(),
                    fmt_bytes(h.guest_ram_bytes),
                    fmt_bytes(h.local_ram_bytes),
                    ratio(h.oversubscription)
                );
            }
        }
        if !self.vms.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<36} {:<14} {:<12} {:>10} {:>10} {:>3} {:>6} {:>8}",
                "VM", "NAME", "HOST", "GUEST", "REMOTE", "R", "SLABS", "DEGRADED"
            );
            for v in &self.vms {
                let _ = writeln!(
                    out,
                    "{:<36} {:<14} {:<12} {:>10} {:>10} {:>3} {:>6} {:>8}",
                    v.uuid.to_string(),
                    v.name,
                    v.host,
                    fmt_bytes(v.guest_ram_bytes),
                    fmt_bytes(v.remote_bytes),
                    v.replication,
                    v.slabs,
                    v.degraded_slabs
                );
            }
        }
        if !self.snapshots.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<36} {:<14} {:<12} {:>10} {:>10} {:>10} {:>6}  DIRECTORY",
                "SNAPSHOT", "NAME", "HOST", "GUEST", "REMOTE", "LOCAL", "SLABS"
            );
            for s in &self.snapshots {
                let _ = writeln!(
                    out,
                    "{:<36} {:<14} {:<12} {:>10} {:>10} {:>10} {:>6}  {}",
                    s.uuid.to_string(),
                    s.name,
                    s.host,
                    fmt_bytes(s.guest_ram_bytes),
                    fmt_bytes(s.remote_bytes),
                    fmt_bytes(s.local_bytes),
                    s.slabs,
                    s.dir
                );
            }
        }
        if !self.orphans.is_empty() {
            let _ = writeln!(out, "\nawaiting collection (VM gone, pages remain):");
            for o in &self.orphans {
                let _ = writeln!(
                    out,
                    "  {} namespace {:#018x} on {} ({} slab(s){})",
                    o.vm,
                    o.namespace,
                    o.server,
                    o.slabs.len(),
                    if o.address.is_none() {
                        ", server gone"
                    } else {
                        ""
                    }
                );
            }
        }
        out
    }
}
