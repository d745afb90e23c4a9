//! How a body on the wire says how it was written, and how a receiver reads it into its
//! version of the message type. Pure: no I/O, no runtime; shared by the TCP and NATS
//! transports.
//!
//! An encoded body is a header, in the crate's bincode format ([`crate::codec`]): its codec's
//! id (one byte, [`Codec::id`]) and the schema version of its type (a varint: one byte below
//! 251), then the value in that codec. The header is written once per message, with its body.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{PoisonError, RwLock};

use std::io::Write;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{self, Codec, CodecError, Manifest, Unreadable, UpcastError, Written};
use crate::protocol::chunk::{Assembled, ChunkWriter};
use crate::protocol::envelope::DeadLetterReason;

/// The codec bodies are written in when their type has no [`BodySchema`]: MessagePack, so
/// that nodes with different versions of a type (a field added with `#[serde(default)]` on
/// one side) understand each other without code. It costs about a quarter of the throughput
/// of bincode bodies in a loopback benchmark at window 256 (about half a microsecond per
/// message; `benches/README.md`, "Codecs", in the repository): declare [`Codec::Bincode`] for a type
/// that is sent a lot and never changes.
pub const DEFAULT_WIRE_CODEC: Codec = Codec::MessagePack;

/// How the bodies of one message type `T` go over the wire, declared per node
/// (`NodeHandle::body_schema`,
/// `NatsCarrierHandle::body_schema` with the feature `nats`) for every consumer of
/// `T` it exposes and every reference to consumers of `T` it hands out.
///
/// Every body carries its codec and the schema version of its type, so a receiver knows how it
/// was written before it decodes it. With the self-describing codec
/// ([`Codec::MessagePack`], the default), a field added with `#[serde(default)]` needs no
/// schema at all: old and new nodes decode each other's bodies (the old one ignores the
/// field it does not know). A breaking change (a renamed field, a changed type) raises the
/// [`version`](Self::version) on the new nodes, whose [`upcast`](Self::upcast) reads what the
/// old ones still send. What a receiver cannot read (an unknown codec, a version newer than
/// its own, an older one without an upcaster) is a dead letter at the consumer
/// ([`DeadLetterReason::IncompatibleBody`], naming codec and versions; no ACK, so the
/// producer retransmits it until it gives up, as for any dead letter), never a guess.
///
/// A node declares one with `NodeHandle::body_schema` (actix-delivery), where an example
/// shows a version 2 type and its upcaster.
pub struct BodySchema<T> {
    codec: Codec,
    version: u32,
    upcast: Option<fn(Written<'_>) -> Result<T, UpcastError>>,
}

impl<T> BodySchema<T> {
    /// In [`DEFAULT_WIRE_CODEC`], version 1, no upcaster: what a type without a declared
    /// schema gets.
    pub const fn new() -> Self {
        Self {
            codec: DEFAULT_WIRE_CODEC,
            version: 1,
            upcast: None,
        }
    }

    /// The codec bodies of `T` are written in (default [`DEFAULT_WIRE_CODEC`]). Received
    /// bodies are read in the codec they were written in, whatever this says.
    /// [`Codec::Bincode`] is faster and smaller, but its reader's type must be exactly the
    /// writer's: every change of `T` then needs a new version and an upcaster on the nodes
    /// that receive it.
    pub const fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// The schema version of `T` this code writes and reads directly (default 1). Raise it
    /// with a change of `T` that cannot decode what the previous version wrote; received
    /// bodies of an older version go through the [`upcast`](Self::upcast) hook, bodies of a
    /// newer one are dead letters.
    pub const fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// How a received body of an older [`version`](Self::version) becomes a `T`: decode it as
    /// the type it was written as with [`Written::decode`], dispatching on
    /// [`Written::version`] (its [`Manifest`] names `T`: bodies carry no type names). An
    /// error (or a panic) makes that delivery a dead letter.
    pub const fn upcast(mut self, upcast: fn(Written<'_>) -> Result<T, UpcastError>) -> Self {
        self.upcast = Some(upcast);
        self
    }

    /// The version this schema writes (and reads directly).
    pub fn current_version(&self) -> u32 {
        self.version
    }

    /// Appends the body of `value`, header first, to `out`; on error `out` is left as it was.
    pub fn write(&self, value: &T, out: &mut Vec<u8>) -> Result<(), CodecError>
    where
        T: Serialize,
    {
        let start = out.len();
        let result = codec::encode_into(&(self.codec.id(), self.version), out)
            .and_then(|()| self.codec.encode_into(value, out, codec::MAX_ENCODED_BYTES));
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Writes a message to be sent in chunks (a producer with `chunk_size`): header first, as
    /// [`write`](Self::write) does, without the one-body limit, into chunks of `chunk_size`
    /// bytes.
    pub fn write_chunks(&self, value: &T, chunk_size: usize) -> Result<Vec<Bytes>, CodecError>
    where
        T: Serialize,
    {
        let mut chunks = ChunkWriter::new(chunk_size);
        let header = codec::encode(&(self.codec.id(), self.version))?;
        chunks.write_all(&header).expect("writing to memory");
        self.codec.write(value, &mut chunks, u64::MAX)?;
        Ok(chunks.finish())
    }

    /// Reads a reassembled chunked message as a `T`, as [`read`](Self::read) reads a body:
    /// at this version straight from its chunks, at another through the upcaster.
    ///
    /// # Errors
    /// As [`read`](Self::read). Never panics, whatever the bytes (or the upcaster) do.
    pub fn read_assembled(&self, mut message: Assembled) -> Result<T, Unread>
    where
        T: DeserializeOwned,
    {
        let len = message.len();
        let Ok((codec, version)) = codec::decode_prefix_from::<(u8, u32)>(&mut message, len) else {
            return Err(Unread {
                reason: DeadLetterReason::UndecodableBody,
                why: "the message has no codec and version header".to_owned(),
            });
        };
        if let (true, Some(known)) = (version == self.version, Codec::from_id(codec)) {
            let decoded = catch_unwind(AssertUnwindSafe(|| known.decode_assembled(message)));
            return match decoded {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(error)) => Err(Unread {
                    reason: DeadLetterReason::UndecodableBody,
                    why: error.to_string(),
                }),
                Err(_) => Err(Unread {
                    reason: DeadLetterReason::UndecodableBody,
                    why: "decoding it panicked".to_owned(),
                }),
            };
        }
        // Another codec or version (rare): the upcaster reads it from one buffer.
        let mut body = codec::encode(&(codec, version)).expect("a header encodes");
        body.extend_from_slice(&message.into_bytes());
        self.read(&body)
    }

    /// Reads a received body as a `T`: directly if it was written at this version, through
    /// the upcaster if at an older one.
    ///
    /// # Errors
    /// [`Unread`]: [`DeadLetterReason::UndecodableBody`] for a body without a header, or one
    /// at this version that does not decode as `T`; [`DeadLetterReason::IncompatibleBody`]
    /// for an unknown codec, a newer version, or an older one no upcaster read. Never
    /// panics, whatever the bytes (or the upcaster) do.
    pub fn read(&self, body: &[u8]) -> Result<T, Unread>
    where
        T: DeserializeOwned,
    {
        let Ok(((codec, version), value)) =
            codec::decode_prefix::<(u8, u32)>(body, body.len() as u64)
        else {
            return Err(Unread {
                reason: DeadLetterReason::UndecodableBody,
                why: "the body has no codec and version header".to_owned(),
            });
        };
        let current = self.version;
        if version == current {
            // The common case, without building a manifest (it allocates): only a failure
            // needs one, for its reason.
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                Codec::from_id(codec).map(|known| known.decode(value, value.len() as u64))
            }));
            if let Ok(Some(Ok(value))) = decoded {
                return Ok(value);
            }
        }
        let incompatible = DeadLetterReason::IncompatibleBody {
            codec,
            version,
            current,
        };
        let manifest = Manifest::from_stored(codec, std::any::type_name::<T>(), version);
        if manifest.codec().is_none() {
            return Err(Unread {
                reason: incompatible,
                why: format!("{manifest} cannot be read by this version of the crate"),
            });
        }
        let written = Written::new(&manifest, value, value.len() as u64);
        let upcast = |old: Written<'_>| match self.upcast {
            Some(upcast) => upcast(old),
            None => Err(UpcastError::missing(&old, current)),
        };
        let read =
            catch_unwind(AssertUnwindSafe(|| written.read(current, upcast))).unwrap_or_else(|_| {
                Err(Unreadable::Incompatible(
                    "decoding or upcasting it panicked".into(),
                ))
            });
        read.map_err(|error| Unread {
            reason: if version == current {
                DeadLetterReason::UndecodableBody
            } else {
                incompatible
            },
            why: error.to_string(),
        })
    }
}

impl<T> Clone for BodySchema<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for BodySchema<T> {}

impl<T> Default for BodySchema<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for BodySchema<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodySchema")
            .field("type", &std::any::type_name::<T>())
            .field("codec", &self.codec)
            .field("version", &self.version)
            .field("upcast", &self.upcast.is_some())
            .finish()
    }
}

/// Why a received body was not read: the dead letter's reason, and a text for the log.
#[derive(Debug, PartialEq, Eq)]
pub struct Unread {
    /// The reason the producer is told.
    pub reason: DeadLetterReason,
    /// What went wrong, for the log.
    pub why: String,
}

/// The schemas a node declared, by message type.
#[derive(Default)]
pub struct Schemas(RwLock<HashMap<TypeId, Box<dyn Any + Send + Sync>>>);

impl Schemas {
    /// Declares (or replaces) the schema of `T`.
    pub fn declare<T: 'static>(&self, schema: BodySchema<T>) {
        let mut schemas = self.0.write().unwrap_or_else(PoisonError::into_inner);
        schemas.insert(TypeId::of::<T>(), Box::new(schema));
    }

    /// The schema of `T`: the declared one, or [`BodySchema::new`].
    pub fn of<T: 'static>(&self) -> BodySchema<T> {
        let schemas = self.0.read().unwrap_or_else(PoisonError::into_inner);
        schemas
            .get(&TypeId::of::<T>())
            .and_then(|schema| schema.downcast_ref::<BodySchema<T>>())
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

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

    /// Version 3: `total` renamed, in cents.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Order {
        id: u64,
        total_cents: u64,
    }

    fn upcast(old: Written<'_>) -> Result<Order, UpcastError> {
        match old.version() {
            1 | 2 => {
                let v1: OrderV1 = old.decode()?;
                Ok(Order {
                    id: v1.id,
                    total_cents: v1.total * 100,
                })
            }
            other => Err(UpcastError::new(format!("no upcaster from {other}"))),
        }
    }

    fn body<T: Serialize>(schema: BodySchema<T>, value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        schema.write(value, &mut out).unwrap();
        out
    }

    #[test]
    fn a_body_starts_with_its_codec_and_version() {
        let bytes = body(BodySchema::new().version(300), &7u64);
        assert_eq!(bytes[..4], [2, 251, 0x2c, 0x01], "msgpack, version 300");
        assert_eq!(bytes[4..], [7], "then the value");
        let bytes = body(BodySchema::new().codec(Codec::Bincode), &"ab");
        assert_eq!(bytes, [1, 1, 2, b'a', b'b']);
    }

    #[test]
    fn an_added_defaulted_field_reads_both_ways_at_the_same_version() {
        let old = body(BodySchema::new(), &OrderV1 { id: 1, total: 5 });
        assert_eq!(
            BodySchema::<OrderV2>::new().read(&old).unwrap(),
            OrderV2 {
                id: 1,
                total: 5,
                currency: None
            }
        );
        let new = OrderV2 {
            id: 2,
            total: 7,
            currency: Some("EUR".into()),
        };
        let new = body(BodySchema::new(), &new);
        assert_eq!(
            BodySchema::<OrderV1>::new().read(&new).unwrap(),
            OrderV1 { id: 2, total: 7 }
        );
    }

    #[test]
    fn the_same_change_in_bincode_is_undecodable() {
        let old = body(
            BodySchema::new().codec(Codec::Bincode),
            &OrderV1 { id: 1, total: 5 },
        );
        let unread = BodySchema::<OrderV2>::new().read(&old).unwrap_err();
        assert_eq!(unread.reason, DeadLetterReason::UndecodableBody);
        assert!(
            unread.why.contains("version 1 in bincode"),
            "{}",
            unread.why
        );
    }

    #[test]
    fn an_older_version_goes_through_the_upcaster_or_is_incompatible() {
        let v1 = body(BodySchema::new(), &OrderV1 { id: 1, total: 5 });
        let with = BodySchema::<Order>::new().version(3).upcast(upcast);
        assert_eq!(
            with.read(&v1).unwrap(),
            Order {
                id: 1,
                total_cents: 500
            }
        );
        let without = BodySchema::<Order>::new().version(3);
        let unread = without.read(&v1).unwrap_err();
        let reason = DeadLetterReason::IncompatibleBody {
            codec: 2,
            version: 1,
            current: 3,
        };
        assert_eq!(unread.reason, reason);
        assert!(unread.why.contains("no upcaster"), "{}", unread.why);
        assert_eq!(
            reason.to_string(),
            "the body was written as version 1 in msgpack, and no upcaster read it as the \
             consumer's version 3"
        );
        // Its own version is read directly, not upcast.
        let v3 = body(
            with,
            &Order {
                id: 2,
                total_cents: 1,
            },
        );
        assert_eq!(with.read(&v3).unwrap().total_cents, 1);
    }

    #[test]
    fn a_newer_version_is_refused_even_with_an_upcaster() {
        let v4 = body(BodySchema::new().version(4), &OrderV1 { id: 1, total: 5 });
        let unread = BodySchema::<Order>::new()
            .version(3)
            .upcast(upcast)
            .read(&v4)
            .unwrap_err();
        let reason = DeadLetterReason::IncompatibleBody {
            codec: 2,
            version: 4,
            current: 3,
        };
        assert_eq!(unread.reason, reason);
        assert!(unread.why.contains("newer"), "{}", unread.why);
        assert_eq!(
            reason.to_string(),
            "the body was written as version 4 in msgpack, newer than the consumer's version 3"
        );
    }

    #[test]
    fn an_unknown_codec_a_missing_header_and_a_panicking_upcaster_are_refused() {
        let unknown = [9, 1, 7];
        let unread = BodySchema::<u64>::new().read(&unknown).unwrap_err();
        let reason = DeadLetterReason::IncompatibleBody {
            codec: 9,
            version: 1,
            current: 1,
        };
        assert_eq!(unread.reason, reason);
        assert!(unread.why.contains("unknown codec 9"), "{}", unread.why);
        assert_eq!(
            reason.to_string(),
            "the body is in codec 9, unknown to this version of the crate"
        );
        for headless in [&[][..], &[2], &[2, 253, 0, 0, 0, 0, 1, 0, 0, 0]] {
            let unread = BodySchema::<u64>::new().read(headless).unwrap_err();
            assert_eq!(
                unread.reason,
                DeadLetterReason::UndecodableBody,
                "{headless:?}"
            );
        }
        let panics = BodySchema::<u64>::new()
            .version(2)
            .upcast(|_| panic!("a bug in the upcaster"));
        let v1 = body(BodySchema::new(), &1u64);
        let unread = panics.read(&v1).unwrap_err();
        assert!(unread.why.contains("panicked"), "{}", unread.why);
    }

    #[test]
    fn a_failed_write_leaves_the_buffer() {
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        let mut out = vec![9];
        assert!(BodySchema::new().write(&Fails, &mut out).is_err());
        assert_eq!(out, [9]);
    }

    #[test]
    fn schemas_are_declared_per_type() {
        let schemas = Schemas::default();
        assert_eq!(schemas.of::<u64>().version, 1);
        assert_eq!(schemas.of::<u64>().codec, DEFAULT_WIRE_CODEC);
        schemas.declare(BodySchema::<u64>::new().version(2).codec(Codec::Bincode));
        assert_eq!(schemas.of::<u64>().version, 2);
        assert_eq!(schemas.of::<u64>().codec, Codec::Bincode);
        assert_eq!(
            schemas.of::<u32>().version,
            1,
            "another type keeps the default"
        );
        schemas.declare(BodySchema::<Order>::new().upcast(upcast));
        assert!(schemas.of::<Order>().upcast.is_some());
    }
}
