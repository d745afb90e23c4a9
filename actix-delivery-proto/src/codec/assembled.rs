//! Decoding a value straight from the chunks of a reassembled message ([`Assembled`]), so
//! that a large message is never copied into one buffer before it is decoded.
//!
//! Bincode reads through [`ChunkReader`], its own reader over the chunks: a byte buffer the
//! value owns (a `Vec<u8>`, `Bytes`, `String`) is made with the capacity its length prefix
//! claims and filled from the chunks, each chunk released once read; bincode checks every
//! length prefix against the bytes left (its limit is the message's length) before the reader
//! allocates, and the reader checks again, so a hostile prefix fails before any allocation.
//! MessagePack is read from the message in one buffer (a copy of the chunks), as its reader
//! would otherwise reserve what a length claims before finding the bytes missing.

use std::io::{self, Read};

use bincode::Options;
use serde::de::{DeserializeOwned, Visitor};

use super::{decode_error, unlimited, Codec, CodecError};
use crate::protocol::chunk::Assembled;

impl Codec {
    /// Decodes a `T` from exactly the bytes of a reassembled chunked message (see the module
    /// docs for how memory is bounded).
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub(crate) fn decode_assembled<T: DeserializeOwned>(
        self,
        mut message: Assembled,
    ) -> Result<T, CodecError> {
        let limit = message.len();
        match self {
            Self::Bincode => {
                let reader = ChunkReader {
                    message: &mut message,
                    scratch: Vec::new(),
                };
                let value = unlimited()
                    .with_limit(limit)
                    .deserialize_from_custom(reader)
                    .map_err(|err| match *err {
                        // The limit is the message's length: the value needs more bytes.
                        bincode::ErrorKind::SizeLimit => CodecError::Malformed {
                            reason: "unexpected end of input".into(),
                        },
                        err => decode_error(err, limit),
                    })?;
                if !message.is_empty() {
                    return Err(CodecError::Malformed {
                        reason: "trailing bytes after the value".into(),
                    });
                }
                Ok(value)
            }
            Self::MessagePack => self.decode(&message.into_bytes(), limit),
        }
    }
}

/// Bincode's reader over a message's chunks.
struct ChunkReader<'a> {
    message: &'a mut Assembled,
    /// Where a string or borrowed byte string that spans chunks is gathered (reused).
    scratch: Vec<u8>,
}

impl ChunkReader<'_> {
    /// The next `length` bytes, appended to `out`; fails, having allocated nothing, if fewer
    /// are left.
    fn take_into(&mut self, length: usize, out: &mut Vec<u8>) -> bincode::Result<()> {
        if length as u64 > self.message.len() {
            return Err(Box::new(bincode::ErrorKind::Io(
                io::ErrorKind::UnexpectedEof.into(),
            )));
        }
        out.reserve_exact(length);
        self.message.read_into(length, out);
        Ok(())
    }

    /// Calls `with` on the next `length` bytes: a view of the current chunk if they are all
    /// in it, else gathered in the scratch buffer.
    fn with_next<R>(
        &mut self,
        length: usize,
        with: impl FnOnce(&[u8]) -> bincode::Result<R>,
    ) -> bincode::Result<R> {
        if let Some(bytes) = self.message.front(length) {
            return with(&bytes);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        self.take_into(length, &mut scratch)?;
        let result = with(&scratch);
        self.scratch = scratch;
        result
    }
}

impl Read for ChunkReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.message.read(buf)
    }
}

impl<'de> bincode::BincodeRead<'de> for ChunkReader<'_> {
    fn forward_read_str<V: Visitor<'de>>(
        &mut self,
        length: usize,
        visitor: V,
    ) -> bincode::Result<V::Value> {
        self.with_next(length, |bytes| match std::str::from_utf8(bytes) {
            Ok(string) => visitor.visit_str(string),
            Err(err) => Err(Box::new(bincode::ErrorKind::InvalidUtf8Encoding(err))),
        })
    }

    fn get_byte_buffer(&mut self, length: usize) -> bincode::Result<Vec<u8>> {
        let mut buffer = Vec::new();
        self.take_into(length, &mut buffer)?;
        Ok(buffer)
    }

    fn forward_read_bytes<V: Visitor<'de>>(
        &mut self,
        length: usize,
        visitor: V,
    ) -> bincode::Result<V::Value> {
        self.with_next(length, |bytes| visitor.visit_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        blob: Blob,
        body: Bytes,
        numbers: Vec<u32>,
    }

    /// Bytes read as a transient slice (`forward_read_bytes`), where `Bytes` takes a buffer.
    #[derive(Debug, Clone, PartialEq)]
    struct Blob(Vec<u8>);

    impl Serialize for Blob {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    impl<'de> Deserialize<'de> for Blob {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Copying;
            impl Visitor<'_> for Copying {
                type Value = Blob;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Blob, E> {
                    Ok(Blob(bytes.to_vec()))
                }
            }
            d.deserialize_bytes(Copying)
        }
    }

    fn sample(len: usize) -> Sample {
        Sample {
            id: 7,
            name: "grüße, ".repeat(len / 16 + 1),
            blob: Blob((0..len).map(|i| i as u8).collect()),
            body: Bytes::from(vec![9u8; len]),
            numbers: (0..len as u32 / 8).collect(),
        }
    }

    /// `bytes` cut at `cuts` (positions, in any order) into an assembled message.
    fn cut(bytes: &[u8], cuts: &[usize]) -> Assembled {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.extend([0, bytes.len()]);
        at.sort_unstable();
        let bytes = Bytes::copy_from_slice(bytes);
        Assembled::new(at.windows(2).map(|w| bytes.slice(w[0]..w[1])))
    }

    proptest! {
        #[test]
        fn a_value_decodes_from_its_chunks_wherever_they_are_cut(
            len in 0usize..300,
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            for codec in [Codec::Bincode, Codec::MessagePack] {
                let value = sample(len);
                let bytes = codec.encode(&value, u64::MAX).unwrap();
                let decoded: Sample = codec.decode_assembled(cut(&bytes, &cuts)).unwrap();
                prop_assert_eq!(decoded, value);
            }
        }

        #[test]
        fn arbitrary_chunks_never_panic_and_never_decode_more_than_they_hold(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            for codec in [Codec::Bincode, Codec::MessagePack] {
                if let Ok(value) = codec.decode_assembled::<Sample>(cut(&bytes, &cuts)) {
                    prop_assert!(value.blob.0.len() + value.body.len() <= bytes.len());
                }
            }
        }
    }

    #[test]
    fn trailing_and_missing_bytes_are_malformed() {
        let mut bytes = Codec::Bincode.encode(&sample(40), u64::MAX).unwrap();
        bytes.push(0);
        let trailing = Codec::Bincode.decode_assembled::<Sample>(cut(&bytes, &[10, 50]));
        assert!(
            matches!(trailing, Err(CodecError::Malformed { .. })),
            "{trailing:?}"
        );
        bytes.truncate(bytes.len() - 2);
        let missing = Codec::Bincode.decode_assembled::<Sample>(cut(&bytes, &[10, 50]));
        assert!(
            matches!(missing, Err(CodecError::Malformed { .. })),
            "{missing:?}"
        );
    }

    #[test]
    fn a_length_prefix_beyond_the_message_fails_before_anything_is_allocated_for_it() {
        // A byte string claiming 2^40 bytes, in a message of a few bytes.
        let claim = Codec::Bincode.encode(&(1u64 << 40), u64::MAX).unwrap();
        let decoded = Codec::Bincode.decode_assembled::<Bytes>(cut(&claim, &[1]));
        assert!(decoded.is_err());
        // Past bincode's limit, the reader itself refuses a claim beyond what is left.
        let mut message = cut(&claim, &[]);
        let mut reader = ChunkReader {
            message: &mut message,
            scratch: Vec::new(),
        };
        assert!(bincode::BincodeRead::get_byte_buffer(&mut reader, 1 << 40).is_err());
        assert!(reader.scratch.capacity() == 0);
    }
}
