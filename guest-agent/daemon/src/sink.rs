//! Where events go: the agent module's device file (`/dev/farvm-agent`, which queues them on
//! the process ring the VMM reads), or standard output for a dry run.

use std::io::Write;

use farvm_guest_agent::device::ring::{ProcEvent, NAME_BYTES};

/// Bytes of one record on the device file (`struct farvm_proc_event`).
pub const RECORD_BYTES: usize = core::mem::size_of::<ProcEvent>();

/// The record's bytes as the C struct lays them out (little-endian x86-64).
pub fn encode(e: &ProcEvent) -> [u8; RECORD_BYTES] {
    let mut b = [0u8; RECORD_BYTES];
    b[0..4].copy_from_slice(&e.kind.to_le_bytes());
    b[4..8].copy_from_slice(&e.pid.to_le_bytes());
    b[8..12].copy_from_slice(&e.ppid.to_le_bytes());
    b[12..16].copy_from_slice(&e.uid.to_le_bytes());
    b[16..24].copy_from_slice(&e.time_ns.to_le_bytes());
    b[24..24 + NAME_BYTES].copy_from_slice(&e.name);
    b
}

/// Writes all `events` to `out` in one write per batch (the module takes whole records only).
pub fn write_events(out: &mut impl Write, events: &[ProcEvent]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(events.len() * RECORD_BYTES);
    for e in events {
        buf.extend_from_slice(&encode(e));
    }
    out.write_all(&buf)
}

/// One line per event, for `--print`.
pub fn describe(e: &ProcEvent) -> String {
    use farvm_guest_agent::device::ring::kind;
    let k = match e.kind {
        kind::PRESENT => "present",
        kind::START => "start",
        kind::RENAME => "rename",
        kind::EXIT => "exit",
        _ => "?",
    };
    format!(
        "{k} pid={} ppid={} uid={} t={}ns name={}",
        e.pid,
        e.ppid,
        e.uid,
        e.time_ns,
        String::from_utf8_lossy(e.name_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_guest_agent::device::ring::kind;

    #[test]
    fn records_are_laid_out_as_the_c_struct() {
        let mut e = ProcEvent {
            kind: kind::START,
            pid: 0x0102_0304,
            ppid: 7,
            uid: 1000,
            time_ns: 0x1122_3344_5566_7788,
            ..ProcEvent::default()
        };
        e.set_name("sqlite3");
        let b = encode(&e);
        assert_eq!(RECORD_BYTES, 64);
        assert_eq!(&b[0..4], &[2, 0, 0, 0]);
        assert_eq!(&b[4..8], &[4, 3, 2, 1]);
        assert_eq!(&b[16..24], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[24..31], b"sqlite3");
        assert!(b[31..].iter().all(|&x| x == 0));
        let mut out = Vec::new();
        write_events(&mut out, &[e, e]).unwrap();
        assert_eq!(out.len(), 128);
        assert_eq!(
            describe(&e),
            "start pid=16909060 ppid=7 uid=1000 t=1234605616436508552ns name=sqlite3"
        );
    }
}
