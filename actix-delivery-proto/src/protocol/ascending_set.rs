//! A set of sequence numbers or keys kept in ascending order in one ring buffer: what the
//! intake and the work-pulling pool hold. Their keys arrive nearly in order and leave nearly in
//! order, so inserting at the back and removing at the front cost O(1) with no allocation once
//! the buffer has grown; a key out of order costs a binary search and a shift of the keys
//! after it. A B-tree paid a search, and at times a node's allocation, for every key.

use std::collections::VecDeque;

/// Distinct `u64`s in ascending order.
#[derive(Clone, Debug, Default)]
pub(crate) struct AscendingSet {
    keys: VecDeque<u64>,
}

impl AscendingSet {
    /// Adds `key`; returns whether it was absent.
    pub(crate) fn insert(&mut self, key: u64) -> bool {
        if self.keys.back().is_none_or(|&last| last < key) {
            self.keys.push_back(key);
            return true;
        }
        match self.keys.binary_search(&key) {
            Ok(_) => false,
            Err(at) => {
                self.keys.insert(at, key);
                true
            }
        }
    }

    /// Removes `key`; returns whether it was present.
    pub(crate) fn remove(&mut self, key: u64) -> bool {
        if self.keys.front() == Some(&key) {
            self.keys.pop_front();
            return true;
        }
        match self.keys.binary_search(&key) {
            Ok(at) => {
                self.keys.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `key` is present.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.keys.binary_search(&key).is_ok()
    }

    /// The smallest key.
    pub(crate) fn first(&self) -> Option<u64> {
        self.keys.front().copied()
    }

    /// Removes and returns the smallest key.
    pub(crate) fn pop_first(&mut self) -> Option<u64> {
        self.keys.pop_front()
    }

    /// How many keys it holds.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Removes every key.
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
    }

    /// The keys, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn keys_in_any_order_come_out_ascending_once_each_as_a_btree_set_keeps_them() {
        let mut rng = SmallRng::seed_from_u64(7);
        let (mut set, mut model) = (AscendingSet::default(), BTreeSet::new());
        for step in 0..20_000u64 {
            // Mostly increasing keys, some out of order, some repeated, as the pool sees them.
            let key = match rng.random_range(0..10) {
                0..=5 => step,
                6 | 7 => step.saturating_sub(rng.random_range(0..50)),
                _ => rng.random_range(0..step.max(1)),
            };
            match rng.random_range(0..4) {
                0 | 1 => assert_eq!(set.insert(key), model.insert(key)),
                2 => assert_eq!(set.remove(key), model.remove(&key)),
                _ => assert_eq!(set.pop_first(), model.pop_first()),
            }
            assert_eq!(set.contains(key), model.contains(&key));
            assert_eq!(set.first(), model.first().copied());
            assert_eq!(set.len(), model.len());
        }
        assert!(set.iter().eq(model.iter().copied()));
        set.clear();
        assert_eq!((set.len(), set.first()), (0, None));
    }
}
