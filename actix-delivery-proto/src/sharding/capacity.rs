//! When a table that emptied gives its memory back.
//!
//! A hash table keeps the capacity of its largest size: after a burst of 400 000 entities the
//! host's and the lanes' tables held 16–21 MiB with nothing in them. The rule here: a table
//! whose capacity exceeds `KEPT` and that holds less than a quarter of it shrinks to twice
//! what it holds (at least `KEPT`). Shrinking rehashes what is left, which costs as much as
//! the removals that made the table that sparse cost already, so it is amortised O(1) per
//! removal; and a table that shrank must double twice before it shrinks again, so it never
//! oscillates.

/// Capacity a table keeps whatever it holds: small tables are never shrunk.
pub(crate) const KEPT: usize = 1024;

/// The capacity to shrink a table of `len` entries and `capacity` to, if the rule says so.
pub(crate) fn shrunk(len: usize, capacity: usize) -> Option<usize> {
    (capacity > KEPT && len < capacity / 4).then(|| (len * 2).max(KEPT))
}

/// Shrinks a hash map by the rule.
pub fn shrink_map<K: Eq + std::hash::Hash, V>(map: &mut hashbrown::HashMap<K, V>) {
    if let Some(to) = shrunk(map.len(), map.capacity()) {
        map.shrink_to(to);
    }
}

/// Shrinks a queue by the rule.
pub(crate) fn shrink_queue<T>(queue: &mut std::collections::VecDeque<T>) {
    if let Some(to) = shrunk(queue.len(), queue.capacity()) {
        queue.shrink_to(to);
    }
}

/// Shrinks a linked hash map by the rule (to what it holds: it has no finer control).
pub(crate) fn shrink_linked<K, V, S>(map: &mut hashlink::LinkedHashMap<K, V, S>)
where
    K: Eq + std::hash::Hash,
    S: std::hash::BuildHasher,
{
    if shrunk(map.len(), map.capacity()).is_some() {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_large_table_under_a_quarter_full_shrinks_to_twice_its_content() {
        assert_eq!(shrunk(0, KEPT), None, "small tables keep their capacity");
        assert_eq!(shrunk(1024, 4096), None, "a quarter full or more");
        assert_eq!(shrunk(1023, 4096), Some(2046));
        assert_eq!(shrunk(10, 1 << 20), Some(KEPT), "never below KEPT");
        let mut map: hashbrown::HashMap<u32, u32> = (0..400_000).map(|i| (i, i)).collect();
        map.retain(|&k, _| k < 100);
        // The memory, not `capacity()`: that counts neither the removals that left a
        // tombstone nor, so, what the table still holds for them (how many do depends on the
        // hasher's random seed).
        let high = map.allocation_size();
        shrink_map(&mut map);
        let low = map.allocation_size();
        assert!(low < high / 100, "{low} of {high} bytes");
        assert!(map.capacity() <= 2 * KEPT, "{}", map.capacity());
        assert_eq!(map.len(), 100);
    }
}
