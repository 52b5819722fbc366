//! The VMM crate's module layering, read from its sources: the top-level modules of
//! `vmm/src` import each other without a loop (a `crate::x` path in code, test modules and
//! comments aside, is an edge), and nothing under `vstate/` or `devices/` names `crate::vm` —
//! the vCPUs reach the VM through `VcpuExits`, the devices through the `OutcomeLatch`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn vmm_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../vmm/src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None`: the crate roots).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// The file's code: up to its test module, without comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules named by `crate::x` paths in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(i, _)| {
            // Not `farvm_x_crate::` or `$crate::`.
            !code[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        })
        .map(|(i, m)| {
            code[i + m.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = vmm_src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(m) = top_module(&src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let deps = g.entry(m.clone()).or_default();
        deps.extend(crate_paths(&code(&text)).into_iter().filter(|d| *d != m));
    }
    g
}

/// A loop in `g`, as the path that closes it.
fn find_loop(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut l = path[i..].to_vec();
            l.push(n.to_string());
            return Some(l);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(l) = visit(g, d, path, done) {
                return Some(l);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

#[test]
fn the_vmm_modules_import_each_other_without_a_loop() {
    let g = graph();
    assert!(g.len() > 10, "read too few modules: {g:?}");
    assert!(
        g["vm"].contains("vstate") && g["builder"].contains("vm"),
        "the reader misses imports: {g:?}"
    );
    if let Some(l) = find_loop(&g) {
        panic!("the VMM's modules import in a loop: {}", l.join(" -> "));
    }
}

#[test]
fn vcpus_and_devices_do_not_reach_up_into_the_vm() {
    let src = vmm_src();
    let mut files = Vec::new();
    rust_files(&src.join("vstate"), &mut files);
    rust_files(&src.join("devices"), &mut files);
    assert!(files.len() > 8);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !code.contains("crate::vm::") && !code.contains("crate::vm;"),
                "{}:{}: {line}",
                f.display(),
                n + 1
            );
        }
    }
}

#[test]
fn a_loop_is_found() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(find_loop(&g).unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(
        crate_paths("use crate::vm::{A}; farvm_crate::x; crate::boot::y"),
        ["boot", "vm"].into_iter().map(String::from).collect()
    );
}
