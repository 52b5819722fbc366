//! What every link encodes and decodes the same way, whatever carries the bytes: a ticket's
//! request frame, and the outcome of a response that carries no pages.

use farvm_memproto::frame::{header_bytes, Body, Frame, Opcode, FLAG_SCATTER, WIRE_PAGE};
use farvm_memproto::{PageSel, Status};

use crate::tickets::{Ticket, TicketOp};
use crate::ClientError;

/// Appends request `req_id` for ticket `t` (header, page selection, and a write's wire pages)
/// to `buf`, which must have room for the largest frame if it is not to grow.
pub(crate) fn encode_request(buf: &mut Vec<u8>, req_id: u64, t: &Ticket) {
    let ns = t.ns;
    let Some(io) = t.io.as_ref() else {
        // Stat carries no buffer.
        let h = header_bytes(Opcode::Stat, 0, Status::Ok, req_id, ns, 0, 0);
        buf.extend_from_slice(&h);
        return;
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
            return;
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
            buf.extend_from_slice(&io.crc(i).to_le_bytes());
            buf.extend_from_slice(io.page(i));
        }
    }
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
