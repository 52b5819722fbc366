//! One module per `farvm` subcommand.

pub mod bench;
pub mod bench_ab;
pub mod bench_pagespace;
pub mod bench_placement;
pub mod bench_remote;
pub mod cloud_hypervisor;
pub mod control;
pub mod image;
pub mod paging;
pub mod plot;
pub mod run;
pub mod trace;

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
