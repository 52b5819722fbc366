//! Where an HTTP server listens: a TCP address, a Unix socket path, or a listening socket handed
//! over as a file descriptor (e.g. by a service manager or the parent that spawned the process).
//!
//! Binding happens in the caller's thread ([`Listen::bind`]), so a bad address or a port in use
//! is an error of the call that asked for it, not a log line from a server thread.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::HttpError;

/// A listening endpoint, as an operator writes it: `HOST:PORT`, `unix:PATH` or `fd:N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address (port 0: an ephemeral port, see [`BoundAddr`]).
    Tcp(SocketAddr),
    /// A Unix stream socket at this path (a stale socket file nobody answers on is replaced; the
    /// file is removed when the server stops).
    Unix(PathBuf),
    /// An already listening TCP or Unix stream socket; the server takes it over (and closes it).
    Fd(RawFd),
}

impl FromStr for Listen {
    type Err = HttpError;

    fn from_str(s: &str) -> Result<Self, HttpError> {
        let bad = || HttpError::BadListen(s.to_string());
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        if let Some(fd) = s.strip_prefix("fd:") {
            return fd.parse().map(Listen::Fd).map_err(|_| bad());
        }
        if let Ok(a) = s.parse() {
            return Ok(Listen::Tcp(a));
        }
        // HOST:PORT, resolved now (its first address).
        s.to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(Listen::Tcp)
            .ok_or_else(bad)
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Fd(fd) => write!(f, "fd:{fd}"),
        }
    }
}

/// The address a server actually listens on (an ephemeral TCP port resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundAddr {
    /// A TCP address (the port chosen if 0 was asked for).
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl fmt::Display for BoundAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundAddr::Tcp(a) => write!(f, "{a}"),
            BoundAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A bound, listening socket (blocking mode; the server makes it non-blocking).
#[derive(Debug)]
pub(crate) enum Bound {
    Tcp(TcpListener),
    /// The listener, and the path to remove when the server stops (None for an inherited fd).
    Unix(UnixListener, Option<PathBuf>),
}

impl Bound {
    pub(crate) fn addr(&self) -> io::Result<BoundAddr> {
        Ok(match self {
            Bound::Tcp(l) => BoundAddr::Tcp(l.local_addr()?),
            Bound::Unix(l, path) => BoundAddr::Unix(match path {
                Some(p) => p.clone(),
                None => l
                    .local_addr()?
                    .as_pathname()
                    .map(|p| p.to_path_buf())
                    .unwrap_or_default(),
            }),
        })
    }
}

impl Listen {
    /// The filesystem path of a Unix socket endpoint: the path itself, or for an inherited fd
    /// the address it is bound to (`getsockname`); `None` for TCP, an unbound or abstract Unix
    /// socket, or an fd that is not a socket. Leaves the fd open.
    pub fn unix_path(&self) -> Option<PathBuf> {
        match self {
            Listen::Tcp(_) => None,
            Listen::Unix(p) => Some(p.clone()),
            Listen::Fd(fd) => {
                if sockopt(*fd, libc::SO_DOMAIN).ok()? != libc::AF_UNIX {
                    return None;
                }
                // SAFETY: `fd` is an open socket (SO_DOMAIN answered); it is only borrowed to
                // duplicate it, and the duplicate is closed on return.
                let dup = unsafe { BorrowedFd::borrow_raw(*fd) }
                    .try_clone_to_owned()
                    .ok()?;
                let addr = UnixListener::from(dup).local_addr().ok()?;
                addr.as_pathname().map(Path::to_path_buf)
            }
        }
    }

    /// Binds (or takes over) the socket.
    pub(crate) fn bind(&self) -> Result<Bound, HttpError> {
        let bind_err = |source| HttpError::Bind {
            what: self.to_string(),
            source,
        };
        match self {
            Listen::Tcp(a) => TcpListener::bind(a).map(Bound::Tcp).map_err(bind_err),
            Listen::Unix(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(bind_err)?;
                }
                if path.exists() {
                    if UnixStream::connect(path).is_ok() {
                        return Err(HttpError::InUse {
                            what: self.to_string(),
                        });
                    }
                    // A stale socket of a process that died: replace it.
                    std::fs::remove_file(path).map_err(bind_err)?;
                }
                // Bound and listening under a temporary name in the same directory, then
                // renamed into place: bind(2) creates the file before listen(2) makes it
                // answer, and a client that waits for the path to appear (libvirt, a test)
                // would be refused in between.
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let tmp = path.with_file_name(format!(".farvm-{}-{n}.sock", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                let l = match UnixListener::bind(&tmp) {
                    Ok(l) => l,
                    // The temporary name does not fit a socket address where the path does:
                    // bound in place, as before.
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                        return UnixListener::bind(path)
                            .map(|l| Bound::Unix(l, Some(path.clone())))
                            .map_err(bind_err);
                    }
                    Err(e) => return Err(bind_err(e)),
                };
                if let Err(e) = std::fs::rename(&tmp, path) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(bind_err(e));
                }
                Ok(Bound::Unix(l, Some(path.clone())))
            }
            Listen::Fd(fd) => take_listener(*fd),
        }
    }
}

/// `getsockopt(fd, SOL_SOCKET, opt)` as an int.
fn sockopt(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of an int and its size; getsockopt fails
    // cleanly (EBADF/ENOTSOCK) on an fd that is not a socket.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes over an inherited listening socket after checking what it is.
fn take_listener(fd: RawFd) -> Result<Bound, HttpError> {
    let not = |detail: String| HttpError::NotAListener { fd, detail };
    let check = |opt, what: &str| sockopt(fd, opt).map_err(|e| not(format!(" ({what}: {e})")));
    if check(libc::SO_TYPE, "SO_TYPE")? != libc::SOCK_STREAM {
        return Err(not(" (not a stream socket)".into()));
    }
    if check(libc::SO_ACCEPTCONN, "SO_ACCEPTCONN")? == 0 {
        return Err(not(" (not listening)".into()));
    }
    match check(libc::SO_DOMAIN, "SO_DOMAIN")? {
        // SAFETY: `fd` is a listening stream socket of this family (checked above); the caller
        // handed it over (`Listen::Fd`), so nothing else closes it.
        libc::AF_INET | libc::AF_INET6 => Ok(Bound::Tcp(unsafe { TcpListener::from_raw_fd(fd) })),
        // SAFETY: as above.
        libc::AF_UNIX => Ok(Bound::Unix(unsafe { UnixListener::from_raw_fd(fd) }, None)),
        other => Err(not(format!(" (address family {other})"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            "127.0.0.1:9300".parse::<Listen>().unwrap(),
            Listen::Tcp("127.0.0.1:9300".parse().unwrap())
        );
        assert!(matches!(
            "localhost:0".parse::<Listen>().unwrap(),
            Listen::Tcp(_)
        ));
        assert_eq!(
            "unix:/run/x.sock".parse::<Listen>().unwrap(),
            Listen::Unix("/run/x.sock".into())
        );
        assert_eq!("fd:3".parse::<Listen>().unwrap(), Listen::Fd(3));
        for bad in ["unix:", "fd:x", "nohost", ""] {
            let e = bad.parse::<Listen>().unwrap_err().to_string();
            assert!(e.contains("HOST:PORT, unix:PATH or fd:N"), "{bad}: {e}");
        }
        assert_eq!(Listen::Unix("/a".into()).to_string(), "unix:/a");
    }

    /// The path appears only once it answers, and nothing else is left in its directory.
    #[test]
    fn a_unix_socket_answers_once_its_path_exists() {
        let dir = std::env::temp_dir().join(format!("farvm-listen-new-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("api.sock");
        let bound = Listen::Unix(path.clone()).bind().unwrap();
        assert!(UnixStream::connect(&path).is_ok());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["api.sock"]);
        assert_eq!(bound.addr().unwrap(), BoundAddr::Unix(path));
        drop(bound);
        // A path that fits a socket address (107 bytes) while the temporary name beside it
        // would not: bound in place.
        let deep = dir.join("d".repeat(98 - dir.as_os_str().len().min(97)));
        std::fs::create_dir_all(&deep).unwrap();
        let short = deep.join("a.sock");
        assert!(short.as_os_str().len() < 108, "{}", short.display());
        let bound = Listen::Unix(short.clone()).bind().unwrap();
        assert!(UnixStream::connect(&short).is_ok());
        drop(bound);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_inherited_unix_socket_names_its_path() {
        let dir = std::env::temp_dir().join(format!("farvm-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web-1-socket");
        let l = UnixListener::bind(&path).unwrap();
        let fd = l.into_raw_fd();
        assert_eq!(Listen::Fd(fd).unix_path(), Some(path.clone()));
        assert!(
            matches!(Listen::Fd(fd).bind().unwrap(), Bound::Unix(..)),
            "fd still open"
        );
        let t = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(Listen::Fd(t.into_raw_fd()).unix_path(), None);
        assert_eq!(Listen::Unix(path.clone()).unix_path(), Some(path));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_inherited_fd_must_be_a_listening_stream_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let want = l.local_addr().unwrap();
        let b = Listen::Fd(l.into_raw_fd()).bind().unwrap();
        assert_eq!(b.addr().unwrap(), BoundAddr::Tcp(want));
        let f = std::fs::File::open("/dev/null").unwrap();
        let e = Listen::Fd(f.into_raw_fd()).bind().unwrap_err().to_string();
        assert!(e.contains("not a listening"), "{e}");
        let (a, _b) = UnixStream::pair().unwrap();
        let e = Listen::Fd(a.into_raw_fd()).bind().unwrap_err().to_string();
        assert!(e.contains("not listening"), "{e}");
    }
}
