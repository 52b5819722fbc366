//! The one AEAD implementation the sealer runs: AES-256-GCM from `ring`, which uses AES-NI,
//! VAES and VPCLMULQDQ where the CPU has them (detected at run time). Chosen by
//! `benches/seal.rs`: 0.55 µs a page here, 3.4× faster than RustCrypto's `aes-gcm`, level with
//! `aws-lc-rs` without its cmake build (docs/sealing.md has the table). Everything else in the
//! crate is independent of the implementation; swapping it is this file.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::hkdf::{Salt, HKDF_SHA256};

use crate::key::KEY_LEN;
use crate::PAGE_SIZE;

/// Bytes of an AEAD nonce.
pub(crate) const NONCE_LEN: usize = 12;
/// Bytes of an AEAD tag.
pub(crate) const TAG_LEN: usize = 16;

/// HKDF `info` of the page subkey: it names the algorithm, so another cipher gets other keys.
const SUBKEY_INFO: &[u8] = b"farvm-seal v1 aes-256-gcm page subkey";

/// An expanded AES-256-GCM subkey.
pub(crate) struct Cipher(LessSafeKey);

impl Cipher {
    /// The subkey HKDF-SHA256(ikm = key, salt, info = [`SUBKEY_INFO`]), expanded straight
    /// into the cipher: its bytes never exist outside `ring`.
    pub(crate) fn derive(key: &[u8; KEY_LEN], salt: &[u8]) -> Self {
        Self::derive_for(key, salt, SUBKEY_INFO)
    }

    /// The subkey HKDF-SHA256(ikm = key, salt, info): another `info` (a stream's) gives
    /// another key from the same secret.
    pub(crate) fn derive_for(key: &[u8; KEY_LEN], salt: &[u8], info: &[u8]) -> Self {
        let prk = Salt::new(HKDF_SHA256, salt).extract(key);
        let info = [info];
        let okm = prk
            .expand(&info, &AES_256_GCM)
            // HKDF-SHA256 fails only for outputs over 8160 bytes; this one is 32.
            .expect("HKDF-SHA256 yields a 32-byte key");
        Self(LessSafeKey::new(UnboundKey::from(okm)))
    }

    /// Encrypts `page` in place; returns the tag.
    pub(crate) fn seal(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        page: &mut [u8; PAGE_SIZE],
    ) -> [u8; TAG_LEN] {
        self.seal_slice(nonce, aad, page)
    }

    /// Authenticates and decrypts `page` in place; false if the tag does not match (then
    /// `page` holds unspecified bytes: the caller wipes it).
    pub(crate) fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        page: &mut [u8; PAGE_SIZE],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        self.open_slice(nonce, aad, page, tag)
    }
}

impl Cipher {
    /// Encrypts `data` (any length up to 2^36 bytes) in place; returns the tag.
    pub(crate) fn seal_slice(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let tag = self
            .0
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), data)
            // AES-GCM fails only for messages over 2^36 bytes: callers bound their frames.
            .expect("AES-GCM accepts a bounded frame");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Authenticates and decrypts `data` in place; false if the tag does not match.
    pub(crate) fn open_slice(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        self.0
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(aad),
                Tag::from(*tag),
                data,
                0..,
            )
            .is_ok()
    }
}
