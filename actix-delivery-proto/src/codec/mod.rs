//! The one place bytes are made: serde values to and from bytes, with a size limit, in one of
//! two [`Codec`]s, and what a stored value records of how it was written ([`Manifest`]).
//!
//! Everything this crate stores or sends is encoded here: journal payloads written by the
//! persistence layer, and the frames of the TCP transport ([`crate::tcp`]). One module, one
//! set of options per codec, so a change of format is a change of this module.
//!
//! # The two codecs
//!
//! - [`Codec::Bincode`]: bincode 1.3.3, compact and fastest, but **fixed schema**: the reader's
//!   type must be exactly the writer's (a field added to a type makes every value written
//!   before undecodable). The crate's own frames and records use it, versioned by the crate.
//! - [`Codec::MessagePack`]: MessagePack with named fields (`rmp-serde`): self-describing, so
//!   a field added with `#[serde(default)]` decodes from values written without it, and a
//!   field the reader does not know (written by a newer version) is ignored. The default for
//!   the application's persistent data (events, snapshots, a durable producer's messages):
//!   data that lives for years is worth the cost (about 2.4× bincode's decoding time and 1.8×
//!   its encoding time per value, a tenth of a microsecond for a typical event: see
//!   `benches/codec.rs`, and actix-delivery's guide, chapter "Changing your types").
//!
//! Breaking changes (a renamed field, a changed type, an event split or removed) need one
//! function: an upcaster, which gets the stored value as [`Written`] (its manifest, and a
//! decoder for the type it was written as) and returns today's type.
//!
//! # Bincode's format and how the limit bounds memory
//!
//! bincode 1.3.3 through [`bincode::DefaultOptions`]: little endian, variable
//! length integers and the rejection of trailing bytes, each set explicitly here rather than
//! relied upon, and a byte limit ([`MAX_ENCODED_BYTES`] unless given).
//!
//! Encoding sizes the value first and fails before allocating
//! if it is too large. Decoding reads from a slice, and bincode then checks every length
//! prefix against the bytes that remain before it allocates for it (it does not consult
//! `with_limit` for slices, so [`decode_with_limit`] checks the input's length itself): a
//! hostile prefix claiming 2^60 elements fails at once. Sequences of fixed-size elements
//! reserve at most serde's cautious 1 MiB up front. (bincode 1.3.3 is complete and no longer
//! maintained, RUSTSEC-2025-0141; it is pinned with `=`.) MessagePack decoding reads from a
//! slice too, growing its buffers with the bytes actually read, never with a claimed length; its
//! nesting depth is limited to [`MAX_DEPTH`] levels.

mod assembled;
mod manifest;
pub mod schema;
mod upcast;

pub use manifest::Manifest;
pub use upcast::{Unreadable, TYPE_CHANGED};
pub use upcast::{Upcast, UpcastError, Written};

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::PlainChain;

/// The default limit for one encoded value: 16 MiB.
///
/// Large enough for any event, snapshot or envelope this crate is meant to carry (they are
/// messages, not files), small enough that a corrupt or hostile length prefix cannot make a
/// decoder reserve more than a few pages of a 16 MiB budget per value.
pub const MAX_ENCODED_BYTES: u64 = 16 * 1024 * 1024;

/// How deeply a MessagePack value may nest: arrays and maps within each other fewer than 128 levels
/// deep decode, deeper input is malformed; without a bound a hostile value would overflow the stack
/// (each level is a recursive call of the decoder).
pub const MAX_DEPTH: usize = 128;

/// Why a value could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The encoding is, or claims to be, longer than the limit.
    #[error("the encoded value exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit in force, in bytes.
        limit: u64,
    },
    /// The bytes are not a valid encoding of the requested type (truncated, trailing bytes,
    /// an invalid tag, invalid UTF-8, …).
    #[error("malformed encoding: {reason}")]
    Malformed {
        /// What the decoder found wrong.
        reason: String,
    },
    /// The value cannot be represented (its `Serialize` implementation failed, or it is a
    /// sequence of unknown length).
    #[error("the value cannot be encoded: {reason}")]
    Unencodable {
        /// What the encoder reported.
        reason: String,
    },
}

/// Encodes `value` into a new buffer, at most [`MAX_ENCODED_BYTES`] long.
///
/// # Errors
/// [`CodecError::TooLarge`] if the encoding would exceed the limit (nothing is allocated for
/// it), [`CodecError::Unencodable`] if the value's `Serialize` implementation fails.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    encode_with_limit(value, MAX_ENCODED_BYTES)
}

/// Encodes `value` into a new buffer, at most `limit` bytes long.
///
/// # Errors
/// As [`encode`], with `limit` in place of [`MAX_ENCODED_BYTES`].
pub fn encode_with_limit<T: Serialize + ?Sized>(
    value: &T,
    limit: u64,
) -> Result<Vec<u8>, CodecError> {
    // With a limit, bincode first sizes the value (no allocation), then allocates exactly.
    options(limit)
        .serialize(value)
        .map_err(|err| encode_error(*err, limit))
}

/// A buffer that refuses to grow beyond `end` bytes (and then records that it did).
struct Capped<'a> {
    bytes: &'a mut Vec<u8>,
    end: usize,
    over: bool,
}

impl std::io::Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = self.bytes.len();
        if buf.len() > self.end - len {
            self.over = true;
            return Err(std::io::Error::other("the encoding limit is reached"));
        }
        if len + buf.len() > self.bytes.capacity() {
            // Doubling, as a `Vec` would, but never reserving beyond the limit.
            let target = (len + buf.len())
                .max(self.bytes.capacity().saturating_mul(2))
                .min(self.end);
            self.bytes.reserve_exact(target - len);
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Appends the encoding of `value` to `out`, at most [`MAX_ENCODED_BYTES`] for this value.
///
/// On error `out` is left as it was.
///
/// # Errors
/// As [`encode`].
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let start = out.len();
    let result = options(MAX_ENCODED_BYTES)
        .serialize_into(&mut *out, value)
        .map_err(|err| encode_error(*err, MAX_ENCODED_BYTES));
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Decodes a `T` from exactly `bytes` (at most [`MAX_ENCODED_BYTES`]).
///
/// # Errors
/// [`CodecError::TooLarge`] if `bytes`, or a length prefix inside them, exceeds the limit;
/// [`CodecError::Malformed`] if the bytes are not exactly one encoding of a `T` (truncated,
/// followed by trailing bytes, invalid tags or UTF-8). Never panics, whatever the bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_with_limit(bytes, MAX_ENCODED_BYTES)
}

/// Decodes a `T` from exactly `bytes`, reading at most `limit` bytes.
///
/// # Errors
/// As [`decode`], with `limit` in place of [`MAX_ENCODED_BYTES`].
pub fn decode_with_limit<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, CodecError> {
    decode_borrowed(bytes, limit)
}

/// Decodes a `T` that may borrow from `bytes` (`&str`, `&[u8]` fields: no allocation for
/// them), reading exactly `bytes`, at most `limit` bytes.
///
/// # Errors
/// As [`decode`], with `limit` in place of [`MAX_ENCODED_BYTES`].
pub fn decode_borrowed<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    limit: u64,
) -> Result<T, CodecError> {
    if bytes.len() as u64 > limit {
        return Err(CodecError::TooLarge { limit });
    }
    options(limit)
        .deserialize(bytes)
        .map_err(|err| decode_error(*err, limit))
}

/// How a value is encoded: the crate's two codecs (see the [module documentation](self)).
///
/// In configuration files: `"bincode"` or `"msgpack"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Codec {
    /// bincode 1.3.3: compact and fastest; fixed schema (the reader's type must be exactly
    /// the writer's).
    #[serde(rename = "bincode")]
    Bincode,
    /// MessagePack with named fields: self-describing; added `#[serde(default)]` fields
    /// decode from older values, unknown fields are ignored.
    #[serde(rename = "msgpack")]
    MessagePack,
}

impl Codec {
    /// Its id, as journals and frames record it: 1 for bincode, 2 for MessagePack.
    pub const fn id(self) -> u8 {
        match self {
            Self::Bincode => 1,
            Self::MessagePack => 2,
        }
    }

    /// The codec with id `id`, if this version of the crate knows it.
    pub const fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Bincode),
            2 => Some(Self::MessagePack),
            _ => None,
        }
    }

    /// Its name, as configuration files spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Bincode => "bincode",
            Self::MessagePack => "msgpack",
        }
    }

    /// Encodes `value` into a new buffer, at most `limit` bytes long.
    ///
    /// # Errors
    /// [`CodecError::TooLarge`] if the encoding would exceed `limit`,
    /// [`CodecError::Unencodable`] if the value's `Serialize` implementation fails (or, for
    /// MessagePack, it is a sequence of unknown length).
    pub fn encode<T: Serialize + ?Sized>(
        self,
        value: &T,
        limit: u64,
    ) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        self.encode_into(value, &mut out, limit)?;
        Ok(out)
    }

    /// Appends the encoding of `value` to `out` in one pass, at most `limit` bytes for this
    /// value. On error `out` is left as it was (and memory it took for a value over the limit
    /// is given back).
    ///
    /// One pass, straight into `out`: [`encode_with_limit`] serializes a bincode value twice
    /// (it sizes it first, then writes it into a buffer of exactly that size); this serializes
    /// it once, which suits large values whose serialization is costly, such as a snapshot of a
    /// whole state, and small ones, whose sizing pass would cost as much as writing them. The
    /// price: a value over the limit fails only once it was written.
    ///
    /// # Errors
    /// As [`Codec::encode`].
    pub fn encode_into<T: Serialize + ?Sized>(
        self,
        value: &T,
        out: &mut Vec<u8>,
        limit: u64,
    ) -> Result<(), CodecError> {
        let start = out.len();
        let result = self.write(value, &mut *out, limit).and_then(|()| {
            if (out.len() - start) as u64 > limit {
                Err(CodecError::TooLarge { limit })
            } else {
                Ok(())
            }
        });
        if result.is_err() {
            out.truncate(start);
            out.shrink_to(start.max(4096));
        }
        result
    }

    /// As [`encode_into`](Self::encode_into), and `out` never grows beyond `limit` bytes
    /// for this value: a value over the limit fails as soon as the limit is reached. For
    /// values that may be large (snapshots of a whole state), where memory matters more than
    /// the cost of checking each write.
    pub(crate) fn encode_bounded_into<T: Serialize + ?Sized>(
        self,
        value: &T,
        out: &mut Vec<u8>,
        limit: u64,
    ) -> Result<(), CodecError> {
        let start = out.len();
        let mut capped = Capped {
            end: start.saturating_add(usize::try_from(limit).unwrap_or(usize::MAX)),
            bytes: out,
            over: false,
        };
        let result = self.write(value, &mut capped, limit);
        let over = capped.over;
        if result.is_err() {
            out.truncate(start);
        }
        match result {
            Err(_) if over => Err(CodecError::TooLarge { limit }),
            other => other,
        }
    }

    /// Writes the encoding of `value` to `out` in one pass.
    pub(crate) fn write<T: Serialize + ?Sized>(
        self,
        value: &T,
        mut out: impl std::io::Write,
        limit: u64,
    ) -> Result<(), CodecError> {
        match self {
            Self::Bincode => unlimited()
                .serialize_into(&mut out, value)
                .map_err(|err| encode_error(*err, limit)),
            Self::MessagePack => rmp_serde::encode::write_named(&mut out, value).map_err(|err| {
                CodecError::Unencodable {
                    reason: PlainChain(&err).to_string(),
                }
            }),
        }
    }

    /// Decodes a `T` from exactly `bytes`, at most `limit` bytes.
    ///
    /// # Errors
    /// [`CodecError::TooLarge`] if `bytes`, or a length inside them, exceeds `limit`;
    /// [`CodecError::Malformed`] if the bytes are not exactly one encoding of a `T`
    /// (truncated, followed by trailing bytes, of another type). Never panics, whatever the
    /// bytes.
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8], limit: u64) -> Result<T, CodecError> {
        match self {
            Self::Bincode => decode_with_limit(bytes, limit),
            Self::MessagePack => {
                if bytes.len() as u64 > limit {
                    return Err(CodecError::TooLarge { limit });
                }
                let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
                de.set_max_depth(MAX_DEPTH);
                let value = T::deserialize(&mut de).map_err(|err| CodecError::Malformed {
                    reason: PlainChain(&err).to_string(),
                })?;
                // The borrowing reader does not tell where it stopped: the input is exactly
                // one value if nothing more can be read after it.
                match serde::de::IgnoredAny::deserialize(&mut de) {
                    Err(rmp_serde::decode::Error::InvalidMarkerRead(err))
                        if err.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        Ok(value)
                    }
                    _ => Err(CodecError::Malformed {
                        reason: "trailing bytes after the value".into(),
                    }),
                }
            }
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes a `T` in bincode from the front of `bytes` and returns it with the bytes after it
/// (for layouts in which other values follow), reading at most `limit` bytes.
pub fn decode_prefix<T: DeserializeOwned>(
    bytes: &[u8],
    limit: u64,
) -> Result<(T, &[u8]), CodecError> {
    let mut rest = bytes;
    let value = decode_prefix_from(&mut rest, limit)?;
    Ok((value, rest))
}

/// As [`decode_prefix`], from the front of `reader`, which it leaves after the value.
pub fn decode_prefix_from<T: DeserializeOwned>(
    reader: &mut impl std::io::Read,
    limit: u64,
) -> Result<T, CodecError> {
    bincode::DefaultOptions::new()
        .with_little_endian()
        .with_varint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit)
        .deserialize_from(reader)
        .map_err(|err| decode_error(*err, limit))
}

/// The crate's bincode options. Every setting is spelled out, so none depends on what a
/// default happens to be.
fn options(limit: u64) -> impl Options {
    unlimited().with_limit(limit)
}

/// [`options`] without a byte limit (the caller bounds the output itself).
fn unlimited() -> impl Options {
    bincode::DefaultOptions::new()
        .with_little_endian()
        .with_varint_encoding()
        .reject_trailing_bytes()
        .with_no_limit()
}

fn decode_error(err: bincode::ErrorKind, limit: u64) -> CodecError {
    match err {
        bincode::ErrorKind::SizeLimit => CodecError::TooLarge { limit },
        bincode::ErrorKind::Io(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
            CodecError::Malformed {
                reason: "unexpected end of input".into(),
            }
        }
        other => CodecError::Malformed {
            reason: PlainChain(&other).to_string(),
        },
    }
}

fn encode_error(err: bincode::ErrorKind, limit: u64) -> CodecError {
    match err {
        bincode::ErrorKind::SizeLimit => CodecError::TooLarge { limit },
        other => CodecError::Unencodable {
            reason: PlainChain(&other).to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Shape {
        Point,
        Circle { radius: u32 },
        Named(String, Vec<u8>),
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        shapes: Vec<Shape>,
        tags: BTreeMap<String, i64>,
        maybe: Option<bool>,
    }

    fn sample() -> Sample {
        Sample {
            id: u64::MAX,
            name: "grüße".to_string(),
            shapes: vec![
                Shape::Point,
                Shape::Circle { radius: 7 },
                Shape::Named("n".into(), vec![0, 255]),
            ],
            tags: BTreeMap::from([("a".to_string(), -1), ("b".to_string(), i64::MIN)]),
            maybe: Some(false),
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&sample()).unwrap();
        assert_eq!(decode::<Sample>(&bytes).unwrap(), sample());
    }

    #[test]
    fn the_format_is_varint_little_endian() {
        // Pins the format: a change of options would silently change every stored byte.
        assert_eq!(encode(&1u64).unwrap(), [1]);
        assert_eq!(encode(&300u64).unwrap(), [251, 0x2c, 0x01]);
        assert_eq!(encode("ab").unwrap(), [2, b'a', b'b']);
        assert_eq!(encode(&Shape::Circle { radius: 2 }).unwrap(), [1, 2]);
    }

    #[test]
    fn encode_into_appends() {
        let mut out = vec![9];
        encode_into(&5u32, &mut out).unwrap();
        encode_into("x", &mut out).unwrap();
        assert_eq!(out, [9, 5, 1, b'x']);
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&sample()).unwrap();
        bytes.push(0);
        let err = decode::<Sample>(&bytes).unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed { reason } if reason.contains("bytes remaining")),
            "{err:?}"
        );
        // The plain `bincode::deserialize` function would have accepted them: the options
        // matter.
        assert_eq!(bincode::deserialize::<u8>(&[7, 0]).unwrap(), 7);
        assert!(decode::<u8>(&[7, 0]).is_err());
    }

    #[test]
    fn truncated_input_is_malformed() {
        let bytes = encode(&sample()).unwrap();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    decode::<Sample>(&bytes[..len]),
                    Err(CodecError::Malformed { .. })
                ),
                "prefix of {len} bytes"
            );
        }
    }

    /// A varint length prefix claiming 2^60 elements, followed by nothing.
    fn hostile_prefix() -> Vec<u8> {
        let mut bytes = vec![253]; // varint tag: a u64 follows
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes
    }

    #[test]
    fn hostile_length_prefix_is_refused_without_allocating() {
        // Reserving 2^60 elements would abort the test process (capacity overflow or out of
        // memory), so an error at all proves nothing was reserved for the claim: each kind of
        // length prefix is checked against the 8 bytes that remain.
        let bytes = hostile_prefix();
        let truncated = CodecError::Malformed {
            reason: "unexpected end of input".into(),
        };
        assert_eq!(decode::<Vec<u8>>(&bytes).unwrap_err(), truncated);
        assert_eq!(decode::<Vec<u64>>(&bytes).unwrap_err(), truncated);
        assert_eq!(decode::<String>(&bytes).unwrap_err(), truncated);
        assert_eq!(decode::<BTreeMap<u64, u64>>(&bytes).unwrap_err(), truncated);
        assert_eq!(
            decode::<serde_bytes_like::Bytes>(&bytes).unwrap_err(),
            truncated
        );
    }

    #[test]
    fn bincode_ignores_the_limit_for_slices() {
        // Why `decode_with_limit` checks the input's length itself.
        let bytes = encode("abc").unwrap();
        let unchecked: String = bincode::DefaultOptions::new()
            .with_limit(1)
            .deserialize(&bytes)
            .unwrap();
        assert_eq!(unchecked, "abc");
        assert_eq!(
            decode_with_limit::<String>(&bytes, 1).unwrap_err(),
            CodecError::TooLarge { limit: 1 }
        );
    }

    /// A byte buffer deserialized through `deserialize_byte_buf` (as `serde_bytes` does),
    /// without a dependency for it.
    mod serde_bytes_like {
        use serde::de::{Deserializer, Error, Visitor};
        use serde::Deserialize;

        #[derive(Debug)]
        pub struct Bytes;

        impl<'de> Deserialize<'de> for Bytes {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = Bytes;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("bytes")
                    }
                    fn visit_byte_buf<E: Error>(self, _: Vec<u8>) -> Result<Bytes, E> {
                        Ok(Bytes)
                    }
                }
                d.deserialize_byte_buf(V)
            }
        }
    }

    #[test]
    fn limit_is_enforced_on_encode() {
        let value = vec![7u8; 100]; // 1 length byte + 100
        assert_eq!(encode_with_limit(&value, 101).unwrap().len(), 101);
        assert_eq!(
            encode_with_limit(&value, 100).unwrap_err(),
            CodecError::TooLarge { limit: 100 }
        );
        let big = vec![0u8; MAX_ENCODED_BYTES as usize];
        assert_eq!(
            encode(&big).unwrap_err(),
            CodecError::TooLarge {
                limit: MAX_ENCODED_BYTES
            }
        );
        let mut out = vec![1, 2];
        assert!(encode_into(&big, &mut out).is_err());
        assert_eq!(
            out,
            [1, 2],
            "a failed encode_into leaves the buffer as it was"
        );
    }

    #[test]
    fn one_pass_encoding_is_the_same_encoding_serialized_once_and_bounded() {
        use std::cell::Cell;
        struct Counted<'a>(&'a Cell<u32>, Sample);
        impl Serialize for Counted<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.0.set(self.0.get() + 1);
                self.1.serialize(serializer)
            }
        }
        let calls = Cell::new(0);
        let bytes = Codec::Bincode
            .encode(&Counted(&calls, sample()), 1 << 20)
            .unwrap();
        assert_eq!(bytes, encode(&sample()).unwrap());
        assert_eq!(calls.get(), 1, "serialized once");
        encode(&Counted(&calls, sample())).unwrap();
        assert_eq!(calls.get(), 3, "the sizing encoder serializes twice");
        let value = vec![7u8; 100]; // 1 length byte + 100
        assert_eq!(Codec::Bincode.encode(&value, 101).unwrap().len(), 101);
        assert_eq!(
            Codec::Bincode.encode(&value, 100).unwrap_err(),
            CodecError::TooLarge { limit: 100 }
        );
        // Beyond any 16 MiB default, when asked to.
        let big = vec![0u8; MAX_ENCODED_BYTES as usize];
        let bytes = Codec::Bincode.encode(&big, 2 * MAX_ENCODED_BYTES).unwrap();
        assert_eq!(
            bytes,
            encode_with_limit(&big, 2 * MAX_ENCODED_BYTES).unwrap()
        );
    }

    #[test]
    fn limit_is_enforced_on_decode() {
        let bytes = encode(&vec![7u8; 100]).unwrap();
        assert_eq!(
            decode_with_limit::<Vec<u8>>(&bytes, 101).unwrap(),
            vec![7u8; 100]
        );
        assert_eq!(
            decode_with_limit::<Vec<u8>>(&bytes, 100).unwrap_err(),
            CodecError::TooLarge { limit: 100 }
        );
    }

    #[test]
    fn a_failing_serialize_is_unencodable() {
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        assert_eq!(
            encode(&Fails).unwrap_err(),
            CodecError::Unencodable {
                reason: "no".into()
            }
        );
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct OrderV1 {
        id: u64,
        total: u64,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct OrderV2 {
        id: u64,
        total: u64,
        #[serde(default)]
        currency: Option<String>,
    }

    #[test]
    fn both_codecs_round_trip_and_keep_their_ids() {
        for codec in [Codec::Bincode, Codec::MessagePack] {
            let bytes = codec.encode(&sample(), MAX_ENCODED_BYTES).unwrap();
            assert_eq!(
                codec.decode::<Sample>(&bytes, MAX_ENCODED_BYTES).unwrap(),
                sample()
            );
            assert_eq!(Codec::from_id(codec.id()), Some(codec));
        }
        assert_eq!(
            Codec::Bincode.encode(&sample(), MAX_ENCODED_BYTES).unwrap(),
            encode(&sample()).unwrap(),
            "Codec::Bincode is the crate's bincode"
        );
        assert_eq!((Codec::Bincode.id(), Codec::MessagePack.id()), (1, 2));
        assert_eq!(Codec::from_id(0), None);
        assert_eq!(Codec::from_id(3), None);
    }

    #[test]
    fn message_pack_decodes_an_added_defaulted_field_and_ignores_an_unknown_one() {
        let old = Codec::MessagePack
            .encode(&OrderV1 { id: 1, total: 5 }, MAX_ENCODED_BYTES)
            .unwrap();
        assert_eq!(
            Codec::MessagePack
                .decode::<OrderV2>(&old, MAX_ENCODED_BYTES)
                .unwrap(),
            OrderV2 {
                id: 1,
                total: 5,
                currency: None
            }
        );
        let new = Codec::MessagePack
            .encode(
                &OrderV2 {
                    id: 2,
                    total: 7,
                    currency: Some("EUR".into()),
                },
                MAX_ENCODED_BYTES,
            )
            .unwrap();
        assert_eq!(
            Codec::MessagePack
                .decode::<OrderV1>(&new, MAX_ENCODED_BYTES)
                .unwrap(),
            OrderV1 { id: 2, total: 7 }
        );
        // What bincode cannot do: the reason for the second codec.
        let old = Codec::Bincode
            .encode(&OrderV1 { id: 1, total: 5 }, MAX_ENCODED_BYTES)
            .unwrap();
        assert!(Codec::Bincode
            .decode::<OrderV2>(&old, MAX_ENCODED_BYTES)
            .is_err());
    }

    #[test]
    fn message_pack_refuses_trailing_bytes_truncation_and_the_limit() {
        let mut bytes = Codec::MessagePack
            .encode(&sample(), MAX_ENCODED_BYTES)
            .unwrap();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Codec::MessagePack.decode::<Sample>(&bytes[..len], MAX_ENCODED_BYTES),
                    Err(CodecError::Malformed { .. })
                ),
                "prefix of {len} bytes"
            );
        }
        let len = bytes.len() as u64;
        assert_eq!(
            Codec::MessagePack
                .decode::<Sample>(&bytes, len - 1)
                .unwrap_err(),
            CodecError::TooLarge { limit: len - 1 }
        );
        assert_eq!(
            Codec::MessagePack.encode(&sample(), len - 1).unwrap_err(),
            CodecError::TooLarge { limit: len - 1 }
        );
        bytes.push(0xc0);
        let err = Codec::MessagePack
            .decode::<Sample>(&bytes, MAX_ENCODED_BYTES)
            .unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed { reason } if reason.contains("trailing bytes")),
            "{err:?}"
        );
    }

    #[test]
    fn message_pack_refuses_hostile_lengths_without_allocating() {
        // array32, bin32, str32 and map32 headers claiming 2^32 - 1 items, then nothing.
        for marker in [0xdd, 0xc6, 0xdb, 0xdf] {
            let bytes = [marker, 0xff, 0xff, 0xff, 0xff];
            assert!(Codec::MessagePack
                .decode::<Vec<u64>>(&bytes, MAX_ENCODED_BYTES)
                .is_err());
            assert!(Codec::MessagePack
                .decode::<String>(&bytes, MAX_ENCODED_BYTES)
                .is_err());
            assert!(Codec::MessagePack
                .decode::<BTreeMap<u64, u64>>(&bytes, MAX_ENCODED_BYTES)
                .is_err());
        }
        // Nesting beyond the depth limit is refused, not a stack overflow; within it, decoded.
        let deep = [0x91u8; 100_000];
        let mut nested = vec![0x91u8; MAX_DEPTH - 2];
        nested.push(0x90);
        assert!(Codec::MessagePack
            .decode::<serde::de::IgnoredAny>(&nested, MAX_ENCODED_BYTES)
            .is_ok());
        assert!(Codec::MessagePack
            .decode::<serde::de::IgnoredAny>(&deep, MAX_ENCODED_BYTES)
            .is_err());
    }

    #[test]
    fn encode_into_appends_and_leaves_the_buffer_on_error() {
        for codec in [Codec::Bincode, Codec::MessagePack] {
            let mut out = vec![9];
            codec.encode_into(&5u32, &mut out, 10).unwrap();
            assert_eq!(out, [9, 5], "{codec}");
            assert!(codec.encode_into(&vec![1u8; 20], &mut out, 10).is_err());
            assert_eq!(out, [9, 5], "{codec}: left as it was");
        }
    }

    #[test]
    fn a_prefix_decodes_and_leaves_what_follows() {
        let mut bytes = encode(&(7u32, "x".to_string())).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        let (value, rest) = decode_prefix::<(u32, String)>(&bytes, MAX_ENCODED_BYTES).unwrap();
        assert_eq!((value, rest), ((7, "x".to_string()), &[1u8, 2, 3][..]));
        assert!(decode_prefix::<(u32, String)>(&bytes[..2], MAX_ENCODED_BYTES).is_err());
    }

    #[test]
    fn codecs_are_named_in_configuration_as_in_messages() {
        for codec in [Codec::Bincode, Codec::MessagePack] {
            let text = serde_json::to_string(&codec).unwrap();
            assert_eq!(text, format!("\"{}\"", codec.name()));
            assert_eq!(serde_json::from_str::<Codec>(&text).unwrap(), codec);
        }
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Sample>(&bytes);
            let _ = decode::<Vec<String>>(&bytes);
            let _ = decode::<(u64, Option<Vec<u32>>, char)>(&bytes);
            let _ = decode_with_limit::<BTreeMap<u16, Vec<u8>>>(&bytes, 64);
            let _ = Codec::MessagePack.decode::<Sample>(&bytes, MAX_ENCODED_BYTES);
            let _ = Codec::MessagePack.decode::<BTreeMap<String, Vec<u8>>>(&bytes, 64);
            let _ = decode_prefix::<Sample>(&bytes, MAX_ENCODED_BYTES);
        }

        #[test]
        fn encode_decode_round_trips(id in any::<u64>(), name in ".*", data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let value = (id, name, data);
            let bytes = encode(&value).unwrap();
            prop_assert_eq!(decode::<(u64, String, Vec<u8>)>(&bytes).unwrap(), value);
        }
    }
}
