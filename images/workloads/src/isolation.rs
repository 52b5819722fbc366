//! Address-space isolation check: each round writes a per-process tag over the whole heap,
//! yields the CPU (other processes, with the same heap virtual addresses, run and write their
//! own tags), then verifies every word. Any foreign word means two processes share a frame.

use crate::fold::{combine, fold_words};
use crate::rng::mix64;
use crate::{phase, Env, Error, Outcome};

pub(crate) fn run(
    heap: &mut [u64],
    seed: u64,
    rounds: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let tag = mix64(seed ^ 0x150_1A7E);
    env.phase(phase::SETUP);
    env.phase(phase::WARMUP);
    // Not `measured()`: the rounds need `env` for yielding.
    env.phase(phase::MEASURE);
    let t0 = env.now_ns();
    let bad = {
        let mut bad = 0u64;
        for round in 0..rounds {
            let t = tag ^ (round << 48);
            for (i, w) in heap.iter_mut().enumerate() {
                *w = t ^ i as u64;
            }
            env.yield_now();
            for (i, w) in heap.iter().enumerate() {
                bad += (*w != t ^ i as u64) as u64;
            }
        }
        bad
    };
    let ns = env.now_ns().saturating_sub(t0);
    env.phase(phase::MEASURED);
    if bad != 0 {
        return Err(Error::Corrupted { mismatches: bad });
    }
    Ok(Outcome {
        checksum: combine(tag, fold_words(heap)),
        ops: rounds * heap.len() as u64,
        elapsed_ns: ns,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec;

    #[test]
    fn yields_between_rounds_and_detects_nothing_alone() {
        let mut h = vec![0u64; 4096];
        let mut e = Fake::default();
        let r = run(&mut h, 3, 4, &mut e).unwrap();
        assert_eq!(e.yields, 4);
        assert_eq!(r.ops, 4 * 4096);
        let r2 = run(&mut h, 4, 4, &mut Fake::default()).unwrap();
        assert_ne!(r.checksum, r2.checksum);
    }
}
