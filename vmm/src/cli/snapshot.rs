//! `farvm snapshot --vm NAME DIR`: asks a running VM, through its control socket, to save
//! itself into the snapshot directory DIR and stop.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use farvm_units::format_size;
use farvm_vmm::control::request_within;
use farvm_vmm::exit_code;

use super::control::Target;
use super::Failure;

pub const SNAPSHOT_ABOUT: &str = "\
Save a running VM into a snapshot directory and stop it (what `virsh save` does through the
API's vm.snapshot). `farvm run --restore DIR` builds the VM again from the snapshot and
resumes it where it was.

The VM is paused; every vCPU's state (registers, FPU/XSAVE, MSRs, local APIC, pending
events), KVM's interrupt controllers and clock, the serial console's and the PV control
device's state and the VM's description go into DIR/manifest.json (a versioned format), and
guest RAM into DIR/memory.pages (pages of zeros are holes in a sparse file). Without a
memory pool every page is written, the remote ones read back from the memory servers, as
every VMM writes all of RAM, and the save says so. A VM on a memory pool (--pool) writes its
resident pages only: its remote pages stay on the pool's servers, DIR/remote.pages lists
them (page number and content fingerprint) and DIR/page.key (mode 0600) holds the key that
sealed them, so the directory holds a secret; in one etcd transaction the VM's namespace
passes from its leased record to a snapshot record of the pool (`farvm pool status` lists
it; `farvm pool snapshot-delete ID` frees its pages), and the VM's exit leaves it there. Such
a snapshot is restored once: the restored VM takes the namespace back and overwrites its
pages. The manifest is written last: a directory with a manifest holds a whole snapshot.
Once saved, the VM stops and its `farvm run` exits 0. A save that fails (a full disk, a
device that cannot be saved yet, etcd not answering) removes what it wrote, leaves the
namespace with the VM and the VM running, with the reason.

With --key-file FILE the snapshot is sealed under that snapshot key (32 raw bytes or 64
hex digits, mode 0600 or 0400; `head -c32 /dev/urandom > FILE` makes one): every page of
DIR/memory.pages is encrypted and authenticated (AES-256-GCM under a key derived for this
snapshot, bound to the page's place and the snapshot), the tags go into DIR/memory.tags, a
pool VM's page key is stored wrapped in DIR/page.key.sealed instead of DIR/page.key and its
DIR/remote.pages is sealed too, and the manifest (format version 3) holds the machine state
(registers, devices) sealed and records how, under which key id, and a tag over itself and
every page tag; it never holds the key. `farvm run
--restore DIR --snapshot-key-file FILE` opens it; without the key it is refused. Without
--key-file the files are written in the clear (mode 0600) and the VMM warns so: whoever can
read DIR can read the guest's memory, and for a pool VM the pool's copy of it.
docs/sealing.md says what a sealed snapshot still reveals (which pages are zero, and the
VM's description, which stays readable in the manifest).

The test guest can be saved; a VM with a virtio disk or network device, or a Linux guest (its
agent device), is refused before it is paused. DIR is created if missing; a directory that
already holds a snapshot is refused.

EXAMPLE
  farvm snapshot --vm test1 /var/lib/farvm/snap/test1
  farvm run --restore /var/lib/farvm/snap/test1 --serial none
  farvm snapshot --vm test1 --key-file /etc/farvm/keys/snapshot /var/lib/farvm/snap/t1s
  farvm run --restore /var/lib/farvm/snap/t1s --snapshot-key-file /etc/farvm/keys/snapshot

EXIT STATUS
  0   saved; the VM has stopped
  64  the --key-file cannot be read, is readable by others, or is not a key
  71  the control socket cannot be reached, or the VM refused or failed the save (the
      message says why; the VM is still running)";

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub target: Target,
    /// The snapshot directory (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Give up waiting for the save after this many seconds (the VM finishes or fails it on
    /// its own).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub wait: u64,
    /// Seal the snapshot under the snapshot key in FILE: 32 raw bytes or 64 hex digits,
    /// readable by its owner only (mode 0600 or 0400). The VMM reads the file itself (it must
    /// be able to). Without it the snapshot is written in the clear.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

pub fn run(a: SnapshotArgs) -> Result<()> {
    let host = |m: String| Failure::new(exit_code::HOST_ERROR, m);
    let dir = std::path::absolute(&a.dir).map_err(|e| host(format!("{}: {e}", a.dir.display())))?;
    let cmd = match &a.key_file {
        Some(key) => {
            // Checked here first, so a bad key file is the flag's error, not the VMM's.
            farvm_seal::PageKey::from_file(key)
                .map_err(|e| Failure::new(exit_code::USAGE, format!("--key-file: {e}")))?;
            let key = std::path::absolute(key)
                .map_err(|e| Failure::new(exit_code::USAGE, format!("--key-file: {e}")))?;
            format!("snapshot {} --key-file {}", dir.display(), key.display())
        }
        None => format!("snapshot {}", dir.display()),
    };
    let v = request_within(&a.target.path(), &cmd, Duration::from_secs(a.wait))
        .map_err(|e| host(e.to_string()))?;
    if a.target.json {
        println!("{v}");
        return Ok(());
    }
    let kept = match v["pool_snapshot"].as_str() {
        Some(id) => format!(
            "{} pages left in the memory pool (its snapshot {id} owns them: `farvm pool \
             snapshot-delete {id}` frees them)",
            v["remote_pages"].as_u64().unwrap_or(0)
        ),
        None => "every page written (no memory pool)".to_owned(),
    };
    let sealed = match v["sealed_under"].as_str() {
        Some(id) => format!(", sealed under snapshot key {id}"),
        None => " (in the clear)".to_owned(),
    };
    println!(
        "saved to {}{sealed}: {} of guest RAM, {} pages written, {kept}, paused {:.2} s; the VM \
         has stopped",
        dir.display(),
        format_size(v["memory_bytes"].as_u64().unwrap_or(0)),
        v["pages_written"].as_u64().unwrap_or(0),
        v["paused_secs"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}
