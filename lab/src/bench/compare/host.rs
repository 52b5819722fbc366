//! The host setup `farvm-lab bench compare` needs for its kernel-swap baselines, made and undone
//! here: a cgroup-v1 memory cgroup for the VMM process, a zram swap device, a swapfile on a
//! loop device backed by tmpfs, and an NBD device served by `nbd-server` over loopback TCP from
//! a file on tmpfs (kernel swap over the network, where the kernel has `nbd`). Every piece is a guard whose `Drop` tears it down (swapoff,
//! device reset and removal, unmount, rmdir), so an error or Ctrl-C mid-run leaves the host as
//! it was. Preconditions are checked up front and refused with a message naming what is
//! missing.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where the cgroup-v1 memory controller is mounted.
const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";
/// Where a cgroup-v2 hierarchy is mounted (kernels without cgroup-v1 memory, e.g. the KVM
/// lab's).
const CGROUP2_ROOT: &str = "/sys/fs/cgroup";

/// Which memory-cgroup interface the host has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

fn cgroup_version() -> Option<CgroupVersion> {
    if Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
        return Some(CgroupVersion::V1);
    }
    let controllers =
        std::fs::read_to_string(Path::new(CGROUP2_ROOT).join("cgroup.controllers")).ok()?;
    controllers
        .split_whitespace()
        .any(|c| c == "memory")
        .then_some(CgroupVersion::V2)
}
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
    if cgroup_version().is_none() {
        bail!(
            "no memory cgroup: neither the cgroup-v1 memory controller at {MEMCG_ROOT} nor a \
             cgroup-v2 hierarchy with the memory controller at {CGROUP2_ROOT} (mount one: \
             `mount -t cgroup2 none {CGROUP2_ROOT}`); pass --swap none"
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

/// A memory cgroup of our own; removed on drop (its processes have ended by then).
pub struct MemCgroup {
    path: PathBuf,
    version: CgroupVersion,
}

impl MemCgroup {
    /// Creates the cgroup NAME. Under cgroup v1 (`/sys/fs/cgroup/memory/NAME`) its OOM killer is
    /// turned off: at a limit of a few MiB the memory cgroup's reclaim gives up on a KVM guest's
    /// pages (they are mapped by the vCPU and keep coming back young) and the OOM killer would
    /// kill the VMM; with it off the VMM waits until reclaim frees a page, which is the cost
    /// kernel swap then has. Cgroup v2 (`/sys/fs/cgroup/NAME`) has no such switch: the limit is
    /// `memory.high` (reclaim and throttling above it, never the OOM killer).
    pub fn create(name: &str) -> Result<Self> {
        let version = cgroup_version().context("no memory cgroup controller")?;
        let root = match version {
            CgroupVersion::V1 => MEMCG_ROOT,
            CgroupVersion::V2 => {
                write(
                    &Path::new(CGROUP2_ROOT).join("cgroup.subtree_control"),
                    "+memory",
                )?;
                CGROUP2_ROOT
            }
        };
        let path = Path::new(root).join(name);
        std::fs::create_dir(&path)
            .with_context(|| format!("creating the memory cgroup {}", path.display()))?;
        let cg = Self { path, version };
        if version == CgroupVersion::V1 {
            write(&cg.path.join("memory.oom_control"), "1")?;
        }
        Ok(cg)
    }

    /// How often the cgroup has hit its limit so far: v1 `memory.failcnt` (charges refused),
    /// v2 `memory.events` `high` + `max` + `oom` (since [`Self::set_limit`] made it anew). A
    /// fault the kernel takes inside a system call or on the way back to user space (a
    /// thread's rseq area) in a v1 cgroup at its limit with the OOM killer off fails without
    /// an OOM event; this count is what shows the cgroup was at its limit.
    pub fn limit_hits(&self) -> u64 {
        let read = |f: &str| std::fs::read_to_string(self.path.join(f)).unwrap_or_default();
        match self.version {
            CgroupVersion::V1 => read("memory.failcnt").trim().parse().unwrap_or(0),
            CgroupVersion::V2 => read("memory.events")
                .lines()
                .filter_map(|l| l.split_once(' '))
                .filter(|(k, _)| ["high", "max", "oom"].contains(k))
                .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
                .sum(),
        }
    }

    /// Sets the memory limit (`None`: unlimited) and resets the peak usage (cgroup v2: by
    /// making the cgroup anew, which has no processes between runs).
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<()> {
        match self.version {
            CgroupVersion::V1 => {
                let v = bytes.map_or("-1".to_string(), |b| b.to_string());
                write(&self.path.join("memory.limit_in_bytes"), &v)?;
                write(&self.path.join("memory.max_usage_in_bytes"), "0")
            }
            CgroupVersion::V2 => {
                std::fs::remove_dir(&self.path)
                    .and_then(|_| std::fs::create_dir(&self.path))
                    .with_context(|| format!("re-creating {}", self.path.display()))?;
                let v = bytes.map_or("max".to_string(), |b| b.to_string());
                write(&self.path.join("memory.high"), &v)
            }
        }
    }

    /// Peak memory charged to the cgroup since the last [`Self::set_limit`].
    pub fn max_usage(&self) -> Result<u64> {
        let p = self.path.join(match self.version {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        });
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        s.trim()
            .parse()
            .with_context(|| format!("{}: not a number: {s}", p.display()))
    }

    /// The cgroup's limit and charge files, for a thread that steers the limit while a run goes.
    pub fn limit_file(&self) -> LimitFile {
        let (limit, current) = match self.version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            CgroupVersion::V2 => ("memory.high", "memory.current"),
        };
        LimitFile {
            limit: self.path.join(limit),
            current: self.path.join(current),
            kernel: match self.version {
                CgroupVersion::V1 => self.path.join("memory.kmem.usage_in_bytes"),
                CgroupVersion::V2 => self.path.join("memory.stat"),
            },
        }
    }

    /// The cgroup's `memory.events` (v2) or OOM state (v1, `memory.oom_control`), one line, for
    /// a run that ended badly: whether the kernel's OOM machinery acted on it (`oom_kill`).
    pub fn events(&self) -> String {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        std::fs::read_to_string(self.path.join(file))
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
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

/// A memory cgroup's limit (v1 `memory.limit_in_bytes`, v2 `memory.high`) and charge files.
pub struct LimitFile {
    limit: PathBuf,
    current: PathBuf,
    /// v1 `memory.kmem.usage_in_bytes`, v2 `memory.stat` (its `kernel` line).
    kernel: PathBuf,
}

impl LimitFile {
    /// Sets the limit (the kernel reclaims down to it as the write returns).
    pub fn set(&self, bytes: u64) -> Result<()> {
        write(&self.limit, &bytes.to_string())
    }

    /// Kernel memory charged to the cgroup now (slab, page tables, KVM's structures, kernel
    /// stacks): memory reclaim cannot free it, so a limit below budget + this squeezes the guest.
    pub fn kernel(&self) -> Option<u64> {
        let s = std::fs::read_to_string(&self.kernel).ok()?;
        match s.lines().find_map(|l| l.strip_prefix("kernel ")) {
            Some(v) => v.trim().parse().ok(),
            None => s.trim().parse().ok(),
        }
    }

    /// Memory charged to the cgroup now, if readable.
    pub fn current(&self) -> Option<u64> {
        std::fs::read_to_string(&self.current)
            .ok()?
            .trim()
            .parse()
            .ok()
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

/// The kernel-swap devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwapKind {
    /// Compressed RAM (lz4 where the kernel has it).
    Zram,
    /// A swapfile on a loop device backed by tmpfs.
    Loop,
    /// An NBD device (`nbd-client -swap`) served by `nbd-server` on 127.0.0.1 from a file on
    /// tmpfs: swap over the same loopback TCP farvm's memserver uses.
    Nbd,
}

impl SwapKind {
    pub fn label(self) -> &'static str {
        match self {
            SwapKind::Zram => "kernel swap, zram",
            SwapKind::Loop => "kernel swap, loop on tmpfs",
            SwapKind::Nbd => "kernel swap, NBD over TCP",
        }
    }
}

/// A tmpfs mount of ours (noswap), unmounted and removed on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a `bytes` noswap tmpfs at a fresh directory named after `tag`.
    fn mount(bytes: u64, tag: &str) -> Result<Self> {
        let mnt = std::env::temp_dir().join(format!("farvm-compare-{tag}"));
        std::fs::create_dir_all(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        // noswap: the tmpfs pages holding the swap file must never be swapped themselves, or a
        // swap-out to the device can wait for a swap-in from it (a kernel deadlock: the loop
        // worker blocks on a tmpfs page whose read is queued behind it).
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
        Ok(Tmpfs(mnt))
    }

    /// A file of `bytes` allocated up front (charged to farvm-lab, not to the VM's cgroup): a
    /// sparse file would allocate tmpfs pages as the kernel swaps out, charged to the cgroup
    /// that is out of memory, so swapping would free nothing there.
    fn file(&self, bytes: u64) -> Result<PathBuf> {
        let file = self.0.join("swapfile");
        run(
            "fallocate",
            &[
                OsStr::new("-l"),
                OsStr::new(&bytes.to_string()),
                file.as_os_str(),
            ],
        )?;
        Ok(file)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Err(e) = run("umount", &[self.0.as_os_str()]) {
            eprintln!("farvm-lab: unmounting {}: {e:#}", self.0.display());
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The first NBD device not connected to a server.
fn free_nbd_device() -> Result<PathBuf> {
    (0..16)
        .map(|i| PathBuf::from(format!("/dev/nbd{i}")))
        .find(|d| {
            let name = d
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            d.exists() && !Path::new(&format!("/sys/block/{name}/pid")).exists()
        })
        .context(
            "no free NBD device (/dev/nbd*): the kernel needs the nbd module (`modprobe nbd`; in \
             the KVM lab: scripts/kvm-lab run --modules nbd ...), or pass --swap zram",
        )
}

/// Refuses unless NBD swap can be set up: a free NBD device and Debian's nbd-server and
/// nbd-client.
pub fn check_nbd() -> Result<()> {
    free_nbd_device()?;
    for tool in ["nbd-server", "nbd-client"] {
        if which(tool).is_none() {
            bail!(
                "`{tool}` not found (Debian: nbd-server, nbd-client; scripts/compare-lab.sh \
                 installs them), or pass --swap zram"
            );
        }
    }
    Ok(())
}

/// `nbd-server` in the foreground on 127.0.0.1, exporting one file, and the NBD device
/// `nbd-client` connected to it; disconnected and stopped on drop.
struct NbdLink {
    server: std::process::Child,
    dev: Option<PathBuf>,
}

/// The TCP port of the NBD export (loopback only).
const NBD_PORT: u16 = 10_909;

impl NbdLink {
    fn start(file: &Path, dir: &Path) -> Result<Self> {
        check_nbd()?;
        let dev = free_nbd_device()?;
        let cfg = dir.join("nbd-server.conf");
        write(
            &cfg,
            &format!(
                "[generic]\n    listenaddr = 127.0.0.1\n    port = {NBD_PORT}\n[swap]\n    \
                 exportname = {}\n",
                file.display()
            ),
        )?;
        let server = Command::new(which("nbd-server").unwrap_or_default())
            .arg("-d")
            .arg("-C")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting nbd-server")?;
        let mut link = NbdLink { server, dev: None };
        // The server listens within moments; nbd-client retries are bounded.
        let port = NBD_PORT.to_string();
        let mut last = None;
        for _ in 0..50 {
            match run(
                "nbd-client",
                &[
                    OsStr::new("-N"),
                    OsStr::new("swap"),
                    OsStr::new("-swap"),
                    OsStr::new("-b"),
                    OsStr::new("4096"),
                    OsStr::new("127.0.0.1"),
                    OsStr::new(&port),
                    dev.as_os_str(),
                ],
            ) {
                Ok(_) => {
                    link.dev = Some(dev);
                    return Ok(link);
                }
                Err(e) => last = Some(e),
            }
            if let Ok(Some(st)) = link.server.try_wait() {
                bail!("nbd-server exited ({st}) before a client connected");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("nbd-client did not connect")))
    }
}

impl Drop for NbdLink {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            if let Err(e) = run("nbd-client", &[OsStr::new("-d"), dev.as_os_str()]) {
                eprintln!("farvm-lab: disconnecting {}: {e:#}", dev.display());
            }
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// An active swap device of ours; swapped off and removed on drop (fields drop in order:
/// swap off first, then the device, then its backing).
pub struct SwapDevice {
    dev: PathBuf,
    zram_id: Option<u32>,
    /// The loop device for [`SwapKind::Loop`].
    loop_dev: Option<PathBuf>,
    nbd: Option<NbdLink>,
    tmpfs: Option<Tmpfs>,
    swapped_on: bool,
}

impl SwapDevice {
    /// Sets up a swap device of `kind` holding `bytes` and turns it on.
    pub fn start(kind: SwapKind, bytes: u64, tag: &str) -> Result<Self> {
        let bytes = bytes.max(16 << 20).next_multiple_of(1 << 20);
        let mut d = match kind {
            SwapKind::Zram => Self::zram(bytes)?,
            SwapKind::Loop => Self::loop_on_tmpfs(bytes, tag)?,
            SwapKind::Nbd => Self::nbd(bytes, tag)?,
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
            loop_dev: None,
            nbd: None,
            tmpfs: None,
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
        let tmpfs = Tmpfs::mount(bytes, tag)?;
        let file = tmpfs.file(bytes)?;
        let dev = PathBuf::from(run(
            "losetup",
            &[OsStr::new("--find"), OsStr::new("--show"), file.as_os_str()],
        )?);
        Ok(Self {
            dev: dev.clone(),
            zram_id: None,
            loop_dev: Some(dev),
            nbd: None,
            tmpfs: Some(tmpfs),
            swapped_on: false,
        })
    }

    fn nbd(bytes: u64, tag: &str) -> Result<Self> {
        let tmpfs = Tmpfs::mount(bytes, tag)?;
        let file = tmpfs.file(bytes)?;
        let link = NbdLink::start(&file, &tmpfs.0)?;
        Ok(Self {
            dev: link.dev.clone().unwrap_or_default(),
            zram_id: None,
            loop_dev: None,
            nbd: Some(link),
            tmpfs: Some(tmpfs),
            swapped_on: false,
        })
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
        if let Some(dev) = self.loop_dev.take() {
            report(run("losetup", &[OsStr::new("-d"), dev.as_os_str()]));
        }
        // Then the NBD link and the tmpfs (in that order) as the fields drop.
        drop(self.nbd.take());
        drop(self.tmpfs.take());
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
