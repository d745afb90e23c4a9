//! Duplicate suppression: one window per producer, kept in a table bounded by count (LRU) and
//! by idleness (TTL sweep).

use std::time::{Duration, Instant};

use hashbrown::HashSet;
use hashlink::LinkedHashMap;

use crate::protocol::envelope::{Header, Incarnation, ProducerId};

/// What one producer incarnation has been handled: every seq up to `contiguous`, plus the
/// out-of-order seqs above it. Also tracks the seqs admitted to the handler and waiting for it,
/// so that a retransmit of such a seq does not start the handler again.
#[derive(Debug)]
pub struct ProducerWindow {
    incarnation: Incarnation,
    contiguous: u64,
    last_seen: Instant,
    /// Allocated on first need: most windows only ever see seqs in order.
    beyond: Option<Box<Beyond>>,
}

/// Seqs beyond the contiguous mark.
#[derive(Debug, Default)]
struct Beyond {
    /// Handled out of order.
    above: HashSet<u64>,
    /// Admitted to the handler and waiting for it.
    pending: HashSet<u64>,
}

impl ProducerWindow {
    fn new(incarnation: Incarnation, now: Instant) -> Self {
        Self {
            incarnation,
            contiguous: 0,
            last_seen: now,
            beyond: None,
        }
    }

    /// The incarnation this window describes.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Every seq up to this one was handled (or settled by the producer).
    pub fn contiguous(&self) -> u64 {
        self.contiguous
    }

    /// Seqs handled above `contiguous` (out of order).
    pub fn out_of_order(&self) -> usize {
        self.beyond.as_ref().map_or(0, |b| b.above.len())
    }

    /// Seqs admitted to the handler and waiting for it.
    pub fn pending(&self) -> usize {
        self.beyond.as_ref().map_or(0, |b| b.pending.len())
    }

    /// Whether `seq` was handled already.
    pub fn is_handled(&self, seq: u64) -> bool {
        seq <= self.contiguous
            || self
                .beyond
                .as_ref()
                .is_some_and(|b| contains(&b.above, seq))
    }

    /// Whether `seq` was admitted to the handler and waits for it.
    pub fn is_pending(&self, seq: u64) -> bool {
        self.beyond
            .as_ref()
            .is_some_and(|b| contains(&b.pending, seq))
    }

    /// Marks `seq` as admitted to the handler and waiting for it.
    pub fn begin(&mut self, seq: u64) {
        self.beyond.get_or_insert_default().pending.insert(seq);
    }

    /// The handler for `seq` failed: it is neither pending nor handled.
    pub fn abort(&mut self, seq: u64) {
        if let Some(beyond) = &mut self.beyond {
            if !beyond.pending.is_empty() {
                beyond.pending.remove(&seq);
            }
        }
    }

    /// The handler for `seq` succeeded: record it, sliding `contiguous` over what was handled
    /// above it.
    pub fn complete(&mut self, seq: u64) {
        self.abort(seq);
        if seq == self.contiguous + 1 {
            self.contiguous = seq;
            self.slide();
        } else if seq > self.contiguous {
            self.beyond.get_or_insert_default().above.insert(seq);
        }
    }

    /// The producer says every seq below `window_start` is settled: treat them as handled.
    fn advance_to(&mut self, window_start: u64) {
        let settled = window_start - 1;
        if settled <= self.contiguous {
            return;
        }
        self.contiguous = settled;
        if let Some(beyond) = &mut self.beyond {
            beyond.above.retain(|&seq| seq > settled);
            beyond.pending.retain(|&seq| seq > settled);
        }
        self.slide();
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
    /// The producer's window existed for this incarnation.
    Existing,
    /// The window described another incarnation and was replaced by a fresh one.
    Replaced,
    /// The producer was new; `evicted` says whether the least recently used window made room.
    Created {
        /// Whether another producer's window was evicted to make room.
        evicted: bool,
    },
}

/// Where a window lives: finds it again without a lookup, and finds nothing once that window
/// was evicted, swept or replaced by another incarnation's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRef {
    slot: usize,
    generation: u64,
}

#[derive(Debug)]
struct Slot {
    window: ProducerWindow,
    /// Advances whenever the slot's window is dropped or replaced.
    generation: u64,
}

/// The per-producer windows, bounded by `max_producers` (least recently used evicted first)
/// and by `idle_ttl` (idle windows swept at the cadence of the TTL).
///
/// Recency and idleness are one order: every admitted delivery moves its producer to the back,
/// so the front is both the least recently used and the longest idle window. Lookups, recency
/// updates, evictions and sweeps are O(1) per window touched; a delivery from the most recent
/// producer (a batch, a busy producer) needs no lookup at all.
#[derive(Debug)]
pub struct DedupTable {
    /// Producers in recency order (front: least recently used), each with its slot.
    order: LinkedHashMap<ProducerId, usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The most recently used producer (the back of `order`) and its slot.
    newest: Option<(ProducerId, usize)>,
    /// Waiting seqs of windows dropped (evicted, swept, replaced) since last taken.
    dropped_pending: usize,
    max_producers: Option<usize>,
    idle_ttl: Option<Duration>,
    next_sweep: Option<Instant>,
}

impl DedupTable {
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
            dropped_pending: 0,
            max_producers,
            idle_ttl,
            next_sweep: None,
        }
    }

    /// The window for `header`'s producer and incarnation, created (evicting if full) or
    /// replaced as needed, marked as the most recently used, and advanced to the header's
    /// `window_start`; with a reference to find it again.
    pub fn window_for(
        &mut self,
        header: &Header,
        now: Instant,
    ) -> (&mut ProducerWindow, WindowRef, Lookup) {
        if self.next_sweep.is_none() {
            self.next_sweep = self.idle_ttl.map(|ttl| now + ttl);
        }
        let (slot, mut lookup) = match &self.newest {
            Some((id, slot)) if *id == header.producer_id => (*slot, Lookup::Existing),
            _ => self.find_or_insert(header, now),
        };
        let entry = &mut self.slots[slot];
        if lookup == Lookup::Existing && entry.window.incarnation != header.incarnation {
            self.dropped_pending += entry.window.pending();
            entry.window = ProducerWindow::new(header.incarnation, now);
            entry.generation += 1;
            lookup = Lookup::Replaced;
        }
        entry.window.last_seen = now;
        entry.window.advance_to(header.window_start);
        let at = WindowRef {
            slot,
            generation: entry.generation,
        };
        (&mut entry.window, at, lookup)
    }

    /// The window `at` refers to, if it is still there (not evicted, swept or replaced).
    /// Does not touch its recency.
    pub fn window(&mut self, at: WindowRef) -> Option<&mut ProducerWindow> {
        self.slots
            .get_mut(at.slot)
            .filter(|entry| entry.generation == at.generation)
            .map(|entry| &mut entry.window)
    }

    /// Whether the window `at` refers to is still there.
    pub fn is_live(&self, at: WindowRef) -> bool {
        self.slots
            .get(at.slot)
            .is_some_and(|entry| entry.generation == at.generation)
    }

    /// How many waiting seqs belonged to windows dropped (evicted, swept or replaced) since the
    /// last call: their messages wait for a window that no longer exists.
    pub fn take_dropped_pending(&mut self) -> usize {
        std::mem::take(&mut self.dropped_pending)
    }

    /// The window of producer `id`, without touching its recency.
    pub fn get(&self, id: &str) -> Option<&ProducerWindow> {
        self.order.get(id).map(|&slot| &self.slots[slot].window)
    }

    /// Number of producers tracked.
    pub fn len(&self) -> usize {
        self.order.len()
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

    /// Runs the idle sweep if it is due: removes every window idle for at least the TTL and
    /// schedules the next sweep one TTL later (if any window is left). Returns how many
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
            if now.saturating_duration_since(self.slots[slot].window.last_seen) < ttl {
                break;
            }
            self.remove_front();
            swept += 1;
        }
        self.next_sweep = (!self.order.is_empty()).then(|| now + ttl);
        swept
    }

    /// Forgets every window.
    pub fn clear(&mut self) {
        while self.remove_front() {}
        self.dropped_pending = 0;
        self.next_sweep = None;
    }

    /// Finds the producer's slot (moving it to the back) or gives it a fresh one.
    fn find_or_insert(&mut self, header: &Header, now: Instant) -> (usize, Lookup) {
        let id = &header.producer_id;
        let (slot, lookup) = match self.order.to_back(id).copied() {
            Some(slot) => (slot, Lookup::Existing),
            None => {
                let full = self
                    .max_producers
                    .is_some_and(|max| self.order.len() >= max);
                let evicted = full && self.remove_front();
                let window = ProducerWindow::new(header.incarnation, now);
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.slots[slot].window = window;
                        slot
                    }
                    None => {
                        self.slots.push(Slot {
                            window,
                            generation: 0,
                        });
                        self.slots.len() - 1
                    }
                };
                self.order.insert(id.clone(), slot);
                (slot, Lookup::Created { evicted })
            }
        };
        self.newest = Some((id.clone(), slot));
        (slot, lookup)
    }

    /// Drops the least recently used window; false if there is none.
    fn remove_front(&mut self) -> bool {
        let Some((_, slot)) = self.order.pop_front() else {
            return false;
        };
        self.dropped_pending += self.slots[slot].window.pending();
        self.slots[slot].generation += 1;
        self.free.push(slot);
        if self.order.is_empty() {
            self.newest = None;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: &str, incarnation: u128, seq: u64) -> Header {
        Header {
            producer_id: ProducerId::from(id),
            incarnation: Incarnation::from_u128(incarnation),
            seq,
            window_start: 1,
        }
    }

    fn ids(table: &DedupTable) -> Vec<&str> {
        table.order.keys().map(ProducerId::as_str).collect()
    }

    #[test]
    fn window_slides_contiguous_over_out_of_order_seqs() {
        let mut table = DedupTable::new(None, None);
        let now = Instant::now();
        let (window, _, _) = table.window_for(&header("p", 1, 1), now);
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
    fn pending_seqs_are_neither_handled_nor_forgotten() {
        let mut table = DedupTable::new(None, None);
        let (window, _, _) = table.window_for(&header("p", 1, 1), Instant::now());
        window.begin(1);
        assert!(window.is_pending(1) && !window.is_handled(1));
        window.abort(1);
        assert!(!window.is_pending(1) && !window.is_handled(1));
        window.begin(1);
        window.complete(1);
        assert!(!window.is_pending(1) && window.is_handled(1));
    }

    #[test]
    fn window_start_marks_lower_seqs_settled() {
        let mut table = DedupTable::new(None, None);
        let now = Instant::now();
        let mut h = header("p", 1, 9);
        h.window_start = 5;
        let (window, _, _) = table.window_for(&h, now);
        assert_eq!(window.contiguous(), 4);
        window.complete(6);
        window.begin(7);
        h.window_start = 6;
        let (window, _, _) = table.window_for(&h, now);
        assert_eq!((window.contiguous(), window.out_of_order()), (6, 0));
        assert!(window.is_pending(7));
        // An older window_start never moves the window back.
        h.window_start = 2;
        let (window, _, _) = table.window_for(&h, now);
        assert_eq!(window.contiguous(), 6);
    }

    #[test]
    fn new_incarnation_replaces_the_window_in_place() {
        let mut table = DedupTable::new(None, None);
        let now = Instant::now();
        table.window_for(&header("p", 1, 1), now).0.complete(1);
        let (window, _, lookup) = table.window_for(&header("p", 2, 1), now);
        assert_eq!(lookup, Lookup::Replaced);
        assert_eq!(window.contiguous(), 0);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn window_refs_go_stale_when_their_window_is_replaced_evicted_or_swept() {
        let ttl = Duration::from_secs(1);
        let mut table = DedupTable::new(Some(1), Some(ttl));
        let t0 = Instant::now();
        let (_, first, _) = table.window_for(&header("p", 1, 1), t0);
        assert!(table.window(first).is_some());
        let (_, replaced, _) = table.window_for(&header("p", 2, 1), t0);
        assert!(
            table.window(first).is_none(),
            "replaced by another incarnation"
        );
        let (_, other, _) = table.window_for(&header("q", 1, 1), t0);
        assert!(table.window(replaced).is_none(), "evicted");
        assert_eq!(table.sweep(t0 + ttl), 1);
        assert!(table.window(other).is_none(), "swept");
        let (_, again, lookup) = table.window_for(&header("q", 1, 2), t0 + ttl);
        assert_eq!(lookup, Lookup::Created { evicted: false });
        assert!(table.window(again).is_some());
    }

    #[test]
    fn lru_evicts_the_least_recently_used_in_exact_order() {
        let mut table = DedupTable::new(Some(3), None);
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            let lookup = table.window_for(&header(id, 1, 1), now).2;
            assert_eq!(lookup, Lookup::Created { evicted: false });
        }
        // A duplicate refreshes recency just like a new seq: "a" becomes most recent.
        table.window_for(&header("a", 1, 1), now);
        assert_eq!(ids(&table), ["b", "c", "a"]);
        let lookup = table.window_for(&header("d", 1, 1), now).2;
        assert_eq!(lookup, Lookup::Created { evicted: true });
        assert_eq!(ids(&table), ["c", "a", "d"]);
        table.window_for(&header("c", 1, 2), now);
        table.window_for(&header("e", 1, 1), now);
        assert_eq!(ids(&table), ["d", "c", "e"]);
        // Lookups without recency (observability, outcome recording) do not reorder.
        assert!(table.get("d").is_some());
        table.window_for(&header("f", 1, 1), now);
        assert_eq!(ids(&table), ["c", "e", "f"]);
    }

    #[test]
    fn flood_of_distinct_ids_stays_at_max_producers() {
        let mut table = DedupTable::new(Some(64), None);
        let now = Instant::now();
        for i in 0..10_000 {
            table.window_for(&header(&format!("flood-{i}"), 1, 1), now);
            assert!(table.len() <= 64);
        }
        assert_eq!(table.len(), 64);
        assert!(table.get("flood-9999").is_some() && table.get("flood-9935").is_none());
    }

    #[test]
    fn sweep_runs_at_the_ttl_cadence_and_removes_windows_idle_for_a_ttl() {
        let ttl = Duration::from_secs(10);
        let mut table = DedupTable::new(None, Some(ttl));
        let t0 = Instant::now();
        assert_eq!(table.next_sweep(), None);
        table.window_for(&header("old", 1, 1), t0);
        assert_eq!(table.next_sweep(), Some(t0 + ttl));
        table.window_for(&header("young", 1, 1), t0 + Duration::from_secs(5));
        assert_eq!(table.sweep(t0 + Duration::from_secs(9)), 0, "not due yet");
        assert_eq!(table.sweep(t0 + ttl), 1, "idle exactly one TTL");
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
        let mut table = DedupTable::new(None, Some(ttl));
        let t0 = Instant::now();
        table.window_for(&header("p", 1, 1), t0);
        table.window_for(&header("p", 1, 2), t0 + Duration::from_secs(9));
        assert_eq!(table.sweep(t0 + ttl), 0);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn ttl_never_arms_no_sweep() {
        let mut table = DedupTable::new(Some(4), None);
        let t0 = Instant::now();
        table.window_for(&header("p", 1, 1), t0);
        assert_eq!(table.next_sweep(), None);
        assert_eq!(table.sweep(t0 + Duration::from_secs(1_000_000)), 0);
        assert_eq!(table.len(), 1);
    }
}
