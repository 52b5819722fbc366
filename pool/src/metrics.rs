//! The pool's status as Prometheus metrics (`farvm pool metrics --listen ADDR`), served by
//! farvm-httpd: a collector that renders the newest view of a [`PoolWatch`] on every scrape
//! (never waiting on etcd; the watch keeps the view current).
//!
//! Series: per server (`server`, `rack` labels) `farvm_pool_server_{capacity,used,reserved,
//! free}_bytes`, `farvm_pool_server_vms` and `farvm_pool_server_up` (1 when it takes new slabs,
//! 0 when draining, degraded or in an undeclared rack); per rack (declared ones also with no
//! server) `farvm_pool_rack_{capacity,free}_bytes`; for the fleet
//! `farvm_pool_{servers,racks,declared_racks,vms}`, `farvm_pool_{capacity,used,reserved,free,guest_ram,
//! local_ram}_bytes`, `farvm_pool_oversubscription_ratio` (guest RAM / host-local RAM, 0 with
//! no VM), `farvm_pool_orphans` (server, namespace pairs awaiting collection) and
//! `farvm_pool_etcd_up`.

use std::fmt;
use std::sync::{Arc, Mutex};

use farvm_httpd::metrics::{router, Families};
use farvm_httpd::prometheus_client::collector::Collector;
use farvm_httpd::prometheus_client::encoding::DescriptorEncoder;
use farvm_httpd::{Exposition, HttpError, HttpServer, Listen};

use crate::directory::{Connectivity, Directory, PoolWatch};
use crate::record::ServerHealth;
use crate::status::PoolStatus;

/// Serves the pool's metrics on `listen` (until dropped).
pub fn serve(listen: &Listen, dir: &Directory) -> Result<HttpServer, HttpError> {
    let mut exposition = Exposition::new();
    exposition.register_collector(PoolCollector {
        watch: Arc::new(Mutex::new(dir.watch())),
        dir: dir.clone(),
    });
    HttpServer::start(listen, "pool-metrics", router(Arc::new(exposition)))
}

struct PoolCollector {
    watch: Arc<Mutex<PoolWatch>>,
    dir: Directory,
}

impl fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCollector").finish_non_exhaustive()
    }
}

impl Collector for PoolCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let view = self
            .watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .latest();
        let up = matches!(self.dir.connectivity(), Connectivity::Connected) && view.revision > 0;
        encode(
            &mut Families::new(encoder, &[]),
            &PoolStatus::from_view(&view),
            up,
        )
    }
}

/// Writes the status's series.
pub fn encode(f: &mut Families<'_>, s: &PoolStatus, etcd_up: bool) -> fmt::Result {
    let servers: Vec<_> = s
        .racks
        .iter()
        .flat_map(|r| {
            r.servers
                .iter()
                .map(move |srv| (r.rack.as_str(), r.declared, srv))
        })
        .collect();
    let labels: Vec<[(&str, &str); 2]> = servers
        .iter()
        .map(|(rack, _, srv)| [("server", srv.id.as_str()), ("rack", *rack)])
        .collect();
    let per_server =
        |get: &dyn Fn(bool, &crate::status::ServerStatus) -> u64| -> Vec<(&[(&str, &str)], u64)> {
            servers
                .iter()
                .zip(&labels)
                .map(|((_, declared, srv), l)| (&l[..], get(*declared, srv)))
                .collect()
        };
    f.gauge_series(
        "farvm_pool_server_capacity_bytes",
        "Arena size of each memory server.",
        &per_server(&|_, s| s.capacity_bytes),
    )?;
    f.gauge_series(
        "farvm_pool_server_used_bytes",
        "Bytes of pages each memory server stores.",
        &per_server(&|_, s| s.used_bytes),
    )?;
    f.gauge_series(
        "farvm_pool_server_reserved_bytes",
        "Bytes reserved on each memory server by placed slab replicas.",
        &per_server(&|_, s| s.reserved_bytes),
    )?;
    f.gauge_series(
        "farvm_pool_server_free_bytes",
        "Capacity minus the larger of used and reserved bytes.",
        &per_server(&|_, s| s.free_bytes),
    )?;
    f.gauge_series(
        "farvm_pool_server_vms",
        "VMs with a slab replica on each memory server.",
        &per_server(&|_, s| s.vms.len() as u64),
    )?;
    f.gauge_series(
        "farvm_pool_server_up",
        "1 when the server takes new slabs, 0 when draining, degraded or in an undeclared rack.",
        &per_server(&|declared, s| u64::from(declared && s.health == ServerHealth::Up)),
    )?;
    let racks: Vec<[(&str, &str); 1]> = s
        .racks
        .iter()
        .map(|r| [("rack", r.rack.as_str())])
        .collect();
    let per_rack =
        |get: &dyn Fn(&crate::status::RackStatus) -> u64| -> Vec<(&[(&str, &str)], u64)> {
            s.racks
                .iter()
                .zip(&racks)
                .map(|(r, l)| (&l[..], get(r)))
                .collect()
        };
    f.gauge_series(
        "farvm_pool_rack_capacity_bytes",
        "Capacity of each rack's memory servers.",
        &per_rack(&|r| r.capacity_bytes),
    )?;
    f.gauge_series(
        "farvm_pool_rack_free_bytes",
        "Free bytes of each rack's memory servers.",
        &per_rack(&|r| r.free_bytes),
    )?;
    let fl = &s.fleet;
    f.gauge(
        "farvm_pool_servers",
        "Memory servers registered.",
        fl.servers as u64,
    )?;
    f.gauge(
        "farvm_pool_racks",
        "Racks with a memory server.",
        fl.racks as u64,
    )?;
    f.gauge(
        "farvm_pool_declared_racks",
        "Racks declared in the pool.",
        fl.declared_racks as u64,
    )?;
    f.gauge("farvm_pool_vms", "VMs registered.", fl.vms as u64)?;
    f.gauge(
        "farvm_pool_capacity_bytes",
        "Capacity of the pool.",
        fl.capacity_bytes,
    )?;
    f.gauge(
        "farvm_pool_used_bytes",
        "Bytes stored in the pool.",
        fl.used_bytes,
    )?;
    f.gauge(
        "farvm_pool_reserved_bytes",
        "Bytes reserved by placed slabs.",
        fl.reserved_bytes,
    )?;
    f.gauge(
        "farvm_pool_free_bytes",
        "Free bytes of the pool.",
        fl.free_bytes,
    )?;
    f.gauge(
        "farvm_pool_guest_ram_bytes",
        "Guest RAM of the registered VMs.",
        fl.guest_ram_bytes,
    )?;
    f.gauge(
        "farvm_pool_local_ram_bytes",
        "Host RAM the registered VMs may keep resident.",
        fl.local_ram_bytes,
    )?;
    f.gauge(
        "farvm_pool_oversubscription_ratio",
        "Guest RAM over host-local RAM of the registered VMs (0 with no VM).",
        fl.oversubscription.unwrap_or(0.0),
    )?;
    f.gauge(
        "farvm_pool_orphans",
        "(server, namespace) pairs of dead VMs awaiting collection.",
        s.orphans.len() as u64,
    )?;
    f.gauge(
        "farvm_pool_etcd_up",
        "1 while etcd answers.",
        u64::from(etcd_up),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{RackId, ServerId};
    use crate::record::ServerRecord;
    use crate::view::PoolView;

    #[test]
    fn series_name_every_server_and_the_fleet() {
        let mut view = PoolView {
            revision: 3,
            ..Default::default()
        };
        // r1 and r3 declared (r3 has no server); r2 is not, so b takes no slabs.
        view.racks = ["r1", "r3"].map(|r| RackId::new(r).unwrap()).into();
        for (id, rack, used) in [("a", "r1", 4096u64), ("b", "r2", 0)] {
            let id = ServerId::new(id).unwrap();
            view.servers.insert(
                id.clone(),
                ServerRecord {
                    id,
                    address: "127.0.0.1:7070".parse().unwrap(),
                    endpoints: Vec::new(),
                    rack: RackId::new(rack).unwrap(),
                    capacity_bytes: 1 << 30,
                    used_bytes: used,
                    instance: 1,
                    wire_version: 2,
                    health: ServerHealth::Up,
                },
            );
        }
        let mut e = Exposition::new();
        struct Fixed(PoolStatus);
        impl fmt::Debug for Fixed {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("Fixed")
            }
        }
        impl Collector for Fixed {
            fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
                encode(&mut Families::new(encoder, &[]), &self.0, true)
            }
        }
        e.register_collector(Fixed(PoolStatus::from_view(&view)));
        let text = e.render();
        assert!(
            text.contains("farvm_pool_server_used_bytes{server=\"a\",rack=\"r1\"} 4096"),
            "{text}"
        );
        assert!(text.contains("farvm_pool_servers 2"), "{text}");
        assert!(text.contains("farvm_pool_racks 2"), "{text}");
        assert!(text.contains("farvm_pool_declared_racks 2"), "{text}");
        assert!(
            text.contains("farvm_pool_server_up{server=\"a\",rack=\"r1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("farvm_pool_server_up{server=\"b\",rack=\"r2\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("farvm_pool_rack_capacity_bytes{rack=\"r3\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("farvm_pool_capacity_bytes 2147483648"),
            "{text}"
        );
        assert!(text.contains("farvm_pool_etcd_up 1"), "{text}");
    }
}
