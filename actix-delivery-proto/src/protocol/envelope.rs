//! The data that crosses the wire: identities, the delivery header, the ACK, and the admission
//! rules that bound what a peer may send.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::protocol::chunk::header::{ChunkFault, ChunkHeader};
use crate::protocol::trace_context::TraceContext;

/// The longest producer id (in bytes) a consumer admits. Not configurable: a limit the sender
/// could raise would be no limit.
pub const MAX_ID_BYTES: usize = 256;

/// The largest sequence number a consumer admits (`2^53 - 1`, the largest integer every JSON
/// peer can represent exactly). Sequence numbers start at 1.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// The name a producer goes by, as carried on the wire.
///
/// Cheap to clone (a shared string). A value received from a peer is untrusted: the consumer
/// checks it during admission ([`admit`]), and the library never writes peer-supplied ids to
/// its logs.
#[derive(Clone, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProducerId(Arc<str>);

impl ProducerId {
    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length of the id in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the id is the empty string (which admission refuses).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for ProducerId {
    fn from(id: &str) -> Self {
        Self(Arc::from(id))
    }
}

impl From<String> for ProducerId {
    fn from(id: String) -> Self {
        Self(Arc::from(id))
    }
}

/// Ids cloned from one another share their string, so identity answers most comparisons
/// without reading the bytes.
impl PartialEq for ProducerId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for ProducerId {}

impl Hash for ProducerId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The string's hash, consistent with `Eq` and with `Borrow<str>`.
        self.as_str().hash(state);
    }
}

// Hash and Eq of `ProducerId` are those of the string, so tables keyed by id can be queried
// with a `&str`.
impl Borrow<str> for ProducerId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A 128-bit token that a producer draws from the OS CSPRNG each time it starts.
///
/// It separates the sequence spaces of successive lives of one producer id (a restarted
/// producer reuses seqs, never its incarnation), and it authenticates ACKs: a producer acts
/// only on ACKs that mirror its current incarnation, which leaves the producer only on
/// deliveries it actually sent.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Incarnation {
    // Two halves rather than a `u128`: 8-byte alignment keeps every header free of padding.
    high: u64,
    low: u64,
}

impl Incarnation {
    /// A token with a chosen value, for tests, simulations and wire decoding.
    pub const fn from_u128(value: u128) -> Self {
        Self {
            high: (value >> 64) as u64,
            low: value as u64,
        }
    }

    /// The token's value.
    pub const fn as_u128(self) -> u128 {
        ((self.high as u128) << 64) | self.low as u128
    }
}

impl Incarnation {
    /// The token's public identifier: what handlers, dead letters, logs and journals see.
    pub fn id(self) -> IncarnationId {
        let digest = Sha256::new()
            .chain_update(b"actix-delivery incarnation\0")
            .chain_update(self.as_u128().to_le_bytes())
            .finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        IncarnationId(u128::from_be_bytes(first))
    }
}

/// Never prints the token (it is a capability): only its public [`IncarnationId`].
impl fmt::Debug for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Incarnation(id {})", self.id())
    }
}

/// The stable, public identifier of an [`Incarnation`]: the first 128 bits of a SHA-256 digest
/// of the token. The same token always gives the same id (in every process), distinct tokens
/// give distinct ids (a collision is as likely as guessing a 128-bit value), and the id reveals
/// nothing about the token, so it can be stored, logged and shown where the token must not go.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IncarnationId(u128);

impl IncarnationId {
    /// An id with a chosen value (tests, decoding stored records).
    pub const fn from_u128(value: u128) -> Self {
        Self(value)
    }

    /// The id's value.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for IncarnationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for IncarnationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IncarnationId({self})")
    }
}

/// Everything of a delivery except its body and reply address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The sending producer's id.
    pub producer_id: ProducerId,
    /// The sending producer's current incarnation.
    pub incarnation: Incarnation,
    /// This message's sequence number within the incarnation (from 1).
    pub seq: u64,
    /// The lowest seq the producer still awaits an ACK for: every lower seq of this incarnation
    /// is settled at the producer. A consumer that has no (or lost its) dedup state for this
    /// producer starts its window here instead of waiting forever for seqs that will never be
    /// sent again. Always `1 <= window_start <= seq`.
    pub window_start: u64,
    /// The trace the message was sent in, if the producer set one
    /// (`ProducerOptionsBuilder::trace_context`).
    pub trace_context: Option<TraceContext>,
    /// Set when the delivery is one chunk of a large message (a producer with
    /// `chunk_size`): where it sits in its
    /// message. For a reassembled message (what a handler runs for), `seq` is its last chunk's.
    #[serde(default)]
    pub chunk: Option<ChunkHeader>,
}

impl Header {
    /// The seq of the message's first chunk: `seq` itself unless the message was chunked.
    pub fn first_seq(&self) -> u64 {
        self.chunk.map_or(self.seq, |chunk| chunk.first_seq)
    }
}

/// Which message a handler is running for: what an effectively-once handler records next to
/// its business state to recognise a re-run. It names the incarnation by its public
/// [`IncarnationId`], never by the token, so it is safe to store and log.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeliveryInfo {
    /// The producer that sent the message.
    pub producer_id: ProducerId,
    /// The public id of the producer's incarnation when it sent the message.
    pub incarnation: IncarnationId,
    /// The message's sequence number within that incarnation (of a chunked message: its last
    /// chunk's, whose ACK confirms it).
    pub seq: u64,
    /// The lowest seq the producer still awaited an ACK for when it sent this message: every
    /// lower seq of the incarnation was settled (ACKed or given up) by then.
    pub window_start: u64,
    /// The trace the message was sent in, if its producer set one
    /// (`ProducerOptionsBuilder::trace_context`):
    /// the parent of the handler's work. Metadata, not identity: a message resent by a
    /// recovered durable producer has none (contexts are not stored).
    #[serde(default)]
    pub trace_context: Option<TraceContext>,
    /// `Some(first)` when the message was sent in chunks
    /// (`chunk_size`): it took every seq from
    /// `first` through `seq`, and an effectively-once record marks them all (see
    /// [`seqs`](Self::seqs)). `None`: it took `seq` alone.
    #[serde(default)]
    pub first_seq: Option<u64>,
}

impl DeliveryInfo {
    /// Every seq the message took: `seq` alone, or, for a chunked message, its chunks'.
    pub fn seqs(&self) -> std::ops::RangeInclusive<u64> {
        self.first_seq.unwrap_or(self.seq)..=self.seq
    }
}

impl From<&Header> for DeliveryInfo {
    fn from(header: &Header) -> Self {
        Self {
            producer_id: header.producer_id.clone(),
            incarnation: header.incarnation.id(),
            seq: header.seq,
            window_start: header.window_start,
            trace_context: header.trace_context.clone(),
            first_seq: header.chunk.map(|chunk| chunk.first_seq),
        }
    }
}

/// The acknowledgement a consumer sends to a delivery's `reply_to` once the handler succeeded
/// (or immediately for a duplicate). It mirrors the delivery's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ack {
    /// The producer the ACK is meant for.
    pub producer_id: ProducerId,
    /// The incarnation mirrored from the delivery.
    pub incarnation: Incarnation,
    /// The acknowledged sequence number.
    pub seq: u64,
}

impl From<Header> for Ack {
    fn from(header: Header) -> Self {
        Self {
            producer_id: header.producer_id,
            incarnation: header.incarnation,
            seq: header.seq,
        }
    }
}

/// Why a delivery was refused as malformed (a dead letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The delivery has no address to send the ACK to.
    #[error("the delivery has no reply_to")]
    MissingReplyTo,
    /// `seq` is 0 or above [`MAX_SEQ`].
    #[error("seq {0} is outside 1..=2^53-1")]
    SeqOutOfRange(u64),
    /// The producer id is the empty string.
    #[error("the producer id is empty")]
    EmptyProducerId,
    /// The producer id is longer than [`MAX_ID_BYTES`].
    #[error("the producer id is {0} bytes, more than the 256 allowed")]
    ProducerIdTooLong(usize),
    /// `window_start` is 0 or above `seq`.
    #[error("window_start {window_start} is outside 1..=seq ({seq})")]
    WindowStartOutOfRange {
        /// The offending value.
        window_start: u64,
        /// The delivery's seq.
        seq: u64,
    },
    /// The body arrived encoded (from another process) and does not decode as the consumer's
    /// message type.
    #[error("the body does not decode as the consumer's message type")]
    UndecodableBody,
    /// The body arrived encoded in a way the consumer's version of its message type cannot
    /// read: a codec this version of the crate does not know, a schema version newer than
    /// the consumer's (the sender runs newer code), or an older one that no upcaster turned
    /// into today's type (see `BodySchema`).
    #[error("{}", incompatible(*codec, *version, *current))]
    IncompatibleBody {
        /// The id of the codec the body was written in
        /// ([`Codec::id`](crate::codec::Codec::id)).
        codec: u8,
        /// The schema version the body was written at.
        version: u32,
        /// The consumer's version of its message type.
        current: u32,
    },
    /// The delivery carries a trace context with an all-zero trace or span id (which W3C
    /// Trace Context forbids, and no producer of this crate sends).
    #[error("the trace context has an all-zero id")]
    InvalidTraceContext,
    /// A chunk of a large message whose chunk header is impossible, or contradicts the chunks
    /// of its message received before (see [`ChunkFault`]).
    #[error("invalid chunk: {0}")]
    InvalidChunk(ChunkFault),
    /// A chunked message longer than the consumer's `max_message_bytes`: it can never be
    /// handled (no ACK: its producer retransmits it until it gives up).
    #[error("the message is {len} bytes, more than max_message_bytes ({max})")]
    MessageTooLarge {
        /// The message's length, as its chunks announce it.
        len: u64,
        /// The consumer's `max_message_bytes`.
        max: u64,
    },
    /// The body names an origin (a producer's stable message id: a sharded producer's entity
    /// envelope, a work-pulling job) that is not the sending stream's own: the delivery's
    /// token does not have the origin's public incarnation id, or its producer id is not the
    /// origin's followed by `/` (see [`check_origin`](crate::protocol::origin::check_origin)).
    /// Nothing was run and no window moved.
    #[error("the body names an origin that is not the sending stream's own")]
    ForeignOrigin,
    /// A sharded producer routed the message by another shard count than the receiving
    /// entity host's: the two disagree on which shard (and so which node) an entity belongs
    /// to. Every producer, host and coordinator of an entity type must use one count.
    #[error("the sender routes by {sent} shards, this host by {hosted}: the shard counts of an entity type must agree")]
    ShardCountMismatch {
        /// The sender's shard count.
        sent: u32,
        /// The host's.
        hosted: u32,
    },
}

/// The text of [`DeadLetterReason::IncompatibleBody`].
fn incompatible(codec: u8, version: u32, current: u32) -> String {
    let Some(name) = crate::codec::Codec::from_id(codec) else {
        return format!("the body is in codec {codec}, unknown to this version of the crate");
    };
    let why = if version > current {
        "newer than the consumer's"
    } else {
        "and no upcaster read it as the consumer's"
    };
    format!("the body was written as version {version} in {name}, {why} version {current}")
}

/// Admission: the checks a consumer applies to every delivery before anything else.
///
/// # Errors
/// The first rule the delivery breaks.
pub fn admit(header: &Header, has_reply_to: bool) -> Result<(), DeadLetterReason> {
    if !has_reply_to {
        return Err(DeadLetterReason::MissingReplyTo);
    }
    check_numbers(header.seq, header.window_start)?;
    check_producer_id(header.producer_id.as_str())?;
    if header
        .trace_context
        .as_ref()
        .is_some_and(|context| !context.is_valid())
    {
        return Err(DeadLetterReason::InvalidTraceContext);
    }
    Ok(())
}

/// The numbers of a delivery: a seq in `1..=`[`MAX_SEQ`], a window start in `1..=seq`.
///
/// # Errors
/// [`DeadLetterReason::SeqOutOfRange`] or [`DeadLetterReason::WindowStartOutOfRange`].
pub fn check_numbers(seq: u64, window_start: u64) -> Result<(), DeadLetterReason> {
    if seq == 0 || seq > MAX_SEQ {
        return Err(DeadLetterReason::SeqOutOfRange(seq));
    }
    if window_start == 0 || window_start > seq {
        return Err(DeadLetterReason::WindowStartOutOfRange { window_start, seq });
    }
    Ok(())
}

/// Checks a producer id against the wire limits (non-empty, at most [`MAX_ID_BYTES`]).
///
/// # Errors
/// [`DeadLetterReason::EmptyProducerId`] or [`DeadLetterReason::ProducerIdTooLong`].
pub fn check_producer_id(id: &str) -> Result<(), DeadLetterReason> {
    match id.len() {
        0 => Err(DeadLetterReason::EmptyProducerId),
        len if len > MAX_ID_BYTES => Err(DeadLetterReason::ProducerIdTooLong(len)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: &str, seq: u64, window_start: u64) -> Header {
        Header {
            producer_id: ProducerId::from(id),
            incarnation: Incarnation::from_u128(7),
            seq,
            window_start,
            trace_context: None,
            chunk: None,
        }
    }

    #[test]
    fn well_formed_delivery_is_admitted() {
        assert_eq!(admit(&header("p", 1, 1), true), Ok(()));
        assert_eq!(admit(&header("p", MAX_SEQ, 5), true), Ok(()));
    }

    #[test]
    fn missing_reply_to_is_refused_first() {
        assert_eq!(
            admit(&header("", 0, 0), false),
            Err(DeadLetterReason::MissingReplyTo)
        );
    }

    #[test]
    fn seq_must_be_within_one_to_two_pow_53_minus_one() {
        assert_eq!(
            admit(&header("p", 0, 1), true),
            Err(DeadLetterReason::SeqOutOfRange(0))
        );
        assert_eq!(
            admit(&header("p", MAX_SEQ + 1, 1), true),
            Err(DeadLetterReason::SeqOutOfRange(MAX_SEQ + 1))
        );
        assert_eq!(MAX_SEQ, 9_007_199_254_740_991);
    }

    #[test]
    fn producer_id_must_be_one_to_256_bytes() {
        assert_eq!(
            admit(&header("", 1, 1), true),
            Err(DeadLetterReason::EmptyProducerId)
        );
        assert_eq!(admit(&header(&"x".repeat(256), 1, 1), true), Ok(()));
        assert_eq!(
            admit(&header(&"x".repeat(257), 1, 1), true),
            Err(DeadLetterReason::ProducerIdTooLong(257))
        );
        // Bytes, not chars: 128 two-byte chars are exactly 256 bytes.
        assert_eq!(admit(&header(&"é".repeat(128), 1, 1), true), Ok(()));
        assert_eq!(
            admit(&header(&"é".repeat(129), 1, 1), true),
            Err(DeadLetterReason::ProducerIdTooLong(258))
        );
    }

    #[test]
    fn window_start_must_be_within_one_to_seq() {
        assert_eq!(
            admit(&header("p", 3, 0), true),
            Err(DeadLetterReason::WindowStartOutOfRange {
                window_start: 0,
                seq: 3
            })
        );
        assert_eq!(
            admit(&header("p", 3, 4), true),
            Err(DeadLetterReason::WindowStartOutOfRange {
                window_start: 4,
                seq: 3
            })
        );
        assert_eq!(admit(&header("p", 3, 3), true), Ok(()));
    }

    #[test]
    fn a_trace_context_with_an_all_zero_id_is_refused_after_the_other_rules() {
        let decoded = |bytes: [u8; 25]| -> TraceContext { crate::codec::decode(&bytes).unwrap() };
        let mut bytes = [1; 25];
        let mut traced = header("p", 2, 1);
        traced.trace_context = Some(decoded(bytes));
        assert_eq!(admit(&traced, true), Ok(()));
        bytes[..16].fill(0);
        traced.trace_context = Some(decoded(bytes));
        assert_eq!(
            admit(&traced, true),
            Err(DeadLetterReason::InvalidTraceContext)
        );
        bytes = [1; 25];
        bytes[16..24].fill(0);
        traced.trace_context = Some(decoded(bytes));
        assert_eq!(
            admit(&traced, true),
            Err(DeadLetterReason::InvalidTraceContext)
        );
        traced.seq = 0;
        assert_eq!(
            admit(&traced, true),
            Err(DeadLetterReason::SeqOutOfRange(0))
        );
    }

    #[test]
    fn incarnation_round_trips_its_value_and_orders_like_it() {
        let values = [0, 1, u64::MAX as u128, u64::MAX as u128 + 1, u128::MAX];
        for v in values {
            assert_eq!(Incarnation::from_u128(v).as_u128(), v);
        }
        for pair in values.windows(2) {
            assert!(Incarnation::from_u128(pair[0]) < Incarnation::from_u128(pair[1]));
        }
    }

    #[test]
    fn incarnation_ids_are_stable_distinct_and_never_show_the_token() {
        let token = Incarnation::from_u128(0x1234_5678_9abc_def0_0fed_cba9_8765_4321);
        assert_eq!(token.id(), token.id());
        assert_ne!(token.id(), Incarnation::from_u128(token.as_u128() + 1).id());
        // Fixed across processes and versions (journals store it): the first 16 bytes of
        // SHA-256("actix-delivery incarnation\0" ‖ token as 16 little-endian bytes).
        assert_eq!(
            Incarnation::from_u128(7).id().to_string(),
            "dcc6a721a510d45a33e5c707bd6e76f6"
        );
        let header = Header {
            producer_id: "p".into(),
            incarnation: token,
            seq: 1,
            window_start: 1,
            trace_context: None,
            chunk: None,
        };
        let printed = format!("{header:?} {:?}", DeliveryInfo::from(&header));
        assert!(!printed.contains("123456789abcdef"), "{printed}");
        assert!(
            !printed.contains(&format!("{:x}", token.as_u128())),
            "{printed}"
        );
        assert!(printed.contains(&token.id().to_string()), "{printed}");
    }

    #[test]
    fn ids_compare_by_content_whether_or_not_they_share_storage() {
        let a = ProducerId::from("same");
        assert_eq!(a, a.clone());
        assert_eq!(a, ProducerId::from("same".to_string()));
        assert_ne!(a, ProducerId::from("other"));
    }
}
