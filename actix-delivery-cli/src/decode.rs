//! A stored payload, shown: decoded to JSON where its codec is self-describing (MessagePack),
//! through the core's own readers; else its bytes in hex, beside its manifest.

use actix_delivery::codec::{Codec, Manifest, UpcastError, Written};
use actix_delivery_proto::persistence::inspect::decode_events;
use serde_json::Value;

/// What a payload is shown as.
pub enum Shown {
    /// The events of a persistent actor's entry (an entity's, a durable producer's log's).
    Events(Vec<Value>),
    /// A value written as it is (`Journal::append_as`).
    Value(Value),
    /// Bytes that do not decode without their type: bincode, raw bytes, an unknown codec, or
    /// MessagePack that is neither of the above.
    Bytes,
}

/// Reads a value as it was written, whatever its version.
fn as_written(old: Written<'_>) -> Result<Vec<Value>, UpcastError> {
    old.decode()
}

/// How to show `payload`, written as `manifest` says.
pub fn show(payload: &[u8], manifest: &Manifest) -> Shown {
    if manifest.codec() != Some(Codec::MessagePack) {
        return Shown::Bytes;
    }
    // An entry first: its leading format byte would read as a small integer followed by
    // trailing bytes, which the whole-value decoding refuses anyway.
    if let Ok(events) = decode_events(payload, manifest, manifest.version(), as_written) {
        return Shown::Events(events);
    }
    match Codec::MessagePack.decode::<Value>(payload, payload.len() as u64) {
        Ok(value) => Shown::Value(value),
        Err(_) => Shown::Bytes,
    }
}
