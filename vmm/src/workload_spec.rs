//! Turning `--workload NAME[:key=value,...]` arguments into the test plan's process list.
//!
//! The syntax and the workload table belong to `farvm-workloads` (shared with the guest); this
//! module only places processes on vCPUs (round-robin unless `cpu=` is given) and checks them
//! against the VM.

use farvm_guest_agent::boot::{ProcessSpec, MAX_PROCS};
use farvm_workloads::{parse_spec, Spec};

/// One parsed `--workload` with its placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacedWorkload {
    /// The parsed spec.
    pub spec: Spec,
    /// The vCPU it runs on (given with `cpu=`, else round-robin).
    pub cpu: u32,
}

impl PlacedWorkload {
    /// The `ProcessSpec` written into BootInfo.
    pub fn process_spec(&self) -> ProcessSpec {
        ProcessSpec {
            cpu: self.cpu,
            workload: self.spec.workload.id,
            ws_bytes: self.spec.ws_bytes,
            seed: self.spec.seed,
            params: self.spec.params,
        }
    }

    /// The CLI name of the workload.
    pub fn name(&self) -> &'static str {
        self.spec.workload.name
    }
}

/// Parses every spec and assigns CPUs: explicit `cpu=` is kept (and must be < `vcpus`), the
/// others go round-robin over the vCPUs in argument order.
pub fn place(specs: &[String], vcpus: u32) -> Result<Vec<PlacedWorkload>, String> {
    if specs.len() > MAX_PROCS {
        return Err(format!(
            "{} workloads given; the test guest runs at most {MAX_PROCS} processes",
            specs.len()
        ));
    }
    let vcpus = vcpus.max(1);
    let mut out = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let spec = parse_spec(s).map_err(|e| format!("--workload {s}: {e}"))?;
        let cpu = match spec.cpu {
            Some(c) if c >= vcpus => {
                return Err(format!(
                    "--workload {s}: cpu={c} but the VM has {vcpus} vCPU(s) (0..{})",
                    vcpus - 1
                ))
            }
            Some(c) => c,
            None => i as u32 % vcpus,
        };
        out.push(PlacedWorkload { spec, cpu });
    }
    Ok(out)
}

/// Name of a workload id (for reports).
pub fn workload_name(id: u32) -> &'static str {
    farvm_workloads::find_by_id(id).map_or("?", |w| w.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_and_explicit_cpu() {
        let specs: Vec<String> = ["seq:ws=64M", "kv:cpu=0", "random", "quicksort:seed=9"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = place(&specs, 2).unwrap();
        assert_eq!(
            p.iter().map(|w| w.cpu).collect::<Vec<_>>(),
            vec![0, 0, 0, 1]
        );
        assert_eq!(p[0].process_spec().ws_bytes, 64 << 20);
        assert_eq!(p[3].process_spec().seed, 9);
        assert_eq!(p[1].name(), "kv");
    }

    #[test]
    fn errors_are_clear() {
        let e = place(&["nosuch".to_string()], 1).unwrap_err();
        assert!(e.contains("unknown workload"), "{e}");
        let e = place(&["seq:cpu=3".to_string()], 2).unwrap_err();
        assert!(e.contains("cpu=3"), "{e}");
        let e = place(&["seq:bogus=1".to_string()], 2).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }
}
