//! The records the pool keeps in etcd, as JSON values: a memory server's registration, a VM's
//! instance record and one slab's placement. Field names are part of the key layout's contract
//! (see [`crate::keys`]); new fields are added with `#[serde(default)]` so older readers and
//! writers keep working.

use std::net::SocketAddr;

use farvm_transport::{Endpoint, Transport};
use serde::{Deserialize, Serialize};

use crate::ids::{RackId, ServerId, VmId};

/// Whether a memory server takes new slabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerHealth {
    /// Serving, and takes new slabs while it has room.
    Up,
    /// Serving its slabs while they are moved off; takes no new ones.
    Draining,
    /// Serving, but reports trouble (e.g. its arena is failing writes); takes no new slabs.
    Degraded,
}

impl ServerHealth {
    /// The lower-case name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Draining => "draining",
            Self::Degraded => "degraded",
        }
    }
}

/// A memory server's registration, under its own etcd lease: it disappears when the server
/// stops renewing the lease (it died, or lost the network).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRecord {
    /// The server's id (also its key).
    pub id: ServerId,
    /// Where clients connect over TCP.
    pub address: SocketAddr,
    /// Other listeners clients may use, each with its transport (`rdma://IP:PORT`: the
    /// server's RDMA listener, `farvm-memserver --rdma`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<Endpoint>,
    /// Its failure domain.
    pub rack: RackId,
    /// Arena size in bytes.
    pub capacity_bytes: u64,
    /// Bytes of pages stored, all namespaces (the server's own count, refreshed periodically).
    pub used_bytes: u64,
    /// Random per server process: a new value means the server restarted and lost its pages.
    pub instance: u64,
    /// Highest wire-protocol version the server speaks.
    pub wire_version: u8,
    /// Whether it takes new slabs.
    pub health: ServerHealth,
}

impl ServerRecord {
    /// How a client that wants `transport` reaches this server: its listener of that kind
    /// (with `transport`'s RDMA page mode), else its TCP address.
    pub fn endpoint(&self, transport: Transport) -> Endpoint {
        self.endpoints
            .iter()
            .find(|e| e.transport.same_kind(transport))
            .map_or(Endpoint::tcp(self.address), |e| Endpoint {
                addr: e.addr,
                transport,
            })
    }

    /// Capacity not used by stored pages (reservations by placed slabs not counted).
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.used_bytes)
    }
}

/// A VM instance's record, under the VM's own etcd lease: it disappears when the VMM stops
/// renewing the lease. Its slabs' placement records ([`SlabRecord`]) are not leased, so they
/// outlive it and tell the garbage collector where its pages are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    /// The instance id (also its key).
    pub uuid: VmId,
    /// The memory-server namespace holding its pages ([`VmId::namespace`]).
    pub namespace: u64,
    /// The operator's name for the VM (informative; not unique).
    pub name: String,
    /// The host running it.
    pub host: String,
    /// Guest RAM in bytes.
    pub guest_ram_bytes: u64,
    /// Host RAM the VM may keep resident (the rest lives on memory servers).
    pub local_budget_bytes: u64,
    /// Replicas per slab.
    pub replication: u8,
    /// Bytes per slab.
    pub slab_bytes: u64,
    /// Slabs placed for it (`placement/<uuid>/0 .. slabs-1`).
    pub slabs: u32,
}

impl VmRecord {
    /// Guest RAM that lives on memory servers (one copy).
    pub fn remote_bytes(&self) -> u64 {
        self.guest_ram_bytes.saturating_sub(self.local_budget_bytes)
    }
}

/// A pool VM's snapshot: the owner of the saved VM's namespace and placement while the VM
/// is not running (no lease: it lives until it is restored or deleted). Its key is the VM's
/// uuid, which the restored VM keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The saved VM's record, written back under a new lease by the restore.
    pub vm: VmRecord,
    /// The snapshot's directory on `host`.
    pub dir: String,
    /// The host that saved it.
    pub host: String,
    /// Pages the memory servers hold for it (one copy each).
    pub remote_pages: u64,
    /// Pages the snapshot's directory holds (the resident ones).
    pub local_pages: u64,
    /// When it was saved (Unix milliseconds, the saving host's clock).
    pub created_unix_ms: u64,
}

/// Where one slab of a VM lives: one replica per server, on distinct racks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlabRecord {
    /// Bytes reserved on each replica's server.
    pub bytes: u64,
    /// The servers holding a replica, primary first.
    pub replicas: Vec<ServerId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(json_endpoints: &str) -> ServerRecord {
        serde_json::from_str(&format!(
            r#"{{"id":"s1","address":"10.0.0.5:7070",{json_endpoints}"rack":"r1",
            "capacity_bytes":1,"used_bytes":0,"instance":7,"wire_version":3,"health":"up"}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_server_is_reached_by_the_transport_asked_for_where_it_has_one() {
        // A record written before endpoints existed reads as TCP only.
        let old = server("");
        assert!(old.endpoints.is_empty());
        let tcp = Endpoint::tcp("10.0.0.5:7070".parse().unwrap());
        assert_eq!(old.endpoint(Transport::RDMA), tcp);
        assert!(!serde_json::to_string(&old).unwrap().contains("endpoints"));
        let both = server(r#""endpoints":["rdma://10.0.0.5:7071"],"#);
        assert_eq!(both.endpoint(Transport::Tcp), tcp);
        let send = Transport::Rdma { one_sided: false };
        assert_eq!(
            both.endpoint(send),
            Endpoint {
                addr: "10.0.0.5:7071".parse().unwrap(),
                transport: send,
            }
        );
        let json = serde_json::to_string(&both).unwrap();
        assert!(
            json.contains(r#""endpoints":["rdma://10.0.0.5:7071"]"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<ServerRecord>(&json).unwrap(), both);
    }
}
