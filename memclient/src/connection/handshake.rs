//! The client side of the challenge–response handshake on a fresh TCP stream (PROTOCOL.md,
//! "Handshake"): CHALLENGE in, HELLO with our proof out, HELLO response with the server's
//! proof in. Not on the hot path: frames go through a small owned buffer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use farvm_memproto::auth::{proofs_equal, random_bytes, Secret};
use farvm_memproto::frame::HEADER_LEN;
use farvm_memproto::frame::{decode_body, decode_header, encode, Body, Frame, FrameError};
use farvm_memproto::{Status, PROTOCOL_VERSION};

use crate::ClientError;

/// Maps an I/O error on the connection to `addr` to a connect error.
pub(crate) fn io_err(addr: SocketAddr) -> impl Fn(std::io::Error) -> ClientError {
    move |e| ClientError::Connect {
        addr,
        kind: e.kind(),
    }
}

pub(crate) enum ReadErr {
    Io(std::io::Error),
    /// Why the frame was refused (a peer of another version: `BadVersion`).
    Malformed(FrameError),
}

/// Reads one frame into `buf`; a body longer than `buf` is refused as `TooLarge`.
pub(crate) fn read_frame<'b>(r: &mut impl Read, buf: &'b mut [u8]) -> Result<Frame<'b>, ReadErr> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb).map_err(ReadErr::Io)?;
    let h = decode_header(&hb).map_err(ReadErr::Malformed)?;
    let body = buf
        .get_mut(..h.body_len as usize)
        .ok_or(ReadErr::Malformed(FrameError::TooLarge(h.body_len)))?;
    r.read_exact(body).map_err(ReadErr::Io)?;
    decode_body(&h, body).map_err(ReadErr::Malformed)
}

/// Performs the handshake on a fresh stream.
pub(crate) fn handshake(
    stream: &mut TcpStream,
    addr: SocketAddr,
    secret: Option<&Secret>,
    timeout: Duration,
) -> Result<(), ClientError> {
    let err = io_err(addr);
    stream.set_read_timeout(Some(timeout)).map_err(&err)?;
    let version_err = |server| ClientError::Version {
        addr,
        server,
        client: PROTOCOL_VERSION,
    };
    // A server of another version fails the decoder's version check on its CHALLENGE: the
    // operator should read "version N", not "malformed frame".
    let refused = |e| match e {
        FrameError::BadVersion(v) => version_err(v),
        _ => ClientError::Protocol("malformed handshake frame"),
    };
    let mut buf = vec![0u8; 512];
    let f = read_frame(stream, &mut buf).map_err(|e| match e {
        ReadErr::Io(e) => err(e),
        ReadErr::Malformed(e) => refused(e),
    })?;
    let Body::Challenge {
        server_nonce,
        max_version,
    } = f.body
    else {
        return Err(ClientError::Protocol("expected CHALLENGE"));
    };
    if max_version < PROTOCOL_VERSION {
        return Err(version_err(max_version));
    }
    let client_nonce = random_bytes::<32>();
    let (key_id, mac) = match secret {
        Some(s) => (s.key_id(), s.client_proof(&server_nonce, &client_nonce)),
        None => ([0; 8], [0; 32]),
    };
    let hello = Frame {
        req_id: 0,
        namespace: 0,
        body: Body::Hello {
            key_id,
            client_nonce,
            mac,
        },
    };
    let mut out = Vec::with_capacity(128);
    encode(&mut out, &hello, false);
    stream.write_all(&out).map_err(&err)?;
    let f = read_frame(stream, &mut buf).map_err(|e| match e {
        ReadErr::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => ClientError::Auth {
            addr,
            reason: "server closed the connection during the handshake",
        },
        ReadErr::Io(e) => err(e),
        ReadErr::Malformed(e) => refused(e),
    })?;
    match f.body {
        Body::HelloResp { server_mac } => {
            if let Some(s) = secret {
                if !proofs_equal(&server_mac, &s.server_proof(&server_nonce, &client_nonce)) {
                    return Err(ClientError::Auth {
                        addr,
                        reason: "server could not prove it knows the secret",
                    });
                }
            }
        }
        Body::Error {
            status: Status::AuthFailed,
            ..
        } => {
            return Err(ClientError::Auth {
                addr,
                reason: "server rejected our key or proof",
            })
        }
        Body::Error { status, .. } => return Err(ClientError::from_status(status)),
        _ => return Err(ClientError::Protocol("expected HELLO response")),
    }
    stream.set_read_timeout(None).map_err(&err)?;
    Ok(())
}
