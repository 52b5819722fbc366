//! [`ApiError`]: every way a request fails, its HTTP status, and the JSON error body Cloud
//! Hypervisor sends (an array of messages, outermost first, e.g. `["Error from API", "The VM
//! could not boot", "VM is not created"]`).

use crate::info::VmState;

/// A failed request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No endpoint at this path (404).
    #[error("no endpoint {0} (farvm answers /api/v1/ vm.create, vm.boot, vm.info, vm.counters, vm.pause, vm.resume, vm.shutdown, vm.reboot, vm.delete, vm.snapshot, vm.restore, vm.send-migration, vm.receive-migration, vmm.ping, vmm.shutdown)")]
    NotFound(String),
    /// The endpoint exists but not with this method (400, as Cloud Hypervisor answers).
    #[error("{endpoint} takes {expected}, not {got}")]
    BadMethod {
        endpoint: &'static str,
        expected: &'static str,
        got: String,
    },
    /// The body is missing, not JSON, or not the shape the endpoint takes (400).
    #[error("{0}")]
    BadJson(String),
    /// A configuration farvm cannot run: a field it has no device or feature for, or a value
    /// out of range (400).
    #[error("{0}")]
    BadConfig(String),
    /// No VM is created (404).
    #[error("cannot {action}: no VM is created (PUT vm.create first)")]
    NotCreated { action: &'static str },
    /// The VM is in the wrong state for the action (405).
    #[error("cannot {action} a VM that is {state}")]
    WrongState {
        action: &'static str,
        state: StateName,
    },
    /// The host failed to do it (500): /dev/kvm, guest memory, memory servers ...
    #[error("cannot {action}: {reason}")]
    Failed {
        action: &'static str,
        reason: String,
    },
}

/// A VM state as named in error messages: one of Cloud Hypervisor's states, or "already
/// created" for a second `vm.create`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateName {
    State(VmState),
    AlreadyCreated,
}

impl std::fmt::Display for StateName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateName::State(VmState::Created) => f.write_str("created but not booted"),
            StateName::State(VmState::Running) => f.write_str("running"),
            StateName::State(VmState::Paused) => f.write_str("paused"),
            StateName::State(VmState::Shutdown) => f.write_str("shut down"),
            StateName::AlreadyCreated => f.write_str("already created (PUT vm.delete first)"),
        }
    }
}

impl ApiError {
    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::NotFound(_) | ApiError::NotCreated { .. } => 404,
            ApiError::BadMethod { .. } | ApiError::BadJson(_) | ApiError::BadConfig(_) => 400,
            ApiError::WrongState { .. } => 405,
            ApiError::Failed { .. } => 500,
        }
    }

    /// [`ApiError::WrongState`] for a VM in `state`.
    pub fn wrong_state(action: &'static str, state: VmState) -> Self {
        ApiError::WrongState {
            action,
            state: StateName::State(state),
        }
    }

    /// The messages of the error body, outermost first.
    pub fn messages(&self) -> Vec<String> {
        let outer = match self {
            ApiError::NotFound(_) => "Not Found",
            ApiError::BadMethod { .. } => "Bad Request",
            ApiError::BadJson(_) => "Failed to deserialize JSON",
            ApiError::BadConfig(_) => "Invalid VM configuration",
            ApiError::NotCreated { .. } | ApiError::WrongState { .. } | ApiError::Failed { .. } => {
                "Error from API"
            }
        };
        vec![outer.to_string(), self.to_string()]
    }

    /// The JSON error body: an array of strings.
    pub fn body(&self) -> String {
        serde_json::to_string(&self.messages()).unwrap_or_else(|_| "[]".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_json_arrays_of_messages() {
        let e = ApiError::NotCreated { action: "boot" };
        assert_eq!(e.status(), 404);
        let v: Vec<String> = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v[0], "Error from API");
        assert!(v[1].contains("no VM is created"), "{v:?}");
        let e = ApiError::wrong_state("pause", VmState::Paused);
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (405, "cannot pause a VM that is paused")
        );
        let e = ApiError::BadConfig("a \"quoted\" \\ value".into());
        let v: Vec<String> = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v[1], "a \"quoted\" \\ value");
    }
}
