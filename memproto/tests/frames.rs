//! Property tests of the frame codec: every frame type round-trips, and arbitrary bytes never
//! make the decoder panic (the same property the cargo-fuzz target checks).

use farvm_memproto::frame::{
    decode, encode, encode_error, Body, Frame, Opcode, PageSel, HEADER_LEN, MAX_BODY, WIRE_PAGE,
};
use farvm_memproto::{StatInfo, Status, MAX_PAGES_PER_FRAME};
use proptest::prelude::*;

fn status() -> impl Strategy<Value = Status> {
    (1u8..=7).prop_map(|v| Status::from_u8(v).unwrap())
}

#[derive(Debug, Clone)]
enum Owned {
    Challenge([u8; 32], u8),
    Hello([u8; 8], [u8; 32], [u8; 32]),
    HelloResp([u8; 32]),
    Read(Option<u64>, Vec<u64>),
    Write(Option<u64>, Vec<u64>, Vec<u8>, bool),
    Discard(Option<u64>, Vec<u64>),
    Stat,
    ReadResp(u32, Vec<bool>, Vec<u8>),
    WriteResp(u32),
    DiscardResp(u32),
    StatResp(u64, u64, u64, u64),
    Error(Status, String),
}

fn sel_strategy() -> impl Strategy<Value = (Option<u64>, Vec<u64>)> {
    prop_oneof![
        (0u64..u64::MAX - 512, 1usize..=MAX_PAGES_PER_FRAME)
            .prop_map(|(s, n)| (Some(s), (0..n as u64).map(|i| s + i).collect())),
        prop::collection::vec(any::<u64>(), 1..=MAX_PAGES_PER_FRAME).prop_map(|v| (None, v)),
    ]
}

fn owned() -> impl Strategy<Value = Owned> {
    prop_oneof![
        (any::<[u8; 32]>(), any::<u8>()).prop_map(|(a, b)| Owned::Challenge(a, b)),
        (any::<[u8; 8]>(), any::<[u8; 32]>(), any::<[u8; 32]>())
            .prop_map(|(a, b, c)| Owned::Hello(a, b, c)),
        any::<[u8; 32]>().prop_map(Owned::HelloResp),
        sel_strategy().prop_map(|(s, v)| Owned::Read(s, v)),
        (sel_strategy().prop_flat_map(|(s, v)| {
            let n = v.len().min(4);
            let v: Vec<u64> = v.into_iter().take(n).collect();
            let s2 = s;
            (
                Just(s2),
                Just(v),
                prop::collection::vec(any::<u8>(), n * WIRE_PAGE),
                any::<bool>(),
            )
        }))
        .prop_map(|(s, v, d, f)| Owned::Write(s, v, d, f)),
        sel_strategy().prop_map(|(s, v)| Owned::Discard(s, v)),
        Just(Owned::Stat),
        (1u32..=8)
            .prop_flat_map(|n| (Just(n), prop::collection::vec(any::<bool>(), n as usize)))
            .prop_flat_map(|(n, bits)| {
                let present = bits.iter().filter(|b| **b).count();
                (
                    Just(n),
                    Just(bits),
                    prop::collection::vec(any::<u8>(), present * WIRE_PAGE),
                )
            })
            .prop_map(|(n, b, d)| Owned::ReadResp(n, b, d)),
        (0u32..=256).prop_map(Owned::WriteResp),
        (0u32..=256).prop_map(Owned::DiscardResp),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(a, b, c, d)| Owned::StatResp(a, b, c, d)),
        (status(), "[ -~]{0,100}").prop_map(|(s, m)| Owned::Error(s, m)),
    ]
}

fn scatter_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_frame_round_trips(o in owned(), req_id in any::<u64>(), ns in any::<u64>()) {
        let mut buf = Vec::new();
        let sc;
        let bm;
        let mut if_absent = false;
        let body = match &o {
            Owned::Challenge(n, v) => Body::Challenge { server_nonce: *n, max_version: *v },
            Owned::Hello(k, n, m) => Body::Hello { key_id: *k, client_nonce: *n, mac: *m },
            Owned::HelloResp(m) => Body::HelloResp { server_mac: *m },
            Owned::Read(s, v) | Owned::Discard(s, v) | Owned::Write(s, v, _, _) => {
                sc = scatter_bytes(v);
                let sel = match s {
                    Some(st) => PageSel::Run { start: *st, count: v.len() as u32 },
                    None => PageSel::Scatter(&sc),
                };
                match &o {
                    Owned::Read(..) => Body::Read(sel),
                    Owned::Discard(..) => Body::Discard(sel),
                    Owned::Write(_, _, d, f) => { if_absent = *f; Body::Write { sel, pages: d } }
                    _ => unreachable!(),
                }
            }
            Owned::Stat => Body::Stat,
            Owned::ReadResp(n, bits, d) => {
                let mut b = vec![0u8; (*n as usize).div_ceil(8)];
                for (i, x) in bits.iter().enumerate() { if *x { b[i / 8] |= 1 << (i % 8); } }
                bm = b;
                Body::ReadResp { count: *n, bitmap: &bm, pages: d }
            }
            Owned::WriteResp(n) => Body::WriteResp { written: *n },
            Owned::DiscardResp(n) => Body::DiscardResp { freed: *n },
            Owned::StatResp(a, b, c, d) => Body::StatResp(StatInfo { namespace_pages: *a, used_pages: *b, capacity_pages: *c, instance: *d }),
            Owned::Error(s, m) => Body::Error { status: *s, message: m },
        };
        let f = Frame { req_id, namespace: ns, body };
        if let Body::Error { status, message } = f.body {
            encode_error(&mut buf, Opcode::Read, status, req_id, ns, message);
        } else {
            encode(&mut buf, &f, if_absent);
        }
        // A trailing frame must not be consumed.
        buf.extend_from_slice(b"trailing");
        let (g, used) = decode(&buf).expect("decodes");
        prop_assert_eq!(used, buf.len() - 8);
        prop_assert_eq!(g, f);
        // Every strict prefix is reported as truncated, never as a frame.
        for cut in [0, HEADER_LEN - 1, used - 1] {
            prop_assert!(decode(&buf[..cut]).is_err());
        }
    }

    /// The fuzz target's property: whatever the decoder accepts re-encodes to the same bytes.
    #[test]
    fn accepted_frames_are_canonical(
        start in any::<u64>(), n in 1u32..=3, scatter in any::<bool>(),
        flips in prop::collection::vec((0usize..64, any::<u8>()), 1..4)
    ) {
        let pages = vec![9u8; n as usize * WIRE_PAGE];
        let sc: Vec<u8> = (0..n as u64).flat_map(|i| (start ^ i).to_le_bytes()).collect();
        let sel = if scatter { PageSel::Scatter(&sc) } else { PageSel::Run { start: start.min(u64::MAX - 4), count: n } };
        let mut buf = Vec::new();
        encode(&mut buf, &Frame { req_id: 5, namespace: 6, body: Body::Write { sel, pages: &pages } }, false);
        // Mutate the header and the start of the body, where the structure lives.
        for (at, x) in flips { let i = at % buf.len(); buf[i] ^= x; }
        if let Ok((f, used)) = decode(&buf) {
            let mut out = Vec::new();
            if let Body::Error { status, message } = f.body {
                encode_error(&mut out, Opcode::Write, status, f.req_id, f.namespace, message);
                prop_assert_eq!(out.len(), used);
            } else {
                encode(&mut out, &f, buf[6] & farvm_memproto::frame::FLAG_IF_ABSENT != 0);
                prop_assert_eq!(&out[..], &buf[..used]);
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok((_, used)) = decode(&data) { prop_assert!(used <= data.len()); }
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        start in any::<u64>(), n in 1u32..=4, flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)
    ) {
        let pages = vec![7u8; n as usize * WIRE_PAGE];
        let f = Frame { req_id: 1, namespace: 2, body: Body::Write {
            sel: PageSel::Run { start: start.min(u64::MAX - 8), count: n }, pages: &pages } };
        let mut buf = Vec::new();
        encode(&mut buf, &f, false);
        for (at, x) in flips { let i = at % buf.len(); buf[i] ^= x; }
        if let Ok((_, used)) = decode(&buf) { prop_assert!(used <= buf.len() && used <= HEADER_LEN + MAX_BODY); }
    }
}

#[test]
fn limits_are_enforced() {
    // Count above the per-frame limit.
    let mut buf = Vec::new();
    let sc = vec![0u8; 8 * (MAX_PAGES_PER_FRAME + 1)];
    encode(
        &mut buf,
        &Frame {
            req_id: 0,
            namespace: 0,
            body: Body::Read(PageSel::Scatter(&sc)),
        },
        false,
    );
    assert!(decode(&buf).is_err());
    // Body length above MAX_BODY is rejected from the header alone.
    let mut h = buf[..HEADER_LEN].to_vec();
    h[28..32].copy_from_slice(&((MAX_BODY + 1) as u32).to_le_bytes());
    assert!(decode(&h).is_err());
    // A run that overflows u64.
    buf.clear();
    encode(
        &mut buf,
        &Frame {
            req_id: 0,
            namespace: 0,
            body: Body::Read(PageSel::Run {
                start: u64::MAX,
                count: 2,
            }),
        },
        false,
    );
    assert!(decode(&buf).is_err());
}
