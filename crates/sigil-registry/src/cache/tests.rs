//! The cache against a model (a map of what was last stored per key), and
//! the concurrency its users rely on: one load per key however many ask, no
//! waiter left waiting when a load is cancelled, no stampede after it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn key(n: u16) -> Key {
    // Spread like a SHA-256: the index reads bytes 0..8, the shard byte 8.
    let mut k = [0u8; 32];
    let h = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    k[..8].copy_from_slice(&h.to_le_bytes());
    k[8] = (h >> 56) as u8;
    k[30..].copy_from_slice(&n.to_le_bytes());
    k
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u16, u32),
    Get(u16),
    Invalidate(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u16..300, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        (0u16..300).prop_map(Op::Get),
        (0u16..300).prop_map(Op::Invalidate),
    ]
}

proptest! {
    /// Whatever it returns is what was last stored for that key (never
    /// another key's, never a replaced or invalidated one); it never holds
    /// more than its capacity; and while fewer keys than one shard's share
    /// were ever stored, nothing stored is lost.
    #[test]
    fn answers_agree_with_a_model(ops in proptest::collection::vec(op(), 1..400), capacity in 16u64..512) {
        let cache: Cache<u32> = Cache::new(capacity, Duration::from_secs(3600));
        let mut model: HashMap<u16, u32> = HashMap::new();
        let mut distinct = std::collections::HashSet::new();
        let share = capacity.div_ceil(SHARDS as u64);
        let per_shard = (share + share / 8 + 1) as usize;
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    cache.insert(key(k), v);
                    model.insert(k, v);
                    distinct.insert(k);
                }
                Op::Invalidate(k) => {
                    cache.invalidate(&key(k));
                    model.remove(&k);
                }
                Op::Get(k) => {
                    let got = cache.get(&key(k));
                    if let Some(v) = got {
                        prop_assert_eq!(Some(&v), model.get(&k), "key {}", k);
                    } else if distinct.len() <= per_shard {
                        prop_assert!(!model.contains_key(&k), "key {} lost with room to spare", k);
                    }
                }
            }
            prop_assert!(cache.len() <= per_shard as u64 * SHARDS as u64);
        }
    }
}

#[test]
fn the_time_to_live_is_checked_on_every_hit() {
    let cache: Cache<u32> = Cache::new(100, Duration::from_millis(30));
    cache.insert(key(1), 7);
    assert_eq!(cache.get(&key(1)), Some(7));
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(cache.get(&key(1)), None);
    cache.insert(key(1), 8);
    assert_eq!(cache.get(&key(1)), Some(8), "stored again, fresh again");
}

#[test]
fn each_entry_keeps_its_own_time_to_live() {
    let cache: Cache<u32> = Cache::new(100, Duration::from_secs(3600));
    cache.insert_for(key(1), 1, Duration::from_millis(30));
    cache.insert_for(key(2), 2, Duration::ZERO);
    cache.insert(key(3), 3);
    assert_eq!(cache.get(&key(1)), Some(1));
    assert_eq!(cache.get(&key(2)), None, "a zero life is not kept");
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(cache.get(&key(1)), None, "past its own life");
    assert_eq!(cache.get(&key(3)), Some(3), "the cache-wide life");
    cache.insert_for(key(3), 4, Duration::ZERO);
    assert_eq!(cache.get(&key(3)), None, "stored again with no life");
}

#[tokio::test]
async fn a_load_kept_for_no_time_still_answers_its_caller_and_is_loaded_again() {
    let cache: Cache<u32> = Cache::new(100, Duration::from_secs(3600));
    let loads = AtomicUsize::new(0);
    for want in [(1, true), (2, true)] {
        let got = cache
            .get_or_load_for(
                key(9),
                || async { loads.fetch_add(1, Ordering::SeqCst) as u32 + 1 },
                |v| {
                    if *v < 3 {
                        Duration::ZERO
                    } else {
                        Duration::from_secs(60)
                    }
                },
            )
            .await;
        assert_eq!(got, want);
    }
    let (v, loaded) = cache
        .get_or_load_for(key(9), || async { 3 }, |_| Duration::from_secs(60))
        .await;
    assert_eq!((v, loaded), (3, true));
    assert_eq!(cache.get(&key(9)), Some(3), "kept for its life");
}

#[test]
fn a_full_shard_evicts_what_was_not_read_since_the_hand_passed() {
    // Two slots per shard: keys of one shard replace each other, the one
    // read survives the first pass of the hand.
    let cache: Cache<u32> = Cache::new(SHARDS as u64, Duration::from_secs(60));
    let same: Vec<Key> = (0..2000u16)
        .map(key)
        .filter(|k| k[8] as usize & (SHARDS - 1) == 0)
        .take(3)
        .collect();
    cache.insert(same[0], 0);
    cache.insert(same[1], 1);
    assert_eq!(cache.get(&same[0]), Some(0), "read: its bit is set");
    cache.insert(same[2], 2);
    assert_eq!(cache.get(&same[0]), Some(0), "kept: it was read");
    assert_eq!(cache.get(&same[1]), None, "evicted: not read");
    assert_eq!(cache.get(&same[2]), Some(2));
}

/// `get_with` answers what its reader makes of a live entry; an entry the
/// reader turns down is not counted as read, so the hand may evict it.
#[test]
fn a_read_under_the_lock_answers_what_the_reader_keeps() {
    let cache: Cache<(u32, &'static str)> = Cache::new(SHARDS as u64, Duration::from_secs(60));
    let same: Vec<Key> = (0..2000u16)
        .map(key)
        .filter(|k| k[8] as usize & (SHARDS - 1) == 0)
        .take(3)
        .collect();
    cache.insert(same[0], (7, "made for a"));
    cache.insert(same[1], (8, "made for b"));
    assert_eq!(cache.get_with(&same[0], |v| Some(v.0)), Some(7));
    assert_eq!(cache.get_with(&same[1], |_| None::<u32>), None);
    assert_eq!(cache.get_with(&key(1), |v| Some(v.0)), None, "absent");
    cache.insert(same[2], (9, "made for c"));
    assert_eq!(cache.get(&same[0]), Some((7, "made for a")), "read: kept");
    assert_eq!(cache.get(&same[1]), None, "turned down, not read: evicted");
    cache.insert_for(same[2], (9, "made for c"), Duration::ZERO);
    assert_eq!(
        cache.get_with(&same[2], |v| Some(v.0)),
        None,
        "past its life"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_of_one_key_load_once() {
    let cache = Arc::new(Cache::<u32>::new(100, Duration::from_secs(60)));
    let loads = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (cache, loads) = (cache.clone(), loads.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load(key(9), || async {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        42
                    })
                    .await
            })
        })
        .collect();
    let mut fresh = 0;
    for t in tasks {
        let (v, loaded) = t.await.unwrap();
        assert_eq!(v, 42);
        fresh += usize::from(loaded);
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1, "one load for 100 callers");
    assert_eq!(fresh, 1, "one caller loaded, 99 waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_load_wakes_its_waiters_and_one_of_them_loads() {
    let cache = Arc::new(Cache::<u32>::new(100, Duration::from_secs(60)));
    let loads = Arc::new(AtomicUsize::new(0));
    // The first caller's load never ends; it is cancelled by its deadline.
    let first = {
        let (cache, loads) = (cache.clone(), loads.clone());
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_millis(50),
                cache.get_or_load(key(3), || async {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<u32>().await
                }),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Twenty callers join it; when it is cancelled exactly one loads again.
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (cache, loads) = (cache.clone(), loads.clone());
            tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    cache.get_or_load(key(3), || async {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        5
                    }),
                )
                .await
            })
        })
        .collect();
    assert!(first.await.unwrap().is_err(), "the first caller timed out");
    for w in waiters {
        let (v, _) = w.await.unwrap().expect("no waiter is left waiting");
        assert_eq!(v, 5);
    }
    assert_eq!(
        loads.load(Ordering::SeqCst),
        2,
        "the cancelled load and one more"
    );
    assert!(
        cache.inflight.lock().unwrap().is_empty(),
        "nothing left in flight"
    );
}
