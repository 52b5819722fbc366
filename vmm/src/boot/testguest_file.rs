//! The test guest as a kernel *file*: recognising it by its ELF note
//! (`farvm_guest_agent::boot::note`) and reading its workloads from a kernel command line
//! (`farvm.workload=SPEC`, the `--workload` syntax), so a kernel path plus a command line — what
//! libvirt's `<kernel>` and `<cmdline>` hand a VMM — is enough to run a test plan.

use farvm_guest_agent::boot::note::{NAME, TYPE_TEST_GUEST};

const PT_NOTE: u32 = 4;

/// The command-line key that adds one workload process (repeatable).
pub const WORKLOAD_KEY: &str = "farvm.workload";

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?)).ok()
}

/// The ABI version in the test-guest note of `image`, or `None` when `image` is not an ELF64
/// file carrying that note (any other kernel). Never panics on malformed input.
pub fn test_guest_abi(image: &[u8]) -> Option<u32> {
    if image.get(..4)? != b"\x7fELF" || image.get(4)? != &2 || image.get(5)? != &1 {
        return None;
    }
    let phoff = u64_at(image, 32)?;
    let phentsize = usize::from(u16_at(image, 54)?);
    let phnum = usize::from(u16_at(image, 56)?);
    if phentsize < 56 {
        return None;
    }
    (0..phnum).find_map(|i| {
        let h = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(image, h)? != PT_NOTE {
            return None;
        }
        let off = u64_at(image, h + 8)?;
        let len = u64_at(image, h + 32)?;
        find_note(image.get(off..off.checked_add(len)?)?)
    })
}

/// Is `image` the farvm test guest (of any ABI version)?
pub fn is_test_guest(image: &[u8]) -> bool {
    test_guest_abi(image).is_some()
}

/// Walks the notes of one PT_NOTE segment (4-byte aligned entries) for the test-guest note.
fn find_note(mut notes: &[u8]) -> Option<u32> {
    let pad4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let namesz = u32_at(notes, 0)? as usize;
        let descsz = u32_at(notes, 4)? as usize;
        let n_type = u32_at(notes, 8)?;
        let desc_at = 12usize.checked_add(pad4(namesz)?)?;
        let next = desc_at.checked_add(pad4(descsz)?)?;
        let name = notes.get(12..12 + namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if name == NAME && n_type == TYPE_TEST_GUEST && descsz == 4 {
            return u32_at(desc, 0);
        }
        notes = notes.get(next..)?;
    }
    None
}

/// The workload specs named by `farvm.workload=SPEC` words of a kernel command line, in order.
/// Words not starting with `farvm.` are left to the guest (ignored here); any other `farvm.`
/// key is an error, so a misspelt key does not silently run nothing.
pub fn workloads_from_cmdline(cmdline: &str) -> Result<Vec<String>, String> {
    let mut specs = Vec::new();
    for word in cmdline.split_ascii_whitespace() {
        if !word.starts_with("farvm.") {
            continue;
        }
        let (key, spec) = word.split_once('=').unwrap_or((word, ""));
        if key != WORKLOAD_KEY {
            return Err(format!(
                "kernel command line: unknown key in `{word}` (the test guest reads only \
                 {WORKLOAD_KEY}=SPEC)"
            ));
        }
        if spec.is_empty() {
            return Err(format!("kernel command line: `{word}` names no workload"));
        }
        specs.push(spec.to_string());
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::elf::build_test_elf;

    /// `build_test_elf` plus a PT_NOTE segment holding `notes`.
    fn elf_with_notes(notes: &[u8]) -> Vec<u8> {
        let mut f = build_test_elf(&[0xf4], 0x100000, 0x100000);
        let at = f.len() as u64;
        f.extend_from_slice(notes);
        // A second program header right after the first (the header area is zero-filled).
        let ph = 64 + 56;
        f[56..58].copy_from_slice(&2u16.to_le_bytes());
        f[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        f[ph + 8..ph + 16].copy_from_slice(&at.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&(notes.len() as u64).to_le_bytes());
        f
    }

    fn note_bytes(name: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(name.len() as u32).to_le_bytes());
        v.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        v.extend_from_slice(&n_type.to_le_bytes());
        v.extend_from_slice(name);
        v.resize(v.len().next_multiple_of(4), 0);
        v.extend_from_slice(desc);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    #[test]
    fn the_builtin_test_guest_carries_the_note() {
        let elf = crate::builtin::test_guest_elf();
        assert_eq!(test_guest_abi(elf), Some(farvm_guest_agent::ABI_VERSION));
    }

    #[test]
    fn the_note_is_found_after_other_notes() {
        let mut notes = note_bytes(b"GNU\0", 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        notes.extend(note_bytes(NAME, TYPE_TEST_GUEST, &7u32.to_le_bytes()));
        assert_eq!(test_guest_abi(&elf_with_notes(&notes)), Some(7));
    }

    #[test]
    fn other_kernels_are_not_the_test_guest() {
        assert!(!is_test_guest(&build_test_elf(&[0xf4], 0x100000, 0x100000)));
        let other = note_bytes(b"Linux\0", TYPE_TEST_GUEST, &1u32.to_le_bytes());
        assert!(!is_test_guest(&elf_with_notes(&other)));
        let wrong_type = note_bytes(NAME, 2, &1u32.to_le_bytes());
        assert!(!is_test_guest(&elf_with_notes(&wrong_type)));
        assert!(!is_test_guest(b"\x7fELF"));
        assert!(!is_test_guest(&[]));
    }

    #[test]
    fn truncated_notes_do_not_panic() {
        let good = elf_with_notes(&note_bytes(NAME, TYPE_TEST_GUEST, &1u32.to_le_bytes()));
        for cut in 0..good.len() {
            let _ = test_guest_abi(&good[..cut]);
        }
        let mut huge = good.clone();
        let ph = 64 + 56;
        huge[ph + 32..ph + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(test_guest_abi(&huge), None);
    }

    #[test]
    fn cmdline_workloads_in_order() {
        let w = workloads_from_cmdline(
            "console=ttyS0 farvm.workload=seq:ws=32M quiet farvm.workload=kv:cpu=1",
        )
        .unwrap();
        assert_eq!(w, vec!["seq:ws=32M", "kv:cpu=1"]);
        assert!(workloads_from_cmdline("").unwrap().is_empty());
    }

    #[test]
    fn cmdline_errors_name_the_word() {
        let e = workloads_from_cmdline("farvm.workload=").unwrap_err();
        assert!(e.contains("names no workload"), "{e}");
        let e = workloads_from_cmdline("farvm.workload").unwrap_err();
        assert!(e.contains("names no workload"), "{e}");
        let e = workloads_from_cmdline("farvm.workloads=seq").unwrap_err();
        assert!(
            e.contains("farvm.workloads=seq") && e.contains("unknown key"),
            "{e}"
        );
    }
}
