//! The `vm.add-net` body: one network device, whose tap comes as a descriptor sent with the
//! request over the API's Unix socket (SCM_RIGHTS), as libvirt's ch driver sends it after
//! `vm.create` and before `vm.boot`:
//!
//! ```json
//! {"id": "net_0", "mac": "52:54:00:12:34:56", "num_queues": 2}
//! ```
//!
//! with exactly one descriptor: farvm's device has one queue pair, so one tap queue. The
//! fields are those of `vm.create`'s `net` entries, checked alike ([`crate::create`]); `tap`,
//! if given, must be the name of the tap the descriptor opens (the VMM checks it).

use serde::Serialize;

use crate::create::{bad, check_net_fields, RawNet};
use crate::error::ApiError;

/// A `vm.add-net` request, as accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AddNetSpec {
    /// The tap's name, if the body gives one.
    pub tap: Option<String>,
    /// The guest's MAC address [`None`: derived from the tap's name].
    pub mac: Option<String>,
    /// Cloud Hypervisor's device id (accepted; farvm names devices by order).
    pub id: Option<String>,
}

impl AddNetSpec {
    /// Parses `body`, sent with `fds` descriptors.
    pub fn parse(body: &[u8], fds: usize) -> Result<Self, ApiError> {
        let raw: RawNet =
            serde_json::from_slice(body).map_err(|e| ApiError::BadJson(e.to_string()))?;
        let key = |f: &str| f.to_string();
        if raw.fds.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(
                "`fds`: the descriptors travel with the request (SCM_RIGHTS), not in its body",
            ));
        }
        check_net_fields(&key, &raw)?;
        match fds {
            1 => {}
            0 => {
                return Err(bad(
                    "vm.add-net came without a tap descriptor: send one with the request over \
                     the API's Unix socket (SCM_RIGHTS)",
                ))
            }
            n => {
                return Err(bad(format!(
                    "vm.add-net came with {n} descriptors: farvm's network device has one \
                     queue pair, so it takes one tap queue"
                )))
            }
        }
        Ok(AddNetSpec {
            tap: raw.tap.filter(|t| !t.is_empty()),
            mac: raw.mac,
            id: raw.id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_libvirt_sends_is_accepted_with_one_descriptor() {
        let body = br#"{"id":"net_0","mac":"52:54:00:12:34:56","num_queues":2}"#;
        let s = AddNetSpec::parse(body, 1).unwrap();
        assert_eq!(s.mac.as_deref(), Some("52:54:00:12:34:56"));
        assert_eq!((s.id.as_deref(), s.tap), (Some("net_0"), None));
    }

    #[test]
    fn descriptors_and_fields_farvm_cannot_honour_are_refused_by_name() {
        let ok = br#"{"mac":"52:54:00:12:34:56"}"#;
        for (body, fds, needle) in [
            (&ok[..], 0, "without a tap descriptor"),
            (&ok[..], 2, "came with 2 descriptors"),
            (br#"{"num_queues":4}"#, 1, "`num_queues` is 4"),
            (br#"{"ip":"192.168.1.1"}"#, 1, "`ip`"),
            (br#"{"mac":"01:00:00:00:00:01"}"#, 1, "`mac`"),
            (br#"{"fds":[3]}"#, 1, "travel with the request"),
            (br#"{"bogus":1}"#, 1, "unknown field `bogus`"),
        ] {
            let e = AddNetSpec::parse(body, fds).unwrap_err().to_string();
            assert!(e.contains(needle), "{}: {e}", String::from_utf8_lossy(body));
        }
    }
}
