//! Sealing a snapshot at rest under a snapshot key: the pages of its page file, its page key
//! (wrapped), its other records, its machine state, and a summary that binds them together.
//!
//! Every snapshot draws a random 32-byte salt (its identity, kept in its manifest) and runs
//! AES-256-GCM under its own subkey HKDF-SHA256(snapshot key, salt, info "farvm-seal v1
//! snapshot"). The associated data of everything sealed is the salt, what the item is (a
//! page, the wrapped key, a chunk of records, the summary) and its index, so an item moved to
//! another index, another kind or another snapshot does not open. The nonce is the item's kind
//! and index: [`SnapshotSealer`] takes indexes of each kind strictly in increasing order and
//! refuses anything else ([`SnapshotSealError`]), and a fresh salt gives every snapshot a
//! fresh subkey, so no nonce is ever used twice under a subkey whatever the caller does.
//!
//! The summary is a tag over bytes the caller chooses (what the snapshot holds: page counts,
//! digests of its other files) and SHA-256 of every sealed page's index and tag, in order: a
//! page added, removed (a hole punched into the page file) or swapped makes the summary fail
//! even though each page's own tag is intact. [`SnapshotOpener::check_summary`] takes the
//! same list from the caller (read back from where the tags are kept), so the list is checked
//! before any page is opened.

use ring::digest::{Context, SHA256};

use crate::backend::{Cipher, NONCE_LEN, TAG_LEN};
use crate::key::{KeyError, PageKey, KEY_LEN};
use crate::PAGE_SIZE;

/// Bytes of a snapshot's salt.
pub const SNAPSHOT_SALT_LEN: usize = 32;
/// Bytes of the tag of a sealed page, record chunk or summary.
pub const SNAPSHOT_TAG_LEN: usize = TAG_LEN;
/// Bytes of a wrapped page key: the sealed key and its tag.
pub const WRAPPED_KEY_LEN: usize = KEY_LEN + TAG_LEN;

/// HKDF `info` of a snapshot's subkey: no page or stream subkey is derived with it.
const SNAPSHOT_INFO: &[u8] = b"farvm-seal v1 snapshot";

/// What an item is; each kind has its own nonce space under a snapshot's subkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Page = 1,
    Key = 2,
    Records = 3,
    Summary = 4,
    Machine = 5,
}

const KINDS: usize = 5;

/// Why a [`SnapshotSealer`] refused to seal: sealing it would use a nonce a second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "snapshot sealing: {what} {index} after {after}: items are sealed once each, in increasing \
     order"
)]
pub struct SnapshotSealError {
    /// What was to be sealed.
    pub what: &'static str,
    /// Its index.
    pub index: u64,
    /// The index sealed last of its kind.
    pub after: u64,
}

/// Why a sealed item did not open: the wrong snapshot key, or the item was altered, moved
/// or taken from another snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotOpenError {
    /// A page.
    #[error("page {0} does not open (altered, moved from another page or another snapshot)")]
    Page(u64),
    /// The wrapped page key.
    #[error("the wrapped page key does not open (another snapshot key, or altered)")]
    Key,
    /// A chunk of records.
    #[error("records chunk {0} does not open (altered, moved or from another snapshot)")]
    Records(u64),
    /// The machine state.
    #[error("the machine state does not open (altered, or from another snapshot)")]
    Machine,
    /// The summary.
    #[error(
        "the summary does not open (another snapshot key, or the snapshot's files or \
         manifest were altered)"
    )]
    Summary,
}

fn nonce(kind: Kind, index: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[..4].copy_from_slice(&(kind as u32).to_le_bytes());
    n[4..].copy_from_slice(&index.to_le_bytes());
    n
}

/// The snapshot's subkey and salt, shared by both sides.
struct Sealed {
    cipher: Cipher,
    salt: [u8; SNAPSHOT_SALT_LEN],
}

impl Sealed {
    fn new(key: &PageKey, salt: [u8; SNAPSHOT_SALT_LEN]) -> Self {
        Self {
            cipher: Cipher::derive_for(key.secret(), &salt, SNAPSHOT_INFO),
            salt,
        }
    }

    /// The associated data of item `index` of `kind`: salt, kind, index.
    fn aad(&self, kind: Kind, index: u64) -> [u8; SNAPSHOT_SALT_LEN + 12] {
        let mut aad = [0u8; SNAPSHOT_SALT_LEN + 12];
        aad[..SNAPSHOT_SALT_LEN].copy_from_slice(&self.salt);
        aad[SNAPSHOT_SALT_LEN..SNAPSHOT_SALT_LEN + 4].copy_from_slice(&(kind as u32).to_le_bytes());
        aad[SNAPSHOT_SALT_LEN + 4..].copy_from_slice(&index.to_le_bytes());
        aad
    }

    /// The summary's associated data: its place, the page list's digest, the caller's bytes.
    fn summary_aad(&self, summary: &[u8], pages: &[u8; 32]) -> Vec<u8> {
        let mut aad = Vec::with_capacity(SNAPSHOT_SALT_LEN + 12 + 32 + summary.len());
        aad.extend_from_slice(&self.aad(Kind::Summary, 0));
        aad.extend_from_slice(pages);
        aad.extend_from_slice(summary);
        aad
    }
}

/// The running SHA-256 of the sealed pages' indexes and tags.
struct PageList(Context);

impl PageList {
    fn new() -> Self {
        Self(Context::new(&SHA256))
    }

    fn add(&mut self, page: u64, tag: &[u8; TAG_LEN]) {
        self.0.update(&page.to_le_bytes());
        self.0.update(tag);
    }

    fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }
}

/// Seals one snapshot as it is written (module doc): pages, the page key, record chunks, in
/// increasing order of each kind, then [`SnapshotSealer::finish`].
pub struct SnapshotSealer {
    sealed: Sealed,
    /// The next index each kind may take.
    next: [u64; KINDS],
    pages: PageList,
}

impl SnapshotSealer {
    /// A sealer for a new snapshot under `key`, with a fresh salt from the OS RNG.
    pub fn create(key: &PageKey) -> Result<Self, KeyError> {
        let mut salt = [0u8; SNAPSHOT_SALT_LEN];
        getrandom::fill(&mut salt).map_err(KeyError::Rng)?;
        Ok(Self {
            sealed: Sealed::new(key, salt),
            next: [0; KINDS],
            pages: PageList::new(),
        })
    }

    /// The snapshot's salt (its identity; not secret), which its opener needs.
    pub fn salt(&self) -> &[u8; SNAPSHOT_SALT_LEN] {
        &self.sealed.salt
    }

    fn take(
        &mut self,
        kind: Kind,
        what: &'static str,
        index: u64,
    ) -> Result<(), SnapshotSealError> {
        let next = &mut self.next[kind as usize - 1];
        if index < *next {
            return Err(SnapshotSealError {
                what,
                index,
                after: next.saturating_sub(1),
            });
        }
        *next = index + 1;
        Ok(())
    }

    /// Encrypts page `page` (its index in the snapshot) in place; returns its tag.
    pub fn seal_page(
        &mut self,
        page: u64,
        data: &mut [u8; PAGE_SIZE],
    ) -> Result<[u8; TAG_LEN], SnapshotSealError> {
        self.take(Kind::Page, "page", page)?;
        let s = &self.sealed;
        let tag = s
            .cipher
            .seal_slice(&nonce(Kind::Page, page), &s.aad(Kind::Page, page), data);
        self.pages.add(page, &tag);
        Ok(tag)
    }

    /// `key`, sealed (once per snapshot): what [`SnapshotOpener::unwrap_key`] opens.
    pub fn wrap_key(&mut self, key: &PageKey) -> Result<[u8; WRAPPED_KEY_LEN], SnapshotSealError> {
        self.take(Kind::Key, "page key", 0)?;
        let mut out = [0u8; WRAPPED_KEY_LEN];
        out[..KEY_LEN].copy_from_slice(key.secret());
        let s = &self.sealed;
        let tag = s.cipher.seal_slice(
            &nonce(Kind::Key, 0),
            &s.aad(Kind::Key, 0),
            &mut out[..KEY_LEN],
        );
        out[KEY_LEN..].copy_from_slice(&tag);
        Ok(out)
    }

    /// Encrypts chunk `chunk` of a records file in place; returns its tag.
    pub fn seal_records(
        &mut self,
        chunk: u64,
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], SnapshotSealError> {
        self.take(Kind::Records, "records chunk", chunk)?;
        let s = &self.sealed;
        Ok(s.cipher.seal_slice(
            &nonce(Kind::Records, chunk),
            &s.aad(Kind::Records, chunk),
            data,
        ))
    }

    /// Encrypts `data` (the machine state: registers, devices; once per snapshot) in place
    /// and appends its tag.
    pub fn seal_machine(&mut self, data: &mut Vec<u8>) -> Result<(), SnapshotSealError> {
        self.take(Kind::Machine, "machine state", 0)?;
        let s = &self.sealed;
        let tag = s
            .cipher
            .seal_slice(&nonce(Kind::Machine, 0), &s.aad(Kind::Machine, 0), data);
        data.extend_from_slice(&tag);
        Ok(())
    }

    /// The summary's tag over `summary` and every page sealed (module doc); ends the sealer.
    pub fn finish(self, summary: &[u8]) -> [u8; TAG_LEN] {
        let aad = self.sealed.summary_aad(summary, &self.pages.finish());
        // An empty plaintext: the tag authenticates the associated data alone (a MAC).
        self.sealed
            .cipher
            .seal_slice(&nonce(Kind::Summary, 0), &aad, &mut [])
    }
}

/// Opens a sealed snapshot's items, in any order.
pub struct SnapshotOpener {
    sealed: Sealed,
}

impl SnapshotOpener {
    /// The opener of the snapshot with `salt`, under `key`.
    pub fn new(key: &PageKey, salt: &[u8; SNAPSHOT_SALT_LEN]) -> Self {
        Self {
            sealed: Sealed::new(key, *salt),
        }
    }

    /// Checks the summary's `tag` against `summary` and the list of sealed pages `pages`
    /// (index and tag, in the order they were sealed).
    pub fn check_summary<'a>(
        &self,
        summary: &[u8],
        pages: impl IntoIterator<Item = (u64, &'a [u8; TAG_LEN])>,
        tag: &[u8; TAG_LEN],
    ) -> Result<(), SnapshotOpenError> {
        let mut list = PageList::new();
        for (page, t) in pages {
            list.add(page, t);
        }
        let aad = self.sealed.summary_aad(summary, &list.finish());
        let s = &self.sealed;
        if !s
            .cipher
            .open_slice(&nonce(Kind::Summary, 0), &aad, &mut [], tag)
        {
            return Err(SnapshotOpenError::Summary);
        }
        Ok(())
    }

    /// Authenticates and decrypts page `page` in place; on failure `data` is wiped.
    pub fn open_page(
        &self,
        page: u64,
        data: &mut [u8; PAGE_SIZE],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), SnapshotOpenError> {
        let s = &self.sealed;
        if !s.cipher.open_slice(
            &nonce(Kind::Page, page),
            &s.aad(Kind::Page, page),
            data,
            tag,
        ) {
            data.fill(0);
            return Err(SnapshotOpenError::Page(page));
        }
        Ok(())
    }

    /// The page key [`SnapshotSealer::wrap_key`] sealed.
    pub fn unwrap_key(
        &self,
        wrapped: &[u8; WRAPPED_KEY_LEN],
    ) -> Result<PageKey, SnapshotOpenError> {
        let mut bytes = zeroize::Zeroizing::new([0u8; KEY_LEN]);
        bytes.copy_from_slice(&wrapped[..KEY_LEN]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&wrapped[KEY_LEN..]);
        let s = &self.sealed;
        if !s.cipher.open_slice(
            &nonce(Kind::Key, 0),
            &s.aad(Kind::Key, 0),
            bytes.as_mut(),
            &tag,
        ) {
            return Err(SnapshotOpenError::Key);
        }
        Ok(PageKey::from_bytes(*bytes))
    }

    /// Authenticates and decrypts what [`SnapshotSealer::seal_machine`] sealed, in place,
    /// leaving the plaintext.
    pub fn open_machine(&self, data: &mut Vec<u8>) -> Result<(), SnapshotOpenError> {
        let Some(body) = data.len().checked_sub(TAG_LEN) else {
            return Err(SnapshotOpenError::Machine);
        };
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&data[body..]);
        data.truncate(body);
        let s = &self.sealed;
        if !s.cipher.open_slice(
            &nonce(Kind::Machine, 0),
            &s.aad(Kind::Machine, 0),
            data,
            &tag,
        ) {
            data.fill(0);
            return Err(SnapshotOpenError::Machine);
        }
        Ok(())
    }

    /// Authenticates and decrypts chunk `chunk` of a records file in place.
    pub fn open_records(
        &self,
        chunk: u64,
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), SnapshotOpenError> {
        let s = &self.sealed;
        if !s.cipher.open_slice(
            &nonce(Kind::Records, chunk),
            &s.aad(Kind::Records, chunk),
            data,
            tag,
        ) {
            data.fill(0);
            return Err(SnapshotOpenError::Records(chunk));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(b: u8) -> PageKey {
        PageKey::from_bytes([b; KEY_LEN])
    }

    fn page(fill: u8) -> [u8; PAGE_SIZE] {
        std::array::from_fn(|i| fill ^ (i as u8))
    }

    #[test]
    fn a_snapshot_opens_under_its_key_only_and_each_item_at_its_place_only() {
        let k = key(1);
        let mut s = SnapshotSealer::create(&k).unwrap();
        let (mut a, mut b) = (page(1), page(2));
        let ta = s.seal_page(3, &mut a).unwrap();
        let tb = s.seal_page(9, &mut b).unwrap();
        assert_ne!(a, page(1), "sealed in the clear");
        let wrapped = s.wrap_key(&key(7)).unwrap();
        let mut rec = b"twenty-four byte records".to_vec();
        let tr = s.seal_records(0, &mut rec).unwrap();
        let mut machine = b"registers".to_vec();
        s.seal_machine(&mut machine).unwrap();
        assert!(s.seal_machine(&mut b"again".to_vec()).is_err());
        let salt = *s.salt();
        let summary = s.finish(b"2 pages");
        let o = SnapshotOpener::new(&k, &salt);
        o.check_summary(b"2 pages", [(3, &ta), (9, &tb)], &summary)
            .unwrap();
        // A page dropped or swapped in the list, another summary: refused.
        for bad in [
            vec![(3, &ta)],
            vec![(9, &tb), (3, &ta)],
            vec![(3, &tb), (9, &ta)],
        ] {
            assert_eq!(
                o.check_summary(b"2 pages", bad, &summary),
                Err(SnapshotOpenError::Summary)
            );
        }
        assert!(o
            .check_summary(b"3 pages", [(3, &ta), (9, &tb)], &summary)
            .is_err());
        // A page at another index, a flipped bit: refused and wiped.
        let mut moved = a;
        assert_eq!(
            o.open_page(9, &mut moved, &ta),
            Err(SnapshotOpenError::Page(9))
        );
        assert!(moved.iter().all(|&x| x == 0));
        let mut flipped = a;
        flipped[100] ^= 4;
        assert!(o.open_page(3, &mut flipped, &ta).is_err());
        o.open_page(3, &mut a, &ta).unwrap();
        assert_eq!(a, page(1));
        assert_eq!(o.unwrap_key(&wrapped).unwrap().id(), key(7).id());
        o.open_records(0, &mut rec, &tr).unwrap();
        assert_eq!(rec, b"twenty-four byte records");
        let mut flipped = machine.clone();
        flipped[0] ^= 1;
        assert_eq!(
            o.open_machine(&mut flipped),
            Err(SnapshotOpenError::Machine)
        );
        assert!(o.open_machine(&mut vec![1, 2]).is_err());
        o.open_machine(&mut machine).unwrap();
        assert_eq!(machine, b"registers");
        // Another key, another snapshot's salt: nothing opens.
        let wrong = SnapshotOpener::new(&key(2), &salt);
        assert_eq!(
            wrong.unwrap_key(&wrapped).err(),
            Some(SnapshotOpenError::Key)
        );
        let other = SnapshotOpener::new(&k, &[0; SNAPSHOT_SALT_LEN]);
        assert!(other.unwrap_key(&wrapped).is_err());
        assert!(other
            .check_summary(b"2 pages", [(3, &ta), (9, &tb)], &summary)
            .is_err());
    }

    #[test]
    fn a_sealer_never_seals_an_index_twice() {
        let mut s = SnapshotSealer::create(&key(1)).unwrap();
        s.seal_page(5, &mut page(0)).unwrap();
        assert_eq!(
            s.seal_page(5, &mut page(0)),
            Err(SnapshotSealError {
                what: "page",
                index: 5,
                after: 5
            })
        );
        assert!(s.seal_page(4, &mut page(0)).is_err());
        s.seal_page(6, &mut page(0)).unwrap();
        s.wrap_key(&key(2)).unwrap();
        assert!(s.wrap_key(&key(2)).is_err());
        s.seal_records(0, &mut [1, 2]).unwrap();
        assert!(s.seal_records(0, &mut [1, 2]).is_err());
        // Two snapshots under one key never share a subkey: the same page seals differently.
        let (mut x, mut y) = (page(3), page(3));
        SnapshotSealer::create(&key(1))
            .unwrap()
            .seal_page(0, &mut x)
            .unwrap();
        SnapshotSealer::create(&key(1))
            .unwrap()
            .seal_page(0, &mut y)
            .unwrap();
        assert_ne!(x, y);
    }

    proptest! {
        /// Any page round-trips at its index, and a page opened at any other index, or with
        /// any single bit of it or its tag flipped, is refused.
        #[test]
        fn pages_round_trip_and_any_change_is_refused(
            fill in any::<u8>(),
            index in 0u64..1 << 40,
            other in 0u64..1 << 40,
            bit in 0usize..(PAGE_SIZE + TAG_LEN) * 8,
        ) {
            let k = key(fill);
            let mut s = SnapshotSealer::create(&k).unwrap();
            let mut p = page(fill);
            let tag = s.seal_page(index, &mut p).unwrap();
            let o = SnapshotOpener::new(&k, s.salt());
            if other != index {
                prop_assert!(o.open_page(other, &mut p.clone(), &tag).is_err());
            }
            let (mut q, mut t) = (p, tag);
            if bit < PAGE_SIZE * 8 {
                q[bit / 8] ^= 1 << (bit % 8);
            } else {
                let b = bit - PAGE_SIZE * 8;
                t[b / 8] ^= 1 << (b % 8);
            }
            prop_assert!(o.open_page(index, &mut q, &t).is_err());
            o.open_page(index, &mut p, &tag).unwrap();
            prop_assert_eq!(p, page(fill));
        }
    }
}
