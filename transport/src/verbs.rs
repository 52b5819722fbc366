//! The verbs layer (feature `verbs`), on rdma-core: `sideway` for set-up (device, protection
//! domain, memory registration, completion queue, reliable-connected queue pair and its state
//! changes) and rdma-core's inline data-path calls (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`) directly, with work requests and completions on the stack, so the data path
//! allocates nothing. rdma-core is loaded at run time (`rdma-mummy-sys` dlopens libibverbs):
//! a binary built with RDMA starts on a host without it and reports "no RDMA device".
//!
//! Device choice follows the IP route, as rdma_cm does: the device is the one with a RoCE GID
//! for the local address of the TCP control connection, so two devices on one host (two
//! Soft-RoCE devices on a veth pair) each serve their own address.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys::{
    ibv_poll_cq, ibv_post_recv, ibv_post_send, ibv_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr,
    ibv_sge, ibv_wc, ibv_wr_opcode,
};
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, GenericCompletionQueue,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
pub use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairState};
use sideway::ibverbs::AccessFlags;

use farvm_memproto::rdma::endpoint::QpEndpoint;

/// RDMA set-up failures.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// The device list is empty: no RDMA driver, or rdma-core's libibverbs is not installed.
    #[error(
        "no RDMA device (ibv_get_device_list is empty): load an RDMA driver (Soft-RoCE: \
         `modprobe rdma_rxe` and `rdma link add rxe0 type rxe netdev IFACE`) and install \
         rdma-core's libibverbs1 and ibverbs-providers"
    )]
    NoDevice,
    /// No device has a RoCE GID for the local address the peer is reached from.
    #[error(
        "no RDMA device has a RoCE GID for {ip} (devices: {devices}): the RDMA device must sit \
         on the interface the memory server is reached through"
    )]
    NoGid {
        /// The local address.
        ip: IpAddr,
        /// The devices seen.
        devices: String,
    },
    /// A verbs call failed.
    #[error("{call} failed: {reason}")]
    Verbs {
        /// The verbs call.
        call: &'static str,
        /// Its error.
        reason: String,
    },
}

fn verbs<E: std::fmt::Debug>(call: &'static str) -> impl Fn(E) -> RdmaError {
    move |e| RdmaError::Verbs {
        call,
        reason: format!("{e:?}"),
    }
}

/// `IBV_GID_TYPE_ROCE_V2`: UDP-encapsulated RoCE, routable (Soft-RoCE speaks only this).
const GID_TYPE_ROCE_V2: u32 = 2;

/// The GID bytes of `ip` (IPv4-mapped for IPv4, as RoCE fills its GID table).
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// An opened device with a protection domain, on the port and GID of one local address.
pub struct RdmaDevice {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    name: String,
    port: u8,
    gid_index: u32,
    gid: [u8; 16],
    mtu: Mtu,
}

impl RdmaDevice {
    /// Opens the device (port 1) that has a RoCE GID for `ip`, preferring RoCE v2.
    pub fn for_local_ip(ip: IpAddr) -> Result<Self, RdmaError> {
        let list = DeviceList::new().map_err(|_| RdmaError::NoDevice)?;
        if list.is_empty() {
            return Err(RdmaError::NoDevice);
        }
        let want = gid_of(ip);
        let port = 1u8;
        let mut names = Vec::new();
        for dev in list.iter() {
            names.push(dev.name());
            let Ok(ctx) = dev.open() else { continue };
            let Ok(attr) = ctx.query_port(port) else {
                continue;
            };
            let mut found = None;
            for i in 0..attr.gid_tbl_len().max(0) as u32 {
                let Ok(g) = ctx.query_gid(port, i) else {
                    continue;
                };
                if g.raw != want {
                    continue;
                }
                let v2 = ctx.query_gid_type(port, i).ok() == Some(GID_TYPE_ROCE_V2);
                if v2 || found.is_none() {
                    found = Some(i);
                }
                if v2 {
                    break;
                }
            }
            let Some(gid_index) = found else { continue };
            let pd = ctx.alloc_pd().map_err(verbs("ibv_alloc_pd"))?;
            let name = dev.name();
            tracing::debug!(device = %name, gid_index, %ip, "RDMA device chosen");
            return Ok(Self {
                ctx,
                pd,
                name,
                port,
                gid_index,
                gid: want,
                mtu: attr.active_mtu(),
            });
        }
        Err(RdmaError::NoGid {
            ip,
            devices: names.join(", "),
        })
    }

    /// The device's name (e.g. `rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers `len` bytes at `ptr` for local writes (receives land there).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped for the lifetime of the returned region.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Arc<MemoryRegion>, RdmaError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.pd.reg_mr(ptr as usize, len, AccessFlags::LocalWrite) }
            .map_err(verbs("ibv_reg_mr"))
    }

    /// Registers `len` bytes at `ptr` for local writes and for remote reads and writes by the
    /// peers of this device's queue pairs (a granted slab).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped for the lifetime of the returned region, and may be
    /// read and written by the remote peer at any time while it lives.
    pub unsafe fn register_remote(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Arc<MemoryRegion>, RdmaError> {
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite;
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.pd.reg_mr(ptr as usize, len, access) }.map_err(verbs("ibv_reg_mr"))
    }
}

/// RDMA READs a queue pair keeps in flight as initiator, and accepts as responder.
const RD_ATOMIC: u8 = 16;

/// A one-sided operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneSided {
    /// RDMA READ: remote memory into the local buffer.
    Read,
    /// RDMA WRITE: the local buffer into remote memory.
    Write,
}

/// One completion, as the data path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// `ibv_wc_status` (0: success; the client maps the rest in `farvm_memclient`'s `wc`).
    pub status: u32,
    /// A receive (else a send).
    pub recv: bool,
    /// Bytes received.
    pub byte_len: u32,
}

impl Completion {
    /// A blank entry, for the arrays completions are polled into.
    pub const EMPTY: Self = Self {
        wr_id: 0,
        status: 0,
        recv: false,
        byte_len: 0,
    };
}

/// Completions polled at most per call.
pub const POLL_BATCH: usize = 16;

/// A reliable-connected queue pair with its completion queue (sends and receives share it) and
/// the CQ's completion channel: a thread with nothing to poll arms the CQ ([`Self::arm`]) and
/// sleeps on the channel's fd ([`Self::event_fd`]) until a completion arrives, so an idle queue
/// pair costs no CPU.
pub struct RcQueuePair {
    // Field order is drop order: the QP before its CQ, the CQ before its channel (the CQ
    // holds the channel too).
    qp: BasicQueuePair,
    _cq: Arc<BasicCompletionQueue>,
    chan: Arc<CompletionChannel>,
    raw_qp: NonNull<ibv_qp>,
    raw_cq: NonNull<rdma_mummy_sys::ibv_cq>,
    local: QpEndpoint,
    port: u8,
    gid_index: u32,
    mtu: Mtu,
}

// SAFETY: the raw pointers are the QP and CQ this struct owns (through `qp` and `cq`, which are
// Send + Sync); rdma-core's post and poll calls are thread safe (the provider locks per queue).
unsafe impl Send for RcQueuePair {}
// SAFETY: as above.
unsafe impl Sync for RcQueuePair {}

impl RcQueuePair {
    /// Creates a QP for `send_depth` outstanding send-queue work requests and `recv_depth`
    /// posted receives, and moves it to INIT. `remote_access`: the peer may RDMA READ and
    /// WRITE memory registered for it (the server's side).
    pub fn new(
        dev: &RdmaDevice,
        send_depth: u32,
        recv_depth: u32,
        remote_access: bool,
    ) -> Result<Self, RdmaError> {
        let chan = dev
            .ctx
            .create_comp_channel()
            .map_err(verbs("ibv_create_comp_channel"))?;
        // Events are taken without blocking (`take_events`); threads wait with poll(2).
        chan.set_nonblocking(true)
            .map_err(verbs("fcntl(completion channel, O_NONBLOCK)"))?;
        let cq = dev
            .ctx
            .create_cq_builder()
            .setup_cqe(send_depth + recv_depth)
            .setup_comp_channel(&chan, 0)
            .build()
            .map_err(verbs("ibv_create_cq"))?;
        let cqh = GenericCompletionQueue::from(Arc::clone(&cq));
        let mut qp = dev
            .pd
            .create_qp_builder()
            .setup_send_cq(cqh.clone())
            .setup_recv_cq(cqh)
            .setup_max_send_wr(send_depth)
            .setup_max_recv_wr(recv_depth)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .build()
            .map_err(verbs("ibv_create_qp"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(dev.port)
            .setup_access_flags(if remote_access {
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite
            } else {
                AccessFlags::LocalWrite
            });
        qp.modify(&attr).map_err(verbs("ibv_modify_qp(INIT)"))?;
        let lid = dev
            .ctx
            .query_port(dev.port)
            .map_err(verbs("ibv_query_port"))?
            .lid();
        let psn = u32::from_le_bytes(farvm_memproto::auth::random_bytes::<4>()) & 0xff_ffff;
        // SAFETY: the handles of the QP and CQ just created; they live as long as `qp`/`cq`.
        let (raw_qp, raw_cq) = unsafe { (qp.qp(), cq.cq()) };
        let local = QpEndpoint {
            qpn: qp.qp_number(),
            psn,
            lid,
            gid: dev.gid,
        };
        Ok(Self {
            qp,
            _cq: cq,
            chan,
            raw_qp,
            raw_cq,
            local,
            port: dev.port,
            gid_index: dev.gid_index,
            mtu: dev.mtu,
        })
    }

    /// This side's address, to send to the peer.
    pub fn endpoint(&self) -> QpEndpoint {
        self.local
    }

    /// Connects to the peer (INIT → RTR → RTS).
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<(), RdmaError> {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(self.mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(RD_ATOMIC)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        let gid = Gid { raw: remote.gid };
        ah.setup_dest_lid(remote.lid)
            .setup_port(self.port)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.gid_index as u8)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(64);
        attr.setup_address_vector(&ah);
        self.qp.modify(&attr).map_err(verbs("ibv_modify_qp(RTR)"))?;
        let mut attr = QueuePairAttribute::new();
        // Timeout 18 (4.096 µs × 2^18 ≈ 1.07 s) × 7 retries: long enough that a slow path (an
        // RDMA READ's response of many packets under emulation) is not retried while it still
        // streams in; a peer that died is seen sooner through the control connection, which
        // the kernel closes. Receiver-not-ready retries forever (7), which is flow control,
        // not failure (the receive queue is sized to the window).
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.local.psn)
            .setup_timeout(18)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(RD_ATOMIC);
        self.qp.modify(&attr).map_err(verbs("ibv_modify_qp(RTS)"))
    }

    /// Posts a signaled SEND of `len` bytes at `addr` (registered with `lkey`).
    ///
    /// # Safety
    /// `addr..addr+len` must lie in memory registered with `lkey` and stay untouched until the
    /// send's completion is polled.
    pub unsafe fn post_send(&self, wr_id: u64, lkey: u32, addr: *const u8, len: u32) -> i32 {
        let sge = ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.post(wr_id, ibv_wr_opcode::IBV_WR_SEND, sge, None, true) }
    }

    /// Posts a one-sided READ or WRITE of `len` bytes between local `addr` (registered with
    /// `lkey`) and `remote_addr` (granted with `rkey`). Only a `signaled` request produces a
    /// completion; on a reliable-connected queue pair it also tells that every earlier one
    /// finished.
    ///
    /// # Safety
    /// `addr..addr+len` must lie in memory registered with `lkey` and be left to the device
    /// (not read for a READ, not written for a WRITE) until a later signaled completion of
    /// this queue pair is polled.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_one_sided(
        &self,
        op: OneSided,
        wr_id: u64,
        lkey: u32,
        addr: *mut u8,
        len: u32,
        rkey: u32,
        remote_addr: u64,
        signaled: bool,
    ) -> i32 {
        let sge = ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        let opcode = match op {
            OneSided::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
            OneSided::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        let remote = rdma_mummy_sys::rdma_t { remote_addr, rkey };
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.post(wr_id, opcode, sge, Some(remote), signaled) }
    }

    /// Posts one send-queue work request with one scatter-gather entry.
    ///
    /// # Safety
    /// The callers' contracts: `sge` names registered memory left to the device until the
    /// request (or a later signaled one) completes.
    unsafe fn post(
        &self,
        wr_id: u64,
        opcode: rdma_mummy_sys::ibv_wr_opcode::Type,
        mut sge: ibv_sge,
        remote: Option<rdma_mummy_sys::rdma_t>,
        signaled: bool,
    ) -> i32 {
        // SAFETY: an all-zero ibv_send_wr is a valid "no options" request (C callers memset it).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = opcode;
        wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        if let Some(r) = remote {
            wr.wr.rdma = r;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and `sge` live on the stack for the call; the QP is ours and alive; the
        // buffer contract is the caller's.
        unsafe { ibv_post_send(self.raw_qp.as_ptr(), &mut wr, &mut bad) }
    }

    /// Posts an unsignaled zero-length RDMA WRITE. It moves no data and touches no remote
    /// memory (a zero-length WRITE carries no rkey to check), but posting it makes the provider
    /// run the send queue again: `rdma_rxe` in Linux 6.12 can leave posted work requests
    /// unsent until the next post (docs/rdma.md, "Why one-sided requests stalled"), and the
    /// link kicks it with this. Returns `ibv_post_send`'s status.
    pub fn post_kick(&self) -> i32 {
        // SAFETY: an all-zero ibv_send_wr is a valid "no options" request (C callers memset it).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.sg_list = std::ptr::null_mut();
        wr.num_sge = 0;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        wr.wr.rdma = rdma_mummy_sys::rdma_t {
            remote_addr: 0,
            rkey: 0,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` lives on the stack for the call and names no memory; the QP is ours
        // and alive.
        unsafe { ibv_post_send(self.raw_qp.as_ptr(), &mut wr, &mut bad) }
    }

    /// Posts a receive of at most `len` bytes into `addr` (registered with `lkey`).
    ///
    /// # Safety
    /// `addr..addr+len` must lie in memory registered with `lkey`, stay mapped, and be left to
    /// the device until the receive's completion is polled.
    pub unsafe fn post_recv(&self, wr_id: u64, lkey: u32, addr: *mut u8, len: u32) -> i32 {
        let mut sge = ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as `post_send`.
        unsafe { ibv_post_recv(self.raw_qp.as_ptr(), &mut wr, &mut bad) }
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions; returns how many, or the
    /// provider's error.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize, i32> {
        // SAFETY: ibv_wc is plain data; zero is a valid bit pattern.
        let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        let n = out.len().min(POLL_BATCH) as i32;
        // SAFETY: the CQ is ours and alive; `wcs` has room for `n` entries.
        let got = unsafe { ibv_poll_cq(self.raw_cq.as_ptr(), n, wcs.as_mut_ptr()) };
        if got < 0 {
            return Err(got);
        }
        for (o, wc) in out.iter_mut().zip(&wcs[..got as usize]) {
            *o = Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                recv: wc.opcode & rdma_mummy_sys::ibv_wc_opcode::IBV_WC_RECV != 0,
                byte_len: wc.byte_len,
            };
        }
        Ok(got as usize)
    }

    /// The QP's state as the provider reports it (`RTS` while it works, `ERR` once a work
    /// request failed), for stall reports.
    pub fn state(&self) -> &'static str {
        use rdma_mummy_sys::ibv_qp_state as st;
        // SAFETY: both structs are plain data; zero is a valid bit pattern.
        let mut attr: rdma_mummy_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: rdma_mummy_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is ours and alive; both out-parameters live on the stack.
        let rc = unsafe {
            rdma_mummy_sys::ibv_query_qp(
                self.raw_qp.as_ptr(),
                &mut attr,
                rdma_mummy_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return "unknown (ibv_query_qp failed)";
        }
        match attr.qp_state {
            st::IBV_QPS_RESET => "RESET",
            st::IBV_QPS_INIT => "INIT",
            st::IBV_QPS_RTR => "RTR",
            st::IBV_QPS_RTS => "RTS",
            st::IBV_QPS_SQD => "SQD",
            st::IBV_QPS_SQE => "SQE",
            st::IBV_QPS_ERR => "ERR",
            _ => "unknown",
        }
    }

    /// The completion channel's file descriptor: readable once a completion arrived on the CQ
    /// after [`Self::arm`].
    pub fn event_fd(&self) -> RawFd {
        self.chan.as_raw_fd()
    }

    /// Asks for one event on the channel at the CQ's next completion. A completion that
    /// arrived before the call raises none: poll the CQ once more after arming, and wait on
    /// [`Self::event_fd`] only if that finds nothing. Returns the provider's error code.
    pub fn arm(&self) -> Result<(), i32> {
        // SAFETY: the CQ is ours and alive.
        match unsafe { rdma_mummy_sys::ibv_req_notify_cq(self.raw_cq.as_ptr(), 0) } {
            0 => Ok(()),
            rc => Err(rc),
        }
    }

    /// Takes the events waiting on the channel (without blocking) and acknowledges them.
    /// Returns how many there were.
    pub fn take_events(&self) -> u32 {
        let mut n = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is ours and alive, and non-blocking (set in `new`), so this
            // returns at once: 0 with an event for our CQ (the only one on the channel), or
            // -1 (EAGAIN) when none is left.
            let rc = unsafe {
                rdma_mummy_sys::ibv_get_cq_event(
                    self.chan.comp_channel().as_ptr(),
                    &mut cq,
                    &mut ctx,
                )
            };
            if rc != 0 {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // SAFETY: acknowledges exactly the events taken above, on the CQ they came for
            // (every event must be acknowledged before the CQ is destroyed).
            unsafe { rdma_mummy_sys::ibv_ack_cq_events(self.raw_cq.as_ptr(), n) };
        }
        n
    }

    /// Sleeps until the armed CQ raises an event, `other` (another descriptor, such as a
    /// control connection) is readable, or `timeout` passes, then takes the channel's events.
    /// Returns whether `other` is readable.
    pub fn wait(&self, other: Option<RawFd>, timeout: std::time::Duration) -> bool {
        let mut fds = [
            libc::pollfd {
                fd: self.event_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // poll(2) skips a negative descriptor.
                fd: other.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: two valid pollfds on the stack; the descriptors are open (the channel is
        // ours, `other` is the caller's).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        self.take_events();
        r > 0 && fds[1].revents != 0
    }

    /// Moves the QP to the error state: outstanding work requests complete as flushed.
    pub fn fail(&mut self) {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if let Err(e) = self.qp.modify(&attr) {
            tracing::debug!("ibv_modify_qp(ERR): {e:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sideway::ibverbs::completion::WorkCompletionStatus;

    /// The completion statuses the client maps by number (`farvm_memclient`'s `wc`) are
    /// rdma-core's.
    #[test]
    fn status_codes_match_rdma_core() {
        assert_eq!(WorkCompletionStatus::Success as u32, 0);
        assert_eq!(WorkCompletionStatus::WorkRequestFlushedError as u32, 5);
        assert_eq!(WorkCompletionStatus::RemoteAccessError as u32, 10);
        assert_eq!(WorkCompletionStatus::RetryCounterExceededError as u32, 12);
    }

    #[test]
    fn gids_of_addresses() {
        let g = gid_of("10.2.0.1".parse().unwrap());
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&g[12..], &[10, 2, 0, 1]);
        assert_eq!(gid_of("fe80::1".parse().unwrap())[0], 0xfe);
    }

    /// Without a device (this host), choosing one fails with the operator's message, never a
    /// crash (libibverbs is loaded at run time, so this holds without rdma-core too).
    #[test]
    fn no_device_is_a_clear_error() {
        match RdmaDevice::for_local_ip("127.0.0.1".parse().unwrap()) {
            Ok(d) => eprintln!("an RDMA device is present here: {}", d.name()),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with("no RDMA device"),
                    "unexpected error text: {msg}"
                );
            }
        }
    }
}
