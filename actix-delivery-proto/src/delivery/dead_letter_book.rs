//! The bounded book of dead letters a memory store keeps: entries by id, one per source and
//! key; beyond the bounds, the oldest entries a peer's input caused go first, then the oldest
//! of the rest. The SQL stores apply the same rules in their statements; the store conformance
//! tests hold all of them to these.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::delivery::dead_letters::{
    cut_text, DeadLetterCounts, DeadLetterFilter, DeadLetterLimits, DeadLetterPage, Kept,
    NewDeadLetter, SourceKind, StoredDeadLetter,
};

/// Dead letters in memory, within [`DeadLetterLimits`].
#[derive(Debug)]
pub struct DeadLetterBook {
    limits: DeadLetterLimits,
    entries: BTreeMap<u64, StoredDeadLetter>,
    keys: HashMap<(SourceKind, String, String), u64>,
    /// The ids of the entries a peer's input caused
    /// ([`is_peer_input`](crate::delivery::dead_letters::DeadLetterCause::is_peer_input)):
    /// they are dropped before the others.
    peer_input: BTreeSet<u64>,
    bytes: u64,
    last_id: u64,
}

impl DeadLetterBook {
    /// An empty book within `limits` (validated by the caller).
    pub fn new(limits: DeadLetterLimits) -> Self {
        Self {
            limits,
            entries: BTreeMap::new(),
            keys: HashMap::new(),
            peer_input: BTreeSet::new(),
            bytes: 0,
            last_id: 0,
        }
    }

    /// Keeps `letter` ([`bounded`](NewDeadLetter::bounded) first): updates the entry of the
    /// same source and key (its id and first time stay), or adds one; then, until the book is
    /// within its bounds again, drops the oldest other entry a peer's input caused; when none
    /// is left and only `max_bytes` is exceeded, drops the body of the letter just kept if a
    /// peer's input caused it (its length and manifest stay); then the oldest other entry.
    /// The entry just kept stays, even when it alone is over `max_bytes`. A peer's flood so
    /// replaces its own entries: of this process's give-ups and poison it takes at most the
    /// room of one entry without its body.
    pub fn keep(&mut self, letter: NewDeadLetter, now_ms: u64) -> Kept {
        let letter = letter.bounded(self.limits.max_body_bytes);
        let key = (letter.kind, letter.source.clone(), letter.key.clone());
        let weight = letter.weight();
        let peer_input = letter.cause.is_peer_input();
        let (id, updated) = match self.keys.get(&key).copied() {
            Some(id) => {
                let entry = self.entries.get_mut(&id).expect("a key names a kept entry");
                self.bytes = self.bytes - entry.letter.weight() + weight;
                entry.letter = letter;
                entry.last_at_ms = now_ms;
                (id, true)
            }
            None => {
                self.last_id += 1;
                let id = self.last_id;
                self.keys.insert(key, id);
                self.bytes += weight;
                let entry = StoredDeadLetter {
                    id,
                    letter,
                    first_at_ms: now_ms,
                    last_at_ms: now_ms,
                    replay_failures: 0,
                };
                self.entries.insert(id, entry);
                (id, false)
            }
        };
        if peer_input {
            self.peer_input.insert(id);
        } else {
            self.peer_input.remove(&id);
        }
        let mut evicted = 0;
        while self.entries.len() > 1
            && (self.entries.len() as u64 > self.limits.max_entries
                || self.bytes > self.limits.max_bytes)
        {
            if let Some(next) = first_but(self.peer_input.iter().copied(), id) {
                self.remove(next);
            } else if peer_input
                && self.entries.len() as u64 <= self.limits.max_entries
                && self.drop_body(id)
            {
                // Only the bytes are over: the body makes room, not a give-up.
                continue;
            } else {
                let next = first_but(self.entries.keys().copied(), id).expect("more than one");
                self.remove(next);
            }
            evicted += 1;
        }
        Kept {
            id,
            updated,
            evicted,
        }
    }

    /// Drops the body of the entry `id` (its length stays); whether it had one.
    fn drop_body(&mut self, id: u64) -> bool {
        let entry = self.entries.get_mut(&id).expect("the entry just kept");
        let Some(body) = entry.letter.body.take() else {
            return false;
        };
        self.bytes -= body.len() as u64;
        true
    }

    /// The entry `id`.
    pub fn get(&self, id: u64) -> Option<&StoredDeadLetter> {
        self.entries.get(&id)
    }

    /// The page of entries `filter` matches, oldest first.
    pub fn list(&self, filter: &DeadLetterFilter) -> DeadLetterPage {
        let first = filter.after_id.map_or(0, |after| after.saturating_add(1));
        let matching = self
            .entries
            .range(first..)
            .map(|(_, entry)| entry)
            .filter(|entry| filter.matches(entry))
            .take(filter.page_size() + 1)
            .map(|entry| {
                if filter.without_bodies {
                    entry.without_body()
                } else {
                    entry.clone()
                }
            })
            .collect();
        DeadLetterPage::of(matching, filter)
    }

    /// Removes the entry `id`, returning it.
    pub fn remove(&mut self, id: u64) -> Option<StoredDeadLetter> {
        let entry = self.entries.remove(&id)?;
        let letter = &entry.letter;
        self.keys
            .remove(&(letter.kind, letter.source.clone(), letter.key.clone()));
        self.peer_input.remove(&id);
        self.bytes -= letter.weight();
        Some(entry)
    }

    /// Notes that a replay of `id` failed with `error` at `now_ms`; `false` if there is no
    /// such entry.
    pub fn replay_failed(&mut self, id: u64, error: &str, now_ms: u64) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else {
            return false;
        };
        let before = entry.letter.weight();
        entry.replay_failures = entry.replay_failures.saturating_add(1);
        entry.last_at_ms = now_ms;
        entry.letter.error = error.to_owned();
        cut_text(&mut entry.letter.error);
        self.bytes = self.bytes - before + entry.letter.weight();
        true
    }

    /// How many entries the book holds, and their weight, by cause.
    pub fn counts(&self) -> DeadLetterCounts {
        let mut by_cause = BTreeMap::new();
        for entry in self.entries.values() {
            *by_cause.entry(entry.letter.cause).or_insert(0) += 1;
        }
        DeadLetterCounts {
            entries: self.entries.len() as u64,
            bytes: self.bytes,
            by_cause: by_cause.into_iter().collect(),
        }
    }
}

/// The first of `ids` that is not `id`.
fn first_but(mut ids: impl Iterator<Item = u64>, id: u64) -> Option<u64> {
    ids.find(|&other| other != id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Manifest;
    use crate::delivery::dead_letters::DeadLetterCause;

    fn letter(key: &str, body: usize) -> NewDeadLetter {
        NewDeadLetter {
            kind: SourceKind::WorkPulling,
            source: "pool".into(),
            cause: DeadLetterCause::GivenUp,
            key: key.into(),
            origin: None,
            manifest: Manifest::raw(),
            body: Some(vec![7; body]),
            body_len: body as u64,
            attempts: 3,
            error: "no confirmation".into(),
        }
    }

    fn limits(max_entries: u64, max_bytes: u64) -> DeadLetterLimits {
        DeadLetterLimits {
            max_entries,
            max_bytes,
            // Unvalidated: bodies above `max_bytes` reach the book (`validate` refuses this).
            max_body_bytes: u64::MAX,
            ..DeadLetterLimits::default()
        }
    }

    fn ids(book: &DeadLetterBook) -> Vec<u64> {
        book.list(&DeadLetterFilter::default())
            .entries
            .iter()
            .map(|entry| entry.id)
            .collect()
    }

    #[test]
    fn the_same_source_and_key_update_one_entry() {
        let mut book = DeadLetterBook::new(limits(10, 1 << 20));
        let first = book.keep(letter("a", 4), 100);
        let mut again = letter("a", 8);
        again.attempts = 5;
        let second = book.keep(again, 200);
        assert_eq!((first.id, first.updated), (1, false));
        assert_eq!((second.id, second.updated), (1, true));
        let entry = book.get(first.id).unwrap();
        assert_eq!(
            (entry.first_at_ms, entry.last_at_ms, entry.letter.attempts),
            (100, 200, 5)
        );
        assert_eq!(book.counts().entries, 1);
        assert_eq!(book.counts().bytes, letter("a", 8).weight());
    }

    #[test]
    fn the_oldest_entries_go_first_beyond_max_entries() {
        let mut book = DeadLetterBook::new(limits(3, 1 << 20));
        for key in ["a", "b", "c"] {
            assert_eq!(book.keep(letter(key, 1), 0).evicted, 0);
        }
        assert_eq!(book.keep(letter("d", 1), 0).evicted, 1);
        assert_eq!(ids(&book), [2, 3, 4]);
        // An update of the oldest keeps its age: it is still the next to go.
        book.keep(letter("b", 1), 1);
        book.keep(letter("e", 1), 1);
        assert_eq!(ids(&book), [3, 4, 5]);
    }

    #[test]
    fn the_oldest_entries_go_first_beyond_max_bytes_but_the_newest_stays() {
        let one = letter("a", 100).weight();
        let mut book = DeadLetterBook::new(limits(100, 2 * one));
        book.keep(letter("a", 100), 0);
        book.keep(letter("b", 100), 0);
        assert_eq!(book.keep(letter("c", 100), 0).evicted, 1);
        assert_eq!(ids(&book), [2, 3]);
        assert!(book.counts().bytes <= 2 * one);
        // One entry heavier than the whole bound drops every other and stays.
        let kept = book.keep(letter("d", 3 * one as usize), 0);
        assert_eq!(kept.evicted, 2);
        assert_eq!(ids(&book), [4]);
    }

    #[test]
    fn an_updated_old_entry_that_grew_evicts_younger_ones_not_itself() {
        let one = letter("a", 100).weight();
        let mut book = DeadLetterBook::new(limits(100, 3 * one));
        for key in ["a", "b", "c"] {
            book.keep(letter(key, 100), 0);
        }
        let kept = book.keep(letter("a", 200), 1);
        assert_eq!((kept.id, kept.evicted), (1, 1));
        assert_eq!(ids(&book), [1, 3]);
    }

    #[test]
    fn a_peers_flood_drops_its_own_entries_before_the_give_ups() {
        let mut book = DeadLetterBook::new(limits(4, 1 << 20));
        let peer = |key: &str| NewDeadLetter {
            cause: DeadLetterCause::Undecodable,
            ..letter(key, 1)
        };
        for key in ["a", "b", "c", "d"] {
            book.keep(letter(key, 1), 0);
        }
        // The first letter of a peer's drops the oldest give-up: no entry of a peer's is
        // there to drop.
        assert_eq!(book.keep(peer("x0"), 1).evicted, 1);
        assert_eq!(ids(&book), [2, 3, 4, 5]);
        // From then on the flood replaces itself.
        for n in 1..50 {
            assert_eq!(book.keep(peer(&format!("x{n}")), 2).evicted, 1);
        }
        assert_eq!(ids(&book), [2, 3, 4, 54]);
        // A give-up makes room by dropping a peer's entries first, then the oldest give-up.
        assert_eq!(book.keep(letter("e", 1), 3).evicted, 1);
        assert_eq!(ids(&book), [2, 3, 4, 55]);
        assert_eq!(book.keep(letter("f", 1), 3).evicted, 1);
        assert_eq!(ids(&book), [3, 4, 55, 56]);
        // An entry whose cause changes class is dropped as its new class is.
        assert_eq!(book.keep(peer("e"), 4).id, 55);
        assert_eq!(book.keep(letter("g", 1), 4).evicted, 1);
        assert_eq!(ids(&book), [3, 4, 56, 57]);
    }

    #[test]
    fn a_peers_letter_too_heavy_for_the_room_left_is_kept_without_its_body() {
        let own = letter("own-0", 100).weight();
        let mut book = DeadLetterBook::new(limits(100, 10 * own));
        for n in 0..10 {
            book.keep(letter(&format!("own-{n}"), 100), 0);
        }
        let peer = |n: usize, body: usize| NewDeadLetter {
            cause: DeadLetterCause::Malformed,
            ..letter(&format!("own-{n}x"), body)
        };
        // The first takes the room of one give-up, its body dropped, not of eleven.
        let first = book.keep(peer(0, 1000), 1);
        assert_eq!(first.evicted, 1);
        assert_eq!(book.get(first.id).unwrap().letter.body, None);
        assert_eq!(book.get(first.id).unwrap().letter.body_len, 1000);
        // A growing flood replaces itself and keeps what fits of each body: no give-up goes.
        for (n, body) in [(1, 1), (2, 50), (3, 500), (4, 1), (5, 1000), (6, 90)] {
            let kept = book.keep(peer(n, body), 2);
            let entry = book.get(kept.id).unwrap();
            assert_eq!(entry.letter.body.is_some(), body < 100, "letter {n}");
            assert!(book.counts().bytes <= 10 * own, "letter {n}");
            assert_eq!(ids(&book)[..9], [2, 3, 4, 5, 6, 7, 8, 9, 10], "letter {n}");
        }
    }

    #[test]
    fn pages_follow_after_id_and_filters() {
        let mut book = DeadLetterBook::new(limits(100, 1 << 20));
        for (n, key) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let mut letter = letter(key, 1);
            if n % 2 == 1 {
                letter.cause = DeadLetterCause::Poison;
            }
            book.keep(letter, n as u64 * 10);
        }
        let filter = DeadLetterFilter {
            limit: Some(2),
            ..DeadLetterFilter::default()
        };
        let page = book.list(&filter);
        assert_eq!((page.entries.len(), page.next), (2, Some(2)));
        let last = book.list(&DeadLetterFilter {
            after_id: Some(4),
            ..filter.clone()
        });
        assert_eq!((last.entries.len(), last.next), (1, None));
        let poison = book.list(&DeadLetterFilter {
            cause: Some(DeadLetterCause::Poison),
            ..DeadLetterFilter::default()
        });
        assert_eq!(
            poison.entries.iter().map(|e| e.id).collect::<Vec<_>>(),
            [2, 4]
        );
        let window = book.list(&DeadLetterFilter {
            since_ms: Some(10),
            until_ms: Some(30),
            ..DeadLetterFilter::default()
        });
        assert_eq!(
            window.entries.iter().map(|e| e.id).collect::<Vec<_>>(),
            [2, 3]
        );
    }

    #[test]
    fn removed_and_failed_replays_keep_the_weight_right() {
        let mut book = DeadLetterBook::new(limits(100, 1 << 20));
        let kept = book.keep(letter("a", 10), 0);
        assert!(book.replay_failed(kept.id, &"x".repeat(5000), 9));
        let entry = book.get(kept.id).unwrap();
        assert_eq!((entry.replay_failures, entry.last_at_ms), (1, 9));
        assert_eq!(book.counts().bytes, entry.letter.weight());
        assert!(book.remove(kept.id).is_some());
        assert_eq!(book.counts(), DeadLetterCounts::default());
        assert!(!book.replay_failed(kept.id, "gone", 10));
    }
}
