//! A nemesis schedule: the faults one seed draws (kind, target, start, duration), drawn by a
//! fixed deterministic generator so that the same seed and flags always give the same schedule
//! (what makes a failure replay), and their text form printed and written to the logs.

use std::fmt;
use std::time::Duration;

// The trace generators' SplitMix64: a fixed algorithm, so a seed draws the same schedule on
// every machine and toolchain, which replaying a failure needs.
use farvm_prefetch::trace::rng::SplitMix64;

/// Uniform in `lo..=hi` milliseconds.
fn millis(rng: &mut SplitMix64, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.below(hi - lo + 1))
}

/// What a fault does. Every kind but the kills undoes itself after its duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// SIGSTOP etcd, SIGCONT after the duration.
    EtcdPause,
    /// `cluster.sh etcd-stop`, `etcd-start` after the duration (same data directory).
    EtcdRestart,
    /// Every namespace of a rack (servers and hosts) loses its link; back up after the duration.
    Partition,
    /// SIGKILL a memory server for good.
    ServerKill,
    /// SIGSTOP a memory server, SIGCONT after the duration.
    ServerPause,
    /// SIGKILL a memory server and start an empty one in its place under a new pool id.
    ServerRestartEmpty,
    /// SIGKILL a memory server and start it again, empty, under the same pool id.
    ServerRestartSameId,
    /// SIGSTOP a VMM for longer than its lease TTL and the pool's grace, then SIGCONT.
    VmmPause,
    /// SIGKILL a VMM (it must end with 137 and its namespaces be reclaimed).
    VmmKill,
    /// `farvm-pool drain SERVER` (the mark is taken off when everything heals).
    Drain,
    /// `farvm-pool rebalance`.
    Rebalance,
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::EtcdPause,
        Kind::EtcdRestart,
        Kind::Partition,
        Kind::ServerKill,
        Kind::ServerPause,
        Kind::ServerRestartEmpty,
        Kind::ServerRestartSameId,
        Kind::VmmPause,
        Kind::VmmKill,
        Kind::Drain,
        Kind::Rebalance,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::EtcdPause => "etcd-pause",
            Kind::EtcdRestart => "etcd-restart",
            Kind::Partition => "partition",
            Kind::ServerKill => "server-kill",
            Kind::ServerPause => "server-pause",
            Kind::ServerRestartEmpty => "server-restart-empty",
            Kind::ServerRestartSameId => "server-restart-same-id",
            Kind::VmmPause => "vmm-pause",
            Kind::VmmKill => "vmm-kill",
            Kind::Drain => "drain",
            Kind::Rebalance => "rebalance",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Who a fault hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Etcd,
    /// Rack number, 1-based.
    Rack(u32),
    /// Memory server `rK-msI`.
    Server {
        rack: u32,
        index: u32,
    },
    /// VM index, 0-based.
    Vm(usize),
    /// The whole pool (rebalance).
    Pool,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Etcd => f.write_str("etcd"),
            Target::Rack(k) => write!(f, "r{k}"),
            Target::Server { rack, index } => write!(f, "r{rack}-ms{index}"),
            Target::Vm(i) => write!(f, "vm{i}"),
            Target::Pool => f.write_str("pool"),
        }
    }
}

/// One drawn fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    pub target: Target,
    /// From the moment every VM is admitted.
    pub at: Duration,
    /// How long it lasts before it undoes itself (zero for the kills and the commands).
    pub lasts: Duration,
}

/// The cluster a schedule is drawn for.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub racks: u32,
    pub servers_per_rack: u32,
    pub vms: usize,
    /// The VMs' lease TTL: a VMM pause lasts longer than it plus the pool's grace.
    pub lease_ttl: Duration,
    pub gc_grace: Duration,
}

/// The faults of one seed, in start order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

/// Draws `count` faults of `kinds` over `span` for `shape` from `seed`.
pub fn draw(seed: u64, count: usize, span: Duration, kinds: &[Kind], shape: Shape) -> Schedule {
    let mut rng = SplitMix64::new(seed);
    let span_ms = span.as_millis().max(1) as u64;
    let mut faults: Vec<Fault> = (0..count)
        .map(|_| {
            let kind = kinds[rng.below(kinds.len() as u64) as usize];
            let at = Duration::from_millis(rng.below(span_ms));
            let server = |rng: &mut SplitMix64| Target::Server {
                rack: 1 + rng.below(u64::from(shape.racks)) as u32,
                index: 1 + rng.below(u64::from(shape.servers_per_rack)) as u32,
            };
            let (target, lasts) = match kind {
                Kind::EtcdPause | Kind::EtcdRestart => (Target::Etcd, millis(&mut rng, 500, 8_000)),
                Kind::Partition => (
                    Target::Rack(1 + rng.below(u64::from(shape.racks)) as u32),
                    millis(&mut rng, 500, 8_000),
                ),
                Kind::ServerPause => (server(&mut rng), millis(&mut rng, 500, 8_000)),
                Kind::ServerKill | Kind::ServerRestartEmpty | Kind::ServerRestartSameId => {
                    (server(&mut rng), Duration::ZERO)
                }
                Kind::Drain => (server(&mut rng), Duration::ZERO),
                Kind::VmmPause => (
                    Target::Vm(rng.below(shape.vms as u64) as usize),
                    // Past the lease and the grace: the pool reclaims the VM meanwhile.
                    shape.lease_ttl + shape.gc_grace + millis(&mut rng, 1_000, 3_000),
                ),
                Kind::VmmKill => (
                    Target::Vm(rng.below(shape.vms as u64) as usize),
                    Duration::ZERO,
                ),
                Kind::Rebalance => (Target::Pool, Duration::ZERO),
            };
            Fault {
                kind,
                target,
                at,
                lasts,
            }
        })
        .collect();
    faults.sort_by_key(|f| f.at);
    Schedule { seed, faults }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {}: {} fault(s)", self.seed, self.faults.len())?;
        for x in &self.faults {
            write!(
                f,
                "  t+{:>6.2}s  {:<23} {:<8}",
                x.at.as_secs_f64(),
                x.kind.name(),
                x.target.to_string()
            )?;
            if x.lasts > Duration::ZERO {
                write!(f, " for {:.2}s", x.lasts.as_secs_f64())?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            racks: 3,
            servers_per_rack: 2,
            vms: 3,
            lease_ttl: Duration::from_secs(2),
            gc_grace: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_seed_always_draws_the_same_schedule_and_another_seed_another() {
        let span = Duration::from_secs(10);
        let a = draw(7, 12, span, &Kind::ALL, shape());
        assert_eq!(a, draw(7, 12, span, &Kind::ALL, shape()));
        assert_ne!(a, draw(8, 12, span, &Kind::ALL, shape()));
        // The text form is what the logs keep: it must be stable too.
        assert_eq!(
            a.to_string(),
            draw(7, 12, span, &Kind::ALL, shape()).to_string()
        );
    }

    #[test]
    fn faults_start_within_the_span_hit_existing_targets_and_come_in_order() {
        let span = Duration::from_secs(10);
        for seed in 0..200 {
            let s = draw(seed, 8, span, &Kind::ALL, shape());
            assert_eq!(s.faults.len(), 8);
            assert!(s.faults.windows(2).all(|w| w[0].at <= w[1].at));
            for f in &s.faults {
                assert!(f.at < span, "{s}");
                match &f.target {
                    Target::Rack(k) => assert!((1..=3).contains(k)),
                    Target::Server { rack, index } => {
                        assert!((1..=3).contains(rack) && (1..=2).contains(index))
                    }
                    Target::Vm(i) => assert!(*i < 3),
                    Target::Etcd | Target::Pool => {}
                }
                if f.kind == Kind::VmmPause {
                    assert!(f.lasts > Duration::from_secs(7), "past lease + grace: {s}");
                }
            }
        }
    }

    #[test]
    fn only_the_kinds_asked_for_are_drawn_and_every_kind_is_reachable() {
        let span = Duration::from_secs(10);
        let s = draw(3, 50, span, &[Kind::Drain, Kind::EtcdPause], shape());
        assert!(s
            .faults
            .iter()
            .all(|f| matches!(f.kind, Kind::Drain | Kind::EtcdPause)));
        let mut seen: Vec<Kind> = (0..50)
            .flat_map(|seed| draw(seed, 10, span, &Kind::ALL, shape()).faults)
            .map(|f| f.kind)
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen, Kind::ALL.to_vec());
    }

    #[test]
    fn kind_names_parse_back() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse("nosuch"), None);
    }
}
