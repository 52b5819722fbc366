//! One module per `farvm` subcommand.

pub mod api;
pub mod cloud_hypervisor;
pub mod control;
pub mod domain;
pub mod image;
pub mod paging;
pub mod restore;
pub mod run;
pub mod snapshot;

/// A failure with the exit status it maps to (see `farvm_vmm::exit_code`).
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}
