//! Shared helpers for farvm integration tests.
