//! Values under ascending keys in one ring buffer, taken out in any order: a producer's
//! messages in flight by seq, a consumer's handed-off outcomes by id. Most leave at the front,
//! but with many entities or workers behind one stream they settle in any order, and removing
//! one from the middle of a `VecDeque` moved half of the buffer: O(window) per ACK. Here a
//! value taken from the middle leaves a hole: the holes at the front are dropped as the front
//! leaves, and the buffer is compacted once the holes outnumber the values, so that every
//! removal costs O(1) amortised (plus the search for its key) and the buffer never holds more
//! than twice its values (and a few holes).

use std::collections::VecDeque;

/// Holes tolerated before a compaction, however few the values: a small buffer is never
/// compacted for one or two holes.
const MIN_HOLES_COMPACTED: usize = 32;

/// Values under distinct keys, in ascending key order.
#[derive(Clone, Debug)]
pub(crate) struct KeyedRing<V> {
    /// Ascending keys; `None`: a hole. The front is never a hole.
    slots: VecDeque<(u64, Option<V>)>,
    holes: usize,
}

impl<V> Default for KeyedRing<V> {
    fn default() -> Self {
        Self {
            slots: VecDeque::new(),
            holes: 0,
        }
    }
}

impl<V> KeyedRing<V> {
    /// How many values it holds.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.holes
    }

    /// Whether it holds no value.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The value with the smallest key.
    pub(crate) fn front(&self) -> Option<(u64, &V)> {
        let (key, value) = self.slots.front()?;
        Some((*key, value.as_ref().expect("the front is never a hole")))
    }

    /// Adds `value` under `key`; returns the value it replaces. At the back when `key` is above
    /// every key held (the common case); else in its place (in the hole a value of that key
    /// left, if there is one).
    #[inline]
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if self.slots.back().is_none_or(|(last, _)| *last < key) {
            self.slots.push_back((key, Some(value)));
            None
        } else {
            self.insert_within(key, value)
        }
    }

    #[inline(never)]
    fn insert_within(&mut self, key: u64, value: V) -> Option<V> {
        match self.slots.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(at) => {
                let replaced = self.slots[at].1.replace(value);
                self.holes -= usize::from(replaced.is_none());
                replaced
            }
            Err(at) => {
                self.slots.insert(at, (key, Some(value)));
                None
            }
        }
    }

    /// The keys, ascending.
    pub(crate) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots
            .iter()
            .filter_map(|(key, value)| value.as_ref().map(|_| *key))
    }

    /// The value under `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.slots[self.index(key)?].1.as_ref()
    }

    /// The value under `key`, to change.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let index = self.index(key)?;
        self.slots[index].1.as_mut()
    }

    /// Takes the value under `key` out.
    #[inline]
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let index = self.index(key)?;
        if index == 0 && self.holes == 0 {
            return self.slots.pop_front().and_then(|(_, value)| value);
        }
        self.remove_at(index)
    }

    #[inline(never)]
    fn remove_at(&mut self, index: usize) -> Option<V> {
        let value = self.slots[index].1.take()?;
        self.holes += 1;
        self.tidy();
        Some(value)
    }

    /// Takes the value with the smallest key out.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<(u64, V)> {
        let (key, value) = self.slots.pop_front()?;
        self.tidy();
        Some((key, value.expect("the front is never a hole")))
    }

    /// The values, by ascending key, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut V)> {
        self.slots
            .iter_mut()
            .filter_map(|(key, value)| Some((*key, value.as_mut()?)))
    }

    /// Takes every value out, by ascending key.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.holes = 0;
        self.slots
            .drain(..)
            .filter_map(|(key, value)| Some((key, value?)))
    }

    /// Drops every value.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.holes = 0;
    }

    /// Gives back the memory its buffer keeps from its largest size.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.slots.shrink_to_fit();
    }

    /// Slots in the buffer, holes included: what it costs.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Where `key` is. Keys ascend with few gaps, so `key - first` is nearly always the index;
    /// search otherwise.
    #[inline]
    fn index(&self, key: u64) -> Option<usize> {
        let first = self.slots.front()?.0;
        // Beyond `usize` (a 32-bit target) the guess is no index: search.
        let guess = usize::try_from(key.checked_sub(first)?).unwrap_or(usize::MAX);
        match self.slots.get(guess) {
            Some((k, _)) if *k == key => Some(guess),
            // A key above the last (one not held yet) needs no search.
            _ if self.slots.back().is_some_and(|(last, _)| *last < key) => None,
            _ => self.slots.binary_search_by_key(&key, |(k, _)| *k).ok(),
        }
    }

    /// Drops the holes at the front; compacts once the holes outnumber the values.
    #[inline]
    fn tidy(&mut self) {
        if self.holes == 0 {
            return;
        }
        while self.slots.front().is_some_and(|(_, v)| v.is_none()) {
            self.slots.pop_front();
            self.holes -= 1;
        }
        if self.holes > MIN_HOLES_COMPACTED && self.holes > self.len() {
            self.compact();
        }
    }

    #[inline(never)]
    fn compact(&mut self) {
        self.slots.retain(|(_, value)| value.is_some());
        self.holes = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// What must hold between any two calls.
    fn check<V>(ring: &KeyedRing<V>) {
        let front = ring.slots.front();
        assert!(
            front.is_none_or(|(_, v)| v.is_some()),
            "the front is no hole"
        );
        let holes = ring.slots.iter().filter(|(_, v)| v.is_none()).count();
        assert_eq!(ring.holes, holes, "the holes are counted");
        let keys = ring.slots.iter().map(|(k, _)| *k);
        assert!(
            keys.clone().zip(keys.skip(1)).all(|(a, b)| a < b),
            "keys ascend"
        );
        assert!(
            ring.slots.len() <= 2 * ring.len() + MIN_HOLES_COMPACTED + 1,
            "holes are bounded by the values"
        );
    }

    #[test]
    fn values_taken_in_any_order_leave_the_rest_as_a_sorted_map_would() {
        let mut rng = SmallRng::seed_from_u64(11);
        let (mut ring, mut model) = (KeyedRing::default(), BTreeMap::new());
        let mut next = 1u64;
        for _ in 0..10_000 {
            match rng.random_range(0..10) {
                // Mostly new keys at the back, as a producer numbers its messages.
                0..=4 => {
                    assert_eq!(ring.insert(next, next * 10), model.insert(next, next * 10));
                    next += 1 + u64::from(rng.random_bool(0.1));
                }
                // A key taken back and inserted again in its place (a seq sent again).
                5 => {
                    let key = rng.random_range(1..=next);
                    if let Some(value) = model.remove(&key) {
                        assert_eq!(ring.remove(key), Some(value));
                        assert_eq!(ring.insert(key, value + 1), model.insert(key, value + 1));
                    }
                }
                // A key never held, anywhere: below the front, in a gap, in a hole.
                6 => {
                    // Or held: the value is replaced.
                    let key = rng.random_range(0..next);
                    assert_eq!(ring.insert(key, key), model.insert(key, key));
                }
                // Settled out of order, or at the front.
                7 | 8 => {
                    let key = rng.random_range(1..=next);
                    assert_eq!(ring.remove(key), model.remove(&key));
                }
                _ => assert_eq!(
                    ring.pop_front(),
                    model.pop_first(),
                    "the smallest key leaves first"
                ),
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.front(), model.first_key_value().map(|(k, v)| (*k, v)));
            let probe = rng.random_range(1..next + 1);
            assert_eq!(ring.get(probe), model.get(&probe));
            assert_eq!(ring.get_mut(probe), model.get_mut(&probe));
            check(&ring);
        }
        assert!(ring.keys().eq(model.keys().copied()));
        for (_, value) in ring.iter_mut() {
            *value += 1;
        }
        let drained: Vec<_> = ring.drain().collect();
        let expected: Vec<_> = model.into_iter().map(|(k, v)| (k, v + 1)).collect();
        assert_eq!(drained, expected);
        assert!(ring.is_empty());
    }

    #[test]
    fn a_value_settled_behind_a_stuck_front_costs_no_shift_and_no_growth() {
        let mut ring = KeyedRing::default();
        ring.insert(1, ()); // stuck
        for key in 2..100_000 {
            ring.insert(key, ());
            assert_eq!(ring.remove(key), Some(()));
        }
        assert_eq!(ring.len(), 1);
        assert!(ring.slots.len() <= MIN_HOLES_COMPACTED + 2);
        assert_eq!(ring.front(), Some((1, &())));
        check(&ring);
    }

    #[test]
    fn a_drain_dropped_half_way_leaves_the_ring_empty() {
        let mut ring = KeyedRing::default();
        for key in 1..100 {
            ring.insert(key, key);
        }
        for key in (2..100).step_by(3) {
            ring.remove(key);
        }
        assert_eq!(ring.drain().next(), Some((1, 1)));
        assert_eq!((ring.is_empty(), ring.len()), (true, 0));
        check(&ring);
        ring.insert(7, 7);
        assert_eq!(ring.get(7), Some(&7));
    }
}
