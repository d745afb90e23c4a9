//! Reliable delivery over NATS (feature `nats`): consumers are found by subject instead of by
//! address, and a queue group lets several processes share a consumer and take over from
//! each other. A [`NatsCarrierHandle`] per process exposes local consumers on subjects
//! ([`NatsCarrierHandle::expose`], [`NatsCarrierHandle::expose_in_group`]) and hands out
//! [`ConsumerRef`](crate::ConsumerRef)s for subjects ([`NatsCarrierHandle::consumer_ref`]) that an
//! unchanged [`ProducerController`](crate::ProducerController) sends to.
//!
//! NATS core delivers at most once: a message published while nobody listens, or while the
//! server is away, is gone. The protocol on top makes it at-least-once (every message is
//! retransmitted until its ACK arrives), and with a persistent consumer effectively-once.
//!
//! # How it works
//!
//! - **Deliveries** are published to the consumer's subject in batches (what one producer flush
//!   hands over, split to fit the server's `max_payload` and at most 1024 deliveries), with a reply
//!   subject under the carrier's own inbox, one per
//!   [`consumer_ref`](NatsCarrierHandle::consumer_ref) (`_INBOX.<inbox>.<random token>`). The
//!   server's "no responders" notice for a batch comes back on that subject, at once; a status
//!   another client publishes to the inbox is counted apart ([`NatsStats::forged_no_responders`]).
//!   Whether a batch may still be answered is known from a probe: a message of the carrier's own (a
//!   random key and the number of batches before it) published to the reply subject behind its
//!   batches, at most one in flight per reference (one second taken as lost): when it comes back
//!   through the server, every notice for the batches before it has come, so a status for them is
//!   another client's.
//! - **ACKs** go back, batched, to the reply subject their delivery named; the carrier routes them
//!   to the producer by its id and incarnation. A body is encoded once per message and kept for
//!   retransmissions until it is ACKed or the producer's window moves past it.
//! - **Messages beyond `max_payload`** go in chunks
//!   ([`chunk_size`](crate::ProducerOptionsBuilder::chunk_size), at most the server's `max_payload`
//!   less 1 KiB of headers: a producer with larger chunks is refused when it is built), each chunk
//!   sent as its bytes. With a queue group, a message's chunks are spread over the members, and the
//!   message completes only in a round whose chunks all reach the same one: send chunked messages
//!   to a subject with one consumer, not to a queue group.
//! - **Reconnection is the client's** (`async-nats` reconnects with backoff by itself, and
//!   subscribes again). A batch counts against `max_output_bytes` until the client has written it
//!   to its socket, so while the server is away the carrier's queue fills to that limit and drops
//!   the rest (counted); the producers retransmit it all.
//! - **Queue groups**: the server hands each batch to one member. When a member dies, the messages
//!   it had not ACKed are retransmitted, and reach a live member. Because a producer's batches are
//!   spread over the members, each member's duplicate filter sees only part of the stream: a
//!   retransmission that reaches another member than the first copy runs the handler again
//!   (at-least-once). Ordered mode still holds (a member refuses a message until the producer's
//!   window start shows its predecessor confirmed), at the cost of refusals and retransmissions. A
//!   member whose consumer stops for good leaves the group (its carrier unsubscribes), so its share
//!   goes to the others. For effectively-once across members, give each member a persistent
//!   consumer ([`persistence`](crate::persistence)) of the same entity on a shared journal (the
//!   PostgreSQL journal, feature `postgres`): the journal's record of processed deliveries answers
//!   the second copy, and its fence decides between two members writing at once.
//!
//! # Wire format
//!
//! One NATS message is the byte of its protocol version, then one frame of the TCP transport
//! at that version ([`tcp`](crate::tcp), "Wire format"), without the length prefix (NATS
//! frames its messages) and without a tag (NATS authenticates its clients): kind 4
//! `Deliveries` on the consumer's subject (its consumer name is the subject), kind 5 `Acks` on
//! the producer's inbox. Bodies carry their codec and schema version as over TCP
//! ([`BodySchema`](crate::tcp::BodySchema), declared with [`NatsCarrierHandle::body_schema`]).
//!
//! A carrier reads messages of every protocol version this release speaks, 3 (first byte 3;
//! deliveries cannot be chunks) and 4 (first byte 7), writes its deliveries at the version its
//! [`wire_version`](NatsOptionsBuilder::wire_version) names (default 4), and writes each ACK at
//! the version of the deliveries it answers (which their carrier wrote, so reads): there is no
//! handshake, so during a rolling upgrade from a release that reads only an older version,
//! every carrier of this release writes that version until none of the older release is left.
//! A chunk is never published by a carrier writing version 3: it is held back and stays
//! unconfirmed, its producer retransmits it and it is held again, counted per held
//! transmission in [`NatsStats::chunks_held_for_version`]. The producer's window stays
//! occupied, so a producer that chunks stalls on a carrier at version 3 until it sends through
//! a carrier made with version 4 or its `max_attempts` gives the message up. A message of another
//! protocol version is refused, counted in [`NatsStats::version_refusals`] and warned about:
//! protocol 1 (releases before bodies carried a codec, and before NATS messages carried a
//! version) put the frame first, so this carrier refuses its messages, and it refuses this
//! carrier's as frames of the wrong kind: neither misreads the other, and neither delivers to
//! the other; protocol 2 (before deliveries could carry a trace context) is refused by its
//! version byte, 2. Protocol 4's byte is 7, not 4: 4 and 5 are the first bytes of protocol
//! 1's messages (the kinds of its frames).
//!
//! # Untrusted input and bounded memory
//!
//! Every message is untrusted. One longer than the server's `max_payload`, one that is not a
//! frame of this protocol, the wrong kind for its subject, or with an identifier over 256
//! bytes is dropped whole, counted in [`NatsStats::decode_failures`] and logged at most once
//! a minute; never a panic. Then, as over TCP, a body that cannot be read as the consumer's
//! type is a dead letter of that delivery only, and fields that admission checks become dead
//! letters at the consumer. Deliveries without a reply subject, or with one not under
//! `reply_prefix` (default `_INBOX.`), are counted and dropped: the consumer publishes ACKs
//! only to inboxes, never to a subject a sender names. The consumer's name inside a batch is
//! not checked: the subject it arrived on is the address.
//!
//! The carrier reads its subscriptions continuously: at most 16 batches per exposed subject wait
//! for the consumer to take them from its mailbox (a batch's dead letters of bodies that do not
//! decode wait there too, and count alike), and beyond, deliveries are dropped (counted in
//! [`NatsStats::deliveries_dropped_busy`]) rather than left to pile up in the client's buffer,
//! which is bounded in messages, not bytes. The ACK inbox is bounded alike: at most 8 full frames
//! of ACKs (8 × 1024) per producer incarnation not known to be taken by the producer (as over TCP),
//! and beyond, ACKs are dropped (counted in [`NatsStats::acks_dropped_busy`]; the producer
//! retransmits and is ACKed again), so an ACK flood at a busy producer cannot grow its mailbox. At
//! most `max_output_bytes` wait to be published or written, and at most `max_routes` producer
//! incarnations (over the whole carrier) are remembered with their unconfirmed bodies.
//!
//! # Security
//!
//! Authentication and TLS are the NATS server's and client's: connect the client with
//! credentials (`async_nats::ConnectOptions::with_credentials_file`, `user_and_password`,
//! `token`, NKeys; `require_tls(true)` and root certificates for TLS) and pass it to
//! [`NatsCarrierHandle::with_client`]; restrict with the server's permissions who may publish to
//! a consumer's subject and subscribe to `_INBOX.>`, and let consumer processes publish
//! only to `_INBOX.>` (their ACKs). Anyone who may publish to a consumer's
//! subject can deliver messages to it and, knowing a producer's incarnation, speak for that
//! producer ([Trust](crate::guide::guarantees#trust-the-incarnation-is-a-capability)); anyone
//! who may subscribe to a subject reads its messages.
//!
//! Choosing between TCP, NATS and a broker with its own persistence:
//! [Choosing a transport](crate::guide::over_nats#choosing-a-transport).

mod acks;
mod carrier;
mod inbound;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
use actix_delivery_proto::nats::notices;
mod options;
mod publisher;
mod shared;
mod stats;
use actix_delivery_proto::nats::subject;
use actix_delivery_proto::nats::version;

pub use carrier::{NatsCarrierHandle, NatsError};
pub use options::{NatsConfig, NatsOptions, NatsOptionsBuilder};
pub use stats::NatsStats;
pub(crate) use subject::check_subject;
pub use subject::SubjectError;
