//! The one place bytes are made: serde values to and from bincode, with a size limit.
//!
//! Everything this crate stores or sends is encoded here: journal payloads written by the
//! persistence layer, and the frames of the TCP transport ([`crate::remote`]). One module, one set of options, so a
//! change of format is a change of this file.
//!
//! The format is bincode 1.3.3 through [`bincode::DefaultOptions`]: little endian, variable
//! length integers and the rejection of trailing bytes, each set explicitly here rather than
//! relied upon, and a byte limit ([`MAX_ENCODED_BYTES`] unless given).
//!
//! How the limit bounds memory: encoding sizes the value first and fails before allocating
//! if it is too large. Decoding reads from a slice, and bincode then checks every length
//! prefix against the bytes that remain before it allocates for it (it does not consult
//! `with_limit` for slices, so [`decode_with_limit`] checks the input's length itself): a
//! hostile prefix claiming 2^60 elements fails at once. Sequences of fixed-size elements
//! reserve at most serde's cautious 1 MiB up front. (bincode 1.3.3 is complete and no longer
//! maintained, RUSTSEC-2025-0141; it is pinned with `=`.)

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The default limit for one encoded value: 16 MiB.
///
/// Large enough for any event, snapshot or envelope this crate is meant to carry (they are
/// messages, not files), small enough that a corrupt or hostile length prefix cannot make a
/// decoder reserve more than a few pages of a 16 MiB budget per value.
pub const MAX_ENCODED_BYTES: u64 = 16 * 1024 * 1024;

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

/// Encodes `value` in one pass into a new buffer, at most `limit` bytes long.
///
/// [`encode_with_limit`] serializes a value twice (it sizes it first, then writes it into a
/// buffer of exactly that size); this serializes it once, into a buffer that grows as it is
/// written (never beyond `limit`). For large values whose serialization is costly, such as
/// a snapshot of a whole state. The price: a value over the limit fails only once `limit`
/// bytes of it were written.
///
/// # Errors
/// [`CodecError::TooLarge`] if the encoding would exceed `limit`, [`CodecError::Unencodable`]
/// if the value's `Serialize` implementation fails.
pub fn encode_in_one_pass<T: Serialize + ?Sized>(
    value: &T,
    limit: u64,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Capped {
        bytes: Vec::new(),
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
        over: false,
    };
    // Without a limit in the options, bincode does not size the value first; `Capped` is the
    // limit.
    match unlimited().serialize_into(&mut out, value) {
        Ok(()) => Ok(out.bytes),
        Err(_) if out.over => Err(CodecError::TooLarge { limit }),
        Err(err) => Err(encode_error(*err, limit)),
    }
}

/// A buffer that refuses to grow beyond `limit` bytes (and then records that it did).
struct Capped {
    bytes: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = self.bytes.len();
        if buf.len() > self.limit - len {
            self.over = true;
            return Err(std::io::Error::other("the encoding limit is reached"));
        }
        if len + buf.len() > self.bytes.capacity() {
            // Doubling, as a `Vec` would, but never reserving beyond the limit.
            let target = (len + buf.len())
                .max(self.bytes.capacity().saturating_mul(2))
                .min(self.limit);
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
    options(limit).deserialize(bytes).map_err(|err| match *err {
        bincode::ErrorKind::SizeLimit => CodecError::TooLarge { limit },
        bincode::ErrorKind::Io(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
            CodecError::Malformed {
                reason: "unexpected end of input".into(),
            }
        }
        other => CodecError::Malformed {
            reason: other.to_string(),
        },
    })
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

fn encode_error(err: bincode::ErrorKind, limit: u64) -> CodecError {
    match err {
        bincode::ErrorKind::SizeLimit => CodecError::TooLarge { limit },
        other => CodecError::Unencodable {
            reason: other.to_string(),
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
        let bytes = encode_in_one_pass(&Counted(&calls, sample()), 1 << 20).unwrap();
        assert_eq!(bytes, encode(&sample()).unwrap());
        assert_eq!(calls.get(), 1, "serialized once");
        encode(&Counted(&calls, sample())).unwrap();
        assert_eq!(calls.get(), 3, "the sizing encoder serializes twice");
        let value = vec![7u8; 100]; // 1 length byte + 100
        assert_eq!(encode_in_one_pass(&value, 101).unwrap().len(), 101);
        assert_eq!(
            encode_in_one_pass(&value, 100).unwrap_err(),
            CodecError::TooLarge { limit: 100 }
        );
        // Beyond any 16 MiB default, when asked to.
        let big = vec![0u8; MAX_ENCODED_BYTES as usize];
        let bytes = encode_in_one_pass(&big, 2 * MAX_ENCODED_BYTES).unwrap();
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

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Sample>(&bytes);
            let _ = decode::<Vec<String>>(&bytes);
            let _ = decode::<(u64, Option<Vec<u32>>, char)>(&bytes);
            let _ = decode_with_limit::<BTreeMap<u16, Vec<u8>>>(&bytes, 64);
        }

        #[test]
        fn encode_decode_round_trips(id in any::<u64>(), name in ".*", data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let value = (id, name, data);
            let bytes = encode(&value).unwrap();
            prop_assert_eq!(decode::<(u64, String, Vec<u8>)>(&bytes).unwrap(), value);
        }
    }
}
