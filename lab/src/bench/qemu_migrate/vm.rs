//! One QEMU process of the bench: the test guest booted by [`Qemu::command`], its console in a
//! file, its QMP socket beside it; killed if dropped while still running.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use farvm_vmm::boot::pvh::{self, ConsoleOutcome};
use farvm_vmm::workload_spec::PlacedWorkload;

use super::qmp::Qmp;
use crate::bench::compare::qemu::Qemu;

/// Doorbells (writes to the test guest's mailbox port, `farvm_guest_agent::pv::PORT_MAILBOX`)
/// a workload rings up to its measured phase: SETUP, WARMUP, MEASURE (`pv::phase`; every
/// workload rings them in that order, the kernel only when it kills a process).
const DOORBELLS_TO_MEASURE: u64 = 3;

/// Bytes of stderr past which a QEMU is taken to be looping on a failed vCPU.
const STDERR_FLOOD: u64 = 1 << 20;

/// How long QEMU may take to open its QMP socket.
const QMP_PATIENCE: Duration = Duration::from_secs(60);

/// A running QEMU and its QMP connection.
pub struct QemuVm {
    child: Child,
    console: PathBuf,
    stderr: PathBuf,
    doorbells: PathBuf,
    socket: PathBuf,
    /// Its QMP connection.
    pub qmp: Qmp,
    what: String,
}

impl QemuVm {
    /// Starts QEMU for `w` on `mem` bytes of guest frames with `extra` arguments (`-incoming`,
    /// `-S`), its console written to `dir/NAME.console` and QMP at `sockets/NAME.qmp` (a local
    /// file system: the lab's shared output directory takes no Unix sockets).
    pub fn start(
        qemu: &Qemu,
        w: &PlacedWorkload,
        mem: u64,
        extra: &[&str],
        (dir, sockets): (&Path, &Path),
        name: &str,
    ) -> Result<Self> {
        let console = dir.join(format!("{name}.console"));
        let socket = sockets.join(format!("{name}.qmp"));
        let _ = std::fs::remove_file(&socket);
        let out = File::create(&console).with_context(|| format!("{}", console.display()))?;
        let stderr = dir.join(format!("{name}.stderr"));
        let err = File::create(&stderr)?;
        let mut cmd = qemu.command(w, mem, None)?;
        // An isa-debugcon on the mailbox port writes one byte to `doorbells` per doorbell (the
        // low byte of the 32-bit write): `wait_measuring` counts them.
        let doorbells = sockets.join(format!("{name}.doorbells"));
        let _ = std::fs::remove_file(&doorbells);
        cmd.arg("-chardev")
            .arg(format!("file,id=doorbells,path={}", doorbells.display()))
            .arg("-device")
            .arg(format!(
                "isa-debugcon,iobase={:#x},chardev=doorbells",
                farvm_guest_agent::pv::PORT_MAILBOX
            ))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let what = format!("QEMU {name}");
        let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        // QEMU creates the socket early in its start; one that exits first (bad arguments, no
        // /dev/kvm) says why on its stderr.
        let deadline = Instant::now() + QMP_PATIENCE;
        let qmp = loop {
            match Qmp::connect(&socket, &what, Duration::from_secs(1)) {
                Ok(q) => break q,
                Err(e) => {
                    if let Some(st) = child.try_wait()? {
                        let err = std::fs::read_to_string(&stderr).unwrap_or_default();
                        bail!("{what} exited {st}: {}", err.trim());
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(e);
                    }
                }
            }
        };
        Ok(QemuVm {
            child,
            console,
            stderr,
            doorbells,
            socket,
            qmp,
            what,
        })
    }

    /// Waits until the guest's workload has entered its measured phase (its working set
    /// filled and warmed up), as `farvm stats` shows farvm's: its third doorbell.
    pub fn wait_measuring(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let rung = std::fs::metadata(&self.doorbells).map_or(0, |m| m.len());
            if rung >= DOORBELLS_TO_MEASURE {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "{} exited {st} before its workload's measured phase",
                    self.what
                );
            }
            self.check_stderr()?;
            if Instant::now() >= deadline {
                bail!(
                    "{}: the workload had not reached its measured phase after {timeout:?}",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Fails if QEMU has already exited (its guest's workload ended before the step that needs
    /// it running).
    pub fn ensure_running(&mut self, step: &str) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(st) => bail!(
                "{} exited {st} before {step}: the workload had ended (more passes or a shorter \
                 --settle)",
                self.what
            ),
        }
    }

    /// Waits for QEMU to exit (killing it after `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            self.check_stderr()?;
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("{} still running after {timeout:?}: killed", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends a QEMU whose vCPU failed: on a KVM internal error (an emulation failure) QEMU
    /// prints the registers and retries for ever, filling its stderr.
    fn check_stderr(&mut self) -> Result<()> {
        let len = std::fs::metadata(&self.stderr).map_or(0, |m| m.len());
        if len < STDERR_FLOOD {
            return Ok(());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read(&self.stderr).unwrap_or_default();
        let head = String::from_utf8_lossy(&text[..text.len().min(1500)]).into_owned();
        let _ = std::fs::write(&self.stderr, &head);
        bail!("{} killed, its vCPU failing: {}", self.what, head.trim());
    }

    /// Asks QEMU to quit (a source whose guest has moved on) and reaps it.
    pub fn quit(mut self) -> Result<()> {
        let _ = self.qmp.execute("quit", serde_json::json!({}));
        self.wait_exit(Duration::from_secs(30)).map(|_| ())
    }

    /// The console so far.
    pub fn console_text(&self) -> String {
        std::fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The workload's checksum from the console of a QEMU that exited with `status`: the
    /// guest's process must have ended `done` and the guest powered off with status 0.
    pub fn checksum(&self, status: ExitStatus) -> Result<u64> {
        let console = self.console_text();
        let done = pvh::parse_console(&console)
            .first()
            .and_then(|p| match p.outcome {
                ConsoleOutcome::Done { checksum, .. } => Some(checksum),
                ConsoleOutcome::Other(_) => None,
            });
        match (status.code().and_then(pvh::exit_status), done) {
            (Some(0), Some(c)) => Ok(c),
            _ => bail!(
                "{} exited {status} without the guest reporting its workload done; console: {}",
                self.what,
                console.trim()
            ),
        }
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.doorbells);
        let _ = std::fs::remove_file(&self.socket);
    }
}
