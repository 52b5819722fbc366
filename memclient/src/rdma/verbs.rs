//! One-sided RDMA access on rdma-core via `sideway` (feature `rdma`).
//!
//! **Not run on hardware**: the development host has no RDMA device (no CONFIG_INFINIBAND, so
//! no Soft-RoCE either). This compiles and its device-independent logic (regions, planning,
//! status mapping, endpoint encoding) is unit-tested; the verbs calls below follow
//! rdma-core's documented sequence (open device → PD → MR → CQ → RC QP → INIT/RTR/RTS →
//! `ibv_wr_rdma_read/write` → poll CQ) but have never executed.
//!
//! Server side: [`RdmaDevice::register`] registers the arena with remote read/write access.
//! Client side: [`RdmaTransport`] owns one connected QP per server, a registered staging
//! buffer, the region grants and, because a one-sided access bypasses the server's index,
//! the presence and crc32c of every page it wrote (so reads still report absent pages and
//! are verified end to end).

use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::FxHashMap;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{ExtendedCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use farvm_memproto::rdma::endpoint::QpEndpoint;
use farvm_memproto::rdma::plan::{plan, split_wr_id, WorkRequest};
use farvm_memproto::rdma::region::RegionMap;
use farvm_memproto::{page_crc, MAX_PAGES_PER_FRAME, PAGE_SIZE};

use super::wc::map_status;
use crate::ClientError;

/// RDMA set-up failures.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// No device, or libibverbs missing (it is loaded at run time).
    #[error("no RDMA device: {0}")]
    NoDevice(String),
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

/// An opened device with a protection domain.
pub struct RdmaDevice {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    port: u8,
    gid_index: u32,
}

impl RdmaDevice {
    /// Opens `name` (or the first device) on port 1, GID index 0.
    pub fn open(name: Option<&str>) -> Result<Self, RdmaError> {
        let list = DeviceList::new().map_err(|e| RdmaError::NoDevice(format!("{e:?}")))?;
        let dev = list
            .iter()
            .find(|d| name.is_none_or(|n| d.name() == n))
            .ok_or_else(|| RdmaError::NoDevice("no matching device".into()))?;
        let ctx = dev.open().map_err(verbs("ibv_open_device"))?;
        let pd = ctx.alloc_pd().map_err(verbs("ibv_alloc_pd"))?;
        Ok(Self {
            ctx,
            pd,
            port: 1,
            gid_index: 0,
        })
    }

    /// Registers `len` bytes at `ptr` for local and remote read/write.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped for the lifetime of the returned region.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Arc<MemoryRegion>, RdmaError> {
        // SAFETY: forwarded to the caller's contract.
        unsafe {
            self.pd.reg_mr(
                ptr as usize,
                len,
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            )
        }
        .map_err(verbs("ibv_reg_mr"))
    }
}

/// A reliable-connected queue pair with its completion queue.
pub struct RdmaQueuePair {
    qp: ExtendedQueuePair,
    cq: Arc<ExtendedCompletionQueue>,
    local: QpEndpoint,
    port: u8,
    gid_index: u32,
    depth: u32,
}

impl RdmaQueuePair {
    /// Creates a QP able to hold `depth` outstanding work requests and moves it to INIT.
    pub fn new(dev: &RdmaDevice, depth: u32) -> Result<Self, RdmaError> {
        let cq = dev
            .ctx
            .create_cq_builder()
            .setup_cqe(depth)
            .build_ex()
            .map_err(verbs("ibv_create_cq_ex"))?;
        let cqh = GenericCompletionQueue::from(Arc::clone(&cq));
        let mut qp = dev
            .pd
            .create_qp_builder()
            .setup_send_cq(cqh.clone())
            .setup_recv_cq(cqh)
            .setup_max_send_wr(depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .build_ex()
            .map_err(verbs("ibv_create_qp_ex"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(dev.port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            );
        qp.modify(&attr).map_err(verbs("ibv_modify_qp(INIT)"))?;
        let gid = dev
            .ctx
            .query_gid(dev.port, dev.gid_index)
            .map_err(verbs("ibv_query_gid"))?;
        let lid = dev
            .ctx
            .query_port(dev.port)
            .map_err(verbs("ibv_query_port"))?
            .lid();
        let psn = u32::from_le_bytes(farvm_memproto::auth::random_bytes::<4>()) & 0xff_ffff;
        let local = QpEndpoint {
            qpn: qp.qp_number(),
            psn,
            lid,
            gid: gid.raw,
        };
        Ok(Self {
            qp,
            cq,
            local,
            port: dev.port,
            gid_index: dev.gid_index,
            depth,
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
            .setup_path_mtu(Mtu::Mtu4096)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(16)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        let gid = Gid { raw: remote.gid };
        ah.setup_dest_lid(remote.lid)
            .setup_port(self.port)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.gid_index as u8)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(1);
        attr.setup_address_vector(&ah);
        self.qp.modify(&attr).map_err(verbs("ibv_modify_qp(RTR)"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.local.psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(16);
        self.qp.modify(&attr).map_err(verbs("ibv_modify_qp(RTS)"))
    }

    /// Posts `wrs` as one chain of RDMA READs (or WRITEs) against the local buffer at
    /// `local_base` registered with `lkey`.
    ///
    /// # Safety
    /// `local_base + wr.local_offset .. + wr.len` must lie in the registered buffer and stay
    /// valid until the completions are polled.
    pub unsafe fn post(
        &mut self,
        wrs: &[WorkRequest],
        lkey: u32,
        local_base: *mut u8,
        write: bool,
    ) -> Result<(), ClientError> {
        if wrs.len() > self.depth as usize {
            return Err(ClientError::InvalidRequest(
                "more work requests than the QP depth",
            ));
        }
        let mut guard = self.qp.start_post_send();
        for w in wrs {
            let h = guard.construct_wr(w.wr_id, WorkRequestFlags::Signaled);
            let h = if write {
                h.setup_write(w.rkey, w.remote_addr)
            } else {
                h.setup_read(w.rkey, w.remote_addr)
            };
            // SAFETY: the caller guarantees the local range is registered and stays valid.
            unsafe {
                h.setup_sge(lkey, local_base.add(w.local_offset) as u64, w.len);
            }
        }
        guard.post().map_err(|_| ClientError::Disconnected)
    }

    /// Busy-polls until `n` completions arrived; returns the first error (all are drained).
    pub fn wait(&self, n: usize) -> Result<(), ClientError> {
        let mut seen = 0;
        let mut first_err = Ok(());
        while seen < n {
            if let Ok(poller) = self.cq.start_poll() {
                for wc in poller {
                    seen += 1;
                    let r = map_status(wc.status());
                    if r.is_err() && first_err.is_ok() {
                        tracing::warn!(wr = ?split_wr_id(wc.wr_id()), "RDMA completion error");
                        first_err = r;
                    }
                }
            }
            std::hint::spin_loop();
        }
        first_err
    }
}

/// A one-sided page transport over connected QPs (one per server).
pub struct RdmaTransport {
    qps: Vec<Mutex<RdmaQueuePair>>,
    regions: RwLock<RegionMap>,
    staging: Mutex<Staging>,
    written: Mutex<FxHashMap<(u64, u64), u32>>,
    max_wr_bytes: u32,
}

struct Staging {
    buf: Box<[u8]>,
    mr: Arc<MemoryRegion>,
    plan: Vec<WorkRequest>,
}

impl RdmaTransport {
    /// Builds a transport from connected QPs (index = server) and region grants.
    pub fn new(
        dev: &RdmaDevice,
        qps: Vec<RdmaQueuePair>,
        regions: RegionMap,
    ) -> Result<Self, RdmaError> {
        let mut buf = vec![0u8; MAX_PAGES_PER_FRAME * PAGE_SIZE].into_boxed_slice();
        // SAFETY: `buf` is owned by the Staging next to the MR and outlives it (field order:
        // the MR is deregistered before... both drop together; no transfer is outstanding
        // when the transport is dropped because every call waits for its completions).
        let mr = unsafe { dev.register(buf.as_mut_ptr(), buf.len())? };
        Ok(Self {
            qps: qps.into_iter().map(Mutex::new).collect(),
            regions: RwLock::new(regions),
            staging: Mutex::new(Staging {
                buf,
                mr,
                plan: Vec::with_capacity(MAX_PAGES_PER_FRAME),
            }),
            written: Mutex::new(FxHashMap::default()),
            max_wr_bytes: 1 << 20,
        })
    }

    fn transfer(
        &self,
        st: &mut Staging,
        ns: u64,
        pages: &[u64],
        write: bool,
    ) -> Result<(), ClientError> {
        {
            let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
            plan(&regions, ns, pages, 0, self.max_wr_bytes, &mut st.plan)
                .map_err(|_| ClientError::InvalidRequest("page has no RDMA region grant"))?;
        }
        let lkey = st.mr.lkey();
        let base = st.buf.as_mut_ptr();
        for server in 0..self.qps.len() as u16 {
            let n = st.plan.iter().filter(|w| w.server == server).count();
            if n == 0 {
                continue;
            }
            let wrs: Vec<WorkRequest> = st
                .plan
                .iter()
                .filter(|w| w.server == server)
                .copied()
                .collect();
            let mut qp = self.qps[server as usize]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // SAFETY: the plan's offsets are < pages.len() × 4096 ≤ the staging buffer, which
            // is registered and borrowed mutably until `wait` returns.
            unsafe { qp.post(&wrs, lkey, base, write)? };
            qp.wait(n)?;
        }
        Ok(())
    }
}

impl RdmaTransport {
    /// Reads `pages` of `ns` into `dst` (`pages.len()` × 4096 bytes); `present[i]` tells
    /// whether page i was stored (absent pages are zero-filled in `dst`).
    pub fn read_pages(
        &self,
        ns: u64,
        pages: &[u64],
        dst: &mut [u8],
        present: &mut [bool],
    ) -> Result<(), ClientError> {
        if dst.len() != pages.len() * PAGE_SIZE || present.len() != pages.len() {
            return Err(ClientError::InvalidRequest(
                "buffer sizes do not match the page list",
            ));
        }
        let mut st = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        for (c, chunk) in pages.chunks(MAX_PAGES_PER_FRAME).enumerate() {
            self.transfer(&mut st, ns, chunk, false)?;
            let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            for (i, &p) in chunk.iter().enumerate() {
                let k = c * MAX_PAGES_PER_FRAME + i;
                let d = &mut dst[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                match written.get(&(ns, p)) {
                    Some(&crc) => {
                        let s = &st.buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                        if page_crc(s) != crc {
                            return Err(ClientError::ChecksumMismatch);
                        }
                        d.copy_from_slice(s);
                        present[k] = true;
                    }
                    None => {
                        d.fill(0);
                        present[k] = false;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes `pages` of `ns` from `src` (`pages.len()` × 4096 bytes).
    pub fn write_pages(&self, ns: u64, pages: &[u64], src: &[u8]) -> Result<(), ClientError> {
        if src.len() != pages.len() * PAGE_SIZE {
            return Err(ClientError::InvalidRequest(
                "buffer size does not match the page list",
            ));
        }
        let mut st = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        for (c, chunk) in pages.chunks(MAX_PAGES_PER_FRAME).enumerate() {
            let from = c * MAX_PAGES_PER_FRAME * PAGE_SIZE;
            st.buf[..chunk.len() * PAGE_SIZE]
                .copy_from_slice(&src[from..from + chunk.len() * PAGE_SIZE]);
            self.transfer(&mut st, ns, chunk, true)?;
            let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
            for (i, &p) in chunk.iter().enumerate() {
                written.insert(
                    (ns, p),
                    page_crc(&st.buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sideway::ibverbs::completion::WorkCompletionStatus;

    /// Our status constants must equal rdma-core's (the mapping is unit-tested in `wc`).
    #[test]
    fn status_codes_match_rdma_core() {
        assert_eq!(
            WorkCompletionStatus::Success as u32,
            super::super::wc::WC_SUCCESS
        );
        assert_eq!(
            map_status(WorkCompletionStatus::RemoteAccessError as u32),
            Err(ClientError::Denied)
        );
        assert!(
            map_status(WorkCompletionStatus::RetryCounterExceededError as u32)
                .unwrap_err()
                .is_server_failure()
        );
        assert!(
            map_status(WorkCompletionStatus::WorkRequestFlushedError as u32)
                .unwrap_err()
                .is_server_failure()
        );
    }

    /// On this host there is no device: opening must fail cleanly, not crash (sideway
    /// dlopens libibverbs, so this also holds where rdma-core is not installed).
    #[test]
    fn open_without_device_is_a_clean_error() {
        if let Err(e) = RdmaDevice::open(None) {
            assert!(matches!(
                e,
                RdmaError::NoDevice(_) | RdmaError::Verbs { .. }
            ));
        }
    }
}
