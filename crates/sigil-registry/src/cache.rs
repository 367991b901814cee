//! The digest cache: a table built for one shape of entry — a 32-byte key
//! (the SHA-256 of everything a lookup depends on) and a small answer — that
//! holds 100,000 of them in a few MiB.
//!
//! Owns the table (sharded by the key's own bits, each shard a map from key
//! to slot and a fixed array of slots, so an entry is one slot and one map
//! cell and nothing is allocated per entry), eviction (CLOCK: a hit sets a
//! slot's bit, the hand clears bits until it finds one unset or expired —
//! hits never take a write lock on anything shared beyond their shard), the
//! cache-wide time to live (checked on every hit; expired slots are reused
//! first), and single-flight: concurrent misses of one key wait for one load
//! (a separate in-flight map, so the table holds only answers). A load that
//! is cancelled (its admission timed out) wakes the waiters, and one of them
//! loads instead — none waits for an answer that will not come. It knows
//! nothing about registries: what an answer means, and the shorter lives of
//! negative answers, are `lib.rs`'s.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Shards (a power of two): enough that the cores rarely meet on one lock.
const SHARDS: usize = 16;

/// A cache key: already a hash, so its first bytes are used as is.
pub(crate) type Key = [u8; 32];

/// Hashes a [`Key`] by its first eight bytes (it is a SHA-256: uniform
/// already; hashing it again would only cost time).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        if let Some(b) = bytes.first_chunk::<8>() {
            self.0 ^= u64::from_le_bytes(*b);
        }
    }

    // The slice's length prefix says nothing: every key is 32 bytes.
    fn write_usize(&mut self, _: usize) {}
}

type Index = HashMap<Key, u32, BuildHasherDefault<KeyHasher>>;

struct Slot<V> {
    key: Key,
    value: V,
    /// When it was stored, in milliseconds since the cache was made.
    born: u64,
    /// Read since the hand last passed.
    referenced: bool,
}

struct Shard<V> {
    index: Index,
    slots: Vec<Slot<V>>,
    hand: usize,
    capacity: usize,
}

/// The digest cache.
pub(crate) struct Cache<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    inflight: Mutex<HashMap<Key, watch::Receiver<Option<V>>, BuildHasherDefault<KeyHasher>>>,
    ttl_ms: u64,
    epoch: Instant,
}

impl<V: Clone> Cache<V> {
    /// A cache of about `capacity` entries (at most an eighth more), each
    /// usable for `ttl`.
    pub(crate) fn new(capacity: u64, ttl: Duration) -> Cache<V> {
        // Keys spread over shards by chance, not evenly: each shard gets an
        // eighth more than its share, so a cache filled to `capacity` keeps
        // it all (a shard's count strays by about its square root).
        let share = capacity.div_ceil(SHARDS as u64);
        let per_shard = usize::try_from(share + share / 8 + 1)
            .unwrap_or(usize::MAX)
            .clamp(1, 1 << 24);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    index: Index::default(),
                    slots: Vec::new(),
                    hand: 0,
                    capacity: per_shard,
                })
            })
            .collect();
        Cache {
            shards,
            inflight: Mutex::default(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, Shard<V>> {
        // Bits the index's hash does not use (it reads the first eight bytes).
        let i = usize::from(key[8]) & (SHARDS - 1);
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fresh(&self, born: u64, now: u64) -> bool {
        now.saturating_sub(born) < self.ttl_ms
    }

    /// The answer for `key`, if one is stored and not past the TTL.
    pub(crate) fn get(&self, key: &Key) -> Option<V> {
        let now = self.now();
        let mut shard = self.shard(key);
        let i = *shard.index.get(key)? as usize;
        let slot = &mut shard.slots[i];
        if !self.fresh(slot.born, now) {
            return None;
        }
        slot.referenced = true;
        Some(slot.value.clone())
    }

    /// Stores `value` for `key`, evicting by CLOCK when the shard is full.
    pub(crate) fn insert(&self, key: Key, value: V) {
        let now = self.now();
        let ttl = self.ttl_ms;
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        if let Some(&i) = shard.index.get(&key) {
            let slot = &mut shard.slots[i as usize];
            slot.value = value;
            slot.born = now;
            slot.referenced = true;
            return;
        }
        let slot = Slot {
            key,
            value,
            born: now,
            referenced: false,
        };
        if shard.slots.len() < shard.capacity {
            shard.index.insert(key, shard.slots.len() as u32);
            shard.slots.push(slot);
            return;
        }
        // The hand clears bits until it finds a slot not read since its last
        // pass, or expired; at most two turns.
        loop {
            let h = shard.hand;
            shard.hand = (h + 1) % shard.slots.len();
            let s = &mut shard.slots[h];
            if s.referenced && now.saturating_sub(s.born) < ttl {
                s.referenced = false;
                continue;
            }
            let old = std::mem::replace(s, slot);
            if shard.index.get(&old.key) == Some(&(h as u32)) {
                shard.index.remove(&old.key);
            }
            shard.index.insert(key, h as u32);
            return;
        }
    }

    /// Forgets `key` (its slot is reused first).
    pub(crate) fn invalidate(&self, key: &Key) {
        let mut shard = self.shard(key);
        if let Some(i) = shard.index.remove(key) {
            let s = &mut shard.slots[i as usize];
            s.referenced = false;
            s.born = 0;
        }
    }

    /// Entries stored (expired ones included until they are reused).
    pub(crate) fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).index.len() as u64)
            .sum()
    }

    /// The stored answer, or the one `load` gives — run once however many
    /// ask at the same time. `true` with an answer this call loaded.
    pub(crate) async fn get_or_load<F, Fut>(&self, key: Key, load: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let mut load = Some(load);
        loop {
            if let Some(v) = self.get(&key) {
                return (v, false);
            }
            let waiting = {
                let mut inflight = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
                // Checked again under the lock: a load may have just ended.
                if let Some(v) = self.get(&key) {
                    return (v, false);
                }
                match inflight.get(&key) {
                    Some(rx) => Ok(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        inflight.insert(key, rx);
                        Err(tx)
                    }
                }
            };
            match waiting {
                Ok(mut rx) => {
                    // `Err`: the load was cancelled; try again (and maybe load).
                    if let Ok(v) = rx.wait_for(Option::is_some).await
                        && let Some(v) = v.clone()
                    {
                        return (v, false);
                    }
                }
                Err(tx) => {
                    let Some(f) = load.take() else {
                        // Unreachable: a caller loads at most once, then returns.
                        continue;
                    };
                    let _done = Loading { cache: self, key };
                    let v = f().await;
                    self.insert(key, v.clone());
                    let _ = tx.send(Some(v.clone()));
                    return (v, true);
                }
            }
        }
    }
}

/// Removes a load from the in-flight map when it ends or is cancelled; the
/// sender it dropped with it wakes every waiter.
struct Loading<'a, V: Clone> {
    cache: &'a Cache<V>,
    key: Key,
}

impl<V: Clone> Drop for Loading<'_, V> {
    fn drop(&mut self) {
        self.cache
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests;
