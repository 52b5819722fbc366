//! Checking an initrd before the guest gets it: the kernel takes an initramfs (a cpio archive,
//! possibly compressed, possibly several concatenated) or an old-style initrd (a filesystem
//! image it mounts), and silently boots without one — to hang looking for its root — when
//! handed anything else. So farvm looks at the first bytes and refuses what no kernel could use.

use super::BootError;

/// What the first bytes of an initrd are, as the kernel's unpacker (`init/initramfs.c`,
/// `lib/decompress.c`) and its old-initrd loader (`init/do_mounts_rd.c`) recognise them.
const MAGICS: &[(&[u8], &str)] = &[
    (b"070701", "cpio (newc)"),
    (b"070702", "cpio (newc, with checksums)"),
    (b"\x1f\x8b", "gzip"),
    (b"\x1f\x9e", "gzip (old)"),
    (b"BZh", "bzip2"),
    (b"\x5d\x00\x00", "lzma"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x89LZO", "lzo"),
    (b"\x02\x21\x4c\x18", "lz4"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"-rom1fs-", "romfs"),
    (b"hsqs", "squashfs"),
    (b"\x45\x3d\xcd\x28", "cramfs"),
];

/// Offset and value of the ext2/3/4 superblock magic (an old-style initrd image).
const EXT_MAGIC_AT: usize = 1024 + 56;
const EXT_MAGIC: &[u8] = &[0x53, 0xef];

/// What `initrd` is (see [`MAGICS`]); an error naming its first bytes if the kernel could use
/// none of it. Leading zero bytes are skipped, as the kernel's unpacker does between archives.
pub fn check(initrd: &[u8]) -> Result<&'static str, BootError> {
    let start = initrd.iter().position(|&b| b != 0).unwrap_or(initrd.len());
    let rest = &initrd[start..];
    if rest.is_empty() {
        return Err(BootError::BadInitrd(match initrd.len() {
            0 => "it is empty".to_owned(),
            n => format!("its {n} bytes are all zeros"),
        }));
    }
    if let Some((_, kind)) = MAGICS.iter().find(|(m, _)| rest.starts_with(m)) {
        return Ok(kind);
    }
    if initrd.get(EXT_MAGIC_AT..EXT_MAGIC_AT + 2) == Some(EXT_MAGIC) {
        return Ok("ext2/3/4 image");
    }
    let head: Vec<String> = rest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Err(BootError::BadInitrd(format!(
        "it is neither an initramfs (a cpio archive, plain or compressed with gzip, \
         bzip2, lzma, xz, lzo, lz4 or zstd) nor a filesystem image the kernel can mount: it \
         starts with {} at byte {start}",
        head.join(" ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_and_images_the_kernel_takes_pass() {
        assert_eq!(check(b"070701000000").unwrap(), "cpio (newc)");
        assert_eq!(check(b"\0\0\0\0\x1f\x8b\x08").unwrap(), "gzip");
        assert_eq!(check(b"\x28\xb5\x2f\xfd\x00").unwrap(), "zstd");
        let mut ext = vec![0u8; 2048];
        ext[EXT_MAGIC_AT..EXT_MAGIC_AT + 2].copy_from_slice(EXT_MAGIC);
        ext[0] = 1;
        assert_eq!(check(&ext).unwrap(), "ext2/3/4 image");
    }

    #[test]
    fn anything_else_is_refused_naming_its_first_bytes() {
        let e = check(b"hello world").unwrap_err().to_string();
        assert!(e.contains("68 65 6c 6c 6f 20 77 6f at byte 0"), "{e}");
        let e = check(&[0u8; 64]).unwrap_err().to_string();
        assert!(e.contains("all zeros"), "{e}");
    }
}
