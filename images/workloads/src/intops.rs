//! Dependent integer arithmetic without memory traffic: a CPU-bound process for scheduling and
//! preemption tests, and the cleanest guest-vs-native ratio (no paging involved).

use crate::fold::combine;
use crate::{measured, phase, Env, Outcome};

pub(crate) fn run(seed: u64, iters: u64, env: &mut dyn Env) -> Outcome {
    env.phase(phase::SETUP);
    env.phase(phase::WARMUP);
    let (x, ns) = measured(env, || {
        let mut x = seed | 1;
        for i in 0..iters {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(i ^ (x >> 29));
        }
        x
    });
    Outcome {
        checksum: combine(x, iters),
        ops: iters,
        elapsed_ns: ns,
    }
}
