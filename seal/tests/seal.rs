//! Sealing round trips, and every tamper the memory server (or the path to it) could try is
//! detected: a flipped bit in the page or its seal, another page number, another namespace,
//! an older version, another key, another sealer's salt; and no plaintext survives sealing.

use farvm_seal::{OpenError, PageAddr, PageKey, PageSealer, Seal, PAGE_SIZE, SEAL_LEN};
use proptest::prelude::*;

const ADDR: PageAddr = PageAddr {
    namespace: 0x00ff_0001,
    page: 0x4_2000,
    version: 9,
};

fn key(b: u8) -> PageKey {
    PageKey::from_bytes([b; 32])
}

fn sealer(b: u8) -> PageSealer {
    PageSealer::new(&key(b)).expect("OS RNG")
}

/// A page with content that depends on every byte position.
fn page(seed: u8) -> [u8; PAGE_SIZE] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
}

/// Seals `plain` for `addr`; returns the sealed bytes and the seal.
fn sealed(s: &mut PageSealer, addr: PageAddr, plain: &[u8; PAGE_SIZE]) -> ([u8; PAGE_SIZE], Seal) {
    let mut p = *plain;
    let seal = s.seal(addr, &mut p).expect("fresh sealer");
    (p, seal)
}

/// Opens a copy, asserting the error, and that the page was wiped.
fn rejected(
    s: &mut PageSealer,
    addr: PageAddr,
    sealed: &[u8; PAGE_SIZE],
    seal: &Seal,
) -> OpenError {
    let mut p = *sealed;
    let err = s
        .open(addr, &mut p, seal)
        .expect_err("tampered page opened");
    assert_eq!(p, [0u8; PAGE_SIZE], "a rejected page is wiped");
    err
}

#[test]
fn round_trip() {
    let mut s = sealer(1);
    let plain = page(3);
    let (mut p, seal) = sealed(&mut s, ADDR, &plain);
    assert_ne!(p, plain, "sealing changed the page");
    s.open(ADDR, &mut p, &seal).expect("authentic");
    assert_eq!(p, plain);
}

#[test]
fn each_seal_uses_a_new_nonce() {
    // Sealing the same content at the same address twice gives other bytes: a new nonce.
    let mut s = sealer(1);
    let (a, sa) = sealed(&mut s, ADDR, &page(0));
    let (b, sb) = sealed(&mut s, ADDR, &page(0));
    assert_ne!(a, b);
    assert_ne!(sa, sb);
    for (mut p, seal) in [(a, sa), (b, sb)] {
        s.open(ADDR, &mut p, &seal).expect("both authentic");
        assert_eq!(p, page(0));
    }
}

#[test]
fn every_flipped_bit_of_the_page_is_detected() {
    let mut s = sealer(1);
    let (p, seal) = sealed(&mut s, ADDR, &page(5));
    for bit in 0..PAGE_SIZE * 8 {
        let mut t = p;
        t[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            rejected(&mut s, ADDR, &t, &seal),
            OpenError::Forged,
            "bit {bit}"
        );
    }
}

#[test]
fn every_flipped_bit_of_the_seal_is_detected() {
    let mut s = sealer(1);
    let (p, seal) = sealed(&mut s, ADDR, &page(5));
    for bit in 0..SEAL_LEN * 8 {
        let mut t = seal;
        t.0[bit / 8] ^= 1 << (bit % 8);
        let err = rejected(&mut s, ADDR, &p, &t);
        // A flip in the key id names a key the sealer does not hold; anywhere else (salt,
        // counter, tag) the tag no longer matches.
        if bit < 32 {
            assert_eq!(err, OpenError::UnknownKey(t.key_id()), "bit {bit}");
        } else {
            assert_eq!(err, OpenError::Forged, "bit {bit}");
        }
    }
}

#[test]
fn another_page_number_is_detected() {
    let mut s = sealer(1);
    let other = PageAddr {
        page: ADDR.page + 1,
        ..ADDR
    };
    let (p, seal) = sealed(&mut s, other, &page(1));
    assert_eq!(rejected(&mut s, ADDR, &p, &seal), OpenError::Forged);
}

#[test]
fn another_namespace_is_detected() {
    // Another VM sharing the key file (or the same VM's other namespace): the same page number
    // and version in another namespace does not open.
    let mut s = sealer(1);
    let other = PageAddr {
        namespace: ADDR.namespace + 1,
        ..ADDR
    };
    let (p, seal) = sealed(&mut s, other, &page(1));
    assert_eq!(rejected(&mut s, ADDR, &p, &seal), OpenError::Forged);
}

#[test]
fn an_older_version_is_detected() {
    let mut s = sealer(1);
    let old = PageAddr {
        version: ADDR.version - 1,
        ..ADDR
    };
    let (p_old, seal_old) = sealed(&mut s, old, &page(1));
    let (mut p_new, seal_new) = sealed(&mut s, ADDR, &page(2));
    // The server replays the older copy when the VMM expects the newer one.
    assert_eq!(rejected(&mut s, ADDR, &p_old, &seal_old), OpenError::Forged);
    s.open(ADDR, &mut p_new, &seal_new)
        .expect("the current version");
    assert_eq!(p_new, page(2));
}

#[test]
fn a_page_of_another_key_is_detected() {
    // Another VM's page (its own key), even at the very same address.
    let (p, seal) = sealed(&mut sealer(2), ADDR, &page(1));
    let err = rejected(&mut sealer(1), ADDR, &p, &seal);
    assert_eq!(err, OpenError::UnknownKey(key(2).id()));
    // The same, with the other key's id forged into the seal: the tag does not match.
    let mut forged = seal;
    forged.0[..4].copy_from_slice(&key(1).id().0);
    assert_eq!(
        rejected(&mut sealer(1), ADDR, &p, &forged),
        OpenError::Forged
    );
}

#[test]
fn swapped_seals_are_detected() {
    // Two genuine pages of the same sealer and address, each with the other's seal.
    let mut s = sealer(1);
    let (a, sa) = sealed(&mut s, ADDR, &page(1));
    let (b, sb) = sealed(&mut s, ADDR, &page(2));
    assert_eq!(rejected(&mut s, ADDR, &a, &sb), OpenError::Forged);
    assert_eq!(rejected(&mut s, ADDR, &b, &sa), OpenError::Forged);
}

#[test]
fn sealers_under_one_key_open_each_others_pages() {
    // The fault thread opens what the evictor sealed; a restarted VMM with the same key file
    // opens what the previous run sealed. Each has its own salt, so its own nonces.
    let k = key(7);
    let mut evictor = PageSealer::new(&k).expect("OS RNG");
    let mut faulter = PageSealer::new(&k).expect("OS RNG");
    let (a, sa) = sealed(&mut evictor, ADDR, &page(1));
    let (b, sb) = sealed(&mut faulter, ADDR, &page(1));
    assert_ne!(
        a, b,
        "same content, same address, other sealer: other bytes"
    );
    for _ in 0..2 {
        // Twice: the second open uses the subkey kept from the first.
        let mut p = a;
        faulter.open(ADDR, &mut p, &sa).expect("the evictor's page");
        assert_eq!(p, page(1));
    }
    let mut p = b;
    evictor
        .open(ADDR, &mut p, &sb)
        .expect("the fault thread's page");
    assert_eq!(p, page(1));
}

#[test]
fn after_rotation_old_pages_open_with_the_old_key() {
    let (old, new) = (key(1), key(2));
    let (p, seal) = sealed(&mut PageSealer::new(&old).expect("OS RNG"), ADDR, &page(4));
    let mut s = PageSealer::new(&new).expect("OS RNG");
    assert_eq!(seal.key_id(), old.id());
    assert_eq!(
        rejected(&mut s, ADDR, &p, &seal),
        OpenError::UnknownKey(old.id())
    );
    s.add_opening_key(&old);
    let mut q = p;
    s.open(ADDR, &mut q, &seal)
        .expect("opened with the old key");
    assert_eq!(q, page(4));
    // New pages are still sealed under the new key.
    assert_eq!(sealed(&mut s, ADDR, &page(4)).1.key_id(), new.id());
}

#[test]
fn a_sealed_page_holds_no_copy_of_a_plaintext_marker() {
    // The marker a test VM writes into every page; sealed, no 64-byte window of any page may
    // equal it, nor any 16-byte piece of it (a block-sized leak, as ECB would show).
    let marker: [u8; 64] = std::array::from_fn(|i| b"farvm-seal marker "[i % 18] ^ i as u8);
    let plain: [u8; PAGE_SIZE] = std::array::from_fn(|i| marker[i % 64]);
    let mut s = sealer(1);
    let mut store = Vec::new();
    for n in 0..64 {
        let (p, seal) = sealed(&mut s, PageAddr { page: n, ..ADDR }, &plain);
        store.extend_from_slice(&p);
        store.extend_from_slice(&seal.0);
    }
    for piece in marker.chunks(16).chain([&marker[..]]) {
        assert!(
            !store.windows(piece.len()).any(|w| w == piece),
            "the store holds plaintext"
        );
    }
    // And identical plaintext pages seal to distinct ciphertexts.
    let first = &store[..PAGE_SIZE];
    let second = &store[PAGE_SIZE + SEAL_LEN..2 * PAGE_SIZE + SEAL_LEN];
    assert_ne!(first, second);
}

#[test]
fn debug_never_prints_the_key() {
    let k = PageKey::from_bytes([0xab; 32]);
    let text = format!("{k:?} {:?}", PageSealer::new(&k).expect("OS RNG"));
    assert!(!text.to_lowercase().contains("abab"), "{text}");
    assert!(text.contains(&k.id().to_string()), "{text}");
}

fn any_page() -> impl Strategy<Value = [u8; PAGE_SIZE]> {
    proptest::collection::vec(any::<u8>(), PAGE_SIZE)
        .prop_map(|v| v.try_into().expect("PAGE_SIZE bytes"))
}

fn any_addr() -> impl Strategy<Value = PageAddr> {
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(namespace, page, version)| PageAddr {
        namespace,
        page,
        version,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_pages_round_trip(plain in any_page(), addr in any_addr()) {
        let mut s = sealer(9);
        let (mut p, seal) = sealed(&mut s, addr, &plain);
        s.open(addr, &mut p, &seal).expect("authentic");
        prop_assert_eq!(p, plain);
    }

    #[test]
    fn random_flips_are_detected(
        plain in any_page(),
        addr in any_addr(),
        pos in 0..PAGE_SIZE + SEAL_LEN,
        mask in 1u8..=255,
    ) {
        let mut s = sealer(9);
        let (mut p, mut seal) = sealed(&mut s, addr, &plain);
        if pos < PAGE_SIZE {
            p[pos] ^= mask;
        } else {
            seal.0[pos - PAGE_SIZE] ^= mask;
        }
        let mut q = p;
        prop_assert!(s.open(addr, &mut q, &seal).is_err());
        prop_assert_eq!(q, [0u8; PAGE_SIZE]);
    }

    #[test]
    fn random_other_addresses_are_detected(
        plain in any_page(),
        addr in any_addr(),
        other in any_addr(),
    ) {
        prop_assume!(addr != other);
        let mut s = sealer(9);
        let (mut p, seal) = sealed(&mut s, other, &plain);
        prop_assert_eq!(s.open(addr, &mut p, &seal), Err(OpenError::Forged));
    }
}

/// The construction is pinned: pages stored by one build must open in the next. A change to
/// the key id, the subkey derivation, the nonce, the associated data or the cipher shows here.
#[test]
fn the_construction_is_pinned() {
    let k = PageKey::from_bytes(std::array::from_fn(|i| i as u8));
    let mut s = PageSealer::with_salt(&k, [0xa5; farvm_seal::SALT_LEN]);
    s.seal(ADDR, &mut [0u8; PAGE_SIZE]).expect("fresh sealer");
    let mut p = [0u8; PAGE_SIZE];
    let seal = s.seal(ADDR, &mut p).expect("fresh sealer");
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&seal.0),
        "2e2d23fba5a5a5a5a5a5a5a5a5a5a5a501000000000000006567a94d5283eaa4b54cf286085d5c66"
    );
    assert_eq!(
        hex(&p[..32]),
        "693e063d2629709e3eabaef1760e28375e7b4320b380d62c0959d39ac40c21d5"
    );
    s.open(ADDR, &mut p, &seal).expect("authentic");
    assert_eq!(p, [0u8; PAGE_SIZE]);
}

/// The construction the crate doc states, rebuilt from other implementations (RustCrypto's
/// HMAC-SHA256 and AES-256-GCM): key id = HMAC(key, "farvm-seal v1 key id")[..4]; subkey =
/// HKDF-SHA256(key, salt, "farvm-seal v1 aes-256-gcm page subkey"); nonce = counter (u64 LE)
/// then 4 zero bytes; associated data = namespace, page, version (u64 LE each).
#[test]
fn the_construction_is_the_documented_one() {
    use aes_gcm::aead::{AeadInOut, KeyInit};
    use hmac::{Hmac, Mac};
    let hmac = |key: &[u8], msg: &[&[u8]]| -> [u8; 32] {
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("any key length");
        for part in msg {
            m.update(part);
        }
        m.finalize().into_bytes().into()
    };
    let key: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
    let salt = [0x3c; farvm_seal::SALT_LEN];
    let mut s = PageSealer::with_salt(&PageKey::from_bytes(key), salt);
    for counter in 0u64..3 {
        let plain = page(counter as u8);
        let (p, seal) = sealed(&mut s, ADDR, &plain);

        let key_id = &hmac(&key, &[b"farvm-seal v1 key id"])[..4];
        let prk = hmac(&salt, &[&key]);
        let subkey = hmac(&prk, &[b"farvm-seal v1 aes-256-gcm page subkey", &[1]]);
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&counter.to_le_bytes());
        let mut aad = Vec::new();
        for v in [ADDR.namespace, ADDR.page, ADDR.version] {
            aad.extend_from_slice(&v.to_le_bytes());
        }
        let mut want = plain;
        let tag = aes_gcm::Aes256Gcm::new(&subkey.into())
            .encrypt_inout_detached(&nonce.into(), &aad, want.as_mut_slice().into())
            .expect("a page");

        assert_eq!(p, want, "ciphertext");
        assert_eq!(&seal.0[..4], key_id, "key id");
        assert_eq!(&seal.0[4..16], &salt, "salt");
        assert_eq!(&seal.0[16..24], &counter.to_le_bytes(), "counter");
        assert_eq!(&seal.0[24..], tag.as_slice(), "tag");
    }
}
