//! Runs workloads natively and prints name, time, ops and checksum — the same numbers the test
//! guest reports for the same spec, for quick comparisons by hand:
//!
//! `cargo run --release -p farvm-workloads --features std --example native -- seq:ws=64M kv`
//!
//! In a Linux guest (as `farvm-workload`, built by `guest-agent/linux/build.sh`) it can also
//! report the ground truth for fault attribution: with `--frames FILE --hold FILE2` and one
//! spec it touches its heap once, notes the guest-physical frame of every heap page (from
//! `/proc/self/pagemap`; needs root), prints `farvm-frames: populated pid N`, runs the
//! workload, notes the frames again, writes `pid N` and then the frames that did not move (one
//! hex frame number a line) to FILE, prints `farvm-frames: held pid N pages M moved K` and
//! keeps its memory until FILE2 exists — so that, until then, no other process can own those
//! frames.
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use farvm_workloads::{parse_spec, run, StdEnv};

const PAGE: usize = 4096;

/// Guest-physical frame of each page of `heap` (None: not present), from /proc/self/pagemap.
fn frames(heap: &[u64]) -> std::io::Result<Vec<Option<u64>>> {
    let pagemap = File::open("/proc/self/pagemap")?;
    let first = heap.as_ptr() as usize / PAGE;
    let pages = (heap.len() * 8).div_ceil(PAGE);
    let mut raw = vec![0u8; pages * 8];
    pagemap.read_exact_at(&mut raw, (first * 8) as u64)?;
    Ok(raw
        .chunks_exact(8)
        .map(|e| {
            let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            // Bit 63: present; bits 0-54: the frame (0 without CAP_SYS_ADMIN).
            let pfn = v & ((1 << 55) - 1);
            (v >> 63 == 1 && pfn != 0).then_some(pfn)
        })
        .collect())
}

/// `--frames`: see the module docs.
struct FrameReport {
    file: PathBuf,
    hold: PathBuf,
}

impl FrameReport {
    fn before(&self, heap: &mut [u64]) -> Vec<Option<u64>> {
        // One write per page: every page present before the frames are read.
        for i in (0..heap.len()).step_by(PAGE / 8) {
            // SAFETY: `i` is in bounds; a volatile write so the touch is not optimised away.
            unsafe { std::ptr::write_volatile(&mut heap[i], 0) };
        }
        let f = frames(heap).unwrap_or_else(|e| die(&format!("/proc/self/pagemap: {e}")));
        if f.iter().all(Option::is_none) {
            die("/proc/self/pagemap shows no frames (not root?)");
        }
        println!("farvm-frames: populated pid {}", std::process::id());
        std::io::stdout().flush().ok();
        f
    }

    fn after(&self, heap: &[u64], before: &[Option<u64>]) {
        let now = frames(heap).unwrap_or_else(|e| die(&format!("/proc/self/pagemap: {e}")));
        let stable: Vec<u64> = before
            .iter()
            .zip(&now)
            .filter_map(|(&a, &b)| a.filter(|_| a == b))
            .collect();
        let mut text = format!("pid {}\n", std::process::id());
        for f in &stable {
            text.push_str(&format!("{f:x}\n"));
        }
        std::fs::write(&self.file, text)
            .unwrap_or_else(|e| die(&format!("{}: {e}", self.file.display())));
        println!(
            "farvm-frames: held pid {} pages {} moved {}",
            std::process::id(),
            stable.len(),
            now.len() - stable.len()
        );
        std::io::stdout().flush().ok();
        while !Path::new(&self.hold).exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn die(msg: &str) -> ! {
    eprintln!("native: {msg}");
    std::process::exit(2);
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |name: &str| {
        let i = args.iter().position(|a| a == name)?;
        let v = args.get(i + 1).cloned();
        args.drain(i..(i + 2).min(args.len()));
        Some(v.unwrap_or_else(|| die(&format!("{name} needs a value"))))
    };
    let report = match (take("--frames"), take("--hold")) {
        (Some(file), Some(hold)) => Some(FrameReport {
            file: file.into(),
            hold: hold.into(),
        }),
        (None, None) => None,
        _ => die("--frames FILE and --hold FILE go together"),
    };
    let specs = args;
    if specs.is_empty() || (report.is_some() && specs.len() != 1) {
        die("usage: native [--frames FILE --hold FILE] SPEC... (e.g. seq:ws=64M,passes=4; one SPEC with --frames)");
    }
    println!(
        "{:<16} {:>12} {:>12} {:>18}",
        "workload", "time_ms", "ops", "checksum"
    );
    for s in &specs {
        let spec = parse_spec(s).unwrap_or_else(|e| die(&e.to_string()));
        let mut heap = vec![0u64; (spec.ws_bytes.div_ceil(4096) * 512) as usize];
        let before = report.as_ref().map(|r| r.before(&mut heap));
        let result = run(
            spec.workload.id,
            &spec.params(),
            &mut heap,
            &mut StdEnv::default(),
        );
        if let (Some(r), Some(b)) = (&report, &before) {
            r.after(&heap, b);
        }
        match result {
            Ok(o) => println!(
                "{:<16} {:>12.3} {:>12} {:#018x}",
                spec.workload.name,
                o.elapsed_ns as f64 / 1e6,
                o.ops,
                o.checksum
            ),
            Err(e) => println!("{:<16} error: {e}", spec.workload.name),
        }
    }
}
