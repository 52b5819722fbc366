//! farvm-workloads: the test guest's workloads, `no_std`, also built natively.
//!
//! The same code runs in the test guest's ring-3 processes and natively (the VMM's baselines
//! and checksum tests), so results can be compared bit for bit. Rules that keep it so:
//! - no allocator: the caller passes the heap (the working set) as a `&mut [u64]`;
//! - deterministic from `(seed, parameters)`: one SplitMix64 stream per purpose;
//! - f64 work uses only IEEE `+ - * /` and the crate's own `exp`/`ln` (no FMA contraction in
//!   Rust, and the x86-64 baseline has no FMA), so native and guest bits agree;
//! - no dependencies (the crate is compiled into a freestanding program).
//!
//! Every workload runs the same phases, announced through [`Env::phase`]: setup (fill the
//! working set), one unmeasured warm-up pass, the measured phase (timed with [`Env::now_ns`]).
//! Its checksum folds the measured results and, at the end, every word of the working set with
//! its position ([`fold::fold_words`]), so one wrong page anywhere changes it.
#![no_std]

#[cfg(feature = "std")]
extern crate std;

pub mod fold;
pub mod lathist;
pub mod math;
pub mod meta;
pub mod replay;
pub mod rng;
pub mod spec;

mod intops;
mod isolation;
mod kv;
mod matmul;
mod pagerank;
mod quicksort;
mod scan;
mod sparse;
mod zipf;

pub use meta::{find_by_id, find_by_name, ParamInfo, WorkloadInfo, WORKLOADS};
pub use spec::{parse_spec, Spec, SpecError};
pub use zipf::Zipf;

/// What a workload needs from where it runs.
pub trait Env {
    /// A monotonic clock in nanoseconds (rdtsc-based in the guest, `Instant` natively).
    fn now_ns(&mut self) -> u64;
    /// The workload enters phase `phase` (`farvm_guest_agent::pv::phase::*` numbering:
    /// 0 setup, 1 warm-up, 2 measured begins, 3 measured ended).
    fn phase(&mut self, _phase: u32) {}
    /// Give the CPU to another process (the isolation workload's rounds). Natively a no-op.
    fn yield_now(&mut self) {}
    /// Reports workload counter `index` ([`lathist::counter`]) to whoever runs the workload
    /// (the guest's mailbox). Ignored by default.
    fn counter(&mut self, _index: usize, _value: u64) {}
}

/// Phase numbers passed to [`Env::phase`]: the guest ABI's mailbox phases.
pub use farvm_guest_agent::pv::phase;

/// A workload's inputs (the test plan's `ProcessSpec` without the CPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// Working-set size in bytes; the heap passed to [`run`] must hold at least this much.
    pub ws_bytes: u64,
    /// Seed of the workload's random numbers (same seed, same checksum).
    pub seed: u64,
    /// The workload's named parameters, in the order of [`WorkloadInfo::params`];
    /// 0 means "the default".
    pub params: [u64; 4],
}

/// A workload's result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// A checksum of what the workload computed, equal in the guest and natively.
    pub checksum: u64,
    /// Operations in the measured phase (words scanned, lines touched, keys, edges, ...).
    pub ops: u64,
    /// Duration of the measured phase in ns.
    pub elapsed_ns: u64,
}

/// Why a workload refused to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// No workload has this id.
    UnknownWorkload(u32),
    /// The heap slice is shorter than the working set or the workload's minimum.
    HeapTooSmall {
        /// Bytes needed.
        need: u64,
        /// Bytes given.
        have: u64,
    },
    /// A parameter is out of range.
    BadParam {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: u64,
    },
    /// The workload only makes sense in the test guest (it faults on purpose).
    GuestOnly(u32),
    /// Words differed from what the workload wrote there: the isolation check's (another
    /// process or a wrong page overwrote them), or a verifying scan's (seq `verify=1`).
    Corrupted {
        /// Words that differed from what this process wrote.
        mismatches: u64,
    },
    /// The replay blob is missing, malformed, or has no such section.
    BadBlob {
        /// The section asked for.
        section: u64,
    },
}

impl Error {
    /// Stable numeric code written to the guest mailbox (`Mailbox::error`).
    pub fn code(&self) -> u64 {
        match self {
            Error::UnknownWorkload(_) => 1,
            Error::HeapTooSmall { .. } => 2,
            Error::BadParam { .. } => 3,
            Error::GuestOnly(_) => 4,
            Error::Corrupted { .. } => 5,
            Error::BadBlob { .. } => 6,
        }
    }

    /// Description of a mailbox error code.
    pub fn describe_code(code: u64) -> &'static str {
        match code {
            1 => "unknown workload",
            2 => "heap smaller than the working set",
            3 => "parameter out of range",
            4 => "workload runs only in the test guest",
            5 => "the workload read a word that differs from what it wrote (isolation, or seq verify=1)",
            6 => "replay blob missing or malformed",
            _ => "unknown error",
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::UnknownWorkload(id) => write!(f, "unknown workload id {id}"),
            Error::HeapTooSmall { need, have } => {
                write!(f, "heap too small: need {need} bytes, have {have}")
            }
            Error::BadParam { name, value } => {
                write!(f, "parameter {name}={value} is out of range")
            }
            Error::GuestOnly(id) => write!(f, "workload {id} runs only in the test guest"),
            Error::Corrupted { mismatches } => {
                write!(
                    f,
                    "{mismatches} words differed from what the workload wrote there"
                )
            }
            Error::BadBlob { section } => {
                write!(
                    f,
                    "replay blob missing, malformed or without section {section}"
                )
            }
        }
    }
}

impl core::error::Error for Error {}

/// Runs workload `id` (a `farvm_guest_agent::boot::workload` id) over `heap`.
///
/// `heap` must hold at least `p.ws_bytes` bytes; only the first `ws_bytes` are used.
pub fn run(id: u32, p: &Params, heap: &mut [u64], env: &mut dyn Env) -> Result<Outcome, Error> {
    run_blob(id, p, heap, &[], env)
}

/// [`run`] with the boot blob `blob` (the `replay` workload's trace, [`replay`]; empty if
/// there is none).
pub fn run_blob(
    id: u32,
    p: &Params,
    heap: &mut [u64],
    blob: &[u8],
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let info = find_by_id(id).ok_or(Error::UnknownWorkload(id))?;
    let have = heap.len() as u64 * 8;
    if p.ws_bytes > have {
        return Err(Error::HeapTooSmall {
            need: p.ws_bytes,
            have,
        });
    }
    if p.ws_bytes < info.min_ws {
        return Err(Error::HeapTooSmall {
            need: info.min_ws,
            have: p.ws_bytes,
        });
    }
    let heap = &mut heap[..(p.ws_bytes / 8) as usize];
    let arg = |i: usize| meta::param(info, p, i);
    use meta::id::*;
    match id {
        SEQ_SCAN => scan::seq(heap, p.seed, arg(0), arg(1), arg(2), env),
        STRIDE => scan::stride(heap, p.seed, arg(0), arg(1), env),
        RANDOM_RMW => scan::random(heap, p.seed, arg(0), env),
        MATMUL_NAIVE => matmul::run(heap, p.seed, arg(0), 0, env),
        MATMUL_BLOCKED => matmul::run(heap, p.seed, arg(0), arg(1), env),
        ZIPF_KV => kv::run(heap, p.seed, arg(0), arg(1), arg(2), arg(3), env),
        PAGERANK => pagerank::run(heap, p.seed, arg(0), arg(1), arg(2), env),
        QUICKSORT => quicksort::run(heap, p.seed, env),
        SPARSE => sparse::run(heap, p.seed, arg(0), arg(1), env),
        ISOLATION => isolation::run(heap, p.seed, arg(0), env),
        INT_OPS => Ok(intops::run(p.seed, arg(0), env)),
        REPLAY => replay::run(heap, blob, p.params[0], p.seed, arg(1), env),
        CRASH => Err(Error::GuestOnly(id)),
        _ => Err(Error::UnknownWorkload(id)),
    }
}

/// Measures `f` between the MEASURE and MEASURED phase marks.
fn measured<T>(env: &mut dyn Env, f: impl FnOnce() -> T) -> (T, u64) {
    env.phase(phase::MEASURE);
    let t0 = env.now_ns();
    let r = f();
    let t1 = env.now_ns();
    env.phase(phase::MEASURED);
    (r, t1.saturating_sub(t0))
}

/// Views a `u64` heap as `f64`s.
fn as_f64(words: &mut [u64]) -> &mut [f64] {
    // SAFETY: f64 and u64 have the same size and alignment and every bit pattern is a valid
    // f64; the returned slice borrows `words` mutably, so there is no aliasing.
    unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<f64>(), words.len()) }
}

/// Views a `u64` heap as twice as many `u32`s.
fn as_u32(words: &mut [u64]) -> &mut [u32] {
    // SAFETY: u64's alignment is a multiple of u32's, the byte length is the same, every bit
    // pattern is a valid u32, and the mutable borrow of `words` prevents aliasing.
    unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u32>(), words.len() * 2) }
}

/// Runs workload `id` natively on a fresh zeroed heap of `p.ws_bytes` (feature `std`): the
/// baseline that the VMM's benchmarks and tests compare guest runs against.
#[cfg(feature = "std")]
pub fn run_native(id: u32, p: &Params) -> Result<Outcome, Error> {
    let mut heap = std::vec![0u64; (p.ws_bytes / 8).max(1) as usize];
    run(id, p, &mut heap, &mut StdEnv::default())
}

/// Runs workload `id` natively like [`run_native`], with `blob` as the boot blob (the
/// `replay` workload's trace): the native twin of a guest run with that blob (feature `std`).
#[cfg(feature = "std")]
pub fn run_native_blob(id: u32, p: &Params, blob: &[u8]) -> Result<Outcome, Error> {
    let mut heap = std::vec![0u64; (p.ws_bytes / 8).max(1) as usize];
    run_blob(id, p, &mut heap, blob, &mut StdEnv::default())
}

/// A native [`Env`] on `std::time::Instant` (feature `std`).
#[cfg(feature = "std")]
pub struct StdEnv {
    start: std::time::Instant,
}

#[cfg(feature = "std")]
impl Default for StdEnv {
    fn default() -> Self {
        StdEnv {
            start: std::time::Instant::now(),
        }
    }
}

#[cfg(feature = "std")]
impl Env for StdEnv {
    fn now_ns(&mut self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn yield_now(&mut self) {
        std::thread::yield_now();
    }
}

#[cfg(test)]
pub(crate) mod testenv {
    /// A fake clock counting calls, recording phases.
    #[derive(Default)]
    pub struct Fake {
        pub t: u64,
        pub phases: [u32; 8],
        pub nphases: usize,
        pub yields: u64,
        pub counters: [u64; 8],
    }
    impl crate::Env for Fake {
        fn now_ns(&mut self) -> u64 {
            self.t += 1000;
            self.t
        }
        fn phase(&mut self, p: u32) {
            if self.nphases < 8 {
                self.phases[self.nphases] = p;
                self.nphases += 1;
            }
        }
        fn yield_now(&mut self) {
            self.yields += 1;
        }
        fn counter(&mut self, index: usize, value: u64) {
            self.counters[index] = value;
        }
    }
}
