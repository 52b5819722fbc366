//! The page sealer: seals a 4 KiB page in place under a per-sealer subkey and a counter nonce,
//! returning its [`Seal`] (the 40-byte trailer stored next to the page), and opens a page in
//! place given its seal and the [`PageAddr`] the caller expects it to have.

use crate::backend::{Cipher, NONCE_LEN, TAG_LEN};
use crate::key::{KeyError, KeyId, PageKey, KEY_ID_LEN};
use crate::PAGE_SIZE;

/// Bytes of the per-sealer salt that selects the subkey.
pub const SALT_LEN: usize = 12;
/// Bytes of a page's [`Seal`]: key id (4), salt (12), counter (8), tag (16).
pub const SEAL_LEN: usize = KEY_ID_LEN + SALT_LEN + 8 + TAG_LEN;
/// Subkeys of other sealers an opener keeps expanded (older runs of this VM, other threads'
/// sealers); beyond that the least recently added is dropped and derived again when needed.
const CACHED_SUBKEYS: usize = 16;

const SALT_AT: usize = KEY_ID_LEN;
const COUNTER_AT: usize = SALT_AT + SALT_LEN;
const TAG_AT: usize = COUNTER_AT + 8;

/// What a page is, bound into its tag as associated data: a page is authentic only at the
/// address and version it was sealed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageAddr {
    /// The VM's namespace on the memory servers.
    pub namespace: u64,
    /// The guest page number.
    pub page: u64,
    /// The page's write version: what identifies the content the VMM last wrote back (it opens
    /// with the version it expects, so an older copy is rejected; docs/sealing.md proposes the
    /// low 64 bits of the engine's fingerprint of that content).
    pub version: u64,
}

impl PageAddr {
    /// The associated data: the three fields little-endian, 24 bytes.
    fn aad(&self) -> [u8; 24] {
        let mut aad = [0u8; 24];
        aad[..8].copy_from_slice(&self.namespace.to_le_bytes());
        aad[8..16].copy_from_slice(&self.page.to_le_bytes());
        aad[16..].copy_from_slice(&self.version.to_le_bytes());
        aad
    }
}

/// A sealed page's trailer, stored and sent with its 4096 bytes: the key id, the salt of the
/// sealer's subkey, the nonce counter and the tag. None of it is secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seal(pub [u8; SEAL_LEN]);

impl Seal {
    /// The id of the page key the page was sealed under.
    pub fn key_id(&self) -> KeyId {
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&self.0[..KEY_ID_LEN]);
        KeyId(id)
    }

    fn salt(&self) -> &[u8] {
        &self.0[SALT_AT..COUNTER_AT]
    }

    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..8].copy_from_slice(&self.0[COUNTER_AT..TAG_AT]);
        nonce
    }

    fn tag(&self) -> [u8; TAG_LEN] {
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&self.0[TAG_AT..]);
        tag
    }
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&self.0[COUNTER_AT..TAG_AT]);
        f.debug_struct("Seal")
            .field("key_id", &self.key_id())
            .field("counter", &u64::from_le_bytes(counter))
            .finish_non_exhaustive()
    }
}

/// Why a page could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// This sealer used all 2^64 nonces; a new `PageSealer` (a new salt) continues.
    #[error("page sealer {0} used all 2^64 nonces")]
    Exhausted(KeyId),
}

/// Why a page was not opened. The page's bytes are wiped (zero) in every case: nothing of an
/// unauthenticated page stays where the guest could later see it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The page was sealed under a key this sealer does not hold (rotated out, or another
    /// VM's), by its id.
    #[error("page sealed under key {0}, which this VMM does not hold")]
    UnknownKey(KeyId),
    /// The tag does not match: the page, its seal, or its address (namespace, page number,
    /// version) is not what was sealed. The AEAD cannot say which.
    #[error("page failed authentication: altered, or not the page and version expected")]
    Forged,
}

/// One sealer's subkey: the salt it is derived with, and the expanded cipher.
struct Subkey {
    key_id: KeyId,
    salt: [u8; SALT_LEN],
    cipher: Cipher,
}

impl Subkey {
    fn derive(key: &PageKey, salt: [u8; SALT_LEN]) -> Self {
        Self {
            key_id: key.id(),
            salt,
            cipher: Cipher::derive(key.secret(), &salt),
        }
    }
}

/// Seals and opens pages. One per thread that touches pages (the fault thread, the evictor,
/// a connection's receiver): `&mut self`, no lock, no allocation on the data path. Sealers made
/// from the same key open each other's pages.
pub struct PageSealer {
    /// The keys this sealer opens with; the first one seals.
    keys: Vec<PageKey>,
    /// The subkey pages are sealed under.
    current: Subkey,
    /// The next nonce counter under `current`.
    next: u64,
    /// Other sealers' subkeys seen in authentic pages, most recent last.
    others: Vec<Subkey>,
}

impl PageSealer {
    /// A sealer under `key` with a fresh random salt, so its nonces are its own even when the
    /// key is shared (see the crate doc).
    pub fn new(key: &PageKey) -> Result<Self, KeyError> {
        let mut salt = [0u8; SALT_LEN];
        getrandom::fill(&mut salt).map_err(KeyError::Rng)?;
        Ok(Self::with_salt(key, salt))
    }

    /// A sealer with a given salt. Two sealers under one key with one salt repeat nonces:
    /// only for tests and benches that need reproducible output.
    pub fn with_salt(key: &PageKey, salt: [u8; SALT_LEN]) -> Self {
        Self {
            keys: vec![key.clone()],
            current: Subkey::derive(key, salt),
            next: 0,
            others: Vec::with_capacity(CACHED_SUBKEYS),
        }
    }

    /// Also opens pages sealed under `key` (an older key after rotation); new pages are still
    /// sealed under the first key.
    pub fn add_opening_key(&mut self, key: &PageKey) {
        if !self.keys.iter().any(|k| k.id() == key.id()) {
            self.keys.push(key.clone());
        }
    }

    /// The id of the key new pages are sealed under.
    pub fn key_id(&self) -> KeyId {
        self.current.key_id
    }

    /// Encrypts `page` in place for `addr` and returns its seal.
    pub fn seal(&mut self, addr: PageAddr, page: &mut [u8; PAGE_SIZE]) -> Result<Seal, SealError> {
        let counter = self.next;
        self.next = counter
            .checked_add(1)
            .ok_or(SealError::Exhausted(self.current.key_id))?;
        let mut seal = [0u8; SEAL_LEN];
        seal[..KEY_ID_LEN].copy_from_slice(&self.current.key_id.0);
        seal[SALT_AT..COUNTER_AT].copy_from_slice(&self.current.salt);
        seal[COUNTER_AT..TAG_AT].copy_from_slice(&counter.to_le_bytes());
        let seal = Seal(seal);
        let tag = self.current.cipher.seal(&seal.nonce(), &addr.aad(), page);
        let mut out = seal.0;
        out[TAG_AT..].copy_from_slice(&tag);
        Ok(Seal(out))
    }

    /// Authenticates `page` (as landed: ciphertext) against `seal` and the address the caller
    /// expects, and decrypts it in place. On any error the page is zeroed.
    pub fn open(
        &mut self,
        addr: PageAddr,
        page: &mut [u8; PAGE_SIZE],
        seal: &Seal,
    ) -> Result<(), OpenError> {
        let result = self.open_inner(addr, page, seal);
        if result.is_err() {
            page.fill(0);
        }
        result
    }

    fn open_inner(
        &mut self,
        addr: PageAddr,
        page: &mut [u8; PAGE_SIZE],
        seal: &Seal,
    ) -> Result<(), OpenError> {
        let (nonce, aad, tag) = (seal.nonce(), addr.aad(), seal.tag());
        let key_id = seal.key_id();
        let mine = |s: &Subkey| s.key_id == key_id && s.salt == seal.salt();
        if mine(&self.current) {
            return authentic(self.current.cipher.open(&nonce, &aad, page, &tag));
        }
        if let Some(sub) = self.others.iter().find(|s| mine(s)) {
            return authentic(sub.cipher.open(&nonce, &aad, page, &tag));
        }
        // Another sealer's page (an earlier run, another thread): derive its subkey. Only
        // after the page authenticates is the subkey kept, so forged salts cost a derivation
        // each but cannot push genuine subkeys out of the cache.
        let key = self
            .keys
            .iter()
            .find(|k| k.id() == key_id)
            .ok_or(OpenError::UnknownKey(key_id))?;
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(seal.salt());
        let sub = Subkey::derive(key, salt);
        authentic(sub.cipher.open(&nonce, &aad, page, &tag))?;
        if self.others.len() == CACHED_SUBKEYS {
            self.others.remove(0);
        }
        self.others.push(sub);
        Ok(())
    }
}

impl std::fmt::Debug for PageSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageSealer")
            .field("key_id", &self.current.key_id)
            .field("sealed", &self.next)
            .finish_non_exhaustive()
    }
}

fn authentic(ok: bool) -> Result<(), OpenError> {
    if ok {
        Ok(())
    } else {
        Err(OpenError::Forged)
    }
}
