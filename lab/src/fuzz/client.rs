//! The client half of the fuzzer: READ responses as a memory server sends them, built from
//! pages the two VMs sealed, then corrupted the ways a compromised server or a broken path
//! would (a seal or data bit flipped with the crc32c fixed up, another VM's page, another page
//! number's, an older version's, a seal cut short or zeroed, header and bitmap lies). Each is
//! decoded as the client's receive path does (`farvm_memproto::frame`'s header and bitmap
//! checks), landed in a request's `IoBuf`, and accepted or refused by the client's own check
//! (`farvm_memclient::accept_read_pages`: crc32c, then the seal). A page it marks present
//! must be exactly the plaintext the reading VM wrote at that page number and version.

use farvm_memclient::{accept_read_pages, ClientError, IoBuf};
use farvm_memproto::frame::{
    self, decode_header, read_resp_bitmap_len, read_resp_present, Body, Frame, FrameError, Opcode,
    HEADER_LEN, WIRE_PAGE,
};
use farvm_memproto::{Status, SEAL_LEN};
use farvm_pageio::Version;
use farvm_prefetch::trace::rng::SplitMix64;
use farvm_seal::{PageAddr, PageSealer};

use super::mutate;
use super::vms::{is_plaintext_of, Vm, Vms};
use super::{kind_of, Outcomes, Verdict};

/// Page numbers of the sealed pages the responses are made of.
const PAGES: u64 = 16;
/// Versions of each page.
const VERSIONS: u64 = 3;
/// Most pages one fuzzed READ asks for.
const MAX_READ: usize = 8;

/// The client fuzz target (see the module doc).
pub struct ClientFuzz {
    /// `genuine[vm][page][version - 1]`: the wire page (crc32c, seal, ciphertext) VM `vm`
    /// sealed for (its namespace, page, version).
    genuine: Vec<Vec<Vec<Vec<u8>>>>,
    io: IoBuf,
    response: Vec<u8>,
    pages: Vec<u8>,
    crcs: Vec<[u8; 4]>,
}

impl ClientFuzz {
    /// Seals every (VM, page, version) once.
    pub fn new(vms: &mut [Vm; 2]) -> Self {
        let genuine = (0..2)
            .map(|k| {
                (0..PAGES)
                    .map(|page| {
                        (1..=VERSIONS)
                            .map(|version| {
                                let mut wire = Vec::with_capacity(WIRE_PAGE);
                                let addr = PageAddr {
                                    namespace: vms[k].ns,
                                    page,
                                    version,
                                };
                                vms[k].sealed_wire_page(addr, &mut wire);
                                wire
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Self {
            genuine,
            io: IoBuf::new(MAX_READ),
            response: Vec::new(),
            pages: Vec::new(),
            crcs: vec![[0; 4]; farvm_memproto::MAX_PAGES_PER_FRAME],
        }
    }

    /// One execution: VM `k` reads a few pages at the versions it expects; the response is
    /// built, mostly corrupted, and received.
    pub fn exec(&mut self, rng: &mut SplitMix64, vms: &mut Vms, out: &mut Outcomes) -> Verdict {
        let k = rng.below(2) as usize;
        let ns = vms[k].ns;
        let count = 1 + rng.below(MAX_READ as u64) as usize;
        let indices: Vec<u64> = if rng.below(2) == 0 {
            let start = rng.below(PAGES - count as u64 + 1);
            self.io.set_run(start, count).map_err(|e| e.to_string())?;
            (start..start + count as u64).collect()
        } else {
            let idx: Vec<u64> = (0..count).map(|_| rng.below(PAGES)).collect();
            self.io.set_scatter(&idx).map_err(|e| e.to_string())?;
            idx
        };
        let versions: Vec<Version> = (0..count)
            .map(|_| Version(1 + rng.below(VERSIONS)))
            .collect();
        self.io.set_versions(&versions).map_err(|e| e.to_string())?;
        // The genuine response: each page present with probability 4/5.
        let mut bitmap = vec![0u8; count.div_ceil(8)];
        self.pages.clear();
        for i in 0..count {
            if rng.below(5) != 0 {
                bitmap[i / 8] |= 1 << (i % 8);
                let (page, version) = (indices[i] as usize, versions[i].0 as usize - 1);
                self.pages
                    .extend_from_slice(&self.genuine[k][page][version]);
            }
        }
        let name = self.corrupt(rng, k);
        out.add_mutation(name);
        self.response.clear();
        let f = Frame {
            req_id: 7,
            namespace: ns,
            body: Body::ReadResp {
                count: count as u32,
                bitmap: &bitmap,
                pages: &self.pages,
            },
        };
        frame::encode(&mut self.response, &f, false);
        if rng.below(10) < 2 {
            let name = self.lie(rng, vms[1 - k].ns);
            out.add_mutation(name);
        }
        let received = self.receive(ns, &mut vms[k].opener);
        self.check(received, ns, &indices, &versions, out)
    }

    /// Corrupts the response's pages (three in four responses).
    fn corrupt(&mut self, rng: &mut SplitMix64, k: usize) -> &'static str {
        let present = self.pages.len() / WIRE_PAGE;
        if present == 0 || rng.below(4) == 0 {
            return "none";
        }
        let j = rng.below(present as u64) as usize;
        let at = j * WIRE_PAGE;
        // Swaps take any page of the pool: mostly another page number or version (one in 48
        // draws the very page that was there, which must then be accepted).
        let page = rng.below(PAGES) as usize;
        let version = rng.below(VERSIONS) as usize;
        let wp = &mut self.pages[at..at + WIRE_PAGE];
        match rng.below(7) {
            0 => mutate::page_flip_crc_fixed(rng, &mut self.pages, at),
            1 => {
                wp.copy_from_slice(&self.genuine[1 - k][page][version]);
                "another VM's page"
            }
            2 => {
                wp.copy_from_slice(&self.genuine[k][page][version]);
                "another page number or version of the same VM"
            }
            3 => {
                // The seal cut short: its tail replaced by the data's first bytes (the frame
                // keeps its length), crc32c fixed.
                let cut = 1 + rng.below(SEAL_LEN as u64 - 1) as usize;
                wp.copy_within(4 + SEAL_LEN..4 + SEAL_LEN + cut, 4 + SEAL_LEN - cut);
                mutate::fix_crc(wp);
                "seal cut short, crc fixed"
            }
            4 => {
                wp[4..4 + SEAL_LEN].fill(0);
                mutate::fix_crc(wp);
                "seal zeroed (an unsealed page), crc fixed"
            }
            5 => {
                // Another page's seal on this data.
                let other = &self.genuine[k][page][version];
                wp[4..4 + SEAL_LEN].copy_from_slice(&other[4..4 + SEAL_LEN]);
                mutate::fix_crc(wp);
                "another page's seal, crc fixed"
            }
            _ => {
                mutate::bit_flip(rng, wp);
                "page bit flipped, crc not fixed"
            }
        }
    }

    /// A lie in the response's header or presence bitmap, or its end cut off.
    fn lie(&mut self, rng: &mut SplitMix64, other_ns: u64) -> &'static str {
        match rng.below(3) {
            0 => mutate::header_lie(rng, &mut self.response, 0, other_ns),
            1 if self.response.len() > HEADER_LEN => {
                self.response[HEADER_LEN] ^= 1 << rng.below(8);
                "bitmap bit flipped"
            }
            _ => {
                let keep = rng.below(self.response.len() as u64) as usize;
                self.response.truncate(keep);
                "response cut short"
            }
        }
    }

    /// Receives the response as the TCP link does: header, presence bitmap, pages landed in
    /// the request's buffer (crc32c aside, seal and data in place), then the landed pages'
    /// check with the reading VM's opener. `Err`: the response never reached the check (the
    /// reason, as an outcome).
    fn receive(
        &mut self,
        ns: u64,
        opener: &mut PageSealer,
    ) -> Result<Result<u32, ClientError>, String> {
        let r = &self.response;
        let malformed = |e: FrameError| format!("malformed response ({})", kind_of(&e));
        let Some(hb) = r.first_chunk::<HEADER_LEN>() else {
            return Err("connection lost: response cut short".into());
        };
        let h = decode_header(hb).map_err(malformed)?;
        if h.req_id != 7 {
            return Err("answer to another request: dropped".into());
        }
        let body = &r[HEADER_LEN..];
        if h.opcode != Opcode::ReadResp || h.status != Status::Ok {
            if body.len() < h.body_len as usize {
                return Err("connection lost: response cut short".into());
            }
            frame::decode_body(&h, &body[..h.body_len as usize]).map_err(malformed)?;
            return Err("a response that does not match the request".into());
        }
        let bl = read_resp_bitmap_len(&h).map_err(malformed)?;
        if body.len() < bl {
            return Err("connection lost: response cut short".into());
        }
        let mut bitmap = [0u8; farvm_memproto::MAX_PAGES_PER_FRAME / 8];
        bitmap[..bl].copy_from_slice(&body[..bl]);
        let present = read_resp_present(&h, &bitmap[..bl]).map_err(malformed)?;
        if body.len() < bl + present * WIRE_PAGE {
            return Err("connection lost: response cut short".into());
        }
        if h.count as usize != self.io.len() {
            return Err("a response that does not match the request".into());
        }
        let mut j = 0;
        for i in 0..self.io.len() {
            if bitmap[i / 8] & (1 << (i % 8)) == 0 {
                continue;
            }
            let wp = &body[bl + j * WIRE_PAGE..bl + (j + 1) * WIRE_PAGE];
            self.crcs[j].copy_from_slice(&wp[..4]);
            let mut seal = [0u8; SEAL_LEN];
            seal.copy_from_slice(&wp[4..4 + SEAL_LEN]);
            self.io.set_seal(i, &seal);
            self.io.page_mut(i).copy_from_slice(&wp[4 + SEAL_LEN..]);
            j += 1;
        }
        Ok(accept_read_pages(
            &mut self.io,
            ns,
            &bitmap[..bl],
            &self.crcs,
            Some(opener),
        ))
    }

    /// What was delivered is exactly what the reading VM wrote; what was refused left no page
    /// present.
    fn check(
        &self,
        received: Result<Result<u32, ClientError>, String>,
        ns: u64,
        indices: &[u64],
        versions: &[Version],
        out: &mut Outcomes,
    ) -> Verdict {
        let outcome = match received {
            Err(why) => {
                out.add(format!("client: {why}"));
                return Ok(());
            }
            Ok(o) => o,
        };
        match outcome {
            Ok(n) => {
                if self.io.present_count() != n as usize {
                    return Err(format!(
                        "{n} pages accepted, {} marked present",
                        self.io.present_count()
                    ));
                }
                for (i, (&page, version)) in indices.iter().zip(versions).enumerate() {
                    if !self.io.is_present(i) {
                        continue;
                    }
                    let addr = PageAddr {
                        namespace: ns,
                        page,
                        version: version.0,
                    };
                    if !is_plaintext_of(addr, self.io.page(i)) {
                        return Err(format!(
                            "a page delivered for {addr:?} is not its plaintext"
                        ));
                    }
                }
                out.add(if n == 0 {
                    "client: accepted, no page present".to_string()
                } else {
                    "client: accepted, every page authentic".to_string()
                });
            }
            Err(e) => {
                if self.io.present_count() != 0 {
                    return Err(format!(
                        "refused ({e}) but {} pages present",
                        self.io.present_count()
                    ));
                }
                out.add(format!("client: refused ({e:?})"));
            }
        }
        Ok(())
    }
}
