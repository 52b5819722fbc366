//! Response bodies: `vm.info`, `vmm.ping`, and `vm.counters` (Cloud Hypervisor's shape: groups
//! of named integer counters).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use crate::create::CreateSpec;

/// The VM's state as `vm.info` reports it (Cloud Hypervisor's `VmState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum VmState {
    /// Created (or shut down through `vm.shutdown`): configured, not running.
    Created,
    /// The vCPUs run the guest.
    Running,
    /// Every vCPU is parked.
    Paused,
    /// The guest stopped by itself (it powered off, crashed, or its memory was lost); it can
    /// be booted again.
    Shutdown,
}

/// The `vm.info` body.
pub fn vm_info(spec: &CreateSpec, pty: Option<&Path>, state: VmState) -> Value {
    json!({
        "config": spec.config_json(pty),
        "state": state,
        "memory_actual_size": spec.memory,
    })
}

/// The `vmm.ping` body: the API level as `version` (what clients compare), farvm's own version
/// as `build_version`.
pub fn vmm_ping(farvm_version: &str, pid: u32) -> Value {
    json!({
        "version": crate::API_LEVEL,
        "build_version": format!("farvm {farvm_version}"),
        "pid": pid,
        "features": [],
    })
}

/// The `vm.counters` body: counter groups, each a map of names to integers.
pub type Counters = BTreeMap<String, BTreeMap<String, u64>>;

/// Flattens a JSON value into one counter group: nested objects' keys are joined with `.`,
/// array elements get their index, booleans count as 0/1, fractions become parts per million
/// (`NAME_ppm`), and strings are left out (counters are numbers).
pub fn flatten_into(group: &mut BTreeMap<String, u64>, prefix: &str, v: &Value) {
    let key = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                flatten_into(group, &key(k), v);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten_into(group, &key(&i.to_string()), v);
            }
        }
        Value::Bool(b) => {
            group.insert(prefix.to_string(), u64::from(*b));
        }
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                group.insert(prefix.to_string(), u);
            } else if let Some(f) = n.as_f64().filter(|f| f.is_finite() && *f >= 0.0) {
                group.insert(format!("{prefix}_ppm"), (f * 1e6).round() as u64);
            }
        }
        Value::Null | Value::String(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_flatten_to_integers() {
        let mut g = BTreeMap::new();
        flatten_into(
            &mut g,
            "",
            &json!({"a": 1, "b": {"c": true, "d": [3, 4]}, "cov": 0.25, "s": "x", "n": null}),
        );
        let want: BTreeMap<String, u64> = [
            ("a", 1),
            ("b.c", 1),
            ("b.d.0", 3),
            ("b.d.1", 4),
            ("cov_ppm", 250_000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(g, want);
    }

    #[test]
    fn ping_reports_the_api_level() {
        let v = vmm_ping("0.1.0", 42);
        assert_eq!(v["version"], crate::API_LEVEL);
        assert_eq!(v["build_version"], "farvm 0.1.0");
        assert_eq!(v["pid"], 42);
    }
}
