//! What a persistent actor stores: one journal entry per command that caused something, and
//! snapshots of its state with its delivery record.
//!
//! Both consist of the crate's part (the processed mark, deliveries and confirmations of an
//! entry; the delivery record and outbox of a snapshot), always in bincode, and the
//! application's part (the events; the state), in the codec the stored
//! [`Manifest`] names and at the version it names, so that an older version of a type is
//! decoded by an upcaster rather than misread. A leading format byte tells the layouts apart:
//!
//! ```text
//! format 3 (current):   3 · crate part (bincode) · application part (manifest's codec)
//! format 2 (read only): 2 · crate part (bincode) · application part (manifest's codec)
//! format 1 (journal schema 1, read only):
//!                       1 · application part (bincode) · crate part (bincode)
//! ```
//!
//! Format 3's processed mark names the first seq of a chunked message (the mark covers its
//! range); formats 1 and 2 have the same crate part without it, so format 1 is read by
//! decoding the application part first (bincode tells where it ends) and the crate part from
//! the rest. A snapshot's crate part is the same in all three. In format 1 an application
//! part decoded as another layout than it was written in (a type changed without a new
//! version) can end in the wrong place, and then the crate part is what fails: its error
//! gives the same hint as a value that does not decode itself.

use std::cell::Cell;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub(crate) use crate::codec::Unreadable;
use crate::codec::{self, Codec, CodecError, Manifest, UpcastError, Written, TYPE_CHANGED};
use crate::persistence::delivery_record::Mark;
use crate::persistence::outbox_state::{OutboxState, Sent};
use crate::persistence::type_names::TypeNames;
use crate::protocol::dedup::WindowRecord;
use crate::protocol::envelope::{Incarnation, IncarnationId};

/// The manifests an entity's entries and snapshots are written with.
#[derive(Clone, Debug)]
pub(crate) struct Manifests {
    pub events: Manifest,
    pub state: Manifest,
}

impl Manifests {
    /// For entity `E`, under `names`, written in `codec`.
    pub fn of<E: crate::persistence::behavior::EventSourced>(
        names: &TypeNames,
        codec: Codec,
    ) -> Self {
        Self {
            events: Manifest::new(codec, names.events(), E::EVENT_VERSION),
            state: Manifest::new(codec, names.state(), E::STATE_VERSION),
        }
    }
}

/// The layout this version writes.
const FORMAT: u8 = 3;
/// The layout before marks could cover a chunked message's seqs, still read.
const FORMAT_2: u8 = 2;
/// The layout of journal schema 1 (before manifests), still read.
const LEGACY: u8 = 1;

/// One journal entry: the events of one command, the processed mark of the delivery it came
/// from, and the deliveries it makes (stored together, so that none exists without the
/// others); or the confirmations of earlier deliveries.
#[derive(Debug)]
pub(crate) struct Entry<Ev> {
    pub events: Vec<Ev>,
    pub record: EntryRecord,
}

/// The crate's part of an entry.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct EntryRecord {
    pub processed: Option<Mark>,
    pub sent: Vec<Sent>,
    pub confirmed: Vec<(String, u64)>,
    /// The outbox's incarnation, in the entry of its first delivery.
    pub outbox_incarnation: Option<Incarnation>,
}

/// The crate's part of an entry in formats 1 and 2: its mark covers one seq.
#[derive(Deserialize)]
struct EntryRecordV2 {
    processed: Option<MarkV2>,
    sent: Vec<Sent>,
    confirmed: Vec<(String, u64)>,
    outbox_incarnation: Option<Incarnation>,
}

/// A processed mark in formats 1 and 2.
#[derive(Deserialize)]
struct MarkV2 {
    producer_id: crate::protocol::envelope::ProducerId,
    incarnation: IncarnationId,
    seq: u64,
    window_start: u64,
}

impl From<EntryRecordV2> for EntryRecord {
    fn from(old: EntryRecordV2) -> Self {
        Self {
            processed: old.processed.map(|mark| Mark {
                producer_id: mark.producer_id,
                incarnation: mark.incarnation,
                seq: mark.seq,
                window_start: mark.window_start,
                first_seq: None,
            }),
            sent: old.sent,
            confirmed: old.confirmed,
            outbox_incarnation: old.outbox_incarnation,
        }
    }
}

impl<Ev: Serialize + DeserializeOwned> Entry<Ev> {
    pub fn new(events: Vec<Ev>, processed: Option<Mark>) -> Self {
        Self {
            events,
            record: EntryRecord {
                processed,
                ..EntryRecord::default()
            },
        }
    }

    /// Encodes the entry, its events in `codec`, at most [`codec::MAX_ENCODED_BYTES`] long.
    pub fn encode(&self, codec: Codec) -> Result<Vec<u8>, CodecError> {
        encode(
            &self.record,
            &self.events,
            codec,
            codec::MAX_ENCODED_BYTES,
            Codec::encode_into,
        )
    }

    /// Decodes an entry written as `manifest` says, its events at the version `current` or,
    /// through `upcast`, at an older one. An unknown layout, a newer version, or an older one
    /// `upcast` cannot read is an error, never a guess.
    pub fn decode(
        bytes: &[u8],
        manifest: &Manifest,
        current: u32,
        upcast: fn(Written<'_>) -> Result<Vec<Ev>, UpcastError>,
    ) -> Result<Self, Unreadable> {
        let (events, record) =
            decode::<Vec<Ev>, EntryRecord, EntryRecordV2>(bytes, manifest, current, upcast)?;
        Ok(Self { events, record })
    }
}

/// A snapshot as written: borrows the state and the outbox.
#[derive(Serialize)]
pub(crate) struct SnapshotOut<'a, S> {
    pub state: &'a S,
    pub record: SnapshotRecordOut<'a>,
}

/// The crate's part of a snapshot, borrowed for writing.
#[derive(Serialize)]
pub(crate) struct SnapshotRecordOut<'a> {
    delivered: Vec<WindowRecord<IncarnationId>>,
    outbox: &'a OutboxState,
}

impl<'a, S: Serialize> SnapshotOut<'a, S> {
    pub fn new(
        state: &'a S,
        delivered: Vec<WindowRecord<IncarnationId>>,
        outbox: &'a OutboxState,
    ) -> Self {
        Self {
            state,
            record: SnapshotRecordOut { delivered, outbox },
        }
    }

    /// Encodes the snapshot in one pass (a large state is serialized once, not sized
    /// first), the state in `codec`, at most `limit` bytes long: the buffer never grows
    /// beyond `limit`, however large the state.
    pub fn encode(&self, codec: Codec, limit: u64) -> Result<Vec<u8>, CodecError> {
        encode(
            &self.record,
            self.state,
            codec,
            limit,
            Codec::encode_bounded_into,
        )
    }
}

/// A snapshot as read.
pub(crate) struct SnapshotIn<S> {
    pub state: S,
    pub delivered: Vec<WindowRecord<IncarnationId>>,
    pub outbox: OutboxState,
}

/// The crate's part of a snapshot, owned.
#[derive(Deserialize)]
struct SnapshotRecordIn {
    delivered: Vec<WindowRecord<IncarnationId>>,
    outbox: OutboxState,
}

impl<S: DeserializeOwned> SnapshotIn<S> {
    /// Decodes a stored snapshot whatever its size: its bytes are in memory already (the
    /// journal bounds them), and decoding a slice checks every length against the bytes
    /// that remain. A snapshot written under a larger `max_snapshot_bytes` than the one
    /// configured now still recovers. The state is read as [`Entry::decode`] reads events.
    pub fn decode(
        bytes: &[u8],
        manifest: &Manifest,
        current: u32,
        upcast: fn(Written<'_>) -> Result<S, UpcastError>,
    ) -> Result<Self, Unreadable> {
        let (state, record) =
            decode::<S, SnapshotRecordIn, SnapshotRecordIn>(bytes, manifest, current, upcast)?;
        Ok(Self {
            state,
            delivered: record.delivered,
            outbox: record.outbox,
        })
    }
}

/// `FORMAT · record (bincode) · value (codec)`, at most `limit` bytes.
fn encode<R: Serialize, V: Serialize + ?Sized>(
    record: &R,
    value: &V,
    codec: Codec,
    limit: u64,
    encode_into: fn(Codec, &V, &mut Vec<u8>, u64) -> Result<(), CodecError>,
) -> Result<Vec<u8>, CodecError> {
    let too_large = |err| match err {
        CodecError::TooLarge { .. } => CodecError::TooLarge { limit },
        other => other,
    };
    let mut out = vec![FORMAT];
    Codec::Bincode
        .encode_into(record, &mut out, limit.saturating_sub(1))
        .map_err(too_large)?;
    let left = limit.saturating_sub(out.len() as u64);
    encode_into(codec, value, &mut out, left).map_err(too_large)?;
    Ok(out)
}

/// Reads any layout: the application's value `V` (at `current`, or through `upcast`) and the
/// crate's record `R` (`L` in formats 1 and 2).
fn decode<V: DeserializeOwned, R: DeserializeOwned, L: DeserializeOwned + Into<R>>(
    bytes: &[u8],
    manifest: &Manifest,
    current: u32,
    upcast: fn(Written<'_>) -> Result<V, UpcastError>,
) -> Result<(V, R), Unreadable> {
    let limit = bytes.len() as u64;
    let corrupt =
        |err: CodecError| Unreadable::Corrupt(format!("the crate's part does not decode: {err}"));
    let Some((&format, body)) = bytes.split_first() else {
        return Err(Unreadable::Corrupt("empty".into()));
    };
    match format {
        FORMAT => {
            let (record, value) = codec::decode_prefix::<R>(body, limit).map_err(corrupt)?;
            let value = Written::new(manifest, value, limit).read(current, upcast)?;
            Ok((value, record))
        }
        FORMAT_2 => {
            let (record, value) = codec::decode_prefix::<L>(body, limit).map_err(corrupt)?;
            let value = Written::new(manifest, value, limit).read(current, upcast)?;
            Ok((value, record.into()))
        }
        LEGACY => {
            // Only actix-delivery 0.1 wrote format 1, always as bincode version 1: whatever the
            // columns say (a 0.1 node saving a snapshot over a newer one leaves the newer
            // manifest next to its payload).
            let manifest = &Manifest::legacy();
            let rest = Cell::new(None);
            let value = Written::prefix(manifest, body, limit, &rest).read(current, upcast)?;
            let rest = rest.get().ok_or_else(|| {
                Unreadable::Incompatible(
                    "written in format 1 (journal schema 1), in which the delivery record \
                     follows the events: the upcaster must decode them (call \
                     `Written::decode`)"
                        .into(),
                )
            })?;
            // Where the application's part ends is known only by decoding it: decoded as
            // another layout than the one written, it ends elsewhere, and the crate's part
            // after it is what fails.
            let misread = if current == manifest.version() {
                TYPE_CHANGED
            } else {
                "(corrupt, or the upcaster decoded version 1 as another type than it was \
                 written as)"
            };
            let record = codec::decode_with_limit::<L>(rest, limit).map_err(|err| {
                Unreadable::Corrupt(format!("the crate's part does not decode: {err} {misread}"))
            })?;
            Ok((value, record.into()))
        }
        other => Err(Unreadable::Corrupt(format!(
            "written in format {other}, this version reads formats {LEGACY} to {FORMAT}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::envelope::ProducerId;

    fn no_upcast<T>(old: Written<'_>) -> Result<T, UpcastError> {
        Err(UpcastError::missing(&old, 2))
    }

    fn mark() -> Mark {
        Mark {
            producer_id: ProducerId::from("p"),
            incarnation: IncarnationId::from_u128(3),
            seq: 7,
            window_start: 5,
            first_seq: None,
        }
    }

    /// A mark as formats 1 and 2 wrote it.
    #[derive(Serialize)]
    struct V2Mark {
        producer_id: ProducerId,
        incarnation: IncarnationId,
        seq: u64,
        window_start: u64,
    }

    fn v2_mark() -> V2Mark {
        V2Mark {
            producer_id: ProducerId::from("p"),
            incarnation: IncarnationId::from_u128(3),
            seq: 7,
            window_start: 5,
        }
    }

    fn manifest(codec: Codec, version: u32) -> Manifest {
        Manifest::new(codec, "u32", version)
    }

    #[test]
    fn entries_round_trip_with_their_mark_in_both_codecs() {
        let chunked = Mark {
            first_seq: Some(3),
            ..mark()
        };
        for codec in [Codec::Bincode, Codec::MessagePack] {
            for mark in [mark(), chunked.clone()] {
                let bytes = Entry::new(vec![1u32, 2], Some(mark.clone()))
                    .encode(codec)
                    .unwrap();
                assert_eq!(bytes[0], FORMAT);
                let entry =
                    Entry::<u32>::decode(&bytes, &manifest(codec, 1), 1, no_upcast).unwrap();
                assert_eq!(
                    (entry.events, entry.record.processed),
                    (vec![1, 2], Some(mark))
                );
            }
        }
    }

    #[test]
    fn format_2_entries_are_read_with_their_single_seq_marks() {
        #[derive(Serialize)]
        struct V2Record {
            processed: Option<V2Mark>,
            sent: Vec<Sent>,
            confirmed: Vec<(String, u64)>,
            outbox_incarnation: Option<Incarnation>,
        }
        let record = V2Record {
            processed: Some(v2_mark()),
            sent: Vec::new(),
            confirmed: vec![("shipping".into(), 4)],
            outbox_incarnation: None,
        };
        let mut bytes = vec![FORMAT_2];
        bytes.extend(codec::encode(&record).unwrap());
        bytes.extend(rmp_serde::to_vec_named(&vec![9u32]).unwrap());
        let manifest = manifest(Codec::MessagePack, 1);
        let entry = Entry::<u32>::decode(&bytes, &manifest, 1, no_upcast).unwrap();
        assert_eq!(entry.events, [9]);
        assert_eq!(entry.record.processed, Some(mark()));
        assert_eq!(entry.record.confirmed, [("shipping".to_string(), 4)]);
    }

    /// An entry as journal schema 1 wrote it: `Entry { format: 1, events, processed, sent,
    /// confirmed, outbox_incarnation }` in bincode, whole.
    fn legacy_entry(events: Vec<u32>, processed: Option<V2Mark>) -> Vec<u8> {
        #[derive(Serialize)]
        struct V1 {
            format: u8,
            events: Vec<u32>,
            processed: Option<V2Mark>,
            sent: Vec<Sent>,
            confirmed: Vec<(String, u64)>,
            outbox_incarnation: Option<Incarnation>,
        }
        codec::encode(&V1 {
            format: 1,
            events,
            processed,
            sent: Vec::new(),
            confirmed: vec![("shipping".into(), 4)],
            outbox_incarnation: None,
        })
        .unwrap()
    }

    #[test]
    fn legacy_entries_are_read_directly_at_version_1_and_through_the_upcaster_after() {
        let bytes = legacy_entry(vec![4, 5], Some(v2_mark()));
        let entry = Entry::<u32>::decode(&bytes, &Manifest::legacy(), 1, no_upcast).unwrap();
        assert_eq!(entry.events, [4, 5]);
        assert_eq!(entry.record.processed, Some(mark()));
        assert_eq!(entry.record.confirmed, [("shipping".to_string(), 4)]);

        fn doubled(old: Written<'_>) -> Result<Vec<u64>, UpcastError> {
            assert_eq!(old.version(), 1);
            Ok(old
                .decode::<Vec<u32>>()?
                .into_iter()
                .map(|n| u64::from(n) * 2)
                .collect())
        }
        let entry = Entry::<u64>::decode(&bytes, &Manifest::legacy(), 2, doubled).unwrap();
        assert_eq!(entry.events, [8, 10]);
        assert_eq!(
            entry.record.processed,
            Some(mark()),
            "the record after the events"
        );

        fn drops_without_decoding(_: Written<'_>) -> Result<Vec<u64>, UpcastError> {
            Ok(Vec::new())
        }
        let err = Entry::<u64>::decode(&bytes, &Manifest::legacy(), 2, drops_without_decoding)
            .unwrap_err();
        assert!(
            matches!(&err, Unreadable::Incompatible(r) if r.contains("must decode them")),
            "{err}"
        );
    }

    #[test]
    fn a_legacy_entry_decoded_as_another_layout_says_what_probably_happened() {
        // A field added to the events: they end inside the crate's part.
        type Added = (u32, Option<u8>);
        let bytes = legacy_entry(vec![4, 0], Some(v2_mark()));
        let err = Entry::<Added>::decode(&bytes, &Manifest::legacy(), 1, no_upcast).unwrap_err();
        assert!(
            matches!(&err, Unreadable::Corrupt(r)
                if r.contains("crate's part") && r.contains(TYPE_CHANGED)),
            "{err}"
        );
        fn as_added(old: Written<'_>) -> Result<Vec<Added>, UpcastError> {
            old.decode()
        }
        let err = Entry::<Added>::decode(&bytes, &Manifest::legacy(), 2, as_added).unwrap_err();
        assert!(
            matches!(&err, Unreadable::Corrupt(r)
                if r.contains("the upcaster decoded version 1 as another type")),
            "{err}"
        );
    }

    #[test]
    fn a_newer_version_an_older_one_without_upcaster_and_garbage_are_errors_not_guesses() {
        let bytes = Entry::new(vec![1u32], None)
            .encode(Codec::MessagePack)
            .unwrap();
        let incompatible = |manifest: Manifest, current| match Entry::<u32>::decode(
            &bytes, &manifest, current, no_upcast,
        )
        .unwrap_err()
        {
            Unreadable::Incompatible(reason) => reason,
            other => panic!("{other:?}"),
        };
        let err = incompatible(manifest(Codec::MessagePack, 3), 2);
        assert!(
            err.contains("version 3") && err.contains("version 2"),
            "{err}"
        );
        let err = incompatible(manifest(Codec::MessagePack, 1), 2);
        assert!(err.contains("no upcaster"), "{err}");
        let err = incompatible(Manifest::from_stored(9, "u32", 1), 1);
        assert!(err.contains("unknown codec 9"), "{err}");
        let mut foreign = bytes.clone();
        foreign[0] = 4;
        let err = Entry::<u32>::decode(&foreign, &manifest(Codec::MessagePack, 1), 1, no_upcast)
            .unwrap_err();
        assert!(
            matches!(&err, Unreadable::Corrupt(r) if r.contains("format 4")),
            "{err}"
        );
        assert!(Entry::<u32>::decode(&[], &Manifest::legacy(), 1, no_upcast).is_err());
        assert!(
            Entry::<String>::decode(&[LEGACY, 1, 200], &Manifest::legacy(), 1, no_upcast).is_err()
        );
    }

    fn records() -> Vec<WindowRecord<IncarnationId>> {
        vec![WindowRecord {
            producer_id: ProducerId::from("p"),
            incarnation: IncarnationId::from_u128(1),
            floor: 2,
            contiguous: 4,
            above: vec![6],
        }]
    }

    #[test]
    fn snapshots_round_trip_in_both_codecs_and_as_schema_1_wrote_them() {
        let outbox = OutboxState::default();
        for codec in [Codec::Bincode, Codec::MessagePack] {
            let bytes = SnapshotOut::new(&"state".to_string(), records(), &outbox)
                .encode(codec, codec::MAX_ENCODED_BYTES)
                .unwrap();
            let snapshot =
                SnapshotIn::<String>::decode(&bytes, &manifest(codec, 1), 1, no_upcast).unwrap();
            assert_eq!(
                (snapshot.state.as_str(), snapshot.delivered),
                ("state", records())
            );
        }
        #[derive(Serialize)]
        struct V1<'a> {
            format: u8,
            state: &'a str,
            delivered: Vec<WindowRecord<IncarnationId>>,
            outbox: OutboxState,
        }
        let legacy = codec::encode(&V1 {
            format: 1,
            state: "old",
            delivered: records(),
            outbox: OutboxState::default(),
        })
        .unwrap();
        let snapshot =
            SnapshotIn::<String>::decode(&legacy, &Manifest::legacy(), 1, no_upcast).unwrap();
        assert_eq!(
            (snapshot.state.as_str(), snapshot.delivered),
            ("old", records())
        );
    }

    #[test]
    fn snapshots_have_their_own_limit_beyond_the_codecs_default() {
        let state = vec![1u8; codec::MAX_ENCODED_BYTES as usize + 1];
        let outbox = OutboxState::default();
        let snapshot = SnapshotOut::new(&state, Vec::new(), &outbox);
        assert_eq!(
            snapshot
                .encode(Codec::Bincode, codec::MAX_ENCODED_BYTES)
                .unwrap_err(),
            CodecError::TooLarge {
                limit: codec::MAX_ENCODED_BYTES
            }
        );
        let bytes = snapshot
            .encode(Codec::Bincode, 2 * codec::MAX_ENCODED_BYTES)
            .unwrap();
        let manifest = manifest(Codec::Bincode, 1);
        assert_eq!(
            SnapshotIn::<Vec<u8>>::decode(&bytes, &manifest, 1, no_upcast)
                .unwrap()
                .state,
            state
        );
    }

    proptest::proptest! {
        /// The layouts, headers and manifests of stored entries are read from the journal:
        /// whatever they hold, reading them is an error or a value, never a panic.
        #[test]
        fn decoding_arbitrary_entries_and_manifests_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128),
            format in 0u8..4,
            codec in 0u8..4,
            version in 0u32..4,
        ) {
            let mut bytes = bytes;
            bytes.insert(0, format);
            let manifest = Manifest::from_stored(codec, "fuzz", version);
            fn upcast(old: Written<'_>) -> Result<Vec<String>, UpcastError> {
                old.decode()
            }
            fn upcast_state(old: Written<'_>) -> Result<(u64, String), UpcastError> {
                old.decode()
            }
            let _ = Entry::<String>::decode(&bytes, &manifest, 2, upcast);
            let _ = SnapshotIn::<(u64, String)>::decode(&bytes, &manifest, 2, upcast_state);
        }
    }
}
