//! The `--seccomp` setting: what a thread's filter does with a call outside its list.

use std::fmt;
use std::str::FromStr;

/// What happens to a system call a thread's filter does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// No filter is installed.
    Off,
    /// Filters are installed; a call outside them is allowed and logged by the kernel
    /// (`SECCOMP_RET_LOG`: the audit log or `dmesg`, `type=1326`), for finding a missing entry.
    Log,
    /// Filters are installed; a call outside them ends the process with a message naming the
    /// thread and the call, and exit status [`crate::EXIT_STATUS`].
    #[default]
    On,
}

impl Mode {
    /// The word `--seccomp` takes for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Log => "log",
            Mode::On => "on",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--seccomp` value that is none of `off`, `log`, `on`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("seccomp mode must be off, log or on (got {0:?})")]
pub struct BadMode(pub String);

impl FromStr for Mode {
    type Err = BadMode;

    fn from_str(s: &str) -> Result<Self, BadMode> {
        match s {
            "off" => Ok(Mode::Off),
            "log" => Ok(Mode::Log),
            "on" => Ok(Mode::On),
            other => Err(BadMode(other.to_string())),
        }
    }
}
