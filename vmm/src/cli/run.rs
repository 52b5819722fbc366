//! `farvm run`: boot a VM, stream its console, print each workload's result, exit with the
//! guest's status.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use farvm_devices::serial::{SerialIn, SerialOut};
use farvm_guest_agent::pv::state;
use farvm_httpd::{HttpError, HttpServer, Listen};
use farvm_units::{format_size, parse_size};
use farvm_vmm::builder::{self, VmConfig};
use farvm_vmm::control::{default_socket_path, ControlServer};
use farvm_vmm::devices::board::{DiskConfig, NetConfig};
use farvm_vmm::devices::console::{self, RawMode};
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::spec::{
    AsyncPf, CliNames, Endpoint, FieldNames, PoolOptions, RemoteOptions, SpecError, SpecErrorKind,
    TestGuestOptions, Transport, VmSpec,
};
use farvm_vmm::vm::{Vm, VmOutcome, VmReport};
use farvm_vmm::workload_spec::workload_name;
use farvm_vmm::{exit_code, signals};

use super::Failure;

pub const LONG_ABOUT: &str = "\
Boot a virtual machine and run workloads in it.

Without --kernel, farvm boots its built-in test guest: a tiny ring-0 kernel whose ring-3
processes run the workloads given with --workload (one process each) and report their time and
checksum to the VMM. With --kernel PATH, the file is sniffed: an ELF is booted as a test-guest
kernel (direct 64-bit entry), a bzImage (or an ELF given with --initrd/--cmdline/--linux) as
Linux through the x86 64-bit boot protocol. The test guest itself (an ELF carrying farvm's
test-guest note, as written by `farvm image export`) stays the test guest with --cmdline: each
`farvm.workload=SPEC` word of the command line adds a workload, after those of --workload.

The console (16550 at 0x3F8, IRQ 4) streams to stdout (or --serial FILE|none). When the test
guest shuts down, farvm prints one line per process: pid, workload, cpu, state, measured time,
ops and checksum (or JSON with --json) and exits with the guest's status.

LINUX GUESTS
A stock distribution kernel boots to userspace: farvm gives it ACPI tables (MADT with one
local APIC per vCPU, a hardware-reduced FADT, a DSDT describing COM1 and the disks), an e820
map, kvmclock, the in-kernel PIC/IOAPIC/LAPICs and PIT; the kernel starts the other vCPUs
itself with INIT/SIPI. Each --disk PATH[,ro] is a virtio-blk disk on virtio-mmio, announced
in the DSDT (device LNRO0005; /dev/vda, /dev/vdb, ... in order): a kernel that builds
virtio_mmio, virtio_blk and its file system as modules needs them loaded from the initrd.
Each --net tap=NAME[,mac=MAC] is a virtio-net device on the host's tap NAME, in the slots after
the disks (eth0, eth1, ... in order; virtio_net must be built in or loaded from the initrd).
farvm opens the tap (creating it if it does not exist: that needs CAP_NET_ADMIN) but does not
configure the host side: give the tap an address, or plug it into a bridge, with ip(8). No
offloads yet (MTU 1500, checksums computed by the sender). The guest's link follows the tap
(down while the tap is down on the host); a tap deleted while the VM runs is a pulled cable
for good: the guest sees its link go down, the VM goes on.
Console input comes from --serial-in (stdin by default for Linux). On a terminal, stdin is put
in raw mode while the VM runs, so every key (Ctrl-C too) goes to the guest; Ctrl-A x stops
the VM (exit status 130), Ctrl-A Ctrl-A sends Ctrl-A. `poweroff` in the guest (ACPI S5) ends
the run with status 0; a reboot (the ACPI reset register) stops the VM with status 75 — farvm
does not restart guests. Linux does not run at a usable speed on a host whose KVM emulates
guest ring 0 (PVM); --stop-at-entry checks the boot setup there.

REMOTE MEMORY
By default guest RAM is remote memory: only --local-memory of it (50% unless told) may be
resident on this host; the rest lives on memory servers (--memserver ADDR, repeatable;
--replicas R copies per page). With no --memserver, farvm starts a farvm-memserver process
on loopback (the binary next to farvm, or $FARVM_MEMSERVER_BIN), which ends with the VM. Guest faults on non-resident pages are served by the paging engine (userfaultfd),
never-written pages are zero-filled locally, and --prefetcher (leap+stream unless told;
none, next-n, stride, read-ahead, leap, stream, leap+stream) fetches and installs pages before
the guest asks. A paging summary is printed at exit; `farvm stats --vm NAME` shows it live
and --metrics ADDR serves it to Prometheus. --local-only keeps all RAM local (no engine).
The prefetcher learns per guest process from the CR3 the guest agent publishes; a guest
without an agent (a stock Linux guest) has one global history of guest-physical pages.

A memory server that stops answering (2 s request timeout; 60 s for the local one) is
taken out of service; with --replicas 2 or more the VM goes on from the other copies and
re-replicates. When it held the only copy of some pages, the guest waits on those pages
(reads and write-backs are retried, the log says why once a second) and resumes when the
server answers again. A server that restarted has lost its pages: they are never read back
as zeros. When the guest needs one of them the VM is stopped with exit status 74, naming the
page; pages the guest never needs again cost nothing.

With --pool URLS (etcd) the VM joins a memory pool instead: memory servers registered there
(`farvm-memserver --pool URLS --rack R`, in racks declared with `farvm pool racks add`) hold
its pages, placed by the pool on --replicas distinct racks (2 unless told); a VM that cannot
be placed is refused naming the racks and bytes missing. The VM's pages are dropped on every
server when it exits, or when its lease runs out after farvm was killed. See `farvm pool
--help`.

Without --workload, the test guest runs a default set chosen to page: seq:ws=192M and
random:ws=64M in 512M of RAM at 50% local.

A control socket answers `farvm status|stats|shutdown --vm NAME` while the VM runs. Ctrl-C
(SIGINT) or SIGTERM shuts the VM down cleanly.

LIBVIRT DOMAIN XML
--domain FILE.xml runs a libvirt domain without libvirt. farvm reads the part of the domain
format it understands (name, memory, vcpu, os kernel/initrd/cmdline, serial and console, raw
<disk>s, <interface type='ethernet'> taps, its own <metadata> element) and merges the host
config (/etc/farvm/farvm.toml, or the file $FARVM_CONFIG names: the domain's [domain.\"NAME\"]
section, then [defaults]). Its disks' targets run from vda, in order; its interfaces are the
guest's eth0, eth1, ... in document order (other interface types, a bridge or a libvirt
network, are refused: create the tap on the host and name it in <target dev='NAME'/>).
Elements farvm ignores are printed as warnings; a domain it cannot run is an error naming the
element and line (exit status 64), and so is a problem found once the domain is read (`<vcpu>
(line 4): 32 vCPUs is more than the test guest supports (16)`). The domain decides the options
listed under \"The VM (decided by the domain with --domain)\": --name, --memory, --vcpus,
--kernel, --initrd, --cmdline, --disk, --net, --serial (a pty console goes to stdout) and the
remote-memory options (--memserver or --pool, --local-memory, --prefetcher, --replicas,
--memserver-token-file, --page-space, --probe-every, --metrics, --local-only); giving one of
them as well is an error. The other options
(--timeout, --json, --workload, --pool-slab, ...) apply as usual.

SNAPSHOTS
`farvm snapshot --vm NAME DIR` saves a running VM into the directory DIR and stops it;
--restore DIR builds the VM again from DIR/manifest.json (its description: memory, vCPUs,
remote-memory options, workloads) and resumes the guest where it was saved: its vCPUs,
interrupt controllers, clock, serial console, PV device and all of guest RAM are loaded before
it runs. Without a pool a snapshot holds every page of guest RAM (the remote ones read back
from the memory servers, as every VMM writes all of RAM), and the restored VM pages them out
again under the same --local-memory to its memory servers (a new embedded one by default).
A pool VM's snapshot holds its resident pages only: the restore takes the snapshot's
namespace back from the pool in one etcd transaction (refused, exit 66, once the pool holds
no such snapshot: restored already or deleted, since the restored VM overwrites its pages),
loads the resident pages and faults the others from the pool's servers as the guest touches
them. With --restore, the
options that describe the VM (--memory, --vcpus, --workload, --kernel, the remote-memory
options, ...) are the snapshot's and may not be given; --name, --serial, --serial-in,
--guest-log, --metrics and the run's own options (--timeout, --json, --control-socket, ...)
apply. A missing snapshot exits 66, a corrupt one or one of another format version 65.

A snapshot sealed under a snapshot key (`farvm snapshot --key-file`) needs the same key:
--snapshot-key-file FILE. Its page file's pages, its pool page key and its remote-page list
are opened with it, and its manifest, page tags and holes are checked against the seal's
summary before anything is built: a sealed snapshot restored without the key or with another
one exits 64 and names the flag, and one whose files were altered (a flipped bit, pages
swapped or moved, a page removed) exits 65; either way a pool snapshot stays in the pool,
restorable with the right key. docs/sealing.md says what a sealed snapshot still reveals.

RESTORE MODES
--restore-pages chooses how a pool VM's snapshot brings back its resident pages (its remote
pages are always read from the pool on the guest's first touch). eager (the default) loads
every one from the page file before the guest's first instruction. The other modes start the
guest with none loaded: the paging engine reads each from the snapshot's page file on the
guest's first touch, checked against the fingerprint the save recorded (resident.pages), and
the page leaves the file for the pool once it is written back; the snapshot directory must
stay in place while the restored VM runs (a save or migration of that VM copies the pages it
still serves). lazy runs the VM with its prefetcher off, lazy-prefetch with it on.
working-set fetches the pages listed in working-set.pages (the resident pages in the order the
saved run first touched them) in that order, 256 pages per batch, before the first
instruction; working-set-async starts the guest at once and fetches them on a thread of its
own (restore-ws) behind it; both run the VM's prefetcher. A snapshot without resident.pages
(an older farvm's), a sealed snapshot (no clear list of its pages' fingerprints) or a
full-copy snapshot (no pool) restores eagerly only: another mode is refused before the VM is
built (exit 64).
docs/snapshot.md compares the modes.

LIVE MIGRATION
--incoming HOST:PORT --migration-key-file PATH waits on HOST:PORT for one VM that `farvm
migrate --vm NAME --to HOST:PORT --key-file PATH` sends from another host, over a stream
sealed with the key both hold. The VM must be on a memory pool: its resident pages arrive
(copied while the guest runs, then the last changes while it is paused), its remote pages
stay on the pool's servers, and once the VM is built and loaded here its namespace is taken
over in one etcd transaction, which succeeds only if the source has not resumed the VM; then
the guest runs here and the source stops. The VM's description is the source's; --name,
--serial, --serial-in, --guest-log, --metrics and the run's own options apply, as with
--restore. A stream that fails, or a takeover the source won, ends this run with the reason
(the VM runs on at the source).

WORKLOAD SPEC
  --workload NAME[:key=value,...]   keys: ws (working set, e.g. 64M, 1G), seed, cpu, and the
  workload's own parameters. Names: seq, stride, random, matmul, matmul-blocked, kv, pagerank,
  quicksort, replay, isolation, crash, intops. Processes without cpu= go round-robin over the
  vCPUs.
  --workload replay:trace=FILE[,records=N,seed=S,passes=P,cpu=C]   replays a page-access trace
  (farvm's binary format or `pid page` text lines, zstd-compressed or not; e.g. traces/*.trace.zst):
  one process per trace pid, each touching its own pages in trace order over a heap the size of
  its footprint, reads and writes as recorded. The trace is loaded as a boot blob next to the
  kernel. records=N replays only the first N records; passes=P replays them P times. One replay
  trace per VM.

EXAMPLES
  farvm run                                   # test guest, 50% local, local memserver
  farvm run --local-memory 25% --prefetcher none --workload stride:ws=128M
  farvm run --memserver 10.0.0.5:7070 --memserver 10.0.0.6:7070 --replicas 2 \\
            --memserver-token-file tokens --metrics 127.0.0.1:9300
  farvm run --pool http://10.77.0.2:2379 --memory 64G --local-memory 2G --replicas 2
  farvm run --local-only --memory 1G --vcpus 2 --workload seq:ws=256M --workload kv:ws=256M
  farvm run --vcpus 2 --workload isolation --workload isolation --workload isolation:cpu=1
  farvm run --local-memory 25% --workload replay:trace=traces/sqlite.trace.zst,records=200000
  farvm run --kernel ./guest.elf --memory 512M --serial console.log --json
  farvm image export /var/lib/farvm && farvm run --kernel /var/lib/farvm/farvm-testguest.elf \\
            --cmdline 'farvm.workload=seq:ws=32M farvm.workload=kv:ws=32M'
  farvm run --kernel vmlinuz --initrd initrd.img --vcpus 2 --memory 1G --local-only \\
            --disk rootfs.img --cmdline 'console=ttyS0 root=/dev/vda rw'
  farvm run --kernel vmlinuz --initrd initrd.img --disk data.img,ro --local-memory 25% \\
            --serial-in none --cmdline 'console=ttyS0'
  farvm run --kernel bzImage --initrd initrd.img --cmdline 'console=ttyS0' --stop-at-entry
  FARVM_CONFIG=./farvm.toml farvm run --domain web-1.xml --timeout 600

EXIT STATUS
  0        the guest shut down with status 0 (every process ended as expected), or the VM was
           shut down through its control socket, or saved by `farvm snapshot`
  1-63     the guest's own non-zero shutdown status (test guest: 1 = a process failed,
           2 = bad boot info, 3 = out of memory, 4 = bad user image)
  64       bad command-line arguments; a sealed --restore snapshot without its
           --snapshot-key-file, or with another key
  65       the kernel or initrd is malformed or does not fit in guest memory; the
           --restore snapshot is corrupt or of another format version (or, sealed, was
           altered)
  66       the kernel, initrd, a disk image or the --restore snapshot cannot be read (or a
           disk is in use)
  69       the memory pool cannot take the VM: no room for its replicas on distinct racks
           (the message names the racks and bytes), or etcd, or any memory server, did not
           answer within --pool-wait
  70       the guest crashed: KVM internal error, triple fault, failed entry, access to an
           unmapped address, guest kernel panic
  71       host failure: /dev/kvm unusable, a KVM ioctl failed, cannot map guest memory
  74       guest memory was lost: the guest needed a page whose data exists nowhere it can be
           trusted (every memory server holding it lost it or returned a wrong copy, or its
           local frame vanished); the log names the page and the cause. Also when the memory
           pool reclaimed the VM's remote memory after its lease expired (the VMM was paused
           or cut off from etcd for too long): \"guest memory reclaimed\"
  75       the guest rebooted (farvm stopped it instead of restarting it)
  124      --timeout expired
  130/143  stopped by SIGINT/SIGTERM or the console's Ctrl-A x (the VM was shut down cleanly)
  159      a thread made a system call its seccomp filter forbids (--seccomp on); stderr names
           the thread, its class and the call";

#[derive(Args, Debug, Clone)]
// A pool's knobs need a pool: one given with --pool, or one the domain may name.
#[command(group(clap::ArgGroup::new("pool_source").args(["pool", "domain", "incoming"])))]
pub struct RunArgs {
    /// Run the libvirt domain in this file (see LIBVIRT DOMAIN XML); it decides the VM's
    /// name, memory, vCPUs, kernel, console and remote-memory options.
    #[arg(long, value_name = "FILE.xml", conflicts_with = "vm_description")]
    pub domain: Option<PathBuf>,

    #[command(flatten)]
    pub vm: VmArgs,

    /// A process running a workload: NAME[:key=value,...] (repeatable; see WORKLOAD SPEC).
    #[arg(long = "workload", short = 'w', value_name = "SPEC")]
    pub workloads: Vec<String>,

    /// LAPIC timer frequency for preemption (0 = cooperative only).
    #[arg(long, value_name = "HZ", default_value_t = 100)]
    pub timer_hz: u32,

    /// Seed of the guest's physical-frame free-list shuffle (0 = ascending order).
    #[arg(long, value_name = "SEED", default_value_t = 1)]
    pub frame_shuffle_seed: u64,

    /// Free-list fragmentation: hand out frames in runs of 2^SHIFT (0 = every frame shuffled)
    /// [default: 9 (2 MiB runs) with remote memory, else 0]. The prefetcher learns from
    /// guest-physical pages, so contiguous runs are what let it see a sequential stream.
    #[arg(long, value_name = "SHIFT")]
    pub frame_run_shift: Option<u32>,

    /// Premap each process's whole heap at start instead of demand paging it.
    #[arg(long)]
    pub premap: bool,

    /// Demand-page the heap one 4 KiB page per fault (default: 2 MiB around each fault).
    #[arg(long, conflicts_with = "premap")]
    pub demand_4k: bool,

    /// Console input: stdin, none, or a file, FIFO or pty to read until its end [default:
    /// stdin for a Linux guest, none for the test guest]. Stdin on a terminal is put in raw
    /// mode while the VM runs; Ctrl-A x stops the VM.
    #[arg(long, value_name = "stdin|FILE|none")]
    pub serial_in: Option<SerialIn>,

    /// Host backing of guest RAM without remote memory (`--local-only`): anon (private
    /// anonymous memory, the only kind). With remote memory the paging engine backs guest RAM;
    /// `--guest-memory` chooses how.
    #[arg(long, value_name = "anon", default_value = "anon", value_parser = ["anon", "anonymous"])]
    pub memory_backing: String,

    /// Control socket path [default: $XDG_RUNTIME_DIR/farvm/NAME.sock or /run/farvm/NAME.sock].
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,

    /// Do not open a control socket.
    #[arg(long, conflicts_with = "control_socket")]
    pub no_control_socket: bool,

    /// How pages move to and from `rdma://` servers: one-sided (RDMA READ and WRITE on slabs
    /// the server registers; its CPU never handles a page) or send-recv (each request a SEND
    /// the server's thread answers with a SEND). send-recv is for A/B comparisons and for an
    /// RDMA provider whose one-sided path misbehaves (docs/rdma.md); a slab the server refuses
    /// to grant travels as SEND/RECV either way.
    // `action = Set`: for a `bool` field clap's default is a flag, which would hand the parser
    // "true" instead of the value given.
    #[arg(long, value_name = "one-sided|send-recv", default_value = "one-sided",
          value_parser = parse_rdma_pages, action = clap::ArgAction::Set)]
    pub rdma_pages: bool,

    /// With a pool (--pool, or a domain naming one): the VM's lease TTL in seconds (how soon
    /// after farvm dies its pages are reclaimed) [default: 10].
    #[arg(long, value_name = "SECS", requires = "pool_source")]
    pub pool_lease_ttl: Option<u64>,

    /// With a pool: the slab size, the unit of placement (each slab of the remote share is
    /// reserved whole on --replicas servers), e.g. 1G or 64M [default: the remote share
    /// (guest RAM minus --local-memory) rounded up to a power of two, 2M to 1G, so a VM
    /// reserves at most twice what it can store: 64M for a 48M share].
    #[arg(long, value_name = "SIZE", requires = "pool_source", value_parser = parse_slab)]
    pub pool_slab: Option<u64>,

    /// With a pool: how to reach its memory servers, tcp or rdma. rdma uses each server's
    /// RDMA listener (one registered with `farvm-memserver --rdma`) and reaches a server that
    /// has none over TCP, saying so in the log; its pages move as --rdma-pages says. This host
    /// needs an RDMA device on the route to the servers [default: tcp].
    #[arg(long, value_name = "tcp|rdma", requires = "pool_source", value_parser = parse_transport)]
    pub pool_transport: Option<Transport>,

    /// With a pool: seconds to wait at start for etcd, and for memory servers while none is
    /// registered, before giving up [default: 300]. Servers that placements name but that
    /// are not registered (an etcd outage expired their leases) are waited for up to 30 s of
    /// it; a pool that is only short of room refuses at once.
    #[arg(long, value_name = "SECS", requires = "pool_source")]
    pub pool_wait: Option<u64>,

    /// With a pool: this host's name in the pool [default: the kernel's host name] (with
    /// --incoming: the name the migrated VM is registered under here).
    #[arg(long, value_name = "NAME", requires = "pool_source")]
    pub pool_host: Option<String>,

    /// Guest RAM's backing with remote memory: memfd (pages land in a memfd and are mapped
    /// with UFFDIO_CONTINUE; evicted pages are freed) or anon (private anonymous memory whose
    /// pages move in and out with UFFDIO_MOVE and are reused, never freed and re-allocated;
    /// Linux 6.8 or later; 0.6-0.85x memfd's CPU per remote page). anon is unsafe where the
    /// kernel loses pages that UFFDIO_MOVE moves while it migrates them (memory compaction;
    /// the 6.18.44 kernel farvm's tests run on does: `cargo run --release -p farvm-ept --example
    /// uffd_move_under_migration` checks a host), and under load guest pages have gone
    /// missing with it on such a host (found and the VM stopped, exit 74). Default: memfd;
    /// FARVM_GUEST_MEMORY overrides it when set.
    #[arg(long, value_name = "KIND", value_parser = parse_guest_memory)]
    pub guest_memory: Option<farvm_ept::GuestMemory>,

    /// Keep KVM's async page faults. By default, with remote memory, they are turned off (by
    /// disabling HLT exits) so that a guest fault on a remote page is handled on the vCPU's
    /// own thread: the paging engine then knows which vCPU, hence which guest process, faulted
    /// (per-process prefetching and accuracy), and the fault costs two thread hand-offs less.
    /// With this flag KVM takes such faults on its own worker thread instead, which nobody can
    /// attribute (96% of a stride run's faults under SVM). Without HLT exits a guest HLT halts
    /// in guest mode and holds its host CPU; farvm parks a test-guest vCPU that has nothing
    /// left to run in KVM, where it blocks, so only a guest that idles with HLT pays that.
    #[arg(long)]
    pub kvm_async_pf: bool,

    /// Turn KVM's async page faults off for a Linux guest too (as for the test guest). A Linux
    /// guest keeps them by default, because it idles with HLT: with HLT exits disabled its idle
    /// vCPUs halt in guest mode and keep their host CPUs. Without this flag its faults on
    /// remote pages are taken on KVM's worker threads and cannot be attributed to guest
    /// processes, so the guest agent's per-process histories and statistics need it (on hosts
    /// with a CPU per vCPU). Nested under QEMU-TCG (the KVM lab) a guest that then does not
    /// exit exposed QEMU losing the lab host's timer interrupt, which `scripts/kvm-lab` detects
    /// and recovers (docs/linux-guests.md).
    #[arg(long, conflicts_with = "kvm_async_pf")]
    pub no_kvm_async_pf: bool,

    /// Stage-2 pre-fault of injected pages: on builds each prefetched page's stage-2
    /// (EPT/NPT) entry with KVM_PRE_FAULT_MEMORY as it is installed, so the guest's first
    /// touch takes no exit at all (where KVM supports it: two-dimensional paging, Linux 6.11
    /// or later; the paging summary says "on", or "unsupported" where KVM refuses it); off
    /// leaves the entry to the guest's first touch (a stage-2 fault KVM resolves from the
    /// host mapping), for A/B comparisons (`farvm-lab bench stage2`).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set, num_args = 1)]
    pub stage2_prefault: bool,

    /// Prefetch histories: per-process (one per guest process the guest agent names; faults
    /// of no known process go to one global history) or global (one history of
    /// guest-physical pages for the whole guest, as without an agent — the baseline
    /// per-process histories are measured against). Per-process statistics are kept either
    /// way.
    #[arg(long, value_name = "per-process|global", default_value = "per-process",
          value_parser = ["per-process", "global"])]
    pub history: String,

    /// Record every fault the paging engine resolves (guest page, kind, and whether and to
    /// which guest pid its vCPU's agent slot attributed it) and write the records to FILE at
    /// exit, one per line: `GPN KIND ATTRIBUTED PID` (GPN in hex). Up to 4,194,304 faults
    /// (64 MiB); later ones are counted as dropped on the last line. For checking attribution
    /// against the guest's own view of its processes' pages.
    #[arg(long, value_name = "FILE", conflicts_with = "local_only")]
    pub fault_log: Option<PathBuf>,

    /// Pin the fault path to host CPU N: vCPU 0, the paging engine's fault handler and the
    /// local memserver's connection threads (evictor and prefetch receiver stay free). A
    /// demand fault hands off between these threads several times; on a host whose idle CPUs
    /// halt without polling (e.g. a VM guest with haltpoll off) each hand-off across CPUs
    /// wakes an idle CPU, which costs far more than a context switch on the same CPU
    /// (`farvm-lab bench remote` prints both). Default: left to the scheduler.
    #[arg(long, value_name = "N", conflicts_with = "local_only")]
    pub fault_path_cpu: Option<usize>,

    /// Stop the VM after this many seconds (exit status 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,

    #[command(flatten)]
    pub sandbox: super::SeccompArgs,

    /// Print results (and the run's outcome, exits, phase timestamps) as JSON.
    #[arg(long)]
    pub json: bool,

    /// Echo guest log lines (PV log port) on stderr.
    #[arg(long)]
    pub guest_log: bool,

    /// Boot an ELF --kernel as a Linux vmlinux (implied by --initrd/--cmdline unless the ELF is
    /// the test guest).
    #[arg(long)]
    pub linux: bool,

    /// Set everything up, print the entry state (registers, boot data placement) and exit
    /// without running the guest.
    #[arg(long)]
    pub stop_at_entry: bool,

    /// Restore the VM saved in the snapshot directory DIR (by `farvm snapshot` or the API's
    /// vm.snapshot) and resume it where it was saved (see SNAPSHOTS).
    #[arg(long, value_name = "DIR", conflicts_with_all = [
        "domain", "workloads", "kernel", "initrd", "cmdline", "linux", "stop_at_entry",
        "memory", "vcpus", "local_only", "memservers", "pool", "replicas", "local_memory",
        "prefetcher", "disks", "nets",
    ])]
    pub restore: Option<PathBuf>,
    /// How a pool VM's snapshot brings its resident pages back (see RESTORE MODES): eager
    /// (all of them loaded from the page file before the guest runs), lazy (each read from
    /// the page file on the guest's first touch, prefetcher off), lazy-prefetch (the same,
    /// the VM's prefetcher on), working-set (the pages the saved run touched, in the order it
    /// first did, fetched before the guest runs; the rest as lazy-prefetch) or
    /// working-set-async (the same fetch, behind the running guest).
    #[arg(
        long,
        value_name = "MODE",
        value_enum,
        requires = "restore",
        default_value_t
    )]
    pub restore_pages: farvm_vmm::snapshot::RestorePages,
    /// The snapshot key a sealed --restore snapshot was sealed under (`farvm snapshot
    /// --key-file`): a file of 32 raw bytes or 64 hex digits, readable by its owner only (mode
    /// 0600 or 0400). A sealed snapshot without it, or with another key, is refused (exit 64)
    /// before the VM is built, and a pool snapshot stays in the pool, restorable with the
    /// right key (see SNAPSHOTS).
    #[arg(long, value_name = "FILE", requires = "restore")]
    pub snapshot_key_file: Option<PathBuf>,
    /// Wait on HOST:PORT for a VM that `farvm migrate` sends from another host, and run it
    /// (see LIVE MIGRATION).
    #[arg(long, value_name = "HOST:PORT", requires = "migration_key_file", conflicts_with_all = [
        "restore", "domain", "workloads", "kernel", "initrd", "cmdline", "linux", "stop_at_entry",
        "memory", "vcpus", "local_only", "memservers", "pool", "replicas", "local_memory",
        "prefetcher", "disks", "nets",
    ])]
    pub incoming: Option<std::net::SocketAddr>,
    /// The migration key this host shares with the source (32 bytes or 64 hex digits, mode
    /// 0600/0400): the stream is sealed with it.
    #[arg(long, value_name = "PATH", requires = "incoming")]
    pub migration_key_file: Option<PathBuf>,
    /// Where an incoming migration is laid out while it arrives (a snapshot directory,
    /// removed once the VM is loaded) [default: a new directory in $TMPDIR].
    #[arg(long, value_name = "DIR", requires = "incoming")]
    pub incoming_dir: Option<PathBuf>,
}

/// The options that describe the VM itself: a domain (`--domain`) decides every one of them,
/// so giving one as well is an error (clap names both).
#[derive(Args, Debug, Clone)]
#[group(id = "vm_description", multiple = true)]
#[command(next_help_heading = "The VM (decided by the domain with --domain)")]
pub struct VmArgs {
    /// VM name (control socket name) [default: farvm-<pid>].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Kernel to boot: a test-guest ELF, a Linux bzImage or vmlinux [default: the built-in
    /// test guest].
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,

    /// Linux: the initial ramdisk.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,

    /// The kernel command line (Linux; for the test guest, `farvm.workload=SPEC` words add
    /// workloads).
    #[arg(long, value_name = "STRING")]
    pub cmdline: Option<String>,

    /// Guest RAM size (K/M/G suffixes; RAM above 3G is placed at 4G).
    #[arg(long, short = 'm', value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    pub memory: u64,

    /// Number of vCPUs (threads vcpu0, vcpu1, ...).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=255))]
    pub vcpus: u32,

    /// Console destination: stdout, none, or a file path.
    #[arg(long, value_name = "stdout|FILE|none", default_value = "stdout")]
    pub serial: SerialOut,

    /// Keep all guest RAM local: no paging engine, no memory server.
    #[arg(long, conflicts_with_all = ["memservers", "replicas", "memserver_token_file"])]
    pub local_only: bool,

    /// A memory server (host:port or ip:port; repeatable) [default: a farvm-memserver process
    /// that farvm starts on loopback]. A host name is resolved once, at start (its first address).
    /// `rdma://HOST:PORT` reaches the server over RDMA: HOST:PORT is its RDMA listener
    /// (`farvm-memserver --rdma`), and this host needs an RDMA device on the route to it
    /// (without one, farvm stops at start: "no RDMA device ...", exit status 71).
    #[arg(long = "memserver", value_name = "[rdma://]HOST:PORT", value_parser = parse_memserver)]
    pub memservers: Vec<Endpoint>,

    /// Join a memory pool: etcd client URLs (comma-separated or repeated, e.g.
    /// http://10.77.0.2:2379). The VM gets a fresh instance id (its namespace on the servers)
    /// and is admitted by the pool's placement: every slab of its remote share gets --replicas
    /// copies (default 2) on as many distinct racks, or the VM is refused with the shortfall
    /// (rack, bytes). Its record lives under its own lease; at exit the servers drop its pages
    /// at once, and if farvm dies they do so when the lease expires. While etcd does not
    /// answer, the start waits (--pool-wait) and says so; a running VM never waits on etcd.
    #[arg(long, value_name = "URLS", value_delimiter = ',', env = "FARVM_POOL",
          conflicts_with_all = ["memservers", "local_only"])]
    pub pool: Vec<String>,

    /// Copies of each remote page [default: 2 with two or more memservers, else 1].
    #[arg(long, value_name = "R")]
    pub replicas: Option<usize>,

    /// Tenant secret for the memory servers (hex, first line of the file).
    #[arg(long, value_name = "FILE")]
    pub memserver_token_file: Option<PathBuf>,

    /// Page encryption: on seals every page before it leaves the VMM for a memory server
    /// (AES-256-GCM under the VM's page key, which never leaves the VMM), bound to the VM's
    /// namespace, the page number and the page's last written version, so a memory server (or
    /// anyone on the path) can neither read guest memory nor serve a forged page, another
    /// page's, another VM's or an older copy: such a page is never installed, the read fails
    /// over to another replica, and with none left the VM stops (exit status 74, naming the
    /// page). Costs about 0.6 µs of CPU per page each way and 40 bytes per page on the
    /// servers. off gives all of that up: pages travel and rest in the clear, readable by the
    /// servers, and only the crc32c and the engine's fingerprint check stand between the
    /// guest and a page a server altered. Sealing is implemented over TCP only: RDMA memory
    /// servers need off (docs/sealing.md).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set, num_args = 1,
          conflicts_with = "local_only")]
    pub page_encryption: bool,

    /// The page key: a file of 32 raw bytes or 64 hex digits, readable by its owner only
    /// (mode 0600 or 0400; a file others can read is refused). For a VM that is restarted
    /// onto its pool namespace and must open the pages it sealed before. With --domain, the
    /// host config's memory_key_file applies when this is not given; this option wins over
    /// it. Default: a key drawn from the OS RNG for this run, never written anywhere.
    #[arg(long, value_name = "FILE", conflicts_with = "local_only")]
    pub memory_key_file: Option<PathBuf>,

    /// Local-memory budget: SIZE (e.g. 256M) or PCT% of guest RAM; the rest is remote.
    #[arg(long, value_name = "SIZE|PCT%", default_value = "50%", value_parser = parse_budget)]
    pub local_memory: farvm_ept::Budget,

    /// Prefetcher: none, next-n, stride, read-ahead, leap, stream, leap+stream.
    #[arg(long, value_name = "NAME", default_value = farvm_prefetch::registry::DEFAULT)]
    pub prefetcher: String,

    /// Leave every N-th prefetched page unmapped until the guest touches it, so the hit rate
    /// of the (otherwise invisible) injected prefetches can be measured; each such probe
    /// costs the guest one minor fault. After the first 256 probes only every 4N-th page is one
    /// (N = 1 stays 1). 0 = no probes: accuracy then comes from the prefetcher's own markers
    /// only.
    #[arg(long, value_name = "N", default_value_t = farvm_vmm::remote::DEFAULT_PROBE_EVERY)]
    pub probe_every: u32,

    /// Page numbers the prefetcher learns from: virtual (each process's own virtual pages,
    /// found by walking its page tables from the CR3 the guest agent publishes; pages it
    /// cannot place stay physical) or physical (guest-physical pages). Virtual keeps a
    /// process's sequential scan sequential however the guest kernel scattered its frames
    /// (`farvm-lab bench page-space`).
    #[arg(long, value_name = "virtual|physical", default_value = "virtual")]
    pub page_space: farvm_vmm::remote::PageSpace,

    /// Serve Prometheus metrics (paging counters and latency quantiles) on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,

    /// A disk for a Linux guest: a raw image file or block device, read-only with `,ro`
    /// (repeatable: /dev/vda, /dev/vdb, ... in order; virtio-blk on virtio-mmio).
    #[arg(long = "disk", value_name = "PATH[,ro]")]
    pub disks: Vec<DiskConfig>,

    /// A network interface for a Linux guest: virtio-net on the host's tap device NAME
    /// (opened by name; created, and removed at exit, if it does not exist), with MAC address
    /// MAC (default: 52:54:00 and three bytes derived from NAME). Repeatable: eth0, eth1, ...
    /// in order, after the disks on virtio-mmio.
    #[arg(long = "net", value_name = "tap=NAME[,mac=MAC]")]
    pub nets: Vec<NetConfig>,
}

/// `--rdma-pages`: true for one-sided.
fn parse_rdma_pages(s: &str) -> Result<bool, String> {
    match s {
        "one-sided" => Ok(true),
        "send-recv" => Ok(false),
        _ => Err(format!("`{s}`: use one-sided or send-recv")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("`{other}`: expected on or off")),
    }
}

impl RunArgs {
    /// The VM these flags describe (without `--domain`'s file: see [`super::domain`]).
    pub fn to_spec(&self) -> VmSpec {
        let v = &self.vm;
        VmSpec {
            name: v.name.clone(),
            uuid: None,
            memory: v.memory,
            vcpus: v.vcpus,
            kernel: v.kernel.clone(),
            initrd: v.initrd.clone(),
            cmdline: v.cmdline.clone(),
            force_linux: self.linux,
            workloads: self.workloads.clone(),
            test_guest: TestGuestOptions {
                timer_hz: self.timer_hz,
                frame_shuffle_seed: self.frame_shuffle_seed,
                frame_run_shift: self.frame_run_shift,
                premap: self.premap,
                demand_4k: self.demand_4k,
            },
            serial: v.serial.clone(),
            serial_in: self.serial_in.clone(),
            disks: v.disks.clone(),
            nets: v.nets.clone(),
            echo_guest_logs: self.guest_log,
            async_pf: if self.kvm_async_pf {
                AsyncPf::Keep
            } else if self.no_kvm_async_pf {
                AsyncPf::Off
            } else {
                AsyncPf::Auto
            },
            metrics: v.metrics,
            local_only: v.local_only,
            remote: RemoteOptions {
                servers: v.memservers.clone(),
                pool: v.pool.clone(),
                pool_options: {
                    let d = PoolOptions::default();
                    PoolOptions {
                        lease_ttl: self.pool_lease_ttl.map_or(d.lease_ttl, Duration::from_secs),
                        slab_bytes: self.pool_slab.or(d.slab_bytes),
                        wait: self.pool_wait.map_or(d.wait, Duration::from_secs),
                        host: self.pool_host.clone(),
                        transport: self.pool_transport.unwrap_or(d.transport),
                    }
                },
                rdma_one_sided: self.rdma_pages,
                replicas: v.replicas,
                token_file: v.memserver_token_file.clone(),
                local_memory: v.local_memory,
                prefetcher: v.prefetcher.clone(),
                probe_every: v.probe_every,
                page_space: v.page_space,
                guest_memory: self.guest_memory,
                stage2_prefault: self.stage2_prefault,
                global_history: self.history == "global",
                fault_path_cpu: self.fault_path_cpu,
                fault_log: self.fault_log.is_some(),
                page_encryption: v.page_encryption,
                memory_key_file: v.memory_key_file.clone(),
            },
        }
    }
}

/// A problem with the VM's description, named by `names`, with the exit status its kind has.
pub fn spec_failure(e: &SpecError, names: &dyn FieldNames) -> Failure {
    let code = match e.kind {
        SpecErrorKind::Invalid => exit_code::USAGE,
        SpecErrorKind::Unreadable => exit_code::NO_INPUT,
        SpecErrorKind::BadKernel => exit_code::BAD_KERNEL,
    };
    Failure::new(code, e.render(names))
}

/// Builds the VM (remote memory first, when asked for), mapping errors to exit statuses.
pub fn build_vm(cfg: &VmConfig) -> Result<Vm, Failure> {
    builder::build(cfg).map_err(|e| Failure::new(exit_code::for_build_error(&e), e.to_string()))
}

/// Starts the Prometheus endpoint for `vm`.
fn start_metrics(addr: SocketAddr, vm: &Vm) -> Result<HttpServer, Failure> {
    farvm_vmm::metrics::serve(&Listen::Tcp(addr), vm.shared()).map_err(|e| {
        let why = match e {
            HttpError::Bind { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        Failure::new(
            exit_code::HOST_ERROR,
            format!("cannot serve --metrics on {addr}: {why}"),
        )
    })
}

/// Writes the fault log (`--fault-log FILE`).
fn write_fault_log(path: &Path, r: &VmReport) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "# farvm fault log: gpn kind attributed pid")?;
    for f in &r.fault_log {
        writeln!(
            w,
            "{:x} {} {} {}",
            f.gpn,
            f.kind.name(),
            u8::from(f.attributed),
            f.pid
        )?;
    }
    writeln!(w, "# dropped {}", r.fault_log_dropped)?;
    w.flush()
}

/// Runs a created VM to its end (control socket, signals, timeout) and returns the report.
pub fn run_vm(
    vm: Vm,
    spec: VmSpec,
    control: Option<PathBuf>,
    timeout: Option<Duration>,
) -> Result<VmReport, Failure> {
    let host = |e: String| Failure::new(exit_code::HOST_ERROR, e);
    signals::install_termination_handlers().map_err(|e| host(format!("signal handlers: {e}")))?;
    let server = match control {
        Some(p) => Some(
            ControlServer::start(&p, vm.shared().clone(), Some(spec))
                .map_err(|e| host(e.to_string()))?,
        ),
        None => None,
    };
    let running = vm.start().map_err(|e| host(e.to_string()))?;
    let outcome = running.wait(timeout, true);
    // The control server holds the VM's shared state, and through it the paging engine: it
    // goes before the VM's end, which stops the engine and leaves the pool only when it holds
    // the last reference (else a pool VM's pages waited for its lease to expire).
    drop(server);
    let report = running.finish(outcome);
    Ok(report)
}

pub fn run(a: RunArgs) -> Result<i32> {
    super::start_sandbox(a.sandbox.seccomp)?;
    let mut spec = a.to_spec();
    let (cfg, vm) = match a.incoming {
        Some(addr) => {
            let (s, cfg, vm) = super::incoming::arrive(addr, &a)?;
            spec = s;
            (cfg, vm)
        }
        None => {
            let snapshot = a
                .restore
                .as_deref()
                .map(|dir| super::restore::open(dir, a.snapshot_key_file.as_deref()))
                .transpose()?
                .map(|snap| snap.restore_pages(a.restore_pages));
            let cfg = match (&snapshot, &a.domain) {
                (Some(snap), _) => {
                    spec = super::restore::spec(snap, &a);
                    let mut cfg = spec.to_config().map_err(|e| spec_failure(&e, &CliNames))?;
                    super::restore::prepare(snap, &mut cfg)?;
                    cfg
                }
                (None, Some(path)) => {
                    let names = super::domain::apply(&mut spec, path)?;
                    spec.to_config().map_err(|e| spec_failure(&e, &names))?
                }
                (None, None) => spec.to_config().map_err(|e| spec_failure(&e, &CliNames))?,
            };
            let vm = build_vm(&cfg)?;
            if let Some(snap) = &snapshot {
                super::restore::load(snap, &vm)?;
            }
            (cfg, vm)
        }
    };
    let metrics = spec
        .metrics
        .map(|addr| start_metrics(addr, &vm))
        .transpose()?;
    if let Some(m) = &metrics {
        eprintln!("farvm: metrics on http://{}/metrics", m.addr());
    }
    if a.stop_at_entry {
        print_entry(&vm, a.json)?;
        drop(metrics);
        drop(vm);
        return Ok(exit_code::OK);
    }
    let control = if a.no_control_socket {
        None
    } else {
        Some(
            a.control_socket
                .clone()
                .unwrap_or_else(|| default_socket_path(&cfg.name)),
        )
    };
    // Interactive console: raw mode until the run ends (restored on every return path).
    let raw = if cfg.serial_in == SerialIn::Stdin {
        RawMode::stdin().map_err(|e| {
            Failure::new(
                exit_code::HOST_ERROR,
                format!("cannot put the terminal in raw mode: {e}"),
            )
        })?
    } else {
        None
    };
    if raw.is_some() {
        eprintln!("farvm: {}", console::ESCAPE_HELP);
    }
    let report = run_vm(vm, spec, control, a.timeout.map(Duration::from_secs));
    drop(raw);
    let report = report?;
    drop(metrics);
    if let Some(path) = &a.fault_log {
        write_fault_log(path, &report).map_err(|e| {
            Failure::new(
                exit_code::HOST_ERROR,
                format!("cannot write the fault log {}: {e}", path.display()),
            )
        })?;
    }
    print_report(&report, a.json, report.paging.as_ref());
    let code = exit_code::for_outcome(&report.outcome);
    if code != exit_code::OK {
        // Also with --json (stdout is the report): the log says which process went wrong.
        for p in &report.processes {
            if let Some(why) = process_problem(p) {
                eprintln!(
                    "farvm: process {} ({}): {why}",
                    p.pid,
                    workload_name(p.workload)
                );
            }
        }
        eprintln!("farvm: {}", report.outcome);
    }
    Ok(code)
}

fn print_entry(vm: &Vm, json: bool) -> Result<()> {
    let (regs, sregs) = vm.vcpu_regs(0)?;
    let v = serde_json::json!({
        "rip": regs.rip, "rsi": regs.rsi, "rdi": regs.rdi, "rsp": regs.rsp,
        "cr0": sregs.cr0, "cr3": sregs.cr3, "cr4": sregs.cr4, "efer": sregs.efer,
        "cs": sregs.cs.selector, "ds": sregs.ds.selector, "cs_long_mode": sregs.cs.l == 1,
        "gdt_base": sregs.gdt.base, "gdt_limit": sregs.gdt.limit,
        "linux": vm.linux_boot(),
        "memory_regions": vm.ram().regions().iter().map(|r| (r.gpa(), r.len())).collect::<Vec<_>>(),
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("entry state of vCPU 0 (not run):");
        println!(
            "  rip {:#x}  rsi {:#x}  rdi {:#x}  rsp {:#x}",
            regs.rip, regs.rsi, regs.rdi, regs.rsp
        );
        println!(
            "  cr0 {:#x}  cr3 {:#x}  cr4 {:#x}  efer {:#x}  cs {:#x} (L={})",
            sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer, sregs.cs.selector, sregs.cs.l
        );
        if let Some(l) = vm.linux_boot() {
            println!(
                "  linux {}: protocol {}.{:02}, kernel {:#x}..{:#x}, entry {:#x}",
                l.kind,
                l.protocol_version >> 8,
                l.protocol_version & 0xff,
                l.kernel_load,
                l.kernel_end,
                l.entry
            );
            println!(
                "  boot_params at {:#x}, cmdline at {:#x} ({} bytes)",
                l.boot_params_gpa, l.cmdline_gpa, l.cmdline_len
            );
            match l.initrd_gpa {
                Some(g) => println!("  initrd at {g:#x} ({} bytes)", l.initrd_len),
                None => println!("  no initrd"),
            }
            if let Some(r) = l.acpi_rsdp_addr {
                println!("  ACPI RSDP at {r:#x}");
            }
            for (a, s, t) in &l.e820 {
                println!("  e820 {a:#014x} +{:<8} type {t}", format_size(*s));
            }
        }
    }
    Ok(())
}

/// Name of a mailbox state.
pub fn state_name(s: u32) -> &'static str {
    match s {
        state::STARTING => "starting",
        state::RUNNING => "running",
        state::DONE => "done",
        state::KILLED => "killed",
        state::FAILED => "failed",
        _ => "?",
    }
}

fn print_report(r: &VmReport, json: bool, paging: Option<&farvm_vmm::remote::RemoteStats>) {
    let paging_json = paging.map(|p| serde_json::to_value(p).unwrap_or(serde_json::Value::Null));
    if json {
        let procs: Vec<serde_json::Value> = r.processes.iter().map(process_json).collect();
        let v = serde_json::json!({
            "name": r.name,
            "outcome": r.outcome,
            "exit_status": exit_code::for_outcome(&r.outcome),
            "uptime_secs": r.uptime_secs,
            "exits": r.exits,
            "processes": procs,
            "paging": paging_json,
            "per_process": r.per_process,
        });
        println!("{v}");
        return;
    }
    if let Some(p) = &paging_json {
        print!("{}", super::paging::render(p));
    }
    if r.processes.is_empty() {
        return;
    }
    println!(
        "{:>4} {:<15} {:>3} {:<8} {:>12} {:>12} {:>18}",
        "pid", "workload", "cpu", "state", "time_ms", "ops", "checksum"
    );
    for p in &r.processes {
        let extra = process_problem(p)
            .map(|why| format!("  ({why})"))
            .unwrap_or_default();
        println!(
            "{:>4} {:<15} {:>3} {:<8} {:>12.3} {:>12} {:>#18x}{extra}",
            p.pid,
            workload_name(p.workload),
            p.cpu,
            state_name(p.state),
            p.elapsed_ns as f64 / 1e6,
            p.ops,
            p.checksum
        );
    }
    for p in &r.processes {
        if let Some(d) = p.measured_phase_paging() {
            let e = farvm_ept::PrefetchEstimate::of(&d);
            println!(
                "{:>4} measured phase (the VM's paging meanwhile): demand faults {} | zero-fill {} | prefetches issued {} | coverage {:.3}",
                p.pid, d.demand_faults, d.zero_fills, d.prefetch_issued, e.coverage
            );
        }
    }
    if let VmOutcome::GuestShutdown { status } = r.outcome {
        println!(
            "guest shut down with status {status} after {:.3} s",
            r.uptime_secs
        );
    }
}

/// What went wrong with process `p`, if it was killed or failed: the exception, or the
/// workload's error (and a verifying scan's first wrong word).
fn process_problem(p: &ProcessRecord) -> Option<String> {
    match p.state {
        state::KILLED => Some(format!(
            "killed by exception vector {} error {:#x} cr2 {:#x} rip {:#x}",
            p.fault_vector, p.fault_error, p.fault_cr2, p.fault_rip
        )),
        state::FAILED => Some(format!(
            "{}, code {}{}",
            farvm_workloads::Error::describe_code(p.error),
            p.error,
            diverged_word(p)
        )),
        _ => None,
    }
}

/// A verifying scan's first wrong word (seq `verify=1`, reported in its counters), or "".
fn diverged_word(p: &ProcessRecord) -> String {
    use farvm_workloads::lathist::counter as c;
    let code = farvm_workloads::Error::Corrupted { mismatches: 0 }.code();
    if p.error != code || workload_name(p.workload) != "seq" {
        return String::new();
    }
    let word = p.counters[c::DIVERGED_WORD];
    format!(
        "; first at working-set offset {:#x} (page {}), pass {}: wrote {:#x}, read {:#x}",
        word * 8,
        word / 512,
        p.counters[c::DIVERGED_PASS],
        p.counters[c::DIVERGED_EXPECTED],
        p.counters[c::DIVERGED_FOUND]
    )
}

fn process_json(p: &ProcessRecord) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or(serde_json::Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("name".into(), workload_name(p.workload).into());
        o.insert("state_name".into(), state_name(p.state).into());
        o.insert("time_ms".into(), (p.elapsed_ns as f64 / 1e6).into());
        if let Some(d) = p.measured_phase_paging() {
            o.insert(
                "measured_phase_paging".into(),
                serde_json::to_value(&d).unwrap_or(serde_json::Value::Null),
            );
        }
        if p.state == state::FAILED {
            o.insert(
                "error_text".into(),
                format!(
                    "{}{}",
                    farvm_workloads::Error::describe_code(p.error),
                    diverged_word(p)
                )
                .into(),
            );
        }
    }
    v
}

/// `--memserver`: `[rdma://]HOST:PORT`, resolved now so that a typo fails at the command line.
fn parse_memserver(s: &str) -> Result<Endpoint, String> {
    Endpoint::parse(s).map_err(|e| e.to_string())
}

/// `--pool-transport`: a transport's URL scheme (`tcp`, `rdma`).
fn parse_transport(s: &str) -> Result<Transport, String> {
    Transport::from_scheme(s)
        .ok_or_else(|| format!("`{s}`: use {}", Transport::SCHEMES.join(" or ")))
}

/// `--local-memory`.
fn parse_budget(s: &str) -> Result<farvm_ept::Budget, String> {
    farvm_ept::Budget::parse(s).map_err(|e| e.to_string())
}

/// `--pool-slab`: whole 4 KiB pages.
fn parse_slab(s: &str) -> Result<u64, String> {
    match farvm_ept::Budget::parse(s) {
        Ok(farvm_ept::Budget::Bytes(b)) if b >= 4096 && b.is_multiple_of(4096) => Ok(b),
        _ => Err(format!(
            "`{s}`: a size of whole 4 KiB pages, e.g. 1G or 64M"
        )),
    }
}

fn parse_guest_memory(s: &str) -> Result<farvm_ept::GuestMemory, String> {
    farvm_ept::GuestMemory::parse(s).ok_or_else(|| format!("`{s}` is not memfd or anon"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(no_binary_name = true)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn spec(args: &[&str]) -> VmSpec {
        use clap::Parser;
        Cli::try_parse_from(args).unwrap().run.to_spec()
    }

    /// `farvm run` alone is the description's default: one set of defaults.
    #[test]
    fn no_flags_is_the_default_description() {
        assert_eq!(spec(&[]), VmSpec::default());
    }

    /// The on|off switches take their value (`--page-encryption off`), and sealing is on by
    /// default.
    #[test]
    fn on_off_switches_take_their_value() {
        let d = spec(&[]);
        assert!(d.remote.page_encryption && d.remote.stage2_prefault);
        let s = spec(&[
            "--page-encryption",
            "off",
            "--stage2-prefault",
            "off",
            "--memory-key-file",
            "/k",
        ]);
        assert!(!s.remote.page_encryption && !s.remote.stage2_prefault);
        assert_eq!(s.remote.memory_key_file.as_deref(), Some(Path::new("/k")));
        assert!(spec(&["--page-encryption", "on"]).remote.page_encryption);
        use clap::Parser;
        assert!(Cli::try_parse_from(["--page-encryption", "maybe"]).is_err());
    }

    /// Each flag lands in its field, and a problem found in the description names the flag.
    #[test]
    fn flags_fill_the_description_and_its_errors_name_them() {
        let s = spec(&[
            "--vcpus",
            "32",
            "--memory",
            "1G",
            "--local-memory",
            "25%",
            "--pool",
            "http://10.0.0.2:2379",
            "--pool-slab",
            "64M",
            "--kvm-async-pf",
        ]);
        assert_eq!((s.vcpus, s.memory), (32, 1 << 30));
        assert_eq!(s.remote.local_memory, farvm_ept::Budget::Percent(25.0));
        assert_eq!(s.async_pf, AsyncPf::Keep);
        assert_eq!(s.remote.pool, ["http://10.0.0.2:2379"]);
        assert_eq!(s.remote.pool_options.slab_bytes, Some(64 << 20));
        // A pool's knobs need a pool (given, or one a domain may name).
        use clap::Parser;
        let e = Cli::try_parse_from(["--pool-slab", "64M"]).err().unwrap();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{e}"
        );
        Cli::try_parse_from(["--domain", "d.xml", "--pool-slab", "64M"]).unwrap();
        let e = spec_failure(&s.to_config().unwrap_err(), &CliNames);
        assert_eq!(e.code, exit_code::USAGE);
        assert!(
            e.message
                .starts_with("--vcpus: 32 vCPUs is more than the test guest supports"),
            "{e}"
        );
        let e = spec(&["--kernel", "/nonexistent/k"])
            .to_config()
            .unwrap_err();
        assert_eq!(spec_failure(&e, &CliNames).code, exit_code::NO_INPUT);
    }

    #[test]
    fn a_verifying_scan_that_failed_names_its_first_wrong_word() {
        let mut p = ProcessRecord::new(
            1,
            0,
            farvm_workloads::meta::id::SEQ_SCAN,
            state::FAILED,
            2,
            0,
        );
        p.counters = [0, 0, 0, 1029, 7, 0xaa, 0, 0];
        p.error = farvm_workloads::Error::Corrupted { mismatches: 1 }.code();
        assert_eq!(
            diverged_word(&p),
            "; first at working-set offset 0x2028 (page 2), pass 7: wrote 0xaa, read 0x0"
        );
        assert!(process_json(&p)["error_text"]
            .as_str()
            .unwrap()
            .ends_with("read 0x0"));
        // Another error, or another workload's code 5 (isolation), has no such word.
        p.error = 3;
        assert_eq!(diverged_word(&p), "");
    }

    #[test]
    fn memserver_urls_name_the_transport() {
        let tcp = parse_memserver("127.0.0.1:7070").unwrap();
        assert_eq!((tcp.addr.port(), tcp.transport), (7070, Transport::Tcp));
        assert_eq!(parse_rdma_pages("one-sided"), Ok(true));
        assert_eq!(parse_rdma_pages("send-recv"), Ok(false));
        assert!(parse_rdma_pages("two-sided").is_err());
        // Through clap, as the command line reaches it.
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        use clap::Parser;
        let pages = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
                .map(|c| c.run.rdma_pages)
                .map_err(|e| e.to_string())
        };
        assert_eq!(pages(&[]), Ok(true));
        assert_eq!(pages(&["--rdma-pages", "send-recv"]), Ok(false));
        assert_eq!(pages(&["--rdma-pages", "one-sided"]), Ok(true));
        let e = pages(&["--rdma-pages", "bogus"]).unwrap_err();
        assert!(e.contains("`bogus`: use one-sided or send-recv"), "{e}");
        let rdma = parse_memserver("rdma://10.2.0.2:7071").unwrap();
        assert_eq!(rdma.addr, "10.2.0.2:7071".parse().unwrap());
        assert_eq!(rdma.transport, Transport::RDMA);
        assert_eq!(
            parse_memserver("tcp://127.0.0.1:1").unwrap().transport,
            Transport::Tcp
        );
        let e = parse_memserver("nvme://127.0.0.1:1").unwrap_err();
        assert!(e.contains("unknown scheme"), "{e}");
        assert!(parse_memserver("rdma://nohostport").is_err());
        let pool = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
                .map(|c| c.run.pool_transport)
                .map_err(|e| e.to_string())
        };
        let etcd = ["--pool", "http://127.0.0.1:2379"];
        assert_eq!(pool(&etcd), Ok(None));
        assert_eq!(
            pool(&[&etcd[..], &["--pool-transport", "rdma"]].concat()),
            Ok(Some(Transport::RDMA))
        );
        let e = pool(&[&etcd[..], &["--pool-transport", "ib"]].concat()).unwrap_err();
        assert!(e.contains("`ib`: use tcp or rdma"), "{e}");
    }
}
