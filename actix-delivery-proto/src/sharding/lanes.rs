//! The pure core of a sharded producer's router: one stream ("lane") per destination entity,
//! opened on the entity's first message, closed once unused, at most `max_lanes` open; and
//! for each message its predecessor to the same entity. No actor, no timer, no I/O: the
//! shell drives the lanes' protocol cores this core hands it.
//!
//! Rules:
//! - a message for an entity without a lane opens one; each message is in flight on its lane
//!   until settled;
//! - at most `max_lanes` lanes are open: a message for an entity without a lane when that many
//!   are open closes the least recently used lane with nothing in flight, or, when every lane
//!   has a message in flight, **waits** (counted), in arrival order, and so does every later
//!   message for an entity without a lane (first come, first served), and every later message
//!   for its entity (which keeps each entity's order). A waiting message gets a lane as soon as
//!   one is unused. (Messages in flight are bounded by the producer's window, so with
//!   `max_lanes` at least that window no message ever waits.)
//! - a message's predecessor is the seq (at the producer) of the message routed to the same
//!   entity before it in this producer life, 0 for none (a lane opened anew has none: all of
//!   its entity's earlier messages were settled);
//! - a lane with nothing in flight for `cleanup_after` is closed;
//! - lanes are numbered in the order they open, from a start the shell chooses (their stream
//!   ids carry the number, so that two lanes of one entity never share a stream id);
//! - tables that emptied give their memory back (the rule of the crate's `capacity` module:
//!   under a quarter full, beyond 1 024 entries, they shrink to twice what they hold).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hashbrown::HashMap;
use hashlink::LinkedHashMap;
use serde::{Deserialize, Serialize};

use crate::sharding::capacity;
use crate::sharding::entity_id::EntityId;

struct Lane<S> {
    entity: EntityId,
    stream: S,
    /// The seq of the last message routed to the entity, 0 for none.
    last_seq: u64,
    in_flight: usize,
}

/// A message that waits for a lane.
struct Waiting<M> {
    entity: EntityId,
    seq: u64,
    message: M,
}

/// Counters and gauges of a sharded producer's lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LaneStats {
    /// Lanes (entity streams) open now.
    pub lanes: u64,
    /// Messages in flight on them now.
    pub in_flight: u64,
    /// Messages waiting for a lane now (every lane busy at `max_open_lanes`).
    pub waiting: u64,
    /// Lanes opened.
    pub opened: u64,
    /// Lanes closed: after `cleanup_unused_after` without a message in flight, or for room.
    pub closed: u64,
    /// Lanes closed early, before `cleanup_unused_after`, to open one for another entity at
    /// `max_open_lanes` (the least recently used one with nothing in flight).
    pub evicted: u64,
    /// Messages that had to wait for a lane (every lane busy at `max_open_lanes`).
    pub waited: u64,
    /// Messages routed to a lane.
    pub routed: u64,
    /// Messages settled on their lane.
    pub settled: u64,
    /// Transmissions of messages on the lanes after the first (no ACK within their
    /// `resend_timeout`).
    pub retransmitted: u64,
    /// ACKs the lanes ignored: of no open lane, or not matching a message in flight.
    pub ignored_acks: u64,
}

/// A message routed to its lane.
pub struct Routed<'a, S, M> {
    /// The lane's number.
    pub number: u64,
    /// The lane's stream.
    pub stream: &'a mut S,
    /// The message's predecessor to the same entity (its seq), 0 for none.
    pub previous: u64,
    /// The message's seq at the producer.
    pub seq: u64,
    /// The entity.
    pub entity: EntityId,
    /// The message.
    pub message: M,
}

/// The lanes of a sharded producer. `S` is the shell's state of a lane's stream, `M` what
/// it keeps of a message that waits for a lane.
pub struct Lanes<S, M> {
    lanes: HashMap<u64, Lane<S>>,
    by_entity: HashMap<EntityId, u64>,
    /// Lanes with nothing in flight, since when, least recently used first.
    unused: LinkedHashMap<u64, Instant>,
    waiting: VecDeque<Waiting<M>>,
    /// How many messages wait, per entity.
    waiting_for: HashMap<EntityId, usize>,
    max_lanes: usize,
    cleanup_after: Duration,
    next_number: u64,
    in_flight: usize,
    stats: LaneStats,
}

impl<S, M> Lanes<S, M> {
    /// No lane yet; at most `max_lanes` (positive) open at once; a lane unused for
    /// `cleanup_after` is closed; lanes are numbered from `first_number`.
    pub fn new(max_lanes: usize, cleanup_after: Duration, first_number: u64) -> Self {
        Self {
            lanes: HashMap::new(),
            by_entity: HashMap::new(),
            unused: LinkedHashMap::new(),
            waiting: VecDeque::new(),
            waiting_for: HashMap::new(),
            max_lanes: max_lanes.max(1),
            cleanup_after,
            next_number: first_number,
            in_flight: 0,
            stats: LaneStats::default(),
        }
    }

    /// Routes message `seq` for `entity` to its lane (`open` makes one, given its number, the
    /// entity and the message, if there is none), or makes it wait (`None`) when no lane can
    /// be opened now, or when earlier messages wait (for `entity`, or for any entity without
    /// a lane).
    pub fn route(
        &mut self,
        entity: EntityId,
        seq: u64,
        message: M,
        open: impl FnOnce(u64, &EntityId, &M) -> S,
    ) -> Option<Routed<'_, S, M>> {
        let has_lane = self.by_entity.contains_key(&entity);
        // Without a lane, a message waits behind those that wait already (first come, first
        // served), or for room.
        if self.waiting_for.contains_key(&entity)
            || (!has_lane && (!self.waiting.is_empty() || !self.has_room_for(&entity)))
        {
            self.stats.waited += 1;
            *self.waiting_for.entry(entity.clone()).or_default() += 1;
            self.waiting.push_back(Waiting {
                entity,
                seq,
                message,
            });
            return None;
        }
        Some(self.route_now(entity, seq, message, open))
    }

    /// The first waiting message, routed, if it can have a lane now (`open` as for
    /// [`route`](Self::route)). Call it until `None` after messages settled.
    pub fn poll_waiting(
        &mut self,
        open: impl FnOnce(u64, &EntityId, &M) -> S,
    ) -> Option<Routed<'_, S, M>> {
        let front = self.waiting.front()?;
        if !self.has_room_for(&front.entity) {
            return None;
        }
        let Waiting {
            entity,
            seq,
            message,
        } = self.waiting.pop_front().expect("looked at above");
        if let Some(count) = self.waiting_for.get_mut(&entity) {
            *count -= 1;
            if *count == 0 {
                self.waiting_for.remove(&entity);
            }
        }
        capacity::shrink_queue(&mut self.waiting);
        capacity::shrink_map(&mut self.waiting_for);
        Some(self.route_now(entity, seq, message, open))
    }

    /// Whether a message for `entity` can be routed now: it has a lane, or one can be opened
    /// (below `max_lanes`, or by closing an unused one).
    fn has_room_for(&self, entity: &EntityId) -> bool {
        self.by_entity.contains_key(entity)
            || self.lanes.len() < self.max_lanes
            || !self.unused.is_empty()
    }

    fn route_now(
        &mut self,
        entity: EntityId,
        seq: u64,
        message: M,
        open: impl FnOnce(u64, &EntityId, &M) -> S,
    ) -> Routed<'_, S, M> {
        let number = match self.by_entity.get(&entity) {
            Some(&number) => number,
            None => {
                if self.lanes.len() >= self.max_lanes {
                    let (lru, _) = self.unused.pop_front().expect("room was checked");
                    self.close(lru);
                    self.stats.evicted += 1;
                }
                let number = self.next_number;
                self.next_number = self.next_number.wrapping_add(1);
                self.stats.opened += 1;
                let lane = Lane {
                    entity: entity.clone(),
                    stream: open(number, &entity, &message),
                    last_seq: 0,
                    in_flight: 0,
                };
                self.lanes.insert(number, lane);
                self.by_entity.insert(entity.clone(), number);
                number
            }
        };
        let lane = self.lanes.get_mut(&number).expect("indexed by entity");
        if lane.in_flight == 0 {
            self.unused.remove(&number); // in use again
        }
        let previous = std::mem::replace(&mut lane.last_seq, seq);
        lane.in_flight += 1;
        self.in_flight += 1;
        self.stats.routed += 1;
        Routed {
            number,
            stream: &mut lane.stream,
            previous,
            seq,
            entity,
            message,
        }
    }

    /// Lane `number`'s stream, if it is open.
    pub fn get_mut(&mut self, number: u64) -> Option<&mut S> {
        self.lanes.get_mut(&number).map(|lane| &mut lane.stream)
    }

    /// A message on lane `number` was settled; returns its entity.
    pub fn settled(&mut self, number: u64, now: Instant) -> Option<EntityId> {
        let lane = self.lanes.get_mut(&number)?;
        lane.in_flight -= 1;
        self.in_flight -= 1;
        self.stats.settled += 1;
        if lane.in_flight == 0 {
            self.unused.insert(number, now);
        }
        Some(lane.entity.clone())
    }

    /// Counts transmissions after the first, and ACKs that matched nothing.
    pub fn count(&mut self, retransmitted: u64, ignored_acks: u64) {
        self.stats.retransmitted += retransmitted;
        self.stats.ignored_acks += ignored_acks;
    }

    /// The producer started a new life: every lane is closed (their streams, with what is in
    /// flight on them, are the previous life's) and the messages waiting are dropped. Returns
    /// both, for the shell to settle.
    pub fn restart(&mut self) -> (Vec<S>, Vec<M>) {
        self.unused.clear();
        self.by_entity.clear();
        self.waiting_for.clear();
        self.in_flight = 0;
        let closed = self.lanes.len() as u64;
        self.stats.closed += closed;
        let streams = self.lanes.drain().map(|(_, lane)| lane.stream).collect();
        let waiting = self.waiting.drain(..).map(|w| w.message).collect();
        self.shrink();
        (streams, waiting)
    }

    /// The next lane to close now (unused for `cleanup_after`), with its stream.
    pub fn poll_unused(&mut self, now: Instant) -> Option<(u64, S)> {
        let (_, &since) = self.unused.front()?;
        if since + self.cleanup_after > now {
            return None;
        }
        let (number, _) = self.unused.pop_front()?;
        let stream = self.close(number)?;
        Some((number, stream))
    }

    /// When the next lane may be closed.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.unused
            .front()
            .map(|(_, &since)| since + self.cleanup_after)
    }

    /// The counters and gauges.
    pub fn stats(&self) -> LaneStats {
        LaneStats {
            lanes: self.lanes.len() as u64,
            in_flight: self.in_flight as u64,
            waiting: self.waiting.len() as u64,
            ..self.stats
        }
    }

    /// The stream of every open lane.
    pub fn streams(&self) -> impl Iterator<Item = &S> + '_ {
        self.lanes.values().map(|lane| &lane.stream)
    }

    /// Removes lane `number` (not in the unused list any more).
    fn close(&mut self, number: u64) -> Option<S> {
        let lane = self.lanes.remove(&number)?;
        self.by_entity.remove(&lane.entity);
        self.stats.closed += 1;
        self.shrink();
        Some(lane.stream)
    }

    fn shrink(&mut self) {
        capacity::shrink_map(&mut self.lanes);
        capacity::shrink_map(&mut self.by_entity);
        capacity::shrink_linked(&mut self.unused);
        capacity::shrink_queue(&mut self.waiting);
        capacity::shrink_map(&mut self.waiting_for);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> EntityId {
        EntityId::new(name).unwrap()
    }

    type Table = Lanes<&'static str, u64>;

    /// Routes `seq` for `entity`, opening a lane named `name`: (lane number, previous), or
    /// `None` if it waits.
    fn route(lanes: &mut Table, entity: &str, seq: u64, name: &'static str) -> Option<(u64, u64)> {
        lanes
            .route(id(entity), seq, seq, |_, _, _| name)
            .map(|r| (r.number, r.previous))
    }

    #[test]
    fn a_lane_opens_on_its_entitys_first_message_and_names_each_messages_predecessor() {
        let mut lanes = Table::new(10, Duration::from_secs(60), 7);
        assert_eq!(route(&mut lanes, "a", 1, "a"), Some((7, 0)));
        assert_eq!(route(&mut lanes, "b", 2, "b"), Some((8, 0)));
        assert_eq!(route(&mut lanes, "a", 3, "a"), Some((7, 1)));
        assert_eq!(route(&mut lanes, "a", 7, "a"), Some((7, 3)));
        let (streams, waiting) = lanes.restart();
        assert_eq!((streams.len(), waiting.len()), (2, 0));
        assert_eq!(
            route(&mut lanes, "a", 1, "a2"),
            Some((9, 0)),
            "a new life's lane and chain"
        );
        let stats = lanes.stats();
        assert_eq!(
            (stats.lanes, stats.opened, stats.closed, stats.in_flight),
            (1, 3, 2, 1)
        );
    }

    #[test]
    fn a_lane_unused_for_the_cleanup_interval_closes_and_a_busy_one_stays() {
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let mut lanes = Table::new(10, after, 0);
        route(&mut lanes, "a", 1, "a");
        route(&mut lanes, "b", 2, "b");
        route(&mut lanes, "b", 3, "b");
        assert_eq!(lanes.next_deadline(), None, "both busy");
        assert_eq!(lanes.settled(0, t0), Some(id("a")));
        lanes.settled(1, t0);
        assert_eq!(lanes.next_deadline(), Some(t0 + after));
        assert!(lanes
            .poll_unused(t0 + after)
            .is_some_and(|(n, s)| n == 0 && s == "a"));
        assert!(
            lanes.poll_unused(t0 + after).is_none(),
            "b has one in flight"
        );
        // A message for a closed entity opens a lane with no predecessor.
        assert_eq!(route(&mut lanes, "a", 4, "a2"), Some((2, 0)));
        // Used again before its deadline: not closed.
        lanes.settled(1, t0 + after);
        route(&mut lanes, "b", 5, "b");
        lanes.settled(1, t0 + after * 2);
        assert!(lanes.poll_unused(t0 + after * 2).is_none());
        let stats = lanes.stats();
        assert_eq!((stats.opened, stats.closed, stats.lanes), (3, 1, 2));
    }

    #[test]
    fn at_max_lanes_the_least_recently_used_idle_lane_closes_for_a_new_entity() {
        let t0 = Instant::now();
        let mut lanes = Table::new(2, Duration::from_secs(60), 0);
        route(&mut lanes, "a", 1, "a");
        route(&mut lanes, "b", 2, "b");
        lanes.settled(1, t0); // b idle first
        lanes.settled(0, t0); // then a
        assert_eq!(route(&mut lanes, "c", 3, "c"), Some((2, 0)));
        let stats = lanes.stats();
        assert_eq!((stats.lanes, stats.evicted, stats.closed), (2, 1, 1));
        assert!(
            lanes.get_mut(1).is_none(),
            "b, the least recently used, closed"
        );
        assert_eq!(
            route(&mut lanes, "a", 4, "a"),
            Some((0, 1)),
            "a kept its lane"
        );
    }

    #[test]
    fn when_every_lane_is_busy_a_new_entitys_messages_wait_in_order_and_keep_the_entitys_order() {
        let t0 = Instant::now();
        let mut lanes = Table::new(2, Duration::from_secs(60), 0);
        route(&mut lanes, "a", 1, "a");
        route(&mut lanes, "b", 2, "b");
        assert_eq!(route(&mut lanes, "c", 3, "c"), None, "both busy: c waits");
        assert_eq!(
            route(&mut lanes, "a", 4, "a"),
            Some((0, 1)),
            "a has its lane"
        );
        assert_eq!(route(&mut lanes, "d", 5, "d"), None);
        assert_eq!(route(&mut lanes, "c", 6, "c"), None, "behind c's first");
        assert!(lanes.poll_waiting(|_, _, _| "c").is_none(), "still no room");
        assert_eq!(lanes.stats().waiting, 3);
        lanes.settled(1, t0); // b's lane is free now
        let first = lanes
            .poll_waiting(|_, _, _| "c")
            .map(|r| (r.entity, r.seq, r.previous));
        assert_eq!(first, Some((id("c"), 3, 0)), "b's lane closed for c");
        assert!(
            lanes.poll_waiting(|_, _, _| "d").is_none(),
            "d waits for room"
        );
        lanes.settled(0, t0);
        assert!(
            lanes.poll_waiting(|_, _, _| "d").is_none(),
            "a still has 4 in flight"
        );
        lanes.settled(0, t0);
        let next = lanes.poll_waiting(|_, _, _| "d").map(|r| (r.entity, r.seq));
        assert_eq!(next, Some((id("d"), 5)));
        let last = lanes
            .poll_waiting(|_, _, _| unreachable!("c has its lane"))
            .map(|r| (r.entity, r.seq, r.previous));
        assert_eq!(last, Some((id("c"), 6, 3)), "c's second, after its first");
        let stats = lanes.stats();
        assert_eq!(
            (stats.waited, stats.waiting, stats.evicted, stats.lanes),
            (3, 0, 2, 2)
        );
    }

    #[test]
    fn a_restart_hands_back_every_lane_and_every_waiting_message() {
        let mut lanes = Table::new(1, Duration::from_secs(60), 0);
        route(&mut lanes, "a", 1, "a");
        route(&mut lanes, "b", 2, "b");
        let (streams, waiting) = lanes.restart();
        assert_eq!((streams, waiting), (vec!["a"], vec![2]));
        let stats = lanes.stats();
        assert_eq!((stats.lanes, stats.waiting, stats.in_flight), (0, 0, 0));
        assert_eq!(route(&mut lanes, "b", 1, "b"), Some((1, 0)));
    }

    #[test]
    fn tables_that_drained_give_their_memory_back() {
        let t0 = Instant::now();
        let mut lanes = Table::new(1 << 20, Duration::from_secs(1), 0);
        for n in 0..100_000u64 {
            route(&mut lanes, &n.to_string(), n + 1, "x");
            lanes.settled(n, t0);
        }
        let high = lanes.lanes.capacity();
        while lanes.poll_unused(t0 + Duration::from_secs(1)).is_some() {}
        assert!(lanes.lanes.capacity() <= capacity::KEPT * 2, "from {high}");
        assert!(lanes.by_entity.capacity() <= capacity::KEPT * 2);
        assert!(lanes.unused.capacity() <= capacity::KEPT * 2);
    }
}
