//! The frames nodes exchange, their encoding, and the limits checked when decoding them. Pure:
//! no I/O, no runtime; shared by every transport of this crate.
//!
//! On the wire a frame is a 4-byte big-endian length `n` (what `tokio-util`'s
//! `LengthDelimitedCodec` reads by default) and `n` bytes: the [`Frame`] in the crate's bincode
//! format ([`crate::codec`]: varint integers, little endian, no trailing bytes), followed, after
//! an authenticated handshake, by a 16-byte tag ([`Sealer`]). The first byte of the payload is
//! the frame kind (the enum's variant index); a `Hello` starts with the magic bytes `actixdlv`
//! and the protocol version, so any future version can recognise and refuse this one.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::codec::{self, CodecError};
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::{Incarnation, MAX_ID_BYTES};
use crate::protocol::trace_context::TraceContext;
use crate::tcp::auth::{NodeId, Nonce, Sealer};

/// The protocol version this crate speaks: 4 since a delivery may be one chunk of a large
/// message (one byte when it is not); 3 since each delivery may carry a trace context (one
/// byte when it does not); 2 since bodies start with their codec and schema version
/// (`schema`); version 1 bodies were bare bincode. Peers of another version
/// are refused at the handshake (and NATS messages of another version are refused, counted):
/// a deployment upgrades its nodes together.
pub const PROTOCOL_VERSION: u16 = 4;

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

/// The client's opening frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 8],
    /// The client's [`PROTOCOL_VERSION`].
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
    /// The server's [`PROTOCOL_VERSION`].
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
    /// (one byte when absent; version 4 on). Checked by the consumer's admission.
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
}

impl<'a> Frame<'a> {
    /// Decodes one payload (tag already checked and removed) and checks its limits. Fields that
    /// admission checks (seq ranges, empty ids) are passed through, to become dead letters.
    ///
    /// # Errors
    /// [`FrameError`]; never panics, whatever the bytes.
    pub fn decode(payload: &'a [u8]) -> Result<Self, FrameError> {
        let frame: Frame<'a> = codec::decode_borrowed(payload, payload.len() as u64)?;
        match &frame {
            Frame::Hello(hello) if hello.magic != MAGIC => return Err(FrameError::BadMagic),
            Frame::Deliveries(batch) => {
                check_id(batch.consumer)?;
                check_id(batch.producer_id)?;
            }
            Frame::Acks(batch) => check_id(batch.producer_id)?,
            _ => {}
        }
        Ok(frame)
    }

    /// Appends the frame to `out`: length prefix, payload, tag. Nothing is appended (and the
    /// sealer does not count it) if the frame would be longer than `max_len`.
    ///
    /// # Errors
    /// [`FrameError::TooLong`], or [`FrameError::Malformed`] if a body cannot be encoded.
    pub fn encode(
        &self,
        sealer: &mut Sealer,
        out: &mut Vec<u8>,
        max_len: usize,
    ) -> Result<(), FrameError> {
        let start = out.len();
        out.extend_from_slice(&[0; LENGTH_PREFIX]);
        let body = start + LENGTH_PREFIX;
        if let Err(err) = codec::encode_into(self, out) {
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
    struct Bounded<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
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
            while let Some(item) = seq.next_element()? {
                if items.len() == MAX_BATCH {
                    return Err(serde::de::Error::invalid_length(MAX_BATCH + 1, &self));
                }
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(Bounded(std::marker::PhantomData))
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
