//! The pure core of a sharded producer's router: one stream ("lane") per destination entity,
//! opened on the entity's first message, closed once unused; and for each message its
//! predecessor to the same entity. No actor, no timer, no I/O: the shell opens and stops the
//! streams this core names.
//!
//! Rules:
//! - a message for an entity without a lane opens one; each message is in flight on its lane
//!   until settled;
//! - a message's predecessor is the seq (at the producer) of the message routed to the same
//!   entity before it in this producer life, 0 for none (a lane opened anew has none: all of
//!   its entity's earlier messages were settled);
//! - a lane with nothing in flight for `cleanup_after` is closed;
//! - a new life of the producer (another incarnation) starts every lane's chain anew: seqs of
//!   the previous life mean nothing in the new one.

use std::time::{Duration, Instant};

use hashbrown::HashMap;
use hashlink::LinkedHashMap;
use serde::{Deserialize, Serialize};

use crate::sharding::entity_id::EntityId;

struct Lane<S> {
    stream: S,
    /// The seq of the last message routed to the entity, 0 for none.
    last_seq: u64,
    in_flight: usize,
}

/// Counters and gauges of a sharded producer's lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LaneStats {
    /// Lanes (entity streams) open now.
    pub lanes: u64,
    /// Messages in flight on them now.
    pub in_flight: u64,
    /// Lanes opened.
    pub opened: u64,
    /// Lanes closed after `cleanup_unused_after` without a message in flight.
    pub closed: u64,
    /// Messages routed to a lane.
    pub routed: u64,
    /// Messages settled on their lane.
    pub settled: u64,
}

/// The lanes of a sharded producer. `S` is the shell's handle of a lane's stream.
pub struct Lanes<S> {
    lanes: HashMap<EntityId, Lane<S>>,
    /// Lanes with nothing in flight, since when, oldest first.
    unused: LinkedHashMap<EntityId, Instant>,
    cleanup_after: Duration,
    in_flight: usize,
    stats: LaneStats,
}

impl<S> Lanes<S> {
    /// No lane yet; a lane unused for `cleanup_after` is closed.
    pub fn new(cleanup_after: Duration) -> Self {
        Self {
            lanes: HashMap::new(),
            unused: LinkedHashMap::new(),
            cleanup_after,
            in_flight: 0,
            stats: LaneStats::default(),
        }
    }

    /// Routes message `seq` to `entity`'s lane (`open` makes one if there is none): the
    /// lane's stream and the message's predecessor to the entity (0 for none).
    pub fn route(&mut self, entity: &EntityId, seq: u64, open: impl FnOnce() -> S) -> (&S, u64) {
        if !self.lanes.contains_key(entity) {
            self.stats.opened += 1;
            let lane = Lane {
                stream: open(),
                last_seq: 0,
                in_flight: 0,
            };
            self.lanes.insert(entity.clone(), lane);
        }
        let lane = self.lanes.get_mut(entity).expect("made above");
        if lane.in_flight == 0 {
            self.unused.remove(entity); // in use again
        }
        let previous = std::mem::replace(&mut lane.last_seq, seq);
        lane.in_flight += 1;
        self.in_flight += 1;
        self.stats.routed += 1;
        (&lane.stream, previous)
    }

    /// A message on `entity`'s lane was settled.
    pub fn settled(&mut self, entity: &EntityId, now: Instant) {
        let Some(lane) = self.lanes.get_mut(entity) else {
            return;
        };
        lane.in_flight -= 1;
        self.in_flight -= 1;
        self.stats.settled += 1;
        if lane.in_flight == 0 {
            self.unused.insert(entity.clone(), now);
        }
    }

    /// The producer started a new life: every lane's predecessor chain starts anew.
    pub fn restart(&mut self) {
        for lane in self.lanes.values_mut() {
            lane.last_seq = 0;
        }
    }

    /// The next lane to close now (unused for `cleanup_after`), with its stream to stop.
    pub fn poll_unused(&mut self, now: Instant) -> Option<(EntityId, S)> {
        let (_, &since) = self.unused.front()?;
        if since + self.cleanup_after > now {
            return None;
        }
        let (entity, _) = self.unused.pop_front()?;
        let lane = self.lanes.remove(&entity)?;
        self.stats.closed += 1;
        Some((entity, lane.stream))
    }

    /// When the next lane may be closed.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.unused
            .front()
            .map(|(_, &since)| since + self.cleanup_after)
    }

    /// Every lane's stream (to stop them all).
    pub fn drain(&mut self) -> impl Iterator<Item = S> + '_ {
        self.unused.clear();
        self.in_flight = 0;
        self.lanes.drain().map(|(_, lane)| lane.stream)
    }

    /// The counters and gauges.
    pub fn stats(&self) -> LaneStats {
        LaneStats {
            lanes: self.lanes.len() as u64,
            in_flight: self.in_flight as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> EntityId {
        EntityId::new(name).unwrap()
    }

    #[test]
    fn a_lane_opens_on_its_entitys_first_message_and_names_each_messages_predecessor() {
        let mut lanes = Lanes::new(Duration::from_secs(60));
        let mut opened = 0;
        let mut route = |lanes: &mut Lanes<u32>, entity: &str, seq| {
            let (stream, previous) = lanes.route(&id(entity), seq, || {
                opened += 1;
                opened
            });
            (*stream, previous)
        };
        assert_eq!(route(&mut lanes, "a", 1), (1, 0));
        assert_eq!(route(&mut lanes, "b", 2), (2, 0));
        assert_eq!(route(&mut lanes, "a", 3), (1, 1));
        assert_eq!(route(&mut lanes, "a", 7), (1, 3));
        lanes.restart();
        assert_eq!(route(&mut lanes, "a", 1), (1, 0), "a new life's chain");
        let stats = lanes.stats();
        assert_eq!((stats.lanes, stats.opened, stats.in_flight), (2, 2, 5));
    }

    #[test]
    fn a_lane_unused_for_the_cleanup_interval_closes_and_a_busy_one_stays() {
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let mut lanes = Lanes::new(after);
        lanes.route(&id("a"), 1, || "a");
        lanes.route(&id("b"), 2, || "b");
        lanes.route(&id("b"), 3, || "b");
        assert_eq!(lanes.next_deadline(), None, "both busy");
        lanes.settled(&id("a"), t0);
        lanes.settled(&id("b"), t0);
        assert_eq!(lanes.next_deadline(), Some(t0 + after));
        assert!(lanes
            .poll_unused(t0 + after)
            .is_some_and(|(e, s)| e == id("a") && s == "a"));
        assert!(
            lanes.poll_unused(t0 + after).is_none(),
            "b has one in flight"
        );
        // A message for a closed entity opens a lane with no predecessor.
        let (_, previous) = lanes.route(&id("a"), 4, || "a2");
        assert_eq!(previous, 0);
        // Used again before its deadline: not closed.
        lanes.settled(&id("b"), t0 + after);
        lanes.route(&id("b"), 5, || "b");
        lanes.settled(&id("b"), t0 + after * 2);
        assert!(lanes.poll_unused(t0 + after * 2).is_none());
        let stats = lanes.stats();
        assert_eq!((stats.opened, stats.closed, stats.lanes), (3, 1, 2));
    }
}
