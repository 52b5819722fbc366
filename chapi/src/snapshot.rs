//! The `vm.snapshot` and `vm.restore` bodies, as libvirt's ch driver sends them (Cloud
//! Hypervisor's `VmSnapshotConfig` and `RestoreConfig`): `{"destination_url":
//! "file:///DIR"}` and `{"source_url": "file:///DIR", "prefault": false}`. A snapshot is a
//! directory on this host: only `file://` URLs of absolute paths are taken.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    destination_url: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    source_url: String,
    /// Cloud Hypervisor's "read all of memory in at once": farvm loads every page anyway.
    #[serde(rename = "prefault")]
    _prefault: Option<bool>,
}

fn body<'a, T: Deserialize<'a>>(endpoint: &str, body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadJson(format!("{endpoint}: {e}")))
}

/// The directory a `file:///DIR` URL names.
fn directory(field: &str, url: &str) -> Result<PathBuf, ApiError> {
    let path = url.strip_prefix("file://").ok_or_else(|| {
        ApiError::BadConfig(format!(
            "{field}: `{url}` is not a file:// URL (a snapshot is a directory on this host)"
        ))
    })?;
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(ApiError::BadConfig(format!(
            "{field}: `{url}` does not name an absolute path"
        )));
    }
    Ok(path)
}

/// The directory a `vm.snapshot` body saves to.
pub fn destination(b: &[u8]) -> Result<PathBuf, ApiError> {
    let b: SnapshotBody = body("vm.snapshot", b)?;
    directory("destination_url", &b.destination_url)
}

/// The directory a `vm.restore` body restores from.
pub fn source(b: &[u8]) -> Result<PathBuf, ApiError> {
    let b: RestoreBody = body("vm.restore", b)?;
    directory("source_url", &b.source_url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_a_directory() {
        let d = destination(br#"{"destination_url":"file:///var/lib/s"}"#).unwrap();
        assert_eq!(d, PathBuf::from("/var/lib/s"));
        let s = source(br#"{"source_url":"file:///var/lib/s","prefault":true}"#).unwrap();
        assert_eq!(s, PathBuf::from("/var/lib/s"));
        let e = destination(br#"{"destination_url":"tcp://h:1"}"#).unwrap_err();
        assert!(e.to_string().contains("not a file:// URL"), "{e}");
        assert_eq!(e.status(), 400);
        let e = source(br#"{"source_url":"file://rel/dir"}"#).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        let e = source(br#"{"source_url":"file:///d","net_fds":[3]}"#).unwrap_err();
        assert!(e.to_string().contains("net_fds"), "{e}");
        assert_eq!(destination(b"").unwrap_err().status(), 400);
    }
}
