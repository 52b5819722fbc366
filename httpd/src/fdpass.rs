//! File descriptors sent with a request over a Unix socket (SCM_RIGHTS), as libvirt's Cloud
//! Hypervisor driver sends the tap devices it created: one `sendmsg` carrying the whole HTTP
//! request and the descriptors, on a connection of its own (`PUT /api/v1/vm.add-net`).
//!
//! A Unix socket's connections are read with `recvmsg` ([`FdStream`]): descriptors that arrive
//! are kept in the connection's [`FdInbox`], which every request of that connection finds in
//! its extensions as `ConnectInfo<FdInbox>`; the handler that expects descriptors
//! [`FdInbox::take`]s them. The kernel never merges bytes sent with descriptors into one read
//! with bytes sent before them, so a request's descriptors are in the inbox once its head has
//! been read. Descriptors nobody takes are closed with the connection. A TCP connection's
//! inbox is always empty.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};

/// Most descriptors one message may carry; more are closed by the kernel and the connection's
/// next request is refused by its handler for want of them (a warning says why).
pub const MAX_FDS: usize = 16;

/// The descriptors a connection received and no request has taken yet.
#[derive(Clone, Debug, Default)]
pub struct FdInbox(Arc<Mutex<Vec<OwnedFd>>>);

impl FdInbox {
    /// Takes every descriptor received so far, in the order they came.
    pub fn take(&self) -> Vec<OwnedFd> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn put(&self, fds: impl IntoIterator<Item = OwnedFd>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend(fds);
    }
}

impl Connected<IncomingStream<'_, FdUnixListener>> for FdInbox {
    fn connect_info(stream: IncomingStream<'_, FdUnixListener>) -> Self {
        stream.remote_addr().clone()
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for FdInbox {
    fn connect_info(_: IncomingStream<'_, TcpListener>) -> Self {
        FdInbox::default()
    }
}

/// A Unix listener whose connections take descriptors ([`FdStream`]).
pub struct FdUnixListener(pub UnixListener);

impl Listener for FdUnixListener {
    type Io = FdStream;
    type Addr = FdInbox;

    async fn accept(&mut self) -> (FdStream, FdInbox) {
        loop {
            match self.0.accept().await {
                Ok((stream, _)) => {
                    let inbox = FdInbox::default();
                    return (
                        FdStream {
                            stream,
                            inbox: inbox.clone(),
                        },
                        inbox,
                    );
                }
                Err(e) => {
                    // Out of descriptors or memory: wait rather than spin (as axum does).
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<FdInbox> {
        Ok(FdInbox::default())
    }
}

/// A Unix stream read with `recvmsg`, its received descriptors going to its [`FdInbox`].
pub struct FdStream {
    stream: UnixStream,
    inbox: FdInbox,
}

impl AsyncRead for FdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            let fd = this.stream.as_raw_fd();
            // SAFETY: the unfilled part is only written by recvmsg, and only the bytes it
            // reports are marked filled.
            let unfilled = unsafe { buf.unfilled_mut() };
            match this
                .stream
                .try_io(Interest::READABLE, || recv_with_fds(fd, unfilled))
            {
                Ok((n, fds, truncated)) => {
                    if truncated {
                        tracing::warn!(
                            "a request carried more than {MAX_FDS} descriptors; the rest were closed"
                        );
                    }
                    this.inbox.put(fds);
                    // SAFETY: recvmsg initialised the first n bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Control-message space for [`MAX_FDS`] descriptors (`CMSG_SPACE`), in `u64`s for alignment.
const CMSG_WORDS: usize = (size_of::<libc::cmsghdr>() + MAX_FDS * size_of::<RawFd>()).div_ceil(8);

/// One `recvmsg` on `fd` into `buf`: the bytes read, the descriptors that came with them
/// (close-on-exec), and whether some were cut off.
fn recv_with_fds(
    fd: RawFd,
    buf: &mut [MaybeUninit<u8>],
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut control = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no control); its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; CMSG_WORDS]>() as _;
    // SAFETY: msg points at iov (over buf) and control, both live for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages recvmsg wrote, with the kernel's own macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..len / size_of::<RawFd>() {
                    // SAFETY: each is a new descriptor the kernel installed for us.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, fds, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

/// Sends `bytes` with `fds` in one `sendmsg` on `stream` (a client's side: tests, and tools
/// that hand a VMM a tap the way libvirt does).
pub fn send_with_fds(
    stream: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[RawFd],
) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("at most {MAX_FDS} descriptors per message"),
        ));
    }
    let mut control = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(payload) } as _;
        // SAFETY: the control buffer holds CMSG_SPACE(payload) bytes (checked above by
        // MAX_FDS); the header and the descriptors are written inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: msg points at iov (over bytes) and control, both live for the call.
    let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::HttpServer;
    use crate::Listen;
    use axum::extract::ConnectInfo;
    use axum::routing::put;
    use axum::Router;
    use std::io::{Read, Write};

    /// Answers with what each descriptor it was sent reads as (pipes' contents), `|`-joined.
    async fn read_fds(ConnectInfo(inbox): ConnectInfo<FdInbox>) -> String {
        inbox
            .take()
            .into_iter()
            .map(|fd| {
                let mut s = String::new();
                std::fs::File::from(fd).read_to_string(&mut s).unwrap();
                s
            })
            .collect::<Vec<_>>()
            .join("|")
    }

    fn pipe_with(text: &str) -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: p is a valid two-int array for pipe2.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 gave us both ends.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let mut w = std::fs::File::from(w);
        w.write_all(text.as_bytes()).unwrap();
        (r, w.into())
    }

    fn response(s: &mut std::os::unix::net::UnixStream) -> String {
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn each_request_gets_the_descriptors_sent_with_it_and_tcp_gets_none() {
        let dir = std::env::temp_dir().join(format!("farvm-fdpass-{}", std::process::id()));
        let path = dir.join("api.sock");
        let router = Router::new().route("/fds", put(read_fds));
        let s =
            HttpServer::start(&Listen::Unix(path.clone()), "fdpass-test", router.clone()).unwrap();
        let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let req = "PUT /fds HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n";
        for (i, texts) in [vec!["tap0"], vec!["a", "b"], vec![]]
            .into_iter()
            .enumerate()
        {
            // Write ends closed at once: the handler reads each pipe to its end.
            let pipes: Vec<OwnedFd> = texts.iter().map(|t| pipe_with(t).0).collect();
            let raw: Vec<RawFd> = pipes.iter().map(|r| r.as_raw_fd()).collect();
            assert_eq!(send_with_fds(&c, req.as_bytes(), &raw).unwrap(), req.len());
            drop(pipes); // the server holds its own copies now
            let r = response(&mut c);
            assert!(r.starts_with("HTTP/1.1 200"), "request {i}: {r}");
            assert!(r.ends_with(&texts.join("|")), "request {i}: {r}");
        }
        drop(s);

        let s = HttpServer::start(&"127.0.0.1:0".parse().unwrap(), "fdpass-test", router).unwrap();
        let mut c = std::net::TcpStream::connect(s.tcp_addr().unwrap()).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).unwrap();
        let r = String::from_utf8_lossy(&buf[..n]);
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
