//! `--event-monitor` records, as Cloud Hypervisor writes them: one pretty-printed JSON object
//! per event followed by an empty line, e.g.
//!
//! ```json
//! {
//!   "timestamp": { "secs": 0, "nanos": 1200 },
//!   "source": "vm",
//!   "event": "booted",
//!   "properties": null
//! }
//! ```
//!
//! libvirt's ch driver (releases that pass `--event-monitor`) marks the domain shut off on
//! `vm`/`shutdown` and `vmm`/`shutdown`.

use std::time::Duration;

use serde::Serialize;

/// Where an event comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Vmm,
    Vm,
}

#[derive(Serialize)]
struct Record<'a> {
    timestamp: Duration,
    source: Source,
    event: &'a str,
    properties: Option<()>,
}

/// The record of `event` from `source`, `since_start` after the VMM started, with its trailing
/// blank line.
pub fn record(since_start: Duration, source: Source, event: &str) -> String {
    let r = Record {
        timestamp: since_start,
        source,
        event,
        properties: None,
    };
    let mut s = serde_json::to_string_pretty(&r).unwrap_or_default();
    s.push_str("\n\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_cloud_hypervisors() {
        let r = record(Duration::new(3, 5), Source::Vm, "booted");
        assert!(r.ends_with("}\n\n"), "{r:?}");
        let v: serde_json::Value = serde_json::from_str(r.trim()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"timestamp": {"secs": 3, "nanos": 5}, "source": "vm",
                "event": "booted", "properties": null})
        );
    }
}
