//! The one place bytes are made: serde values to and from bytes, with a size limit, in one of
//! two [`Codec`]s (compact, fixed-schema bincode; self-describing MessagePack, the default for
//! what is stored), what a stored value records of how it was written ([`Manifest`]), and the
//! upcasters that read old versions ([`Written`], [`Upcast`]). They live in the sans-IO core,
//! whose [`codec`](actix_delivery_proto::codec) module documents the formats and how their
//! limits bound memory.

pub use actix_delivery_proto::codec::{
    decode, decode_borrowed, decode_with_limit, encode, encode_into, encode_with_limit, Codec,
    CodecError, Manifest, Upcast, UpcastError, Written, MAX_DEPTH, MAX_ENCODED_BYTES,
};
// The core's body schemas and prefix decoding, for the transports and journals.
pub(crate) use actix_delivery_proto::codec::*;
