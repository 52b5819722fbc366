//! One client connection: handshake, then a loop of request → response.
//!
//! Requests on a connection are served in order (the client pipelines several and matches
//! responses by request id). Responses are accumulated and flushed when no further request is
//! already buffered, so a pipelined burst costs one `write` instead of one per response.
//! A malformed frame closes this connection only, with the reason logged.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use super::metrics::Op;
use super::store::{Namespace, TenantId};
use super::Shared;
use farvm_memproto::auth::{proofs_equal, random_bytes};
use farvm_memproto::frame::{
    self, decode_body, decode_header, encode, encode_error, header_bytes, Body, Frame, Opcode,
    FLAG_IF_ABSENT, HEADER_LEN, MAX_BODY,
};
use farvm_memproto::{StatInfo, Status, PROTOCOL_VERSION};

const FLUSH_AT: usize = 256 * 1024;

/// Why a connection ended (logged).
#[derive(Debug, thiserror::Error)]
pub enum ConnEnd {
    /// Socket error or peer closed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent an invalid frame.
    #[error("malformed frame: {0}")]
    Malformed(#[from] frame::FrameError),
    /// A protocol-level violation that ends the session (failed auth, request before auth).
    #[error("{0}")]
    Protocol(&'static str),
    /// The RDMA side of a session failed (set-up, or a failed completion).
    #[error("RDMA: {0}")]
    Rdma(String),
    /// The peer speaks another wire protocol version (answered with `VersionUnsupported`).
    #[error("the client speaks wire protocol version {client}, this server {server}")]
    Version {
        /// The version byte of the peer's frame.
        client: u8,
        /// [`PROTOCOL_VERSION`].
        server: u8,
    },
}

/// One client session's state: its tenant once authenticated, the namespace it used last,
/// and the responses not written yet.
pub(super) struct Session {
    pub tenant: Option<TenantId>,
    cached: Option<(u64, Arc<Namespace>)>,
    pub out: Vec<u8>,
}

impl Session {
    /// A session before authentication, with its first frame (the CHALLENGE, with a fresh
    /// nonce, returned) in `out`.
    pub fn challenge() -> (Self, [u8; 32]) {
        let server_nonce = random_bytes::<32>();
        (Self::challenge_with(server_nonce), server_nonce)
    }

    /// A session before authentication whose CHALLENGE carries `server_nonce`.
    pub fn challenge_with(server_nonce: [u8; 32]) -> Self {
        let mut sess = Session {
            tenant: None,
            cached: None,
            out: Vec::with_capacity(FLUSH_AT + MAX_BODY + 2 * HEADER_LEN),
        };
        let challenge = Frame {
            req_id: 0,
            namespace: 0,
            body: Body::Challenge {
                server_nonce,
                max_version: PROTOCOL_VERSION,
            },
        };
        encode(&mut sess.out, &challenge, false);
        sess
    }
}

/// Serves one connection until it closes or fails.
pub(crate) fn serve(stream: TcpStream, sh: Arc<Shared>) -> Result<(), ConnEnd> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(256 * 1024, stream.try_clone()?);
    let mut writer = stream;
    let (mut sess, server_nonce) = Session::challenge();
    writer.write_all(&sess.out)?;
    sess.out.clear();
    let mut body = vec![0u8; MAX_BODY];
    loop {
        let res = match serve_one(&mut reader, &mut body, &sh, &mut sess, &server_nonce)? {
            Step::Handled(res) => res,
            Step::Closed => return Ok(()),
            Step::OtherVersion(client) => {
                refuse_version(&mut writer, client)?;
                return Err(ConnEnd::Version {
                    client,
                    server: PROTOCOL_VERSION,
                });
            }
        };
        if sess.out.len() >= FLUSH_AT || reader.buffer().is_empty() || res.is_err() {
            writer.write_all(&sess.out)?;
            sess.out.clear();
        }
        res?;
    }
}

/// What reading one frame off a connection came to.
pub(super) enum Step {
    /// A whole frame was decoded and handled (its response is in the session's `out`); the
    /// handler's verdict: an error ends the connection once the response is flushed.
    Handled(Result<(), ConnEnd>),
    /// The peer closed the connection between frames.
    Closed,
    /// The frame's header carries another protocol version (answered by the caller).
    OtherVersion(u8),
}

/// Reads one request frame from `reader` into `body` (at least [`MAX_BODY`] bytes), decodes
/// and handles it. An error is a frame that could not be read or decoded: the connection ends
/// without a response.
pub(super) fn serve_one(
    reader: &mut impl Read,
    body: &mut [u8],
    sh: &Shared,
    sess: &mut Session,
    server_nonce: &[u8; 32],
) -> Result<Step, ConnEnd> {
    let mut hb = [0u8; HEADER_LEN];
    if let Err(e) = reader.read_exact(&mut hb) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Ok(Step::Closed);
        }
        return Err(e.into());
    }
    let h = match decode_header(&hb) {
        Ok(h) => h,
        Err(frame::FrameError::BadVersion(client)) => return Ok(Step::OtherVersion(client)),
        Err(e) => {
            sh.metrics.malformed();
            return Err(e.into());
        }
    };
    let b = &mut body[..h.body_len as usize];
    reader.read_exact(b)?;
    let f = decode_body(&h, b).inspect_err(|_| sh.metrics.malformed())?;
    Ok(Step::Handled(handle(
        sh,
        sess,
        server_nonce,
        h.opcode,
        h.flags,
        &f,
    )))
}

/// Answers a frame of another protocol version with `VersionUnsupported`, naming both
/// versions, so that the peer's operator reads why (its own decoder may still refuse our
/// version byte: it then names ours).
fn refuse_version(writer: &mut TcpStream, client: u8) -> std::io::Result<()> {
    let msg = format!(
        "this memory server speaks wire protocol version {PROTOCOL_VERSION}, the client \
         {client}: run farvm and farvm-memserver from the same release"
    );
    let mut out = Vec::with_capacity(HEADER_LEN + msg.len());
    encode_error(
        &mut out,
        Opcode::Hello,
        Status::VersionUnsupported,
        0,
        0,
        &msg,
    );
    writer.write_all(&out)
}

/// The message of an error answer for a request on a namespace refused with `st`.
fn refusal(st: Status) -> &'static str {
    match st {
        Status::Reclaimed => {
            "the memory pool reclaimed this namespace (its VM's lease expired); it is refused \
             from now on"
        }
        _ => "namespace belongs to another tenant",
    }
}

fn reply_error(sess: &mut Session, op: Opcode, st: Status, f: &Frame<'_>, msg: &str) {
    encode_error(&mut sess.out, op, st, f.req_id, f.namespace, msg);
}

fn namespace(
    sh: &Shared,
    sess: &mut Session,
    tenant: TenantId,
    id: u64,
    create: bool,
) -> Result<Option<Arc<Namespace>>, Status> {
    if let Some((cid, ns)) = &sess.cached {
        // A reclaimed namespace is looked up again (and refused).
        if *cid == id && !ns.is_reclaimed() {
            return Ok(Some(ns.clone()));
        }
    }
    let ns = sh.store.namespace(id, tenant, create)?;
    if let Some(ns) = &ns {
        sess.cached = Some((id, ns.clone()));
    }
    Ok(ns)
}

/// Handles one request frame: its response goes to `sess.out`.
pub(super) fn handle(
    sh: &Shared,
    sess: &mut Session,
    server_nonce: &[u8; 32],
    op: Opcode,
    flags: u8,
    f: &Frame<'_>,
) -> Result<(), ConnEnd> {
    let t0 = Instant::now();
    if let Body::Hello {
        key_id,
        client_nonce,
        mac,
    } = f.body
    {
        if sess.tenant.is_some() {
            reply_error(sess, op, Status::BadRequest, f, "already authenticated");
            sh.metrics
                .record(Op::Hello, Status::BadRequest, t0.elapsed());
            return Ok(());
        }
        if sh.tenants.is_empty() {
            // Open mode (no --token-file): every client is the same anonymous tenant.
            sess.tenant = Some([0; 8]);
            let resp = Body::HelloResp {
                server_mac: [0; 32],
            };
            encode(&mut sess.out, &Frame { body: resp, ..*f }, false);
        } else {
            let ok = sh
                .tenants
                .get(&key_id)
                .filter(|s| proofs_equal(&s.client_proof(server_nonce, &client_nonce), &mac));
            let Some(secret) = ok else {
                reply_error(
                    sess,
                    op,
                    Status::AuthFailed,
                    f,
                    "unknown key or wrong proof",
                );
                sh.metrics
                    .record(Op::Hello, Status::AuthFailed, t0.elapsed());
                return Err(ConnEnd::Protocol("authentication failed"));
            };
            sess.tenant = Some(key_id);
            let resp = Body::HelloResp {
                server_mac: secret.server_proof(server_nonce, &client_nonce),
            };
            encode(&mut sess.out, &Frame { body: resp, ..*f }, false);
        }
        sh.metrics.record(Op::Hello, Status::Ok, t0.elapsed());
        return Ok(());
    }
    let Some(tenant) = sess.tenant else {
        reply_error(sess, op, Status::NotAuthenticated, f, "send HELLO first");
        return Err(ConnEnd::Protocol("request before HELLO"));
    };
    let ns_id = f.namespace;
    match f.body {
        Body::Read(sel) => {
            let ns = match namespace(sh, sess, tenant, ns_id, false) {
                Ok(ns) => ns,
                Err(st) => {
                    reply_error(sess, op, st, f, refusal(st));
                    sh.metrics.record(Op::Read, st, t0.elapsed());
                    return Ok(());
                }
            };
            let at = sess.out.len();
            sess.out.extend_from_slice(&[0u8; HEADER_LEN]);
            let present = sh.store.read(ns.as_deref(), &sel, &mut sess.out);
            let body_len = sess.out.len() - at - HEADER_LEN;
            let n = sel.len() as u32;
            let h = header_bytes(
                Opcode::ReadResp,
                0,
                Status::Ok,
                f.req_id,
                ns_id,
                n,
                body_len,
            );
            sess.out[at..at + HEADER_LEN].copy_from_slice(&h);
            sh.metrics.pages(present as u64, 0, 0);
            sh.metrics.record(Op::Read, Status::Ok, t0.elapsed());
        }
        Body::Write { sel, pages } => {
            let r = namespace(sh, sess, tenant, ns_id, true).and_then(|ns| {
                let ns = ns.ok_or(Status::Denied)?;
                sh.store
                    .write(&ns, &sel, pages, flags & FLAG_IF_ABSENT != 0)
            });
            match r {
                Ok(written) => {
                    let resp = Body::WriteResp { written };
                    encode(&mut sess.out, &Frame { body: resp, ..*f }, false);
                    sh.metrics.pages(0, written as u64, 0);
                    sh.metrics.record(Op::Write, Status::Ok, t0.elapsed());
                }
                Err(st) => {
                    let msg = match st {
                        Status::CapacityExhausted => "server capacity exhausted; batch not stored",
                        Status::ChecksumMismatch => "page crc32c mismatch; batch not stored",
                        st => refusal(st),
                    };
                    reply_error(sess, op, st, f, msg);
                    sh.metrics.record(Op::Write, st, t0.elapsed());
                }
            }
        }
        Body::Discard(sel) => match namespace(sh, sess, tenant, ns_id, false) {
            Ok(ns) => {
                let freed = ns.map_or(0, |ns| sh.store.discard(&ns, &sel));
                let resp = Body::DiscardResp { freed };
                encode(&mut sess.out, &Frame { body: resp, ..*f }, false);
                sh.metrics.pages(0, 0, freed as u64);
                sh.metrics.record(Op::Discard, Status::Ok, t0.elapsed());
            }
            Err(st) => {
                reply_error(sess, op, st, f, refusal(st));
                sh.metrics.record(Op::Discard, st, t0.elapsed());
            }
        },
        Body::Stat => match namespace(sh, sess, tenant, ns_id, false) {
            Ok(ns) => {
                let occ = sh.store.occupancy();
                let info = StatInfo {
                    namespace_pages: sh.store.namespace_pages(ns.as_deref()),
                    ..occ
                };
                encode(
                    &mut sess.out,
                    &Frame {
                        body: Body::StatResp(info),
                        ..*f
                    },
                    false,
                );
                sh.metrics.record(Op::Stat, Status::Ok, t0.elapsed());
            }
            Err(st) => {
                reply_error(sess, op, st, f, refusal(st));
                sh.metrics.record(Op::Stat, st, t0.elapsed());
            }
        },
        _ => {
            // Response opcodes or a CHALLENGE sent to the server.
            reply_error(sess, op, Status::BadRequest, f, "not a request");
            return Err(ConnEnd::Protocol("client sent a non-request frame"));
        }
    }
    Ok(())
}
