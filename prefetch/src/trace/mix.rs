//! Interleaves single-process traces into one multi-process trace.
//!
//! A trace recorded from one program run has no clock shared with another run, so a
//! multi-process trace built from two of them needs a schedule: here a deterministic round robin
//! that takes `quantum` records from each input in turn (as two processes whose faults alternate
//! in bursts), skipping inputs that have ended. Input `i` becomes process key `i + 1`; times
//! become record indices; access kinds are kept if every input has them.

use super::{Record, Trace};

/// Round-robin interleaving of `inputs` in bursts of `quantum` records (at least 1).
pub fn interleave(inputs: &[Trace], quantum: usize) -> Trace {
    let quantum = quantum.max(1);
    let total = inputs.iter().map(|t| t.records.len()).sum();
    let mut records = Vec::with_capacity(total);
    let mut pos = vec![0usize; inputs.len()];
    while records.len() < total {
        for (i, t) in inputs.iter().enumerate() {
            let end = (pos[i] + quantum).min(t.records.len());
            for r in &t.records[pos[i]..end] {
                records.push(Record {
                    key: i as u64 + 1,
                    time: records.len() as u64,
                    ..*r
                });
            }
            pos[i] = end;
        }
    }
    Trace {
        records,
        timed: false,
        kinds: !inputs.is_empty() && inputs.iter().all(|t| t.kinds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_of_quantum_until_every_input_ends() {
        let a = Trace::from_pairs((0..5).map(|p| (9, p)));
        let b = Trace::from_pairs((100..102).map(|p| (9, p)));
        let m = interleave(&[a, b], 2);
        let got: Vec<(u64, u64)> = m.records.iter().map(|r| (r.key, r.page)).collect();
        assert_eq!(
            got,
            [(1, 0), (1, 1), (2, 100), (2, 101), (1, 2), (1, 3), (1, 4)]
        );
        assert!(m
            .records
            .iter()
            .enumerate()
            .all(|(i, r)| r.time == i as u64));
        assert!(!m.kinds);
    }
}
