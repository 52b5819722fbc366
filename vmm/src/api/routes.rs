//! The HTTP face of the API: every request goes to one handler that routes it with
//! `farvm_chapi::route`, runs it on [`ApiState`] and answers as Cloud Hypervisor does — 200
//! with a JSON body, 204 without, or the error's status with a JSON array of messages. The
//! handler runs the operation on a thread of its own while the server's thread waits for it:
//! requests are handled one at a time, as by Cloud Hypervisor's API thread. Descriptors sent with a request over the Unix socket
//! (SCM_RIGHTS, as libvirt sends a tap with `vm.add-net`) reach the handler with it.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use farvm_chapi::{route, ApiError, Endpoint};
use farvm_httpd::axum::body::Bytes;
use farvm_httpd::axum::extract::{ConnectInfo, State};
use farvm_httpd::axum::http::{header, Method, StatusCode, Uri};
use farvm_httpd::axum::response::{IntoResponse, Response};
use farvm_httpd::axum::Router;
use farvm_httpd::fdpass::FdInbox;
use serde_json::Value;

use super::state::ApiState;

/// The `Server` header of every answer.
pub const SERVER: &str = concat!(
    "farvm/",
    env!("CARGO_PKG_VERSION"),
    " (Cloud Hypervisor API v27.0.0)"
);

/// The router serving `state`.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

async fn handle(
    State(state): State<Arc<ApiState>>,
    ConnectInfo(inbox): ConnectInfo<FdInbox>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    // Descriptors sent with this request (SCM_RIGHTS): `vm.add-net` takes them; with any
    // other request they are closed here.
    let fds = inbox.take();
    let result = run_outside_runtime(|| {
        route(method.as_str(), uri.path()).and_then(|e| {
            tracing::debug!(endpoint = e.name(), fds = fds.len(), "API request");
            dispatch(&state, e, &body, fds)
        })
    });
    match result {
        Ok(Some(v)) => json(StatusCode::OK, v.to_string()),
        Ok(None) => (StatusCode::NO_CONTENT, [(header::SERVER, SERVER)]).into_response(),
        Err(e) => {
            // A refused configuration or a failed action is the operator's to read in the
            // domain log (libvirt shows only "failed to create guest VM"): at the default
            // level. A probe of an endpoint in the wrong state is routine.
            match e {
                ApiError::BadConfig(_) | ApiError::BadJson(_) | ApiError::Failed { .. } => {
                    tracing::warn!(status = e.status(), "{} {}: {e}", method, uri.path())
                }
                _ => tracing::info!(status = e.status(), "{} {}: {e}", method, uri.path()),
            }
            let status =
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json(status, e.body())
        }
    }
}

/// Runs `op` on a thread of its own, outside the server's tokio runtime, and waits for it: a
/// pool VM's etcd directory drives a runtime of its own and blocks on it (building, saving or
/// restoring the VM), which tokio refuses on a runtime's thread. The server's one thread waits,
/// so requests still run one at a time. A panic in `op` is the handler's, as before.
///
/// The answer goes out only once the thread is gone from `/proc/self/task`: libvirt's ch
/// driver lists the VMM's threads right after `vm.boot` answers and pins each one, and a
/// thread still exiting (joined, but not yet reaped) made `virsh start` fail with "cannot set
/// CPU affinity on process N: No such process" (seen on a slow host).
fn run_outside_runtime(
    op: impl FnOnce() -> Result<Option<Value>, ApiError> + Send,
) -> Result<Option<Value>, ApiError> {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let answer = std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("api-request".into())
            .spawn_scoped(scope, move || {
                // SAFETY: gettid has no preconditions.
                let _ = tid_tx.send(unsafe { libc::gettid() });
                op()
            }) {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(e) => Err(ApiError::Failed {
                action: "request",
                reason: format!("cannot start a thread for it: {e}"),
            }),
        }
    });
    if let Ok(tid) = tid_rx.try_recv() {
        wait_task_gone(tid);
    }
    answer
}

/// Waits (up to a second) until thread `tid` of this process is no longer listed.
fn wait_task_gone(tid: libc::pid_t) {
    let task = std::path::PathBuf::from(format!("/proc/self/task/{tid}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while task.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

fn json(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::SERVER, SERVER),
        ],
        body,
    )
        .into_response()
}

/// Runs `e` (already routed), given the descriptors that came with it: a JSON body to answer
/// with, or none (204).
fn dispatch(
    state: &ApiState,
    e: Endpoint,
    body: &[u8],
    fds: Vec<OwnedFd>,
) -> Result<Option<Value>, ApiError> {
    let none = |r: Result<(), ApiError>| r.map(|()| None);
    match e {
        Endpoint::VmmPing => Ok(Some(state.ping())),
        Endpoint::VmmShutdown => {
            state.request_exit();
            Ok(None)
        }
        Endpoint::VmCreate => none(state.create(body)),
        Endpoint::VmBoot => none(state.boot()),
        Endpoint::VmInfo => state.info().map(Some),
        Endpoint::VmCounters => state
            .counters()
            .map(|c| Some(serde_json::to_value(c).unwrap_or_default())),
        Endpoint::VmPause => none(state.pause()),
        Endpoint::VmResume => none(state.resume()),
        Endpoint::VmShutdown => none(state.shutdown()),
        Endpoint::VmReboot => none(state.reboot()),
        Endpoint::VmDelete => {
            state.delete();
            Ok(None)
        }
        Endpoint::VmAddNet => none(state.add_net(body, fds)),
        Endpoint::VmSnapshot => none(state.snapshot(body)),
        Endpoint::VmRestore => none(state.restore(body)),
        Endpoint::VmSendMigration => none(state.send_migration(body)),
        Endpoint::VmReceiveMigration => none(state.receive_migration(body)),
    }
}
