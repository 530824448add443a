//! A bounded map that evicts its least recently used entry: the one cache policy of codegen's
//! kernel cache and the runtime's program and pipeline caches.
//!
//! Every entry carries the tick of its last use. A lookup bumps it (O(1)); an insertion into a
//! full map scans for the smallest tick (O(capacity)). Insertions happen only on cache misses,
//! which compile something (milliseconds), so the scan (microseconds for thousands of entries)
//! never shows; in exchange a hit costs one hash lookup and nothing else, and keys are stored once.
//!
//! Keys are hashed with `FxHasher` (rustc-hash): the caches' keys are structural hashes already
//! (or small structs of them), and a lookup sits on every realize's path, where SipHash cost more
//! than the rest of the lookup.
//!
//! Evicting an entry drops the map's handle only: values are `Arc`s in every user of this map, so
//! an executable or kernel still held elsewhere (a running program, a caller's handle) stays
//! alive and valid until its last holder drops it.

use rustc_hash::FxHashMap as HashMap;
use std::borrow::Borrow;
use std::hash::Hash;

/// A map of at most `capacity` entries; inserting into a full map evicts the entry used least
/// recently.
#[derive(Debug)]
pub struct Lru<K, V> {
    map: HashMap<K, (V, u64)>,
    capacity: usize,
    tick: u64,
    evictions: u64,
}

impl<K: Hash + Eq, V> Lru<K, V> {
    /// An empty map that holds at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Lru<K, V> {
        Lru { map: HashMap::default(), capacity: capacity.max(1), tick: 0, evictions: 0 }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The value of `key`, marked as just used.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_mut(key).map(|v| &*v)
    }

    /// The value of `key`, mutable, marked as just used.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let tick = self.next_tick();
        self.map.get_mut(key).map(|(v, used)| {
            *used = tick;
            v
        })
    }

    /// Inserts (or replaces) `key`, marked as just used, first evicting the least recently used
    /// entries while the map is full. Returns the evicted values, for the caller to drop (outside
    /// any lock it holds, if dropping them is costly).
    pub fn insert(&mut self, key: K, value: V) -> Vec<V> {
        let tick = self.next_tick();
        if let Some(slot) = self.map.get_mut(&key) {
            *slot = (value, tick);
            return Vec::new();
        }
        let evicted = self.shrink_to(self.capacity - 1);
        self.map.insert(key, (value, tick));
        evicted
    }

    /// Evicts least recently used entries until at most `len` remain; returns their values.
    fn shrink_to(&mut self, len: usize) -> Vec<V> {
        let mut evicted = Vec::new();
        while self.map.len() > len {
            // Ticks are unique, so the smallest one names exactly one entry.
            let Some(oldest) = self.map.values().map(|(_, used)| *used).min() else { break };
            let Some((_, (value, _))) = self.map.extract_if(|_, (_, used)| *used == oldest).next() else { break };
            evicted.push(value);
            self.evictions += 1;
        }
        evicted
    }

    /// Sets the most entries the map holds (at least one), evicting the least recently used
    /// entries that no longer fit; returns their values.
    pub fn set_capacity(&mut self, capacity: usize) -> Vec<V> {
        self.capacity = capacity.max(1);
        self.shrink_to(self.capacity)
    }

    /// The most entries the map holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries evicted so far (by insertions and by lowering the capacity).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Every value, in no particular order (not marked as used).
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|(v, _)| v)
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Removes every entry and returns the values, for the caller to drop (outside any lock it
    /// holds, if dropping them is costly).
    pub fn drain(&mut self) -> Vec<V> {
        self.map.drain().map(|(_, (v, _))| v).collect()
    }
}

/// The capacity named by the environment variable `var` (a positive integer), else `default`.
/// An unparsable or zero value falls back to `default` too: a typo must not disable a cache.
pub fn capacity_from_env(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|s| s.trim().parse::<usize>().ok()).filter(|&n| n > 0).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut lru = Lru::new(2);
        assert!(lru.insert("a", 1).is_empty());
        assert!(lru.insert("b", 2).is_empty());
        assert_eq!(lru.get("a"), Some(&1)); // `b` is now the oldest
        assert_eq!(lru.insert("c", 3), vec![2]);
        assert_eq!(lru.get("b"), None);
        assert_eq!(lru.get("a"), Some(&1));
        assert_eq!(lru.get("c"), Some(&3));
        assert_eq!(lru.insert("c", 4), Vec::<i32>::new()); // a replacement evicts nothing
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.evictions(), 1);
        assert_eq!(lru.set_capacity(1), vec![1]);
        assert_eq!(lru.get("c"), Some(&4));
        assert_eq!(lru.set_capacity(0), Vec::<i32>::new()); // capacity is at least one
        assert_eq!(lru.capacity(), 1);
    }

    #[test]
    fn stays_at_its_bound() {
        let mut lru = Lru::new(16);
        for i in 0..10_000u32 {
            lru.insert(i, i);
            assert!(lru.len() <= 16);
        }
        assert_eq!(lru.evictions(), 10_000 - 16);
        assert!((10_000 - 16..10_000).all(|i| lru.get(&i) == Some(&i)));
    }
}
