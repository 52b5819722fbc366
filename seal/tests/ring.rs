//! Key rotation at the sealer level: after a rotation new pages are sealed under the new key
//! and pages of both keys open; a second rotation is refused until the previous key is
//! dropped; after the drop a page under the old key is refused as `UnknownKey` (not as a
//! forgery), and a page re-sealed under the new key still opens.

use std::sync::Arc;

use farvm_seal::{KeyRing, OpenError, PageAddr, PageKey, RingSealer, RotateError, PAGE_SIZE};

fn addr(page: u64) -> PageAddr {
    PageAddr {
        namespace: 7,
        page,
        version: 100 + page,
    }
}

fn content(page: u64) -> [u8; PAGE_SIZE] {
    [page as u8 ^ 0x5a; PAGE_SIZE]
}

#[test]
fn a_rotation_seals_under_the_new_key_opens_both_and_drops_the_old_one() {
    let old = PageKey::from_bytes([1; 32]);
    let new = PageKey::from_bytes([2; 32]);
    let ring = Arc::new(KeyRing::new(old.clone()));
    let mut writer = RingSealer::new(ring.clone()).unwrap();
    let mut reader = RingSealer::new(ring.clone()).unwrap();

    let mut before = content(1);
    let seal_before = writer.sealer().unwrap().seal(addr(1), &mut before).unwrap();
    assert_eq!(seal_before.key_id(), old.id());

    assert!(!ring.rotating());
    assert_eq!(ring.rotate(new.clone()), Ok(old.id()));
    assert!(ring.rotating());
    assert!(ring.settled_key().is_err(), "pages may be under either key");
    let state = ring.state();
    assert_eq!((state.current, state.previous), (new.id(), Some(old.id())));
    let mut after = content(2);
    let seal_after = writer.sealer().unwrap().seal(addr(2), &mut after).unwrap();
    assert_eq!(seal_after.key_id(), new.id(), "new pages: the new key");

    let mut page = before;
    reader
        .sealer()
        .unwrap()
        .open(addr(1), &mut page, &seal_before)
        .unwrap();
    assert_eq!(page, content(1), "the old key's page still opens");
    let mut page = after;
    reader
        .sealer()
        .unwrap()
        .open(addr(2), &mut page, &seal_after)
        .unwrap();
    assert_eq!(page, content(2));

    assert_eq!(
        ring.rotate(PageKey::from_bytes([3; 32])),
        Err(RotateError::InProgress {
            previous: old.id(),
            current: new.id()
        }),
        "one rotation at a time"
    );

    // Re-seal page 1 under the new key, then drop the old key.
    let mut resealed = content(1);
    let seal_resealed = writer
        .sealer()
        .unwrap()
        .seal(addr(1), &mut resealed)
        .unwrap();
    assert_eq!(ring.drop_previous(), Some(old.id()));
    assert_eq!(ring.state().previous, None);
    assert!(!ring.rotating());
    assert_eq!(ring.settled_key().unwrap().id(), new.id());
    assert_eq!(ring.drop_previous(), None);

    let mut page = before;
    assert_eq!(
        reader
            .sealer()
            .unwrap()
            .open(addr(1), &mut page, &seal_before),
        Err(OpenError::UnknownKey(old.id())),
        "after the drop a page under the old key is refused by its key id"
    );
    assert_eq!(page, [0; PAGE_SIZE], "and wiped");
    let mut page = resealed;
    reader
        .sealer()
        .unwrap()
        .open(addr(1), &mut page, &seal_resealed)
        .unwrap();
    assert_eq!(page, content(1), "the re-sealed copy opens");

    assert_eq!(
        ring.rotate(new.clone()),
        Err(RotateError::SameKey(new.id()))
    );
    assert_eq!(ring.rotate(PageKey::from_bytes([3; 32])), Ok(new.id()));
}
