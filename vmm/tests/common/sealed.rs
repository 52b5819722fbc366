//! Helpers for the sealed-snapshot tests: key files, a marker the guest's RAM is known to
//! hold, a search of a snapshot directory for it, and the tampering a sealed snapshot must
//! refuse (a flipped bit, two pages swapped).
#![allow(dead_code)]

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const PAGE: u64 = 4096;
const TAG: usize = 16;

/// Writes a snapshot key file of 32 bytes `byte` (mode 0600) at `dir/name`.
pub fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    use std::io::Write;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    f.write_all(&[byte; 32]).unwrap();
    path
}

/// 64 bytes of the test guest's kernel code: the VMM loads them into guest RAM, where they
/// stay unchanged, so every snapshot of a test-guest VM holds them (the page file of a
/// snapshot in the clear holds them as they are).
pub fn marker() -> [u8; 64] {
    let elf = farvm_images::TESTGUEST_ELF;
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, n) = (u64_at(32), u16_at(56));
    for h in (0..n).map(|i| phoff + i * 56) {
        let (kind, flags) = (&elf[h..h + 4], elf[h + 4]);
        // PT_LOAD, executable.
        if kind != [1, 0, 0, 0] || flags & 1 == 0 {
            continue;
        }
        let (off, size) = (u64_at(h + 8), u64_at(h + 32));
        // A window of varied bytes (code, not padding).
        if let Some(w) = elf[off..off + size].chunks_exact(64).find(|w| {
            let mut seen = [false; 256];
            w.iter().for_each(|&b| seen[b as usize] = true);
            seen.iter().filter(|&&s| s).count() >= 40
        }) {
            return w.try_into().unwrap();
        }
    }
    panic!("the test guest's kernel has no executable segment of varied bytes");
}

/// The files of `dir` that hold `needle` anywhere.
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if !e.file_type().unwrap().is_file() {
            continue;
        }
        let data = std::fs::read(e.path()).unwrap();
        if data.windows(needle.len()).any(|w| w == needle) {
            found.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// The page-file indexes of a sealed snapshot's written pages (its non-zero tags).
pub fn sealed_pages(snap: &Path) -> Vec<u64> {
    let tags = std::fs::read(snap.join("memory.tags")).unwrap();
    tags.chunks_exact(TAG)
        .enumerate()
        .filter(|(_, t)| t.iter().any(|&b| b != 0))
        .map(|(i, _)| i as u64)
        .collect()
}

fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Flips bit `bit` of the byte at `offset` of `path` (twice restores it).
pub fn flip_bit(path: &Path, offset: u64, bit: u8) {
    let f = open_rw(path);
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 1 << bit;
    f.write_all_at(&b, offset).unwrap();
}

/// Swaps pages `a` and `b` of the page file `path` (twice restores them).
pub fn swap_pages(path: &Path, a: u64, b: u64) {
    let f = open_rw(path);
    let (mut pa, mut pb) = (vec![0u8; PAGE as usize], vec![0u8; PAGE as usize]);
    f.read_exact_at(&mut pa, a * PAGE).unwrap();
    f.read_exact_at(&mut pb, b * PAGE).unwrap();
    f.write_all_at(&pb, a * PAGE).unwrap();
    f.write_all_at(&pa, b * PAGE).unwrap();
}

/// Swaps the tags of pages `a` and `b` in `memory.tags` (twice restores them).
pub fn swap_tags(snap: &Path, a: u64, b: u64) {
    let f = open_rw(&snap.join("memory.tags"));
    let (mut ta, mut tb) = ([0u8; TAG], [0u8; TAG]);
    f.read_exact_at(&mut ta, a * TAG as u64).unwrap();
    f.read_exact_at(&mut tb, b * TAG as u64).unwrap();
    f.write_all_at(&tb, a * TAG as u64).unwrap();
    f.write_all_at(&ta, b * TAG as u64).unwrap();
}

/// `farvm snapshot --socket SOCK [--key-file KEY] DIR` (the binary `farvm`).
pub fn snapshot(farvm: &Path, sock: &Path, dir: &Path, key: Option<&Path>) -> std::process::Output {
    let mut c = std::process::Command::new(farvm);
    c.arg("snapshot").arg("--socket").arg(sock);
    if let Some(k) = key {
        c.arg("--key-file").arg(k);
    }
    c.arg(dir).output().unwrap()
}

/// `farvm run --restore SNAP [--snapshot-key-file KEY]` (the binary `farvm`), JSON report,
/// no console or control socket.
pub fn restore(farvm: &Path, snap: &Path, key: Option<&Path>) -> std::process::Output {
    let mut c = std::process::Command::new(farvm);
    c.arg("run").arg("--restore").arg(snap);
    if let Some(k) = key {
        c.arg("--snapshot-key-file").arg(k);
    }
    c.args(["--serial", "none", "--json", "--no-control-socket"])
        .output()
        .unwrap()
}

/// [`restore`]'s exit status and stderr, for a restore expected to be refused before the VM
/// runs.
pub fn refused_restore(farvm: &Path, snap: &Path, key: Option<&Path>) -> (Option<i32>, String) {
    let o = restore(farvm, snap, key);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}
