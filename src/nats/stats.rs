//! A NATS carrier's counters.

use serde::{Deserialize, Serialize};

use crate::tcp::stats::counters;

/// What a [`NatsCarrierHandle`](super::NatsCarrierHandle) did since it started (`routes` and
/// `cached_bodies` are current values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NatsStats {
    /// Messages received on exposed subjects and on the ACK inbox (the carrier's probes
    /// included: see `no_responders`).
    pub frames_in: u64,
    /// Messages queued for publishing (batches of deliveries or ACKs, and probes).
    pub frames_out: u64,
    /// Messages refused: too long, not a frame of this protocol, the wrong kind for where
    /// they arrived, or an identifier over 256 bytes. Each is dropped whole; nothing of it
    /// reaches a consumer.
    pub decode_failures: u64,
    /// Of the refused messages, those of a protocol version this carrier does not read (of a
    /// carrier of a release whose versions all lie outside this one's): dropped.
    pub version_refusals: u64,
    /// Deliveries queued for publishing.
    pub deliveries_out: u64,
    /// Deliveries received and handed to an exposed consumer.
    pub deliveries_in: u64,
    /// Deliveries received whose body could not be read as the exposed consumer's type: each
    /// a dead letter at the consumer (`DeadLetterReason::UndecodableBody`, or
    /// `IncompatibleBody` for a codec or schema version it cannot read; no ACK), logged at
    /// most once a minute with why.
    pub undecodable_bodies: u64,
    /// Deliveries received without a reply subject (nowhere to send their ACKs): dropped.
    pub deliveries_without_reply: u64,
    /// Deliveries received whose reply subject is not under `reply_prefix` (the consumer
    /// would publish ACKs wherever a sender asks): dropped.
    pub foreign_reply_subjects: u64,
    /// Deliveries received while 16 batches already waited for the consumer to take them
    /// (a busy consumer; dead letters of undecodable bodies wait, and count, alike): dropped,
    /// whether their bodies decode or not, so that neither the client's buffer nor the
    /// consumer's mailbox grows; the producers retransmit them.
    pub deliveries_dropped_busy: u64,
    /// "No responders" notices the server sent to the ACK inbox: a batch was published to
    /// a subject nobody listened on at that moment (the producer retransmits it). Counted
    /// only on the reply subject the batch named, at most once per batch, and only while
    /// the batch may still be answered: the server answers at once, so a batch is closed once
    /// a probe that the carrier publishes to that reply subject behind it has come back
    /// through the server (within a round trip to the server, or a second if the probe is
    /// lost). A status another client publishes while a batch is open cannot be told from
    /// the server's, at most one per open batch.
    pub no_responders: u64,
    /// "No responders" statuses on the ACK inbox that answer no batch this carrier published
    /// (not on a destination's reply subject, or while no batch published there is open:
    /// each was answered already, or delivered, which its probe showed): any client may
    /// publish to an inbox, so these are another client's, and ignored.
    pub forged_no_responders: u64,
    /// ACKs queued for publishing.
    pub acks_out: u64,
    /// ACKs received and handed to their producer.
    pub acks_in: u64,
    /// ACKs received for no known producer incarnation (dropped).
    pub unroutable_acks: u64,
    /// ACKs received while 8 full frames of ACKs (8 × 1024) handed to their producer were not known
    /// to be taken from its mailbox (a busy producer, or a flood): dropped, so that its mailbox
    /// does not grow; the producer retransmits those messages and is ACKed again.
    pub acks_dropped_busy: u64,
    /// Deliveries dropped because the publishing queue was full (`max_output_bytes`).
    pub deliveries_dropped_full: u64,
    /// ACKs dropped because the publishing queue was full.
    pub acks_dropped_full: u64,
    /// Deliveries that cannot be sent: a body that does not encode or fit a message, no
    /// reply address, or the carrier stopped.
    pub deliveries_unsendable: u64,
    /// Chunks of large messages held back, not published, because this carrier writes
    /// protocol version 3, which has no chunks (see `NatsOptionsBuilder::wire_version`),
    /// counted per held transmission: a held chunk stays unconfirmed, its producer retransmits
    /// it, and it is held and counted again. The producer's window stays occupied, so a
    /// producer that chunks stalls on a carrier at version 3 until it sends through a carrier
    /// made with version 4 or its `max_attempts` gives the message up.
    pub chunks_held_for_version: u64,
    /// Messages the NATS client refused to publish (the client was closed, say): their
    /// deliveries or ACKs are lost and recovered by retransmission.
    pub publish_failures: u64,
    /// Bodies encoded (once per message; again only after its route was forgotten).
    pub bodies_encoded: u64,
    /// The most bytes ever queued for publishing at once (at most `max_output_bytes`).
    pub output_high_water: u64,
    /// Producer incarnations remembered for routing ACKs, now.
    pub routes: u64,
    /// Encoded bodies kept for retransmission, now.
    pub cached_bodies: u64,
}

counters!(Counters => NatsStats {
    frames_in,
    frames_out,
    decode_failures,
    version_refusals,
    deliveries_out,
    deliveries_in,
    undecodable_bodies,
    deliveries_without_reply,
    foreign_reply_subjects,
    deliveries_dropped_busy,
    no_responders,
    forged_no_responders,
    acks_out,
    acks_in,
    unroutable_acks,
    acks_dropped_busy,
    deliveries_dropped_full,
    acks_dropped_full,
    deliveries_unsendable,
    chunks_held_for_version,
    publish_failures,
    bodies_encoded;
    output_high_water,
    routes,
    cached_bodies,
});
