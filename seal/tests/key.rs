//! Page keys: generation, the key file's two accepted forms and clear errors for anything
//! else, key ids, and that `Debug` never shows a key.

use std::io::Write;

use farvm_seal::{KeyError, PageKey};

const KEY: [u8; 32] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,
];
const HEX: &str = "00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210";

fn file(content: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(content).expect("write key file");
    f
}

fn load(content: &[u8]) -> Result<PageKey, KeyError> {
    PageKey::from_file(file(content).path())
}

#[test]
fn generated_keys_differ() {
    let a = PageKey::generate().expect("OS RNG");
    let b = PageKey::generate().expect("OS RNG");
    assert_ne!(a.id(), b.id());
}

#[test]
fn raw_and_hex_files_give_the_same_key() {
    let want = PageKey::from_bytes(KEY).id();
    for content in [
        KEY.to_vec(),
        HEX.as_bytes().to_vec(),
        HEX.to_uppercase().into_bytes(),
        format!("{HEX}\n").into_bytes(),
        format!("{HEX}\r\n").into_bytes(),
    ] {
        assert_eq!(load(&content).expect("a valid key file").id(), want);
    }
}

#[test]
fn anything_else_is_a_clear_error() {
    let cases: [(Vec<u8>, &str); 7] = [
        (Vec::new(), "0 bytes"),
        (KEY[..31].to_vec(), "31 bytes"),
        (vec![0u8; 33], "33 bytes"),
        (HEX.as_bytes()[..63].to_vec(), "63 bytes"),
        (format!("{HEX}\n\n").into_bytes(), "66 bytes"),
        (
            format!(" {}", &HEX[1..]).into_bytes(),
            "not hex at offset 0",
        ),
        (
            format!("{}g", &HEX[..63]).into_bytes(),
            "not hex at offset 63",
        ),
    ];
    for (content, want) in cases {
        let err = load(&content).expect_err("not a key file");
        let text = err.to_string();
        assert!(matches!(err, KeyError::Malformed { .. }), "{text}");
        assert!(text.contains(want), "{text:?} should say {want:?}");
        assert!(
            text.contains("exactly 32 raw bytes, or 64 hex digits"),
            "{text}"
        );
    }
}

#[test]
fn a_missing_file_names_the_path() {
    let err = PageKey::from_file("/nonexistent/farvm.key".as_ref()).expect_err("no such file");
    assert!(matches!(err, KeyError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/farvm.key"), "{err}");
}

#[test]
fn the_key_id_is_public_and_stable() {
    let k = PageKey::from_bytes(KEY);
    // Pinned: a key id written to logs or a seal today must mean the same key tomorrow.
    assert_eq!(k.id().to_string(), "8bcb3207");
    assert_eq!(k.id(), PageKey::from_bytes(KEY).id());
    assert_ne!(k.id(), PageKey::from_bytes([0; 32]).id());
    let debug = format!("{k:?}");
    assert!(!debug.contains("0011") && !debug.contains("[0,"), "{debug}");
    assert!(debug.contains(&k.id().to_string()), "{debug}");
}

#[test]
fn a_written_key_file_is_private_reads_back_as_the_same_key_and_is_never_overwritten() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("page.key");
    let key = PageKey::generate().unwrap();
    key.write_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(PageKey::from_file(&path).unwrap().id(), key.id());
    let other = PageKey::generate().unwrap();
    let err = other
        .write_file(&path)
        .expect_err("an existing file is kept");
    assert!(err.to_string().contains("cannot write key file"), "{err}");
    assert_eq!(PageKey::from_file(&path).unwrap().id(), key.id());
}

#[test]
fn a_key_file_others_can_read_is_refused_by_name() {
    use std::os::unix::fs::PermissionsExt as _;
    let f = file(HEX.as_bytes());
    for (mode, ok) in [(0o600, true), (0o400, true), (0o640, false), (0o604, false)] {
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        match PageKey::from_file(f.path()) {
            Ok(k) => assert!(
                ok && k.id() == PageKey::from_bytes(KEY).id(),
                "mode {mode:o}"
            ),
            Err(e) => {
                assert!(!ok, "mode {mode:o} refused: {e}");
                let text = e.to_string();
                assert!(matches!(e, KeyError::Exposed { .. }), "{text}");
                assert!(text.contains(&f.path().display().to_string()), "{text}");
                assert!(text.contains(&format!("{mode:04o}")), "{text}");
                assert!(text.contains("chmod 600"), "{text}");
            }
        }
    }
}
