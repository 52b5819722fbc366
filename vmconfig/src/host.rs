//! The host config file (TOML; [`DEFAULT_PATH`], or the file named by `$FARVM_CONFIG`): the
//! host's remote-memory defaults and per-domain sections keyed by domain name.
//!
//! ```toml
//! [defaults]
//! memservers = ["10.0.0.5:7070", "10.0.0.6:7070"]   # [] = an embedded server on loopback
//! # pool = { endpoints = ["http://10.0.0.2:2379"] }  (instead of memservers)
//! local_memory = "50%"            # all, N%, or a size (512M, 1GiB, bytes)
//! prefetcher = "leap+stream"
//! replicas = 2
//! token_file = "/etc/farvm/tokens/default"
//! memory_key_file = "/etc/farvm/keys/default"   # the page key, mode 0600 (docs/sealing.md)
//! migration_key_file = "/etc/farvm/keys/migration"  # shared by the hosts a VM migrates between
//! snapshot_key_file = "/etc/farvm/keys/snapshot"  # seals the API's vm.snapshot (docs/sealing.md)
//! page_space = "virtual"          # or physical
//! probe_every = 64
//! metrics = "127.0.0.1:9300"
//! local_only = false
//!
//! [domain."web-1"]
//! local_memory = "25%"
//! ```
//!
//! A domain without a section gets `[defaults]`. An unknown key or a bad value is an error
//! naming the file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::error::ConfigError;
use crate::remote::{
    check_host_port, check_prefetcher, LocalShare, Overrides, PageSpace, Pool, Servers,
};

/// Where the host config file is read from unless `$FARVM_CONFIG` names another.
pub const DEFAULT_PATH: &str = "/etc/farvm/farvm.toml";
/// The environment variable naming the host config file.
pub const ENV_VAR: &str = "FARVM_CONFIG";

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileRaw {
    #[serde(default)]
    defaults: LayerRaw,
    #[serde(default)]
    domain: BTreeMap<String, LayerRaw>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LayerRaw {
    local_only: Option<bool>,
    memservers: Option<Spanned<Vec<Spanned<String>>>>,
    pool: Option<Spanned<PoolRaw>>,
    local_memory: Option<Spanned<String>>,
    prefetcher: Option<Spanned<String>>,
    replicas: Option<Spanned<u32>>,
    token_file: Option<PathBuf>,
    memory_key_file: Option<PathBuf>,
    migration_key_file: Option<PathBuf>,
    snapshot_key_file: Option<PathBuf>,
    page_space: Option<Spanned<String>>,
    probe_every: Option<u32>,
    metrics: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolRaw {
    name: Option<String>,
    endpoints: Vec<Spanned<String>>,
}

/// The host config: defaults and per-domain sections, each a layer of [`Overrides`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostConfig {
    /// The file it was read from (`None`: no file, built-in defaults only).
    pub path: Option<PathBuf>,
    /// The `[defaults]` section: applies to every domain.
    pub defaults: Overrides,
    /// `[domain."NAME"]` sections by domain name.
    pub domains: BTreeMap<String, Overrides>,
}

fn line_of(text: &str, offset: usize) -> u32 {
    let end = offset.min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count() as u32
}

impl HostConfig {
    /// Parses the text of a host config file; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let err = |offset: usize, message: String| ConfigError::Host {
            path: path.to_path_buf(),
            line: line_of(text, offset),
            message,
        };
        let raw: FileRaw = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            err(at, e.message().trim().to_string())
        })?;
        let layer = |raw: LayerRaw, what: &str| -> Result<Overrides, ConfigError> {
            convert(raw).map_err(|(at, m)| err(at, format!("{what}: {m}")))
        };
        let defaults = layer(raw.defaults, "[defaults]")?;
        let mut domains = BTreeMap::new();
        for (name, l) in raw.domain {
            let o = layer(l, &format!("[domain.\"{name}\"]"))?;
            domains.insert(name, o);
        }
        Ok(HostConfig {
            path: Some(path.to_path_buf()),
            defaults,
            domains,
        })
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// The host config farvm uses: the file `$FARVM_CONFIG` names (which must exist), else
    /// [`DEFAULT_PATH`] if it exists, else no file (built-in defaults only).
    pub fn load_default() -> Result<Self, ConfigError> {
        match std::env::var_os(ENV_VAR) {
            Some(p) if !p.is_empty() => Self::load(Path::new(&p)),
            _ if Path::new(DEFAULT_PATH).exists() => Self::load(Path::new(DEFAULT_PATH)),
            _ => Ok(HostConfig::default()),
        }
    }

    /// The host's settings for domain `name`: its section over the defaults.
    pub fn for_domain(&self, name: &str) -> Overrides {
        match self.domains.get(name) {
            Some(section) => section.or(&self.defaults),
            None => self.defaults.clone(),
        }
    }
}

/// Validates one layer; errors carry the byte offset of the bad value.
fn convert(raw: LayerRaw) -> Result<Overrides, (usize, String)> {
    let at = |s: &Spanned<String>, r: Result<(), String>| r.map_err(|e| (s.span().start, e));
    let mut o = Overrides {
        local_only: raw.local_only,
        token_file: raw.token_file,
        memory_key_file: raw.memory_key_file,
        migration_key_file: raw.migration_key_file,
        snapshot_key_file: raw.snapshot_key_file,
        probe_every: raw.probe_every,
        ..Default::default()
    };
    o.servers = match (raw.memservers, raw.pool) {
        (Some(m), Some(p)) => {
            let start = m.span().start.max(p.span().start);
            return Err((
                start,
                "give memory servers either as memservers or as a pool, not both".into(),
            ));
        }
        (Some(m), None) => {
            let list = m.into_inner();
            for a in &list {
                at(a, check_host_port(a.get_ref()))?;
            }
            if list.is_empty() {
                Some(Servers::Embedded)
            } else {
                Some(Servers::Memservers(
                    list.into_iter().map(Spanned::into_inner).collect(),
                ))
            }
        }
        (None, Some(p)) => {
            let span = p.span();
            let p = p.into_inner();
            if p.endpoints.is_empty() {
                return Err((span.start, "pool: endpoints must not be empty".into()));
            }
            Some(Servers::Pool(Pool {
                name: p.name,
                endpoints: p.endpoints.into_iter().map(Spanned::into_inner).collect(),
            }))
        }
        (None, None) => None,
    };
    if let Some(s) = raw.local_memory {
        let v = LocalShare::parse(s.get_ref()).map_err(|e| (s.span().start, e))?;
        o.local_memory = Some(v);
    }
    if let Some(s) = raw.prefetcher {
        at(&s, check_prefetcher(s.get_ref()))?;
        o.prefetcher = Some(s.into_inner());
    }
    if let Some(r) = raw.replicas {
        if *r.get_ref() == 0 {
            return Err((r.span().start, "replicas must be at least 1".into()));
        }
        o.replicas = Some(r.into_inner());
    }
    if let Some(s) = raw.page_space {
        let v = PageSpace::parse(s.get_ref()).map_err(|e| (s.span().start, e))?;
        o.page_space = Some(v);
    }
    if let Some(s) = raw.metrics {
        if s.get_ref().parse::<std::net::SocketAddr>().is_err() {
            return Err((
                s.span().start,
                format!("metrics: `{}` is not an IP address and port", s.get_ref()),
            ));
        }
        o.metrics = Some(s.into_inner());
    }
    Ok(o)
}
