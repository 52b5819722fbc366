//! The human-readable paging summary of a VM with remote memory, shared by `farvm stats` and
//! the end of `farvm run`. Input is the JSON form of `farvm_vmm::remote::RemoteStats`.

use serde_json::Value;

fn us(v: &Value) -> String {
    match v.as_f64() {
        Some(ns) if ns > 0.0 => format!("{:.1}", ns / 1e3),
        _ => "-".into(),
    }
}

/// Renders the summary (several lines, each ending in a newline).
pub fn render(p: &Value) -> String {
    use std::fmt::Write;
    let e = &p["engine"];
    let c = &e["counters"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    let mut s = String::new();
    let pages = e["total_pages"].as_u64().unwrap_or(0);
    let budget = e["budget_pages"].as_u64().unwrap_or(0);
    let _ = writeln!(
        s,
        "paging: prefetcher {}, local budget {} of {} pages ({:.0}%), resident {}, stage-2 pre-fault {}",
        e["prefetcher"].as_str().unwrap_or("?"),
        budget,
        pages,
        if pages > 0 { 100.0 * budget as f64 / pages as f64 } else { 0.0 },
        e["resident_pages"].as_u64().unwrap_or(0),
        p["stage2_prefault"].as_str().unwrap_or(
            if e["stage2_prefault"].as_bool() == Some(true) { "on" } else { "unsupported" }
        ),
    );
    let _ = writeln!(
        s,
        "  faults: demand {} | zero-fill {} | dedup waits {} | evicting waits {} | hot refaults {}",
        n("demand_faults"),
        n("zero_fills"),
        n("dedup_waits"),
        n("evicting_waits"),
        n("hot_refaults")
    );
    let _ = writeln!(
        s,
        "  remote: reads demand {} prefetch {} | writes {} | bytes in {} out {} | errors {}",
        n("remote_reads_demand"),
        n("remote_reads_prefetch"),
        n("remote_writes"),
        n("bytes_read"),
        n("bytes_written"),
        n("store_errors")
    );
    let _ = writeln!(
        s,
        "  prefetch: issued {} injected {} (stage-2 pre-faulted {}) staged {} | hits marker {} late {} probe {}/{} | wasted {} | accuracy {:.3} coverage {:.3}",
        n("prefetch_issued"),
        n("prefetch_injected"),
        n("prefault_pages"),
        n("prefetch_staged"),
        n("prefetch_marker_hits"),
        n("prefetch_late_hits"),
        n("probe_hits"),
        n("probe_staged"),
        n("prefetch_wasted"),
        e["accuracy"].as_f64().unwrap_or(0.0),
        e["coverage"].as_f64().unwrap_or(0.0)
    );
    if n("page_table_walks") > 0 {
        let _ = writeln!(
            s,
            "  page space: virtual | faults seen virtual {} physical {} | page-table walks {} | candidates unmapped {}",
            n("faults_seen_virtual"),
            n("faults_seen_physical"),
            n("page_table_walks"),
            n("candidates_unmapped")
        );
    }
    let _ = writeln!(
        s,
        "  evictions {} (clean {} dirty {} zero {} rescued {} late writes {} vanished {}) in {} rounds",
        n("evictions"),
        n("evict_clean"),
        n("evict_dirty"),
        n("evict_zero"),
        n("evict_rescued"),
        n("evict_late_writes"),
        n("evict_vanished"),
        n("evict_rounds")
    );
    for (name, k) in [
        ("fault service", "fault_service"),
        ("store read", "store_read"),
        ("install", "install"),
        ("vCPU wake", "wake"),
        ("zero fill", "zero_fill"),
        ("timeliness", "prefetch_timeliness"),
    ] {
        let h = &e[k];
        if h["count"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let _ = writeln!(
            s,
            "  {name:<14} µs: p50 {} p99 {} p99.9 {} max {} (n={})",
            us(&h["p50"]),
            us(&h["p99"]),
            us(&h["p999"]),
            us(&h["max"]),
            h["count"]
        );
    }
    let r = &p["remote"];
    if !r.is_null() {
        let _ =
            writeln!(
            s,
            "  memservers: {}{} | replication {} | taken out of service {} (rejoined {}) | read \
             fail-overs {} | degraded slabs {} (suspended {}) | pages sealed: {} (unauthentic {}){}",
            r["servers"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
            if r["embedded"].as_bool() == Some(true) { " (embedded)" } else { "" },
            r["replication"],
            r["dead_servers"],
            r["rejoined_servers"],
            r["read_failovers"],
            r["degraded_slabs"],
            r["suspended_slabs"],
            if r["page_encryption"].as_bool() == Some(true) { "yes" } else { "no" },
            r["remote_unauthentic"],
            key_line(r)
        );
    }
    s
}

/// The page key part of the `remote` line: the current key id, and a rotation's progress.
fn key_line(r: &Value) -> String {
    let Some(current) = r["key_id"].as_str() else {
        return String::new();
    };
    match r["previous_key_id"].as_str() {
        Some(previous) => format!(
            " | key {current}, rotating from {previous}: {} pages to re-seal",
            r["pages_to_reseal"]
        ),
        None => format!(
            " | key {current} ({} rotations, {} pages re-sealed)",
            r["key_rotations"], r["resealed_pages"]
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The `remote` line names the key, and while a rotation runs the key it rotates from and
    /// the pages left; without sealing it says nothing of keys.
    #[test]
    fn the_key_part_shows_a_rotation_in_progress() {
        let rotating = json!({"key_id": "b80ddcb2", "previous_key_id": "5fa3df84",
                              "pages_to_reseal": 1200});
        assert_eq!(
            key_line(&rotating),
            " | key b80ddcb2, rotating from 5fa3df84: 1200 pages to re-seal"
        );
        let settled = json!({"key_id": "b80ddcb2", "previous_key_id": null,
                             "key_rotations": 1, "resealed_pages": 22106});
        assert_eq!(
            key_line(&settled),
            " | key b80ddcb2 (1 rotations, 22106 pages re-sealed)"
        );
        assert_eq!(key_line(&json!({"key_id": null})), "");
    }
}
