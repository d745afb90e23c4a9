//! Bounded reassembly: the chunks a consumer buffers until their message is whole. Pure: time
//! is an argument.
//!
//! # The rules
//!
//! - **One partial message per producer** (per key), of one of its incarnations (its
//!   *owner*, the dedup window). Its chunks arrive in any order; one of a message *older* than
//!   the partial one (a lower first seq) replaces it (dropped, counted: its producer sends it
//!   again), one of a *newer* message is refused (counted; its producer retransmits it): the
//!   oldest message always gets through. A chunk of another incarnation of the producer
//!   replaces the partial message too: a restarted producer's earlier life settled its
//!   messages as stopped, so a partial one of it (a straggler's) could only hold memory.
//!   (Two live producers that share an id would keep replacing each other's partial
//!   messages: ids must be unique.)
//! - **Bytes are bounded in total** (`max_bytes`), counting the chunks of partial messages and
//!   the completed messages handed out and not released yet (messages waiting for the
//!   handler). A partial message is charged its bytes, and at least
//!   [`MIN_PART_CHARGE`] per chunk, so a flood of tiny chunks is bounded like large ones.
//!   When a chunk does not fit, partial messages of keys that are gone are dropped first, then
//!   the *youngest* partial messages (the most recently started), as long as they are younger
//!   than the chunk's own; if it still does not fit, it is refused. The oldest partial message
//!   can therefore always complete (given `max_bytes` of at least one message), and nothing
//!   grows beyond the bound whatever a peer sends.
//! - **A chunk must agree** with its message's earlier chunks (chunk count and message
//!   length) and the chunks must add up to the message's length exactly; otherwise the
//!   partial message is dropped.
//! - **A partial message that gets no new chunk for `idle_ttl`** is dropped at the next
//!   [`sweep`](Reassembly::sweep) (a producer that stopped for good, a hostile peer that never
//!   sends the last chunk).
//!
//! A completed message is handed out in chunk order ([`Assembled`]); it is never handed out
//! before every chunk arrived.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::chunk::{Assembled, ChunkHeader};

/// The least a buffered chunk is charged, in bytes: covers its bookkeeping, so that tiny
/// chunks cannot hold more memory than the bound says.
pub const MIN_PART_CHARGE: u64 = 128;

/// What became of a chunk offered to [`Reassembly::insert`].
#[derive(Debug)]
pub enum Inserted {
    /// Buffered; its message needs more chunks.
    Buffered,
    /// This chunk is buffered already.
    Duplicate,
    /// The chunk completed its message: the chunks in order, and what the message stays
    /// charged until [`released`](Reassembly::release).
    Completed {
        /// The reassembled message.
        message: Assembled,
        /// Its charge against `max_bytes`.
        charge: u64,
    },
    /// Not buffered: an older message of the same key is being reassembled, or no room. Its
    /// producer retransmits it.
    Refused,
    /// It contradicts the chunks of its message received before (or they do not add up to the
    /// message's length): the partial message is dropped.
    Conflicting,
}

/// Counters of a [`Reassembly`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Messages completed.
    pub assembled: u64,
    /// Partial messages dropped: replaced by an older one, evicted for room, idle, gone with
    /// their key, stale, or contradicted.
    pub dropped: u64,
    /// Chunks refused (a newer message than the partial one, or no room).
    pub refused: u64,
}

#[derive(Debug)]
struct Partial<W> {
    owner: W,
    header: ChunkHeader,
    parts: BTreeMap<u32, Bytes>,
    received: u64,
    /// Order of creation: lower is older.
    age: u64,
    touched: Instant,
}

impl<W> Partial<W> {
    fn charge(&self) -> u64 {
        charge(self.received, self.parts.len())
    }
}

/// What `parts` chunks of `received` bytes in all are charged.
fn charge(received: u64, parts: usize) -> u64 {
    received.max(parts as u64 * MIN_PART_CHARGE)
}

/// The partial messages of every key (producer), each of an owner (one of its incarnations),
/// bounded in bytes.
#[derive(Debug)]
pub struct Reassembly<K, W> {
    partials: HashMap<K, Partial<W>>,
    /// Partial messages' charges plus the completed ones not released.
    charged: u64,
    max_bytes: u64,
    idle_ttl: Option<Duration>,
    next_age: u64,
    stats: ReassemblyStats,
}

impl<K: Copy + Eq + Hash, W: Copy + Eq> Reassembly<K, W> {
    /// At most `max_bytes` charged at once; partial messages idle for `idle_ttl` dropped at
    /// the next sweep (`None`: never).
    pub fn new(max_bytes: u64, idle_ttl: Option<Duration>) -> Self {
        Self {
            partials: HashMap::new(),
            charged: 0,
            max_bytes,
            idle_ttl,
            next_age: 0,
            stats: ReassemblyStats::default(),
        }
    }

    /// Whether [`insert`](Self::insert) of chunk `index` of `chunk`'s message under `key`
    /// and `owner` would complete the message (if there is room for it).
    pub fn completes(&self, key: K, owner: W, chunk: &ChunkHeader, index: u32) -> bool {
        match self.partials.get(&key).filter(|p| p.owner == owner) {
            Some(p) if p.header.first_seq == chunk.first_seq => {
                p.header == *chunk
                    && !p.parts.contains_key(&index)
                    && p.parts.len() + 1 == chunk.chunks as usize
            }
            Some(p) if p.header.first_seq < chunk.first_seq => false,
            _ => chunk.chunks == 1,
        }
    }

    /// Buffers chunk `index` (of a header that passed [`check`](super::check)) of `chunk`'s
    /// message under `key`, of `owner`. `is_live` says whether an owner still exists (partial
    /// messages of owners that are gone make room first).
    #[allow(clippy::too_many_arguments)] // one chunk and where it goes; all of them needed
    pub fn insert(
        &mut self,
        key: K,
        owner: W,
        chunk: ChunkHeader,
        index: u32,
        bytes: Bytes,
        now: Instant,
        is_live: impl FnMut(&W) -> bool,
    ) -> Inserted {
        let mut age = self.next_age;
        if self.partials.get(&key).is_some_and(|p| p.owner != owner) {
            self.drop_partial(&key); // another incarnation's: its producer's earlier life
        }
        if let Some(p) = self.partials.get(&key) {
            if p.header.first_seq == chunk.first_seq {
                if p.header != chunk {
                    self.drop_partial(&key);
                    return Inserted::Conflicting;
                }
                if p.parts.contains_key(&index) {
                    return Inserted::Duplicate;
                }
                age = p.age;
            } else if p.header.first_seq < chunk.first_seq {
                self.stats.refused += 1;
                return Inserted::Refused;
            } else {
                self.drop_partial(&key); // a newer message's: the older one goes first
            }
        }
        let (received, parts) = self
            .partials
            .get(&key)
            .map_or((0, 0), |p| (p.received, p.parts.len()));
        let received = received + bytes.len() as u64;
        if received > chunk.message_len {
            self.drop_partial(&key);
            return Inserted::Conflicting;
        }
        let added = charge(received, parts + 1) - charge(received - bytes.len() as u64, parts);
        if !self.make_room(added, age, is_live) {
            self.stats.refused += 1;
            return Inserted::Refused;
        }
        if age == self.next_age {
            self.next_age += 1;
        }
        let partial = self.partials.entry(key).or_insert_with(|| Partial {
            owner,
            header: chunk,
            parts: BTreeMap::new(),
            received: 0,
            age,
            touched: now,
        });
        partial.parts.insert(index, bytes);
        partial.received = received;
        partial.touched = now;
        self.charged += added;
        if partial.parts.len() < chunk.chunks as usize {
            return Inserted::Buffered;
        }
        let partial = self.partials.remove(&key).expect("present: inserted above");
        let charge = partial.charge();
        if partial.received != chunk.message_len {
            self.charged -= charge;
            self.stats.dropped += 1;
            return Inserted::Conflicting;
        }
        self.stats.assembled += 1;
        Inserted::Completed {
            message: Assembled::new(partial.parts.into_values()),
            charge,
        }
    }

    /// A completed message's `charge` is no longer held (it runs, or was dropped).
    pub fn release(&mut self, charge: u64) {
        debug_assert!(charge <= self.charged, "released more than was charged");
        self.charged = self.charged.saturating_sub(charge);
    }

    /// Drops `key`'s partial message of `owner` if its first seq is at or below `floor` (its
    /// producer declared it settled: it will never complete). Returns whether it did.
    pub fn drop_settled(&mut self, key: K, owner: W, floor: u64) -> bool {
        let settled = self
            .partials
            .get(&key)
            .is_some_and(|p| p.owner == owner && p.header.first_seq <= floor);
        if settled {
            self.drop_partial(&key);
        }
        settled
    }

    /// Drops the partial messages whose owners `pred` picks; how many.
    pub fn drop_where(&mut self, mut pred: impl FnMut(&W) -> bool) -> usize {
        self.drop_partials(|p| pred(&p.owner))
    }

    /// Drops the partial messages idle for `idle_ttl` at `now`, and those whose owners are
    /// gone; how many.
    pub fn sweep(&mut self, now: Instant, mut is_live: impl FnMut(&W) -> bool) -> usize {
        let ttl = self.idle_ttl;
        self.drop_partials(|p| ttl.is_some_and(|ttl| now >= p.touched + ttl) || !is_live(&p.owner))
    }

    /// When the oldest idle partial message expires (`None`: none, or no `idle_ttl`).
    pub fn next_deadline(&self) -> Option<Instant> {
        let ttl = self.idle_ttl?;
        self.partials.values().map(|p| p.touched + ttl).min()
    }

    /// Bytes charged now: partial messages and completed ones not released.
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Partial messages now.
    pub fn len(&self) -> usize {
        self.partials.len()
    }

    /// Whether no message is partial.
    pub fn is_empty(&self) -> bool {
        self.partials.is_empty()
    }

    /// Counters since it was made.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Forgets everything (the consumer stopped): nothing is charged any more.
    pub fn clear(&mut self) {
        self.partials.clear();
        self.charged = 0;
    }

    /// Drops the partial messages `pred` picks; how many.
    fn drop_partials(&mut self, mut pred: impl FnMut(&Partial<W>) -> bool) -> usize {
        let keys: Vec<K> = self
            .partials
            .iter()
            .filter(|(_, p)| pred(p))
            .map(|(key, _)| *key)
            .collect();
        for key in &keys {
            self.drop_partial(key);
        }
        keys.len()
    }

    fn drop_partial(&mut self, key: &K) {
        if let Some(partial) = self.partials.remove(key) {
            self.charged -= partial.charge();
            self.stats.dropped += 1;
        }
    }

    /// Makes room for `charge` more bytes for a message of `age`: drops the partial messages
    /// of keys that are gone, then younger ones, youngest first. Whether it fits now.
    fn make_room(&mut self, charge: u64, age: u64, mut is_live: impl FnMut(&W) -> bool) -> bool {
        let max = self.max_bytes;
        let fits = |charged: u64| charged.saturating_add(charge) <= max;
        if fits(self.charged) {
            return true;
        }
        self.drop_where(|owner| !is_live(owner));
        let mut younger: Vec<(u64, K)> = self
            .partials
            .iter()
            .filter(|(_, p)| p.age > age)
            .map(|(key, p)| (p.age, *key))
            .collect();
        younger.sort_unstable_by_key(|young| std::cmp::Reverse(young.0));
        for (_, key) in younger {
            if fits(self.charged) {
                break;
            }
            self.drop_partial(&key);
        }
        fits(self.charged)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Keys and owners are numbers; the owner is the key unless a test says otherwise.
    type Table = Reassembly<u8, u8>;

    fn header(first_seq: u64, chunks: u32, message_len: u64) -> ChunkHeader {
        ChunkHeader {
            first_seq,
            chunks,
            message_len,
        }
    }

    fn bytes(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    fn insert(t: &mut Table, key: u8, h: ChunkHeader, index: u32, b: Bytes) -> Inserted {
        t.insert(key, key, h, index, b, Instant::now(), |_| true)
    }

    fn read(message: Assembled) -> Vec<u8> {
        let mut out = Vec::new();
        let mut message = message;
        message.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn chunks_in_any_order_complete_their_message_once_every_one_arrived() {
        let mut t = Table::new(10_000, None);
        let h = header(10, 3, 2500);
        assert!(matches!(
            insert(&mut t, 1, h, 2, bytes(500, 3)),
            Inserted::Buffered
        ));
        assert!(matches!(
            insert(&mut t, 1, h, 0, bytes(1000, 1)),
            Inserted::Buffered
        ));
        assert!(matches!(
            insert(&mut t, 1, h, 2, bytes(500, 3)),
            Inserted::Duplicate
        ));
        assert!(t.completes(1, 1, &h, 1));
        assert!(!t.completes(1, 1, &h, 0), "a duplicate completes nothing");
        assert!(
            !t.completes(1, 2, &h, 1),
            "another owner's chunk starts anew"
        );
        let Inserted::Completed { message, charge } = insert(&mut t, 1, h, 1, bytes(1000, 2))
        else {
            panic!("completed");
        };
        assert_eq!(charge, 2500);
        let mut expected = vec![1; 1000];
        expected.extend([2; 1000]);
        expected.extend([3; 500]);
        assert_eq!(read(message), expected, "in chunk order");
        assert_eq!(t.charged(), 2500, "held until released");
        t.release(charge);
        assert_eq!((t.charged(), t.len(), t.stats().assembled), (0, 0, 1));
    }

    #[test]
    fn one_partial_message_per_key_and_the_older_message_wins() {
        let mut t = Table::new(1000, None);
        let newer = header(20, 2, 20);
        let older = header(10, 2, 20);
        insert(&mut t, 1, newer, 0, bytes(10, 0));
        assert!(matches!(
            insert(&mut t, 1, older, 1, bytes(10, 0)),
            Inserted::Buffered
        ));
        assert_eq!(t.stats().dropped, 1, "the newer message gave way");
        assert!(matches!(
            insert(&mut t, 1, newer, 1, bytes(10, 0)),
            Inserted::Refused
        ));
        assert!(
            !t.completes(1, 1, &header(20, 1, 5), 0),
            "refused, so not completing"
        );
        assert!(matches!(
            insert(&mut t, 2, newer, 0, bytes(10, 0)),
            Inserted::Buffered
        ));
        assert_eq!((t.len(), t.stats().refused), (2, 1), "keys are separate");
    }

    #[test]
    fn a_chunk_of_another_incarnation_replaces_the_partial_message() {
        let mut t = Table::new(1000, None);
        let h = header(1, 2, 20);
        let now = Instant::now();
        t.insert(1, 10, h, 0, bytes(10, 0), now, |_| true);
        // The producer restarted: its new life's first message replaces the old one's.
        let inserted = t.insert(1, 11, header(1, 3, 30), 0, bytes(10, 0), now, |_| true);
        assert!(matches!(inserted, Inserted::Buffered));
        assert_eq!((t.len(), t.stats().dropped), (1, 1));
        assert!(!t.drop_settled(1, 10, 5), "not the owner's");
        assert!(t.drop_settled(1, 11, 1));
    }

    #[test]
    fn chunks_that_contradict_their_message_drop_it() {
        let mut t = Table::new(1000, None);
        insert(&mut t, 1, header(1, 3, 30), 0, bytes(10, 0));
        assert!(matches!(
            insert(&mut t, 1, header(1, 4, 30), 1, bytes(10, 0)),
            Inserted::Conflicting
        ));
        assert_eq!((t.len(), t.charged()), (0, 0));
        insert(&mut t, 1, header(1, 2, 15), 0, bytes(10, 0));
        assert!(
            matches!(
                insert(&mut t, 1, header(1, 2, 15), 1, bytes(10, 0)),
                Inserted::Conflicting
            ),
            "more bytes than announced"
        );
        insert(&mut t, 1, header(1, 2, 30), 0, bytes(10, 0));
        assert!(
            matches!(
                insert(&mut t, 1, header(1, 2, 30), 1, bytes(10, 0)),
                Inserted::Conflicting
            ),
            "fewer bytes than announced"
        );
        assert_eq!((t.len(), t.charged(), t.stats().dropped), (0, 0, 3));
    }

    #[test]
    fn the_byte_bound_drops_younger_partial_messages_for_older_ones_and_refuses_the_rest() {
        let mut t = Table::new(3000, None);
        let a = header(1, 3, 3000);
        let b = header(1, 3, 3000);
        insert(&mut t, 1, a, 0, bytes(1000, 0)); // the oldest
        insert(&mut t, 2, b, 0, bytes(1000, 0));
        insert(&mut t, 2, b, 1, bytes(1000, 0));
        assert_eq!(t.charged(), 3000);
        assert!(
            matches!(insert(&mut t, 3, a, 0, bytes(1000, 0)), Inserted::Refused),
            "a new message does not evict older ones"
        );
        assert!(matches!(
            insert(&mut t, 1, a, 1, bytes(1000, 0)),
            Inserted::Buffered
        ));
        assert_eq!((t.len(), t.charged(), t.stats().dropped), (1, 2000, 1));
        assert!(matches!(
            insert(&mut t, 1, a, 2, bytes(1000, 0)),
            Inserted::Completed { .. }
        ));
        assert_eq!(t.charged(), 3000, "completed, not released: still charged");
        assert!(matches!(
            insert(&mut t, 2, b, 0, bytes(1000, 0)),
            Inserted::Refused
        ));
        t.release(3000);
        assert!(matches!(
            insert(&mut t, 2, b, 0, bytes(1000, 0)),
            Inserted::Buffered
        ));
    }

    #[test]
    fn partial_messages_of_keys_that_are_gone_make_room_first() {
        let mut t = Table::new(2000, None);
        let h = header(1, 2, 2000);
        t.insert(1, 1, h, 0, bytes(1000, 0), Instant::now(), |_| true);
        t.insert(2, 2, h, 0, bytes(1000, 0), Instant::now(), |_| true);
        let inserted = t.insert(3, 3, h, 0, bytes(1000, 0), Instant::now(), |owner| {
            *owner != 1
        });
        assert!(matches!(inserted, Inserted::Buffered));
        assert_eq!((t.len(), t.stats().dropped), (2, 1));
    }

    #[test]
    fn tiny_chunks_are_charged_at_least_min_part_charge_each() {
        let mut t = Table::new(4 * MIN_PART_CHARGE, None);
        let h = header(1, 100, 100);
        for index in 0..4 {
            assert!(matches!(
                insert(&mut t, 1, h, index, bytes(1, 0)),
                Inserted::Buffered
            ));
        }
        assert_eq!(t.charged(), 4 * MIN_PART_CHARGE);
        assert!(matches!(
            insert(&mut t, 1, h, 4, bytes(1, 0)),
            Inserted::Refused
        ));
    }

    #[test]
    fn idle_partial_messages_are_swept_and_settled_ones_dropped() {
        let ttl = Duration::from_secs(10);
        let mut t = Table::new(1000, Some(ttl));
        let t0 = Instant::now();
        t.insert(1, 1, header(5, 2, 20), 0, bytes(10, 0), t0, |_| true);
        t.insert(
            2,
            2,
            header(5, 2, 20),
            0,
            bytes(10, 0),
            t0 + ttl / 2,
            |_| true,
        );
        assert_eq!(t.next_deadline(), Some(t0 + ttl));
        assert_eq!(t.sweep(t0 + ttl, |_| true), 1);
        assert_eq!(t.next_deadline(), Some(t0 + ttl / 2 + ttl));
        assert!(!t.drop_settled(2, 2, 4));
        assert!(t.drop_settled(2, 2, 5));
        assert_eq!((t.len(), t.charged(), t.stats().dropped), (0, 0, 2));
    }

    proptest::proptest! {
        /// Arbitrary chunk headers, indexes, lengths and keys, as a hostile peer could send
        /// them (after `check`): the bound always holds, and a message is handed out only
        /// whole, made of exactly the chunks inserted for it, in order.
        #[test]
        fn whatever_arrives_the_bound_holds_and_only_whole_messages_come_out(
            ops in proptest::collection::vec(
                (0u8..4, 1u64..6, 1u32..5, 1u64..40, 0u32..5, 1usize..20, proptest::bool::ANY),
                1..200,
            ),
        ) {
            let max = 100;
            let mut t = Table::new(max, Some(Duration::from_secs(5)));
            let now = Instant::now();
            // What the test saw inserted per (key, first seq): header and parts.
            let mut model: HashMap<(u8, u64), (ChunkHeader, BTreeMap<u32, Bytes>)> = HashMap::new();
            let mut held = Vec::new();
            for (step, (key, first, chunks, len, index, size, release)) in ops.into_iter().enumerate() {
                let h = header(first, chunks, len);
                let index = index % chunks;
                if size as u64 > len || u64::from(chunks) > len {
                    continue; // `check` refuses these before reassembly
                }
                let b = Bytes::from(vec![step as u8; size]);
                let entry = model.entry((key, first)).or_insert_with(|| (h, BTreeMap::new()));
                if entry.0 != h {
                    *entry = (h, BTreeMap::new());
                }
                entry.1.entry(index).or_insert_with(|| b.clone());
                match t.insert(key, key, h, index, b, now, |k| *k != 3) {
                    Inserted::Completed { message, charge } => {
                        let (expected_h, parts) = &model[&(key, first)];
                        proptest::prop_assert_eq!(*expected_h, h);
                        proptest::prop_assert_eq!(parts.len(), chunks as usize);
                        let expected: Vec<u8> = parts.values().flat_map(|p| p.to_vec()).collect();
                        proptest::prop_assert_eq!(expected.len() as u64, len);
                        proptest::prop_assert_eq!(read(message), expected);
                        model.remove(&(key, first));
                        held.push(charge);
                    }
                    Inserted::Conflicting | Inserted::Refused => {
                        model.remove(&(key, first));
                    }
                    Inserted::Buffered | Inserted::Duplicate => {}
                }
                // A partial message dropped behind the model's back (replaced, evicted) is
                // simply started again by later chunks: forget it when the table did.
                model.retain(|(k, f), _| t.partials.get(k).is_some_and(|p| p.header.first_seq == *f));
                if release {
                    if let Some(charge) = held.pop() {
                        t.release(charge);
                    }
                }
                let partial: u64 = t.partials.values().map(Partial::charge).sum();
                proptest::prop_assert_eq!(t.charged(), partial + held.iter().sum::<u64>());
                proptest::prop_assert!(t.charged() <= max);
                proptest::prop_assert!(t.len() <= 4, "one partial message per key");
            }
            t.sweep(now + Duration::from_secs(5), |_| true);
            proptest::prop_assert_eq!(t.charged(), held.iter().sum::<u64>());
        }
    }
}
