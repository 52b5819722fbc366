//! Mapping of RDMA work-completion status codes (`ibv_wc_status`, stable verbs ABI values)
//! to client errors: remote access faults mean the grant is gone (another tenant, or the
//! slab moved); transport retries exhausted or flushes mean the server or path died, which
//! triggers fail-over exactly like a lost TCP connection.

use crate::ClientError;

/// `IBV_WC_SUCCESS`.
pub const WC_SUCCESS: u32 = 0;
const WC_LOC_LEN_ERR: u32 = 1;
const WC_LOC_QP_OP_ERR: u32 = 2;
const WC_LOC_PROT_ERR: u32 = 4;
const WC_WR_FLUSH_ERR: u32 = 5;
const WC_LOC_ACCESS_ERR: u32 = 8;
const WC_REM_INV_REQ_ERR: u32 = 9;
const WC_REM_ACCESS_ERR: u32 = 10;
const WC_REM_OP_ERR: u32 = 11;
const WC_RETRY_EXC_ERR: u32 = 12;
const WC_RNR_RETRY_EXC_ERR: u32 = 13;
const WC_REM_ABORT_ERR: u32 = 16;
const WC_FATAL_ERR: u32 = 19;
const WC_RESP_TIMEOUT_ERR: u32 = 20;

/// `Ok` for success, else the client error for a completion status.
pub fn map_status(status: u32) -> Result<(), ClientError> {
    match status {
        WC_SUCCESS => Ok(()),
        WC_REM_ACCESS_ERR | WC_REM_INV_REQ_ERR => Err(ClientError::Denied),
        WC_RETRY_EXC_ERR | WC_RNR_RETRY_EXC_ERR | WC_WR_FLUSH_ERR | WC_FATAL_ERR
        | WC_RESP_TIMEOUT_ERR | WC_REM_ABORT_ERR | WC_REM_OP_ERR => Err(ClientError::Disconnected),
        WC_LOC_LEN_ERR | WC_LOC_QP_OP_ERR | WC_LOC_PROT_ERR | WC_LOC_ACCESS_ERR => Err(
            ClientError::InvalidRequest("local RDMA error (bad local buffer or queue pair)"),
        ),
        _ => Err(ClientError::Protocol("unexpected RDMA completion status")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_fail_over_or_denial() {
        assert_eq!(map_status(0), Ok(()));
        assert_eq!(map_status(10), Err(ClientError::Denied));
        for s in [5, 12, 13, 19, 20] {
            let e = map_status(s).unwrap_err();
            assert!(e.is_server_failure(), "status {s} must fail over");
        }
        assert!(!map_status(4).unwrap_err().is_server_failure());
        assert!(map_status(999).is_err());
    }
}
