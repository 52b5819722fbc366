//! The wire frame: a fixed 32-byte header plus an opcode-specific body (see PROTOCOL.md).
//!
//! Decoding validates everything (magic, version, opcode, counts, exact body length, bitmap
//! consistency) and returns views that borrow the input, so the server and the client decode
//! without allocating. Encoding appends to a caller-owned `Vec<u8>` that is reused across frames.

use super::{Status, MAX_PAGES_PER_FRAME, PAGE_SIZE, PROTOCOL_VERSION, SEAL_LEN};

/// Magic number at the start of every frame: the bytes `F`, `V`, `M`, `S`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FVMS");
/// Length of the fixed header.
pub const HEADER_LEN: usize = 32;
/// A page on the wire: its crc32c (4 bytes, little endian, over seal and data), its seal
/// ([`SEAL_LEN`] bytes, opaque to the server) and its 4096 bytes.
pub const WIRE_PAGE: usize = 4 + SEAL_LEN + PAGE_SIZE;
/// Where a wire page's seal starts.
pub const WIRE_SEAL_AT: usize = 4;
/// Where a wire page's data starts.
pub const WIRE_DATA_AT: usize = 4 + SEAL_LEN;
/// Bytes of a nonce or a MAC in the handshake.
pub const NONCE_LEN: usize = 32;
/// Longest error message a server sends (bytes of UTF-8).
pub const MAX_ERROR_MESSAGE: usize = 256;
/// Largest body any frame may have: a WRITE of the maximum page count with a scatter list.
pub const MAX_BODY: usize = MAX_PAGES_PER_FRAME * (8 + WIRE_PAGE);

/// Flag: the page selection is a scatter list of indices rather than a contiguous run.
pub const FLAG_SCATTER: u8 = 1 << 0;
/// Flag (WRITE only): store a page only if the namespace does not hold it yet. Used by
/// re-replication so an old copy never overwrites a newer write that raced with it.
pub const FLAG_IF_ABSENT: u8 = 1 << 1;
const KNOWN_FLAGS: u8 = FLAG_SCATTER | FLAG_IF_ABSENT;

/// Frame kinds. Responses carry the request's opcode with the high bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Server → client, first frame on a connection: the server nonce.
    Challenge = 0x7e,
    /// Client → server: key id, client nonce and the client's proof.
    Hello = 0x01,
    /// Read pages.
    Read = 0x02,
    /// Write pages.
    Write = 0x03,
    /// Drop pages.
    Discard = 0x04,
    /// Namespace and server occupancy.
    Stat = 0x05,
    /// Response to HELLO.
    HelloResp = 0x81,
    /// Response to READ.
    ReadResp = 0x82,
    /// Response to WRITE.
    WriteResp = 0x83,
    /// Response to DISCARD.
    DiscardResp = 0x84,
    /// Response to STAT.
    StatResp = 0x85,
}

impl Opcode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x7e => Self::Challenge,
            0x01 => Self::Hello,
            0x02 => Self::Read,
            0x03 => Self::Write,
            0x04 => Self::Discard,
            0x05 => Self::Stat,
            0x81 => Self::HelloResp,
            0x82 => Self::ReadResp,
            0x83 => Self::WriteResp,
            0x84 => Self::DiscardResp,
            0x85 => Self::StatResp,
            _ => return None,
        })
    }

    fn is_response(self) -> bool {
        (self as u8) & 0x80 != 0
    }
}

/// Why a frame was rejected. Any of these closes the connection that sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not `FVMS`.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The header's version is not one this build speaks.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// Unknown opcode byte.
    #[error("unknown opcode {0:#04x}")]
    BadOpcode(u8),
    /// Unknown flag bits, or a flag on an opcode that does not take it.
    #[error("flags {flags:#04x} not valid for {opcode:?}")]
    BadFlags {
        /// The opcode.
        opcode: Opcode,
        /// The flags byte.
        flags: u8,
    },
    /// Unknown status byte.
    #[error("unknown status {0}")]
    BadStatus(u8),
    /// A request carried a non-zero status.
    #[error("request carries status {0}")]
    StatusOnRequest(u8),
    /// Page count above the per-frame limit, or zero where pages are required.
    #[error("page count {0} outside 1..={max}", max = MAX_PAGES_PER_FRAME)]
    BadCount(u32),
    /// The body length does not match what the header announces.
    #[error("body length {got} for {opcode:?} (expected {expected})")]
    BadLength {
        /// The opcode.
        opcode: Opcode,
        /// Declared body length.
        got: usize,
        /// The length the header implies.
        expected: usize,
    },
    /// Body longer than [`MAX_BODY`].
    #[error("body length {0} exceeds the limit {max}", max = MAX_BODY)]
    TooLarge(u32),
    /// A contiguous run would pass the end of the u64 page space.
    #[error("page run {start}+{count} overflows")]
    RunOverflow {
        /// First page.
        start: u64,
        /// Page count.
        count: u32,
    },
    /// A READ response's presence bitmap has bits set past its page count.
    #[error("presence bitmap has bits past the page count")]
    BadBitmap,
    /// An error message that is not UTF-8 or too long.
    #[error("malformed error message")]
    BadMessage,
    /// The buffer is shorter than the frame.
    #[error("truncated frame: have {have} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
}

/// The decoded fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub opcode: Opcode,
    /// Flag bits (`FLAG_*`).
    pub flags: u8,
    /// Outcome (responses only).
    pub status: Status,
    /// Request id chosen by the client, echoed in the response (pipelining).
    pub req_id: u64,
    /// Namespace (VM id).
    pub namespace: u64,
    /// Page count (meaning depends on the opcode).
    pub count: u32,
    /// Length of the body that follows.
    pub body_len: u32,
}

/// Which pages a READ, WRITE or DISCARD names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSel<'a> {
    /// `count` pages from `start`.
    Run {
        /// First page index.
        start: u64,
        /// Number of pages.
        count: u32,
    },
    /// An explicit list: `count` little-endian u64 page indices.
    Scatter(&'a [u8]),
}

impl PageSel<'_> {
    /// Number of pages selected.
    pub fn len(&self) -> usize {
        match self {
            PageSel::Run { count, .. } => *count as usize,
            PageSel::Scatter(b) => b.len() / 8,
        }
    }

    /// True when no page is selected (never for a decoded frame).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th page index. `i` must be below `len()`.
    pub fn index(&self, i: usize) -> u64 {
        match self {
            PageSel::Run { start, .. } => start + i as u64,
            PageSel::Scatter(b) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&b[i * 8..i * 8 + 8]);
                u64::from_le_bytes(a)
            }
        }
    }

    fn wire_len(&self) -> usize {
        match self {
            PageSel::Run { .. } => 8,
            PageSel::Scatter(b) => b.len(),
        }
    }
}

/// Namespace and server occupancy, the body of a STAT response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatInfo {
    /// Pages stored in the namespace.
    pub namespace_pages: u64,
    /// Pages stored on the server, all namespaces.
    pub used_pages: u64,
    /// Server capacity in pages.
    pub capacity_pages: u64,
    /// Random, drawn when the server process started. A client that reconnects to a server
    /// and gets another instance knows the server restarted and lost every page it held.
    pub instance: u64,
}

/// A decoded frame body (borrowing the receive buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// Server nonce and the highest version the server speaks.
    Challenge {
        /// Random per connection.
        server_nonce: [u8; NONCE_LEN],
        /// Highest version the server speaks.
        max_version: u8,
    },
    /// Client proof.
    Hello {
        /// Public identifier of the client's secret (see `auth`).
        key_id: [u8; 8],
        /// Random per connection.
        client_nonce: [u8; NONCE_LEN],
        /// HMAC-SHA256 proving knowledge of the secret.
        mac: [u8; NONCE_LEN],
    },
    /// Server proof (mutual authentication).
    HelloResp {
        /// HMAC-SHA256 proving the server knows the secret too.
        server_mac: [u8; NONCE_LEN],
    },
    /// Read the selected pages.
    Read(PageSel<'a>),
    /// Write pages; `pages` is `count` wire pages (crc32c, seal, 4096 bytes).
    Write {
        /// Which pages.
        sel: PageSel<'a>,
        /// Wire pages.
        pages: &'a [u8],
    },
    /// Drop the selected pages.
    Discard(PageSel<'a>),
    /// Ask for occupancy.
    Stat,
    /// `bitmap` has one bit per requested page; `pages` holds the present ones in order.
    ReadResp {
        /// Number of pages requested.
        count: u32,
        /// Presence bitmap, `ceil(count/8)` bytes, LSB first.
        bitmap: &'a [u8],
        /// Present pages as wire pages.
        pages: &'a [u8],
    },
    /// Pages stored.
    WriteResp {
        /// Count of pages written.
        written: u32,
    },
    /// Pages that existed and were dropped.
    DiscardResp {
        /// Count of pages freed.
        freed: u32,
    },
    /// Occupancy.
    StatResp(StatInfo),
    /// A response with a non-OK status and its message.
    Error {
        /// What failed.
        status: Status,
        /// Human-readable reason.
        message: &'a str,
    },
}

/// A whole decoded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Request id.
    pub req_id: u64,
    /// Namespace.
    pub namespace: u64,
    /// The body.
    pub body: Body<'a>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn check_count(count: u32) -> Result<usize, FrameError> {
    if count == 0 || count as usize > MAX_PAGES_PER_FRAME {
        return Err(FrameError::BadCount(count));
    }
    Ok(count as usize)
}

fn bitmap_len(count: usize) -> usize {
    count.div_ceil(8)
}

/// Decodes and validates a header. The body length it returns is within [`MAX_BODY`], so a
/// reader can size its buffer once.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if b[4] != PROTOCOL_VERSION {
        return Err(FrameError::BadVersion(b[4]));
    }
    let opcode = Opcode::from_u8(b[5]).ok_or(FrameError::BadOpcode(b[5]))?;
    let flags = b[6];
    let status = Status::from_u8(b[7]).ok_or(FrameError::BadStatus(b[7]))?;
    if !opcode.is_response() && status != Status::Ok {
        return Err(FrameError::StatusOnRequest(b[7]));
    }
    let allowed = match opcode {
        Opcode::Read | Opcode::Discard => FLAG_SCATTER,
        Opcode::Write => KNOWN_FLAGS,
        _ => 0,
    };
    if flags & !allowed != 0 {
        return Err(FrameError::BadFlags { opcode, flags });
    }
    let body_len = u32_at(b, 28);
    if body_len as usize > MAX_BODY {
        return Err(FrameError::TooLarge(body_len));
    }
    Ok(Header {
        opcode,
        flags,
        status,
        req_id: u64_at(b, 8),
        namespace: u64_at(b, 16),
        count: u32_at(b, 24),
        body_len,
    })
}

fn expect_len(opcode: Opcode, got: usize, expected: usize) -> Result<(), FrameError> {
    if got != expected {
        return Err(FrameError::BadLength {
            opcode,
            got,
            expected,
        });
    }
    Ok(())
}

fn decode_sel<'a>(h: &Header, body: &'a [u8]) -> Result<(PageSel<'a>, usize), FrameError> {
    let count = check_count(h.count)?;
    if h.flags & FLAG_SCATTER != 0 {
        let n = count * 8;
        if body.len() < n {
            return Err(FrameError::BadLength {
                opcode: h.opcode,
                got: body.len(),
                expected: n,
            });
        }
        Ok((PageSel::Scatter(&body[..n]), n))
    } else {
        if body.len() < 8 {
            return Err(FrameError::BadLength {
                opcode: h.opcode,
                got: body.len(),
                expected: 8,
            });
        }
        let start = u64_at(body, 0);
        if start.checked_add(count as u64 - 1).is_none() {
            return Err(FrameError::RunOverflow {
                start,
                count: h.count,
            });
        }
        Ok((
            PageSel::Run {
                start,
                count: h.count,
            },
            8,
        ))
    }
}

/// Length of the presence bitmap that starts the body of a successful READ response with
/// this header (its page count checked).
pub fn read_resp_bitmap_len(h: &Header) -> Result<usize, FrameError> {
    Ok(bitmap_len(check_count(h.count)?))
}

/// Checks a successful READ response's presence bitmap against its header (no bit past the
/// page count, a body of exactly the bitmap plus one wire page per present page) and returns
/// the number of present pages. With it a receiver can parse the bitmap first and then
/// receive the pages straight into their destinations.
pub fn read_resp_present(h: &Header, bitmap: &[u8]) -> Result<usize, FrameError> {
    let count = check_count(h.count)?;
    let bl = bitmap_len(count);
    if bitmap.len() != bl {
        return Err(FrameError::BadLength {
            opcode: h.opcode,
            got: bitmap.len(),
            expected: bl,
        });
    }
    if count % 8 != 0 && bitmap[bl - 1] >> (count % 8) != 0 {
        return Err(FrameError::BadBitmap);
    }
    let present: usize = bitmap.iter().map(|b| b.count_ones() as usize).sum();
    expect_len(h.opcode, h.body_len as usize, bl + present * WIRE_PAGE)?;
    Ok(present)
}

/// Decodes a body whose header was accepted by [`decode_header`]. `body` must be exactly
/// `header.body_len` bytes.
pub fn decode_body<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, FrameError> {
    expect_len(h.opcode, body.len(), h.body_len as usize)?;
    let frame = |body| {
        Ok(Frame {
            req_id: h.req_id,
            namespace: h.namespace,
            body,
        })
    };
    let pageless = matches!(
        h.opcode,
        Opcode::Challenge | Opcode::Hello | Opcode::HelloResp | Opcode::Stat | Opcode::StatResp
    );
    if (pageless || h.status != Status::Ok) && h.count != 0 {
        return Err(FrameError::BadCount(h.count));
    }
    if h.opcode.is_response() && h.status != Status::Ok {
        if body.len() > MAX_ERROR_MESSAGE {
            return Err(FrameError::BadMessage);
        }
        let message = std::str::from_utf8(body).map_err(|_| FrameError::BadMessage)?;
        return frame(Body::Error {
            status: h.status,
            message,
        });
    }
    match h.opcode {
        Opcode::Challenge => {
            expect_len(h.opcode, body.len(), NONCE_LEN + 1)?;
            let mut server_nonce = [0u8; NONCE_LEN];
            server_nonce.copy_from_slice(&body[..NONCE_LEN]);
            frame(Body::Challenge {
                server_nonce,
                max_version: body[NONCE_LEN],
            })
        }
        Opcode::Hello => {
            expect_len(h.opcode, body.len(), 8 + 2 * NONCE_LEN)?;
            let mut key_id = [0u8; 8];
            let mut client_nonce = [0u8; NONCE_LEN];
            let mut mac = [0u8; NONCE_LEN];
            key_id.copy_from_slice(&body[..8]);
            client_nonce.copy_from_slice(&body[8..8 + NONCE_LEN]);
            mac.copy_from_slice(&body[8 + NONCE_LEN..]);
            frame(Body::Hello {
                key_id,
                client_nonce,
                mac,
            })
        }
        Opcode::HelloResp => {
            expect_len(h.opcode, body.len(), NONCE_LEN)?;
            let mut server_mac = [0u8; NONCE_LEN];
            server_mac.copy_from_slice(body);
            frame(Body::HelloResp { server_mac })
        }
        Opcode::Read | Opcode::Discard => {
            let (sel, used) = decode_sel(h, body)?;
            expect_len(h.opcode, body.len(), used)?;
            frame(if h.opcode == Opcode::Read {
                Body::Read(sel)
            } else {
                Body::Discard(sel)
            })
        }
        Opcode::Write => {
            let (sel, used) = decode_sel(h, body)?;
            expect_len(h.opcode, body.len(), used + sel.len() * WIRE_PAGE)?;
            frame(Body::Write {
                sel,
                pages: &body[used..],
            })
        }
        Opcode::Stat => {
            expect_len(h.opcode, body.len(), 0)?;
            frame(Body::Stat)
        }
        Opcode::ReadResp => {
            let bl = read_resp_bitmap_len(h)?;
            if body.len() < bl {
                return Err(FrameError::BadLength {
                    opcode: h.opcode,
                    got: body.len(),
                    expected: bl,
                });
            }
            let bitmap = &body[..bl];
            read_resp_present(h, bitmap)?;
            frame(Body::ReadResp {
                count: h.count,
                bitmap,
                pages: &body[bl..],
            })
        }
        Opcode::WriteResp | Opcode::DiscardResp => {
            expect_len(h.opcode, body.len(), 0)?;
            if h.count as usize > MAX_PAGES_PER_FRAME {
                return Err(FrameError::BadCount(h.count));
            }
            frame(if h.opcode == Opcode::WriteResp {
                Body::WriteResp { written: h.count }
            } else {
                Body::DiscardResp { freed: h.count }
            })
        }
        Opcode::StatResp => {
            expect_len(h.opcode, body.len(), 32)?;
            frame(Body::StatResp(StatInfo {
                namespace_pages: u64_at(body, 0),
                used_pages: u64_at(body, 8),
                capacity_pages: u64_at(body, 16),
                instance: u64_at(body, 24),
            }))
        }
    }
}

/// Decodes one complete frame from the front of `buf`; returns it and the bytes consumed.
pub fn decode(buf: &[u8]) -> Result<(Frame<'_>, usize), FrameError> {
    if buf.len() < HEADER_LEN {
        return Err(FrameError::Truncated {
            have: buf.len(),
            need: HEADER_LEN,
        });
    }
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&buf[..HEADER_LEN]);
    let h = decode_header(&hb)?;
    let end = HEADER_LEN + h.body_len as usize;
    if buf.len() < end {
        return Err(FrameError::Truncated {
            have: buf.len(),
            need: end,
        });
    }
    Ok((decode_body(&h, &buf[HEADER_LEN..end])?, end))
}

/// Appends a header. `body_len` must be the exact length of the body the caller appends next.
#[allow(clippy::too_many_arguments)]
pub fn put_header(
    out: &mut Vec<u8>,
    opcode: Opcode,
    flags: u8,
    status: Status,
    req_id: u64,
    namespace: u64,
    count: u32,
    body_len: usize,
) {
    out.extend_from_slice(&header_bytes(
        opcode, flags, status, req_id, namespace, count, body_len,
    ));
}

/// The 32 header bytes (see [`put_header`]).
#[allow(clippy::too_many_arguments)]
pub fn header_bytes(
    opcode: Opcode,
    flags: u8,
    status: Status,
    req_id: u64,
    namespace: u64,
    count: u32,
    body_len: usize,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4] = PROTOCOL_VERSION;
    h[5] = opcode as u8;
    h[6] = flags;
    h[7] = status as u8;
    h[8..16].copy_from_slice(&req_id.to_le_bytes());
    h[16..24].copy_from_slice(&namespace.to_le_bytes());
    h[24..28].copy_from_slice(&count.to_le_bytes());
    h[28..32].copy_from_slice(&(body_len as u32).to_le_bytes());
    h
}

fn put_sel(out: &mut Vec<u8>, sel: &PageSel<'_>) {
    match sel {
        PageSel::Run { start, .. } => out.extend_from_slice(&start.to_le_bytes()),
        PageSel::Scatter(b) => out.extend_from_slice(b),
    }
}

fn sel_flags(sel: &PageSel<'_>) -> u8 {
    match sel {
        PageSel::Run { .. } => 0,
        PageSel::Scatter(_) => FLAG_SCATTER,
    }
}

/// Appends `frame` to `out`. `if_absent` sets [`FLAG_IF_ABSENT`] on a WRITE. Produces exactly
/// what [`decode`] accepts, as long as the frame itself is within the protocol limits.
pub fn encode(out: &mut Vec<u8>, f: &Frame<'_>, if_absent: bool) {
    let (id, ns) = (f.req_id, f.namespace);
    match &f.body {
        Body::Challenge {
            server_nonce,
            max_version,
        } => {
            put_header(
                out,
                Opcode::Challenge,
                0,
                Status::Ok,
                id,
                ns,
                0,
                NONCE_LEN + 1,
            );
            out.extend_from_slice(server_nonce);
            out.push(*max_version);
        }
        Body::Hello {
            key_id,
            client_nonce,
            mac,
        } => {
            put_header(
                out,
                Opcode::Hello,
                0,
                Status::Ok,
                id,
                ns,
                0,
                8 + 2 * NONCE_LEN,
            );
            out.extend_from_slice(key_id);
            out.extend_from_slice(client_nonce);
            out.extend_from_slice(mac);
        }
        Body::HelloResp { server_mac } => {
            put_header(out, Opcode::HelloResp, 0, Status::Ok, id, ns, 0, NONCE_LEN);
            out.extend_from_slice(server_mac);
        }
        Body::Read(sel) | Body::Discard(sel) => {
            let op = if matches!(f.body, Body::Read(_)) {
                Opcode::Read
            } else {
                Opcode::Discard
            };
            let n = sel.len() as u32;
            put_header(
                out,
                op,
                sel_flags(sel),
                Status::Ok,
                id,
                ns,
                n,
                sel.wire_len(),
            );
            put_sel(out, sel);
        }
        Body::Write { sel, pages } => {
            let flags = sel_flags(sel) | if if_absent { FLAG_IF_ABSENT } else { 0 };
            let n = sel.len() as u32;
            let len = sel.wire_len() + pages.len();
            put_header(out, Opcode::Write, flags, Status::Ok, id, ns, n, len);
            put_sel(out, sel);
            out.extend_from_slice(pages);
        }
        Body::Stat => put_header(out, Opcode::Stat, 0, Status::Ok, id, ns, 0, 0),
        Body::ReadResp {
            count,
            bitmap,
            pages,
        } => {
            let len = bitmap.len() + pages.len();
            put_header(out, Opcode::ReadResp, 0, Status::Ok, id, ns, *count, len);
            out.extend_from_slice(bitmap);
            out.extend_from_slice(pages);
        }
        Body::WriteResp { written } => {
            put_header(out, Opcode::WriteResp, 0, Status::Ok, id, ns, *written, 0)
        }
        Body::DiscardResp { freed } => {
            put_header(out, Opcode::DiscardResp, 0, Status::Ok, id, ns, *freed, 0)
        }
        Body::StatResp(s) => {
            put_header(out, Opcode::StatResp, 0, Status::Ok, id, ns, 0, 32);
            out.extend_from_slice(&s.namespace_pages.to_le_bytes());
            out.extend_from_slice(&s.used_pages.to_le_bytes());
            out.extend_from_slice(&s.capacity_pages.to_le_bytes());
            out.extend_from_slice(&s.instance.to_le_bytes());
        }
        Body::Error { .. } => unreachable_error(out, f),
    }
}

/// Encodes an error response; the opcode is the response opcode of the failed request.
pub fn encode_error(
    out: &mut Vec<u8>,
    response_to: Opcode,
    status: Status,
    req_id: u64,
    ns: u64,
    msg: &str,
) {
    let mut end = msg.len().min(MAX_ERROR_MESSAGE);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    let op = Opcode::from_u8(response_to as u8 | 0x80).unwrap_or(Opcode::HelloResp);
    put_header(out, op, 0, status, req_id, ns, 0, end);
    out.extend_from_slice(&msg.as_bytes()[..end]);
}

// An `Error` body does not say which request opcode it answers; `encode` maps it to a
// HELLO response. Real senders call `encode_error` with the request's opcode.
fn unreachable_error(out: &mut Vec<u8>, f: &Frame<'_>) {
    if let Body::Error { status, message } = f.body {
        encode_error(out, Opcode::Hello, status, f.req_id, f.namespace, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver checks a READ response's bitmap before any page of it arrives.
    #[test]
    fn a_read_response_bitmap_is_checked_before_its_pages() {
        let mut read = Vec::new();
        let f = Frame {
            req_id: 4,
            namespace: 3,
            body: Body::ReadResp {
                count: 3,
                bitmap: &[0b0000_0101],
                pages: &[0u8; 2 * WIRE_PAGE],
            },
        };
        encode(&mut read, &f, false);
        let hb = read.first_chunk::<HEADER_LEN>().expect("header");
        let h = decode_header(hb).expect("header decodes");
        assert_eq!(read_resp_bitmap_len(&h), Ok(1));
        assert_eq!(read_resp_present(&h, &[0b0000_0101]), Ok(2));
        // A bit past the page count, or a bitmap that does not match the body length.
        assert_eq!(
            read_resp_present(&h, &[0b0000_1101]),
            Err(FrameError::BadBitmap)
        );
        assert!(matches!(
            read_resp_present(&h, &[0b0000_0001]),
            Err(FrameError::BadLength { .. })
        ));
    }
}
