//! The endpoints farvm answers under `/api/v1/`, and the routing of a request line (method and
//! path) to one of them, with Cloud Hypervisor's answers for the rest: an unknown path is 404,
//! a known endpoint with the wrong method is 400.

use crate::error::ApiError;
use crate::API_ROOT;

/// An HTTP method an endpoint takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
        }
    }
}

/// An endpoint of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `GET vmm.ping`: the VMM's version.
    VmmPing,
    /// `PUT vmm.shutdown`: stop the VM, if any, and exit.
    VmmShutdown,
    /// `PUT vm.create` with the VM configuration: remember it (nothing runs yet).
    VmCreate,
    /// `PUT vm.boot`: build the VM and start its vCPUs.
    VmBoot,
    /// `GET vm.info`: configuration (with the pty paths) and state.
    VmInfo,
    /// `GET vm.counters`: farvm's counters (exits, paging, guest processes).
    VmCounters,
    /// `PUT vm.pause`: park every vCPU.
    VmPause,
    /// `PUT vm.resume`: let them run again.
    VmResume,
    /// `PUT vm.shutdown`: stop the VM (it can be booted again).
    VmShutdown,
    /// `PUT vm.reboot`: stop the VM and boot it afresh.
    VmReboot,
    /// `PUT vm.delete`: stop the VM and forget its configuration.
    VmDelete,
    /// `PUT vm.add-net` with a network device and its tap's descriptor (SCM_RIGHTS): add it to
    /// the created VM before it boots.
    VmAddNet,
    /// `PUT vm.snapshot` with `{"destination_url": "file:///DIR"}`: save the VM there (it
    /// stops once saved).
    VmSnapshot,
    /// `PUT vm.restore` with `{"source_url": "file:///DIR"}`: build the VM saved there, paused.
    VmRestore,
    /// `PUT vm.send-migration` with `{"destination_url": "tcp:HOST:PORT"}`: live-migrate the
    /// VM to the farvm receiving there (it stops here once the destination runs it).
    VmSendMigration,
    /// `PUT vm.receive-migration` with `{"receiver_url": "tcp:HOST:PORT"}`: wait there for a
    /// migrating VM and run it (answered once it runs, or failed).
    VmReceiveMigration,
}

impl Endpoint {
    pub const ALL: [Endpoint; 16] = [
        Endpoint::VmmPing,
        Endpoint::VmmShutdown,
        Endpoint::VmCreate,
        Endpoint::VmBoot,
        Endpoint::VmInfo,
        Endpoint::VmCounters,
        Endpoint::VmPause,
        Endpoint::VmResume,
        Endpoint::VmShutdown,
        Endpoint::VmReboot,
        Endpoint::VmDelete,
        Endpoint::VmAddNet,
        Endpoint::VmSnapshot,
        Endpoint::VmRestore,
        Endpoint::VmSendMigration,
        Endpoint::VmReceiveMigration,
    ];

    /// The name after `/api/v1/`.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::VmmPing => "vmm.ping",
            Endpoint::VmmShutdown => "vmm.shutdown",
            Endpoint::VmCreate => "vm.create",
            Endpoint::VmBoot => "vm.boot",
            Endpoint::VmInfo => "vm.info",
            Endpoint::VmCounters => "vm.counters",
            Endpoint::VmPause => "vm.pause",
            Endpoint::VmResume => "vm.resume",
            Endpoint::VmShutdown => "vm.shutdown",
            Endpoint::VmReboot => "vm.reboot",
            Endpoint::VmDelete => "vm.delete",
            Endpoint::VmAddNet => "vm.add-net",
            Endpoint::VmSnapshot => "vm.snapshot",
            Endpoint::VmRestore => "vm.restore",
            Endpoint::VmSendMigration => "vm.send-migration",
            Endpoint::VmReceiveMigration => "vm.receive-migration",
        }
    }

    /// The method it takes.
    pub fn method(self) -> Method {
        match self {
            Endpoint::VmmPing | Endpoint::VmInfo | Endpoint::VmCounters => Method::Get,
            _ => Method::Put,
        }
    }

    /// Its full path, `/api/v1/<name>`.
    pub fn path(self) -> String {
        format!("{API_ROOT}{}", self.name())
    }
}

/// Routes a request: `method` as on the request line (`GET`, `PUT` ...), `path` its target (a
/// query string, if any, is ignored as Cloud Hypervisor ignores it).
pub fn route(method: &str, path: &str) -> Result<Endpoint, ApiError> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let endpoint = path
        .strip_prefix(API_ROOT)
        .and_then(|name| Endpoint::ALL.into_iter().find(|e| e.name() == name))
        .ok_or_else(|| ApiError::NotFound(printable(path)))?;
    let expected = endpoint.method();
    if method != expected.as_str() {
        return Err(ApiError::BadMethod {
            endpoint: endpoint.name(),
            expected: expected.as_str(),
            got: printable(method),
        });
    }
    Ok(endpoint)
}

/// A request's path or method for an error message: at most 100 characters, control
/// characters escaped (it comes from the client).
fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(100).flat_map(char::escape_debug).collect();
    if s.chars().count() > 100 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_routes_with_its_method_only() {
        for e in Endpoint::ALL {
            assert_eq!(route(e.method().as_str(), &e.path()), Ok(e));
            assert_eq!(
                route(e.method().as_str(), &format!("{}?x=1", e.path())),
                Ok(e)
            );
            let other = match e.method() {
                Method::Get => "PUT",
                Method::Put => "GET",
            };
            let err = route(other, &e.path()).unwrap_err();
            assert_eq!(err.status(), 400, "{e:?}");
            assert!(err.to_string().contains(e.name()), "{err}");
            assert_eq!(route("POST", &e.path()).unwrap_err().status(), 400);
        }
    }

    #[test]
    fn unknown_paths_are_404() {
        for p in [
            "/",
            "/api/v1/",
            "/api/v1/vm.send-migration/",
            "/api/v1/vm.migrate",
            "/api/v2/vm.info",
            "/api/v1/vm.info/",
            "api/v1/vm.info",
            "/api/v1//vm.info",
        ] {
            let e = route("GET", p).unwrap_err();
            assert_eq!(e.status(), 404, "{p}");
        }
        let long = format!("/{}\n", "x".repeat(500));
        let e = route("GET", &long).unwrap_err().to_string();
        assert!(
            e.len() < 400 && !e.contains("\\n") && e.contains('…'),
            "{e}"
        );
    }
}
