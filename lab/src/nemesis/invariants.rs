//! The invariants a schedule must keep, checked once the faults are healed and the quiet
//! period is over:
//! 1. every VM ended with its workload's native checksum or a documented exit status;
//! 2. no leak: with every VM gone, no server stores a page, and the pool lists no VM, no
//!    namespace awaiting collection and no reservation;
//! 3. the pool's status agrees with the servers: it lists exactly the servers running, each
//!    with the bytes that server itself says it stores;
//! 4. nothing hung: every VM and every drain or rebalance ended within its bound.
//!
//! 2 and 3 are polled from the moment the last VM ended until they hold or the quiet period and
//! the settle bound have passed (the servers drop a dead VM's namespace on their own schedule);
//! only what still fails then is a violation. With no VM or command left nothing can store a
//! page, so once they hold they keep holding.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use farvm_pool::ServerHealth;

use super::cluster::{servers, Cluster};
use super::vms::Ending;

/// Bytes of a page, the servers' unit.
const PAGE: u64 = 4096;

/// Which invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    Outcome = 1,
    Leak = 2,
    Agreement = 3,
    Hang = 4,
}

impl Invariant {
    pub fn name(self) -> &'static str {
        match self {
            Invariant::Outcome => "1 (VM outcome)",
            Invariant::Leak => "2 (no leak)",
            Invariant::Agreement => "3 (pool status agrees with the servers)",
            Invariant::Hang => "4 (nothing hung)",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: Invariant,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {}: {}", self.invariant.name(), self.what)
    }
}

fn v(invariant: Invariant, what: String) -> Violation {
    Violation { invariant, what }
}

/// Invariants 1 and 4 for the VMs, and 4 for the commands the faults started.
pub fn endings(endings: &[Ending], hung_commands: &[String]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (i, e) in endings.iter().enumerate() {
        match e {
            Ending::Hung => out.push(v(
                Invariant::Hang,
                format!("vm{i} was still running at its bound (killed; see vm{i}.log)"),
            )),
            Ending::Wrong(why) => out.push(v(Invariant::Outcome, format!("vm{i}: {why}"))),
            _ => {}
        }
    }
    for c in hung_commands {
        out.push(v(
            Invariant::Hang,
            format!("{c} did not end within its bound"),
        ));
    }
    out
}

/// Invariants 2 and 3, polled until they hold or `bound` passes. `running` lists each
/// running server's label (`rK-msI`) and pool id.
pub fn storage(c: &Cluster, running: &[(String, String)], bound: Duration) -> Vec<Violation> {
    let deadline = Instant::now() + bound;
    loop {
        let found = storage_once(c, running);
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn storage_once(c: &Cluster, running: &[(String, String)]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut stored = Vec::new();
    for (label, id) in running {
        let (rack, index) = parse_label(label);
        match c.pages_stored(rack, index) {
            Ok(0) => stored.push((id.clone(), 0)),
            Ok(n) => {
                out.push(v(
                    Invariant::Leak,
                    format!("{id} stores {n} page(s) after every VM ended"),
                ));
                stored.push((id.clone(), n));
            }
            Err(e) => out.push(v(
                Invariant::Agreement,
                format!("{id} does not say what it stores: {e:#}"),
            )),
        }
    }
    let Some(s) = c.status() else {
        out.push(v(
            Invariant::Agreement,
            "farvm-pool status --json does not answer".into(),
        ));
        return out;
    };
    if !s.vms.is_empty() {
        let names: Vec<&str> = s.vms.iter().map(|x| x.name.as_str()).collect();
        out.push(v(
            Invariant::Leak,
            format!(
                "the pool still lists VMs after every VM ended: {}",
                names.join(", ")
            ),
        ));
    }
    if !s.orphans.is_empty() {
        let list: Vec<String> = s
            .orphans
            .iter()
            .map(|o| format!("{:#x} on {}", o.namespace, o.server))
            .collect();
        out.push(v(
            Invariant::Leak,
            format!("namespaces still await collection: {}", list.join(", ")),
        ));
    }
    for (id, pages) in &stored {
        let Some(x) = servers(&s).find(|x| x.id.as_str() == id) else {
            out.push(v(
                Invariant::Agreement,
                format!("{id} runs but the pool does not list it"),
            ));
            continue;
        };
        if x.used_bytes != pages * PAGE {
            out.push(v(
                Invariant::Agreement,
                format!(
                    "the pool says {id} stores {} bytes, the server says {} ({pages} pages)",
                    x.used_bytes,
                    pages * PAGE
                ),
            ));
        }
        if x.reserved_bytes != 0 {
            out.push(v(
                Invariant::Leak,
                format!(
                    "{id} still has {} bytes reserved with no VM left",
                    x.reserved_bytes
                ),
            ));
        }
        if x.health != ServerHealth::Up {
            out.push(v(
                Invariant::Agreement,
                format!(
                    "{id} is {} after every drain mark was taken off",
                    x.health.as_str()
                ),
            ));
        }
    }
    let expected: BTreeSet<&str> = running.iter().map(|(_, id)| id.as_str()).collect();
    for x in servers(&s).filter(|x| !expected.contains(x.id.as_str())) {
        out.push(v(
            Invariant::Agreement,
            format!("the pool lists {}, which is not running", x.id),
        ));
    }
    out
}

/// `rK-msI` → (K, I); labels come from the nemesis's own list.
fn parse_label(label: &str) -> (u32, u32) {
    let (r, m) = label.split_once("-ms").unwrap_or(("r0", "0"));
    (
        r.trim_start_matches('r').parse().unwrap_or(0),
        m.parse().unwrap_or(0),
    )
}
