//! The host setup `farvm-lab bench compare` needs for its kernel-swap baselines, made and undone
//! here: a cgroup-v1 memory cgroup for the VMM process, a zram swap device and a swapfile on a
//! loop device backed by tmpfs. Every piece is a guard whose `Drop` tears it down (swapoff,
//! device reset and removal, unmount, rmdir), so an error or Ctrl-C mid-run leaves the host as
//! it was. Preconditions are checked up front and refused with a message naming what is
//! missing.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the cgroup-v1 memory controller is mounted.
const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";
/// zram's hot-add/remove interface.
const ZRAM_CONTROL: &str = "/sys/class/zram-control";

/// Refuses unless the process can set up kernel swap: root, the cgroup-v1 memory controller,
/// util-linux's swap and loop tools, and no swap already on (the kernel would page the VM
/// there too, and the baseline would measure someone else's device).
pub fn check_preconditions() -> Result<()> {
    if effective_uid()? != 0 {
        bail!(
            "the kernel-swap baselines need root (they create a memory cgroup, a zram device, \
             a loop device and turn swap on): run farvm-lab as root, or pass --swap none"
        );
    }
    if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
        bail!(
            "no cgroup-v1 memory controller at {MEMCG_ROOT} (the kernel-swap baselines limit \
             the VMM with memory.limit_in_bytes); pass --swap none"
        );
    }
    for tool in [
        "mkswap",
        "swapon",
        "swapoff",
        "losetup",
        "mount",
        "umount",
        "fallocate",
    ] {
        if which(tool).is_none() {
            bail!("`{tool}` not found on PATH (Debian: util-linux, mount); pass --swap none");
        }
    }
    let swaps = std::fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?;
    let on: Vec<&str> = swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if !on.is_empty() {
        bail!(
            "swap is already on ({}): the kernel would page the VM there too; swapoff it \
             first, or pass --swap none",
            on.join(", ")
        );
    }
    Ok(())
}

/// The effective user id, from /proc/self/status (`Uid: real effective saved fs`).
fn effective_uid() -> Result<u32> {
    let s = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .context("no Uid line in /proc/self/status")
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/sbin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Runs a host tool, failing with its stderr.
fn run(tool: &str, args: &[&OsStr]) -> Result<String> {
    let exe = which(tool).with_context(|| format!("`{tool}` not found"))?;
    let out = Command::new(&exe)
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!(
            "{tool} {}: {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing `{value}` to {}", path.display()))
}

/// A cgroup-v1 memory cgroup of our own; removed on drop (its processes have ended by then).
pub struct MemCgroup {
    path: PathBuf,
}

impl MemCgroup {
    /// Creates `/sys/fs/cgroup/memory/NAME` with its OOM killer off: at a limit of a few MiB
    /// the memory cgroup's reclaim gives up on a KVM guest's pages (they are mapped by the
    /// vCPU and keep coming back young) and the OOM killer would kill the VMM; with it off the
    /// VMM waits until reclaim frees a page, which is the cost kernel swap then has.
    pub fn create(name: &str) -> Result<Self> {
        let path = Path::new(MEMCG_ROOT).join(name);
        std::fs::create_dir(&path)
            .with_context(|| format!("creating the memory cgroup {}", path.display()))?;
        let cg = Self { path };
        write(&cg.path.join("memory.oom_control"), "1")?;
        Ok(cg)
    }

    /// Sets the memory limit (`None`: unlimited) and resets the peak usage.
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<()> {
        let v = bytes.map_or("-1".to_string(), |b| b.to_string());
        write(&self.path.join("memory.limit_in_bytes"), &v)?;
        write(&self.path.join("memory.max_usage_in_bytes"), "0")
    }

    /// Peak memory charged to the cgroup since the last [`Self::set_limit`].
    pub fn max_usage(&self) -> Result<u64> {
        let p = self.path.join("memory.max_usage_in_bytes");
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        s.trim()
            .parse()
            .with_context(|| format!("{}: not a number: {s}", p.display()))
    }

    /// A command that runs `program args...` inside this cgroup (a shell puts itself in the
    /// cgroup, then execs the program, so everything the program allocates is charged here).
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(self.path.join("cgroup.procs"))
            .arg(program);
        c
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!(
                "farvm-lab: could not remove the memory cgroup {}: {e}",
                self.path.display()
            );
        }
    }
}

/// The two kernel-swap devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwapKind {
    /// Compressed RAM (lz4 where the kernel has it).
    Zram,
    /// A swapfile on a loop device backed by tmpfs.
    Loop,
}

impl SwapKind {
    pub fn label(self) -> &'static str {
        match self {
            SwapKind::Zram => "kernel swap, zram",
            SwapKind::Loop => "kernel swap, loop on tmpfs",
        }
    }
}

/// An active swap device of ours; swapped off and removed on drop.
pub struct SwapDevice {
    dev: PathBuf,
    zram_id: Option<u32>,
    /// (loop device, tmpfs mount point) for [`SwapKind::Loop`].
    loop_on: Option<(PathBuf, PathBuf)>,
    swapped_on: bool,
}

impl SwapDevice {
    /// Sets up a swap device of `kind` holding `bytes` and turns it on.
    pub fn start(kind: SwapKind, bytes: u64, tag: &str) -> Result<Self> {
        let bytes = bytes.max(16 << 20).next_multiple_of(1 << 20);
        let mut d = match kind {
            SwapKind::Zram => Self::zram(bytes)?,
            SwapKind::Loop => Self::loop_on_tmpfs(bytes, tag)?,
        };
        run("mkswap", &[d.dev.as_os_str()])?;
        run("swapon", &[d.dev.as_os_str()])?;
        d.swapped_on = true;
        Ok(d)
    }

    fn zram(bytes: u64) -> Result<Self> {
        let control = Path::new(ZRAM_CONTROL);
        if !control.join("hot_add").exists() {
            bail!(
                "no zram in this kernel ({ZRAM_CONTROL} missing; `modprobe zram`), or pass \
                 --swap loop"
            );
        }
        let id = std::fs::read_to_string(control.join("hot_add"))
            .context("adding a zram device (zram-control/hot_add)")?;
        let id: u32 = id
            .trim()
            .parse()
            .with_context(|| format!("zram hot_add answered `{}`", id.trim()))?;
        let d = Self {
            dev: PathBuf::from(format!("/dev/zram{id}")),
            zram_id: Some(id),
            loop_on: None,
            swapped_on: false,
        };
        let sys = PathBuf::from(format!("/sys/block/zram{id}"));
        let algs = std::fs::read_to_string(sys.join("comp_algorithm")).unwrap_or_default();
        if algs
            .split_whitespace()
            .any(|a| a.trim_matches(['[', ']']) == "lz4")
        {
            write(&sys.join("comp_algorithm"), "lz4")?;
        }
        write(&sys.join("disksize"), &bytes.to_string())?;
        Ok(d)
    }

    fn loop_on_tmpfs(bytes: u64, tag: &str) -> Result<Self> {
        let mnt = std::env::temp_dir().join(format!("farvm-compare-{tag}"));
        std::fs::create_dir_all(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        // noswap: the tmpfs pages holding the swapfile must never be swapped themselves, or a
        // swap-out to the loop device can wait for a swap-in from it (a kernel deadlock: the
        // loop worker blocks on a tmpfs page whose read is queued behind it).
        let size = format!("size={},noswap", bytes + (4 << 20));
        if let Err(e) = run(
            "mount",
            &[
                OsStr::new("-t"),
                OsStr::new("tmpfs"),
                OsStr::new("-o"),
                OsStr::new(&size),
                OsStr::new("tmpfs"),
                mnt.as_os_str(),
            ],
        ) {
            let _ = std::fs::remove_dir(&mnt);
            return Err(e);
        }
        let file = mnt.join("swapfile");
        let attach = || -> Result<PathBuf> {
            // Allocated up front (charged to farvm-lab, not to the VM's cgroup): a sparse file
            // would allocate tmpfs pages as the kernel swaps out, charged to the cgroup that is
            // out of memory, so swapping would free nothing there.
            run(
                "fallocate",
                &[
                    OsStr::new("-l"),
                    OsStr::new(&bytes.to_string()),
                    file.as_os_str(),
                ],
            )?;
            let dev = run(
                "losetup",
                &[OsStr::new("--find"), OsStr::new("--show"), file.as_os_str()],
            )?;
            Ok(PathBuf::from(dev))
        };
        match attach() {
            Ok(dev) => Ok(Self {
                dev: dev.clone(),
                zram_id: None,
                loop_on: Some((dev, mnt)),
                swapped_on: false,
            }),
            Err(e) => {
                let _ = run("umount", &[mnt.as_os_str()]);
                let _ = std::fs::remove_dir(&mnt);
                Err(e)
            }
        }
    }
}

impl Drop for SwapDevice {
    fn drop(&mut self) {
        let report = |r: Result<String>| {
            if let Err(e) = r {
                eprintln!(
                    "farvm-lab: tearing down swap on {}: {e:#}",
                    self.dev.display()
                );
            }
        };
        if self.swapped_on {
            report(run("swapoff", &[self.dev.as_os_str()]));
        }
        if let Some(id) = self.zram_id {
            let sys = PathBuf::from(format!("/sys/block/zram{id}"));
            report(write(&sys.join("reset"), "1").map(|_| String::new()));
            report(
                write(&Path::new(ZRAM_CONTROL).join("hot_remove"), &id.to_string())
                    .map(|_| String::new()),
            );
        }
        if let Some((dev, mnt)) = self.loop_on.take() {
            report(run("losetup", &[OsStr::new("-d"), dev.as_os_str()]));
            report(run("umount", &[mnt.as_os_str()]));
            let _ = std::fs::remove_dir(&mnt);
        }
    }
}

/// Pages swapped in and out host-wide so far (`/proc/vmstat` pswpin, pswpout).
pub fn swap_counters() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("pswpin "), get("pswpout "))
}
