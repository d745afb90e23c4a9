//! The frames nodes exchange, their encoding, and the limits checked when decoding them. Pure:
//! no I/O, no runtime; shared by every transport of this crate.
//!
//! On the wire a frame is a 4-byte big-endian length `n` (what `tokio-util`'s
//! `LengthDelimitedCodec` reads by default) and `n` bytes: the [`Frame`] in the crate's bincode
//! format ([`crate::codec`]: varint integers, little endian, no trailing bytes), followed, after
//! an authenticated handshake, by a 16-byte tag ([`Sealer`]). The first byte of the payload is
//! the frame kind (the enum's variant index); a `Hello` starts with the magic bytes `actixdlv`
//! and the protocol version the client offers.
//!
//! # Versions
//!
//! This crate speaks the protocol versions [`MIN_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`]. The
//! handshake settles each connection on the highest version both sides speak (see the
//! `handshake` module), and every frame after it is encoded and decoded at that version
//! ([`Frame::encode_versioned`], [`Frame::decode_versioned`]). The handshake's own frames are
//! the same in every version, and a `Hello` only grows: a later version appends its new fields
//! to it, so that this release reads the part it knows of a newer client's `Hello`
//! ([`Frame::decode_opening`]) and answers with the highest version it speaks. Version 3 is
//! version 4 without the `chunk` field of a delivery: a chunk cannot be sent at version 3.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use crate::codec::{self, CodecError};
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::{Incarnation, MAX_ID_BYTES};
use crate::protocol::trace_context::TraceContext;
use crate::tcp::auth::{NodeId, Nonce, Sealer};

/// The highest protocol version this crate speaks, and the one a node offers unless told
/// otherwise (its `wire_version`): 4 since a delivery may be one chunk of a large message (one
/// byte when it is not); 3 since each delivery may carry a trace context (one byte when it
/// does not); 2 since bodies start with their codec and schema version (`schema`); version 1
/// bodies were bare bincode. A peer speaks with this crate at the highest version both speak;
/// one whose versions are all below [`MIN_PROTOCOL_VERSION`] is refused at the handshake.
pub const PROTOCOL_VERSION: u16 = 4;

/// The lowest protocol version this crate speaks: 3, whose deliveries cannot be chunks.
pub const MIN_PROTOCOL_VERSION: u16 = 3;

/// Whether deliveries at protocol `version` may be chunks of a large message (version 4 on).
pub const fn carries_chunks(version: u16) -> bool {
    version >= 4
}

/// The kind of a `Hello` (its variant index; the first byte of the payload as this crate
/// encodes it).
const HELLO_KIND: u32 = 0;

/// The kind of a `Deliveries` frame (its variant index).
const DELIVERIES_KIND: u32 = 4;

/// The first bytes of every `Hello`.
pub const MAGIC: [u8; 8] = *b"actixdlv";

/// The largest frame accepted before the handshake is done: an unauthenticated peer can make a
/// node buffer no more than this.
pub const HANDSHAKE_MAX_FRAME: usize = 256;

/// The most deliveries (or ACKed seqs) in one frame, checked while decoding, before anything
/// is allocated for more: it bounds what one frame can make the receiver allocate to a small
/// multiple of its length.
pub(crate) const MAX_BATCH: usize = 1024;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame<'a> {
    /// Client → server, first: who I am, my nonce.
    Hello(Hello),
    /// Server → client: who I am, my nonce, my proof.
    Challenge(Challenge),
    /// Client → server: my proof.
    Proof(Proof),
    /// Server → client, the first tagged frame: the client is admitted.
    Accepted,
    /// Client → server: deliveries from one producer to one exposed consumer.
    #[serde(borrow)]
    Deliveries(DeliveryBatch<'a>),
    /// Server → client: ACKs for one producer.
    #[serde(borrow)]
    Acks(AckBatch<'a>),
    /// Either way, when nothing else was sent for a while: the connection is alive.
    Ping,
}

/// The lowest `Hello` version whose handshake transcript binds the `Hello`'s length: 5, the
/// first version after this crate's 4, whose `Hello` may be longer than version 4's (see
/// [`Hello`]). Fixed for every release to come: it does not follow [`PROTOCOL_VERSION`].
pub const LENGTH_BOUND_HELLO_VERSION: u16 = 5;

// Every `Hello` that may carry bytes this crate does not know (a version above its own) has
// its length bound.
const _: () = assert!(PROTOCOL_VERSION + 1 >= LENGTH_BOUND_HELLO_VERSION);

/// The client's opening frame.
///
/// The contract between releases: a later protocol version only appends fields to `Hello`,
/// after these, and keeps it within [`HANDSHAKE_MAX_FRAME`]. A server reads the fields it
/// knows of a `Hello` of a version newer than its own and ignores the bytes after them (of
/// such a `Hello` only: trailing bytes are refused after any other frame), so that a client
/// of the next release can connect to a server of this one; the handshake binds the `Hello`'s
/// bytes as sent and received, the appended ones included.
///
/// What the handshake binds (its transcript) depends on the `Hello`'s version. Of a `Hello` of
/// version 3 or 4: its bytes, then the `Challenge` without its proof, encoded (what earlier
/// releases bind). Of a `Hello` of any version above 4 ([`LENGTH_BOUND_HELLO_VERSION`] on, the
/// format of future releases): the length of its bytes as a 4-byte little-endian `u32`, its
/// bytes, then the `Challenge` without its proof, encoded. Every later release computes the
/// transcript of a `Hello` above version 4 the same way: without the length, bytes moved from
/// the end of a longer `Hello` into the start of a forged `Challenge` (or the other way)
/// would leave the bound bytes unchanged, and the proofs would verify with the client and the
/// server at different versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 8],
    /// The highest protocol version the client offers (its `wire_version`).
    pub version: u16,
    /// The client's id for this run.
    pub node_id: NodeId,
    /// Fresh for this connection.
    pub nonce: Nonce,
    /// Whether the client authenticates (has a secret).
    pub authenticated: bool,
    /// The largest frame the client accepts.
    pub max_frame_length: u32,
}

/// The server's answer to a [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// The protocol version of the connection: the highest both sides speak.
    pub version: u16,
    /// The server's id for this run.
    pub node_id: NodeId,
    /// Fresh for this connection.
    pub nonce: Nonce,
    /// The largest frame the server accepts.
    pub max_frame_length: u32,
    /// The server's proof of the secret (`None` without authentication).
    pub proof: Option<[u8; 32]>,
}

/// The client's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// The client's proof of the secret (`None` without authentication).
    pub proof: Option<[u8; 32]>,
}

/// Deliveries of one producer incarnation to one consumer name. The ids are borrowed from the
/// frame: nothing is allocated for them before their length is checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryBatch<'a> {
    /// The exposed consumer's name.
    pub consumer: &'a str,
    /// The producer's id.
    pub producer_id: &'a str,
    /// The producer's incarnation.
    pub incarnation: Incarnation,
    /// At most `MAX_BATCH`.
    #[serde(borrow, deserialize_with = "bounded")]
    pub items: Vec<WireDelivery<'a>>,
}

/// One delivery in a [`DeliveryBatch`]: the body is the message's encoding, made once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDelivery<'a> {
    /// The message's seq.
    pub seq: u64,
    /// The producer's window start when it sent this.
    pub window_start: u64,
    /// The trace the message was sent in: one byte when absent (version 3 on).
    pub trace_context: Option<TraceContext>,
    /// Set when the delivery is one chunk of a large message: where it sits in its message
    /// (one byte when absent). Checked by the consumer's admission. Version 4 on: at version 3
    /// the field is not on the wire (it decodes as `None`), and a chunk cannot be encoded.
    pub chunk: Option<ChunkHeader>,
    /// The encoded body: its codec and schema version, then the value
    /// (`schema`); of a chunk, the chunk's bytes of its message's encoding.
    #[serde(serialize_with = "as_bytes")]
    pub body: &'a [u8],
}

/// ACKs for one producer incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckBatch<'a> {
    /// The producer's id, mirrored.
    pub producer_id: &'a str,
    /// The producer's incarnation, mirrored.
    pub incarnation: Incarnation,
    /// At most `MAX_BATCH`.
    #[serde(deserialize_with = "bounded")]
    pub seqs: Vec<u64>,
}

/// Why bytes are not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not a frame of this protocol (bad encoding, unknown kind, trailing bytes, …).
    #[error("malformed frame: {0}")]
    Malformed(#[from] CodecError),
    /// A `Hello` without the magic bytes.
    #[error("not an actix-delivery peer")]
    BadMagic,
    /// An identifier longer than [`MAX_ID_BYTES`].
    #[error("an identifier of {0} bytes, more than the 256 allowed")]
    IdTooLong(usize),
    /// The frame would exceed the peer's limit.
    #[error("the frame would be {len} bytes, more than the {max} allowed")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A protocol version this crate does not speak.
    #[error(
        "protocol version {0} is not one this release speaks ({MIN_PROTOCOL_VERSION} to \
         {PROTOCOL_VERSION})"
    )]
    UnknownVersion(u16),
    /// A delivery that the protocol version cannot express: a chunk below version 4.
    #[error("a chunk cannot be sent at protocol version {0}: chunks need version 4")]
    ChunkInVersion(u16),
}

impl<'a> Frame<'a> {
    /// Decodes one payload (tag already checked and removed) at [`PROTOCOL_VERSION`] and checks
    /// its limits. Fields that admission checks (seq ranges, empty ids) are passed through, to
    /// become dead letters.
    ///
    /// # Errors
    /// [`FrameError`]; never panics, whatever the bytes.
    pub fn decode(payload: &'a [u8]) -> Result<Self, FrameError> {
        let frame: Frame<'a> = codec::decode_borrowed(payload, payload.len() as u64)?;
        frame.checked()
    }

    /// Decodes one payload as [`decode`](Self::decode) does, at protocol `version`: what a
    /// connection negotiated at that version receives. At version 3 a delivery has no chunk
    /// field (it decodes as `None`).
    ///
    /// # Errors
    /// [`FrameError`] ([`FrameError::UnknownVersion`] for a version this crate does not
    /// speak); never panics, whatever the bytes.
    pub fn decode_versioned(payload: &'a [u8], version: u16) -> Result<Self, FrameError> {
        match version {
            PROTOCOL_VERSION => Self::decode(payload),
            3 => {
                let frame: FrameV3<'a> = codec::decode_borrowed(payload, payload.len() as u64)?;
                Frame::from(frame).checked()
            }
            other => Err(FrameError::UnknownVersion(other)),
        }
    }

    /// Decodes a client's first frame as [`decode`](Self::decode) does, except that a `Hello`
    /// of a version newer than [`PROTOCOL_VERSION`] may be longer than this crate's: the fields
    /// a later version appended are ignored (see [`Hello`]). Returns the frame with, of a
    /// `Hello`, its own bytes: the payload after the frame kind's encoding (whatever its
    /// length: bincode also reads a kind written in more bytes than it needs), the appended
    /// fields included; what the handshake binds. Of any other frame, an empty slice.
    ///
    /// # Errors
    /// [`FrameError`]; trailing bytes after a `Hello` of a version this crate knows, or after
    /// any other frame, are malformed. Never panics, whatever the bytes.
    pub fn decode_opening(payload: &'a [u8]) -> Result<(Self, &'a [u8]), FrameError> {
        let Ok((HELLO_KIND, value)) = codec::decode_prefix::<u32>(payload, payload.len() as u64)
        else {
            return Ok((Self::decode(payload)?, &[]));
        };
        let (hello, rest) = codec::decode_prefix::<Hello>(value, value.len() as u64)?;
        if !rest.is_empty() && hello.version <= PROTOCOL_VERSION {
            return Err(FrameError::Malformed(CodecError::Malformed {
                reason: format!(
                    "{} trailing bytes after a Hello of version {}",
                    rest.len(),
                    hello.version
                ),
            }));
        }
        Ok((Frame::Hello(hello).checked()?, value))
    }

    /// The frame if its magic and ids are within the limits.
    fn checked(self) -> Result<Self, FrameError> {
        match &self {
            Frame::Hello(hello) if hello.magic != MAGIC => return Err(FrameError::BadMagic),
            Frame::Deliveries(batch) => {
                check_id(batch.consumer)?;
                check_id(batch.producer_id)?;
            }
            Frame::Acks(batch) => check_id(batch.producer_id)?,
            _ => {}
        }
        Ok(self)
    }

    /// Appends the frame at [`PROTOCOL_VERSION`] to `out`: length prefix, payload, tag.
    /// Nothing is appended (and the sealer does not count it) if the frame would be longer
    /// than `max_len`. The handshake's frames are the same at every version.
    ///
    /// # Errors
    /// [`FrameError::TooLong`], or [`FrameError::Malformed`] if a body cannot be encoded.
    pub fn encode(
        &self,
        sealer: &mut Sealer,
        out: &mut Vec<u8>,
        max_len: usize,
    ) -> Result<(), FrameError> {
        encode_sealed(self, sealer, out, max_len)
    }

    /// Appends the frame to `out` as [`encode`](Self::encode) does, at protocol `version`:
    /// what a connection negotiated at that version sends.
    ///
    /// # Errors
    /// As [`encode`](Self::encode); [`FrameError::UnknownVersion`] for a version this crate
    /// does not speak, [`FrameError::ChunkInVersion`] for a chunk below version 4.
    pub fn encode_versioned(
        &self,
        version: u16,
        sealer: &mut Sealer,
        out: &mut Vec<u8>,
        max_len: usize,
    ) -> Result<(), FrameError> {
        match version {
            PROTOCOL_VERSION => self.encode(sealer, out, max_len),
            3 => {
                if let Frame::Deliveries(batch) = self
                    && batch.items.iter().any(|item| item.chunk.is_some())
                {
                    return Err(FrameError::ChunkInVersion(version));
                }
                encode_sealed(&AtVersion3(self), sealer, out, max_len)
            }
            other => Err(FrameError::UnknownVersion(other)),
        }
    }
}

/// Appends `frame` (a [`Frame`], or a view of one at another version) to `out`: length
/// prefix, payload, tag; nothing if it would be longer than `max_len`.
fn encode_sealed(
    frame: &impl Serialize,
    sealer: &mut Sealer,
    out: &mut Vec<u8>,
    max_len: usize,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX]);
    let body = start + LENGTH_PREFIX;
    if let Err(err) = codec::encode_into(frame, out) {
        out.truncate(start);
        return Err(err.into());
    }
    let len = out.len() - body + sealer.overhead();
    if len > max_len {
        out.truncate(start);
        return Err(FrameError::TooLong { len, max: max_len });
    }
    sealer.seal(out, body);
    let prefix = u32::try_from(len).expect("max_len fits the 4-byte prefix");
    out[start..body].copy_from_slice(&prefix.to_be_bytes());
    Ok(())
}

/// A frame as protocol version 3 decodes it: version 4's, deliveries without a chunk field.
/// The variants are [`Frame`]'s, in its order.
#[derive(Deserialize)]
enum FrameV3<'a> {
    Hello(Hello),
    Challenge(Challenge),
    Proof(Proof),
    Accepted,
    #[serde(borrow)]
    Deliveries(DeliveryBatchV3<'a>),
    #[serde(borrow)]
    Acks(AckBatch<'a>),
    Ping,
}

/// A [`DeliveryBatch`] at version 3: its items decoded without a chunk field, straight into
/// [`WireDelivery`]s (nothing is copied to make the version 4 batch).
#[derive(Deserialize)]
struct DeliveryBatchV3<'a> {
    consumer: &'a str,
    producer_id: &'a str,
    incarnation: Incarnation,
    #[serde(borrow, deserialize_with = "bounded_v3")]
    items: Vec<WireDelivery<'a>>,
}

/// A [`WireDelivery`] at version 3, as decoded.
#[derive(Deserialize)]
struct WireDeliveryV3<'a> {
    seq: u64,
    window_start: u64,
    trace_context: Option<TraceContext>,
    body: &'a [u8],
}

impl<'a> From<WireDeliveryV3<'a>> for WireDelivery<'a> {
    fn from(item: WireDeliveryV3<'a>) -> Self {
        WireDelivery {
            seq: item.seq,
            window_start: item.window_start,
            trace_context: item.trace_context,
            chunk: None,
            body: item.body,
        }
    }
}

impl<'a> From<FrameV3<'a>> for Frame<'a> {
    fn from(frame: FrameV3<'a>) -> Self {
        match frame {
            FrameV3::Hello(hello) => Frame::Hello(hello),
            FrameV3::Challenge(challenge) => Frame::Challenge(challenge),
            FrameV3::Proof(proof) => Frame::Proof(proof),
            FrameV3::Accepted => Frame::Accepted,
            FrameV3::Deliveries(batch) => Frame::Deliveries(DeliveryBatch {
                consumer: batch.consumer,
                producer_id: batch.producer_id,
                incarnation: batch.incarnation,
                items: batch.items,
            }),
            FrameV3::Acks(batch) => Frame::Acks(batch),
            FrameV3::Ping => Frame::Ping,
        }
    }
}

/// A frame as protocol version 3 encodes it: as version 4, deliveries without a chunk field.
struct AtVersion3<'r, 'a>(&'r Frame<'a>);

impl Serialize for AtVersion3<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Frame::Deliveries(batch) = self.0 else {
            return self.0.serialize(serializer);
        };
        serializer.serialize_newtype_variant(
            "Frame",
            DELIVERIES_KIND,
            "Deliveries",
            &DeliveryBatchAtVersion3(batch),
        )
    }
}

/// A [`DeliveryBatch`] as version 3 encodes it.
struct DeliveryBatchAtVersion3<'r, 'a>(&'r DeliveryBatch<'a>);

impl Serialize for DeliveryBatchAtVersion3<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let batch = self.0;
        let mut out = serializer.serialize_struct("DeliveryBatch", 4)?;
        out.serialize_field("consumer", batch.consumer)?;
        out.serialize_field("producer_id", batch.producer_id)?;
        out.serialize_field("incarnation", &batch.incarnation)?;
        out.serialize_field("items", &ItemsAtVersion3(&batch.items))?;
        out.end()
    }
}

/// The items of a [`DeliveryBatch`] as version 3 encodes them: a chunk among them is an error.
struct ItemsAtVersion3<'r, 'a>(&'r [WireDelivery<'a>]);

impl Serialize for ItemsAtVersion3<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.iter().any(|item| item.chunk.is_some()) {
            return Err(serde::ser::Error::custom(FrameError::ChunkInVersion(3)));
        }
        serializer.collect_seq(self.0.iter().map(|item| WireDeliveryAtVersion3 {
            seq: item.seq,
            window_start: item.window_start,
            trace_context: &item.trace_context,
            body: item.body,
        }))
    }
}

/// A [`WireDelivery`] as version 3 encodes it.
#[derive(Serialize)]
struct WireDeliveryAtVersion3<'r> {
    seq: u64,
    window_start: u64,
    trace_context: &'r Option<TraceContext>,
    #[serde(serialize_with = "as_bytes")]
    body: &'r [u8],
}

fn check_id(id: &str) -> Result<(), FrameError> {
    if id.len() > MAX_ID_BYTES {
        return Err(FrameError::IdTooLong(id.len()));
    }
    Ok(())
}

/// Bytes of `n` in the varint encoding.
pub(crate) const fn varint_len(n: u64) -> usize {
    match n {
        0..=250 => 1,
        251..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

/// Bytes of a string or byte string of `len` bytes (prefix and content).
pub(crate) const fn bytes_len(len: usize) -> usize {
    varint_len(len as u64) + len
}

/// Bytes of one [`WireDelivery`] with a body of `body` bytes.
pub(crate) const fn wire_delivery_len(
    seq: u64,
    window_start: u64,
    traced: bool,
    chunk: Option<ChunkHeader>,
    body: usize,
) -> usize {
    let trace = if traced { 1 + TRACE_CONTEXT_LEN } else { 1 };
    let chunk = match chunk {
        Some(chunk) => {
            1 + varint_len(chunk.first_seq)
                + varint_len(chunk.chunks as u64)
                + varint_len(chunk.message_len)
        }
        None => 1,
    };
    varint_len(seq) + varint_len(window_start) + trace + chunk + bytes_len(body)
}

/// The most a `Deliveries` frame of one chunk takes besides the chunk's bytes (ids at their
/// longest, a trace context, the chunk header, the tag and the length prefix, with room to
/// spare): a node's references carry chunks of up to `max_frame_length` less this.
pub const CHUNK_FRAME_OVERHEAD: usize = 1024;

/// Bytes of a [`TraceContext`] on the wire: trace id, span id, flags.
const TRACE_CONTEXT_LEN: usize = 16 + 8 + 1;

/// Bytes of a `Deliveries` frame's payload without its items, with a count prefix for up to
/// [`MAX_BATCH`] items (the prefix is then 1 or 3 bytes; this counts 3).
pub(crate) fn deliveries_overhead(consumer: &str, producer_id: &str, i: Incarnation) -> usize {
    let value = i.as_u128();
    1 + bytes_len(consumer.len())
        + bytes_len(producer_id.len())
        + varint_len((value >> 64) as u64)
        + varint_len(value as u64)
        + 3
}

fn as_bytes<S: Serializer>(bytes: &&[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_bytes(bytes)
}

/// A sequence of at most [`MAX_BATCH`] elements: the element past the limit is an error, and
/// the declared length reserves at most that much.
fn bounded<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    bounded_from::<D, T, T>(deserializer)
}

/// The items of a version 3 [`DeliveryBatch`], bounded as [`bounded`] bounds a sequence.
fn bounded_v3<'de: 'a, 'a, D>(deserializer: D) -> Result<Vec<WireDelivery<'a>>, D::Error>
where
    D: Deserializer<'de>,
{
    bounded_from::<D, WireDeliveryV3<'a>, WireDelivery<'a>>(deserializer)
}

/// A sequence of at most [`MAX_BATCH`] elements decoded as `W` and kept as `T`, as
/// [`bounded`] says.
fn bounded_from<'de, D, W, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    W: Deserialize<'de> + Into<T>,
{
    struct Bounded<W, T>(std::marker::PhantomData<(W, T)>);

    impl<'de, W: Deserialize<'de> + Into<T>, T> Visitor<'de> for Bounded<W, T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a sequence of at most {MAX_BATCH} elements")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let declared = seq.size_hint().unwrap_or(0);
            if declared > MAX_BATCH {
                return Err(serde::de::Error::invalid_length(declared, &self));
            }
            let mut items = Vec::with_capacity(declared);
            while let Some(item) = seq.next_element::<W>()? {
                if items.len() == MAX_BATCH {
                    return Err(serde::de::Error::invalid_length(MAX_BATCH + 1, &self));
                }
                items.push(item.into());
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(Bounded::<W, T>(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use tokio_util::codec::{Decoder, LengthDelimitedCodec};

    use super::*;

    fn hello() -> Hello {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            node_id: NodeId::from_bytes([1; 16]),
            nonce: [2; 32],
            authenticated: true,
            max_frame_length: 1 << 20,
        }
    }

    fn deliveries<'a>(consumer: &'a str, producer_id: &'a str, n: usize) -> Frame<'a> {
        Frame::Deliveries(DeliveryBatch {
            consumer,
            producer_id,
            incarnation: Incarnation::from_u128(u128::MAX - 5),
            items: (1..=n as u64)
                .map(|seq| WireDelivery {
                    seq,
                    window_start: 1,
                    trace_context: None,
                    chunk: (seq == 2).then_some(ChunkHeader {
                        first_seq: 2,
                        chunks: 1,
                        message_len: 4,
                    }),
                    body: b"body",
                })
                .collect(),
        })
    }

    fn every_kind() -> Vec<Frame<'static>> {
        vec![
            Frame::Hello(hello()),
            Frame::Challenge(Challenge {
                version: 7,
                node_id: NodeId::from_bytes([3; 16]),
                nonce: [4; 32],
                max_frame_length: 4096,
                proof: Some([5; 32]),
            }),
            Frame::Proof(Proof { proof: None }),
            Frame::Accepted,
            deliveries("orders", "p", 3),
            Frame::Acks(AckBatch {
                producer_id: "p",
                incarnation: Incarnation::from_u128(9),
                seqs: vec![1, 2, u64::MAX],
            }),
            Frame::Ping,
        ]
    }

    /// Encodes with `sealer` and returns the payload after the prefix (tag included).
    fn payload_of(frame: &Frame<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        frame
            .encode(&mut Sealer::new(None), &mut out, 1 << 20)
            .unwrap();
        out.split_off(LENGTH_PREFIX)
    }

    #[test]
    fn every_kind_round_trips_through_the_length_delimited_codec() {
        let mut sealer = Sealer::new(None);
        let mut out = Vec::new();
        for frame in every_kind() {
            frame.encode(&mut sealer, &mut out, 1 << 20).unwrap();
        }
        let mut codec = LengthDelimitedCodec::builder()
            .max_frame_length(1 << 20)
            .new_codec();
        let mut buf = BytesMut::from(&out[..]);
        for expected in every_kind() {
            let payload = codec.decode(&mut buf).unwrap().expect("a whole frame");
            assert_eq!(Frame::decode(&payload).unwrap(), expected);
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn the_first_bytes_of_a_hello_are_fixed() {
        let payload = payload_of(&Frame::Hello(hello()));
        assert_eq!(payload[0], 0, "Hello is kind 0");
        assert_eq!(&payload[1..9], b"actixdlv");
        assert_eq!(payload[9], 4, "version 4");
    }

    #[test]
    fn sizes_are_computed_as_bincode_encodes() {
        for n in [
            0,
            1,
            250,
            251,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            1 << 32,
            u64::MAX,
        ] {
            assert_eq!(varint_len(n), codec::encode(&n).unwrap().len(), "{n}");
        }
        let context = TraceContext::new([1; 16], [2; 8], 1);
        let chunk = ChunkHeader {
            first_seq: 70_000,
            chunks: 300,
            message_len: 1 << 33,
        };
        for (body, trace_context, chunk) in [0, 3, 250, 251, 70_000]
            .into_iter()
            .flat_map(|body| [(body, None, None), (body, context.clone(), Some(chunk))])
        {
            let bytes = vec![1u8; body];
            let traced = trace_context.is_some();
            let item = WireDelivery {
                seq: 300,
                window_start: 7,
                trace_context,
                chunk,
                body: &bytes,
            };
            assert_eq!(
                wire_delivery_len(300, 7, traced, chunk, body),
                codec::encode(&item).unwrap().len()
            );
        }
        let incarnation = Incarnation::from_u128(u128::MAX);
        let name = "n".repeat(300);
        let empty = Frame::Deliveries(DeliveryBatch {
            consumer: &name,
            producer_id: "producer",
            incarnation,
            items: Vec::new(),
        });
        // The estimate counts a 3-byte item count; an empty batch has a 1-byte one.
        assert_eq!(
            deliveries_overhead(&name, "producer", incarnation),
            codec::encode(&empty).unwrap().len() + 2
        );
    }

    #[test]
    fn ids_longer_than_the_wire_limit_are_refused_on_decode() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let exact = "x".repeat(MAX_ID_BYTES);
        for (consumer, producer) in [(long.as_str(), "p"), ("c", long.as_str())] {
            let payload = payload_of(&deliveries(consumer, producer, 1));
            assert_eq!(
                Frame::decode(&payload),
                Err(FrameError::IdTooLong(MAX_ID_BYTES + 1))
            );
        }
        assert!(Frame::decode(&payload_of(&deliveries(&exact, &exact, 1))).is_ok());
        let acks = Frame::Acks(AckBatch {
            producer_id: &long,
            incarnation: Incarnation::from_u128(1),
            seqs: vec![1],
        });
        assert_eq!(
            Frame::decode(&payload_of(&acks)),
            Err(FrameError::IdTooLong(MAX_ID_BYTES + 1))
        );
    }

    #[test]
    fn what_admission_refuses_is_passed_through_to_become_a_dead_letter() {
        let frame = Frame::Deliveries(DeliveryBatch {
            consumer: "c",
            producer_id: "",
            incarnation: Incarnation::from_u128(1),
            items: vec![
                WireDelivery {
                    seq: 0,
                    window_start: 0,
                    trace_context: None,
                    chunk: None,
                    body: b"",
                },
                WireDelivery {
                    seq: u64::MAX,
                    window_start: u64::MAX,
                    trace_context: None,
                    chunk: Some(ChunkHeader {
                        first_seq: 0,
                        chunks: 0,
                        message_len: 0,
                    }),
                    body: b"",
                },
            ],
        });
        assert_eq!(Frame::decode(&payload_of(&frame)).unwrap(), frame);
    }

    #[test]
    fn batches_are_bounded_on_decode() {
        assert!(Frame::decode(&payload_of(&deliveries("c", "p", MAX_BATCH))).is_ok());
        let over = payload_of(&deliveries("c", "p", MAX_BATCH + 1));
        assert!(matches!(
            Frame::decode(&over),
            Err(FrameError::Malformed(_))
        ));
        let acks = |n: u64| {
            payload_of(&Frame::Acks(AckBatch {
                producer_id: "p",
                incarnation: Incarnation::from_u128(1),
                seqs: (0..n).collect(),
            }))
        };
        assert!(Frame::decode(&acks(MAX_BATCH as u64)).is_ok());
        assert!(Frame::decode(&acks(MAX_BATCH as u64 + 1)).is_err());
        // A count prefix claiming 2^60 items with nothing behind it fails before reserving.
        let mut hostile = vec![5, 1, b'c', 1, b'p', 0, 0, 253];
        hostile.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(Frame::decode(&hostile).is_err());
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let mut bad_magic = payload_of(&Frame::Hello(hello()));
        bad_magic[1] = b'X';
        assert_eq!(Frame::decode(&bad_magic), Err(FrameError::BadMagic));
        let mut trailing = payload_of(&Frame::Ping);
        trailing.push(0);
        assert!(Frame::decode(&trailing).is_err());
        assert!(Frame::decode(&[7]).is_err(), "unknown kind");
        assert!(Frame::decode(&[]).is_err());
        let full = payload_of(&deliveries("c", "p", 2));
        for len in 0..full.len() {
            assert!(Frame::decode(&full[..len]).is_err(), "truncated at {len}");
        }
    }

    #[test]
    fn encoding_refuses_a_frame_over_the_limit_and_leaves_everything_as_it_was() {
        let key = [1; 32];
        let mut sealer = Sealer::new(Some(&key));
        let mut out = vec![9];
        let frame = deliveries("c", "p", 10);
        let len = payload_of(&frame).len() + sealer.overhead();
        assert_eq!(
            frame.encode(&mut sealer, &mut out, len - 1),
            Err(FrameError::TooLong { len, max: len - 1 })
        );
        assert_eq!(out, [9]);
        // The refused frame was not counted: the next one opens as frame 0.
        frame.encode(&mut sealer, &mut out, len).unwrap();
        assert_eq!(out.len(), 1 + LENGTH_PREFIX + len);
        let mut opener = crate::tcp::auth::Opener::new(Some(&key));
        let payload = opener.open(&out[1 + LENGTH_PREFIX..]).expect("frame 0");
        assert_eq!(Frame::decode(payload).unwrap(), frame);
    }

    /// Encodes at `version` without a tag and returns the payload.
    fn payload_at(frame: &Frame<'_>, version: u16) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::new();
        frame.encode_versioned(version, &mut Sealer::new(None), &mut out, 1 << 20)?;
        Ok(out.split_off(LENGTH_PREFIX))
    }

    fn one_delivery(chunk: Option<ChunkHeader>) -> Frame<'static> {
        Frame::Deliveries(DeliveryBatch {
            consumer: "c",
            producer_id: "p",
            incarnation: Incarnation::from_u128(1),
            items: vec![WireDelivery {
                seq: 1,
                window_start: 1,
                trace_context: None,
                chunk,
                body: b"b",
            }],
        })
    }

    #[test]
    fn version_3_is_version_4_without_the_chunk_field_of_a_delivery() {
        let frame = one_delivery(None);
        // Kind 4, "c", "p", the incarnation's two halves, one item: seq, window start, no
        // trace context, (version 4: no chunk), body "b".
        let v3 = [4, 1, b'c', 1, b'p', 0, 1, 1, 1, 1, 0, 1, b'b'];
        let v4 = [4, 1, b'c', 1, b'p', 0, 1, 1, 1, 1, 0, 0, 1, b'b'];
        assert_eq!(payload_at(&frame, 3).unwrap(), v3);
        assert_eq!(payload_at(&frame, 4).unwrap(), v4);
        assert_eq!(payload_of(&frame), v4, "encode is version 4");
        assert_eq!(Frame::decode_versioned(&v3, 3).unwrap(), frame);
        assert_eq!(Frame::decode_versioned(&v4, 4).unwrap(), frame);
        assert!(Frame::decode_versioned(&v4, 3).is_err(), "a byte too many");
        assert!(Frame::decode_versioned(&v3, 4).is_err(), "a byte short");
        // Every kind round-trips at version 3, traced deliveries included; the handshake's
        // frames and ACKs are the same bytes at both versions.
        let context = TraceContext::new([1; 16], [2; 8], 1);
        let traced = Frame::Deliveries(DeliveryBatch {
            consumer: "orders",
            producer_id: "p",
            incarnation: Incarnation::from_u128(u128::MAX),
            items: (1..=3)
                .map(|seq| WireDelivery {
                    seq,
                    window_start: 1,
                    trace_context: context.clone(),
                    chunk: None,
                    body: b"body",
                })
                .collect(),
        });
        for frame in every_kind().into_iter().chain([traced]) {
            let Ok(payload) = payload_at(&frame, 3) else {
                assert!(matches!(frame, Frame::Deliveries(_)), "{frame:?}");
                continue; // the sample batch holds a chunk
            };
            assert_eq!(Frame::decode_versioned(&payload, 3).unwrap(), frame);
            if !matches!(frame, Frame::Deliveries(_)) {
                assert_eq!(payload, payload_of(&frame), "{frame:?}");
            }
        }
        let hello = payload_of(&Frame::Hello(hello()));
        assert_eq!(
            payload_at(&Frame::Hello(hello_v3()), 3).unwrap()[10..],
            hello[10..]
        );
    }

    fn hello_v3() -> Hello {
        Hello {
            version: 3,
            ..hello()
        }
    }

    #[test]
    fn a_chunk_cannot_be_encoded_at_version_3() {
        let chunk = ChunkHeader {
            first_seq: 1,
            chunks: 2,
            message_len: 2,
        };
        let mut out = vec![9];
        assert_eq!(
            one_delivery(Some(chunk)).encode_versioned(
                3,
                &mut Sealer::new(None),
                &mut out,
                1 << 20
            ),
            Err(FrameError::ChunkInVersion(3))
        );
        assert_eq!(out, [9], "nothing appended");
        assert!(payload_at(&one_delivery(Some(chunk)), 4).is_ok());
    }

    #[test]
    fn versions_this_crate_does_not_speak_are_refused_by_the_versioned_codec() {
        let payload = payload_of(&Frame::Ping);
        for version in [0, 1, 2, PROTOCOL_VERSION + 1, u16::MAX] {
            assert_eq!(
                Frame::decode_versioned(&payload, version),
                Err(FrameError::UnknownVersion(version))
            );
            assert_eq!(
                payload_at(&Frame::Ping, version),
                Err(FrameError::UnknownVersion(version))
            );
        }
        for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            assert_eq!(Frame::decode_versioned(&payload, version), Ok(Frame::Ping));
        }
    }

    #[test]
    fn version_3_frames_are_bounded_and_checked_on_decode() {
        let at_3 = |frame: &Frame<'_>| payload_at(frame, 3).unwrap();
        let without_chunks = |n: usize| {
            let Frame::Deliveries(mut batch) = deliveries("c", "p", n) else {
                unreachable!()
            };
            batch.items.iter_mut().for_each(|item| item.chunk = None);
            Frame::Deliveries(batch)
        };
        assert!(Frame::decode_versioned(&at_3(&without_chunks(MAX_BATCH)), 3).is_ok());
        assert!(matches!(
            Frame::decode_versioned(&at_3(&without_chunks(MAX_BATCH + 1)), 3),
            Err(FrameError::Malformed(_))
        ));
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let mut frame = one_delivery(None);
        if let Frame::Deliveries(batch) = &mut frame {
            batch.consumer = &long;
        }
        assert_eq!(
            Frame::decode_versioned(&at_3(&frame), 3),
            Err(FrameError::IdTooLong(MAX_ID_BYTES + 1))
        );
        let full = at_3(&without_chunks(2));
        for len in 0..full.len() {
            assert!(Frame::decode_versioned(&full[..len], 3).is_err(), "{len}");
        }
        let mut trailing = full;
        trailing.push(0);
        assert!(Frame::decode_versioned(&trailing, 3).is_err());
    }

    #[test]
    fn a_newer_clients_longer_hello_is_read_up_to_what_this_release_knows() {
        let newer = Hello {
            version: 9,
            ..hello()
        };
        let mut payload = payload_of(&Frame::Hello(newer.clone()));
        let known = payload.len();
        payload.extend_from_slice(&[0xab; 20]);
        assert_eq!(
            Frame::decode_opening(&payload),
            Ok((Frame::Hello(newer), &payload[1..])),
            "its bytes: all but the kind, the appended ones included"
        );
        assert!(
            Frame::decode(&payload).is_err(),
            "only the opening is lenient"
        );
        // Of a Hello of a version this release knows, trailing bytes are malformed.
        for hello in [hello(), hello_v3()] {
            let mut payload = payload_of(&Frame::Hello(hello.clone()));
            assert_eq!(
                Frame::decode_opening(&payload),
                Ok((Frame::Hello(hello), &payload[1..]))
            );
            payload.push(0);
            assert!(matches!(
                Frame::decode_opening(&payload),
                Err(FrameError::Malformed(_))
            ));
        }
        // Another frame first is decoded as it is anywhere, trailing bytes refused.
        let mut ping = payload_of(&Frame::Ping);
        assert_eq!(Frame::decode_opening(&ping), Ok((Frame::Ping, &[][..])));
        ping.push(0);
        assert!(Frame::decode_opening(&ping).is_err());
        // The magic is checked, and a truncated Hello is no Hello.
        payload[1] = b'X';
        assert_eq!(Frame::decode_opening(&payload), Err(FrameError::BadMagic));
        for len in 0..known {
            assert!(Frame::decode_opening(&payload[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn the_bytes_of_a_hello_whose_kind_takes_more_than_one_byte_are_the_hellos_own() {
        // Bincode reads a varint written in more bytes than it needs: kind 0 as 251 and a
        // u16 0. The Hello's bytes start after the kind, however long its encoding.
        let canonical = payload_of(&Frame::Hello(hello()));
        let mut long_kind = vec![251, 0, 0];
        long_kind.extend_from_slice(&canonical[1..]);
        assert_eq!(
            Frame::decode_opening(&long_kind),
            Ok((Frame::Hello(hello()), &canonical[1..]))
        );
        // Another frame's kind written so is decoded as anywhere.
        assert_eq!(
            Frame::decode_opening(&[251, 6, 0]),
            Ok((Frame::Ping, &[][..]))
        );
    }

    #[test]
    fn an_oversize_length_prefix_is_refused_before_anything_is_reserved() {
        let mut codec = LengthDelimitedCodec::builder()
            .max_frame_length(HANDSHAKE_MAX_FRAME)
            .new_codec();
        let mut buf = BytesMut::with_capacity(16);
        buf.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(codec.decode(&mut buf).is_err());
        assert!(buf.capacity() <= 16, "nothing reserved for the claim");
        let mut buf = BytesMut::from(&(HANDSHAKE_MAX_FRAME as u32 + 1).to_be_bytes()[..]);
        assert!(codec.decode(&mut buf).is_err());
        let mut buf = BytesMut::from(&(HANDSHAKE_MAX_FRAME as u32).to_be_bytes()[..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None, "waits for the bytes");
    }
}
