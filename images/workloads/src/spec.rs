//! The workload CLI spec, `NAME[:key=value,...]`, parsed without allocating.
//!
//! Keys: `ws` (a size: `4096`, `64K`, `64M`, `1G`, `1GiB`), `seed`, `cpu`, and the workload's
//! named parameters ([`crate::WorkloadInfo::params`]). Numbers accept the same suffixes.

use crate::meta::{find_by_name, WorkloadInfo};
use crate::Params;

/// A parsed `--workload` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The workload named.
    pub workload: &'static WorkloadInfo,
    /// `ws=`: working-set size in bytes (the workload's default if not given).
    pub ws_bytes: u64,
    /// `seed=` ([`DEFAULT_SEED`] if not given).
    pub seed: u64,
    /// The vCPU to run on, if given.
    pub cpu: Option<u32>,
    /// Named parameters with defaults filled in.
    pub params: [u64; 4],
}

impl Spec {
    /// The workload's inputs.
    pub fn params(&self) -> Params {
        Params {
            ws_bytes: self.ws_bytes,
            seed: self.seed,
            params: self.params,
        }
    }
}

/// Seed used when the spec gives none.
pub const DEFAULT_SEED: u64 = 1;

/// Why a spec did not parse. Borrows the offending text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecError<'a> {
    /// The spec is empty.
    Empty,
    /// No workload has this name.
    UnknownWorkload(&'a str),
    /// `key` is not `ws`, `seed`, `cpu` or one of the workload's parameters.
    UnknownKey {
        /// The workload's name.
        workload: &'static str,
        /// The key given.
        key: &'a str,
    },
    /// An item without `=`.
    MissingValue(&'a str),
    /// A value that is not a number (or size) in range.
    BadNumber {
        /// Its key.
        key: &'a str,
        /// The value given.
        value: &'a str,
    },
}

impl core::fmt::Display for SpecError<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SpecError::Empty => write!(f, "empty workload spec (expected NAME[:key=value,...])"),
            SpecError::UnknownWorkload(n) => {
                write!(f, "unknown workload `{n}` (known:")?;
                for w in crate::WORKLOADS {
                    write!(f, " {}", w.name)?;
                }
                write!(f, ")")
            }
            SpecError::UnknownKey { workload, key } => {
                write!(
                    f,
                    "workload `{workload}` has no parameter `{key}` (keys: ws, seed, cpu"
                )?;
                if let Some(w) = find_by_name(workload) {
                    for p in w.params {
                        write!(f, ", {}", p.name)?;
                    }
                }
                write!(f, ")")
            }
            SpecError::MissingValue(item) => write!(f, "`{item}` is not key=value"),
            SpecError::BadNumber { key, value } => {
                write!(
                    f,
                    "`{key}={value}`: not a number or size (e.g. 4096, 64M, 1G)"
                )
            }
        }
    }
}

impl core::error::Error for SpecError<'_> {}

/// Parses `NAME[:key=value,...]`.
pub fn parse_spec(s: &str) -> Result<Spec, SpecError<'_>> {
    let s = s.trim();
    if s.is_empty() {
        return Err(SpecError::Empty);
    }
    let (name, rest) = match s.split_once(':') {
        Some((n, r)) => (n, r),
        None => (s, ""),
    };
    let workload = find_by_name(name).ok_or(SpecError::UnknownWorkload(name))?;
    let mut spec = Spec {
        workload,
        ws_bytes: workload.default_ws,
        seed: DEFAULT_SEED,
        cpu: None,
        params: [0; 4],
    };
    for (i, p) in workload.params.iter().enumerate() {
        spec.params[i] = p.default;
    }
    for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('=').ok_or(SpecError::MissingValue(item))?;
        let (key, value) = (key.trim(), value.trim());
        let num =
            farvm_units::parse_size(value).map_err(|_| SpecError::BadNumber { key, value })?;
        match key {
            "ws" => spec.ws_bytes = num,
            "seed" => spec.seed = num,
            "cpu" => {
                spec.cpu =
                    Some(u32::try_from(num).map_err(|_| SpecError::BadNumber { key, value })?)
            }
            _ => {
                let i = workload.params.iter().position(|p| p.name == key).ok_or(
                    SpecError::UnknownKey {
                        workload: workload.name,
                        key,
                    },
                )?;
                spec.params[i] = num;
            }
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::id;

    #[test]
    fn specs() {
        let s = parse_spec("seq").unwrap();
        assert_eq!(s.workload.id, id::SEQ_SCAN);
        assert_eq!((s.ws_bytes, s.seed, s.cpu), (64 << 20, DEFAULT_SEED, None));
        assert_eq!(s.params, [4, 0, 0, 0]);
        let s = parse_spec("kv:ws=1G,seed=7,cpu=1,ops=100K,theta=800").unwrap();
        assert_eq!(s.workload.id, id::ZIPF_KV);
        assert_eq!((s.ws_bytes, s.seed, s.cpu), (1 << 30, 7, Some(1)));
        assert_eq!(s.params, [100 << 10, 0, 800, 5]);
        assert_eq!(parse_spec(""), Err(SpecError::Empty));
        assert_eq!(
            parse_spec("nope:ws=1M"),
            Err(SpecError::UnknownWorkload("nope"))
        );
        assert_eq!(
            parse_spec("seq:stride=4"),
            Err(SpecError::UnknownKey {
                workload: "seq",
                key: "stride"
            })
        );
        assert_eq!(parse_spec("seq:ws"), Err(SpecError::MissingValue("ws")));
        assert_eq!(
            parse_spec("seq:ws=lots"),
            Err(SpecError::BadNumber {
                key: "ws",
                value: "lots"
            })
        );
    }
}
