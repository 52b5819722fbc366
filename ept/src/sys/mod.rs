//! Thin, checked wrappers over the Linux interfaces the engine uses (userfaultfd, memfd
//! mappings and madvise, eventfd/epoll). Every `unsafe` block of the crate that talks to the
//! kernel lives here.

pub mod anon;
pub mod mem;
pub mod poll;
pub mod uffd;
