//! The sending side's memory per producer incarnation: where its ACKs go back to, and the
//! encoded bodies of its messages that may still be retransmitted, so that a body is encoded
//! once per message, not once per transmission. Pure: no I/O, no runtime.
//!
//! A route is one producer id under one incarnation: the lanes of an outbox share their
//! entity's incarnation under ids of their own, and each has its own route.
//!
//! A route's reply address follows its producer: a durable producer keeps its incarnation
//! across restarts in one process (it is stored with its stream), but each life has a new
//! reply address, so a delivery naming another address than the route's replaces it and the
//! ACKs that follow go to the live producer, never to the dead one's address.
//!
//! Bounded three times: at most `max_routes` routes per remote address (least recently used
//! evicted: its ACKs are then dropped and its next delivery starts a new route); per route
//! only seqs at or above the producer's latest `window_start` that are not ACKed yet, which the
//! producer's window bounds, with `MAX_BODIES_PER_ROUTE` as a hard stop against hand-made
//! deliveries; and per route at most `MAX_ACKS_WAITING` received ACKs handed to the producer
//! and not known to be taken from its mailbox (beyond, ACKs are dropped: the producer
//! retransmits, the consumer ACKs again), so that a peer flooding ACKs at a busy producer
//! cannot grow its mailbox. Knowing costs a reply from the producer, so it is asked for once
//! per half of the bound: when `PROBE_AT` ACKs are waiting, the last message of the next
//! frame is a probe whose taking releases every ACK handed before it (a mailbox is first in,
//! first out); until then ACKs go fire-and-forget.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use hashlink::linked_hash_map::RawEntryMut;
use hashlink::LruCache;

use crate::protocol::envelope::{Incarnation, ProducerId};
use crate::tcp::body::{Bodies, Body};
use crate::tcp::frame::MAX_BATCH;

/// Where a route's ACKs go, and whether two such places are the same one (for a
/// `ReplyTo`: `ReplyTo::same_as`).
pub trait ReplyAddress: Clone {
    /// Whether `self` and `other` reach the same recipient.
    fn same_as(&self, other: &Self) -> bool;
}

/// The most encoded bodies one route keeps; beyond it the lowest seq is forgotten (and
/// encoded again if retransmitted).
pub(crate) const MAX_BODIES_PER_ROUTE: usize = 1 << 16;

/// The most received ACKs of one route handed to its producer and not yet taken from its
/// mailbox: eight full frames, as a receiving connection hands at most eight frames to its
/// consumers.
pub(crate) const MAX_ACKS_WAITING: usize = 8 * MAX_BATCH;

/// ACKs waiting from which the next admitted frame is a probe (when none is out).
pub(crate) const PROBE_AT: usize = MAX_ACKS_WAITING / 2;

/// One producer incarnation's route.
#[derive(Debug)]
pub struct Route<R> {
    producer_id: ProducerId,
    reply_to: R,
    /// Encoded bodies of messages not known to be settled.
    bodies: Bodies,
    /// ACKs handed to the producer and not known to be taken.
    backlog: Arc<Backlog>,
}

impl<R> Route<R> {
    /// The encoded body of `seq`: the kept bytes, or `encode`'s (into `scratch`), which are
    /// kept. Forgets every body below `window_start` first (the producer settled those).
    /// Returns whether `encode` was called.
    ///
    /// # Errors
    /// `encode`'s error (nothing is kept).
    pub fn body<E>(
        &mut self,
        seq: u64,
        window_start: u64,
        scratch: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(Body, bool), E> {
        self.bodies
            .get_or_encode(seq, window_start, MAX_BODIES_PER_ROUTE, scratch, encode)
    }

    /// Bodies held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bodies.len()
    }
}

/// A route's ACKs handed to its producer and not known to be taken.
#[derive(Debug, Default)]
struct Backlog {
    waiting: AtomicUsize,
    /// A [`Probe`] is out.
    probing: AtomicBool,
}

/// Received ACKs admitted to their producer: where they go, and whether their last message
/// is a probe.
#[derive(Debug)]
pub struct AckRoute<R> {
    /// The route's producer id (shared, not copied from the frame).
    pub producer_id: ProducerId,
    /// Where the ACKs go.
    pub reply_to: R,
    /// `Some`: send the last message so as to learn when it is taken, and drop this then.
    pub probe: Option<Probe>,
}

/// Releases, when dropped, the ACKs a probe covers: those handed to the producer up to and
/// including the probe's frame.
#[derive(Debug)]
pub struct Probe {
    backlog: Arc<Backlog>,
    covered: usize,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.backlog
            .waiting
            .fetch_sub(self.covered, Ordering::AcqRel);
        self.backlog.probing.store(false, Ordering::Release);
    }
}

/// Why received ACKs were not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckRefusal {
    /// No route has this producer id and incarnation.
    Unroutable,
    /// `MAX_ACKS_WAITING` ACKs handed to the route's producer are not known to be taken.
    Busy,
}

/// The routes of one remote address, keyed by producer id and incarnation (128 random bits:
/// unique per producer life; lanes of one outbox share one under different ids).
#[derive(Debug)]
pub struct Routes<R> {
    table: LruCache<(ProducerId, Incarnation), Route<R>, RandomState>,
    /// The table's hasher: keys are found by a hash computed once (and, for ACKs, from the
    /// frame's id, without copying it).
    hasher: RandomState,
}

impl<R: ReplyAddress> Routes<R> {
    /// At most `max_routes` routes.
    pub fn new(max_routes: usize) -> Self {
        let hasher = RandomState::new();
        Self {
            table: LruCache::with_hasher(max_routes, hasher.clone()),
            hasher,
        }
    }

    /// The hash of the key `(producer_id, incarnation)` (a `ProducerId` hashes as its string).
    fn hash(&self, producer_id: &str, incarnation: Incarnation) -> u64 {
        self.hasher.hash_one((producer_id, incarnation))
    }

    /// The route of this producer incarnation, made if it is new (evicting the least recently
    /// used one when full), refreshed otherwise. A delivery naming another reply address (the
    /// producer restarted under its stored incarnation) keeps the bodies (a seq of a durable
    /// producer is never reused) and sends the ACKs to the new address.
    pub fn route(
        &mut self,
        producer_id: &ProducerId,
        incarnation: Incarnation,
        reply_to: &R,
    ) -> &mut Route<R> {
        let hash = self.hash(producer_id.as_str(), incarnation);
        let is = |(id, inc): &(ProducerId, Incarnation)| *inc == incarnation && id == producer_id;
        if self.table.raw_entry().from_hash(hash, is).is_none() {
            if self.table.len() >= self.table.capacity() {
                self.table.remove_lru();
            }
            let route = Route {
                producer_id: producer_id.clone(),
                reply_to: reply_to.clone(),
                bodies: Bodies::default(),
                backlog: Arc::default(),
            };
            if let RawEntryMut::Vacant(entry) = self.table.raw_entry_mut().from_hash(hash, is) {
                entry.insert_hashed_nocheck(hash, (producer_id.clone(), incarnation), route);
            }
        }
        let RawEntryMut::Occupied(mut entry) = self.table.raw_entry_mut().from_hash(hash, is)
        else {
            unreachable!("present: found or inserted above");
        };
        entry.to_back();
        let route = entry.into_mut();
        if !route.reply_to.same_as(reply_to) {
            route.reply_to = reply_to.clone();
        }
        route
    }

    /// ACKs for `seqs` arrived: admits them to their producer unless `MAX_ACKS_WAITING`
    /// handed before them are not known to be taken, and forgets the bodies of those admitted
    /// (those refused as busy keep theirs: their messages are retransmitted).
    ///
    /// # Errors
    /// [`AckRefusal`]: no route matches, or its producer is busy.
    pub fn admit_acks(
        &mut self,
        producer_id: &str,
        incarnation: Incarnation,
        seqs: &[u64],
    ) -> Result<AckRoute<R>, AckRefusal> {
        let hash = self.hash(producer_id, incarnation);
        let is = |(id, inc): &(ProducerId, Incarnation)| {
            *inc == incarnation && id.as_str() == producer_id
        };
        let RawEntryMut::Occupied(entry) = self.table.raw_entry_mut().from_hash(hash, is) else {
            return Err(AckRefusal::Unroutable);
        };
        let route = entry.into_mut();
        let backlog = &route.backlog;
        // Only this (under the caller's `&mut`) adds; a probe taken meanwhile only lowers it.
        if backlog.waiting.load(Ordering::Acquire) + seqs.len() > MAX_ACKS_WAITING {
            return Err(AckRefusal::Busy);
        }
        let waiting = backlog.waiting.fetch_add(seqs.len(), Ordering::AcqRel) + seqs.len();
        let probe =
            (waiting >= PROBE_AT && !backlog.probing.swap(true, Ordering::AcqRel)).then(|| Probe {
                backlog: backlog.clone(),
                covered: waiting,
            });
        for &seq in seqs {
            route.bodies.remove(seq);
        }
        Ok(AckRoute {
            producer_id: route.producer_id.clone(),
            reply_to: route.reply_to.clone(),
            probe,
        })
    }

    /// ACKs for `seqs` arrived: their bodies are forgotten. Returns where the ACKs go, or
    /// `None` if no route matches the producer id and incarnation. Unbounded, for the tests
    /// of the routing itself; the carriers use [`admit_acks`](Self::admit_acks).
    #[cfg(test)]
    pub(crate) fn handle_acks(
        &mut self,
        producer_id: &str,
        incarnation: Incarnation,
        seqs: &[u64],
    ) -> Option<(ProducerId, R)> {
        let admitted = self.admit_acks(producer_id, incarnation, seqs).ok()?;
        Some((admitted.producer_id, admitted.reply_to))
    }

    /// Routes held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether it holds no route.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Encoded bodies held, over all routes.
    pub fn bodies(&self) -> usize {
        self.table.iter().map(|(_, route)| route.bodies.len()).sum()
    }
}
#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    impl ReplyAddress for &'static str {
        fn same_as(&self, other: &Self) -> bool {
            self == other
        }
    }

    impl ReplyAddress for u8 {
        fn same_as(&self, other: &Self) -> bool {
            self == other
        }
    }

    impl ReplyAddress for () {
        fn same_as(&self, (): &Self) -> bool {
            true
        }
    }

    fn encode(
        seq: u64,
        count: &mut u32,
    ) -> impl FnOnce(&mut Vec<u8>) -> Result<(), Infallible> + '_ {
        move |out| {
            *count += 1;
            out.extend_from_slice(&seq.to_le_bytes());
            Ok(())
        }
    }

    #[test]
    fn a_body_is_encoded_once_and_reused_until_settled() {
        let mut routes = Routes::new(4);
        let id = ProducerId::from("p");
        let route = routes.route(&id, Incarnation::from_u128(1), &"reply");
        let mut encoded = 0;
        for seq in 1..=3 {
            route
                .body(seq, 1, &mut Vec::new(), encode(seq, &mut encoded))
                .unwrap();
        }
        let (again, _) = route
            .body(2, 1, &mut Vec::new(), encode(2, &mut encoded))
            .unwrap();
        assert_eq!(again.as_slice(), 2u64.to_le_bytes());
        assert_eq!(encoded, 3, "the retransmission reused the bytes");
        // window_start 3 settles 1 and 2.
        route
            .body(4, 3, &mut Vec::new(), encode(4, &mut encoded))
            .unwrap();
        assert_eq!(route.len(), 2);
        // An ACK forgets its body and names the route's reply address.
        let (producer, reply) = routes
            .handle_acks("p", Incarnation::from_u128(1), &[3])
            .unwrap();
        assert_eq!((producer.as_str(), reply), ("p", "reply"));
        assert_eq!(routes.bodies(), 1);
    }

    #[test]
    fn acks_for_unknown_routes_or_a_wrong_producer_id_go_nowhere() {
        let mut routes = Routes::new(4);
        routes.route(&ProducerId::from("p"), Incarnation::from_u128(1), &0u8);
        assert!(routes
            .handle_acks("p", Incarnation::from_u128(2), &[1])
            .is_none());
        assert!(routes
            .handle_acks("q", Incarnation::from_u128(1), &[1])
            .is_none());
    }

    #[test]
    fn producers_sharing_an_incarnation_under_other_ids_have_routes_of_their_own() {
        let mut routes = Routes::new(4);
        let incarnation = Incarnation::from_u128(1);
        let (a, b) = (ProducerId::from("lane a"), ProducerId::from("lane b"));
        let mut encoded = 0;
        for seq in 1..=3 {
            for (id, reply) in [(&a, "a"), (&b, "b")] {
                routes
                    .route(id, incarnation, &reply)
                    .body(seq, 1, &mut Vec::new(), encode(seq, &mut encoded))
                    .unwrap();
            }
        }
        assert_eq!((routes.len(), routes.bodies(), encoded), (2, 6, 6));
        for (id, reply) in [("lane a", "a"), ("lane b", "b")] {
            let (producer, to) = routes.handle_acks(id, incarnation, &[1, 2, 3]).unwrap();
            assert_eq!((producer.as_str(), to), (id, reply));
        }
        assert_eq!(routes.bodies(), 0, "each ACK found its own lane's bodies");
    }

    #[test]
    fn acks_not_known_to_be_taken_by_their_producer_are_bounded_per_route() {
        let mut routes = Routes::new(4);
        let (a, b) = (ProducerId::from("a"), ProducerId::from("b"));
        let incarnation = Incarnation::from_u128(1);
        let mut encoded = 0;
        for id in [&a, &b] {
            routes
                .route(id, incarnation, &())
                .body(1, 1, &mut Vec::new(), encode(1, &mut encoded))
                .unwrap();
        }
        let full: Vec<u64> = (2..2 + MAX_BATCH as u64).collect();
        let frames = MAX_ACKS_WAITING / MAX_BATCH;
        let admitted: Vec<_> = (0..frames)
            .map(|_| routes.admit_acks("a", incarnation, &full).unwrap())
            .collect();
        // One probe, on the frame that reached half the bound; the rest fire and forget.
        let probes: Vec<usize> = (0..frames)
            .filter(|&i| admitted[i].probe.is_some())
            .collect();
        assert_eq!(probes, [PROBE_AT / MAX_BATCH - 1]);
        // The producer took nothing: more are refused, and seq 1 keeps its body.
        assert_eq!(
            routes.admit_acks("a", incarnation, &[1]).unwrap_err(),
            AckRefusal::Busy
        );
        assert_eq!(routes.bodies(), 2);
        // Another route is not affected.
        assert!(routes.admit_acks("b", incarnation, &[1]).is_ok());
        // The probe is taken: what it covers is released, the rest still counts, and the
        // next frame is a probe again.
        let mut admitted = admitted;
        let probe = admitted[probes[0]].probe.take();
        drop(probe);
        let again = routes.admit_acks("a", incarnation, &full).unwrap();
        assert!(again.probe.is_some());
        let _more: Vec<_> = (1..PROBE_AT / MAX_BATCH)
            .map(|_| routes.admit_acks("a", incarnation, &full).unwrap())
            .collect();
        assert_eq!(
            routes.admit_acks("a", incarnation, &[1]).unwrap_err(),
            AckRefusal::Busy
        );
        // Without a probe taken, nothing is ever released: fire-and-forget frames alone
        // do not make room.
        drop(admitted);
        assert_eq!(
            routes.admit_acks("a", incarnation, &[1]).unwrap_err(),
            AckRefusal::Busy
        );
    }

    #[test]
    fn a_new_reply_address_for_a_known_incarnation_takes_over_its_acks() {
        let mut routes = Routes::new(4);
        let (id, incarnation) = (ProducerId::from("p"), Incarnation::from_u128(1));
        let mut encoded = 0;
        routes
            .route(&id, incarnation, &"first life")
            .body(1, 1, &mut Vec::new(), encode(1, &mut encoded))
            .unwrap();
        // The producer restarted under the same (stored) incarnation: new address.
        let (_, fresh) = routes
            .route(&id, incarnation, &"second life")
            .body(1, 1, &mut Vec::new(), encode(1, &mut encoded))
            .unwrap();
        assert!(!fresh, "the bodies are kept: a durable seq is never reused");
        let (_, reply) = routes.handle_acks("p", incarnation, &[1]).unwrap();
        assert_eq!(reply, "second life");
        assert_eq!(routes.len(), 1);
    }

    #[test]
    fn routes_are_bounded_least_recently_used_first() {
        let mut routes = Routes::new(2);
        let id = ProducerId::from("p");
        routes.route(&id, Incarnation::from_u128(1), &1u8);
        routes.route(&id, Incarnation::from_u128(2), &2u8);
        routes.route(&id, Incarnation::from_u128(1), &1u8); // refreshed
        routes.route(&id, Incarnation::from_u128(3), &3u8); // evicts 2
        assert_eq!(routes.len(), 2);
        assert!(routes
            .handle_acks("p", Incarnation::from_u128(2), &[])
            .is_none());
        assert!(routes
            .handle_acks("p", Incarnation::from_u128(1), &[])
            .is_some());
    }

    #[test]
    fn bodies_per_route_have_a_hard_bound() {
        let mut routes = Routes::new(1);
        let route = routes.route(&ProducerId::from("p"), Incarnation::from_u128(1), &());
        let mut encoded = 0;
        for seq in 1..=MAX_BODIES_PER_ROUTE as u64 + 10 {
            route
                .body(seq, 1, &mut Vec::new(), encode(seq, &mut encoded))
                .unwrap();
        }
        assert_eq!(route.len(), MAX_BODIES_PER_ROUTE);
    }

    #[test]
    fn a_failed_encoding_caches_nothing() {
        let mut routes = Routes::new(1);
        let route = routes.route(&ProducerId::from("p"), Incarnation::from_u128(1), &());
        assert_eq!(route.body(1, 1, &mut Vec::new(), |_| Err("no")), Err("no"));
        assert_eq!(route.len(), 0);
    }
}
