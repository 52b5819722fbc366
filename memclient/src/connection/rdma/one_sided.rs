//! One-sided pages on an RDMA link: which requests go as RDMA READ/WRITE on slabs the server
//! granted (asked for on the control connection), posting a batch from its registered send
//! buffer, and landing a finished read (crc32c checked, one copy into the engine's page).

use super::*;

impl RdmaLink {
    /// Posts a one-sided batch for `ticket` from the send buffer `st` (registered with
    /// `lkey`): a write's pages and entries are copied in first; the last work request is
    /// signaled with `wr_id`.
    pub(super) fn post_one_sided(
        &self,
        st: &mut SendState,
        lkey: u32,
        ticket: u32,
        wr_id: u64,
    ) -> i32 {
        let SendState {
            bytes, plan: wrs, ..
        } = st;
        if bytes.capacity() != SLOT_BYTES
            || META_OFF + MAX_PAGES_PER_FRAME * META_BYTES > SLOT_BYTES
        {
            return -1;
        }
        let base = bytes.as_mut_ptr();
        let t = self.tickets.lock(ticket);
        let Some(io) = t.io.as_ref() else { return -1 };
        let write = t.op == TicketOp::Write;
        let ns = t.ns;
        {
            let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
            if plan(&g.map, ns, io.indices(), 0, MAX_WR_BYTES, wrs).is_err() {
                return -1;
            }
        }
        if write {
            for k in 0..io.len() {
                let m = MetaWord::present(page_crc(io.page(k))).0.to_le_bytes();
                // SAFETY: page k and entry k lie inside the buffer's capacity (k < 256; the
                // layout is checked above), which nothing else touches while we hold it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        io.page(k).as_ptr(),
                        base.add(k * PAGE_SIZE),
                        PAGE_SIZE,
                    );
                    std::ptr::copy_nonoverlapping(
                        m.as_ptr(),
                        base.add(META_OFF + k * META_BYTES),
                        META_BYTES,
                    );
                }
            }
        }
        let op = if write {
            OneSided::Write
        } else {
            OneSided::Read
        };
        let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
        Counters::add(&self.counters.os_batches, 1);
        Counters::add(&self.counters.os_wrs, 2 * wrs.len() as u64);
        // Pages first, then their entries: a reader never sees a present entry before its
        // page (a writer's batch lands in order), and a torn overwrite fails its crc32c.
        for w in wrs.iter() {
            // SAFETY: the planned range lies in the buffer (local offsets < 256 pages) and is
            // the device's until the batch's signaled completion.
            let rc = unsafe {
                self.qp.post_one_sided(
                    op,
                    0,
                    lkey,
                    base.add(w.local_offset),
                    w.len,
                    w.rkey,
                    w.remote_addr,
                    false,
                )
            };
            if rc != 0 {
                return rc;
            }
        }
        let last = wrs.len() - 1;
        for (n, w) in wrs.iter().enumerate() {
            let first = w.local_offset / PAGE_SIZE;
            let pages = w.len as usize / PAGE_SIZE;
            let Ok(loc) = g.map.region(ns, io.page_index(first)) else {
                return -1;
            };
            // SAFETY: as above, for the entries' range from META_OFF.
            let rc = unsafe {
                self.qp.post_one_sided(
                    op,
                    wr_id,
                    lkey,
                    base.add(META_OFF + first * META_BYTES),
                    (pages * META_BYTES) as u32,
                    w.rkey,
                    meta_addr(&loc, io.page_index(first)),
                    n == last,
                )
            };
            if rc != 0 {
                return rc;
            }
        }
        0
    }

    /// The outcome of the finished one-sided batch of `ticket` in send buffer `sb`: a read's
    /// present pages are checked (crc32c) and copied into the request's buffer.
    pub(super) fn land_one_sided(&self, sb: u16, ticket: u32) -> Result<u32, ClientError> {
        let st = self.send[sb as usize]
            .buf
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let base = st.bytes.as_ptr();
        let mut t = self.tickets.lock(ticket);
        let op = t.op;
        let Some(io) = t.io.as_mut() else {
            return Err(ClientError::Protocol("one-sided request without a buffer"));
        };
        let n = io.len();
        if op == TicketOp::Write {
            self.one_sided_writes.fetch_add(n as u64, Ordering::Relaxed);
            return Ok(n as u32);
        }
        let mut bitmap = [0u8; MAX_PAGES_PER_FRAME / 8];
        let (mut present, mut intact) = (0u32, true);
        for k in 0..n.min(MAX_PAGES_PER_FRAME) {
            let mut m = [0u8; META_BYTES];
            // SAFETY: entry k and page k lie in the buffer's initialised capacity (see
            // `connect`); the device finished writing them (the batch's last, signaled work
            // request completed) and nobody else touches the buffer while we hold it.
            let page = unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(META_OFF + k * META_BYTES),
                    m.as_mut_ptr(),
                    META_BYTES,
                );
                std::slice::from_raw_parts(base.add(k * PAGE_SIZE), PAGE_SIZE)
            };
            let m = MetaWord(u64::from_le_bytes(m));
            if !m.is_present() {
                continue;
            }
            intact &= page_crc(page) == m.crc();
            // SAFETY: the request's buffer, which nobody else touches while its slot is
            // receiving; 4 KiB of source and destination.
            unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), io.page_ptr(k), PAGE_SIZE) };
            // A granted slab holds unsealed pages only (PROTOCOL.md).
            io.set_seal(k, &[0; farvm_memproto::SEAL_LEN]);
            bitmap[k / 8] |= 1 << (k % 8);
            present += 1;
        }
        self.landed_copied
            .fetch_add(present as u64 * PAGE_SIZE as u64, Ordering::Relaxed);
        self.one_sided_reads.fetch_add(n as u64, Ordering::Relaxed);
        if intact {
            io.set_present_from(&bitmap[..n.div_ceil(8)]);
            Ok(present)
        } else {
            io.clear_present();
            Err(ClientError::ChecksumMismatch)
        }
    }

    /// How `ticket` travels: one-sided when it reads or writes pages whose slabs are all
    /// granted. With `may_block`, grants missing for it are asked for first.
    pub(super) fn kind_of(&self, ticket: u32, may_block: bool) -> Kind {
        if !self.one_sided {
            return Kind::TwoSided;
        }
        let mut missing = [(0u64, 0u64); GRANTS_PER_SUBMIT];
        let mut nmissing = 0;
        let ns;
        {
            let t = self.tickets.lock(ticket);
            let Some(io) = t.io.as_ref() else {
                return Kind::TwoSided;
            };
            if !matches!(t.op, TicketOp::Read | TicketOp::Write) {
                return Kind::TwoSided;
            }
            ns = t.ns;
            let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
            for &p in io.indices() {
                if g.map.contains(ns, p) {
                    continue;
                }
                let slab = p / GRANT_SLAB_PAGES;
                if !may_block || g.refused.contains(&(ns, slab)) {
                    return Kind::TwoSided;
                }
                if missing[..nmissing].iter().any(|&(_, s)| s == slab) {
                    continue;
                }
                if nmissing == GRANTS_PER_SUBMIT {
                    return Kind::TwoSided;
                }
                missing[nmissing] = (ns, slab);
                nmissing += 1;
            }
        }
        for &(ns, slab) in &missing[..nmissing] {
            if !self.request_grant(ns, slab) {
                return Kind::TwoSided;
            }
        }
        Kind::OneSided
    }

    /// Asks the server for the grant of `slab` of `ns` on the control connection; true once
    /// it is granted. A refusal is remembered (that slab stays two-sided); a broken control
    /// connection fails the link.
    pub(super) fn request_grant(&self, ns: u64, slab: u64) -> bool {
        let _g = self.grant_lock.lock().unwrap_or_else(|e| e.into_inner());
        let page = slab * GRANT_SLAB_PAGES;
        {
            let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
            if g.map.contains(ns, page) {
                return true;
            }
            if g.refused.contains(&(ns, slab)) || self.is_broken() {
                return false;
            }
        }
        let mut reply = [0u8; GRANT_REPLY_LEN];
        let io = (&self.ctl)
            .write_all(&GrantRequest { ns, slab }.to_bytes())
            .and_then(|()| (&self.ctl).read_exact(&mut reply));
        if let Err(e) = io {
            tracing::warn!(server = self.server, "asking for a slab grant: {e}");
            self.fail_all();
            return false;
        }
        let mut g = self.grants.write().unwrap_or_else(|e| e.into_inner());
        match parse_reply(&reply) {
            Ok(r) => match g.map.insert(ns, slab, r) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(server = self.server, "bad slab grant: {e}");
                    g.refused.insert((ns, slab));
                    false
                }
            },
            Err(st) => {
                tracing::debug!(server = self.server, ns, slab, st, "slab grant refused");
                g.refused.insert((ns, slab));
                false
            }
        }
    }

    /// Counts a one-sided batch of send buffer `sb` as completed, with its time since posted.
    pub(super) fn note_one_sided_done(&self, sb: u16) {
        let Some(b) = self.send.get(sb as usize) else {
            return;
        };
        let us = b
            .buf
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .posted
            .elapsed()
            .as_micros() as u64;
        Counters::add(&self.counters.os_done, 1);
        self.counters.os_max_us.fetch_max(us, Ordering::Relaxed);
    }
}
