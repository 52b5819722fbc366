//! `farvm migrate --vm NAME --to HOST:PORT --key-file PATH`: asks a running VM, through its
//! control socket, to move itself to the farvm waiting at HOST:PORT (`farvm run --incoming`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use farvm_units::format_size;
use farvm_vmm::control::request_within;
use farvm_vmm::exit_code;

use super::control::Target;
use super::Failure;

pub const MIGRATE_ABOUT: &str = "\
Live-migrate a running VM on a memory pool to another host, where `farvm run --incoming
HOST:PORT --migration-key-file PATH` waits for it. Only the VM's resident pages cross between
the hosts; its remote pages stay on the pool's memory servers, and the namespace that holds
them passes to the destination in one etcd transaction.

While the guest runs, the resident pages are copied to the destination in rounds, each round
sending the pages whose content changed since they were sent (a fingerprint per page: writes
by the guest and by the VMM's devices alike), until what is left would take at most
--downtime-limit to send at the rate the rounds measured (checked after every 64 pages, so a
VM whose resident pages all fit the limit is paused after its first frames), or the rounds
stop shrinking (less than 10% fewer pages than the round before), or 10 rounds have run.
Then the guest is paused; the pages changed since, the
list of remote pages (page number and content fingerprint), the page key, every vCPU's and
device's state and the VM's description follow; the destination builds the VM, loads it,
takes the namespace over (the etcd transaction succeeds only if the source's record is
unchanged since the pause) and answers, and the guest runs there, its TSC and kvmclock moved
forward by the time it was paused (the two hosts' wall clocks must agree, as with NTP), so
the guest sees the pause as time that passed. The VM then stops here and its `farvm run`
exits 0.

If anything fails before the destination has taken the namespace over (the destination
refuses, dies, or the network between the hosts breaks), the source cancels the handover
with the same kind of transaction and the VM runs on here: exactly one of the two
transactions succeeds, so exactly one host runs the VM. If etcd does not answer, the VM stays
paused here until it does (up to 5 minutes).

The stream between the hosts is encrypted and authenticated (AES-256-GCM) under a key both
hosts hold: --key-file here and --migration-key-file at the destination name files of 32
bytes (or 64 hex digits), mode 0600 or 0400 (e.g. `head -c32 /dev/urandom > key; chmod 600
key`). A stream under another key is refused before anything is written.

A VM without a memory pool (--pool), with a virtio disk or network device, or a Linux guest
(its agent device) is refused before it is paused.

EXAMPLE
  (on host B)  farvm run --incoming 10.0.0.2:7000 --migration-key-file /etc/farvm/migration.key \\
                 --pool http://etcd:2379 --name web1
  (on host A)  farvm migrate --vm web1 --to 10.0.0.2:7000 --key-file /etc/farvm/migration.key

EXIT STATUS
  0   migrated; the VM runs at the destination and has stopped here
  71  the control socket cannot be reached, or the migration was refused or failed (the
      message says why; unless it says otherwise, the VM is still running here)";

#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub target: Target,
    /// Where the destination's `farvm run --incoming` listens.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// The migration key both hosts hold (32 bytes or 64 hex digits, mode 0600/0400).
    #[arg(long, value_name = "PATH")]
    pub key_file: PathBuf,
    /// The source's part of the pause the pre-copy aims for, in milliseconds: the time to
    /// send the pages left, the machine state and the remote-page list. The destination's
    /// load and the etcd transaction come on top (about 15-20 ms for 16 MiB resident on the
    /// development host). A smaller limit sends more rounds (more bytes, when the guest keeps
    /// changing or moving its resident pages); a larger one sends fewer.
    #[arg(long, value_name = "MS", default_value_t = farvm_vmm::migration::DEFAULT_DOWNTIME_LIMIT.as_millis() as u64)]
    pub downtime_limit: u64,
    /// Give up waiting for the migration after this many seconds (the VM finishes or fails
    /// it on its own).
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub wait: u64,
}

pub fn run(a: MigrateArgs) -> Result<()> {
    let host = |m: String| Failure::new(exit_code::HOST_ERROR, m);
    let key = std::path::absolute(&a.key_file)
        .map_err(|e| host(format!("{}: {e}", a.key_file.display())))?;
    let cmd = format!("migrate {} {} {}", a.to, key.display(), a.downtime_limit);
    let v = request_within(&a.target.path(), &cmd, Duration::from_secs(a.wait))
        .map_err(|e| host(e.to_string()))?;
    if a.target.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "migrated to {}: {} resident pages moved ({} sent in {} rounds while running, then \
         {} paused), {} remote pages left in the pool, {} sent, paused {:.0} ms, {:.2} s in \
         all; the VM has stopped here",
        a.to,
        v["resident_pages"].as_u64().unwrap_or(0),
        v["pages_per_round"]
            .as_array()
            .map(|r| r[..r.len().saturating_sub(1)]
                .iter()
                .filter_map(|x| x.as_u64())
                .sum::<u64>())
            .unwrap_or(0),
        v["rounds"].as_u64().unwrap_or(0),
        v["pages_per_round"]
            .as_array()
            .and_then(|r| r.last())
            .and_then(|x| x.as_u64())
            .unwrap_or(0),
        v["remote_pages"].as_u64().unwrap_or(0),
        format_size(v["bytes_sent"].as_u64().unwrap_or(0)),
        v["paused_secs"].as_f64().unwrap_or(0.0) * 1e3,
        v["total_secs"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}
