//! The host config file: values, defaults per domain, and errors naming file and line.

use std::path::Path;

use farvm_vmconfig::{ConfigError, HostConfig, LocalShare, PageSpace, Servers};

fn parse(text: &str) -> Result<HostConfig, ConfigError> {
    HostConfig::parse(text, Path::new("/etc/farvm/farvm.toml"))
}

fn err(text: &str) -> (u32, String) {
    match parse(text) {
        Err(ConfigError::Host {
            path,
            line,
            message,
        }) => {
            assert_eq!(path, Path::new("/etc/farvm/farvm.toml"));
            (line, message)
        }
        other => panic!("expected a host-config error, got {other:?}"),
    }
}

const FULL: &str = r#"
[defaults]
memservers = ["10.0.0.5:7070", "10.0.0.6:7070"]
local_memory = "50%"
prefetcher = "leap+stream"
replicas = 2
token_file = "/etc/farvm/tokens/default"
memory_key_file = "/etc/farvm/keys/default"
migration_key_file = "/etc/farvm/keys/migration"
snapshot_key_file = "/etc/farvm/keys/snapshot"
page_space = "virtual"
probe_every = 64
metrics = "127.0.0.1:9300"

[domain."web-1"]
local_memory = "25%"
page_space = "physical"

[domain.batch]
pool = { name = "rack-1", endpoints = ["http://10.0.0.2:2379"] }
local_only = false

[domain.tiny]
memservers = []
local_memory = "64MiB"
"#;

#[test]
fn sections_fall_back_to_defaults() {
    let h = parse(FULL).unwrap();
    let d = h.for_domain("no-such-domain");
    assert_eq!(d, h.defaults);
    assert_eq!(
        d.servers,
        Some(Servers::Memservers(vec![
            "10.0.0.5:7070".into(),
            "10.0.0.6:7070".into()
        ]))
    );
    assert_eq!(d.replicas, Some(2));
    assert_eq!(d.probe_every, Some(64));
    let web = h.for_domain("web-1");
    assert_eq!(web.local_memory, Some(LocalShare::Percent(25.0)));
    assert_eq!(web.page_space, Some(PageSpace::Physical));
    assert_eq!(
        web.servers, d.servers,
        "not set in the section: from defaults"
    );
    assert_eq!(web.token_file, d.token_file);
    assert_eq!(
        web.memory_key_file.as_deref(),
        Some(Path::new("/etc/farvm/keys/default"))
    );
    assert_eq!(
        web.migration_key_file.as_deref(),
        Some(Path::new("/etc/farvm/keys/migration"))
    );
    assert_eq!(
        web.snapshot_key_file.as_deref(),
        Some(Path::new("/etc/farvm/keys/snapshot"))
    );
    let batch = h.for_domain("batch");
    assert!(
        matches!(batch.servers, Some(Servers::Pool(ref p)) if p.name.as_deref() == Some("rack-1"))
    );
    assert_eq!(batch.local_only, Some(false));
    let tiny = h.for_domain("tiny");
    assert_eq!(tiny.servers, Some(Servers::Embedded));
    assert_eq!(tiny.local_memory, Some(LocalShare::Bytes(64 << 20)));
}

#[test]
fn empty_file_is_all_defaults() {
    let h = parse("").unwrap();
    assert_eq!(h.for_domain("x"), Default::default());
}

#[test]
fn unknown_keys_name_file_and_line() {
    let (line, msg) = err("[defaults]\nlocal_memory = \"50%\"\nprefetch = \"none\"\n");
    assert_eq!(line, 3, "{msg}");
    assert!(msg.contains("prefetch"), "{msg}");
    let (line, msg) = err("[defaults]\n\n[domain.\"web-1\"]\nreplica = 2\n");
    assert_eq!(line, 4, "{msg}");
    assert!(msg.contains("replica"), "{msg}");
    let (line, msg) = err("[default]\nreplicas = 2\n");
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("default"), "{msg}");
    let e = parse("[defaults]\nfoo = 1\n").unwrap_err().to_string();
    assert!(e.starts_with("/etc/farvm/farvm.toml:2: "), "{e}");
}

#[test]
fn bad_values_name_the_line() {
    for (text, line, needle) in [
        (
            "[defaults]\nlocal_memory = \"lots\"\n",
            2,
            "expected all, N% or a size",
        ),
        (
            "[defaults]\nmemservers = [\"a:1\",\n  \"b\"]\n",
            3,
            "HOST:PORT",
        ),
        (
            "[defaults]\nprefetcher = \"psychic\"\n",
            2,
            "unknown prefetcher",
        ),
        ("\n[domain.x]\nreplicas = 0\n", 3, "at least 1"),
        (
            "[defaults]\npage_space = \"both\"\n",
            2,
            "virtual or physical",
        ),
        (
            "[defaults]\nmetrics = \"localhost\"\n",
            2,
            "IP address and port",
        ),
        ("[defaults]\nreplicas = \"two\"\n", 2, "expected u32"),
        (
            "[defaults]\nmemservers = [\"a:1\"]\npool = { endpoints = [\"e\"] }\n",
            3,
            "not both",
        ),
        (
            "[defaults]\npool = { endpoints = [] }\n",
            2,
            "must not be empty",
        ),
        (
            "[defaults]\npool = { endpoints = [\"e\"], nam = \"x\" }\n",
            2,
            "nam",
        ),
        ("[defaults\n", 1, ""),
    ] {
        let (l, msg) = err(text);
        assert_eq!(l, line, "{text}: {msg}");
        assert!(msg.contains(needle), "{text}: {msg}");
    }
}

#[test]
fn load_reads_files_and_names_missing_ones() {
    let dir = std::env::temp_dir().join(format!("farvm-vmconfig-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("farvm.toml");
    std::fs::write(&p, FULL).unwrap();
    let h = HostConfig::load(&p).unwrap();
    assert_eq!(h.path.as_deref(), Some(p.as_path()));
    assert_eq!(h.domains.len(), 3);
    std::fs::write(&p, "[defaults]\nbogus = 1\n").unwrap();
    let e = HostConfig::load(&p).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:2: ", p.display())), "{e}");
    let missing = dir.join("missing.toml");
    let e = HostConfig::load(&missing).unwrap_err().to_string();
    assert!(
        e.contains("cannot read") && e.contains("missing.toml"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
