//! Reliable delivery across processes and machines, over TCP: a [`NodeHandle`] per process listens
//! for peers, exposes local consumers under names ([`NodeHandle::expose`]) and hands out
//! [`ConsumerRef`](crate::ConsumerRef)s to consumers of other nodes ([`NodeHandle::consumer_ref`])
//! that an unchanged [`ProducerController`](crate::ProducerController) sends to. ACKs come back on
//! the connection their delivery came on.
//!
//! # How it works
//!
//! - **One connection per remote address** ([`PeerAddr`]: an address, or a name resolved on
//!   every attempt), made on the first delivery (or [`NodeHandle::dial`]), kept, and made again
//!   after a loss with exponential backoff (with jitter). Deliveries that find it being made
//!   wait for it (up to `max_output_bytes`); after a failed attempt and while backing off they
//!   are dropped (counted), and the producer's retransmission covers the gap, so nothing is
//!   lost. A connection carries deliveries one way and ACKs the other; heartbeats keep it
//!   alive, and one that stays silent for `idle_timeout` is closed and made again.
//! - **A body is encoded once per message.** The reference keeps each unconfirmed message's
//!   encoded body per producer id and incarnation (the lanes of an outbox share their
//!   entity's incarnation under ids of their own; the same table routes ACKs back, to the reply
//!   address of the producer's latest delivery: a durable producer restarted in the same
//!   process keeps its incarnation, and its ACKs follow it) until the ACK
//!   passes or the producer's `window_start` moves past it; retransmissions reuse the bytes.
//! - **Batches.** What one producer flush hands over goes out in as few frames as fit (up to
//!   1024 deliveries each), and a write drains everything queued for its connection in one
//!   system call. The receiver hands a frame to its consumer as one actor message.
//! - **A restart is visible**: each node draws a random [`NodeId`] at start, exchanged in the
//!   handshake ([`NodeHandle::peer_id`]).
//! - **Lifetime.** A node runs until [`NodeHandle::stop`] or until its last handle is dropped: its
//!   clones and the references from [`NodeHandle::consumer_ref`]. Then its listener and connections
//!   close.
//!
//! # Wire format
//!
//! Frames are a 4-byte big-endian length (`tokio-util`'s `LengthDelimitedCodec`) and a
//! payload: a bincode-encoded frame ([`crate::codec`]: varint, little endian, no trailing
//! bytes) of one of these kinds, then, once authenticated, a 16-byte tag.
//!
//! | kind | direction | fields |
//! |---|---|---|
//! | 0 `Hello` | client → server | magic `actixdlv`, version offered (`wire_version`: 4 by default), node id, nonce (32 B), authenticated, max frame length |
//! | 1 `Challenge` | server → client | version of the connection, node id, nonce, max frame length, server proof |
//! | 2 `Proof` | client → server | client proof |
//! | 3 `Accepted` | server → client | — (the first tagged frame) |
//! | 4 `Deliveries` | client → server | consumer name, producer id, incarnation, items (seq, window start, trace context: 0, or 1 and its 25 bytes, chunk header: 0, or 1 and the message's first seq, chunk count and length, body bytes) |
//! | 5 `Acks` | server → client | producer id, incarnation, seqs |
//! | 6 `Ping` | both | — |
//!
//! A body is its codec's id (one byte: 1 bincode, 2 MessagePack), the schema version of its
//! type (a varint) and the value in that codec: see [`BodySchema`] for how a receiver reads
//! bodies of other versions of its type.
//!
//! This release speaks protocol versions 3 and 4. Version 4 is the table above; version 3 is
//! the same without the chunk header of a delivery. The handshake settles each connection on
//! the highest version both nodes speak, in its one round trip: the client offers its
//! [`wire_version`](NodeOptionsBuilder::wire_version) (4 by default), and the server answers
//! with the highest version it speaks up to that offer; every later frame of the connection is
//! at that version. A node of the previous release (which speaks 4 only) and one of this
//! release at the default settings therefore connect at 4, as before; for a rolling upgrade
//! from a release that speaks only an older version, the nodes of this release offer that
//! version until the last node of the older release is gone. A `Hello` of a newer version may
//! be longer than this release's (a later version appends fields to it): its known part is
//! read and the server answers with its own highest version, so the next release can roll onto
//! this one. Peers without a version in common refuse each other in the handshake, with both
//! sides' versions in the reason, counted in [`NodeStats::version_refusals`]: protocol 1
//! (before bodies carried their codec) and 2 (before deliveries could carry a trace context).
//! A chunk is never sent on a connection at version 3: it is held back and stays unconfirmed,
//! its producer retransmits it and it is held again, counted per held transmission in
//! [`NodeStats::chunks_held_for_version`]. The producer's window stays occupied, so a producer
//! that chunks stalls on a version-3 link until the connection is made again at 4 or its
//! `max_attempts` gives the message up.
//!
//! A chunk of a large message
//! ([`ProducerOptionsBuilder::chunk_size`](crate::ProducerOptionsBuilder::chunk_size)) is a
//! delivery whose body is the chunk's bytes of its message's encoding (the message, as a body
//! above, cut into chunks), with a chunk header; the receiving node hands the chunks to the
//! consumer, which decodes the message with the node's schema once it is whole.
//!
//! The handshake (see the `handshake` module source for the state machine):
//! `proof_S = HMAC-SHA256(K, "actix-delivery/1 server proof\0" ‖ t)`, `proof_C` the same with
//! `client proof`, where the transcript `t` is the `Hello`'s bytes (as the client sent them,
//! the fields a newer version appended included) followed by the encoded `Challenge` without
//! its proof: every field either side announced (both fresh 32-byte nonces, both node ids,
//! versions, the client's mode, both frame limits), so a value altered on the path (a lowered
//! version offer, say) fails the handshake. For a `Hello` of a version above 4 (which may be
//! longer than this release's), `t` starts with the length of the `Hello`'s bytes (a 4-byte
//! little-endian `u32`), so that no byte can move between the `Hello` and the `Challenge`
//! unnoticed; every later release binds such a `Hello` the same way. Both proofs are checked
//! in constant time. The session keys of the two directions are derived the same way (`key
//! client to server`, `key server to client`); every later frame's tag is `HMAC-SHA256(key,
//! frame number ‖ payload)` truncated to 16 bytes, with frame numbers counted from 0 per
//! direction and never sent.
//!
//! # Untrusted input
//!
//! Every byte from a socket is untrusted. Before the handshake a peer can make the node
//! buffer at most 256 bytes; after it, at most `max_frame_length` (length prefixes above it are
//! refused before anything is reserved). A frame is checked, in order: its tag (a wrong one
//! closes the connection before any decoding), its encoding (bounded by its length), its ids
//! (consumer name and producer id at most 256 bytes, borrowed from the frame, so a longer one
//! is never allocated) and its batch length (at most 1024, refused before reserving more). A
//! failure closes that connection only, counted in [`NodeStats::decode_failures`] and logged
//! at most once a minute; never the node, never a panic. Then each body is read as the
//! consumer's type: one that does not decode, or whose codec or schema version it cannot read,
//! is that delivery's fault only, a dead letter at the consumer
//! ([`DeadLetterReason::UndecodableBody`](crate::DeadLetterReason),
//! [`IncompatibleBody`](crate::DeadLetterReason::IncompatibleBody); no ACK, counted in
//! [`NodeStats::undecodable_bodies`]); the other deliveries of its frame are
//! delivered and the connection stays open. Dead letters count against the receiving bound
//! below exactly as deliveries do. Fields that admission checks (seq range, window
//! start, empty producer id) pass through and become dead letters at the consumer, exactly as
//! in-process. Deliveries for a name not exposed are counted and dropped.
//!
//! One cost is the body type's, not the transport's: serde reserves up to 1 MiB up front for
//! a sequence (`Vec<T>`, a map) whose length prefix claims that much, before it finds the
//! bytes missing and fails (freed at once). A peer can therefore make a node reserve up to
//! 1 MiB per sequence nested in the body type, for the moment one body is decoded. Bodies
//! with `serde_bytes` fields or strings are not affected (their length is checked against the
//! bytes first). The fuzz test (`actix-delivery-proto/tests/fuzz`) measures both bounds.
//!
//! # Bounded memory
//!
//! Per connection, at most `max_output_bytes` of frames are held, queued or being written to
//! the socket (bytes leave the count as the socket takes them); what does not fit is dropped
//! and counted (the producer retransmits), so a slow or stalled reader costs the sender that
//! much (plus, for a moment, one frame being encoded) and its socket buffer, never more
//! ([`NodeStats::output_high_water`] is published as it rises, so it is true while a write
//! blocks). On the receiving side a connection has at most 8 frames handed to consumers and
//! not yet taken from their mailboxes, their dead letters included; beyond, it stops reading,
//! and TCP flow control slows the sender. Per remote address, at most `max_routes` routes
//! (producer id and incarnation) are remembered, each with the encoded bodies of its
//! unconfirmed messages (bounded by its window) and at most 8 192 received ACKs handed to its
//! producer and not known to be taken (the producer is asked once per 4 096); beyond, ACKs
//! are dropped and counted
//! ([`NodeStats::acks_dropped_busy`]: the producer retransmits, the consumer ACKs again), as
//! a connection serves other producers too and must not stop reading for one. At most
//! `max_handshakes` incoming connections are in their handshake: a new one beyond closes the
//! oldest ([`NodeStats::handshakes_evicted`]), so connections that never authenticate cannot
//! keep an honest peer out; a handshake that takes longer than `handshake_timeout` is closed
//! ([`NodeStats::handshakes_timed_out`]). At most `max_connections` authenticated incoming
//! connections are open; more are closed after their handshake.
//!
//! # Security
//!
//! Three modes: the shared secret (the handshake and tags above), TLS 1.3 and mutual TLS
//! (feature `tls`: `NodeOptionsBuilder::tls` with a `NodeTls`; the frames are the same,
//! inside TLS and untagged, the inner handshake then exchanging node ids and frame limits
//! only). A TLS node tells a plain peer by its first byte (a frame's length prefix starts with
//! 0, a TLS record with 0x16), refuses it and counts it in [`NodeStats::tls_failures`], and a
//! plain node does the same with a TLS peer. What each mode protects, how the modes meet and
//! what all of them leave open: [Security](crate::guide::over_tcp#security-three-modes) in the
//! guide.

pub(crate) use actix_delivery_proto::tcp::auth;
pub(crate) use actix_delivery_proto::tcp::body;
mod connection;
pub(crate) mod context;
pub(crate) use actix_delivery_proto::tcp::frame;
pub(crate) use actix_delivery_proto::tcp::handshake;
pub(crate) mod inbound;
mod node;
pub(crate) mod options;
pub(crate) mod outbound;
pub(crate) use actix_delivery_proto::tcp::output;
use actix_delivery_proto::tcp::peer;
use actix_delivery_proto::tcp::pending;
pub(crate) mod registry;
pub(crate) use actix_delivery_proto::tcp::routes;

#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub(crate) mod stats;
#[cfg(feature = "tls")]
mod tls;

pub use crate::codec::schema::{BodySchema, DEFAULT_WIRE_CODEC};
pub use auth::{NodeId, NodeSecret, MAX_SECRET_BYTES, MIN_SECRET_BYTES};
pub use node::{NameError, NodeHandle};
pub use options::{NodeConfig, NodeOptions, NodeOptionsBuilder};
pub use peer::{PeerAddr, PeerAddrError};
pub use stats::NodeStats;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use tls::{NodeTls, NodeTlsBuilder, TlsError};
