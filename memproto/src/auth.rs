//! Tenant secrets and the HMAC-SHA256 challenge–response (no secret crosses the wire).
//!
//! A secret is at least 16 random bytes, written in a token file as hex. Its public key id is
//! the first 8 bytes of SHA-256("farvm-memserver key-id" ‖ secret): the server uses it to find
//! which secret to check the proof against, and it identifies the tenant that owns a namespace.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::path::Path;

use super::frame::NONCE_LEN;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// Problems with a secret or a token file.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Not hex, odd length, or too short.
    #[error("line {line}: {reason} (a token is at least {MIN_SECRET_LEN} bytes written as hex)")]
    Malformed {
        /// 1-based line number (1 for a lone string).
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The file could not be read.
    #[error("cannot read token file {path}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("token file {0} holds no token")]
    Empty(String),
}

/// A shared secret. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(key_id={:02x?})", self.key_id())
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl Secret {
    /// Wraps raw bytes (at least [`MIN_SECRET_LEN`]).
    pub fn from_bytes(b: &[u8]) -> Result<Self, SecretError> {
        if b.len() < MIN_SECRET_LEN {
            return Err(SecretError::Malformed {
                line: 1,
                reason: "too short",
            });
        }
        Ok(Self(b.to_vec()))
    }

    /// Parses a hex string (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Self, SecretError> {
        Self::parse_line(s.trim(), 1)
    }

    fn parse_line(s: &str, line: usize) -> Result<Self, SecretError> {
        let b = s.as_bytes();
        if !b.len().is_multiple_of(2) {
            return Err(SecretError::Malformed {
                line,
                reason: "odd number of hex digits",
            });
        }
        let mut out = Vec::with_capacity(b.len() / 2);
        for pair in b.chunks(2) {
            match (hex_val(pair[0]), hex_val(pair[1])) {
                (Some(h), Some(l)) => out.push(h << 4 | l),
                _ => {
                    return Err(SecretError::Malformed {
                        line,
                        reason: "not hex",
                    })
                }
            }
        }
        if out.len() < MIN_SECRET_LEN {
            return Err(SecretError::Malformed {
                line,
                reason: "too short",
            });
        }
        Ok(Self(out))
    }

    /// Hex form, as written in a token file.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A fresh random 32-byte secret.
    pub fn generate() -> Self {
        Self(random_bytes::<32>().to_vec())
    }

    /// Public identifier of this secret.
    pub fn key_id(&self) -> [u8; 8] {
        let mut h = Sha256::new();
        h.update(b"farvm-memserver key-id");
        h.update(&self.0);
        let d = h.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&d[..8]);
        id
    }

    fn mac(&self, role: &[u8], server_nonce: &[u8], client_nonce: &[u8]) -> [u8; NONCE_LEN] {
        // new_from_slice only fails for fixed-size-key MACs; HMAC takes any key length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        m.update(b"farvm-memserver/1 ");
        m.update(role);
        m.update(server_nonce);
        m.update(client_nonce);
        m.finalize().into_bytes().into()
    }

    /// The client's proof for a (server nonce, client nonce) pair.
    pub fn client_proof(&self, sn: &[u8; NONCE_LEN], cn: &[u8; NONCE_LEN]) -> [u8; NONCE_LEN] {
        self.mac(b"client", sn, cn)
    }

    /// The server's proof; different from the client's so neither can be replayed as the other.
    pub fn server_proof(&self, sn: &[u8; NONCE_LEN], cn: &[u8; NONCE_LEN]) -> [u8; NONCE_LEN] {
        self.mac(b"server", sn, cn)
    }
}

/// Constant-time comparison of two proofs.
pub fn proofs_equal(a: &[u8; NONCE_LEN], b: &[u8; NONCE_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a token file: one hex secret per line; blank lines and `#` comments are ignored.
pub fn load_token_file(path: &Path) -> Result<Vec<Secret>, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let tokens = parse_tokens(&text)?;
    if tokens.is_empty() {
        return Err(SecretError::Empty(path.display().to_string()));
    }
    Ok(tokens)
}

/// Parses token-file text (see [`load_token_file`]).
pub fn parse_tokens(text: &str) -> Result<Vec<Secret>, SecretError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if !l.is_empty() {
            out.push(Secret::parse_line(l, i + 1)?);
        }
    }
    Ok(out)
}

/// Random bytes from the OS; falls back to a time-seeded mix if getrandom fails (it does not
/// on Linux ≥ 3.17), because a nonce must never be a constant.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let d = Sha256::digest(t.to_le_bytes());
        for (i, x) in b.iter_mut().enumerate() {
            *x = d[i % 32];
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_parsing() {
        let t = parse_tokens("# tenants\n00112233445566778899aabbccddeeff\n\n  ffeeddccbbaa99887766554433221100 # b\n")
            .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].to_hex(), "00112233445566778899aabbccddeeff");
        assert!(matches!(
            parse_tokens("abc").unwrap_err(),
            SecretError::Malformed { line: 1, .. }
        ));
        assert!(parse_tokens("\n0011").is_err());
        assert!(parse_tokens("zz112233445566778899aabbccddeeff").is_err());
    }

    #[test]
    fn proofs_differ_by_role_secret_and_nonce() {
        let a = Secret::generate();
        let b = Secret::generate();
        let sn = random_bytes::<32>();
        let cn = random_bytes::<32>();
        assert!(proofs_equal(
            &a.client_proof(&sn, &cn),
            &a.client_proof(&sn, &cn)
        ));
        assert!(!proofs_equal(
            &a.client_proof(&sn, &cn),
            &a.server_proof(&sn, &cn)
        ));
        assert!(!proofs_equal(
            &a.client_proof(&sn, &cn),
            &b.client_proof(&sn, &cn)
        ));
        assert!(!proofs_equal(
            &a.client_proof(&sn, &cn),
            &a.client_proof(&cn, &sn)
        ));
        assert_ne!(a.key_id(), b.key_id());
        assert!(!format!("{a:?}").contains(&a.to_hex()));
    }
}
