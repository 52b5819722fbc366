//! The two VMs a fuzz run plays: each with its namespace, its memory-server token (a tenant of
//! its own) and its page key, and the tagged plaintext of the pages it writes, so that a page
//! read back says whose and which it is once opened.

use farvm_memproto::auth::Secret;
use farvm_memproto::{wire_crc, PAGE_SIZE, SEAL_LEN};
use farvm_prefetch::trace::rng::SplitMix64;
use farvm_seal::{PageAddr, PageKey, PageSealer, SALT_LEN};

/// One VM: a tenant of the memory server with one namespace and one page key.
pub struct Vm {
    /// Its namespace on the server.
    pub ns: u64,
    /// Its memory-server token.
    pub secret: Secret,
    /// The sealer of the pages it writes.
    pub sealer: PageSealer,
    /// The opener of the pages it reads (another sealer under the same key, as a
    /// connection's receive side is).
    pub opener: PageSealer,
}

/// The two VMs of a run.
pub type Vms = [Vm; 2];

/// Bytes drawn from `rng`.
pub fn bytes<const N: usize>(rng: &mut SplitMix64) -> [u8; N] {
    let mut b = [0u8; N];
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
    }
    b
}

impl Vm {
    /// VM `i` of the run: its namespace, token, key and sealers are drawn from `rng`, so a seed
    /// replays the same run.
    pub fn new(i: u64, rng: &mut SplitMix64) -> Self {
        let secret = Secret::from_bytes(&bytes::<32>(rng)).expect("32 bytes is a valid token");
        let key = PageKey::from_bytes(bytes::<32>(rng));
        let sealer = PageSealer::with_salt(&key, bytes::<SALT_LEN>(rng));
        let opener = PageSealer::with_salt(&key, bytes::<SALT_LEN>(rng));
        Self {
            ns: 0xf0_0000 + i,
            secret,
            sealer,
            opener,
        }
    }

    /// The wire page (crc32c, seal, ciphertext) of `addr`'s tagged plaintext, sealed by this
    /// VM's sealer: what its client sends in a WRITE.
    pub fn sealed_wire_page(&mut self, addr: PageAddr, out: &mut Vec<u8>) {
        let mut page = [0u8; PAGE_SIZE];
        plaintext(addr, &mut page);
        let seal = self.sealer.seal(addr, &mut page).expect("2^64 nonces");
        out.extend_from_slice(&wire_crc(&seal.0, &page).to_le_bytes());
        out.extend_from_slice(&seal.0);
        out.extend_from_slice(&page);
    }
}

/// The plaintext a VM writes at `addr`: the address itself (namespace, page, version, little
/// endian) followed by a filler derived from it.
pub fn plaintext(addr: PageAddr, page: &mut [u8; PAGE_SIZE]) {
    page[..8].copy_from_slice(&addr.namespace.to_le_bytes());
    page[8..16].copy_from_slice(&addr.page.to_le_bytes());
    page[16..24].copy_from_slice(&addr.version.to_le_bytes());
    let fill = (addr.namespace ^ addr.page.rotate_left(8) ^ addr.version.rotate_left(16)) as u8;
    page[24..].fill(fill);
}

/// Whether `page` is exactly the plaintext of `addr`.
pub fn is_plaintext_of(addr: PageAddr, page: &[u8]) -> bool {
    let mut want = [0u8; PAGE_SIZE];
    plaintext(addr, &mut want);
    page == want
}

/// A wire page's seal.
pub fn seal_of(wire_page: &[u8]) -> [u8; SEAL_LEN] {
    let mut s = [0u8; SEAL_LEN];
    s.copy_from_slice(&wire_page[4..4 + SEAL_LEN]);
    s
}
