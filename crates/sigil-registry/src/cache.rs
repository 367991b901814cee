//! The cache sigil keeps answers in — digests here, verification reports in
//! sigil-verify: a table built for one shape of entry — a 32-byte key (a hash
//! of everything a lookup depends on: a SHA-256 for digests, a seeded hash
//! the verifier checks on every hit for reports) and a small answer — that
//! holds 100,000 of them in a few MiB.
//!
//! Owns the table (sharded by the key's own bits, each shard a map from key
//! to slot and a fixed array of slots, so an entry is one slot and one map
//! cell and nothing is allocated per entry), eviction (CLOCK: a hit sets a
//! slot's bit, the hand clears bits until it finds one unset or expired —
//! hits never take a write lock on anything shared beyond their shard), each
//! entry's time to live (the cache-wide one unless the insert says otherwise;
//! checked on every hit; expired slots are reused first), and single-flight: concurrent misses of one key wait for one load
//! (a separate in-flight map, so the table holds only answers). A load that
//! is cancelled (its admission timed out) wakes the waiters, and one of them
//! loads instead — none waits for an answer that will not come. It knows
//! nothing about registries or signatures: what an answer means, and how long
//! each kind of answer lives, are its users'.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Shards (a power of two): enough that the cores rarely meet on one lock.
const SHARDS: usize = 16;

/// A cache key: its first eight bytes are already a uniform hash (a
/// SHA-256 from [`KeyBuilder`], or the verifier's seeded hash), so they are
/// used as is.
pub type Key = [u8; 32];

/// Builds a [`Key`]: the SHA-256 of the parts a lookup depends on, each
/// prefixed by its length, so no two lists of parts read alike. A collision
/// would need a SHA-256 collision.
#[derive(Debug, Clone)]
pub(crate) struct KeyBuilder(sha2::Sha256);

impl KeyBuilder {
    /// An empty key.
    pub(crate) fn new() -> KeyBuilder {
        KeyBuilder(<sha2::Sha256 as sha2::Digest>::new())
    }

    /// Adds one part.
    pub(crate) fn part(&mut self, p: &str) -> &mut KeyBuilder {
        self.bytes(p.as_bytes())
    }

    /// Adds one part of raw bytes.
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut KeyBuilder {
        sha2::Digest::update(&mut self.0, (b.len() as u64).to_le_bytes());
        sha2::Digest::update(&mut self.0, b);
        self
    }

    /// The key.
    pub(crate) fn finish(self) -> Key {
        sha2::Digest::finalize(self.0).into()
    }
}

impl Default for KeyBuilder {
    fn default() -> Self {
        KeyBuilder::new()
    }
}

/// Hashes a [`Key`] by its first eight bytes (uniform already: hashing them
/// again would only cost time).
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
    /// When it stops being usable, in milliseconds since the cache was made.
    expires: u64,
    /// Read since the hand last passed.
    referenced: bool,
}

struct Shard<V> {
    index: Index,
    slots: Vec<Slot<V>>,
    hand: usize,
    capacity: usize,
}

/// A sharded CLOCK cache with single-flight loads (see the module).
pub struct Cache<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    inflight: Mutex<HashMap<Key, watch::Receiver<Option<V>>, BuildHasherDefault<KeyHasher>>>,
    ttl_ms: u64,
    epoch: Instant,
}

impl<V> std::fmt::Debug for Cache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stored: usize = self
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).index.len())
            .sum();
        f.debug_struct("Cache").field("stored", &stored).finish()
    }
}

impl<V: Clone> Cache<V> {
    /// A cache of about `capacity` entries (at most an eighth more), each
    /// usable for `ttl`.
    pub fn new(capacity: u64, ttl: Duration) -> Cache<V> {
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

    /// The instant `ttl` from `now`, in the cache's milliseconds.
    fn until(now: u64, ttl: Duration) -> u64 {
        now.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
    }

    /// The answer for `key`, if one is stored and not past its time to live.
    pub fn get(&self, key: &Key) -> Option<V> {
        self.get_with(key, |v| Some(v.clone()))
    }

    /// What `read` makes of the answer stored for `key` (not past its time
    /// to live), read under the shard's lock: only what `read` returns is
    /// copied out. A hit that keeps part of a shared entry — the verifier
    /// keeps the report, not the entry around it — then moves no reference
    /// count of the entry, a cache line every core would write per hit. An
    /// answer `read` turns down (`None`) is not marked as read.
    pub fn get_with<T>(&self, key: &Key, read: impl FnOnce(&V) -> Option<T>) -> Option<T> {
        let now = self.now();
        let mut shard = self.shard(key);
        let i = *shard.index.get(key)? as usize;
        let slot = &mut shard.slots[i];
        if now >= slot.expires {
            return None;
        }
        let got = read(&slot.value)?;
        slot.referenced = true;
        Some(got)
    }

    /// Stores `value` for `key` for the cache-wide time to live.
    pub fn insert(&self, key: Key, value: V) {
        let now = self.now();
        self.insert_until(key, value, now, now.saturating_add(self.ttl_ms));
    }

    /// Stores `value` for `key` for `ttl` (zero: not kept).
    pub fn insert_for(&self, key: Key, value: V, ttl: Duration) {
        let now = self.now();
        self.insert_until(key, value, now, Self::until(now, ttl));
    }

    /// Stores `value` for `key` until `expires`, evicting by CLOCK when the
    /// shard is full.
    fn insert_until(&self, key: Key, value: V, now: u64, expires: u64) {
        let mut guard = self.shard(&key);
        let shard = &mut *guard;
        if let Some(&i) = shard.index.get(&key) {
            let slot = &mut shard.slots[i as usize];
            slot.value = value;
            slot.expires = expires;
            slot.referenced = true;
            return;
        }
        let slot = Slot {
            key,
            value,
            expires,
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
            if s.referenced && now < s.expires {
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
    pub fn invalidate(&self, key: &Key) {
        let mut shard = self.shard(key);
        if let Some(i) = shard.index.remove(key) {
            let s = &mut shard.slots[i as usize];
            s.referenced = false;
            s.expires = 0;
        }
    }

    /// Entries stored (expired ones included until they are reused).
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).index.len() as u64)
            .sum()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored answer, or the one `load` gives — run once however many
    /// ask at the same time — kept for the cache-wide time to live. `true`
    /// with an answer this call loaded.
    pub async fn get_or_load<F, Fut>(&self, key: Key, load: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let ttl = Duration::from_millis(self.ttl_ms);
        self.get_or_load_for(key, load, |_| ttl).await
    }

    /// [`Cache::get_or_load`], the answer kept for `ttl_of(&answer)` (zero:
    /// handed to the callers waiting for it, not kept).
    pub async fn get_or_load_for<F, Fut, T>(&self, key: Key, load: F, ttl_of: T) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
        T: FnOnce(&V) -> Duration,
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
                    self.insert_for(key, v.clone(), ttl_of(&v));
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
