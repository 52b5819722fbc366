//! QEMU booting the same test guest as `farvm run` does (its PVH entry, `-machine microvm`,
//! `-accel kvm`; see `farvm_vmm::boot::pvh`): the "QEMU + kernel swap" setups of `bench
//! compare`. The guest gets the same RAM for its frames, the same plan (one process on vCPU 0,
//! timer 100 Hz, frame runs of 2 MiB, shuffle seed 1) and reports on its serial console. QEMU
//! runs with transparent huge pages off (`PR_SET_THP_DISABLE`), like farvm's 4 KiB guest RAM.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use farvm_guest_agent::boot::flags;
use farvm_vmm::boot::pvh::{self, ConsoleOutcome};
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::workload_spec::PlacedWorkload;

use super::failure::{exit_ending, oom_ending, signal_ending, Failure};
use super::guest_rss::{Steer, Watch};
use super::host::{self, MemCgroup};
use super::{output_within, RunResult};
use crate::bench::remote::runner::guest_mem;

/// QEMU and the files it boots (in a scratch directory removed on drop).
pub struct Qemu {
    exe: PathBuf,
    dir: PathBuf,
    kernel: PathBuf,
    tsc_khz: u64,
    timeout: Duration,
}

/// `qemu-system-x86_64` as given: a path, or a name looked up on PATH.
fn resolve(exe: &str) -> Result<PathBuf> {
    let p = Path::new(exe);
    if p.components().count() > 1 {
        return match p.is_file() {
            true => Ok(p.to_path_buf()),
            false => bail!("--qemu {exe}: no such file"),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(exe))
        .find(|c| c.is_file())
        .with_context(|| {
            format!(
                "--qemu {exe}: not found on PATH (Debian: qemu-system-x86), or pass --qemu none"
            )
        })
}

impl Qemu {
    /// Writes the built-in test-guest kernel into a scratch directory named after `tag`; a run
    /// is killed once it has taken `timeout` (QEMU has no timer of its own).
    pub fn new(exe: &str, tag: &str, timeout: Duration) -> Result<Self> {
        let exe = resolve(exe)?;
        let dir = std::env::temp_dir().join(format!("farvm-compare-qemu-{tag}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let kernel = dir.join("testguest.elf");
        std::fs::write(&kernel, farvm_vmm::builtin::test_guest_elf())
            .with_context(|| format!("writing {}", kernel.display()))?;
        let tsc_khz = pvh::host_tsc_khz()?;
        Ok(Qemu {
            exe,
            dir,
            kernel,
            tsc_khz,
            timeout,
        })
    }

    /// The QEMU command booting the test guest with `w` alone (on vCPU 0) on `mem` bytes of
    /// guest frames (QEMU's RAM is `mem` + [`pvh::TOP_RESERVE`]), in `cgroup` if given, with
    /// transparent huge pages off; its console is its stdout. Arguments may be added (QMP,
    /// `-incoming`); its standard streams are the caller's to set.
    pub(crate) fn command(
        &self,
        w: &PlacedWorkload,
        mem: u64,
        cgroup: Option<&MemCgroup>,
    ) -> Result<Command> {
        let mut one = *w;
        one.cpu = 0;
        let plan = TestPlan {
            procs: vec![one.process_spec()],
            timer_hz: 100,
            flags: flags::RAM_IS_ZERO,
            frame_shuffle_seed: 1,
            frame_run_shift: 9,
            // The PVH boot module carries no boot blob: replayed traces run under farvm only.
            blob: Vec::new(),
        };
        // Written beside and renamed over the last one: a QEMU started before (a migration's
        // source) may still be mapping the old file, which must not change under it (SIGBUS).
        let module = self.dir.join("bootinfo.bin");
        let fresh = self.dir.join("bootinfo.bin.new");
        std::fs::write(
            &fresh,
            pvh::boot_module(
                farvm_vmm::builtin::test_guest_elf(),
                mem,
                self.tsc_khz,
                &plan,
            )?,
        )
        .with_context(|| format!("writing {}", fresh.display()))?;
        std::fs::rename(&fresh, &module)
            .with_context(|| format!("renaming {} to {}", fresh.display(), module.display()))?;
        let mut cmd = match cgroup {
            Some(cg) => cg.command(&self.exe),
            None => Command::new(&self.exe),
        };
        // QEMU madvises its guest RAM MADV_HUGEPAGE; farvm's is 4 KiB pages (this host's THP
        // mode is `madvise`). PR_SET_THP_DISABLE (inherited across exec) gives QEMU's guest the
        // same page size, so both VMMs are charged and swapped page by page.
        // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
        // which is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.args(pvh::qemu_args(&self.kernel, &module, mem));
        Ok(cmd)
    }

    /// One QEMU run of `w` (in `cgroup` if given, its limit steered by `steer` if given) to its
    /// power-off; the result parsed from its console.
    pub fn run(
        &self,
        spec: &str,
        w: &PlacedWorkload,
        cgroup: Option<&MemCgroup>,
        steer: Option<Steer>,
    ) -> Result<RunResult> {
        let mem = guest_mem(w);
        let mut cmd = self.command(w, mem, cgroup)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let what = format!("QEMU --workload {spec}");
        let swaps_before = host::swap_counters();
        let t0 = Instant::now();
        let watch = cgroup.map(|cg| Watch {
            guest_bytes: mem,
            cgroup: Some(cg.limit_file()),
            steer,
        });
        let hits_before = cgroup.map_or(0, MemCgroup::limit_hits);
        let (out, guest) = output_within(cmd, self.timeout, watch)?;
        let oom = cgroup
            .map_or(0, MemCgroup::limit_hits)
            .saturating_sub(hits_before);
        let swaps_after = host::swap_counters();
        let console = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        // A QEMU that did not power its guest off through isa-debug-exit, or whose guest did
        // not finish the workload, is a failed run of its setup, not a bench error.
        let failure = match code.and_then(pvh::exit_status) {
            None => match std::os::unix::process::ExitStatusExt::signal(&out.status) {
                Some(_) if t0.elapsed() >= self.timeout => Failure::Timeout {
                    secs: self.timeout.as_secs(),
                },
                Some(sig) => signal_ending(sig, cgroup.map(MemCgroup::events).as_deref(), oom),
                None if oom > 0 => oom_ending(&format!("QEMU {}", out.status), &stderr, oom),
                None => exit_ending(&format!("QEMU {}", out.status), &stderr),
            },
            Some(status) => {
                let procs = pvh::parse_console(&console);
                match procs.first().map(|p| &p.outcome) {
                    Some(ConsoleOutcome::Done {
                        checksum,
                        elapsed_ns,
                        ..
                    }) if status == 0 => {
                        return Ok(RunResult {
                            measured_ms: *elapsed_ns as f64 / 1e6,
                            checksum: Some(*checksum),
                            failed: None,
                            faults: swaps_after.0.saturating_sub(swaps_before.0),
                            prefetches: 0,
                            guest,
                        })
                    }
                    _ => {
                        eprintln!("{what}: the guest's console:\n{console}");
                        // QEMU's own exit 1 reads as the guest's status 0 (isa-debug-exit
                        // exits (status << 1) | 1): say both.
                        let code = code.unwrap_or_default();
                        Failure::Exit {
                            detail: match status {
                                0 => format!(
                                    "QEMU exit {code} without the guest reporting its workload done"
                                ),
                                _ => format!(
                                    "the guest powered off with status {status} (QEMU exit {code})"
                                ),
                            },
                        }
                    }
                }
            }
        };
        eprintln!("{what}: {failure}: {}", stderr.trim());
        Ok(RunResult {
            measured_ms: f64::NAN,
            checksum: None,
            failed: Some(failure),
            faults: 0,
            prefetches: 0,
            guest,
        })
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
