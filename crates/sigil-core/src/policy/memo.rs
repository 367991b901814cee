//! Plans remembered per image string for the life of one compiled policy.
//!
//! Planning is pure — the same image string under the same policy always
//! plans the same (namespace labels aside) — yet every admission of a Pod
//! planned its images again: the reference parsed and normalized, the mirror
//! mapped both ways, the rule found. A cluster runs few distinct image
//! strings, so each [`Policy`](super::Policy) keeps the plans it made, shared
//! (`Arc`), in a small sharded table. It owns nothing else: what is looked
//! up or decided from a plan is the caller's, and it is never consulted
//! when the namespace's labels could change the rule (a policy with a
//! `namespaceSelector`).
//!
//! Bounded: each shard holds at most [`SHARD_CAPACITY`] plans and is emptied
//! when full, so a flood of distinct image strings costs what planning
//! without the memo cost, never memory. A new policy load starts empty (a
//! clone of a policy, as `merge` and `without_verification` make, too).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use super::Plan;
use crate::denial::Denial;

/// Shards, so admissions on many threads rarely meet on one lock.
const SHARDS: usize = 8;
/// Plans kept per shard (4,096 in all: a few MiB at most).
pub(super) const SHARD_CAPACITY: usize = 512;

/// A remembered plan: the image string's plan or why it has none.
pub(super) type Planned = Result<Arc<Plan>, Denial>;

/// The per-policy table of plans.
pub(super) struct PlanMemo {
    hasher: foldhash::quality::RandomState,
    shards: [Mutex<HashMap<Box<str>, Planned, foldhash::quality::RandomState>>; SHARDS],
}

impl PlanMemo {
    /// The plan of `written`, made by `plan` on a miss and kept.
    pub(super) fn get_or_plan(&self, written: &str, plan: impl FnOnce() -> Planned) -> Planned {
        let shard = &self.shards[self.hasher.hash_one(written) as usize % SHARDS];
        if let Some(p) = lock(shard).get(written) {
            return p.clone();
        }
        // Planned outside the lock: two threads may plan the same string at
        // once, and both plans are equal, so the second insert is harmless.
        let planned = plan();
        let mut map = lock(shard);
        if map.len() >= SHARD_CAPACITY {
            map.clear();
        }
        map.insert(written.into(), planned.clone());
        planned
    }

    /// How many plans are kept (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

/// The shard's map; a panic while it was held leaves only whole entries
/// behind, so a poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for PlanMemo {
    fn default() -> Self {
        PlanMemo {
            hasher: Default::default(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::default())),
        }
    }
}

/// A clone remembers nothing: it may be changed before it is used.
impl Clone for PlanMemo {
    fn clone(&self) -> Self {
        PlanMemo::default()
    }
}

impl std::fmt::Debug for PlanMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlanMemo")
    }
}

#[cfg(test)]
mod tests;
