//! Duplicate suppression: one window per producer incarnation, kept in a table bounded by count
//! (LRU over producer ids), by incarnations per id, and by idleness (TTL sweep).
//!
//! The live consumer keys windows by the secret [`Incarnation`] token it mirrors in ACKs; a
//! persistent record keys them by the public `IncarnationId`. Both use
//! these very rules.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use hashbrown::HashSet;
use hashlink::LinkedHashMap;
use serde::{Deserialize, Serialize};

use crate::protocol::envelope::{Incarnation, ProducerId};

/// How many incarnation windows a producer id keeps at most (the most recently used ones):
/// room for the current and previous lives of a restarted producer and for a few live
/// producers that (mistakenly) share an id.
pub const MAX_INCARNATIONS_PER_ID: usize = 4;

/// Two incarnations of one producer id that both admit new messages over an overlapping span
/// this long are no restart (an old incarnation's stragglers overlap the new one for a moment):
/// several live producers share the id.
pub const SHARED_ID_GRACE: Duration = Duration::from_secs(10);

/// What one producer incarnation has been handled: every seq up to `contiguous`, plus the
/// out-of-order seqs above it. Also tracks the seqs admitted to the handler and waiting for it,
/// so that a retransmit of such a seq does not start the handler again.
///
/// The producer's `window_start` raises a `floor`: every seq at or below it is settled at the
/// producer (ACKed or given up). Such a seq is *stale* here: it is neither run nor ACKed again,
/// whether or not it was handled, so a `window_start` can never turn a message that was not
/// handled into a "duplicate" that is confirmed without a handler run.
#[derive(Debug)]
pub struct ProducerWindow<K = Incarnation> {
    incarnation: K,
    /// Every seq up to this one is settled: handled, or at or below `floor`.
    contiguous: u64,
    /// Seqs up to this one were declared settled by the producer (`window_start - 1`).
    floor: u64,
    /// The last seq of the newest message admitted to the handler (running, waiting or handed
    /// off): in ordered mode the next message starts right after it (or after `contiguous`).
    admitted: u64,
    last_seen: Instant,
    /// Unique within the table: tells this window from a later one of the same incarnation.
    generation: u64,
    /// Allocated on first need: most windows only ever see seqs in order.
    beyond: Option<Box<Beyond>>,
}

/// Seqs beyond the contiguous mark.
#[derive(Debug, Default)]
struct Beyond {
    /// Handled out of order.
    above: HashSet<u64>,
    /// Admitted to the handler and waiting for it (not the running one).
    waiting: HashSet<u64>,
    /// Handed off by a pipelined handler, awaiting the outcome that decides their ACK.
    deferred: HashSet<u64>,
}

impl<K: Copy> ProducerWindow<K> {
    fn new(incarnation: K, generation: u64, now: Instant) -> Self {
        Self {
            incarnation,
            contiguous: 0,
            floor: 0,
            admitted: 0,
            last_seen: now,
            generation,
            beyond: None,
        }
    }

    /// The incarnation this window describes.
    pub fn incarnation(&self) -> K {
        self.incarnation
    }

    /// Every seq up to this one was handled, or declared settled by the producer.
    pub fn contiguous(&self) -> u64 {
        self.contiguous
    }

    /// Every seq up to this one was declared settled by the producer (its `window_start`
    /// minus one): stale.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Seqs handled above `contiguous` (out of order).
    pub fn out_of_order(&self) -> usize {
        self.beyond.as_ref().map_or(0, |b| b.above.len())
    }

    /// The seqs handled above `contiguous`, in no particular order.
    pub fn above(&self) -> impl Iterator<Item = u64> + '_ {
        self.beyond.iter().flat_map(|b| b.above.iter().copied())
    }

    /// Seqs admitted to the handler and waiting for it.
    pub fn waiting(&self) -> usize {
        self.beyond.as_ref().map_or(0, |b| b.waiting.len())
    }

    /// Seqs handed off by a pipelined handler, awaiting their outcome.
    pub fn deferred(&self) -> usize {
        self.beyond.as_ref().map_or(0, |b| b.deferred.len())
    }

    /// Whether `seq` was handed off by a pipelined handler and awaits its outcome.
    pub fn is_deferred(&self, seq: u64) -> bool {
        self.beyond
            .as_ref()
            .is_some_and(|b| contains(&b.deferred, seq))
    }

    /// Marks `seq` as handed off, awaiting its outcome.
    pub fn begin_deferred(&mut self, seq: u64) {
        self.beyond.get_or_insert_default().deferred.insert(seq);
    }

    /// `seq`'s outcome arrived (or it was abandoned).
    pub fn end_deferred(&mut self, seq: u64) {
        if let Some(beyond) = &mut self.beyond
            && !beyond.deferred.is_empty()
        {
            beyond.deferred.remove(&seq);
        }
    }

    /// Whether `seq` was declared settled by the producer: never run nor ACKed again.
    pub fn is_stale(&self, seq: u64) -> bool {
        seq <= self.floor
    }

    /// Whether `seq` was handled already (and is not stale).
    pub fn is_handled(&self, seq: u64) -> bool {
        seq > self.floor
            && (seq <= self.contiguous
                || self
                    .beyond
                    .as_ref()
                    .is_some_and(|b| contains(&b.above, seq)))
    }

    /// Whether `seq` was admitted to the handler and waits for it.
    pub fn is_waiting(&self, seq: u64) -> bool {
        self.beyond
            .as_ref()
            .is_some_and(|b| contains(&b.waiting, seq))
    }

    /// Marks `seq` as admitted to the handler and waiting for it.
    pub fn begin_waiting(&mut self, seq: u64) {
        self.beyond.get_or_insert_default().waiting.insert(seq);
    }

    /// `seq` stops waiting (it starts running, or it is dropped); returns whether it was
    /// waiting.
    pub fn end_waiting(&mut self, seq: u64) -> bool {
        self.beyond
            .as_mut()
            .is_some_and(|b| !b.waiting.is_empty() && b.waiting.remove(&seq))
    }

    /// The handler for `seq` succeeded: record it, sliding `contiguous` over what was handled
    /// above it.
    pub fn complete(&mut self, seq: u64) {
        if seq == self.contiguous + 1 {
            self.contiguous = seq;
            self.slide();
        } else if seq > self.contiguous {
            self.beyond.get_or_insert_default().above.insert(seq);
        }
    }

    /// The handler for the message that took every seq from `first` through `last` (a chunked
    /// message) succeeded: record them all, so that `contiguous` passes them and none stays
    /// above it.
    pub fn complete_range(&mut self, first: u64, last: u64) {
        if first >= last {
            return self.complete(last);
        }
        if last <= self.contiguous {
            return;
        }
        if first <= self.contiguous + 1 {
            self.contiguous = last;
            if let Some(beyond) = &mut self.beyond
                && !beyond.above.is_empty()
            {
                beyond.above.retain(|&seq| seq > last);
            }
            self.slide();
        } else {
            let above = &mut self.beyond.get_or_insert_default().above;
            above.extend(first..=last);
        }
    }

    /// Where the next message must start in ordered mode: right after the newest message
    /// admitted to the handler, or after `contiguous`.
    pub fn next_in_order(&self) -> u64 {
        self.contiguous.max(self.admitted) + 1
    }

    /// A message ending at `last` was admitted to the handler (it runs or waits).
    pub fn note_admitted_through(&mut self, last: u64) {
        self.admitted = self.admitted.max(last);
    }

    /// Nothing of this producer incarnation is admitted any more (ordered mode dropped what
    /// waited behind a failed run): the next message starts after `contiguous`.
    pub fn reset_admitted(&mut self) {
        self.admitted = 0;
    }

    /// The producer says every seq below `window_start` is settled: raises the floor (it never
    /// moves down). Returns how many waiting seqs became stale (they must not run).
    #[inline]
    pub fn advance_to(&mut self, window_start: u64) -> usize {
        let settled = window_start.saturating_sub(1);
        if settled <= self.floor {
            return 0;
        }
        self.floor = settled;
        if settled <= self.contiguous {
            return 0; // nothing waits at or below the contiguous mark
        }
        self.contiguous = settled;
        let mut stale = 0;
        if let Some(beyond) = &mut self.beyond {
            beyond.above.retain(|&seq| seq > settled);
            let before = beyond.waiting.len();
            beyond.waiting.retain(|&seq| seq > settled);
            stale = before - beyond.waiting.len();
            // Their outcomes still come (and an ACK for a settled seq is harmless), but they no
            // longer count against the out-of-order bound.
            beyond.deferred.retain(|&seq| seq > settled);
        }
        self.slide();
        stale
    }

    fn slide(&mut self) {
        if let Some(beyond) = &mut self.beyond {
            while !beyond.above.is_empty() && beyond.above.remove(&(self.contiguous + 1)) {
                self.contiguous += 1;
            }
        }
    }
}

/// Set membership that skips hashing when the set is empty (the common case).
fn contains(set: &HashSet<u64>, seq: u64) -> bool {
    !set.is_empty() && set.contains(&seq)
}

/// How [`DedupTable::window_for`] found the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The window of this producer incarnation existed.
    Existing,
    /// The producer id was known, this incarnation is new to it; `replaced` says whether the
    /// id's least recently used window was dropped to stay within
    /// [`MAX_INCARNATIONS_PER_ID`].
    NewIncarnation {
        /// Whether another incarnation's window of the same id was dropped.
        replaced: bool,
    },
    /// The producer id was new; `evicted` says whether the least recently used producer's
    /// windows made room.
    Created {
        /// Whether another producer's windows were evicted to make room.
        evicted: bool,
    },
}

/// One window's durable content: what a persistent record stores in its snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowRecord<K> {
    /// The producer.
    pub producer_id: ProducerId,
    /// Its incarnation.
    pub incarnation: K,
    /// Seqs up to this one are stale.
    pub floor: u64,
    /// Seqs up to this one are settled.
    pub contiguous: u64,
    /// Seqs handled above `contiguous`, ascending.
    pub above: Vec<u64>,
}

/// Waiting seqs whose messages must not run any more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Orphaned {
    /// Became stale: their producer declared them settled (`window_start`).
    pub stale: usize,
    /// Their window was dropped (evicted, swept, replaced): their producers retransmit them.
    pub dropped: usize,
}

impl Orphaned {
    /// Both kinds.
    pub fn total(self) -> usize {
        self.stale + self.dropped
    }
}

/// Where a window lives: finds it again without a lookup, and finds nothing once that window
/// was evicted, swept or replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowRef {
    slot: usize,
    generation: u64,
}

impl WindowRef {
    /// Where the window's producer id is kept: the same for every incarnation window of an
    /// id while the id is tracked (a slot of an evicted id may be taken by another id later,
    /// whose windows are new ones).
    pub fn producer_slot(self) -> usize {
        self.slot
    }
}

/// The windows of one producer id, most recently used first.
#[derive(Debug)]
struct Slot<K> {
    first: ProducerWindow<K>,
    /// Rare: other incarnations (restarts, shared ids), most recently used first.
    others: Vec<ProducerWindow<K>>,
    /// Only while the id has several windows: per window (generation), when it first and
    /// last admitted a new message since then.
    activity: Vec<(u64, Instant, Instant)>,
}

impl<K: Copy + PartialEq> Slot<K> {
    fn new(window: ProducerWindow<K>) -> Self {
        Self {
            activity: Vec::new(),
            first: window,
            others: Vec::new(),
        }
    }

    fn windows(&self) -> impl Iterator<Item = &ProducerWindow<K>> {
        std::iter::once(&self.first).chain(&self.others)
    }

    fn waiting(&self) -> usize {
        self.windows().map(ProducerWindow::waiting).sum()
    }

    fn find(&mut self, generation: u64) -> Option<&mut ProducerWindow<K>> {
        if self.first.generation == generation {
            return Some(&mut self.first);
        }
        self.others.iter_mut().find(|w| w.generation == generation)
    }

    /// Makes `incarnation`'s window the first, if the id has one; whether it has.
    fn bring_forward(&mut self, incarnation: K) -> bool {
        if self.first.incarnation == incarnation {
            return true;
        }
        let Some(index) = self
            .others
            .iter()
            .position(|w| w.incarnation == incarnation)
        else {
            return false;
        };
        std::mem::swap(&mut self.first, &mut self.others[index]);
        self.others[..=index].rotate_right(1);
        true
    }

    /// Adds a new incarnation's window as the first; returns the window dropped to stay within
    /// [`MAX_INCARNATIONS_PER_ID`], if any.
    fn push_front(&mut self, window: ProducerWindow<K>) -> Option<ProducerWindow<K>> {
        let previous = std::mem::replace(&mut self.first, window);
        self.others.insert(0, previous);
        (self.others.len() >= MAX_INCARNATIONS_PER_ID).then(|| self.others.pop())?
    }
}

/// The per-producer windows, bounded by `max_producers` producer ids (least recently used
/// evicted first, with all its windows), by [`MAX_INCARNATIONS_PER_ID`] windows per id, and by
/// `idle_ttl` (idle producers swept at the cadence of the TTL). At most `max_producers ×
/// MAX_INCARNATIONS_PER_ID` windows exist at once.
///
/// Recency and idleness are one order: every admitted delivery moves its producer to the back,
/// so the front is both the least recently used and the longest idle producer. Lookups, recency
/// updates, evictions and sweeps are O(1) per window touched; a delivery from the most recent
/// producer incarnation (a batch, a busy producer) needs no lookup at all.
#[derive(Debug)]
pub struct DedupTable<K = Incarnation> {
    /// Producers in recency order (front: least recently used), each with its slot.
    order: LinkedHashMap<ProducerId, usize>,
    slots: Vec<Option<Slot<K>>>,
    free: Vec<usize>,
    /// The most recently used producer (the back of `order`) and its slot.
    newest: Option<(ProducerId, usize)>,
    /// Windows in all slots.
    windows: usize,
    next_generation: u64,
    /// Waiting seqs orphaned since last taken.
    orphaned: Orphaned,
    max_producers: Option<usize>,
    idle_ttl: Option<Duration>,
    next_sweep: Option<Instant>,
}

impl<K: Copy + PartialEq + Debug> DedupTable<K> {
    /// An empty table. `None` means unbounded (`max_producers`) or never (`idle_ttl`).
    ///
    /// # Panics
    /// If `max_producers` is `Some(0)` or `idle_ttl` is `Some(0)` (options validation rejects
    /// both before a table is built).
    pub fn new(max_producers: Option<usize>, idle_ttl: Option<Duration>) -> Self {
        assert!(max_producers != Some(0), "max_producers must be positive");
        assert!(
            idle_ttl != Some(Duration::ZERO),
            "idle_ttl must be positive"
        );
        Self {
            order: LinkedHashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            newest: None,
            windows: 0,
            next_generation: 0,
            orphaned: Orphaned::default(),
            max_producers,
            idle_ttl,
            next_sweep: None,
        }
    }

    /// The window of `producer_id`'s `incarnation`, created (evicting or replacing if full)
    /// as needed, marked as the most recently used, and advanced to `window_start`; with a
    /// reference to find it again.
    ///
    /// Inlined: a delivery of the newest producer incarnation with the sweep scheduled (a
    /// batch, a busy producer: nearly every delivery) needs two comparisons; everything else
    /// is out of line (`locate`).
    #[inline]
    pub fn window_for(
        &mut self,
        producer_id: &ProducerId,
        incarnation: K,
        window_start: u64,
        now: Instant,
    ) -> (&mut ProducerWindow<K>, WindowRef, Lookup) {
        let sweep_scheduled = self.next_sweep.is_some() || self.idle_ttl.is_none();
        let (slot_index, lookup) = match self.newest_slot(producer_id, incarnation) {
            Some(slot) if sweep_scheduled => (slot, Lookup::Existing),
            _ => self.locate(producer_id, incarnation, now),
        };
        let slot = self.slots[slot_index]
            .as_mut()
            .expect("find_or_insert returns an occupied slot");
        let window = &mut slot.first;
        window.last_seen = now;
        self.orphaned.stale += window.advance_to(window_start);
        let at = WindowRef {
            slot: slot_index,
            generation: window.generation,
        };
        (window, at, lookup)
    }

    /// The window `at` refers to, if it is still there (not evicted, swept or replaced).
    /// Does not touch its recency.
    pub fn window(&mut self, at: WindowRef) -> Option<&mut ProducerWindow<K>> {
        self.slots.get_mut(at.slot)?.as_mut()?.find(at.generation)
    }

    /// Whether the window `at` refers to is still there.
    pub fn is_live(&mut self, at: WindowRef) -> bool {
        self.window(at).is_some()
    }

    /// Notes that the window `at` admitted a new message at `now`. Returns whether another
    /// incarnation of the same id has admitted new messages over a span overlapping this one's
    /// by [`SHARED_ID_GRACE`] or more: several live producers share the id. (A restarted
    /// producer's old incarnation overlaps the new one only by its stragglers.)
    #[inline]
    pub fn note_admitted(&mut self, at: WindowRef, now: Instant) -> bool {
        let Some(slot) = self.slots.get_mut(at.slot).and_then(Option::as_mut) else {
            return false;
        };
        if slot.others.is_empty() {
            // One incarnation (the common case): nothing to compare, nothing to remember.
            if !slot.activity.is_empty() {
                slot.activity.clear();
            }
            return false;
        }
        Self::overlapping(slot, at, now)
    }

    fn overlapping(slot: &mut Slot<K>, at: WindowRef, now: Instant) -> bool {
        let live: Vec<u64> = slot.windows().map(|w| w.generation).collect();
        slot.activity
            .retain(|(generation, _, _)| live.contains(generation));
        let first = match slot
            .activity
            .iter_mut()
            .find(|(g, _, _)| *g == at.generation)
        {
            Some((_, first, last)) => {
                *last = now;
                *first
            }
            None => {
                slot.activity.push((at.generation, now, now));
                now
            }
        };
        slot.activity
            .iter()
            .any(|&(generation, other_first, other_last)| {
                generation != at.generation
                    && other_last.saturating_duration_since(first.max(other_first))
                        >= SHARED_ID_GRACE
            })
    }

    /// The waiting seqs orphaned since the last call: their messages must not run.
    pub fn take_orphaned(&mut self) -> Orphaned {
        std::mem::take(&mut self.orphaned)
    }

    /// The window of `id`'s `incarnation`, if there is one, without touching any recency.
    pub fn peek(&self, id: &str, incarnation: K) -> Option<&ProducerWindow<K>> {
        // The newest producer's slot is known without hashing its id (an entity's record
        // mostly holds one: the stream its commands come on).
        let slot = match &self.newest {
            Some((newest, slot)) if newest.as_str() == id => *slot,
            _ => *self.order.get(id)?,
        };
        self.slots[slot]
            .as_ref()?
            .windows()
            .find(|window| window.incarnation == incarnation)
    }

    /// What the table holds, as records: least recently used producer first, each producer's
    /// windows least recently used first, so that [`restore`](Self::restore) rebuilds the same
    /// recency order. Waiting seqs are not part of it.
    pub fn records(&self) -> Vec<WindowRecord<K>> {
        let mut records = Vec::with_capacity(self.windows);
        for (id, &slot) in self.order.iter() {
            let Some(slot) = &self.slots[slot] else {
                continue;
            };
            let windows = std::iter::once(&slot.first).chain(&slot.others);
            let mut of_id: Vec<WindowRecord<K>> = windows
                .map(|window| {
                    let mut above: Vec<u64> = window.above().collect();
                    above.sort_unstable();
                    WindowRecord {
                        producer_id: id.clone(),
                        incarnation: window.incarnation,
                        floor: window.floor,
                        contiguous: window.contiguous,
                        above,
                    }
                })
                .collect();
            of_id.reverse();
            records.extend(of_id);
        }
        records
    }

    /// Adds the windows of `records` (as [`records`](Self::records) made them) in order, each
    /// as the most recently used, within the table's bounds.
    pub fn restore(&mut self, records: impl IntoIterator<Item = WindowRecord<K>>, now: Instant) {
        for record in records {
            let window_start = record.floor.saturating_add(1);
            let (window, _, _) =
                self.window_for(&record.producer_id, record.incarnation, window_start, now);
            if record.contiguous > window.contiguous {
                window.contiguous = record.contiguous;
            }
            for seq in record.above {
                window.complete(seq);
            }
        }
        self.orphaned = Orphaned::default();
    }

    /// The most recently used window of producer `id`, without touching its recency.
    pub fn get(&self, id: &str) -> Option<&ProducerWindow<K>> {
        let &slot = self.order.get(id)?;
        self.slots[slot].as_ref().map(|s| &s.first)
    }

    /// Every window, least recently used producer first (its windows most recently used
    /// first), with its producer id.
    pub fn iter(&self) -> impl Iterator<Item = (&ProducerId, &ProducerWindow<K>)> {
        self.order.iter().flat_map(move |(id, &slot)| {
            self.slots[slot]
                .iter()
                .flat_map(Slot::windows)
                .map(move |window| (id, window))
        })
    }

    /// Number of producer ids tracked.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Number of windows (producer incarnations) tracked.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// Whether no producer is tracked.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// When the next idle sweep is due; `None` while there is nothing to sweep or the TTL is
    /// "never".
    pub fn next_sweep(&self) -> Option<Instant> {
        self.next_sweep
    }

    /// Runs the idle sweep if it is due: removes every producer idle for at least the TTL and
    /// schedules the next sweep one TTL later (if any producer is left). Returns how many
    /// windows were removed.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let (Some(ttl), Some(due)) = (self.idle_ttl, self.next_sweep) else {
            return 0;
        };
        if now < due {
            return 0;
        }
        let mut swept = 0;
        while let Some((_, &slot)) = self.order.front() {
            let idle = self.slots[slot]
                .as_ref()
                .is_some_and(|s| now.saturating_duration_since(s.first.last_seen) >= ttl);
            if !idle {
                break;
            }
            swept += self.remove_front();
        }
        self.next_sweep = (!self.order.is_empty()).then(|| now + ttl);
        swept
    }

    /// Forgets every window.
    pub fn clear(&mut self) {
        while self.remove_front() > 0 {}
        self.orphaned = Orphaned::default();
        self.next_sweep = None;
    }

    /// The slot of the most recently used producer, if that is `producer_id` and its most
    /// recently used window is `incarnation`'s.
    #[inline]
    fn newest_slot(&self, producer_id: &ProducerId, incarnation: K) -> Option<usize> {
        let (id, slot) = self.newest.as_ref()?;
        let first = &self.slots[*slot].as_ref()?.first;
        (id == producer_id && first.incarnation == incarnation).then_some(*slot)
    }

    /// The slow path of [`window_for`](Self::window_for): schedules the sweep if it is not,
    /// and finds (or creates) the slot unless it is the newest one.
    #[cold]
    #[inline(never)]
    fn locate(
        &mut self,
        producer_id: &ProducerId,
        incarnation: K,
        now: Instant,
    ) -> (usize, Lookup) {
        if self.next_sweep.is_none() {
            self.next_sweep = self.idle_ttl.map(|ttl| now + ttl);
        }
        match self.newest_slot(producer_id, incarnation) {
            Some(slot) => (slot, Lookup::Existing),
            None => self.find_or_insert(producer_id, incarnation, now),
        }
    }

    /// Finds the producer's slot (moving it to the back) with `incarnation`'s window first,
    /// creating what is missing.
    fn find_or_insert(
        &mut self,
        producer_id: &ProducerId,
        incarnation: K,
        now: Instant,
    ) -> (usize, Lookup) {
        let (slot, lookup) = match self.order.to_back(producer_id).copied() {
            Some(slot) => {
                let generation = self.next_generation;
                let entry = self.slots[slot]
                    .as_mut()
                    .expect("ordered slots are occupied");
                if entry.bring_forward(incarnation) {
                    (slot, Lookup::Existing)
                } else {
                    self.next_generation += 1;
                    self.windows += 1;
                    let window = ProducerWindow::new(incarnation, generation, now);
                    let dropped = entry.push_front(window);
                    if let Some(dropped) = &dropped {
                        self.windows -= 1;
                        self.orphaned.dropped += dropped.waiting();
                    }
                    let replaced = dropped.is_some();
                    (slot, Lookup::NewIncarnation { replaced })
                }
            }
            None => {
                let full = self
                    .max_producers
                    .is_some_and(|max| self.order.len() >= max);
                let evicted = full && self.remove_front() > 0;
                let window = ProducerWindow::new(incarnation, self.next_generation, now);
                self.next_generation += 1;
                self.windows += 1;
                let entry = Some(Slot::new(window));
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.slots[slot] = entry;
                        slot
                    }
                    None => {
                        self.slots.push(entry);
                        self.slots.len() - 1
                    }
                };
                self.order.insert(producer_id.clone(), slot);
                (slot, Lookup::Created { evicted })
            }
        };
        self.newest = Some((producer_id.clone(), slot));
        (slot, lookup)
    }

    /// Drops the least recently used producer's windows; returns how many (0: none left).
    fn remove_front(&mut self) -> usize {
        let Some((_, slot)) = self.order.pop_front() else {
            return 0;
        };
        let entry = self.slots[slot].take().expect("ordered slots are occupied");
        let removed = 1 + entry.others.len();
        self.windows -= removed;
        self.orphaned.dropped += entry.waiting();
        self.free.push(slot);
        if self.order.is_empty() {
            self.newest = None;
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Table = DedupTable<u32>;

    fn window_for(
        table: &mut Table,
        id: &str,
        incarnation: u32,
        window_start: u64,
        now: Instant,
    ) -> (WindowRef, Lookup) {
        let (_, at, lookup) =
            table.window_for(&ProducerId::from(id), incarnation, window_start, now);
        (at, lookup)
    }

    fn touch(table: &mut Table, id: &str, incarnation: u32, now: Instant) -> Lookup {
        window_for(table, id, incarnation, 1, now).1
    }

    fn win<'t>(table: &'t mut Table, id: &str, incarnation: u32) -> &'t mut ProducerWindow<u32> {
        table
            .window_for(&ProducerId::from(id), incarnation, 1, Instant::now())
            .0
    }

    fn ids(table: &Table) -> Vec<&str> {
        table.order.keys().map(ProducerId::as_str).collect()
    }

    #[test]
    fn window_slides_contiguous_over_out_of_order_seqs() {
        let mut table = Table::new(None, None);
        let window = win(&mut table, "p", 1);
        window.complete(1);
        window.complete(3);
        assert_eq!((window.contiguous(), window.out_of_order()), (1, 1));
        assert!(window.is_handled(3) && !window.is_handled(2) && !window.is_handled(4));
        window.complete(2);
        assert_eq!((window.contiguous(), window.out_of_order()), (3, 0));
        window.complete(2);
        assert_eq!((window.contiguous(), window.out_of_order()), (3, 0));
    }

    #[test]
    fn a_range_is_marked_whole_and_closes_the_gap_below_it() {
        let mut table = Table::new(None, None);
        let window = win(&mut table, "p", 1);
        window.complete_range(4, 6);
        assert_eq!((window.contiguous(), window.out_of_order()), (0, 3));
        assert!((4..=6).all(|seq| window.is_handled(seq)) && !window.is_handled(3));
        window.complete(8);
        window.complete_range(1, 3);
        assert_eq!(
            (window.contiguous(), window.out_of_order()),
            (6, 1),
            "slid over the range above, up to the next gap"
        );
        window.complete_range(5, 7);
        assert_eq!((window.contiguous(), window.out_of_order()), (8, 0));
        assert_eq!(window.next_in_order(), 9);
        window.note_admitted_through(12);
        assert_eq!(
            window.next_in_order(),
            13,
            "after the newest admitted message"
        );
        window.reset_admitted();
        assert_eq!(window.next_in_order(), 9);
    }

    #[test]
    fn waiting_seqs_are_neither_handled_nor_forgotten() {
        let mut table = Table::new(None, None);
        let window = win(&mut table, "p", 1);
        window.begin_waiting(1);
        assert!(window.is_waiting(1) && !window.is_handled(1));
        assert!(window.end_waiting(1));
        assert!(!window.end_waiting(1), "it left already");
        assert!(!window.is_waiting(1) && !window.is_handled(1));
        window.complete(1);
        assert!(window.is_handled(1));
    }

    #[test]
    fn window_start_makes_lower_seqs_stale_never_handled() {
        let mut table = Table::new(None, None);
        let now = Instant::now();
        let id = ProducerId::from("p");
        let (window, _, _) = table.window_for(&id, 1, 1, now);
        window.complete(1);
        window.complete(6);
        window.begin_waiting(7);
        window.begin_waiting(3);
        // The producer settled everything below 5 (it ACKed 1 and gave 2..=4 up).
        let (window, _, _) = table.window_for(&id, 1, 5, now);
        assert_eq!((window.floor(), window.contiguous()), (4, 4));
        for seq in 1..=4 {
            assert!(window.is_stale(seq) && !window.is_handled(seq), "seq {seq}");
        }
        assert!(!window.is_waiting(3), "a stale seq stops waiting");
        assert!(window.is_waiting(7));
        window.complete(5);
        assert_eq!(window.contiguous(), 6, "slides over 6 handled before");
        assert!(window.is_handled(5) && window.is_handled(6) && !window.is_handled(7));
        let orphaned = table.take_orphaned();
        assert_eq!(
            orphaned,
            Orphaned {
                stale: 1,
                dropped: 0
            },
            "seq 3 went stale waiting"
        );
        // An older window_start never lowers the floor.
        let (window, _, _) = table.window_for(&id, 1, 2, now);
        assert_eq!(window.floor(), 4);
    }

    #[test]
    fn a_window_start_far_ahead_costs_nothing() {
        let mut table = Table::new(None, None);
        let now = Instant::now();
        let id = ProducerId::from("p");
        let (window, _, _) = table.window_for(&id, 1, 1, now);
        for seq in [2, 4, 6] {
            window.complete(seq);
        }
        let (window, _, _) = table.window_for(&id, 1, 1 << 50, now);
        assert_eq!(
            (window.contiguous(), window.out_of_order()),
            ((1 << 50) - 1, 0)
        );
        assert!(window.is_stale(2) && !window.is_handled(4));
    }

    #[test]
    fn each_incarnation_has_its_own_window_and_a_straggler_resets_nothing() {
        let mut table = Table::new(None, None);
        let now = Instant::now();
        win(&mut table, "p", 1).complete(1);
        let lookup = touch(&mut table, "p", 2, now);
        assert_eq!(lookup, Lookup::NewIncarnation { replaced: false });
        win(&mut table, "p", 2).complete(1);
        win(&mut table, "p", 2).complete(2);
        // A late copy from incarnation 1 finds its own window; 2's is untouched.
        assert_eq!(touch(&mut table, "p", 1, now), Lookup::Existing);
        assert!(win(&mut table, "p", 1).is_handled(1));
        assert_eq!(win(&mut table, "p", 2).contiguous(), 2);
        assert_eq!((table.len(), table.windows()), (1, 2));
    }

    #[test]
    fn an_id_keeps_its_most_recently_used_incarnations() {
        let mut table = Table::new(None, None);
        let now = Instant::now();
        for incarnation in 1..=MAX_INCARNATIONS_PER_ID as u32 {
            win(&mut table, "p", incarnation).complete(1);
        }
        touch(&mut table, "p", 1, now); // 2 is now the least recently used
        let lookup = touch(&mut table, "p", 99, now);
        assert_eq!(lookup, Lookup::NewIncarnation { replaced: true });
        assert_eq!(table.windows(), MAX_INCARNATIONS_PER_ID);
        assert!(win(&mut table, "p", 1).is_handled(1), "recently used: kept");
        assert!(
            !win(&mut table, "p", 2).is_handled(1),
            "the LRU one was dropped"
        );
        assert!(table
            .iter()
            .all(|(id, window)| id.as_str() == "p" && window.incarnation() != 3));
    }

    #[test]
    fn only_two_incarnations_active_together_for_a_grace_period_mean_a_shared_id() {
        let mut table = Table::new(None, None);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (old, _) = window_for(&mut table, "p", 1, 1, t0);
        assert!(
            !table.note_admitted(old, t0),
            "one incarnation: nothing to compare"
        );
        // Restarts every 5 s, each with a second of stragglers of the previous incarnation.
        let mut previous = old;
        for restart in 1..=5u64 {
            let (next, _) = window_for(&mut table, "p", restart as u32 + 1, 1, at(restart * 5_000));
            for ms in (0..1_000).step_by(100) {
                let now = at(restart * 5_000 + ms);
                assert!(!table.note_admitted(next, now) && !table.note_admitted(previous, now));
            }
            assert!(!table.note_admitted(next, at(restart * 5_000 + 4_900)));
            previous = next;
        }
        // Two live producers on one id: both keep admitting.
        let (a, _) = window_for(&mut table, "q", 1, 1, at(0));
        let (b, _) = window_for(&mut table, "q", 2, 1, at(0));
        let shared: Vec<bool> = (0..30)
            .map(|n| table.note_admitted(a, at(n * 1_000)) | table.note_admitted(b, at(n * 1_000)))
            .collect();
        assert!(!shared[..10].contains(&true), "not before the grace period");
        assert!(shared[10..].iter().all(|&s| s), "all along after it");
    }

    #[test]
    fn window_refs_go_stale_when_their_window_is_replaced_evicted_or_swept() {
        let ttl = Duration::from_secs(1);
        let mut table = Table::new(Some(1), Some(ttl));
        let t0 = Instant::now();
        let (first, _) = window_for(&mut table, "p", 0, 1, t0);
        for incarnation in 1..MAX_INCARNATIONS_PER_ID as u32 {
            window_for(&mut table, "p", incarnation, 1, t0);
            assert!(table.is_live(first));
        }
        let (replacing, _) = window_for(&mut table, "p", 99, 1, t0);
        assert!(!table.is_live(first), "replaced by a newer incarnation");
        let (other, _) = window_for(&mut table, "q", 1, 1, t0);
        assert!(!table.is_live(replacing), "evicted");
        assert_eq!(table.sweep(t0 + ttl), 1);
        assert!(!table.is_live(other), "swept");
        let (again, lookup) = window_for(&mut table, "q", 1, 2, t0 + ttl);
        assert_eq!(lookup, Lookup::Created { evicted: false });
        assert!(table.is_live(again) && again != other);
    }

    #[test]
    fn lru_evicts_the_least_recently_used_in_exact_order() {
        let mut table = Table::new(Some(3), None);
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            assert_eq!(
                touch(&mut table, id, 1, now),
                Lookup::Created { evicted: false }
            );
        }
        // A duplicate refreshes recency just like a new seq: "a" becomes most recent.
        touch(&mut table, "a", 1, now);
        assert_eq!(ids(&table), ["b", "c", "a"]);
        assert_eq!(
            touch(&mut table, "d", 1, now),
            Lookup::Created { evicted: true }
        );
        assert_eq!(ids(&table), ["c", "a", "d"]);
        touch(&mut table, "c", 1, now);
        touch(&mut table, "e", 1, now);
        assert_eq!(ids(&table), ["d", "c", "e"]);
        // Lookups without recency (observability, outcome recording) do not reorder.
        assert!(table.get("d").is_some());
        touch(&mut table, "f", 1, now);
        assert_eq!(ids(&table), ["c", "e", "f"]);
    }

    #[test]
    fn evicting_a_producer_drops_all_its_windows_and_counts_their_waiting_seqs() {
        let mut table = Table::new(Some(1), None);
        let now = Instant::now();
        win(&mut table, "p", 1).begin_waiting(2);
        win(&mut table, "p", 2).begin_waiting(5);
        win(&mut table, "p", 2).begin_waiting(6);
        touch(&mut table, "q", 1, now);
        assert_eq!((table.len(), table.windows()), (1, 1));
        assert_eq!(
            table.take_orphaned(),
            Orphaned {
                stale: 0,
                dropped: 3
            }
        );
        assert_eq!(table.take_orphaned().total(), 0);
    }

    #[test]
    fn records_restore_the_same_windows_in_the_same_recency_order() {
        let mut table = Table::new(Some(3), None);
        let now = Instant::now();
        let id = |s: &str| ProducerId::from(s);
        let (w, _, _) = table.window_for(&id("a"), 1, 1, now);
        w.complete(1);
        w.complete(3);
        table.window_for(&id("b"), 7, 5, now).0.complete(9);
        table.window_for(&id("a"), 2, 1, now).0.complete(1);
        table.window_for(&id("c"), 1, 1, now);
        table.window_for(&id("a"), 1, 1, now); // a's incarnation 1 most recent again
        let records = table.records();
        let mut restored = Table::new(Some(3), None);
        restored.restore(records.clone(), now);
        assert_eq!(restored.records(), records);
        assert_eq!(ids(&restored), ids(&table));
        let a1 = restored.peek("a", 1).unwrap();
        assert!(a1.is_handled(1) && a1.is_handled(3) && !a1.is_handled(2));
        let b7 = restored.peek("b", 7).unwrap();
        assert!(b7.is_stale(4) && b7.is_handled(9) && !b7.is_handled(5));
        assert!(restored.peek("a", 3).is_none() && restored.peek("d", 1).is_none());
        // A fourth producer evicts the least recently used one in both.
        table.window_for(&id("d"), 1, 1, now);
        restored.window_for(&id("d"), 1, 1, now);
        assert_eq!(ids(&restored), ids(&table));
    }

    #[test]
    fn peek_finds_the_newest_producer_and_nothing_of_one_evicted_or_swept() {
        let mut table = Table::new(Some(1), Some(Duration::from_secs(1)));
        let now = Instant::now();
        let id = |s: &str| ProducerId::from(s);
        table.window_for(&id("a"), 1, 1, now).0.complete(1);
        assert!(table.peek("a", 1).is_some_and(|w| w.is_handled(1)));
        assert!(table.peek("a", 2).is_none(), "another incarnation");
        // "b" evicts "a" and takes its slot.
        table.window_for(&id("b"), 1, 1, now).0.complete(2);
        assert!(table.peek("a", 1).is_none(), "evicted");
        assert!(table
            .peek("b", 1)
            .is_some_and(|w| w.is_handled(2) && !w.is_handled(1)));
        table.sweep(now + Duration::from_secs(2));
        assert_eq!(table.len(), 0);
        assert!(table.peek("b", 1).is_none(), "swept");
    }

    #[test]
    fn flood_of_distinct_ids_stays_at_max_producers() {
        let mut table = Table::new(Some(64), None);
        let now = Instant::now();
        for i in 0..10_000 {
            touch(&mut table, &format!("flood-{i}"), 1, now);
            assert!(table.len() <= 64);
        }
        assert_eq!((table.len(), table.windows()), (64, 64));
        assert!(table.get("flood-9999").is_some() && table.get("flood-9935").is_none());
    }

    #[test]
    fn sweep_runs_at_the_ttl_cadence_and_removes_producers_idle_for_a_ttl() {
        let ttl = Duration::from_secs(10);
        let mut table = Table::new(None, Some(ttl));
        let t0 = Instant::now();
        assert_eq!(table.next_sweep(), None);
        touch(&mut table, "old", 1, t0);
        touch(&mut table, "old", 2, t0);
        assert_eq!(table.next_sweep(), Some(t0 + ttl));
        touch(&mut table, "young", 1, t0 + Duration::from_secs(5));
        assert_eq!(table.sweep(t0 + Duration::from_secs(9)), 0, "not due yet");
        assert_eq!(
            table.sweep(t0 + ttl),
            2,
            "both windows of the producer idle one TTL"
        );
        assert_eq!(ids(&table), ["young"]);
        assert_eq!(table.next_sweep(), Some(t0 + 2 * ttl));
        // "young" was idle 15 s at the second sweep: gone after one to two TTLs.
        assert_eq!(table.sweep(t0 + 2 * ttl), 1);
        assert!(table.is_empty());
        assert_eq!(table.next_sweep(), None, "nothing left: no sweep armed");
    }

    #[test]
    fn activity_keeps_a_window_alive() {
        let ttl = Duration::from_secs(10);
        let mut table = Table::new(None, Some(ttl));
        let t0 = Instant::now();
        touch(&mut table, "p", 1, t0);
        touch(&mut table, "p", 1, t0 + Duration::from_secs(9));
        assert_eq!(table.sweep(t0 + ttl), 0);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn ttl_never_arms_no_sweep() {
        let mut table = Table::new(Some(4), None);
        let t0 = Instant::now();
        touch(&mut table, "p", 1, t0);
        assert_eq!(table.next_sweep(), None);
        assert_eq!(table.sweep(t0 + Duration::from_secs(1_000_000)), 0);
        assert_eq!(table.len(), 1);
    }
}
