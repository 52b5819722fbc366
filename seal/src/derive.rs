//! The public key id: HMAC-SHA256(key, label), truncated. (The page subkey's derivation,
//! HKDF-SHA256, lives with the cipher in `backend.rs`, so its bytes never leave `ring`.)

use ring::hmac;

use crate::key::{KeyId, KEY_ID_LEN, KEY_LEN};

/// Label of the key id; the subkey's HKDF `info` differs, so the two never coincide.
const KEY_ID_LABEL: &[u8] = b"farvm-seal v1 key id";

/// The key's public id.
pub(crate) fn key_id(key: &[u8; KEY_LEN]) -> KeyId {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), KEY_ID_LABEL);
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(&tag.as_ref()[..KEY_ID_LEN]);
    KeyId(id)
}
