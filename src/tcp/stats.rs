//! A node's counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::protocol::rate_limit::RateLimited;

/// What a node did since it started (`connections_open` is a current value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NodeStats {
    /// Connections to peers this node made and authenticated.
    pub connections_opened: u64,
    /// Connections from peers this node accepted and authenticated.
    pub connections_accepted: u64,
    /// Authenticated connections open now, both ways.
    pub connections_open: u64,
    /// Attempts to connect that failed before a handshake (refused, unreachable, timed out,
    /// or a name that did not resolve).
    pub connect_failures: u64,
    /// Names of peers that did not resolve to an address (also counted in
    /// `connect_failures`; retried with the reconnection backoff).
    pub resolve_failures: u64,
    /// Handshakes that failed, both ways (wrong secret, mode or version, a replay, a
    /// timeout, an eviction): each closed its connection, and nothing it carried reached a
    /// consumer.
    pub handshake_failures: u64,
    /// Handshakes that failed in TLS, both ways (also counted in `handshake_failures`): a
    /// certificate not signed by a trusted root, expired, or not for the name connected to;
    /// no certificate where mutual TLS requires one; or a peer that does not speak TLS to a
    /// TLS node, or speaks it to a node that does not.
    pub tls_failures: u64,
    /// Handshakes that took longer than `handshake_timeout`, both ways (also counted in
    /// `handshake_failures`).
    pub handshakes_timed_out: u64,
    /// Incoming connections closed in their handshake to make room for a new one, because
    /// `max_handshakes` were in progress (also counted in `handshake_failures`).
    pub handshakes_evicted: u64,
    /// Handshakes refused because the two nodes speak no protocol version in common (the
    /// peer is of a release whose versions all lie outside this one's; also counted in
    /// `handshake_failures`). Only the side that sees the other's version counts it: a peer
    /// that refuses this node's version closes the connection, which this node counts as a
    /// `handshake_failure` only.
    pub version_refusals: u64,
    /// Incoming connections closed after their handshake because `max_connections`
    /// authenticated ones were open.
    pub connections_refused: u64,
    /// Authenticated connections closed because nothing arrived for `idle_timeout`.
    pub idle_timeouts: u64,
    /// Frames received after handshakes.
    pub frames_in: u64,
    /// Frames queued for sending after handshakes.
    pub frames_out: u64,
    /// Frames that did not verify or decode, or did not belong on their connection: each
    /// closed its connection (only that one).
    pub decode_failures: u64,
    /// Deliveries queued for sending.
    pub deliveries_out: u64,
    /// Deliveries received and handed to an exposed consumer.
    pub deliveries_in: u64,
    /// Deliveries received whose body could not be read as the exposed consumer's type: each
    /// a dead letter at the consumer (`DeadLetterReason::UndecodableBody`, or
    /// `IncompatibleBody` for a codec or schema version it cannot read; no ACK), logged at
    /// most once a minute with why; the rest of its frame is delivered and the connection
    /// stays open.
    pub undecodable_bodies: u64,
    /// ACKs queued for sending.
    pub acks_out: u64,
    /// ACKs received and handed to their producer.
    pub acks_in: u64,
    /// Deliveries received for a consumer name this node does not expose (dropped).
    pub unknown_consumer: u64,
    /// Deliveries received from a peer whose identity the consumer is not exposed to
    /// ([`NodeHandle::expose_to`](crate::tcp::NodeHandle::expose_to)): none is handed over, and the
    /// connection is closed.
    pub unauthorized_deliveries: u64,
    /// ACKs received for no known producer incarnation (dropped).
    pub unroutable_acks: u64,
    /// ACKs received for a producer of which 8 192 ACKs handed to it are not known to be
    /// taken from its mailbox yet (dropped: the producer retransmits, and the consumer ACKs
    /// again), so that a peer flooding ACKs at a busy producer cannot grow its mailbox.
    pub acks_dropped_busy: u64,
    /// Deliveries dropped because their connection's output was full.
    pub deliveries_dropped_full: u64,
    /// ACKs dropped because their connection's output was full.
    pub acks_dropped_full: u64,
    /// Deliveries that found their connection being made and waited for it (bounded by
    /// `max_output_bytes`); sent once it is up.
    pub deliveries_waited: u64,
    /// Deliveries dropped because no connection to their node was up or being made, or
    /// because the attempt they waited for failed.
    pub deliveries_dropped_disconnected: u64,
    /// ACKs dropped because the connection their delivery came on was closed.
    pub acks_dropped_disconnected: u64,
    /// Deliveries that cannot be sent: a body that does not encode or fit a frame, or no
    /// reply address.
    pub deliveries_unsendable: u64,
    /// Chunks of large messages held back, not sent, because their connection speaks protocol
    /// version 3, which has no chunks (see `NodeOptionsBuilder::wire_version`), counted per
    /// held transmission: a held chunk stays unconfirmed, its producer retransmits it, and it
    /// is held and counted again. The producer's window stays occupied, so a producer that
    /// chunks stalls on a version-3 link until the connection is made again at 4 or its
    /// `max_attempts` gives the message up.
    pub chunks_held_for_version: u64,
    /// Bodies encoded (once per message; again only after its route was forgotten).
    pub bodies_encoded: u64,
    /// The most bytes ever held for one connection: queued, or being written to its socket
    /// (at most `max_output_bytes`).
    pub output_high_water: u64,
    /// Producer incarnations remembered for routing ACKs, over all remote addresses, now.
    pub routes: u64,
    /// Encoded bodies kept for retransmission, over all remote addresses, now.
    pub cached_bodies: u64,
}

/// Declares a carrier's live counters: `$counters`, one atomic per field, whose `snapshot`
/// reads them into `$stats` (fields after `;` are current values the carrier fills in).
macro_rules! counters {
    ($counters:ident => $stats:ident { $($field:ident),* $(,)? ; $($current:ident),* $(,)? }) => {
        #[doc = concat!("The live counters behind [`", stringify!($stats), "`].")]
        #[derive(Debug, Default)]
        pub(crate) struct $counters {
            $(pub(crate) $field: std::sync::atomic::AtomicU64,)*
        }

        impl $counters {
            pub(crate) fn snapshot(&self) -> $stats {
                $stats {
                    $($field: self.$field.load(std::sync::atomic::Ordering::Relaxed),)*
                    $($current: 0,)*
                }
            }
        }
    };
}
#[cfg(feature = "nats")]
pub(crate) use counters;

counters!(Counters => NodeStats {
    connections_opened,
    connections_accepted,
    connections_open,
    connect_failures,
    resolve_failures,
    handshake_failures,
    tls_failures,
    handshakes_timed_out,
    handshakes_evicted,
    version_refusals,
    connections_refused,
    idle_timeouts,
    frames_in,
    frames_out,
    decode_failures,
    deliveries_out,
    deliveries_in,
    undecodable_bodies,
    acks_out,
    acks_in,
    unknown_consumer,
    unauthorized_deliveries,
    unroutable_acks,
    acks_dropped_busy,
    deliveries_dropped_full,
    acks_dropped_full,
    deliveries_waited,
    deliveries_dropped_disconnected,
    acks_dropped_disconnected,
    deliveries_unsendable,
    chunks_held_for_version,
    bodies_encoded,
    output_high_water;
    routes,
    cached_bodies,
});

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Kinds of rate-limited warnings.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Warning {
    Handshake,
    Decode,
    UnknownConsumer,
    Dropped,
    Unsendable,
    Undecodable,
    Unauthorized,
    ChunksHeld,
    Version,
}

impl Warning {
    /// How many kinds there are.
    const KINDS: usize = Warning::Version as usize + 1;
}

/// At most one warning a minute per kind, with the count in between. Never prints peer-
/// supplied ids.
#[derive(Debug, Default)]
pub(crate) struct Warnings([Mutex<RateLimited>; Warning::KINDS]);

impl Warnings {
    /// Warns about `what` (one more of `kind`) if a warning of that kind is due.
    pub(crate) fn warn(&self, kind: Warning, what: impl FnOnce() -> String) {
        let limiter = &self.0[kind as usize];
        let due = limiter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(Instant::now(), 1);
        if let Some(count) = due {
            log::warn!("{} ({count} since the last warning of this kind)", what());
        }
    }
}
