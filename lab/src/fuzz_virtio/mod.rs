//! `farvm-lab fuzz-virtio`: a seeded, mutation-based fuzzer of the virtio-blk and virtio-net
//! device models (`farvm-devices`) behind their real virtio-mmio transport, as a hostile guest
//! driver would drive them. This module owns the command line, the execution loop, the hang
//! watchdog and the summary; `driver.rs` draws what the guest does, `memory.rs` maps guest RAM
//! between guard pages, `blk.rs` and `net.rs` are the two targets and their invariants.

mod blk;
mod driver;
mod memory;
mod net;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use farvm_devices::interrupt::{InterruptController, InterruptError};
use rand::SeedableRng;
use rand_xorshift::XorShiftRng;

pub const FUZZ_VIRTIO_ABOUT: &str = "\
A seeded, mutation-based fuzzer of farvm's virtio devices. It drives the production virtio-blk
or virtio-net device model, on its real virtio-mmio transport, the way a hostile guest driver
could: --iterations executions, each drawn from --seed and the execution's number. An execution
resets the device through its status register and brings it up again (feature negotiation,
queue setup, DRIVER_OK), with random register reads and writes of any width mixed in and steps
skipped now and then; writes descriptor tables, indirect tables, available and used rings
(buffers in guest RAM, in the hole, past RAM and at wrapping addresses; lengths from 0 to
4 GiB; NEXT pointing anywhere, loops; READ/WRITE/INDIRECT flags of every mix; queue sizes
that are not powers of two; available indices that jump), well-formed requests mutated and
random chains; and kicks the queues. Guest memory and the device are reused between
executions (the reset is the driver's own).

  blk  the device on a 128 KiB raw image in a scratch directory under --scratch-dir; requests
       are reads, writes, flushes, GET_ID and unknown types, sectors in and out of range
  net  the device on one end of a SOCK_SEQPACKET socketpair standing in for the tap (the
       device's NetBackend seam); the fuzzer sends frames of every size (runts, full size,
       oversized) from the other end and receives what the device transmits; one execution
       in about 2,000 the backend vanishes (EBADF, as a deleted tap)

Invariants, checked on every execution (a violation ends the run):
  - no panic (a panic in device or transport code is caught, reported and is a violation);
  - no hang: an execution that takes longer than --exec-timeout seconds is a violation;
  - no access outside guest RAM: guest RAM is 0-2 MiB and 3-4 MiB, each range mapped between
    PROT_NONE guard pages, so a stray access kills the fuzzer with SIGSEGV (a non-zero exit);
  - the transport still answers (its magic register) after the execution;
  - blk: the image changes only in sectors that an OUT request posted in the available ring
    names (every chain the device could reach is decoded before and after the kicks). Where
    a buffer the device may fill (read data, a status byte, the used ring) overlaps what
    decides its writes (a header, a descriptor, the available ring), a chain served early
    can forge a later one's request in the middle of a kick; those executions skip this
    check (counted: `image checks`);
  - net: every frame the device counts as sent reached the backend; a vanished backend reads
    as link down in configuration space, and a driver that was up got a config-change
    interrupt.

At the end (and on a violation) it prints the command, the seed, the executions run, the
outcome counts (requests served, rejected, frames received, sent, dropped, device resets
needed), the wall time and the executions per second. A violation names the execution; rerun
the same command with --iterations set to that number plus one to reproduce it (executions
depend on the ones before through the image and the device).

EXAMPLES
  farvm-lab fuzz-virtio --device blk --iterations 1000000 --seed 1
  farvm-lab fuzz-virtio --device net --iterations 20000 --seed 7

EXIT STATUS
  0 no violation; 1 a violation (or the fuzzer could not start); 64 bad arguments;
  a death by SIGSEGV is an access outside guest RAM";

/// The device to fuzz.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// virtio-blk on a raw image.
    Blk,
    /// virtio-net on a socketpair backend.
    Net,
}

#[derive(Args, Debug, Clone)]
pub struct FuzzVirtioArgs {
    /// The device to fuzz.
    #[arg(long, value_enum)]
    pub device: Device,
    /// Executions to run.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: u64,
    /// The seed every execution is drawn from (with its number).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds one execution may take before it counts as a hang.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub exec_timeout: u64,
    /// Where the blk target makes its scratch directory (a tmpfs keeps flushes cheap).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/dev/shm",
        env = "FARVM_FUZZ_SCRATCH"
    )]
    pub scratch_dir: PathBuf,
}

/// Outcome counters, printed in the order first counted.
#[derive(Default, Debug)]
pub struct Counts {
    order: Vec<&'static str>,
    values: BTreeMap<&'static str, u64>,
}

impl Counts {
    pub fn add(&mut self, what: &'static str, n: u64) {
        match self.values.get_mut(what) {
            Some(v) => *v += n,
            None => {
                self.order.push(what);
                self.values.insert(what, n);
            }
        }
    }

    #[cfg(test)]
    pub fn get(&self, what: &str) -> u64 {
        self.values.get(what).copied().unwrap_or(0)
    }

    fn rows(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.order.iter().map(|k| (*k, self.values[k]))
    }
}

/// One fuzzed device.
pub trait Target {
    /// Runs one execution; an error is a violated invariant.
    fn execute(&mut self, drv: &mut driver::Driver) -> Result<()>;
    /// Outcomes so far.
    fn counts(&self) -> &Counts;
}

/// An interrupt line that goes nowhere (the blk target reads the interrupt status register).
pub struct NoInterrupts;

impl InterruptController for NoInterrupts {
    fn trigger(&self, _gsi: u32) -> Result<(), InterruptError> {
        Ok(())
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub executions: u64,
    pub counts: Counts,
    pub wall: Duration,
    /// The execution that violated an invariant, and how.
    pub violation: Option<(u64, String)>,
}

/// The RNG of execution `i` under `seed`.
fn exec_rng(seed: u64, i: u64) -> XorShiftRng {
    XorShiftRng::seed_from_u64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Runs the fuzzer; the caller prints the report.
pub fn fuzz(args: &FuzzVirtioArgs) -> Result<Report> {
    let mem = memory::guarded()?;
    let mut target: Box<dyn Target> = match args.device {
        Device::Blk => Box::new(blk::BlkTarget::new(mem, &args.scratch_dir)?),
        Device::Net => Box::new(net::NetTarget::new(mem)?),
    };
    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let watchdog = {
        let (progress, done) = (progress.clone(), done.clone());
        let limit = Duration::from_secs(args.exec_timeout);
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || {
                let mut last = (u64::MAX, Instant::now());
                while done.load(Ordering::Relaxed) == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                    let now = progress.load(Ordering::Relaxed);
                    if now != last.0 {
                        last = (now, Instant::now());
                    } else if last.1.elapsed() > limit {
                        eprintln!(
                            "farvm-lab: fuzz-virtio: violation: execution {now} hung (over {} s)",
                            limit.as_secs()
                        );
                        std::process::exit(1);
                    }
                }
            })?
    };
    let start = Instant::now();
    let mut violation = None;
    let mut executions = 0;
    for i in 0..args.iterations {
        progress.store(i, Ordering::Relaxed);
        let mut drv = driver::Driver {
            rng: exec_rng(args.seed, i),
        };
        executions = i + 1;
        match std::panic::catch_unwind(AssertUnwindSafe(|| target.execute(&mut drv))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                violation = Some((i, format!("{e:#}")));
                break;
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                violation = Some((i, format!("panic: {msg}")));
                break;
            }
        }
    }
    let wall = start.elapsed();
    done.store(1, Ordering::Relaxed);
    let _ = watchdog.join();
    let mut counts = Counts::default();
    for (k, v) in target.counts().rows() {
        counts.add(k, v);
    }
    Ok(Report {
        executions,
        counts,
        wall,
        violation,
    })
}

/// `farvm-lab fuzz-virtio`.
pub fn run(args: FuzzVirtioArgs) -> Result<()> {
    let report = fuzz(&args)?;
    let device = match args.device {
        Device::Blk => "blk",
        Device::Net => "net",
    };
    println!(
        "farvm-lab fuzz-virtio --device {device} --iterations {} --seed {}",
        args.iterations, args.seed
    );
    println!("  {:<52} {}", "seed", args.seed);
    println!("  {:<52} {}", "executions", report.executions);
    for (what, n) in report.counts.rows() {
        println!("  {what:<52} {n}");
    }
    let secs = report.wall.as_secs_f64();
    println!("  {:<52} {secs:.1} s", "wall time");
    println!(
        "  {:<52} {:.0}",
        "executions per second",
        report.executions as f64 / secs.max(1e-9)
    );
    match report.violation {
        None => {
            println!("  {:<52} 0", "violations");
            Ok(())
        }
        Some((i, what)) => bail!(
            "violation in execution {i} (seed {}): {what}; reproduce with --iterations {}",
            args.seed,
            i + 1
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(device: Device) -> FuzzVirtioArgs {
        FuzzVirtioArgs {
            device,
            iterations: 20_000,
            seed: 1,
            exec_timeout: 60,
            // A tmpfs keeps flushes cheap where there is one.
            scratch_dir: Some(PathBuf::from("/dev/shm"))
                .filter(|p| p.is_dir())
                .unwrap_or_else(std::env::temp_dir),
        }
    }

    #[test]
    fn blk_survives_twenty_thousand_hostile_executions() {
        let r = fuzz(&args(Device::Blk)).unwrap();
        assert_eq!(r.violation, None);
        assert_eq!(r.executions, 20_000);
        // The executions reach the device's request code, not just the transport.
        for what in ["reads completed", "writes completed", "flushes completed"] {
            assert!(r.counts.get(what) > 100, "{what}: {:?}", r.counts);
        }
        assert!(
            r.counts
                .get("requests rejected (IOERR, UNSUPP, no status byte)")
                > 100
        );
        assert!(r.counts.get("needs-reset") > 0);
        assert!(
            r.counts
                .get("image checks (the rest: buffers overlap requests)")
                > 10_000
        );
    }

    #[test]
    fn net_survives_twenty_thousand_hostile_executions() {
        let r = fuzz(&args(Device::Net)).unwrap();
        assert_eq!(r.violation, None);
        assert_eq!(r.executions, 20_000);
        for what in [
            "frames received by the guest",
            "frames sent by the guest",
            "received frames dropped",
            "malformed chains consumed",
            "backend vanished",
        ] {
            assert!(r.counts.get(what) > 0, "{what}: {:?}", r.counts);
        }
    }
}
