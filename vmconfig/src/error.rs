//! Errors and warnings of the configuration readers.

use std::path::PathBuf;

/// A configuration input farvm cannot use. Every variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The domain XML is not well-formed XML.
    #[error("domain XML line {line}: {message}")]
    Xml { line: u32, message: String },
    /// An element of the domain XML is missing, repeated or holds a value farvm cannot use.
    #[error("domain XML line {line}: <{element}>: {message}")]
    Invalid {
        element: String,
        line: u32,
        message: String,
    },
    /// The host config file is not valid TOML, has an unknown key or a bad value.
    #[error("{}:{line}: {message}", path.display())]
    Host {
        path: PathBuf,
        line: u32,
        message: String,
    },
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The merged settings name something `farvm run` has no option for.
    #[error("{0}")]
    Unmapped(String),
}

/// Something in the domain XML that farvm ignores (an element or attribute it does not
/// support). The domain still runs; callers show these to the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub line: u32,
    /// Where: the element path, e.g. `devices/disk` or `vcpu@cpuset`.
    pub element: String,
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "domain XML line {}: <{}>: {}",
            self.line, self.element, self.message
        )
    }
}
