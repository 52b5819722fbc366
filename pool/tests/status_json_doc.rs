//! docs/pool.md lists every field of `farvm pool status --json`: its table must name exactly
//! the public fields of the structs the JSON is made of (`src/status.rs`, `Orphan` in
//! `src/gc.rs`; none is renamed or skipped by serde), object by object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `pub name:` fields of `pub struct NAME { ... }` in `src`.
fn fields_of(src: &str, name: &str) -> BTreeSet<String> {
    let start = src
        .find(&format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name}"));
    let body = &src[start..start + src[start..].find("\n}").expect("struct end")];
    assert!(
        !body.contains("#[serde("),
        "{name}: a serde attribute changes its JSON"
    );
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':').map(|(f, _)| f.trim().to_string()))
        .filter(|f| !f.contains(' '))
        .collect()
}

/// Object → fields, from the table after "`farvm pool status --json`" in docs/pool.md.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc = read("../docs/pool.md");
    let start = doc
        .find("**`farvm pool status --json`**")
        .expect("the status JSON section");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| object"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let names = cells[2]
            .split(',')
            .map(|f| f.trim().trim_matches('`').to_string());
        out.entry(cells[1].to_string()).or_default().extend(names);
    }
    out
}

#[test]
fn the_documented_status_fields_are_the_json_fields() {
    let status = read("src/status.rs");
    let gc = read("src/gc.rs");
    let code: BTreeMap<&str, BTreeSet<String>> = [
        ("(top)", fields_of(&status, "PoolStatus")),
        ("rack", fields_of(&status, "RackStatus")),
        ("server", fields_of(&status, "ServerStatus")),
        ("host", fields_of(&status, "HostStatus")),
        ("vm", fields_of(&status, "VmStatus")),
        ("snapshot", fields_of(&status, "SnapshotStatus")),
        ("orphan", fields_of(&gc, "Orphan")),
        ("fleet", fields_of(&status, "FleetStatus")),
    ]
    .into_iter()
    .collect();
    let doc = documented();
    assert_eq!(
        doc.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        code.keys().copied().collect::<BTreeSet<_>>(),
        "objects"
    );
    for (object, fields) in &code {
        assert_eq!(&doc[*object], fields, "the fields of {object}");
    }
}
