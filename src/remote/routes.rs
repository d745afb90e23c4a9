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
//! producer's window bounds, with [`MAX_BODIES_PER_ROUTE`] as a hard stop against hand-made
//! deliveries; and per route at most [`MAX_ACKS_WAITING`] received ACKs handed to the producer
//! and not yet taken from its mailbox (beyond, ACKs are dropped: the producer retransmits, the
//! consumer ACKs again), so that a peer flooding ACKs at a busy producer cannot grow its
//! mailbox.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashlink::LruCache;

use crate::protocol::envelope::{Incarnation, ProducerId};
use crate::remote::body::{Bodies, Body};
use crate::remote::frame::MAX_BATCH;

/// Where a route's ACKs go, and whether two such places are the same one (for a
/// [`ReplyTo`](crate::ReplyTo): [`ReplyTo::same_as`](crate::ReplyTo::same_as)).
pub(crate) trait ReplyAddress: Clone {
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

/// One producer incarnation's route.
#[derive(Debug)]
pub(crate) struct Route<R> {
    producer_id: ProducerId,
    reply_to: R,
    /// Encoded bodies of messages not known to be settled.
    bodies: Bodies,
    /// ACKs handed to the producer and not yet taken.
    waiting: Arc<AtomicUsize>,
}

impl<R> Route<R> {
    /// The encoded body of `seq`: the kept bytes, or `encode`'s (into `scratch`), which are
    /// kept. Forgets every body below `window_start` first (the producer settled those).
    /// Returns whether `encode` was called.
    ///
    /// # Errors
    /// `encode`'s error (nothing is kept).
    pub(crate) fn body<E>(
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

/// Received ACKs admitted to their producer: where they go, and their share of the route's
/// [`MAX_ACKS_WAITING`], held until this is dropped (when the producer took them).
#[derive(Debug)]
pub(crate) struct AckRoute<R> {
    /// The route's producer id (shared, not copied from the frame).
    pub producer_id: ProducerId,
    /// Where the ACKs go.
    pub reply_to: R,
    /// Their share of the bound.
    pub waiting: Waiting,
}

/// A share of a route's [`MAX_ACKS_WAITING`]: given back when dropped.
#[derive(Debug)]
pub(crate) struct Waiting {
    count: Arc<AtomicUsize>,
    n: usize,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// Why received ACKs were not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckRefusal {
    /// No route has this producer id and incarnation.
    Unroutable,
    /// The route's producer has not taken [`MAX_ACKS_WAITING`] ACKs handed to it yet.
    Busy,
}

/// The routes of one remote address, keyed by producer id and incarnation (128 random bits:
/// unique per producer life; lanes of one outbox share one under different ids).
#[derive(Debug)]
pub(crate) struct Routes<R> {
    table: LruCache<(ProducerId, Incarnation), Route<R>>,
}

impl<R: ReplyAddress> Routes<R> {
    /// At most `max_routes` routes.
    pub(crate) fn new(max_routes: usize) -> Self {
        Self {
            table: LruCache::new(max_routes),
        }
    }

    /// The route of this producer incarnation, made if it is new (evicting the least recently
    /// used one when full), refreshed otherwise. A delivery naming another reply address (the
    /// producer restarted under its stored incarnation) keeps the bodies (a seq of a durable
    /// producer is never reused) and sends the ACKs to the new address.
    pub(crate) fn route(
        &mut self,
        producer_id: &ProducerId,
        incarnation: Incarnation,
        reply_to: &R,
    ) -> &mut Route<R> {
        let key = (producer_id.clone(), incarnation);
        match self.table.get_mut(&key) {
            Some(route) => {
                if !route.reply_to.same_as(reply_to) {
                    route.reply_to = reply_to.clone();
                }
            }
            None => {
                self.table.insert(
                    key.clone(),
                    Route {
                        producer_id: producer_id.clone(),
                        reply_to: reply_to.clone(),
                        bodies: Bodies::default(),
                        waiting: Arc::default(),
                    },
                );
            }
        }
        self.table
            .peek_mut(&key)
            .expect("present: found or inserted above")
    }

    /// ACKs for `seqs` arrived: admits them to their producer unless it has not taken
    /// [`MAX_ACKS_WAITING`] before them yet, and forgets the bodies of those admitted (those
    /// refused as busy keep theirs: their messages are retransmitted).
    ///
    /// # Errors
    /// [`AckRefusal`]: no route matches, or its producer is busy.
    pub(crate) fn admit_acks(
        &mut self,
        producer_id: &str,
        incarnation: Incarnation,
        seqs: &[u64],
    ) -> Result<AckRoute<R>, AckRefusal> {
        let key = (ProducerId::from(producer_id), incarnation);
        let route = self.table.peek_mut(&key).ok_or(AckRefusal::Unroutable)?;
        // Only this (under the caller's `&mut`) adds; a concurrent drop only lowers it.
        let waiting = route.waiting.load(Ordering::Acquire);
        if waiting + seqs.len() > MAX_ACKS_WAITING {
            return Err(AckRefusal::Busy);
        }
        route.waiting.fetch_add(seqs.len(), Ordering::AcqRel);
        for &seq in seqs {
            route.bodies.remove(seq);
        }
        Ok(AckRoute {
            producer_id: route.producer_id.clone(),
            reply_to: route.reply_to.clone(),
            waiting: Waiting {
                count: route.waiting.clone(),
                n: seqs.len(),
            },
        })
    }

    /// ACKs for `seqs` arrived: their bodies are forgotten. Returns where the ACKs go, or
    /// `None` if no route matches the producer id and incarnation. Not bounded: a carrier
    /// that hands ACKs over without waiting for them to be taken (see
    /// [`admit_acks`](Self::admit_acks) for the bounded way).
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
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Encoded bodies held, over all routes.
    pub(crate) fn bodies(&self) -> usize {
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
    fn acks_not_yet_taken_by_their_producer_are_bounded_per_route() {
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
        let mut held: Vec<_> = (0..MAX_ACKS_WAITING / MAX_BATCH)
            .map(|_| routes.admit_acks("a", incarnation, &full).unwrap())
            .collect();
        // The producer took none of them: more are refused, and seq 1 keeps its body.
        assert_eq!(
            routes.admit_acks("a", incarnation, &[1]).unwrap_err(),
            AckRefusal::Busy
        );
        assert_eq!(routes.bodies(), 2);
        // Another route is not affected.
        assert!(routes.admit_acks("b", incarnation, &[1]).is_ok());
        // Once the producer took one batch, there is room for as many again.
        held.pop();
        let _again = routes.admit_acks("a", incarnation, &full).unwrap();
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
