//! The guest's process table read from `/proc`, and the events that turn one snapshot into the
//! next (what the VMM's table needs to follow it): `PRESENT` for what the first scan finds,
//! `START` for a new process, `RENAME` when a process runs a new program, `EXIT` when it is gone.
//!
//! A process is keyed by (pid, start time), so a pid reused between two scans is an exit and a
//! start, not a rename. Kernel threads are left out: they never run with a user page table, so
//! the agent slots report them as pid 0.

use std::collections::BTreeMap;
use std::path::Path;

use farvm_guest_agent::device::ring::{kind, ProcEvent};

/// `USER_HZ`: the unit of `/proc/PID/stat`'s start time on x86 Linux.
pub const TICKS_PER_SEC: u64 = 100;
/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u64 = 0x0020_0000;

/// One process as `/proc` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// `comm` (what `ps` shows), at most 15 bytes on Linux.
    pub name: String,
    /// Start time, in [`TICKS_PER_SEC`] ticks since boot.
    pub start_ticks: u64,
    pub kernel_thread: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("no `(comm)` in the stat line")]
    NoComm,
    #[error("stat field {0} is missing or not a number")]
    Field(usize),
}

/// Parses `/proc/PID/stat` (`pid (comm) state ppid ...`). `comm` may itself hold spaces and
/// parentheses: it ends at the line's last `)`.
pub fn parse_stat(line: &str) -> Result<ProcInfo, ParseError> {
    let open = line.find('(').ok_or(ParseError::NoComm)?;
    let close = line.rfind(')').ok_or(ParseError::NoComm)?;
    if close < open {
        return Err(ParseError::NoComm);
    }
    let pid = line[..open]
        .trim()
        .parse()
        .map_err(|_| ParseError::Field(1))?;
    let name = line[open + 1..close].to_string();
    // Fields after comm, numbered as in proc(5): 3 state, 4 ppid, 9 flags, 22 starttime.
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let field = |n: usize| -> Result<u64, ParseError> {
        rest.get(n - 3)
            .and_then(|s| s.parse().ok())
            .ok_or(ParseError::Field(n))
    };
    Ok(ProcInfo {
        pid,
        ppid: u32::try_from(field(4)?).map_err(|_| ParseError::Field(4))?,
        uid: 0,
        name,
        start_ticks: field(22)?,
        kernel_thread: field(9)? & PF_KTHREAD != 0,
    })
}

/// The real uid from `/proc/PID/status` (`Uid:\treal\teffective...`), if there.
pub fn parse_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The processes under `proc_root` (normally `/proc`), kernel threads excluded. Processes that
/// exit while being read are skipped.
pub fn scan(proc_root: &Path) -> std::io::Result<Vec<ProcInfo>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let Ok(mut p) = parse_stat(&stat) else {
            continue;
        };
        if p.kernel_thread || p.pid != pid {
            continue;
        }
        p.uid = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| parse_uid(&s))
            .unwrap_or(0);
        out.push(p);
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

/// Follows successive scans and says what changed.
#[derive(Debug, Default)]
pub struct Tracker {
    known: BTreeMap<u32, ProcInfo>,
    scanned: bool,
}

fn event(k: u32, p: &ProcInfo, time_ns: u64) -> ProcEvent {
    let mut e = ProcEvent {
        kind: k,
        pid: p.pid,
        ppid: p.ppid,
        uid: p.uid,
        time_ns,
        ..ProcEvent::default()
    };
    e.set_name(&p.name);
    e
}

fn start_ns(p: &ProcInfo) -> u64 {
    p.start_ticks.saturating_mul(1_000_000_000 / TICKS_PER_SEC)
}

impl Tracker {
    /// Events that take the previous snapshot to `now` (`now_ns`: the guest's boot time now,
    /// stamped on exits). The first call reports every process as `PRESENT`.
    pub fn update(&mut self, now: Vec<ProcInfo>, now_ns: u64) -> Vec<ProcEvent> {
        let mut events = Vec::new();
        let first = !self.scanned;
        self.scanned = true;
        let mut next = BTreeMap::new();
        for p in now {
            match self.known.remove(&p.pid) {
                None => {
                    let k = if first { kind::PRESENT } else { kind::START };
                    events.push(event(k, &p, start_ns(&p)));
                }
                Some(old) if old.start_ticks != p.start_ticks => {
                    // The pid was reused between two scans.
                    events.push(event(kind::EXIT, &old, now_ns));
                    events.push(event(kind::START, &p, start_ns(&p)));
                }
                Some(old) if old.name != p.name => {
                    events.push(event(kind::RENAME, &p, now_ns));
                }
                Some(_) => {}
            }
            next.insert(p.pid, p);
        }
        for old in self.known.values() {
            events.push(event(kind::EXIT, old, now_ns));
        }
        self.known = next;
        events
    }

    /// Processes known after the last update.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.known.len()
    }
}

/// The guest's CLOCK_BOOTTIME-like uptime in ns, from `/proc/uptime` (10 ms resolution).
pub fn uptime_ns(proc_root: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(proc_root.join("uptime")).ok()?;
    let secs = s.split_whitespace().next()?;
    let (whole, frac) = secs.split_once('.').unwrap_or((secs, "0"));
    let frac_ns: u64 = format!("{frac:0<9}")[..9].parse().ok()?;
    Some(whole.parse::<u64>().ok()? * 1_000_000_000 + frac_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, ppid: u32, flags: u64, start: u64) -> String {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime priority nice threads itrealvalue starttime ...
        format!("{pid} ({comm}) S {ppid} 1 1 0 -1 {flags} 10 0 0 0 1 2 0 0 20 0 1 0 {start} 12345 67 rest")
    }

    fn info(pid: u32, name: &str, start: u64) -> ProcInfo {
        ProcInfo {
            pid,
            ppid: 1,
            uid: 0,
            name: name.into(),
            start_ticks: start,
            kernel_thread: false,
        }
    }

    #[test]
    fn stat_lines_with_awkward_names_parse() {
        let p = parse_stat(&stat(42, "a) (b c", 7, 0x400100, 1234)).unwrap();
        assert_eq!((p.pid, p.ppid, p.name.as_str()), (42, 7, "a) (b c"));
        assert_eq!((p.start_ticks, p.kernel_thread), (1234, false));
        let k = parse_stat(&stat(2, "kthreadd", 0, 0x208040, 0)).unwrap();
        assert!(k.kernel_thread);
        assert_eq!(parse_stat("12 noparen S"), Err(ParseError::NoComm));
        assert_eq!(parse_stat("12 (x) S"), Err(ParseError::Field(4)));
        assert_eq!(parse_stat("x (y) S 1"), Err(ParseError::Field(1)));
        assert_eq!(
            parse_uid("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n"),
            Some(1000)
        );
        assert_eq!(parse_uid("Name:\tx\n"), None);
    }

    #[test]
    fn tracker_reports_present_start_rename_exit_and_pid_reuse() {
        let mut t = Tracker::default();
        let e = t.update(vec![info(1, "init", 1), info(50, "sh", 20)], 1_000);
        assert_eq!(
            e.iter().map(|e| (e.kind, e.pid)).collect::<Vec<_>>(),
            [(kind::PRESENT, 1), (kind::PRESENT, 50)]
        );
        assert_eq!(e[1].time_ns, 20 * 10_000_000, "start time in ns from ticks");
        assert!(t
            .update(vec![info(1, "init", 1), info(50, "sh", 20)], 2_000)
            .is_empty());

        let e = t.update(
            vec![
                info(1, "init", 1),
                info(50, "sqlite3", 20),
                info(60, "xz", 30),
            ],
            3_000,
        );
        let got: Vec<_> = e
            .iter()
            .map(|e| (e.kind, e.pid, e.name_bytes().to_vec()))
            .collect();
        assert_eq!(
            got,
            [
                (kind::RENAME, 50, b"sqlite3".to_vec()),
                (kind::START, 60, b"xz".to_vec())
            ]
        );

        // 60 exits and its pid comes back as another process; 50 exits.
        let e = t.update(vec![info(1, "init", 1), info(60, "sort", 90)], 4_000);
        let got: Vec<_> = e.iter().map(|e| (e.kind, e.pid, e.time_ns)).collect();
        assert_eq!(
            got,
            [
                (kind::EXIT, 60, 4_000),
                (kind::START, 60, 900_000_000),
                (kind::EXIT, 50, 4_000)
            ]
        );
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn scanning_this_machine_finds_this_process_by_name() {
        let me = std::process::id();
        let procs = scan(Path::new("/proc")).expect("/proc readable");
        let p = procs
            .iter()
            .find(|p| p.pid == me)
            .expect("this process in /proc");
        let comm = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap();
        assert_eq!(p.name, comm.trim_end());
        assert!(!p.kernel_thread);
        assert!(procs.iter().all(|p| !p.kernel_thread));
        assert!(uptime_ns(Path::new("/proc")).unwrap() > 0);
    }
}
