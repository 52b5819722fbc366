//! Names in the pool: memory-server ids, rack names and VM ids (with the memory-server
//! namespace a VM id maps to). Each is validated once, where it enters the pool, so every key
//! built from it is well formed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A name that is not a valid server id or rack name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {what}: use 1-64 characters of A-Z a-z 0-9 . _ : -")]
pub struct BadName {
    /// What the name was for ("server id", "rack name").
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
}

fn check_name(what: &'static str, value: &str) -> Result<(), BadName> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(BadName {
            what,
            value: value.to_owned(),
        })
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` (1-64 characters of `A-Z a-z 0-9 . _ : -`).
            pub fn new(value: impl Into<String>) -> Result<Self, BadName> {
                let value = value.into();
                check_name($what, &value)?;
                Ok(Self(value))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = BadName;
            fn from_str(s: &str) -> Result<Self, BadName> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = BadName;
            fn try_from(s: String) -> Result<Self, BadName> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }
    };
}

name_type!(
    /// A memory server's id in the pool, chosen by the operator (e.g. `ms-r1-a`); stable across
    /// restarts of the server process (which change its instance id instead).
    ServerId,
    "server id"
);
name_type!(
    /// A rack (failure domain): a slab's replicas are placed on distinct racks.
    RackId,
    "rack name"
);

/// A VM instance's id: a random UUID drawn when the VM is admitted. Its memory-server
/// namespace is [`VmId::namespace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VmId(pub Uuid);

impl VmId {
    /// A fresh random id.
    pub fn random() -> Self {
        Self(Uuid::new_v4())
    }

    /// The memory-server namespace holding this VM's pages: the UUID's two halves XORed.
    /// Random UUIDs give random namespaces, so two VMs collide with probability 2⁻⁶⁴ per pair.
    pub fn namespace(&self) -> u64 {
        let v = self.0.as_u128();
        (v >> 64) as u64 ^ v as u64
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for VmId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, uuid::Error> {
        Uuid::parse_str(s).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(ServerId::new("ms-r1-a").is_ok());
        assert!(RackId::new("rack.1:a_b").is_ok());
        let e = ServerId::new("a/b").unwrap_err();
        assert_eq!(e.what, "server id");
        assert!(e.to_string().contains("`a/b`"));
        assert!(RackId::new("").is_err());
        assert!(RackId::new("x".repeat(65)).is_err());
        let bad: Result<ServerId, _> = serde_json::from_str("\"a b\"");
        assert!(bad.is_err());
    }

    #[test]
    fn namespace_mixes_both_halves() {
        let id = VmId(Uuid::from_u128(0x0000_0000_0000_0001_0000_0000_0000_0002));
        assert_eq!(id.namespace(), 3);
        let back: VmId = id.to_string().parse().unwrap();
        assert_eq!(back, id);
    }
}
