//! What every link encodes and decodes the same way, whatever carries the bytes: a ticket's
//! request frame (a write's pages sealed in place in the send buffer when the link seals), the
//! check of a READ response's pages where they landed (crc32c, then the seal), and the outcome
//! of a response that carries no pages.

use farvm_memproto::frame::{
    header_bytes, Body, Frame, Opcode, FLAG_SCATTER, WIRE_DATA_AT, WIRE_PAGE, WIRE_SEAL_AT,
};
use farvm_memproto::{page_crc, wire_crc, PageSel, Status, PAGE_SIZE, SEAL_LEN};
use farvm_seal::{PageAddr, PageSealer, Seal};

use crate::tickets::{Ticket, TicketOp};
use crate::{ClientError, IoBuf};

/// Appends request `req_id` for ticket `t` (header, page selection, and a write's wire pages)
/// to `buf`, which must have room for the largest frame if it is not to grow. With `sealer`,
/// a write whose pages carry versions is sealed: each page is copied into `buf` and encrypted
/// there, its seal beside it, and the crc32c covers what is sent. Fails only if the sealer
/// ran out of nonces (2^64 pages): `buf` then holds a partial frame not to be sent.
pub(crate) fn encode_request(
    buf: &mut Vec<u8>,
    req_id: u64,
    t: &Ticket,
    mut sealer: Option<&mut PageSealer>,
) -> Result<(), farvm_seal::SealError> {
    let ns = t.ns;
    let Some(io) = t.io.as_ref() else {
        // Stat carries no buffer.
        let h = header_bytes(Opcode::Stat, 0, Status::Ok, req_id, ns, 0, 0);
        buf.extend_from_slice(&h);
        return Ok(());
    };
    let sel = io.sel();
    let n = sel.len();
    let (sel_len, flags) = match sel {
        PageSel::Run { .. } => (8, 0),
        PageSel::Scatter(b) => (b.len(), FLAG_SCATTER),
    };
    let (op, body_len) = match t.op {
        TicketOp::Read => (Opcode::Read, sel_len),
        TicketOp::Discard => (Opcode::Discard, sel_len),
        TicketOp::Write => (Opcode::Write, sel_len + n * WIRE_PAGE),
        TicketOp::Stat => {
            let h = header_bytes(Opcode::Stat, 0, Status::Ok, req_id, ns, 0, 0);
            buf.extend_from_slice(&h);
            return Ok(());
        }
    };
    buf.extend_from_slice(&header_bytes(
        op,
        flags,
        Status::Ok,
        req_id,
        ns,
        n as u32,
        body_len,
    ));
    match sel {
        PageSel::Run { start, .. } => buf.extend_from_slice(&start.to_le_bytes()),
        PageSel::Scatter(b) => buf.extend_from_slice(b),
    }
    if t.op == TicketOp::Write {
        for i in 0..n {
            // A raw buffer sends the seal it holds; a versioned one is sealed here, or sent
            // with a zero seal by a link that does not seal.
            let at = buf.len();
            buf.extend_from_slice(&[0; 4]);
            match io.version(i) {
                None => buf.extend_from_slice(io.seal(i)),
                Some(_) => buf.extend_from_slice(&[0; SEAL_LEN]),
            }
            buf.extend_from_slice(io.page(i));
            let wp = &mut buf[at..at + WIRE_PAGE];
            if let (Some(s), Some(version)) = (sealer.as_deref_mut(), io.version(i)) {
                let (head, data) = wp.split_at_mut(WIRE_DATA_AT);
                let data: &mut [u8; PAGE_SIZE] = data.try_into().expect("a wire page's data");
                let addr = PageAddr {
                    namespace: ns,
                    page: io.page_index(i),
                    version: version.0,
                };
                head[WIRE_SEAL_AT..].copy_from_slice(&s.seal(addr, data)?.0);
            }
            let crc = page_crc(&wp[WIRE_SEAL_AT..]);
            wp[..4].copy_from_slice(&crc.to_le_bytes());
        }
    }
    Ok(())
}

/// Applies a response without pages to the ticket (stat) and returns its outcome.
pub(crate) fn apply_response(t: &mut Ticket, f: &Frame<'_>) -> Result<u32, ClientError> {
    match (t.op, f.body) {
        (_, Body::Error { status, .. }) => Err(ClientError::from_status(status)),
        (TicketOp::Write, Body::WriteResp { written }) => Ok(written),
        (TicketOp::Discard, Body::DiscardResp { freed }) => Ok(freed),
        (TicketOp::Stat, Body::StatResp(info)) => {
            t.stat = info;
            Ok(0)
        }
        _ => Err(ClientError::Protocol("response does not match the request")),
    }
}

/// Accepts a READ response's pages landed in `io` (the request's buffer for namespace
/// `namespace`): `bitmap` is the response's presence bitmap, checked against its header;
/// each present entry's seal and bytes are in `io`, its wire crc32c in `crcs` (in order of
/// the present entries). Every crc32c is checked, then, with `opener`, every page that carries
/// a version is authenticated and decrypted in place at (namespace, page number, version);
/// only when all of them pass are the pages marked present. Otherwise no page is marked
/// present and a page that failed to open is zeroed: nothing unauthentic is ever delivered.
#[doc(hidden)]
pub fn accept_read_pages(
    io: &mut IoBuf,
    namespace: u64,
    bitmap: &[u8],
    crcs: &[[u8; 4]],
    opener: Option<&mut PageSealer>,
) -> Result<u32, ClientError> {
    let present = |i: &usize| bitmap.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0);
    let count = io.len();
    let landed = (0..count).filter(present).count();
    if landed > crcs.len() {
        io.clear_present();
        return Err(ClientError::Protocol(
            "READ response has more pages than crc32c values",
        ));
    }
    let intact = (0..count)
        .filter(present)
        .zip(crcs.iter())
        .all(|(i, crc)| wire_crc(io.seal(i), io.page(i)) == u32::from_le_bytes(*crc));
    if !intact {
        io.clear_present();
        return Err(ClientError::ChecksumMismatch);
    }
    if let Some(opener) = opener {
        for i in (0..count).filter(present) {
            let Some(version) = io.version(i) else {
                continue;
            };
            let addr = PageAddr {
                namespace,
                page: io.page_index(i),
                version: version.0,
            };
            let seal = Seal(*io.seal(i));
            let opened = match <&mut [u8; PAGE_SIZE]>::try_from(io.page_mut(i)) {
                Ok(page) => opener.open(addr, page, &seal).is_ok(),
                Err(_) => false,
            };
            if !opened {
                io.clear_present();
                return Err(ClientError::Unauthentic);
            }
        }
    }
    io.set_present_from(bitmap);
    Ok(landed as u32)
}
