//! What a projection's handler gets: envelopes of events, decoded from the tagged entries the
//! journal returns. Pure.

use std::marker::PhantomData;
use std::time::SystemTime;

use crate::journal::by_tag::{Offset, TaggedEvent};

use crate::journal::event::StoredEvent;

use crate::journal::id::PersistenceId;
use crate::persistence::behavior::EventSourced;
use crate::persistence::entry::Entry;

/// One event as a projection's handler gets it, with where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope<Ev> {
    /// The offset of its entry in the tag (the events of one entry share it).
    pub offset: Offset,
    /// Its stream.
    pub persistence_id: PersistenceId,
    /// The seq of its entry in the stream.
    pub seq: u64,
    /// When its entry was committed.
    pub written_at: SystemTime,
    /// The event.
    pub event: Ev,
}

impl<Ev> Envelope<Ev> {
    /// The entity id of a sharded entity's stream (`<type>|<id>`, as an
    /// `EntityHostHandle` names them): what follows the first
    /// `|` (entity types hold none, entity ids may). `None` for a stream without `|`.
    pub fn entity_id(&self) -> Option<&str> {
        self.persistence_id
            .as_str()
            .split_once('|')
            .map(|(_, id)| id)
    }

    /// The entity type of a sharded entity's stream: what precedes the first `|`.
    pub fn entity_type(&self) -> Option<&str> {
        self.persistence_id
            .as_str()
            .split_once('|')
            .map(|(kind, _)| kind)
    }
}

/// How a projection turns the stored entries of its tag into events: [`EntityEvents`] for the
/// entries of a persistent entity, [`RawEvents`] for entries as stored. Implemented by those
/// two.
pub trait EventDecoder: 'static {
    /// The events the handler gets.
    type Event: 'static;

    /// The events of one stored entry (possibly none), or why it cannot be read.
    ///
    /// # Errors
    /// A reason, if the entry does not decode (written in a version this code cannot read,
    /// or corrupt).
    fn decode(&self, stored: StoredEvent) -> Result<Vec<Self::Event>, String>;
}

/// The events of a persistent entity `E`: each entry is decoded as the entity's recovery
/// decodes it (the codec its manifest names, older versions through
/// [`EventSourced::upcast_events`]), and every event of the entry is handed on, in order.
pub struct EntityEvents<E>(PhantomData<fn() -> E>);

impl<E> Default for EntityEvents<E> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E: EventSourced> EventDecoder for EntityEvents<E> {
    type Event = E::Event;

    fn decode(&self, stored: StoredEvent) -> Result<Vec<E::Event>, String> {
        Entry::<E::Event>::decode(
            &stored.payload,
            &stored.manifest,
            E::EVENT_VERSION,
            E::upcast_events,
        )
        .map(|entry| entry.events)
        .map_err(|unreadable| unreadable.to_string())
    }
}

/// Entries as stored: one [`StoredEvent`] (payload and manifest) per entry, for entries that
/// were not written by a persistent entity (an application's own
/// `append_tagged`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawEvents;

impl EventDecoder for RawEvents {
    type Event = StoredEvent;

    fn decode(&self, stored: StoredEvent) -> Result<Vec<StoredEvent>, String> {
        Ok(vec![stored])
    }
}

/// One tagged entry on its way to the handler: its events, or why it cannot be handled.
#[derive(Debug)]
pub struct Item<Ev> {
    /// Its offset in the tag.
    pub offset: Offset,
    /// The stream it was written to.
    pub persistence_id: PersistenceId,
    /// Its seq in that stream.
    pub seq: u64,
    /// When it was written.
    pub written_at: SystemTime,
    /// Its events, or why it cannot be read (deleted, undecodable).
    pub events: Result<Vec<Envelope<Ev>>, String>,
}

impl<Ev> Item<Ev> {
    /// Decodes `tagged` with `decoder`.
    pub fn decode<D: EventDecoder<Event = Ev>>(decoder: &D, tagged: TaggedEvent) -> Self {
        let TaggedEvent {
            offset,
            persistence_id,
            seq,
            written_at,
            event,
        } = tagged;
        let events = match event {
            None => Err(
                "its events were deleted (`delete_to`) before the projection read them".to_owned(),
            ),
            Some(stored) => decoder.decode(stored).map(|events| {
                events
                    .into_iter()
                    .map(|event| Envelope {
                        offset,
                        persistence_id: persistence_id.clone(),
                        seq,
                        written_at,
                        event,
                    })
                    .collect()
            }),
        };
        Self {
            offset,
            persistence_id,
            seq,
            written_at,
            events,
        }
    }

    /// How many events it holds (0 if it cannot be read).
    pub fn len(&self) -> usize {
        self.events.as_ref().map_or(0, Vec::len)
    }

    /// Whether it holds no event (or cannot be read).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::codec::{Codec, Manifest};
    use crate::persistence::behavior::Decision;

    #[derive(Default, Serialize, Deserialize)]
    struct Counter(i64);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Added(i64);

    impl EventSourced for Counter {
        type Command = i64;
        type Event = Added;
        type Reply = ();
        type Rejection = String;
        fn decide(&self, n: &i64) -> Result<Decision<Self>, String> {
            Ok(Decision::persist([Added(*n)], ()))
        }
        fn apply(&mut self, Added(n): &Added) {
            self.0 += n;
        }
    }

    fn tagged(event: Option<StoredEvent>) -> TaggedEvent {
        TaggedEvent {
            offset: Offset::from_parts(0, 7),
            persistence_id: PersistenceId::new("c").unwrap(),
            seq: 3,
            written_at: SystemTime::UNIX_EPOCH,
            event,
        }
    }

    #[test]
    fn an_entity_entry_becomes_one_envelope_per_event_sharing_its_offset() {
        let entry = Entry::new(vec![Added(1), Added(2)], None);
        let manifest = Manifest::new(Codec::MessagePack, "Added", 1);
        let stored = StoredEvent {
            seq: 3,
            payload: entry.encode(Codec::MessagePack).unwrap(),
            manifest,
        };
        let item = Item::decode(&EntityEvents::<Counter>::default(), tagged(Some(stored)));
        let events = item.events.unwrap();
        assert_eq!(
            events
                .iter()
                .map(|e| (&e.event, e.offset, e.seq))
                .collect::<Vec<_>>(),
            [
                (&Added(1), Offset::from_parts(0, 7), 3),
                (&Added(2), Offset::from_parts(0, 7), 3)
            ]
        );
    }

    #[test]
    fn a_deleted_or_undecodable_entry_says_why() {
        let deleted = Item::decode(&EntityEvents::<Counter>::default(), tagged(None));
        assert!(deleted.events.unwrap_err().contains("deleted"));
        let garbage = StoredEvent {
            seq: 3,
            payload: vec![9, 9, 9],
            manifest: Manifest::new(Codec::MessagePack, "Added", 1),
        };
        let undecodable = Item::decode(&EntityEvents::<Counter>::default(), tagged(Some(garbage)));
        assert!(undecodable.events.unwrap_err().contains("format 9"));
        let newer = StoredEvent {
            seq: 3,
            payload: Entry::new(vec![Added(1)], None)
                .encode(Codec::MessagePack)
                .unwrap(),
            manifest: Manifest::new(Codec::MessagePack, "Added", 2),
        };
        let item = Item::decode(&EntityEvents::<Counter>::default(), tagged(Some(newer)));
        assert_eq!(item.len(), 0);
        assert!(item.events.is_err(), "a newer version is not guessed at");
    }

    #[test]
    fn a_raw_entry_is_handed_on_as_stored() {
        let stored = StoredEvent {
            seq: 3,
            payload: b"raw".to_vec(),
            manifest: Manifest::raw(),
        };
        let item = Item::decode(&RawEvents, tagged(Some(stored.clone())));
        assert_eq!(item.events.unwrap()[0].event, stored);
    }

    #[test]
    fn an_envelope_names_the_entity_of_a_sharded_stream_split_at_the_first_bar() {
        let envelope = |stream: &str| Envelope {
            offset: Offset::from_parts(0, 1),
            persistence_id: PersistenceId::new(stream).unwrap(),
            seq: 1,
            written_at: SystemTime::UNIX_EPOCH,
            event: (),
        };
        let sharded = envelope("customer|cust-3");
        assert_eq!(
            (sharded.entity_type(), sharded.entity_id()),
            (Some("customer"), Some("cust-3"))
        );
        assert_eq!(envelope("customer|a|b").entity_id(), Some("a|b"));
        assert_eq!(envelope("plain").entity_id(), None);
    }
}
