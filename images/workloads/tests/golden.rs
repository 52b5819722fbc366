//! Pins every workload's checksum at small sizes: the guest and the native build must agree bit
//! for bit, and so must every build over time (a change here means results are no longer
//! comparable with earlier runs: update the values only on purpose).

use farvm_workloads::{parse_spec, run, Env};

struct Clock(u64);
impl Env for Clock {
    fn now_ns(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

const GOLDEN: &[(&str, u64)] = &[
    ("seq:ws=1M,seed=7", 0xc0589506e2feab74),
    ("seq:ws=1M,seed=7,write=1", 0x5f20f8ba2f46be62),
    ("stride:ws=1M,seed=7,stride=4096", 0x55e2e5e7950d80e5),
    ("random:ws=1M,seed=7,ops=100000", 0x22f913b05f8d5ae1),
    ("matmul:ws=1M,seed=7,n=64", 0x8862763c6616f22d),
    // Same k order per element as the naive loops, so the same bits.
    (
        "matmul-blocked:ws=1M,seed=7,n=64,block=16",
        0x8862763c6616f22d,
    ),
    ("kv:ws=1M,seed=7,ops=100000", 0x37c082ce636d3689),
    ("pagerank:ws=1M,seed=7,iters=3", 0x67fbb9af4bc5f86c),
    ("quicksort:ws=1M,seed=7", 0x45a646a7fff3b1e1),
    ("sparse:ws=4M,seed=7,pages=100,passes=3", 0x95eee9dacb759ca6),
    ("isolation:ws=64K,seed=7", 0x97939bb822c5a9b2),
    ("intops:seed=7,iters=1000000", 0xa0c6f3516ab8456c),
];

#[test]
fn checksums_are_pinned() {
    let mut bad = Vec::new();
    for &(s, want) in GOLDEN {
        let spec = parse_spec(s).unwrap();
        let mut heap = vec![0u64; (spec.ws_bytes / 8) as usize];
        let got = run(spec.workload.id, &spec.params(), &mut heap, &mut Clock(0))
            .unwrap()
            .checksum;
        if got != want {
            bad.push(format!("    (\"{s}\", {got:#018x}),"));
        }
    }
    assert!(bad.is_empty(), "checksums changed:\n{}", bad.join("\n"));
}
