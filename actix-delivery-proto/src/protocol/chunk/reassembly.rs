//! Bounded reassembly: the chunks a consumer buffers until their message is whole. Pure: time
//! is an argument.
//!
//! # The rules
//!
//! - **One message per producer** (per key), of one of its incarnations (its *owner*, the
//!   dedup window): a *partial* message (being reassembled) or a *waiting* one (refused for
//!   room). Its chunks arrive in any order; one of a message *older* than the producer's (a
//!   lower first seq) replaces it (a partial one is dropped, counted: its producer sends it
//!   again), one of a *newer* message is refused (counted; its producer retransmits it). A
//!   chunk of another incarnation of the producer replaces it too: a restarted producer's
//!   earlier life settled its messages as stopped, so a partial one of it (a straggler's)
//!   could only hold memory. (Two live producers that share an id would keep replacing each
//!   other's messages: ids must be unique.)
//! - **A message reserves its room with its first buffered chunk**: its whole length, and at
//!   least [`MIN_PART_CHARGE`] per chunk ([`reservation`]), so that a message of tiny chunks
//!   is bounded like one of large ones. Its other chunks never wait for room: a message once
//!   started can always complete. Reservations, with the completed messages handed out and not
//!   released yet (messages waiting for the handler), never exceed `max_bytes`, whatever a
//!   peer sends; a message whose reservation alone exceeds it is refused by
//!   [`check`](super::check).
//! - **A partial message lives at most its [`Lifetime`]**, `grace + message_len / min_rate`
//!   from its first buffered chunk, whatever arrives later: then it is dropped at the next
//!   [`sweep`](Reassembly::sweep) (a producer that stopped for good, a peer that never sends
//!   the last chunk, or one that trickles chunks to keep its room).
//! - **Room goes to messages in the order they were first seen.** A message refused for room
//!   keeps its place in line (its *age*: when it was first seen) while its producer
//!   retransmits it at least once per `grace`, and so does a partial message dropped for room,
//!   with what is left of its lifetime (started again, it goes on with that). A message whose
//!   reservation does not fit takes room from the partial messages of producers that are gone,
//!   then:
//!   - the **oldest** message (first seen, among the partial and waiting ones) from younger
//!     partial messages, the youngest first;
//!   - another message, if its reservation is within its **share** (the room less the
//!     completed messages not released and the oldest message's reservation, divided among
//!     the producers with a partial or waiting message but the oldest's), from the partial
//!     messages that reserved more than the share, the largest first (never the oldest's):
//!     once they are gone it fits, since no one else holds more than a share;
//!   - otherwise it is refused and waits.
//! - **A chunk must agree** with its message's earlier chunks (chunk count and message
//!   length) and the chunks must add up to the message's length exactly; otherwise the
//!   partial message is dropped.
//!
//! A completed message is handed out in chunk order ([`Assembled`]); it is never handed out
//! before every chunk arrived.
//!
//! # How long a message waits for room
//!
//! A message within its share does not wait. Any other waits at most until it is the oldest,
//! and then no longer (as far as completed messages waiting for the handler leave room): each
//! message seen before it is dropped within its lifetime once it is started, and is started at
//! the latest when it is the oldest and retransmitted. So a message waits at most, for each
//! producer with a message seen before it, that message's lifetime and one retransmission
//! interval. Producers that started messages before it and never finish them, in a burst or
//! trickling a chunk now and then to keep their room, keep it out at most until those reach
//! their lifetime: `grace + their length / min_rate` (5.1 s for messages of 128 KiB at the
//! consumer's defaults). Messages first seen after it never delay it.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::chunk::{Assembled, ChunkHeader};

/// The least a chunk is charged, in bytes: covers its bookkeeping, so that tiny chunks cannot
/// hold more memory than the bound says.
pub const MIN_PART_CHARGE: u64 = 128;

/// What a message of `chunk`'s header reserves of the bound while it is reassembled and until
/// it is released: its length, and at least [`MIN_PART_CHARGE`] per chunk.
pub fn reservation(chunk: &ChunkHeader) -> u64 {
    chunk
        .message_len
        .max(u64::from(chunk.chunks) * MIN_PART_CHARGE)
}

/// How long a partial message may take from its first buffered chunk: `grace`, and its length
/// at `min_rate` bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// What every message gets, whatever its length; also how long a waiting message keeps
    /// its place without being retransmitted.
    pub grace: Duration,
    /// The slowest rate, in bytes per second, at which a message is expected to arrive
    /// (positive).
    pub min_rate: u64,
}

impl Lifetime {
    /// The lifetime of a message of `message_len` bytes.
    pub fn of(&self, message_len: u64) -> Duration {
        let nanos = u128::from(message_len) * 1_000_000_000 / u128::from(self.min_rate.max(1));
        let transfer = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.grace.saturating_add(transfer)
    }
}

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
    /// Not buffered: an older message of the same key is being reassembled or waits, or no
    /// room (the message waits). Its producer retransmits it.
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
    /// Partial messages dropped: replaced by an older one, displaced for room, at the end of
    /// their lifetime, gone with their key, stale, or contradicted.
    pub dropped: u64,
    /// Chunks refused (a newer message than the producer's, or no room).
    pub refused: u64,
}

#[derive(Debug)]
struct Partial<W> {
    owner: W,
    header: ChunkHeader,
    parts: BTreeMap<u32, Bytes>,
    received: u64,
    /// Its [`reservation`].
    reserved: u64,
    /// Its place in line: lower was seen first.
    age: u64,
    /// The end of its lifetime.
    expires: Instant,
}

/// A message refused for room, keeping its place in line.
#[derive(Debug)]
struct Waiting<W> {
    owner: W,
    first_seq: u64,
    age: u64,
    /// Forgotten unless retransmitted by then (and at the end of its lifetime).
    expires: Instant,
    /// The end of its lifetime, if it was started (and dropped for room).
    ends: Option<Instant>,
}

/// The partial and waiting messages of every key (producer), each of an owner (one of its
/// incarnations), bounded in bytes and in time.
#[derive(Debug)]
pub struct Reassembly<K, W> {
    partials: HashMap<K, Partial<W>>,
    waiting: HashMap<K, Waiting<W>>,
    /// Partial messages' reservations plus the completed ones not released.
    charged: u64,
    /// Partial messages' reservations.
    reserved: u64,
    max_bytes: u64,
    lifetime: Lifetime,
    next_age: u64,
    stats: ReassemblyStats,
}

impl<K: Copy + Eq + Hash, W: Copy + Eq> Reassembly<K, W> {
    /// At most `max_bytes` charged at once; partial messages dropped at the end of their
    /// `lifetime`.
    pub fn new(max_bytes: u64, lifetime: Lifetime) -> Self {
        Self {
            partials: HashMap::new(),
            waiting: HashMap::new(),
            charged: 0,
            reserved: 0,
            max_bytes,
            lifetime,
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
            _ => {
                let older_waits = self
                    .waiting
                    .get(&key)
                    .is_some_and(|w| w.owner == owner && w.first_seq < chunk.first_seq);
                chunk.chunks == 1 && !older_waits
            }
        }
    }

    /// Buffers chunk `index` (of a header that passed [`check`](super::check)) of `chunk`'s
    /// message under `key`, of `owner`, at `now`. `is_live` says whether an owner still
    /// exists (messages of owners that are gone make room first).
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
                return self.buffer(key, index, bytes);
            }
            if p.header.first_seq < chunk.first_seq {
                self.stats.refused += 1;
                return Inserted::Refused;
            }
            self.drop_partial(&key); // a newer message's: the older one goes first
        }
        // No partial message: the key's message may wait (a key has one or the other).
        if self
            .waiting
            .get(&key)
            .is_some_and(|w| w.owner != owner || now >= w.expires)
        {
            self.waiting.remove(&key); // another incarnation's, or its time is up
        }
        let (mut age, mut ends) = (None, None);
        if let Some(w) = self.waiting.get(&key) {
            if w.first_seq < chunk.first_seq {
                self.stats.refused += 1;
                return Inserted::Refused;
            }
            if w.first_seq == chunk.first_seq {
                (age, ends) = (Some(w.age), w.ends);
            }
        }
        let age = age.unwrap_or_else(|| {
            self.next_age += 1;
            self.next_age
        });
        let need = reservation(&chunk);
        if !self.make_room(key, age, need, now, is_live) {
            self.stats.refused += 1;
            let retransmitted_by = now + self.lifetime.grace;
            let waiting = Waiting {
                owner,
                first_seq: chunk.first_seq,
                age,
                expires: ends.map_or(retransmitted_by, |ends| ends.min(retransmitted_by)),
                ends,
            };
            self.waiting.insert(key, waiting);
            return Inserted::Refused;
        }
        self.waiting.remove(&key);
        self.reserved += need;
        self.charged += need;
        // A message dropped for room goes on with what is left of its lifetime.
        let expires = ends.unwrap_or_else(|| now + self.lifetime.of(chunk.message_len));
        self.partials.insert(
            key,
            Partial {
                owner,
                header: chunk,
                parts: BTreeMap::new(),
                received: 0,
                reserved: need,
                age,
                expires,
            },
        );
        self.buffer(key, index, bytes)
    }

    /// Buffers a chunk of `key`'s partial message (its room reserved).
    fn buffer(&mut self, key: K, index: u32, bytes: Bytes) -> Inserted {
        let partial = self.partials.get_mut(&key).expect("checked by the caller");
        let received = partial.received + bytes.len() as u64;
        if received > partial.header.message_len {
            self.drop_partial(&key);
            return Inserted::Conflicting;
        }
        partial.parts.insert(index, bytes);
        partial.received = received;
        if partial.parts.len() < partial.header.chunks as usize {
            return Inserted::Buffered;
        }
        let partial = self.partials.remove(&key).expect("present: inserted above");
        self.reserved -= partial.reserved;
        if partial.received != partial.header.message_len {
            self.charged -= partial.reserved;
            self.stats.dropped += 1;
            return Inserted::Conflicting;
        }
        self.stats.assembled += 1;
        Inserted::Completed {
            message: Assembled::new(partial.parts.into_values()),
            charge: partial.reserved,
        }
    }

    /// A completed message's `charge` is no longer held (it runs, or was dropped).
    pub fn release(&mut self, charge: u64) {
        debug_assert!(charge <= self.charged, "released more than was charged");
        self.charged = self.charged.saturating_sub(charge);
    }

    /// Drops `key`'s message of `owner` if its first seq is at or below `floor` (its producer
    /// declared it settled: it will never complete).
    pub fn drop_settled(&mut self, key: K, owner: W, floor: u64) {
        let settled = |first_seq: u64, of: W| of == owner && first_seq <= floor;
        if let Some(p) = self.partials.get(&key)
            && settled(p.header.first_seq, p.owner)
        {
            self.drop_partial(&key);
        }
        if let Some(w) = self.waiting.get(&key)
            && settled(w.first_seq, w.owner)
        {
            self.waiting.remove(&key);
        }
    }

    /// Drops the partial messages at the end of their lifetime at `now`, and forgets the
    /// waiting ones not retransmitted for `grace`; both of owners that are gone too. How many
    /// partial messages it dropped.
    pub fn sweep(&mut self, now: Instant, mut is_live: impl FnMut(&W) -> bool) -> usize {
        self.waiting
            .retain(|_, w| now < w.expires && is_live(&w.owner));
        self.drop_partials(|p| now >= p.expires || !is_live(&p.owner))
    }

    /// When the next partial message reaches the end of its lifetime, or a waiting one is
    /// forgotten (`None`: none is held).
    pub fn next_deadline(&self) -> Option<Instant> {
        let partials = self.partials.values().map(|p| p.expires);
        let waiting = self.waiting.values().map(|w| w.expires);
        partials.chain(waiting).min()
    }

    /// The most bytes charged at once.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes charged now: partial messages' reservations and completed ones not released.
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

    /// Messages waiting for room now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Counters since it was made.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Forgets everything (the consumer stopped): nothing is charged any more.
    pub fn clear(&mut self) {
        self.partials.clear();
        self.waiting.clear();
        self.charged = 0;
        self.reserved = 0;
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

    /// Drops `key`'s partial message (counted), returning it.
    fn drop_partial(&mut self, key: &K) -> Option<Partial<W>> {
        let partial = self.partials.remove(key)?;
        self.reserved -= partial.reserved;
        self.charged -= partial.reserved;
        self.stats.dropped += 1;
        Some(partial)
    }

    /// Drops `key`'s partial message for room: its message waits, keeping its place and what
    /// is left of its lifetime.
    fn displace(&mut self, key: &K, now: Instant) {
        if let Some(partial) = self.drop_partial(key) {
            let waiting = Waiting {
                owner: partial.owner,
                first_seq: partial.header.first_seq,
                age: partial.age,
                expires: (now + self.lifetime.grace).min(partial.expires),
                ends: Some(partial.expires),
            };
            self.waiting.insert(*key, waiting);
        }
    }

    /// Whether `need` more bytes fit the bound now.
    fn fits(&self, need: u64) -> bool {
        self.charged.saturating_add(need) <= self.max_bytes
    }

    /// Makes room for `need` bytes for `key`'s message of `age` (`key` has no partial
    /// message): see the module docs. Whether it fits now.
    fn make_room(
        &mut self,
        key: K,
        age: u64,
        need: u64,
        now: Instant,
        mut is_live: impl FnMut(&W) -> bool,
    ) -> bool {
        if self.fits(need) {
            return true;
        }
        self.waiting
            .retain(|_, w| now < w.expires && is_live(&w.owner));
        self.drop_partials(|p| !is_live(&p.owner));
        let others = self.partials.iter().map(|(k, p)| (p.age, *k));
        let waiting = self.waiting.iter().map(|(k, w)| (w.age, *k));
        let oldest = others
            .chain(waiting)
            .filter(|(_, k)| *k != key)
            .min_by_key(|(age, _)| *age);
        let victims: Vec<K> = match oldest {
            None => Vec::new(),
            Some((oldest_age, _)) if age < oldest_age => {
                // The oldest message: younger ones give way, the youngest first.
                let mut younger: Vec<(u64, K)> =
                    self.partials.iter().map(|(k, p)| (p.age, *k)).collect();
                younger.sort_unstable_by_key(|(age, _)| std::cmp::Reverse(*age));
                younger.into_iter().map(|(_, k)| k).collect()
            }
            Some((_, oldest_key)) => {
                // Within its share, from those over theirs, the largest first.
                let completed = self.charged - self.reserved;
                let oldest_held = self.partials.get(&oldest_key).map_or(0, |p| p.reserved);
                let room = self.max_bytes.saturating_sub(completed + oldest_held);
                let asking = usize::from(!self.waiting.contains_key(&key));
                let producers = self.partials.len() + self.waiting.len() + asking - 1;
                let share = room / producers as u64;
                if need > share {
                    return false;
                }
                let mut over: Vec<(u64, u64, K)> = self
                    .partials
                    .iter()
                    .filter(|(k, p)| **k != oldest_key && p.reserved > share)
                    .map(|(k, p)| (p.reserved, p.age, *k))
                    .collect();
                over.sort_unstable_by_key(|(reserved, age, _)| {
                    std::cmp::Reverse((*reserved, *age))
                });
                over.into_iter().map(|(.., k)| k).collect()
            }
        };
        for victim in victims {
            if self.fits(need) {
                break;
            }
            self.displace(&victim, now);
        }
        self.fits(need)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Keys and owners are numbers; the owner is the key unless a test says otherwise.
    type Table = Reassembly<u8, u8>;

    /// A grace of 5 s and 1 000 bytes per second.
    const LIFETIME: Lifetime = Lifetime {
        grace: Duration::from_secs(5),
        min_rate: 1000,
    };

    fn table(max_bytes: u64) -> Table {
        Table::new(max_bytes, LIFETIME)
    }

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

    fn insert_at(t: &mut Table, key: u8, h: ChunkHeader, index: u32, now: Instant) -> Inserted {
        let len = (h.message_len / u64::from(h.chunks)) as usize;
        t.insert(key, key, h, index, bytes(len, key), now, |_| true)
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

    /// Partial messages, waiting ones, dropped, refused, charged.
    fn counts(t: &Table) -> (usize, usize, u64, u64, u64) {
        let s = t.stats();
        (t.len(), t.waiting(), s.dropped, s.refused, t.charged())
    }

    #[test]
    fn chunks_in_any_order_complete_their_message_once_every_one_arrived() {
        let mut t = table(10_000);
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
    fn one_message_per_key_and_the_older_message_wins() {
        let mut t = table(1000);
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
        let mut t = table(1000);
        let h = header(1, 2, 20);
        let now = Instant::now();
        t.insert(1, 10, h, 0, bytes(10, 0), now, |_| true);
        // The producer restarted: its new life's first message replaces the old one's.
        let inserted = t.insert(1, 11, header(1, 3, 30), 0, bytes(10, 0), now, |_| true);
        assert!(matches!(inserted, Inserted::Buffered));
        assert_eq!((t.len(), t.stats().dropped), (1, 1));
        t.drop_settled(1, 10, 5);
        assert_eq!(t.len(), 1, "not the owner's");
        t.drop_settled(1, 11, 1);
        assert_eq!((t.len(), t.charged(), t.stats().dropped), (0, 0, 2));
    }

    #[test]
    fn chunks_that_contradict_their_message_drop_it() {
        let mut t = table(1000);
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
    fn a_message_reserves_its_room_with_its_first_chunk_and_can_always_complete() {
        let mut t = table(4000);
        let now = Instant::now();
        let big = header(1, 4, 2000);
        insert_at(&mut t, 1, big, 0, now);
        assert_eq!(t.charged(), 2000, "all of it, with its first chunk");
        insert_at(&mut t, 2, big, 0, now);
        assert!(
            matches!(insert_at(&mut t, 3, big, 0, now), Inserted::Refused),
            "no room left"
        );
        for index in 1..3 {
            assert!(matches!(
                insert_at(&mut t, 1, big, index, now),
                Inserted::Buffered
            ));
        }
        assert!(matches!(
            insert_at(&mut t, 1, big, 3, now),
            Inserted::Completed { .. }
        ));
        assert_eq!(counts(&t), (1, 1, 0, 1, 4000), "held until released");
        let tiny = header(1, 10, 10);
        assert_eq!(reservation(&tiny), 10 * MIN_PART_CHARGE, "tiny chunks");
    }

    #[test]
    fn a_partial_message_is_dropped_at_the_end_of_its_lifetime_however_often_chunks_arrive() {
        let mut t = table(10_000);
        let t0 = Instant::now();
        let h = header(1, 75, 7500); // 5 s and 7.5 s
        insert_at(&mut t, 1, h, 0, t0);
        let end = t0 + Duration::from_millis(12_500);
        assert_eq!(t.next_deadline(), Some(end));
        for index in 1..70 {
            let at = t0 + Duration::from_millis(100) * index;
            assert!(matches!(
                insert_at(&mut t, 1, h, index, at),
                Inserted::Buffered
            ));
            assert_eq!(t.next_deadline(), Some(end), "not extended by its chunks");
        }
        assert_eq!(t.sweep(end - Duration::from_millis(1), |_| true), 0);
        assert_eq!(t.sweep(end, |_| true), 1);
        assert_eq!(counts(&t), (0, 0, 1, 0, 0));
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn a_message_within_its_share_takes_room_from_those_over_theirs_the_largest_first() {
        let mut t = table(4000);
        let now = Instant::now();
        insert_at(&mut t, 1, header(1, 2, 1000), 0, now); // the oldest: never displaced
        insert_at(&mut t, 2, header(1, 2, 1800), 0, now);
        insert_at(&mut t, 3, header(1, 2, 1200), 0, now);
        assert_eq!(t.charged(), 4000);
        // Key 4's share: (4000 - 1000) / 3 producers = 1000.
        assert!(matches!(
            insert_at(&mut t, 4, header(1, 2, 1001), 0, now),
            Inserted::Refused
        ));
        assert_eq!(counts(&t), (3, 1, 0, 1, 4000), "over its share: it waits");
        // Key 5's share: (4000 - 1000) / 4 = 750, key 4 waiting too.
        assert!(matches!(
            insert_at(&mut t, 5, header(1, 2, 751), 0, now),
            Inserted::Refused
        ));
        assert!(matches!(
            insert_at(&mut t, 5, header(1, 2, 750), 0, now),
            Inserted::Buffered
        ));
        assert!(
            !t.partials.contains_key(&2) && t.partials.contains_key(&3),
            "the largest over its share first, only as many as needed"
        );
        assert_eq!(counts(&t), (3, 2, 1, 2, 2950), "key 2 waits, in its place");
        assert!(t.waiting[&2].age < t.waiting[&4].age);
    }

    #[test]
    fn the_oldest_message_takes_room_from_younger_ones_and_a_refused_one_keeps_its_place() {
        let mut t = table(3000);
        let t0 = Instant::now();
        let small = header(1, 5, 1000); // 6 s
        for key in 1..=3 {
            insert_at(&mut t, key, small, 0, t0);
        }
        // More than its share: it waits, seen after 1, 2 and 3.
        let large = header(1, 3, 3000);
        assert!(matches!(
            insert_at(&mut t, 9, large, 0, t0),
            Inserted::Refused
        ));
        let t1 = t0 + Duration::from_secs(6);
        for later in 1..12 {
            // Key 9 retransmits every 500 ms, keeping its place; the others trickle chunks.
            let at = t0 + Duration::from_millis(500) * later;
            assert!(matches!(
                insert_at(&mut t, 9, large, 1, at),
                Inserted::Refused
            ));
            for key in 1..=3 {
                insert_at(&mut t, key, small, later.min(3), at);
            }
        }
        assert_eq!(t.sweep(t1, |_| true), 3, "their lifetime is over");
        for key in 1..=3 {
            // Started again right away: new messages, younger than key 9's.
            insert_at(&mut t, key, small, 1, t1);
        }
        assert_eq!(counts(&t), (3, 1, 3, 12, 3000));
        assert!(matches!(
            insert_at(&mut t, 9, large, 1, t1),
            Inserted::Buffered
        ));
        assert_eq!(
            counts(&t),
            (1, 3, 6, 12, 3000),
            "all three gave way to the oldest"
        );
        for key in 1..=3 {
            assert!(matches!(
                insert_at(&mut t, key, small, 2, t1),
                Inserted::Refused
            ));
        }
        for index in [0, 2] {
            insert_at(&mut t, 9, large, index, t1);
        }
        assert_eq!(t.stats().assembled, 1);
    }

    #[test]
    fn a_message_dropped_for_room_goes_on_with_what_is_left_of_its_lifetime() {
        let mut t = table(3000);
        let t0 = Instant::now();
        let end = t0 + LIFETIME.of(2000); // 7 s
        insert_at(&mut t, 1, header(1, 4, 1000), 0, t0); // the oldest
        insert_at(&mut t, 2, header(1, 4, 2000), 0, t0);
        // Key 3 is within its share ((3000 - 1000) / 2 = 1000): key 2 gives way.
        let t1 = t0 + Duration::from_secs(1);
        insert_at(&mut t, 3, header(1, 1, 1000), 0, t1);
        assert_eq!(
            counts(&t),
            (1, 1, 1, 0, 2000),
            "key 3 completed, not released"
        );
        t.release(1000);
        let t2 = t0 + Duration::from_secs(2);
        assert!(matches!(
            insert_at(&mut t, 2, header(1, 4, 2000), 1, t2),
            Inserted::Buffered
        ));
        assert_eq!(t.partials[&2].expires, end, "not a new lifetime");
        // Given way again, it is forgotten at the end of its lifetime, however it retries.
        insert_at(&mut t, 3, header(2, 1, 1000), 0, t2);
        for later in 3..7 {
            let at = t0 + Duration::from_secs(later);
            insert_at(&mut t, 2, header(1, 4, 2000), 2, at);
        }
        let age = t.waiting[&2].age;
        assert_eq!(t.waiting[&2].expires, end);
        t.sweep(end, |_| true);
        assert!(!t.waiting.contains_key(&2), "its place is lost");
        insert_at(&mut t, 2, header(1, 4, 2000), 2, end); // room: key 1's lifetime is over
        let again = &t.partials[&2];
        assert!(again.age > age, "a new message, at the back");
        assert_eq!(
            again.expires,
            end + LIFETIME.of(2000),
            "with a lifetime of its own"
        );
    }

    #[test]
    fn a_waiting_message_not_retransmitted_within_the_grace_loses_its_place() {
        let mut t = table(1000);
        let t0 = Instant::now();
        insert_at(&mut t, 1, header(1, 2, 1000), 0, t0);
        assert!(matches!(
            insert_at(&mut t, 2, header(1, 2, 1000), 0, t0),
            Inserted::Refused
        ));
        let forgotten = t0 + LIFETIME.grace;
        assert_eq!(t.next_deadline(), Some(forgotten));
        t.sweep(forgotten, |_| true);
        assert_eq!(counts(&t), (1, 0, 0, 1, 1000));
        // Messages of producers that are gone make room first.
        let inserted = t.insert(3, 3, header(1, 2, 1000), 0, bytes(500, 3), t0, |owner| {
            *owner != 1
        });
        assert!(matches!(inserted, Inserted::Buffered));
        assert_eq!(counts(&t), (1, 0, 1, 1, 1000));
    }

    /// Forgets when the messages the table no longer holds were started (neither partial,
    /// nor waiting with their lifetime running).
    fn forget_finished(started: &mut HashMap<(u8, u64), (Instant, u64)>, t: &Table) {
        started.retain(|(k, f), _| {
            let partial = t.partials.get(k).is_some_and(|p| p.header.first_seq == *f);
            let waits = t
                .waiting
                .get(k)
                .is_some_and(|w| w.first_seq == *f && w.ends.is_some());
            partial || waits
        });
    }

    proptest::proptest! {
        /// Arbitrary chunk headers, indexes, lengths, keys and times, as a hostile peer could
        /// send them (after `check`): the bound always holds, a partial message never
        /// outlives its lifetime (counted from its first buffered chunk, whatever arrives
        /// later, dropped for room or not), one message per key, and a message is handed out
        /// only whole, made of exactly the chunks inserted for it, in order.
        #[test]
        fn whatever_arrives_the_bounds_hold_and_only_whole_messages_come_out(
            ops in proptest::collection::vec(
                (0u8..4, 1u64..6, 1u32..5, 1u64..400, 0u32..5, 1usize..200, 0u64..3000, proptest::bool::ANY),
                1..200,
            ),
        ) {
            let max = 1000;
            let lifetime = Lifetime { grace: Duration::from_secs(2), min_rate: 100 };
            let mut t = Table::new(max, lifetime);
            let mut now = Instant::now();
            // What the test saw inserted per (key, first seq) into the partial message of
            // the moment: header and parts.
            let mut model: HashMap<(u8, u64), (ChunkHeader, BTreeMap<u32, Bytes>)> = HashMap::new();
            // When each message was first started, and its length then.
            let mut started: HashMap<(u8, u64), (Instant, u64)> = HashMap::new();
            let mut held = Vec::new();
            for (step, (key, first, chunks, len, index, size, later, release)) in ops.into_iter().enumerate() {
                now += Duration::from_millis(later);
                let h = header(first, chunks, len);
                let index = index % chunks;
                if size as u64 > len || u64::from(chunks) > len || reservation(&h) > max {
                    continue; // `check` refuses these before reassembly
                }
                t.sweep(now, |k| *k != 3);
                forget_finished(&mut started, &t);
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
                        started.remove(&(key, first));
                        held.push(charge);
                    }
                    Inserted::Conflicting | Inserted::Refused => {
                        model.remove(&(key, first));
                    }
                    Inserted::Buffered | Inserted::Duplicate => {}
                }
                // A partial message dropped behind the model's back (replaced, displaced,
                // expired) is simply started again by later chunks: forget it when the table
                // did; its lifetime goes on while it waits after giving way.
                model.retain(|(k, f), _| t.partials.get(k).is_some_and(|p| p.header.first_seq == *f));
                forget_finished(&mut started, &t);
                for (k, p) in &t.partials {
                    let (at, len) = *started
                        .entry((*k, p.header.first_seq))
                        .or_insert((now, p.header.message_len));
                    proptest::prop_assert_eq!(p.expires, at + lifetime.of(len));
                    proptest::prop_assert!(now < p.expires, "swept at the end of its lifetime");
                    proptest::prop_assert!(!t.waiting.contains_key(k), "one message per key");
                }
                if release
                    && let Some(charge) = held.pop() {
                        t.release(charge);
                    }
                let reserved: u64 = t.partials.values().map(|p| p.reserved).sum();
                proptest::prop_assert_eq!(t.charged(), reserved + held.iter().sum::<u64>());
                proptest::prop_assert!(t.charged() <= max);
                proptest::prop_assert!(t.len() + t.waiting() <= 4, "one message per key");
            }
            t.sweep(now + Duration::from_secs(10), |_| true);
            proptest::prop_assert_eq!(t.charged(), held.iter().sum::<u64>());
            proptest::prop_assert_eq!((t.len(), t.waiting()), (0, 0));
        }
    }
}
