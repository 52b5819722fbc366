//! One module per `farvm` subcommand.

pub mod trace;
