//! Key-value store: an open-addressing hash table (64-byte slots: key + 7 value words, linear
//! probing, power-of-two slot count) filling the working set; `ops` operations on Zipf(theta)
//! keys, `set_pct`% sets and the rest gets.

use crate::fold::{combine, fold_words};
use crate::rng::{mix64, Rng};
use crate::scan::sum;
use crate::zipf::Zipf;
use crate::{measured, phase, Env, Error, Outcome};

const SLOT_WORDS: usize = 8;

pub(crate) fn run(
    heap: &mut [u64],
    seed: u64,
    ops: u64,
    keys: u64,
    theta_milli: u64,
    set_pct: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let slots_fit = (heap.len() / SLOT_WORDS) as u64;
    if slots_fit < 2 {
        return Err(Error::HeapTooSmall {
            need: 2 * 64,
            have: heap.len() as u64 * 8,
        });
    }
    let nslots = 1u64 << (63 - slots_fit.leading_zeros());
    let keys = if keys == 0 { nslots / 2 } else { keys };
    if keys > nslots / 4 * 3 {
        return Err(Error::BadParam {
            name: "keys",
            value: keys,
        });
    }
    if set_pct > 100 {
        return Err(Error::BadParam {
            name: "set_pct",
            value: set_pct,
        });
    }
    if theta_milli > 10_000 {
        return Err(Error::BadParam {
            name: "theta",
            value: theta_milli,
        });
    }
    let zipf = Zipf::new(keys, theta_milli as f64 / 1000.0).ok_or(Error::BadParam {
        name: "keys",
        value: keys,
    })?;
    let salt = mix64(seed ^ 0x6B76);
    let mask = nslots - 1;
    let table = &mut heap[..nslots as usize * SLOT_WORDS];

    env.phase(phase::SETUP);
    table.fill(0);
    for k in 1..=keys {
        let s = find(table, salt, mask, k);
        table[s] = k;
        for j in 1..SLOT_WORDS {
            table[s + j] = mix64(salt ^ (k << 3 | j as u64));
        }
    }
    env.phase(phase::WARMUP);
    let warm = sum(table);
    let (acc, ns) = measured(env, || {
        let mut rng = Rng::new(seed, 6);
        let mut acc = 0u64;
        for i in 0..ops {
            let k = zipf.sample(&mut rng);
            let set = rng.below(100) < set_pct;
            let s = find(table, salt, mask, k);
            if table[s] != k {
                // Every key was inserted at setup: a miss means a wrong page.
                acc = acc.wrapping_add(0xDEAD);
                continue;
            }
            if set {
                for j in 1..SLOT_WORDS {
                    table[s + j] = mix64(i ^ (k << 3 | j as u64));
                }
            } else {
                let mut v = 0u64;
                for j in 1..SLOT_WORDS {
                    v = v.wrapping_add(table[s + j].rotate_left(j as u32));
                }
                acc = acc.rotate_left(5) ^ v;
            }
        }
        acc
    });
    Ok(Outcome {
        checksum: combine(combine(warm, acc), fold_words(heap)),
        ops,
        elapsed_ns: ns,
    })
}

/// Slot (word index) holding key `k`, or the empty slot where it would go.
#[inline]
fn find(table: &[u64], salt: u64, mask: u64, k: u64) -> usize {
    let mut s = mix64(k ^ salt) & mask;
    loop {
        let i = s as usize * SLOT_WORDS;
        let key = table[i];
        if key == k || key == 0 {
            return i;
        }
        s = (s + 1) & mask;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec;

    #[test]
    fn every_key_is_found_and_sets_are_read_back() {
        let mut h = vec![0u64; 8 * 1024];
        let r = run(&mut h, 4, 50_000, 0, 990, 5, &mut Fake::default()).unwrap();
        assert_eq!(r.ops, 50_000);
        let salt = mix64(4 ^ 0x6B76);
        for k in 1..=512u64 {
            let s = find(&h, salt, 1023, k);
            assert_eq!(h[s], k);
        }
        let keys = h.chunks(8).filter(|s| s[0] != 0).count();
        assert_eq!(keys, 512);
        let again = run(
            &mut vec![1u64; 8 * 1024],
            4,
            50_000,
            0,
            990,
            5,
            &mut Fake::default(),
        );
        assert_eq!(again.unwrap().checksum, r.checksum);
        let all_gets = run(&mut h, 4, 50_000, 0, 990, 0, &mut Fake::default()).unwrap();
        assert_ne!(all_gets.checksum, 0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut h = vec![0u64; 8 * 16];
        let mut e = Fake::default();
        assert!(matches!(
            run(&mut h, 1, 1, 13, 990, 5, &mut e),
            Err(Error::BadParam { name: "keys", .. })
        ));
        assert!(matches!(
            run(&mut h, 1, 1, 0, 990, 101, &mut e),
            Err(Error::BadParam {
                name: "set_pct",
                ..
            })
        ));
        assert!(matches!(
            run(&mut h[..8], 1, 1, 0, 990, 5, &mut e),
            Err(Error::HeapTooSmall { .. })
        ));
    }
}
