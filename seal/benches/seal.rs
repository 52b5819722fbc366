//! Sealing and opening one 4 KiB page in place, and a batch of 32, with every AEAD candidate
//! side by side in one run: RustCrypto `aes-gcm` and `chacha20poly1305` (ChaCha20 and
//! XChaCha20), `ring` and `aws-lc-rs` (AES-256-GCM and ChaCha20-Poly1305), and
//! `farvm_seal::PageSealer` itself (the chosen one behind the crate's API: the wrapper's cost).
//!
//! `RUSTFLAGS="--cfg farvm_bench_aws_lc" cargo bench -p farvm-seal --bench seal` (without the
//! cfg, no aws-lc-rs rows: it builds AWS-LC with cmake). Criterion's report comes first, then one
//! markdown table (the one in docs/sealing.md, with the `-Ctarget-cpu=native` variant).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use farvm_seal::{PageAddr, PageKey, PageSealer, Seal, PAGE_SIZE, SALT_LEN, SEAL_LEN};

/// Pages in one batch: one memclient frame's worth of prefetch or write-back.
const BATCH: usize = 32;
/// A fixed key: the numbers do not depend on it.
const KEY: [u8; 32] = [0x5a; 32];
/// The associated data the crate binds: namespace, page number, version (24 bytes).
const AAD: [u8; 24] = [7; 24];

/// One AEAD under test: seal a page in place returning the tag, open it in place.
trait Candidate {
    /// The name in criterion's report and in docs/sealing.md.
    fn name(&self) -> &'static str;
    fn seal(&self, nonce: u64, page: &mut [u8]) -> [u8; 16];
    fn open(&self, nonce: u64, page: &mut [u8], tag: &[u8; 16]) -> bool;
}

/// A 96-bit nonce from a counter (the construction does not change the cost).
fn nonce12(n: u64) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[4..].copy_from_slice(&n.to_le_bytes());
    out
}

fn nonce24(n: u64) -> [u8; 24] {
    let mut out = [0x33u8; 24];
    out[16..].copy_from_slice(&n.to_le_bytes());
    out
}

mod rustcrypto {
    use aes_gcm::aead::{AeadInOut, KeyInit};

    pub struct AesGcm(pub aes_gcm::Aes256Gcm);
    pub struct ChaCha(pub chacha20poly1305::ChaCha20Poly1305);
    pub struct XChaCha(pub chacha20poly1305::XChaCha20Poly1305);

    impl AesGcm {
        pub fn new() -> Self {
            Self(aes_gcm::Aes256Gcm::new(&super::KEY.into()))
        }
    }
    impl ChaCha {
        pub fn new() -> Self {
            Self(chacha20poly1305::ChaCha20Poly1305::new(&super::KEY.into()))
        }
    }
    impl XChaCha {
        pub fn new() -> Self {
            Self(chacha20poly1305::XChaCha20Poly1305::new(&super::KEY.into()))
        }
    }

    macro_rules! candidate {
        ($ty:ty, $name:literal, $nonce:path) => {
            impl super::Candidate for $ty {
                fn name(&self) -> &'static str {
                    $name
                }
                fn seal(&self, nonce: u64, page: &mut [u8]) -> [u8; 16] {
                    let tag = self
                        .0
                        .encrypt_inout_detached(&$nonce(nonce).into(), &super::AAD, page.into())
                        .expect("a 4 KiB page is within every AEAD's limits");
                    tag.into()
                }
                fn open(&self, nonce: u64, page: &mut [u8], tag: &[u8; 16]) -> bool {
                    self.0
                        .decrypt_inout_detached(
                            &$nonce(nonce).into(),
                            &super::AAD,
                            page.into(),
                            &(*tag).into(),
                        )
                        .is_ok()
                }
            }
        };
    }
    candidate!(AesGcm, "rustcrypto-aes256gcm", super::nonce12);
    candidate!(ChaCha, "rustcrypto-chacha20poly1305", super::nonce12);
    candidate!(XChaCha, "rustcrypto-xchacha20poly1305", super::nonce24);
}

/// `ring` and `aws-lc-rs` share one API (`LessSafeKey`, `seal_in_place_separate_tag`).
macro_rules! ring_like {
    ($modname:ident, $krate:ident, $ty:ident, $alg:ident, $name:literal) => {
        mod $modname {
            use $krate::aead::{Aad, LessSafeKey, Nonce, UnboundKey};

            pub struct $ty(LessSafeKey);

            impl $ty {
                pub fn new() -> Self {
                    let key = UnboundKey::new(&$krate::aead::$alg, &super::KEY)
                        .expect("a 32-byte key");
                    Self(LessSafeKey::new(key))
                }
            }

            impl super::Candidate for $ty {
                fn name(&self) -> &'static str {
                    $name
                }
                fn seal(&self, nonce: u64, page: &mut [u8]) -> [u8; 16] {
                    let nonce = Nonce::assume_unique_for_key(super::nonce12(nonce));
                    let tag = self
                        .0
                        .seal_in_place_separate_tag(nonce, Aad::from(super::AAD), page)
                        .expect("a 4 KiB page is within every AEAD's limits");
                    let mut out = [0u8; 16];
                    out.copy_from_slice(tag.as_ref());
                    out
                }
                fn open(&self, nonce: u64, page: &mut [u8], tag: &[u8; 16]) -> bool {
                    let nonce = Nonce::assume_unique_for_key(super::nonce12(nonce));
                    ring_like!(@open $krate, self.0, nonce, page, tag)
                }
            }
        }
    };
    // ring takes the tag as `Tag` and the ciphertext as a range; aws-lc-rs takes `&[u8]`.
    (@open ring, $key:expr, $nonce:ident, $page:ident, $tag:ident) => {
        $key.open_in_place_separate_tag(
            $nonce,
            Aad::from(super::AAD),
            ring::aead::Tag::from(*$tag),
            $page,
            0..,
        )
        .is_ok()
    };
    (@open aws_lc_rs, $key:expr, $nonce:ident, $page:ident, $tag:ident) => {
        $key.open_in_place_separate_tag($nonce, Aad::from(super::AAD), $tag, $page)
            .is_ok()
    };
}
ring_like!(ring_aes, ring, RingAes, AES_256_GCM, "ring-aes256gcm");
ring_like!(
    ring_chacha,
    ring,
    RingChaCha,
    CHACHA20_POLY1305,
    "ring-chacha20poly1305"
);
#[cfg(farvm_bench_aws_lc)]
ring_like!(
    awslc_aes,
    aws_lc_rs,
    AwsLcAes,
    AES_256_GCM,
    "awslc-aes256gcm"
);
#[cfg(farvm_bench_aws_lc)]
ring_like!(
    awslc_chacha,
    aws_lc_rs,
    AwsLcChaCha,
    CHACHA20_POLY1305,
    "awslc-chacha20poly1305"
);

/// The crate's own sealer's address for the page under test.
const FARVM_ADDR: PageAddr = PageAddr {
    namespace: 7,
    page: 0x1234,
    version: 3,
};

fn page() -> Vec<u8> {
    (0..PAGE_SIZE).map(|i| (i * 131 % 251) as u8).collect()
}

fn bench_candidate(c: &mut Criterion, cand: &dyn Candidate) {
    let mut group = c.benchmark_group(cand.name());
    group.throughput(Throughput::Bytes(PAGE_SIZE as u64));
    let mut buf = page();
    let mut nonce = 0u64;
    group.bench_function("seal", |b| {
        b.iter(|| {
            nonce += 1;
            black_box(cand.seal(nonce, black_box(&mut buf)))
        })
    });
    let sealed = {
        let mut p = page();
        let tag = cand.seal(1, &mut p);
        (p, tag)
    };
    group.bench_function("open", |b| {
        b.iter_batched_ref(
            || sealed.0.clone(),
            |p| assert!(cand.open(1, black_box(p), &sealed.1)),
            BatchSize::SmallInput,
        )
    });
    group.throughput(Throughput::Bytes((BATCH * PAGE_SIZE) as u64));
    let mut pages: Vec<Vec<u8>> = (0..BATCH).map(|_| page()).collect();
    group.bench_function("seal_x32", |b| {
        b.iter(|| {
            for p in pages.iter_mut() {
                nonce += 1;
                black_box(cand.seal(nonce, black_box(p)));
            }
        })
    });
    let sealed: Vec<(Vec<u8>, [u8; 16])> = (0..BATCH as u64)
        .map(|i| {
            let mut p = page();
            let tag = cand.seal(i, &mut p);
            (p, tag)
        })
        .collect();
    group.bench_function("open_x32", |b| {
        b.iter_batched_ref(
            || sealed.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            |ps| {
                for (i, p) in ps.iter_mut().enumerate() {
                    assert!(cand.open(i as u64, black_box(p), &sealed[i].1));
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// Criterion's defaults (5 s per function) would make 32 functions take minutes on a shared
/// 2-core machine; 2 s gives a confidence interval of a few percent for sub-µs functions.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
        .without_plots()
}

fn benches(c: &mut Criterion) {
    print_cpu_features();
    for cand in candidates() {
        bench_candidate(c, cand.as_ref());
    }
}

/// What the implementations may pick at run time: the table means little without it.
fn print_cpu_features() {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let features = [
            ("aes", has!("aes")),
            ("pclmulqdq", has!("pclmulqdq")),
            ("avx2", has!("avx2")),
            ("avx512f", has!("avx512f")),
            ("vaes", has!("vaes")),
            ("vpclmulqdq", has!("vpclmulqdq")),
        ];
        let on: Vec<&str> = features.iter().filter(|f| f.1).map(|f| f.0).collect();
        eprintln!("cpu features: {}", on.join(" "));
    }
}

/// Every candidate, in the table's order; the last is the crate's own sealer.
fn candidates() -> Vec<Box<dyn Candidate>> {
    vec![
        Box::new(rustcrypto::AesGcm::new()),
        Box::new(rustcrypto::ChaCha::new()),
        Box::new(rustcrypto::XChaCha::new()),
        Box::new(ring_aes::RingAes::new()),
        Box::new(ring_chacha::RingChaCha::new()),
        #[cfg(farvm_bench_aws_lc)]
        Box::new(awslc_aes::AwsLcAes::new()),
        #[cfg(farvm_bench_aws_lc)]
        Box::new(awslc_chacha::AwsLcChaCha::new()),
        Box::new(Farvm::new()),
    ]
}

/// `PageSealer` as a candidate for the table: the nonce counter is its own, so `seal` ignores
/// the bench's; `open` finds the seal it made for that nonce.
struct Farvm {
    sealer: std::cell::RefCell<PageSealer>,
    /// The seal of each nonce the bench asked for, by nonce modulo 64 (a batch is 32).
    seals: std::cell::RefCell<[Option<Seal>; 64]>,
}

impl Farvm {
    fn new() -> Self {
        Self {
            sealer: PageSealer::with_salt(&PageKey::from_bytes(KEY), [1; SALT_LEN]).into(),
            seals: [None; 64].into(),
        }
    }
}

impl Candidate for Farvm {
    fn name(&self) -> &'static str {
        "farvm-seal-pagesealer"
    }
    fn seal(&self, nonce: u64, page: &mut [u8]) -> [u8; 16] {
        let page: &mut [u8; PAGE_SIZE] = page.try_into().expect("one page");
        let seal = self
            .sealer
            .borrow_mut()
            .seal(FARVM_ADDR, page)
            .expect("counter far from exhausted");
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&seal.0[SEAL_LEN - 16..]);
        self.seals.borrow_mut()[nonce as usize % 64] = Some(seal);
        tag
    }
    fn open(&self, nonce: u64, page: &mut [u8], tag: &[u8; 16]) -> bool {
        let page: &mut [u8; PAGE_SIZE] = page.try_into().expect("one page");
        let seal = self.seals.borrow()[nonce as usize % 64].expect("sealed before");
        assert_eq!(&seal.0[SEAL_LEN - 16..], tag);
        self.sealer
            .borrow_mut()
            .open(FARVM_ADDR, page, &seal)
            .is_ok()
    }
}

/// The summary table: each call timed on its own, the median and the 10th percentile kept.
/// On a shared machine a preemption lands in a few samples only, so the median is robust
/// where criterion's mean is not; the clock's own cost is measured and subtracted.
mod table {
    use super::{page, Candidate, BATCH, PAGE_SIZE};
    use std::hint::black_box;
    use std::time::Instant;

    /// Samples per single-page operation, and per 32-page batch.
    const SAMPLES: usize = 4000;
    const BATCH_SAMPLES: usize = 400;

    /// (median, 10th percentile) of per-page nanoseconds over samples of `per` pages each.
    fn stats(mut ns: Vec<f64>, per: usize, clock: f64) -> (f64, f64) {
        ns.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| ((ns[(ns.len() as f64 * q) as usize] - clock) / per as f64).max(0.0);
        (at(0.5), at(0.1))
    }

    fn clock_cost() -> f64 {
        let mut ns: Vec<f64> = (0..SAMPLES)
            .map(|_| {
                let t = Instant::now();
                black_box(Instant::now() - t).as_nanos() as f64
            })
            .collect();
        ns.sort_by(|a, b| a.total_cmp(b));
        ns[ns.len() / 2]
    }

    /// Seals and opens `per` pages per sample; returns ((seal median, p10), (open median, p10)).
    fn measure(c: &dyn Candidate, per: usize, samples: usize, clock: f64) -> [(f64, f64); 2] {
        let plain: Vec<Vec<u8>> = (0..per).map(|_| page()).collect();
        let mut pages = plain.clone();
        let mut tags = vec![[0u8; 16]; per];
        let (mut seal_ns, mut open_ns) = (Vec::new(), Vec::new());
        let mut nonce = 0u64;
        for _ in 0..samples {
            pages.clone_from(&plain);
            let t = Instant::now();
            for (p, tag) in pages.iter_mut().zip(tags.iter_mut()) {
                nonce += 1;
                *tag = c.seal(nonce, black_box(p));
            }
            seal_ns.push(t.elapsed().as_nanos() as f64);
            let first = nonce + 1 - per as u64;
            let t = Instant::now();
            for (i, (p, tag)) in pages.iter_mut().zip(tags.iter()).enumerate() {
                black_box(c.open(first + i as u64, black_box(p), tag));
            }
            open_ns.push(t.elapsed().as_nanos() as f64);
            assert!(pages == plain, "{}: opened pages differ", c.name());
        }
        [stats(seal_ns, per, clock), stats(open_ns, per, clock)]
    }

    /// Prints the markdown table of docs/sealing.md.
    pub fn print(candidates: &[Box<dyn Candidate>]) {
        let clock = clock_cost();
        println!();
        println!("ns per 4 KiB page, median of {SAMPLES} single-page / {BATCH_SAMPLES} {BATCH}-page samples (10th percentile in brackets); GB/s from the median; clock cost {clock:.0} ns subtracted");
        println!();
        println!("| candidate | seal 1 | open 1 | seal ×{BATCH} | open ×{BATCH} | seal GB/s | open GB/s |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for c in candidates {
            let [s1, o1] = measure(c.as_ref(), 1, SAMPLES, clock);
            let [sb, ob] = measure(c.as_ref(), BATCH, BATCH_SAMPLES, clock);
            let gbs = |ns: f64| PAGE_SIZE as f64 / ns;
            let cell = |(m, p): (f64, f64)| format!("{m:.0} ({p:.0})");
            println!(
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} |",
                c.name(),
                cell(s1),
                cell(o1),
                cell(sb),
                cell(ob),
                gbs(s1.0),
                gbs(o1.0)
            );
        }
    }
}

/// The criterion group (in a module: the macro's function takes no doc comment).
mod group {
    use super::{benches, config};
    criterion::criterion_group! {
        name = seal;
        config = config();
        targets = benches
    }
}

fn main() {
    group::seal();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    // `cargo test --benches` runs each function once with `--test`; `--list` lists them.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--test" || a == "--list") {
        table::print(&candidates());
    }
}
