//! Turning `--workload NAME[:key=value,...]` arguments into the test plan's process list.
//!
//! The syntax and the workload table belong to `farvm-workloads` (shared with the guest); this
//! module only places processes on vCPUs (round-robin unless `cpu=` is given) and checks them
//! against the VM.
//!
//! One spec is the VMM's own: `replay:trace=FILE[,records=N,seed=S,passes=P,cpu=C]` reads a
//! page-access trace (farvm's binary or `pid page` text format, zstd or not), turns it into the
//! guest's boot blob (`farvm_workloads::replay`) and becomes one `replay` process per trace
//! process, each with a heap of its footprint (`records=N`: only the first N records).

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

/// The processes of a test plan and the boot blob they need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// One entry per process, in plan order.
    pub workloads: Vec<PlacedWorkload>,
    /// The boot blob (a `replay:` spec's trace; empty without one).
    pub blob: Vec<u8>,
}

/// [`plan`] without the boot blob: for callers that only look at the processes (a VM booted
/// from these without the blob fails its `replay` processes with "replay blob missing").
pub fn place(specs: &[String], vcpus: u32) -> Result<Vec<PlacedWorkload>, String> {
    plan(specs, vcpus).map(|p| p.workloads)
}

/// Parses every spec (expanding a `replay:trace=FILE` spec into one process per trace
/// process and the boot blob) and assigns CPUs: explicit `cpu=` is kept (and must be <
/// `vcpus`), the others go round-robin over the vCPUs in argument order.
pub fn plan(specs: &[String], vcpus: u32) -> Result<Placement, String> {
    let mut blob = Vec::new();
    let mut expanded = Vec::with_capacity(specs.len());
    for s in specs {
        match s.strip_prefix("replay:") {
            Some(rest) if rest.contains("trace=") => {
                if !blob.is_empty() {
                    return Err(format!(
                        "--workload {s}: one replay trace per VM (the boot blob holds one)"
                    ));
                }
                let (b, procs) = replay_specs(rest).map_err(|e| format!("--workload {s}: {e}"))?;
                blob = b;
                expanded.extend(procs);
            }
            _ => expanded.push(s.clone()),
        }
    }
    Ok(Placement {
        workloads: place_specs(&expanded, vcpus)?,
        blob,
    })
}

/// `trace=FILE[,records=N,...]` → the boot blob and one `replay:section=i,ws=...` spec per
/// trace process (the other keys passed through).
fn replay_specs(rest: &str) -> Result<(Vec<u8>, Vec<String>), String> {
    let mut file = None;
    let mut records = None;
    let mut keep = Vec::new();
    for kv in rest.split(',').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("trace", f)) => file = Some(f),
            Some(("records", n)) => {
                records = Some(
                    farvm_units::parse_size(n)
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("records={n} is not a positive number"))?,
                )
            }
            Some(("section" | "ws", _)) => {
                return Err(format!(
                    "`{kv}`: the VMM sets section and ws from the trace"
                ))
            }
            _ => keep.push(kv),
        }
    }
    let file = file.ok_or("replay needs trace=FILE")?;
    let f = std::fs::File::open(file).map_err(|e| format!("trace {file}: {e}"))?;
    let trace = farvm_prefetch::trace::read_trace(f).map_err(|e| format!("trace {file}: {e}"))?;
    let n = records.map_or(trace.records.len(), |r| {
        (r as usize).min(trace.records.len())
    });
    let (blob, _keys) = farvm_workloads::replay::encode(
        trace.records[..n].iter().map(|r| (r.key, r.page, r.write)),
    )
    .map_err(|e| format!("trace {file}: {e}"))?;
    let sections = farvm_workloads::replay::sections(&blob).unwrap_or(0);
    let mut specs = Vec::new();
    for i in 0..sections {
        let fp = farvm_workloads::replay::section(&blob, i).map_or(0, |s| s.footprint_pages);
        let mut spec = format!("replay:section={i},ws={}", fp * 4096);
        for kv in &keep {
            spec.push(',');
            spec.push_str(kv);
        }
        specs.push(spec);
    }
    Ok((blob, specs))
}

fn place_specs(specs: &[String], vcpus: u32) -> Result<Vec<PlacedWorkload>, String> {
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
        let e = place(&["replay:trace=/nonexistent/t".to_string()], 1).unwrap_err();
        assert!(e.contains("/nonexistent/t"), "{e}");
        let e = place(&["replay:trace=x,ws=1M".to_string()], 1).unwrap_err();
        assert!(e.contains("sets section and ws"), "{e}");
    }

    #[test]
    fn a_replay_trace_becomes_one_process_per_trace_process_and_the_blob() {
        let path = std::env::temp_dir().join(format!("farvm-replay-{}.txt", std::process::id()));
        // `pid page` text: pid 5 touches 3 pages, pid 9 two.
        std::fs::write(&path, "5 100\n9 7\n5 101\n5 100\n9 8\n5 300\n").unwrap();
        let spec = format!("replay:trace={},seed=4", path.display());
        let p = plan(&[spec.clone(), "seq:ws=1M".into()], 2).unwrap();
        let short = plan(&[format!("{spec},records=2")], 2).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(p.workloads.len(), 3);
        let (a, b) = (p.workloads[0].process_spec(), p.workloads[1].process_spec());
        assert_eq!(
            (a.params[0], a.ws_bytes, a.seed, a.cpu),
            (0, 3 * 4096, 4, 0)
        );
        assert_eq!((b.params[0], b.ws_bytes, b.cpu), (1, 2 * 4096, 1));
        assert_eq!(p.workloads[2].name(), "seq");
        let s0 = farvm_workloads::replay::section(&p.blob, 0).unwrap();
        assert_eq!((s0.len(), s0.footprint_pages), (4, 3));
        assert_eq!(farvm_workloads::replay::sections(&short.blob), Some(2));
        assert_eq!(short.workloads[0].process_spec().ws_bytes, 4096);
    }
}
