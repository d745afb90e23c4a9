//! Reading a persistent actor's stored entries from outside the actor: for inspectors (the
//! command-line inspector, `actix-delivery-cli`), which show what a journal holds without
//! running the entity or the durable producer that wrote it.
//!
//! An entry is the events of one command plus the crate's record (see
//! [`entry`](crate::persistence::entry)); [`decode_events`] reads its events through the same
//! code the recovery uses, so an inspector never re-implements the layout.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{Manifest, UpcastError, Written};
use crate::persistence::entry::Entry;

pub use crate::codec::Unreadable;

/// The events of one stored entry of a persistent actor (an entity's, a durable producer's
/// log's): `payload` written as `manifest` says, in any of the entry layouts this version
/// reads, its events decoded at the version `current` directly and at an older one through
/// `upcast`, as the recovery reads them.
///
/// To read the events as they were written, whatever their version, pass the manifest's own
/// version and an `upcast` that decodes (`|old| old.decode()`): with
/// `serde_json::Value` as `Ev` that shows the events of a self-describing codec (MessagePack)
/// as JSON. bincode is not self-describing: its events decode only as their own type.
///
/// # Errors
/// Why the entry cannot be read: not an entry of a persistent actor (a plain payload written
/// with `Journal::append`), corrupt, or of a version `current` and `upcast` do not read.
pub fn decode_events<Ev: Serialize + DeserializeOwned>(
    payload: &[u8],
    manifest: &Manifest,
    current: u32,
    upcast: fn(Written<'_>) -> Result<Vec<Ev>, UpcastError>,
) -> Result<Vec<Ev>, Unreadable> {
    Entry::<Ev>::decode(payload, manifest, current, upcast).map(|entry| entry.events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    enum Event {
        Deposited { amount: i64 },
    }

    fn as_written(old: Written<'_>) -> Result<Vec<serde_json::Value>, UpcastError> {
        old.decode()
    }

    #[test]
    fn an_entry_reads_as_its_type_and_in_a_self_describing_codec_as_any_value() {
        let events = vec![Event::Deposited { amount: 5 }];
        let entry = Entry::new(events, None);
        let payload = entry.encode(Codec::MessagePack).unwrap();
        let manifest = Manifest::new(Codec::MessagePack, "app::Event", 4);
        let typed: Vec<Event> = decode_events(&payload, &manifest, 4, |old| old.decode()).unwrap();
        assert_eq!(typed, [Event::Deposited { amount: 5 }]);
        let any = decode_events(&payload, &manifest, manifest.version(), as_written).unwrap();
        assert_eq!(
            any,
            [serde_json::json!({ "Deposited": { "amount": 5 } })],
            "MessagePack with named fields: a map"
        );

        let payload = entry.encode(Codec::Bincode).unwrap();
        let manifest = Manifest::new(Codec::Bincode, "app::Event", 1);
        assert!(decode_events(&payload, &manifest, 1, as_written).is_err());
        let typed: Vec<Event> = decode_events(&payload, &manifest, 1, |old| old.decode()).unwrap();
        assert_eq!(typed, [Event::Deposited { amount: 5 }]);
    }

    #[test]
    fn a_plain_payload_is_not_an_entry() {
        let payload = rmp_serde::to_vec_named(&serde_json::json!({ "a": 1 })).unwrap();
        let manifest = Manifest::new(Codec::MessagePack, "app::Thing", 1);
        assert!(decode_events(&payload, &manifest, 1, as_written).is_err());
        assert!(decode_events(&[], &manifest, 1, as_written).is_err());
    }
}
