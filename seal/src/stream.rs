//! A sealed stream between two hosts holding the same key (a live migration's, or any other
//! transfer of guest state that must not be readable or forgeable on the way): every frame is
//! encrypted and authenticated with AES-256-GCM under a subkey derived from the shared key and
//! a random session salt the sender sends first, in the clear. Each direction has its own
//! subkey and a frame counter in its nonce, so a frame replayed, reordered, dropped or sent
//! back the other way fails to open; the frame's length is its associated data.
//!
//! The stream does no I/O: [`StreamSealer::seal`] turns a frame's bytes into what goes on the
//! wire, [`StreamOpener::open`] the reverse; the caller frames them (e.g. a length prefix).

use crate::backend::{Cipher, NONCE_LEN, TAG_LEN};
use crate::key::PageKey;

/// Bytes of a session salt.
pub const STREAM_SALT_LEN: usize = 32;
/// Bytes a sealed frame adds to its plaintext (the tag).
pub const STREAM_OVERHEAD: usize = TAG_LEN;

/// Which way a stream's frames go: the two directions of one session never share a nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the host that opened the session (it chose the salt).
    Forward,
    /// Back to it.
    Back,
}

impl Direction {
    fn info(self) -> &'static [u8] {
        match self {
            Direction::Forward => b"farvm-seal v1 stream forward",
            Direction::Back => b"farvm-seal v1 stream back",
        }
    }
}

/// A frame did not open: forged, corrupted, replayed, reordered, or under another key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "stream frame {index} does not open: wrong key, or altered, replayed or reordered on the way"
)]
pub struct StreamOpenError {
    /// The frame's index in its direction.
    pub index: u64,
}

fn nonce(counter: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

/// A fresh session salt from the OS random number generator.
pub fn stream_salt() -> Result<[u8; STREAM_SALT_LEN], crate::KeyError> {
    let mut salt = [0u8; STREAM_SALT_LEN];
    getrandom::fill(&mut salt).map_err(crate::KeyError::Rng)?;
    Ok(salt)
}

/// Seals one direction's frames, in order.
pub struct StreamSealer {
    cipher: Cipher,
    next: u64,
}

impl StreamSealer {
    /// The sealer of direction `dir` of the session with `salt` under `key`.
    pub fn new(key: &PageKey, salt: &[u8; STREAM_SALT_LEN], dir: Direction) -> Self {
        Self {
            cipher: Cipher::derive_for(key.secret(), salt, dir.info()),
            next: 0,
        }
    }

    /// Encrypts `frame` in place and appends its tag: what goes on the wire.
    pub fn seal(&mut self, frame: &mut Vec<u8>) {
        let aad = (frame.len() as u64).to_le_bytes();
        let tag = self.cipher.seal_slice(&nonce(self.next), &aad, frame);
        self.next += 1;
        frame.extend_from_slice(&tag);
    }
}

/// Opens one direction's frames, in order.
pub struct StreamOpener {
    cipher: Cipher,
    next: u64,
}

impl StreamOpener {
    /// The opener of direction `dir` of the session with `salt` under `key`.
    pub fn new(key: &PageKey, salt: &[u8; STREAM_SALT_LEN], dir: Direction) -> Self {
        Self {
            cipher: Cipher::derive_for(key.secret(), salt, dir.info()),
            next: 0,
        }
    }

    /// Checks and decrypts a wire frame in place, leaving its plaintext.
    pub fn open(&mut self, frame: &mut Vec<u8>) -> Result<(), StreamOpenError> {
        let index = self.next;
        let Some(body) = frame.len().checked_sub(TAG_LEN) else {
            return Err(StreamOpenError { index });
        };
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&frame[body..]);
        frame.truncate(body);
        let aad = (body as u64).to_le_bytes();
        if !self.cipher.open_slice(&nonce(index), &aad, frame, &tag) {
            frame.fill(0);
            return Err(StreamOpenError { index });
        }
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_open_once_in_order_in_their_direction_under_their_key() {
        let key = PageKey::from_bytes([7; 32]);
        let salt = [1; STREAM_SALT_LEN];
        let mut s = StreamSealer::new(&key, &salt, Direction::Forward);
        let mut o = StreamOpener::new(&key, &salt, Direction::Forward);
        let (mut a, mut b) = (b"first frame".to_vec(), b"second".to_vec());
        s.seal(&mut a);
        s.seal(&mut b);
        assert!(!a.windows(5).any(|w| w == b"first"), "sent in the clear");
        // Out of order, the other way, another key or salt, a flipped bit: refused.
        assert!(o.open(&mut b.clone()).is_err());
        let mut back = StreamOpener::new(&key, &salt, Direction::Back);
        assert!(back.open(&mut a.clone()).is_err());
        let other = PageKey::from_bytes([8; 32]);
        assert!(StreamOpener::new(&other, &salt, Direction::Forward)
            .open(&mut a.clone())
            .is_err());
        assert!(
            StreamOpener::new(&key, &[2; STREAM_SALT_LEN], Direction::Forward)
                .open(&mut a.clone())
                .is_err()
        );
        let mut flipped = a.clone();
        flipped[3] ^= 1;
        assert!(o.open(&mut flipped).is_err());
        let mut a2 = a.clone();
        o.open(&mut a2).unwrap();
        assert_eq!(a2, b"first frame");
        // Replayed: refused.
        assert!(o.open(&mut a.clone()).is_err());
        o.open(&mut b).unwrap();
        assert_eq!(b, b"second");
        let mut short = vec![0u8; 3];
        assert!(o.open(&mut short).is_err());
    }
}
