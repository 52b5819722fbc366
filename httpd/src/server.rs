//! [`HttpServer`]: an axum router served from one control-plane thread.
//!
//! The thread runs a single-threaded tokio runtime: HTTP here is for operators, scrapers and
//! the management API, never on a data path, so one thread is plenty and it cannot take CPU
//! from vCPUs or the paging engine beyond what requests cost. Dropping the server stops it:
//! no new connections, in-flight requests get [`GRACE`] to finish, then the thread is joined
//! (and a Unix socket file it created is removed).

use std::future::IntoFuture;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use farvm_sandbox::ThreadClass;
use tokio::sync::watch;

use crate::fdpass::{FdInbox, FdUnixListener};
use crate::listen::{Bound, BoundAddr, Listen};
use crate::HttpError;

/// How long in-flight requests may take to finish once the server is asked to stop.
pub const GRACE: Duration = Duration::from_secs(2);

/// A running HTTP server; stops on drop.
pub struct HttpServer {
    addr: BoundAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    /// A Unix socket file this server created (removed on stop).
    unix_path: Option<PathBuf>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl HttpServer {
    /// Binds `listen` and serves `router` from a thread named `thread_name`, under its
    /// process's seccomp filter only (the management API: its requests build VMs).
    pub fn start(listen: &Listen, thread_name: &str, router: Router) -> Result<Self, HttpError> {
        Self::start_in(listen, thread_name, None, router)
    }

    /// [`HttpServer::start`] with the thread in seccomp thread class `class`
    /// ([`ThreadClass::Metrics`] for a metrics endpoint); `None`: the process's filter only.
    pub fn start_in(
        listen: &Listen,
        thread_name: &str,
        class: Option<ThreadClass>,
        router: Router,
    ) -> Result<Self, HttpError> {
        let bound = listen.bind()?;
        let bind_err = |source| HttpError::Bind {
            what: listen.to_string(),
            source,
        };
        let addr = bound.addr().map_err(bind_err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(HttpError::Runtime)?;
        let (stop, stopped) = watch::channel(false);
        let (listener, unix_path) = {
            // Registering a socket with the reactor needs the runtime's context.
            let _ctx = rt.enter();
            match bound {
                Bound::Tcp(l) => {
                    l.set_nonblocking(true).map_err(bind_err)?;
                    let l = tokio::net::TcpListener::from_std(l).map_err(bind_err)?;
                    (Listener::Tcp(l), None)
                }
                Bound::Unix(l, path) => {
                    l.set_nonblocking(true).map_err(bind_err)?;
                    let l = tokio::net::UnixListener::from_std(l).map_err(bind_err)?;
                    (Listener::Unix(l), path)
                }
            }
        };
        let name = thread_name.to_string();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                if let Some(class) = class {
                    farvm_sandbox::enter(class);
                }
                rt.block_on(serve(listener, router, stopped, name))
            })
            .map_err(HttpError::Runtime)?;
        Ok(HttpServer {
            addr,
            stop,
            thread: Some(thread),
            unix_path,
        })
    }

    /// Where the server listens.
    pub fn addr(&self) -> &BoundAddr {
        &self.addr
    }

    /// The TCP address, if it listens on TCP.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        match self.addr {
            BoundAddr::Tcp(a) => Some(a),
            BoundAddr::Unix(_) => None,
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

async fn serve(listener: Listener, router: Router, stopped: watch::Receiver<bool>, name: String) {
    let mut graceful = stopped.clone();
    let mut forced = stopped;
    let signal = async move {
        let _ = graceful.wait_for(|s| *s).await;
    };
    let deadline = async move {
        let _ = forced.wait_for(|s| *s).await;
        tokio::time::sleep(GRACE).await;
    };
    // Every request carries its connection's descriptor inbox (`fdpass`): empty over TCP.
    let service = router.into_make_service_with_connect_info::<FdInbox>();
    let result = match listener {
        Listener::Tcp(l) => {
            let served = axum::serve(l, service).with_graceful_shutdown(signal);
            tokio::select! {
                r = served.into_future() => r,
                () = deadline => Ok(()),
            }
        }
        Listener::Unix(l) => {
            let served = axum::serve(FdUnixListener(l), service).with_graceful_shutdown(signal);
            tokio::select! {
                r = served.into_future() => r,
                () = deadline => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::warn!(server = name, "HTTP server stopped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client;
    use axum::routing::get;

    fn hello() -> Router {
        Router::new().route("/hello", get(|| async { "hi\n" }))
    }

    #[test]
    fn serves_on_tcp_and_unix_and_stops_on_drop() {
        let s = HttpServer::start(&"127.0.0.1:0".parse().unwrap(), "http-test", hello()).unwrap();
        let addr = s.addr().clone();
        let r = client::get(&addr, "/hello").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hi\n"));
        assert_eq!(client::get(&addr, "/nope").unwrap().status, 404);
        drop(s);
        assert!(client::get(&addr, "/hello").is_err(), "stopped");

        let dir = std::env::temp_dir().join(format!("farvm-httpd-{}", std::process::id()));
        let path = dir.join("api.sock");
        let listen = Listen::Unix(path.clone());
        let s = HttpServer::start(&listen, "http-test", hello()).unwrap();
        let r = client::get(s.addr(), "/hello").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hi\n"));
        let e = HttpServer::start(&listen, "http-test", hello()).unwrap_err();
        assert!(matches!(e, HttpError::InUse { .. }), "{e}");
        drop(s);
        assert!(!path.exists(), "socket file removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_port_in_use_is_an_error_of_the_caller() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = Listen::Tcp(taken.local_addr().unwrap());
        let e = HttpServer::start(&listen, "http-test", hello()).unwrap_err();
        assert!(e.to_string().contains("cannot listen on 127.0.0.1:"), "{e}");
    }
}
