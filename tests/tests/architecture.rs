//! ARCHITECTURE.md's crate table against `cargo metadata`: every workspace crate has a row,
//! each row lists exactly the crate's normal dependencies inside the workspace, and those are
//! all in rows above it (dependencies point up the table only).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Each workspace crate's normal dependencies on other workspace crates (`farvm-` stripped).
fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        o.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let packages = m["packages"].as_array().unwrap();
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let short = |n: &str| n.trim_start_matches("farvm-").to_string();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap())
                .filter(|n| names.contains(n))
                .map(short)
                .collect();
            (short(p["name"].as_str().unwrap()), deps)
        })
        .collect()
}

/// The table's rows in order: crate (short name) and the dependencies it lists.
fn table() -> Vec<(String, BTreeSet<String>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|l| l.starts_with("| `farvm-"))
        .map(|l| {
            let cols: Vec<&str> = l.split(" | ").collect();
            let name = cols[0]
                .trim_start_matches("| `farvm-")
                .split('`')
                .next()
                .unwrap()
                .to_string();
            let deps = match cols[1].trim() {
                "—" => BTreeSet::new(),
                list => list.split(", ").map(|d| d.trim().to_string()).collect(),
            };
            (name, deps)
        })
        .collect()
}

#[test]
fn the_crate_table_is_the_dependency_graph() {
    let actual = workspace_deps();
    let rows = table();
    let listed: BTreeSet<&String> = rows.iter().map(|(n, _)| n).collect();
    let crates: BTreeSet<&String> = actual.keys().collect();
    assert_eq!(
        listed, crates,
        "ARCHITECTURE.md's rows vs the workspace's crates"
    );
    let mut above: BTreeSet<&String> = BTreeSet::new();
    for (name, deps) in &rows {
        assert_eq!(
            deps, &actual[name],
            "farvm-{name}: ARCHITECTURE.md vs Cargo.toml"
        );
        for d in deps {
            assert!(
                above.contains(d),
                "farvm-{name} depends on farvm-{d}, which is not above it"
            );
        }
        above.insert(name);
    }
}
