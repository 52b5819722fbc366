//! The remote-memory settings one configuration layer may set (the domain XML's farvm metadata,
//! a host-file domain section, the host-file defaults), and their value types with the syntax
//! `farvm run` uses for the same options.

use std::fmt;
use std::path::PathBuf;

/// Where a VM's remote pages live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Servers {
    /// An embedded memory server on loopback, started with the VM (`farvm run` without
    /// `--memserver`).
    Embedded,
    /// These memory servers, `HOST:PORT` each (`--memserver`, repeatable).
    Memservers(Vec<String>),
    /// Servers found in a memory-server pool's registry.
    Pool(Pool),
}

/// A memory-server pool: its registry endpoints (URLs) and, optionally, which pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// The pool's name (`None`: the registry's default pool).
    pub name: Option<String>,
    /// Registry (etcd) endpoint URLs.
    pub endpoints: Vec<String>,
}

/// How much of guest RAM may be resident locally (`--local-memory`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LocalShare {
    /// All of it (no eviction).
    All,
    /// Percent of guest RAM, in (0, 100].
    Percent(f64),
    /// A byte count.
    Bytes(u64),
}

impl fmt::Display for LocalShare {
    /// The `--local-memory` spelling: `all`, `25%`, or a byte count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalShare::All => f.write_str("all"),
            LocalShare::Percent(p) => write!(f, "{p}%"),
            LocalShare::Bytes(b) => write!(f, "{b}"),
        }
    }
}

impl LocalShare {
    /// Parses `all`, `N%` (N in (0, 100]) or a size: digits with an optional libvirt unit
    /// (`512M`, `512MiB`, `1G`, `1000000000B`; no unit means bytes).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(LocalShare::All);
        }
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("`{s}`: `{p}` is not a number"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!("`{s}`: a percentage must be in (0, 100]"));
            }
            return Ok(LocalShare::Percent(v));
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        let bytes = crate::units::parse_scaled(num, (!unit.is_empty()).then_some(unit), 1)
            .map_err(|e| format!("`{s}`: {e} (expected all, N% or a size such as 512M)"))?;
        if bytes == 0 {
            return Err(format!("`{s}`: the local share must be more than 0 bytes"));
        }
        Ok(LocalShare::Bytes(bytes))
    }
}

/// Which page numbers the prefetcher learns from (`--page-space`): the one type for it, from the
/// domain's metadata down to the VMM's remote-memory setup and the lab's reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageSpace {
    /// Each process's own virtual page numbers, by walking its page tables from the CR3 the
    /// guest agent published (`farvm_ept::translate::VirtualPages`).
    Virtual,
    /// Guest-physical page numbers.
    Physical,
}

impl std::str::FromStr for PageSpace {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl fmt::Display for PageSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PageSpace {
    /// `virtual` or `physical`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "virtual" => Ok(PageSpace::Virtual),
            "physical" => Ok(PageSpace::Physical),
            other => Err(format!(
                "unknown page space `{other}` (virtual or physical)"
            )),
        }
    }

    /// The option's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PageSpace::Virtual => "virtual",
            PageSpace::Physical => "physical",
        }
    }
}

/// Checks `HOST:PORT` (a name or IPv4 address, or `[IPv6]`, and a port 1..=65535). Names are
/// not resolved here: that happens when the VM starts.
pub fn check_host_port(s: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "`{s}`: {why} (expected HOST:PORT, e.g. memsrv1:7070)"
        ))
    };
    let Some((host, port)) = s.rsplit_once(':') else {
        return bad("no port");
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return bad("the port must be 1..=65535"),
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match v6.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => bad("not an IPv6 address in brackets"),
        };
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if !name_ok {
        return bad("not a host name or address");
    }
    Ok(())
}

/// Checks a prefetcher name against the ones farvm has.
pub fn check_prefetcher(name: &str) -> Result<(), String> {
    let known = farvm_prefetch::registry::names();
    if known.contains(&name) {
        Ok(())
    } else {
        Err(format!(
            "unknown prefetcher `{name}` (known: {})",
            known.join(", ")
        ))
    }
}

/// The remote-memory settings of one layer; `None` leaves the setting to the next layer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Keep all RAM local: no paging engine, no memory server (`--local-only`).
    pub local_only: Option<bool>,
    /// Where the memory servers are (`--memserver` or a pool).
    pub servers: Option<Servers>,
    /// How much of guest RAM may be resident locally (`--local-memory`).
    pub local_memory: Option<LocalShare>,
    /// Prefetcher name (`--prefetcher`).
    pub prefetcher: Option<String>,
    /// Copies of each remote page (`--replicas`).
    pub replicas: Option<u32>,
    /// Tenant secret for the memory servers (`--memserver-token-file`).
    pub token_file: Option<PathBuf>,
    /// The page key file (`--memory-key-file`); a host-config setting only (a domain's
    /// metadata has no element for it: the key is the host's to keep).
    pub memory_key_file: Option<PathBuf>,
    /// The key a live migration's stream is sealed with, which the hosts a VM migrates
    /// between share (mode 0600 or 0400); a host-config setting only, read by the API
    /// server's `vm.send-migration` and `vm.receive-migration`.
    pub migration_key_file: Option<PathBuf>,
    /// The snapshot key (mode 0600 or 0400) that seals the snapshots the API server's
    /// `vm.snapshot` writes and opens those `vm.restore` reads (`virsh save` / `virsh
    /// restore`); a host-config setting only. Unset: snapshots are written in the clear.
    pub snapshot_key_file: Option<PathBuf>,
    /// Page numbers the prefetcher learns from (`--page-space`).
    pub page_space: Option<PageSpace>,
    /// Every N-th prefetched page left unmapped to measure prefetch hits (`--probe-every`).
    pub probe_every: Option<u32>,
    /// Prometheus endpoint of the VM (`--metrics`), `ADDR:PORT`.
    pub metrics: Option<String>,
}

impl Overrides {
    /// Each field of `self`, or of `lower` where `self` leaves it unset.
    pub fn or(&self, lower: &Overrides) -> Overrides {
        Overrides {
            local_only: self.local_only.or(lower.local_only),
            servers: self.servers.clone().or_else(|| lower.servers.clone()),
            local_memory: self.local_memory.or(lower.local_memory),
            prefetcher: self.prefetcher.clone().or_else(|| lower.prefetcher.clone()),
            replicas: self.replicas.or(lower.replicas),
            token_file: self.token_file.clone().or_else(|| lower.token_file.clone()),
            memory_key_file: self
                .memory_key_file
                .clone()
                .or_else(|| lower.memory_key_file.clone()),
            migration_key_file: self
                .migration_key_file
                .clone()
                .or_else(|| lower.migration_key_file.clone()),
            snapshot_key_file: self
                .snapshot_key_file
                .clone()
                .or_else(|| lower.snapshot_key_file.clone()),
            page_space: self.page_space.or(lower.page_space),
            probe_every: self.probe_every.or(lower.probe_every),
            metrics: self.metrics.clone().or_else(|| lower.metrics.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_share_syntax() {
        assert_eq!(LocalShare::parse("all"), Ok(LocalShare::All));
        assert_eq!(LocalShare::parse("25%"), Ok(LocalShare::Percent(25.0)));
        assert_eq!(LocalShare::parse("12.5 %"), Ok(LocalShare::Percent(12.5)));
        assert_eq!(LocalShare::parse("512M"), Ok(LocalShare::Bytes(512 << 20)));
        assert_eq!(LocalShare::parse("1GiB"), Ok(LocalShare::Bytes(1 << 30)));
        assert_eq!(
            LocalShare::parse("1 GB"),
            Ok(LocalShare::Bytes(1_000_000_000))
        );
        assert_eq!(LocalShare::parse("4096"), Ok(LocalShare::Bytes(4096)));
        for bad in ["0%", "101%", "x%", "0", "12Q", "", "-5M"] {
            assert!(LocalShare::parse(bad).is_err(), "{bad}");
        }
        for s in [
            LocalShare::All,
            LocalShare::Percent(33.5),
            LocalShare::Bytes(77),
        ] {
            assert_eq!(LocalShare::parse(&s.to_string()), Ok(s));
        }
    }

    #[test]
    fn host_port_syntax() {
        for ok in ["memsrv1:7070", "10.0.0.5:7070", "[::1]:7070", "a.b-c_d:1"] {
            assert_eq!(check_host_port(ok), Ok(()), "{ok}");
        }
        for bad in [
            "memsrv1",
            "h:0",
            "h:70000",
            ":7070",
            "[zz]:1",
            "a b:1",
            "::1:7070x",
        ] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upper_layer_wins_field_by_field() {
        let upper = Overrides {
            local_memory: Some(LocalShare::Percent(25.0)),
            ..Default::default()
        };
        let lower = Overrides {
            local_memory: Some(LocalShare::All),
            replicas: Some(2),
            ..Default::default()
        };
        let m = upper.or(&lower);
        assert_eq!(m.local_memory, Some(LocalShare::Percent(25.0)));
        assert_eq!(m.replicas, Some(2));
        assert_eq!(m.prefetcher, None);
    }
}
