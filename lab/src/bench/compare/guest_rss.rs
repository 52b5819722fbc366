//! The guest's own pages in a kernel-swap run, apart from the VMM's: a thread samples the VMM
//! process's `/proc/PID/smaps` for the guest-RAM mapping (resident and swapped pages) and the
//! memory cgroup's charge, and — in the kernel-swap setups — steers the cgroup's limit so that
//! the guest keeps `budget` pages resident, as farvm's engine does. The VMM's own memory (its
//! heap, code, KVM's page tables and vCPU structures, which cgroup v2 charges too) stays outside
//! the budget in every setup; the kernel then decides which pages to swap, within that split.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::host::LimitFile;

/// How often the guest's pages are sampled (and the limit steered).
const PERIOD: Duration = Duration::from_millis(20);

/// The guest-RAM mapping's pages, from one read of `/proc/PID/smaps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestPages {
    pub resident: u64,
    pub swapped: u64,
}

/// The guest-RAM mapping in `smaps` text: of the mappings at least `guest_bytes` long, the one
/// with the most pages resident or swapped (QEMU's and farvm's RAM is one anonymous mapping of
/// the guest's size or a little more; other mappings that large, such as malloc arenas, are
/// mostly reserved and untouched).
pub fn parse_smaps(smaps: &str, guest_bytes: u64) -> Option<GuestPages> {
    let mut best: Option<GuestPages> = None;
    let mut cur: Option<GuestPages> = None;
    let finish = |cur: Option<GuestPages>, best: &mut Option<GuestPages>| {
        if let Some(c) = cur {
            if best.is_none_or(|b| c.resident + c.swapped > b.resident + b.swapped) {
                *best = Some(c);
            }
        }
    };
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                finish(cur.take(), &mut best);
                cur = (b.saturating_sub(a) >= guest_bytes).then(GuestPages::default);
                continue;
            }
        }
        let Some(c) = cur.as_mut() else { continue };
        let kb = |rest: &str| -> u64 {
            rest.split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        if let Some(rest) = line.strip_prefix("Rss:") {
            c.resident = kb(rest) / 4;
        } else if let Some(rest) = line.strip_prefix("Swap:") {
            c.swapped = kb(rest) / 4;
        }
    }
    finish(cur, &mut best);
    best
}

/// What to watch in one run.
pub struct Watch {
    /// The guest's RAM size (the mapping is at least this long).
    pub guest_bytes: u64,
    /// The cgroup's charge, read each period (for the VMM's own memory).
    pub cgroup: Option<LimitFile>,
    /// Steer the cgroup's limit so that the guest keeps this many pages resident.
    pub steer: Option<Steer>,
}

/// The limit steering of a kernel-swap run.
#[derive(Clone, Copy, Debug)]
pub struct Steer {
    pub budget_pages: u64,
    /// The limit the run starts at (budget + the VMM's own memory measured all-local); the
    /// steering never goes above it.
    pub start_bytes: u64,
    /// Nor below this: budget + the VMM's kernel memory measured all-local, which reclaim
    /// cannot free (below it the guest would necessarily hold less than its budget).
    pub floor_bytes: u64,
}

/// A run's samples, summarised.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GuestStats {
    pub samples: u64,
    /// Most guest pages resident at once.
    pub resident_max: u64,
    /// Median guest pages resident once the kernel had swapped some out (None: it never did).
    pub resident_swapping_median: Option<u64>,
    /// Most guest pages swapped out at once.
    pub swapped_max: u64,
    /// Most memory the cgroup held beyond the guest's resident pages: the VMM's own memory.
    pub vmm_own_max_bytes: u64,
    /// Most kernel memory charged to the cgroup (the part of the VMM's own that reclaim
    /// cannot free).
    pub kernel_max_bytes: u64,
    /// The cgroup limit at the end of a steered run.
    pub limit_end_bytes: Option<u64>,
}

/// A running watcher thread; [`Watcher::finish`] stops it and returns its summary.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<GuestStats>,
}

impl Watcher {
    /// Starts watching process `pid`.
    pub fn start(pid: u32, w: Watch) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("compare-watch".into())
            .spawn(move || watch(&PathBuf::from(format!("/proc/{pid}/smaps")), &w, &flag))?;
        Ok(Watcher { stop, handle })
    }

    pub fn finish(self) -> GuestStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn watch(smaps: &Path, w: &Watch, stop: &AtomicBool) -> GuestStats {
    let mut st = GuestStats::default();
    let mut swapping = Vec::new();
    let mut limit = w.steer.map(|s| s.start_bytes);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(PERIOD);
        let Some(g) = std::fs::read_to_string(smaps)
            .ok()
            .and_then(|s| parse_smaps(&s, w.guest_bytes))
        else {
            continue;
        };
        st.samples += 1;
        st.resident_max = st.resident_max.max(g.resident);
        st.swapped_max = st.swapped_max.max(g.swapped);
        if st.swapped_max > 0 {
            swapping.push(g.resident);
        }
        let current = w.cgroup.as_ref().and_then(|c| c.current());
        if let Some(k) = w.cgroup.as_ref().and_then(|c| c.kernel()) {
            st.kernel_max_bytes = st.kernel_max_bytes.max(k);
        }
        if let Some(cur) = current {
            st.vmm_own_max_bytes = st
                .vmm_own_max_bytes
                .max(cur.saturating_sub(g.resident * 4096));
        }
        if let (Some(s), Some(cg), Some(l), Some(cur)) = (w.steer, &w.cgroup, limit, current) {
            let next = steer(s, l, cur, g.resident);
            if next != l && cg.set(next).is_ok() {
                limit = Some(next);
            }
        }
    }
    swapping.sort_unstable();
    st.resident_swapping_median = swapping.get(swapping.len() / 2).copied();
    st.limit_end_bytes = limit;
    st
}

/// The next limit: down by the guest's excess over its budget (reclaim then takes about that
/// much from the cgroup, the guest's share of it first of all when the VMM's own pages are hot);
/// up by half the shortfall when the cgroup is at its limit and the guest holds less than its
/// budget (the VMM's own memory needs more than measured all-local). Within [floor, start].
pub fn steer(s: Steer, limit: u64, current: u64, resident: u64) -> u64 {
    let budget = s.budget_pages * 4096;
    let start = s.start_bytes.max(budget);
    let floor = s.floor_bytes.clamp(budget, start);
    let resident = resident * 4096;
    let next = if resident > budget {
        limit.saturating_sub(resident - budget)
    } else if current + (256 << 10) >= limit {
        limit + (budget - resident) / 2
    } else {
        limit
    };
    next.clamp(floor, start)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/qemu-system-x86_64
Rss:                 900 kB
Swap:                  0 kB
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:                 132 kB
Swap:                  0 kB
7f1000000000-7f1003200000 rw-p 00000000 00:00 0
Size:              51200 kB
Rss:                4096 kB
Swap:               2048 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
Rss:                  64 kB
";

    #[test]
    fn the_guest_mapping_is_the_large_one_with_pages() {
        let g = parse_smaps(SMAPS, 48 << 20).unwrap();
        assert_eq!(
            g,
            GuestPages {
                resident: 1024,
                swapped: 512
            }
        );
        assert_eq!(parse_smaps(SMAPS, 128 << 20), None);
    }

    #[test]
    fn steering_moves_the_limit_toward_the_budget_within_bounds() {
        let s = Steer {
            budget_pages: 1000,
            start_bytes: 1000 * 4096 + (8 << 20),
            floor_bytes: 1000 * 4096 + (4 << 20),
        };
        let start = s.start_bytes;
        // Guest 200 pages over budget: the limit comes down by 200 pages.
        assert_eq!(steer(s, start, start, 1200), start - 200 * 4096);
        // Never below the floor (budget + the VMM's kernel memory).
        let floor = 1000 * 4096 + (4 << 20);
        assert_eq!(steer(s, floor, floor, 5000), floor);
        // Under budget at the limit: up by half the shortfall, never above the start.
        let l = start - (4 << 20);
        assert_eq!(steer(s, l, l, 800), l + 100 * 4096);
        assert_eq!(steer(s, start, start, 0), start);
        // Under budget with room left (the guest is still filling): unchanged.
        assert_eq!(steer(s, l, l - (1 << 20), 800), l);
    }
}
