//! The server half of the fuzzer: streams of request frames, valid ones built with the
//! production encoder and sealed by the two VMs' sealers, then mutated (`mutate.rs`), served
//! by a real in-process memory server ([`ReplayServer`]: the connection's decoder, handler,
//! tenancy checks and store). A model of what each namespace holds says what every response
//! must be: a page read from namespace N is byte for byte the last one written to N at that
//! page number, and a page a VM sealed opens only at the address it was sealed for.

use std::collections::HashMap;

use farvm_memproto::frame::{self, Body, Frame, PageSel, FLAG_IF_ABSENT, HEADER_LEN, WIRE_PAGE};
use farvm_memproto::{page_crc, Status};
use farvm_memserver::server::conn::ConnEnd;
use farvm_memserver::server::replay::{ReplayConn, ReplayServer, Served};
use farvm_prefetch::trace::rng::SplitMix64;
use farvm_seal::{PageAddr, Seal};

use super::mutate;
use super::vms::{bytes, is_plaintext_of, seal_of, Vm, Vms};
use super::{kind_of, Outcomes, Verdict};

/// Page numbers the VMs write and read (small, so that reads find what writes stored).
const PAGE_SPACE: u64 = 96;
/// The store's capacity in pages: small enough that large writes find it full.
pub const CAPACITY_PAGES: u64 = 512;

/// Who holds a namespace, as the model knows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Vm(usize),
    Reclaimed,
}

/// A page the store holds, as the model knows it: its wire bytes (crc32c, seal, data) and,
/// when they are exactly what a VM sealed, the VM and the address it sealed them for.
struct Stored {
    wire: Vec<u8>,
    genuine: Option<(usize, PageAddr)>,
}

/// The server fuzz target (see the module doc).
pub struct ServerFuzz {
    server: ReplayServer,
    model: HashMap<(u64, u64), Stored>,
    owners: HashMap<u64, Owner>,
    next_version: u64,
    /// The seals made this execution, with their VM, address and wire crc32c.
    sealed: HashMap<[u8; farvm_memproto::SEAL_LEN], (usize, PageAddr, u32)>,
    stream: Vec<u8>,
    frames: Vec<usize>,
    pages: Vec<usize>,
    scatter: Vec<u8>,
    wire: Vec<u8>,
}

impl ServerFuzz {
    /// A store of [`CAPACITY_PAGES`] whose tenants are the VMs' tokens.
    pub fn new(vms: &[Vm; 2]) -> anyhow::Result<Self> {
        let tokens = [vms[0].secret.clone(), vms[1].secret.clone()];
        let server = ReplayServer::new(CAPACITY_PAGES * farvm_memproto::PAGE_SIZE as u64, &tokens)?;
        Ok(Self {
            server,
            model: HashMap::new(),
            owners: HashMap::new(),
            next_version: 1,
            sealed: HashMap::new(),
            stream: Vec::new(),
            frames: Vec::new(),
            pages: Vec::new(),
            scatter: Vec::new(),
            wire: Vec::new(),
        })
    }

    /// One execution: a connection of VM `k` fed one (possibly mutated) stream of frames.
    pub fn exec(&mut self, rng: &mut SplitMix64, vms: &mut Vms, out: &mut Outcomes) -> Verdict {
        self.reclaim_when_full(out)?;
        let k = rng.below(2) as usize;
        let mut conn = self.server.connect(bytes::<32>(rng));
        match frame::decode(conn.responses()) {
            Ok((
                Frame {
                    body: Body::Challenge { .. },
                    ..
                },
                _,
            )) => {}
            other => return Err(format!("the first frame is not a CHALLENGE: {other:?}")),
        }
        conn.take_responses();
        self.build(rng, vms, k, &conn);
        self.mutate(rng, vms, k, out);
        self.serve(&mut conn, vms, k, out)?;
        let used = self.server.store().occupancy().used_pages;
        if used != self.model.len() as u64 || used > CAPACITY_PAGES {
            return Err(format!(
                "the store holds {used} pages, the model {} (capacity {CAPACITY_PAGES})",
                self.model.len()
            ));
        }
        Ok(())
    }

    /// Checks, every so often, that the store holds exactly the namespaces the model knows.
    pub fn check_namespaces(&self) -> Verdict {
        let mut held = self.server.store().namespace_ids();
        held.sort_unstable();
        let mut known: Vec<u64> = (self.owners.iter())
            .filter(|(_, o)| **o != Owner::Reclaimed)
            .map(|(ns, _)| *ns)
            .collect();
        known.sort_unstable();
        if held != known {
            return Err(format!(
                "the store holds {} namespaces, the model {}",
                held.len(),
                known.len()
            ));
        }
        Ok(())
    }

    /// As the pool's collector does for VMs gone: drops every namespace but the two VMs' when
    /// the store is three quarters full (mutated namespaces fill it otherwise).
    fn reclaim_when_full(&mut self, out: &mut Outcomes) -> Verdict {
        if (self.model.len() as u64) < CAPACITY_PAGES * 3 / 4 {
            return Ok(());
        }
        let victims: Vec<u64> = (self.owners.iter())
            .filter(|(ns, o)| **o != Owner::Reclaimed && **ns < 0xf0_0000)
            .map(|(ns, _)| *ns)
            .collect();
        for ns in victims {
            let held = self.model.keys().filter(|(n, _)| *n == ns).count() as u64;
            let freed = self.server.store().reclaim_namespace(ns);
            if freed != held {
                return Err(format!(
                    "reclaiming namespace {ns} freed {freed} pages, not {held}"
                ));
            }
            self.model.retain(|(n, _), _| *n != ns);
            self.owners.insert(ns, Owner::Reclaimed);
            out.add("pool reclaimed a mutated namespace");
        }
        Ok(())
    }

    fn selection(&mut self, rng: &mut SplitMix64) -> (bool, u64, u32) {
        let count = if rng.below(50) == 0 {
            1 + rng.below(256)
        } else {
            1 + rng.below(4)
        } as u32;
        let scatter = rng.below(10) < 3;
        self.scatter.clear();
        for _ in 0..count {
            self.scatter
                .extend_from_slice(&rng.below(PAGE_SPACE).to_le_bytes());
        }
        (scatter, rng.below(PAGE_SPACE), count)
    }

    /// The valid stream: a HELLO (mostly), then one to four requests.
    fn build(&mut self, rng: &mut SplitMix64, vms: &mut [Vm; 2], k: usize, conn: &ReplayConn) {
        self.stream.clear();
        self.frames.clear();
        self.pages.clear();
        self.sealed.clear();
        if rng.below(20) != 0 {
            let client_nonce = bytes::<32>(rng);
            let hello = Body::Hello {
                key_id: vms[k].secret.key_id(),
                client_nonce,
                mac: vms[k]
                    .secret
                    .client_proof(conn.server_nonce(), &client_nonce),
            };
            self.push(0, 0, hello, false);
        }
        for req_id in 1..=1 + rng.below(4) {
            // One request in ten addresses the other VM's namespace.
            let ns = if rng.below(10) == 0 {
                vms[1 - k].ns
            } else {
                vms[k].ns
            };
            let (scatter, start, count) = self.selection(rng);
            let scatter_bytes = std::mem::take(&mut self.scatter);
            let sel = if scatter {
                PageSel::Scatter(&scatter_bytes)
            } else {
                PageSel::Run { start, count }
            };
            match rng.below(20) {
                0..=7 => {
                    let mut wire = std::mem::take(&mut self.wire);
                    wire.clear();
                    for i in 0..sel.len() {
                        // One page in sixteen is sealed for a neighbouring page number: a
                        // misdirected write, which the store keeps where it was sent and the
                        // seal must refuse there.
                        let misdirect = u64::from(rng.below(16) == 0);
                        let addr = PageAddr {
                            namespace: ns,
                            page: sel.index(i) ^ misdirect,
                            version: self.next_version,
                        };
                        self.next_version += 1;
                        let at = wire.len();
                        vms[k].sealed_wire_page(addr, &mut wire);
                        let wp = &wire[at..];
                        let crc = u32::from_le_bytes([wp[0], wp[1], wp[2], wp[3]]);
                        self.sealed.insert(seal_of(wp), (k, addr, crc));
                    }
                    let sel_len = if scatter { sel.len() * 8 } else { 8 };
                    let first = self.stream.len() + HEADER_LEN + sel_len;
                    self.pages
                        .extend((0..sel.len()).map(|i| first + i * WIRE_PAGE));
                    let write = Body::Write { sel, pages: &wire };
                    self.push(req_id, ns, write, rng.below(10) == 0);
                    self.wire = wire;
                }
                8..=14 => self.push(req_id, ns, Body::Read(sel), false),
                15..=18 => self.push(req_id, ns, Body::Discard(sel), false),
                _ => self.push(req_id, ns, Body::Stat, false),
            }
            self.scatter = scatter_bytes;
        }
    }

    fn push(&mut self, req_id: u64, namespace: u64, body: Body<'_>, if_absent: bool) {
        self.frames.push(self.stream.len());
        let f = Frame {
            req_id,
            namespace,
            body,
        };
        frame::encode(&mut self.stream, &f, if_absent);
    }

    /// Six streams in ten are mutated: one to three in-place changes, then in four of them
    /// one change of shape.
    fn mutate(&mut self, rng: &mut SplitMix64, vms: &[Vm; 2], k: usize, out: &mut Outcomes) {
        if rng.below(10) >= 6 {
            out.add_mutation("none");
            return;
        }
        for _ in 0..1 + rng.below(3) {
            let name = match rng.below(5) {
                0 | 1 => {
                    let at = self.frames[rng.below(self.frames.len() as u64) as usize];
                    mutate::header_lie(rng, &mut self.stream, at, vms[1 - k].ns)
                }
                2 => mutate::bit_flip(rng, &mut self.stream),
                3 => mutate::byte_set(rng, &mut self.stream),
                _ if !self.pages.is_empty() => {
                    let at = self.pages[rng.below(self.pages.len() as u64) as usize];
                    mutate::page_flip_crc_fixed(rng, &mut self.stream, at)
                }
                _ => mutate::bit_flip(rng, &mut self.stream),
            };
            out.add_mutation(name);
        }
        if rng.below(10) < 4 {
            let name = mutate::reshape(rng, &mut self.stream, &self.frames);
            out.add_mutation(name);
        }
    }

    /// Feeds the stream to the connection frame by frame and checks every response.
    fn serve(
        &mut self,
        conn: &mut ReplayConn,
        vms: &mut [Vm; 2],
        k: usize,
        out: &mut Outcomes,
    ) -> Verdict {
        let stream = std::mem::take(&mut self.stream);
        let mut input: &[u8] = &stream;
        let mut tenant: Option<usize> = None;
        let result = loop {
            let before = input.len();
            let served = conn.serve_frame(&mut input);
            let used = before - input.len();
            let consumed = &stream[stream.len() - before..stream.len() - input.len()];
            match served {
                Served::Next => {
                    if let Err(e) =
                        self.check_handled(consumed, used, conn, vms, k, &mut tenant, out)
                    {
                        break Err(e);
                    }
                    conn.take_responses();
                }
                Served::Closed => {
                    out.add("connection: closed by the peer");
                    break Ok(());
                }
                Served::Ended(end) => {
                    let handled = matches!(end, ConnEnd::Protocol(_));
                    out.add(match &end {
                        ConnEnd::Malformed(e) => {
                            format!("connection ended: malformed frame ({})", kind_of(e))
                        }
                        ConnEnd::Io(_) => "connection ended: frame cut short".into(),
                        ConnEnd::Protocol(why) => format!("connection ended: {why}"),
                        ConnEnd::Version { .. } => {
                            "connection ended: another protocol version".into()
                        }
                        ConnEnd::Rdma(_) => "connection ended: RDMA".into(),
                    });
                    if handled {
                        // The handler answered before ending the session: the answer too
                        // must be a valid frame.
                        break self.check_handled(consumed, used, conn, vms, k, &mut tenant, out);
                    }
                    if !conn.responses().is_empty() {
                        break Err(format!("a connection that ended with `{end}` answered"));
                    }
                    break Ok(());
                }
            }
        };
        self.stream = stream;
        result
    }

    /// One handled frame: it decodes with the codec, it has exactly one answer with its
    /// request id, and the answer is what the model says.
    #[allow(clippy::too_many_arguments)]
    fn check_handled(
        &mut self,
        consumed: &[u8],
        used: usize,
        conn: &ReplayConn,
        vms: &mut [Vm; 2],
        k: usize,
        tenant: &mut Option<usize>,
        out: &mut Outcomes,
    ) -> Verdict {
        let (req, n) = frame::decode(consumed)
            .map_err(|e| format!("the server handled a frame the codec rejects: {e}"))?;
        if n != used {
            return Err(format!("the server read {used} bytes of a {n}-byte frame"));
        }
        let flags = consumed[6];
        let (resp, rn) = frame::decode(conn.responses())
            .map_err(|e| format!("the server's answer does not decode: {e}"))?;
        if rn != conn.responses().len() {
            return Err("more than one answer to one request".into());
        }
        if resp.req_id != req.req_id {
            return Err(format!(
                "answer id {} to request {}",
                resp.req_id, req.req_id
            ));
        }
        let op = opname(&req.body);
        if let Body::Hello {
            key_id,
            client_nonce,
            ..
        } = req.body
        {
            return self.check_hello(&resp.body, key_id, &client_nonce, conn, vms, k, tenant, out);
        }
        let Some(t) = *tenant else {
            return match resp.body {
                Body::Error {
                    status: Status::NotAuthenticated,
                    ..
                } => {
                    out.add(format!("{op}: refused before HELLO"));
                    Ok(())
                }
                other => Err(format!("{op} before HELLO answered {other:?}")),
            };
        };
        let ns = req.namespace;
        // What the namespace lookup gives this tenant.
        let refused = match self.owners.get(&ns) {
            Some(Owner::Vm(o)) if *o != t => Some(Status::Denied),
            Some(Owner::Reclaimed) => Some(Status::Reclaimed),
            _ => None,
        };
        match (req.body, resp.body) {
            (
                Body::Read(_) | Body::Write { .. } | Body::Discard(_) | Body::Stat,
                Body::Error { status, .. },
            ) if Some(status) == refused => {
                out.add(format!("{op}: refused ({status:?})"));
                Ok(())
            }
            (_, _)
                if refused.is_some()
                    && matches!(
                        req.body,
                        Body::Read(_) | Body::Write { .. } | Body::Discard(_) | Body::Stat
                    ) =>
            {
                Err(format!(
                    "{op} on namespace {ns} (expected {refused:?}) answered {:?}",
                    resp.body
                ))
            }
            (
                Body::Read(sel),
                Body::ReadResp {
                    count,
                    bitmap,
                    pages,
                },
            ) => self.check_read(ns, &sel, count, bitmap, pages, vms, out),
            (Body::Write { sel, pages }, resp) => {
                self.check_write(ns, t, &sel, pages, flags & FLAG_IF_ABSENT != 0, resp, out)
            }
            (Body::Discard(sel), Body::DiscardResp { freed }) => {
                let mut gone = 0;
                for i in 0..sel.len() {
                    gone += self.model.remove(&(ns, sel.index(i))).is_some() as u32;
                }
                if gone != freed {
                    return Err(format!("DISCARD freed {freed}, the model {gone}"));
                }
                out.add("discard: ok");
                Ok(())
            }
            (Body::Stat, Body::StatResp(info)) => {
                let in_ns = self.model.keys().filter(|(n, _)| *n == ns).count() as u64;
                if info.namespace_pages != in_ns
                    || info.used_pages != self.model.len() as u64
                    || info.capacity_pages != CAPACITY_PAGES
                {
                    return Err(format!(
                        "STAT {info:?}, the model {in_ns} of {}",
                        self.model.len()
                    ));
                }
                out.add("stat: ok");
                Ok(())
            }
            (Body::Read(_) | Body::Discard(_) | Body::Stat, other) => {
                Err(format!("{op} answered {other:?}"))
            }
            (
                _,
                Body::Error {
                    status: Status::BadRequest,
                    ..
                },
            ) => {
                out.add(format!("{op}: refused, not a request"));
                Ok(())
            }
            (_, other) => Err(format!("{op} (not a request) answered {other:?}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_hello(
        &mut self,
        resp: &Body<'_>,
        key_id: [u8; 8],
        client_nonce: &[u8; 32],
        conn: &ReplayConn,
        vms: &[Vm; 2],
        k: usize,
        tenant: &mut Option<usize>,
        out: &mut Outcomes,
    ) -> Verdict {
        match resp {
            Body::Error {
                status: Status::BadRequest,
                ..
            } if tenant.is_some() => out.add("hello: refused, already authenticated"),
            Body::HelloResp { server_mac } if tenant.is_none() => {
                let who = vms.iter().position(|v| v.secret.key_id() == key_id);
                let Some(who) = who else {
                    return Err("HELLO with an unknown key id was accepted".into());
                };
                let want = vms[who]
                    .secret
                    .server_proof(conn.server_nonce(), client_nonce);
                if *server_mac != want {
                    return Err("the server's proof is wrong".into());
                }
                if who != k {
                    out.add("hello: ok as the other VM (mutated key id)");
                }
                *tenant = Some(who);
                out.add("hello: ok");
            }
            Body::Error {
                status: Status::AuthFailed,
                ..
            } if tenant.is_none() => out.add("hello: authentication failed"),
            other => return Err(format!("HELLO answered {other:?}")),
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn check_read(
        &mut self,
        ns: u64,
        sel: &PageSel<'_>,
        count: u32,
        bitmap: &[u8],
        pages: &[u8],
        vms: &mut [Vm; 2],
        out: &mut Outcomes,
    ) -> Verdict {
        if count as usize != sel.len() {
            return Err(format!("READ of {} pages answered for {count}", sel.len()));
        }
        let mut j = 0;
        for i in 0..sel.len() {
            let idx = sel.index(i);
            let present = bitmap[i / 8] & (1 << (i % 8)) != 0;
            let stored = self.model.get(&(ns, idx));
            if present != stored.is_some() {
                return Err(format!(
                    "READ of namespace {ns} page {idx}: present {present}, the model {}",
                    stored.is_some()
                ));
            }
            let Some(stored) = stored else {
                continue;
            };
            let wp = &pages[j * WIRE_PAGE..(j + 1) * WIRE_PAGE];
            j += 1;
            if wp != &stored.wire[..] {
                return Err(format!(
                    "READ of namespace {ns} page {idx} returned bytes not written there last"
                ));
            }
            let Some((vm, sealed_for)) = stored.genuine else {
                out.add("read: page as written (altered before it was stored)");
                continue;
            };
            let addr = PageAddr {
                namespace: ns,
                page: idx,
                version: sealed_for.version,
            };
            let mut page = [0u8; farvm_memproto::PAGE_SIZE];
            page.copy_from_slice(&wp[4 + farvm_memproto::SEAL_LEN..]);
            let opened = vms[vm].opener.open(addr, &mut page, &Seal(seal_of(wp)));
            match (opened, sealed_for == addr) {
                (Ok(()), true) if is_plaintext_of(addr, &page) => {
                    out.add("read: page opened at its own address")
                }
                (Ok(()), true) => return Err(format!("page {addr:?} opened to other bytes")),
                (Ok(()), false) => {
                    return Err(format!(
                        "page sealed for {sealed_for:?} opened at {addr:?} (namespace {ns})"
                    ))
                }
                (Err(e), true) => return Err(format!("page {addr:?} as sealed fails: {e}")),
                (Err(_), false) => {
                    out.add("read: page stored under another address, refused by its seal")
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn check_write(
        &mut self,
        ns: u64,
        tenant: usize,
        sel: &PageSel<'_>,
        pages: &[u8],
        if_absent: bool,
        resp: Body<'_>,
        out: &mut Outcomes,
    ) -> Verdict {
        // The namespace exists from now on (created before the pages are looked at).
        self.owners.entry(ns).or_insert(Owner::Vm(tenant));
        let n = sel.len();
        let wp = |i: usize| &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
        let crc_ok = (0..n).all(|i| {
            let w = wp(i);
            page_crc(&w[4..]) == u32::from_le_bytes([w[0], w[1], w[2], w[3]])
        });
        let mut new_pages: Vec<u64> = (0..n)
            .map(|i| sel.index(i))
            .filter(|idx| !self.model.contains_key(&(ns, *idx)))
            .collect();
        new_pages.sort_unstable();
        new_pages.dedup();
        let fits = self.model.len() + new_pages.len() <= CAPACITY_PAGES as usize;
        let expected = if !crc_ok {
            Err(Status::ChecksumMismatch)
        } else if !fits {
            Err(Status::CapacityExhausted)
        } else {
            Ok(())
        };
        match (expected, resp) {
            (Ok(()), Body::WriteResp { written }) => {
                let mut stored = 0;
                for i in 0..n {
                    let key = (ns, sel.index(i));
                    if if_absent && self.model.contains_key(&key) {
                        continue;
                    }
                    let w = wp(i);
                    let crc = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    let genuine = match self.sealed.get(&seal_of(w)) {
                        Some(&(vm, addr, c)) if c == crc => Some((vm, addr)),
                        _ => None,
                    };
                    self.model.insert(
                        key,
                        Stored {
                            wire: w.to_vec(),
                            genuine,
                        },
                    );
                    stored += 1;
                }
                if stored != written {
                    return Err(format!("WRITE stored {written}, the model {stored}"));
                }
                out.add(if if_absent {
                    "write: ok (if absent)"
                } else {
                    "write: ok"
                });
                Ok(())
            }
            (Err(want), Body::Error { status, .. }) if status == want => {
                out.add(format!("write: refused ({status:?})"));
                Ok(())
            }
            (want, got) => Err(format!("WRITE expected {want:?}, answered {got:?}")),
        }
    }
}

fn opname(b: &Body<'_>) -> &'static str {
    match b {
        Body::Challenge { .. } => "challenge",
        Body::Hello { .. } => "hello",
        Body::HelloResp { .. } => "hello response",
        Body::Read(_) => "read",
        Body::Write { .. } => "write",
        Body::Discard(_) => "discard",
        Body::Stat => "stat",
        Body::ReadResp { .. } => "read response",
        Body::WriteResp { .. } => "write response",
        Body::DiscardResp { .. } => "discard response",
        Body::StatResp(_) => "stat response",
        Body::Error { .. } => "error response",
    }
}
