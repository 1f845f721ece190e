//! Which logical CPUs to pin workers to: one per physical core.
//!
//! GEMV over host memory is bandwidth-bound; a second hyper-thread on a core adds wake-up cost
//! and shares the same load ports, so the default pool has one worker per physical core. Linux
//! exposes the core a logical CPU belongs to in sysfs; elsewhere (or if sysfs is unreadable)
//! we fall back to `num_cpus::get_physical()` taken from the front of the allowed CPU list.

use core_affinity::CoreId;
use std::collections::BTreeSet;

/// One logical CPU per physical core, among the CPUs this process may run on, in CPU order.
///
/// Empty only if the allowed set cannot be read at all; the pool then runs its workers
/// unpinned (see [`crate::pool::PoolConfig::pin`]).
pub fn physical_core_ids() -> Vec<CoreId> {
    let allowed = core_affinity::get_core_ids().unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut picked = Vec::new();
    let mut sysfs_ok = true;
    for id in &allowed {
        match core_key(id.id) {
            Some(key) => {
                if seen.insert(key) {
                    picked.push(*id);
                }
            }
            None => {
                sysfs_ok = false;
                break;
            }
        }
    }
    if sysfs_ok && !picked.is_empty() {
        return picked;
    }
    let physical = num_cpus::get_physical().max(1);
    allowed.into_iter().take(physical).collect()
}

/// `(package, core)` of a logical CPU from sysfs, or `None` where that is not available.
fn core_key(cpu: usize) -> Option<(u32, u32)> {
    let base = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
    let read = |name: &str| -> Option<u32> {
        std::fs::read_to_string(format!("{base}/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// Default worker count: the number of physical cores this process may use (at least 1).
pub fn default_threads() -> usize {
    physical_core_ids().len().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_ids_are_distinct_and_allowed() {
        let ids = physical_core_ids();
        let allowed = core_affinity::get_core_ids().unwrap_or_default();
        let set: BTreeSet<usize> = ids.iter().map(|c| c.id).collect();
        assert_eq!(set.len(), ids.len(), "duplicate core ids {ids:?}");
        for id in &ids {
            assert!(allowed.iter().any(|a| a.id == id.id));
        }
        assert!(default_threads() >= 1);
        assert!(default_threads() <= num_cpus::get().max(1));
    }
}
