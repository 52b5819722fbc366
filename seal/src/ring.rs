//! The VM's key ring: the key new pages are sealed under and, during a rotation, the previous
//! key pages may still be sealed under; and [`RingSealer`], a [`PageSealer`] that follows it.
//!
//! A rotation is three steps (docs/sealing.md, "Rotation"): [`KeyRing::rotate`] makes a new
//! key current (every sealer seals under it from its next page on, and still opens pages of
//! the previous key); the caller re-seals the pages still under the previous key; then
//! [`KeyRing::drop_previous`] forgets the previous key, after which a page under it fails to
//! open with [`crate::OpenError::UnknownKey`].
//!
//! The data path takes no lock for this: each [`RingSealer`] compares the ring's generation (one
//! atomic load) with the one it was built for, and only when a rotation or a drop changed it
//! does it take the ring's mutex, once, to rebuild its sealer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::key::{KeyError, KeyId, PageKey};
use crate::sealer::PageSealer;

/// Why a rotation was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RotateError {
    /// A rotation is under way: its pages under the previous key are not all re-sealed yet.
    #[error(
        "a key rotation is already under way (pages under key {previous} are still being \
         re-sealed under key {current}); rotate again once it has finished"
    )]
    InProgress {
        /// The key being rotated out.
        previous: KeyId,
        /// The key being rotated in.
        current: KeyId,
    },
    /// The new key is the current key (same id).
    #[error("key {0} is already the current key")]
    SameKey(KeyId),
}

/// The ring's keys at one generation.
#[derive(Clone)]
struct Keys {
    current: PageKey,
    previous: Option<PageKey>,
}

/// What a ring holds, by key id only (for stats and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingState {
    /// The key new pages are sealed under.
    pub current: KeyId,
    /// The key being rotated out, while a rotation is under way.
    pub previous: Option<KeyId>,
    /// Changes at every rotation and every drop.
    pub generation: u64,
}

/// The VM's page keys (see the module doc). Shared (`Arc`) by every sealer of the VM.
pub struct KeyRing {
    keys: Mutex<Keys>,
    generation: AtomicU64,
}

impl KeyRing {
    /// A ring holding `key` only.
    pub fn new(key: PageKey) -> Self {
        Self {
            keys: Mutex::new(Keys {
                current: key,
                previous: None,
            }),
            generation: AtomicU64::new(0),
        }
    }

    fn keys(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `key` current: every sealer of the ring seals under it from its next page on and
    /// still opens pages under the key it replaces. Refused while an earlier rotation's
    /// previous key is still held. Returns the id of the key rotated out.
    pub fn rotate(&self, key: PageKey) -> Result<KeyId, RotateError> {
        let mut keys = self.keys();
        if let Some(previous) = &keys.previous {
            return Err(RotateError::InProgress {
                previous: previous.id(),
                current: keys.current.id(),
            });
        }
        if key.id() == keys.current.id() {
            return Err(RotateError::SameKey(key.id()));
        }
        let old = std::mem::replace(&mut keys.current, key);
        let old_id = old.id();
        keys.previous = Some(old);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(old_id)
    }

    /// Forgets the previous key (the end of a rotation): the ring's copy is zeroized now, each
    /// sealer's at its next seal or open. Returns its id, or `None` if there was none.
    pub fn drop_previous(&self) -> Option<KeyId> {
        let dropped = self.keys().previous.take().map(|k| k.id());
        if dropped.is_some() {
            self.generation.fetch_add(1, Ordering::Release);
        }
        dropped
    }

    /// Whether a rotation is under way (a previous key is held): one atomic load. The
    /// generation is odd from a rotation to the drop that ends it.
    pub fn rotating(&self) -> bool {
        self.generation.load(Ordering::Acquire) % 2 == 1
    }

    /// The key every stored page is sealed under, when no rotation runs (a snapshot that
    /// leaves its pages on the servers keeps it); refused while one runs, since pages may then
    /// be under either key.
    pub fn settled_key(&self) -> Result<PageKey, RotateError> {
        let keys = self.keys();
        match &keys.previous {
            Some(previous) => Err(RotateError::InProgress {
                previous: previous.id(),
                current: keys.current.id(),
            }),
            None => Ok(keys.current.clone()),
        }
    }

    /// The ring's keys by id.
    pub fn state(&self) -> RingState {
        let keys = self.keys();
        RingState {
            current: keys.current.id(),
            previous: keys.previous.as_ref().map(PageKey::id),
            generation: self.generation.load(Ordering::Acquire),
        }
    }

    /// A sealer under the current key that also opens the previous key's pages, and the
    /// generation it reflects.
    fn sealer(&self) -> Result<(PageSealer, u64), KeyError> {
        let keys = self.keys();
        let generation = self.generation.load(Ordering::Acquire);
        let mut sealer = PageSealer::new(&keys.current)?;
        if let Some(previous) = &keys.previous {
            sealer.add_opening_key(previous);
        }
        Ok((sealer, generation))
    }
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyRing").field(&self.state()).finish()
    }
}

/// A [`PageSealer`] that follows a [`KeyRing`]: one per thread or per lock that seals or opens
/// (a connection's writer, its receive side), used like a `PageSealer` through
/// [`RingSealer::sealer`].
pub struct RingSealer {
    ring: Arc<KeyRing>,
    generation: u64,
    sealer: PageSealer,
}

impl RingSealer {
    /// A sealer following `ring`, with a fresh salt.
    pub fn new(ring: Arc<KeyRing>) -> Result<Self, KeyError> {
        let (sealer, generation) = ring.sealer()?;
        Ok(Self {
            ring,
            generation,
            sealer,
        })
    }

    /// The sealer for the ring's current keys: the one already built unless the ring changed
    /// since (one atomic load), else a new one (new salt, the ring's keys; the old sealer and
    /// its copies of keys are dropped, zeroized).
    pub fn sealer(&mut self) -> Result<&mut PageSealer, KeyError> {
        if self.ring.generation.load(Ordering::Acquire) != self.generation {
            let (sealer, generation) = self.ring.sealer()?;
            self.sealer = sealer;
            self.generation = generation;
        }
        Ok(&mut self.sealer)
    }

    /// The ring this sealer follows.
    pub fn ring(&self) -> &Arc<KeyRing> {
        &self.ring
    }
}

impl std::fmt::Debug for RingSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSealer")
            .field("generation", &self.generation)
            .field("sealer", &self.sealer)
            .finish()
    }
}
