//! Errors and warnings of the configuration readers.

use std::path::PathBuf;

/// A configuration input farvm cannot use. Every variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The domain XML is not well-formed XML.
    #[error("domain XML line {line}: {message}")]
    Xml {
        /// 1-based line.
        line: u32,
        /// The parser's message.
        message: String,
    },
    /// An element of the domain XML is missing, repeated or holds a value farvm cannot use.
    #[error("domain XML line {line}: <{element}>: {message}")]
    Invalid {
        /// The element path.
        element: String,
        /// 1-based line.
        line: u32,
        /// What is wrong.
        message: String,
    },
    /// The host config file is not valid TOML, has an unknown key or a bad value.
    #[error("{}:{line}: {message}", path.display())]
    Host {
        /// The host config file.
        path: PathBuf,
        /// 1-based line.
        line: u32,
        /// What is wrong.
        message: String,
    },
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Something in the domain XML that farvm ignores (an element or attribute it does not
/// support). The domain still runs; callers show these to the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line.
    pub line: u32,
    /// Where: the element path, e.g. `devices/disk` or `vcpu@cpuset`.
    pub element: String,
    /// What is ignored and why.
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
