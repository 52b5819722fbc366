//! The per-VM page key: 256 bits from the OS RNG or a key file, zeroized on drop, never
//! printed; and its public [`KeyId`].

use std::fmt;
use std::path::Path;

use zeroize::Zeroizing;

use crate::derive;

/// Bytes of a page key.
pub const KEY_LEN: usize = 32;
/// Bytes of a [`KeyId`].
pub const KEY_ID_LEN: usize = 4;

/// Why a key could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The OS random number generator failed (getrandom).
    #[error("the OS random number generator failed: {0}")]
    Rng(getrandom::Error),
    /// The key file could not be written (it exists, or the directory is not writable).
    #[error("cannot write key file {path}")]
    Write {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The key file could not be read.
    #[error("cannot read key file {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The key file can be read by its group or by others (its mode allows more than 0600):
    /// the key is refused rather than used, since anyone who can read it can read the guest's
    /// remote pages.
    #[error(
        "key file {path} has mode {mode:04o}: a page key file must be readable by its owner \
         only (chmod 600 or 400)"
    )]
    Exposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file holds neither 32 raw bytes nor 64 hex digits.
    #[error(
        "key file {path}: {reason} (a page key file holds exactly {KEY_LEN} raw bytes, or \
         {hex} hex digits optionally followed by one newline)",
        hex = 2 * KEY_LEN
    )]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong, without any of the file's bytes.
        reason: String,
    },
}

/// The public identity of a page key: the first bytes of HMAC-SHA256(key, a fixed label).
/// Stored in every sealed page's trailer so that, after a rotation, a page sealed under an
/// older key is recognised as such (and opened with it, or reported by id) rather than failing
/// as a forgery. It reveals nothing of the key (HMAC is a PRF); two keys share an id with
/// probability 2^-32, which only costs a failed open, never a wrong one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// A 256-bit page key. It never leaves the VMM: the bytes are zeroized on drop, and neither
/// `Debug` nor any accessor outside this crate exposes them.
#[derive(Clone)]
pub struct PageKey {
    bytes: Zeroizing<[u8; KEY_LEN]>,
    id: KeyId,
}

impl PageKey {
    /// A fresh key from the OS random number generator (the default: one per VM run).
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        getrandom::fill(bytes.as_mut()).map_err(KeyError::Rng)?;
        Ok(Self::from_zeroizing(bytes))
    }

    /// A key from its 32 bytes (tests, benches, and a key received from a trusted source).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self::from_zeroizing(Zeroizing::new(bytes))
    }

    /// Loads a key file: exactly 32 raw bytes, or 64 hex digits (either case) optionally
    /// followed by one `\n` or `\r\n` — what `head -c32 /dev/urandom` and
    /// `openssl rand -hex 32` write. The file must be readable by its owner only (no group or
    /// other permission bits: mode 0600 or 0400), else [`KeyError::Exposed`]; the mode is read
    /// from the open file, so it is the file whose bytes are used.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        use std::io::Read as _;
        use std::os::unix::fs::PermissionsExt as _;
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let mode = file.metadata().map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: path.display().to_string(),
                mode,
            });
        }
        let mut data = Zeroizing::new(Vec::with_capacity(2 * KEY_LEN + 2));
        file.read_to_end(&mut data).map_err(io)?;
        Self::parse(&data).map_err(|reason| KeyError::Malformed {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Writes the key into a new file at `path` (32 raw bytes, mode 0600, never over an
    /// existing file), which [`PageKey::from_file`] reads: a snapshot of a VM whose pages stay
    /// sealed on the memory servers keeps its key this way (the file holds the secret).
    pub fn write_file(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let err = |source| KeyError::Write {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        f.write_all(self.bytes.as_ref()).map_err(err)?;
        f.sync_all().map_err(err)
    }

    /// The key's bytes, to hand the key to the VMM that takes the VM over (a live
    /// migration, over a sealed stream): the key never leaves a VMM otherwise.
    pub fn export(&self) -> Zeroizing<[u8; KEY_LEN]> {
        self.bytes.clone()
    }

    /// The key's public id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The key bytes, for deriving subkeys inside this crate.
    pub(crate) fn secret(&self) -> &[u8; KEY_LEN] {
        &self.bytes
    }

    fn from_zeroizing(bytes: Zeroizing<[u8; KEY_LEN]>) -> Self {
        let id = derive::key_id(&bytes);
        Self { bytes, id }
    }

    /// The content rules of a key file; the reason never quotes the file's bytes.
    fn parse(data: &[u8]) -> Result<Self, String> {
        if data.len() == KEY_LEN {
            let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
            bytes.copy_from_slice(data);
            return Ok(Self::from_zeroizing(bytes));
        }
        let hex = data
            .strip_suffix(b"\r\n")
            .or_else(|| data.strip_suffix(b"\n"))
            .unwrap_or(data);
        if hex.len() != 2 * KEY_LEN {
            return Err(format!("{} bytes", data.len()));
        }
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => bytes[i] = hi << 4 | lo,
                _ => {
                    return Err(format!(
                        "{} bytes, not hex at offset {}",
                        data.len(),
                        2 * i + usize::from(nibble(pair[0]).is_some())
                    ))
                }
            }
        }
        Ok(Self::from_zeroizing(bytes))
    }
}

impl fmt::Debug for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}
