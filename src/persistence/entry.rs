//! What a persistent actor stores: one journal entry per command that caused something, and
//! snapshots of its state with its delivery record. Both go through the crate's codec, with
//! a leading format version so that a future format is recognised instead of misread.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::persistence::delivery_record::Mark;
use crate::persistence::outbox_state::{OutboxState, Sent};
use crate::protocol::dedup::WindowRecord;
use crate::protocol::envelope::{Incarnation, IncarnationId};

/// The format of entries and snapshots this version writes and reads.
const FORMAT: u8 = 1;

/// One journal entry: the events of one command, the processed mark of the delivery it came
/// from, and the deliveries it makes (stored together, so that none exists without the
/// others); or the confirmations of earlier deliveries.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Entry<Ev> {
    format: u8,
    pub events: Vec<Ev>,
    pub processed: Option<Mark>,
    pub sent: Vec<Sent>,
    pub confirmed: Vec<(String, u64)>,
    /// The outbox's incarnation, in the entry of its first delivery.
    pub outbox_incarnation: Option<Incarnation>,
}

impl<Ev: Serialize + DeserializeOwned> Entry<Ev> {
    pub fn new(events: Vec<Ev>, processed: Option<Mark>) -> Self {
        Self {
            format: FORMAT,
            events,
            processed,
            sent: Vec::new(),
            confirmed: Vec::new(),
            outbox_incarnation: None,
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode(self)
    }

    /// Decodes an entry; a format this version does not know is an error, never guessed at.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        check_format(bytes)?;
        codec::decode(bytes).map_err(|e| e.to_string())
    }
}

/// A snapshot as written: borrows the state and the outbox.
#[derive(Serialize)]
pub(crate) struct SnapshotOut<'a, S> {
    format: u8,
    pub state: &'a S,
    pub delivered: Vec<WindowRecord<IncarnationId>>,
    pub outbox: &'a OutboxState,
}

impl<'a, S: Serialize> SnapshotOut<'a, S> {
    pub fn new(
        state: &'a S,
        delivered: Vec<WindowRecord<IncarnationId>>,
        outbox: &'a OutboxState,
    ) -> Self {
        Self {
            format: FORMAT,
            state,
            delivered,
            outbox,
        }
    }

    /// Encodes the snapshot in one pass (a large state is serialized once, not sized
    /// first), at most `limit` bytes long.
    pub fn encode(&self, limit: u64) -> Result<Vec<u8>, CodecError> {
        codec::encode_in_one_pass(self, limit)
    }
}

/// A snapshot as read (the same fields, owned).
#[derive(Deserialize)]
pub(crate) struct SnapshotIn<S> {
    #[allow(dead_code)] // checked by `check_format` before decoding
    format: u8,
    pub state: S,
    pub delivered: Vec<WindowRecord<IncarnationId>>,
    pub outbox: OutboxState,
}

impl<S: DeserializeOwned> SnapshotIn<S> {
    /// Decodes a stored snapshot whatever its size: its bytes are in memory already (the
    /// journal bounds them), and decoding a slice checks every length prefix against the
    /// bytes that remain. A snapshot written under a larger `max_snapshot_bytes` than the one
    /// configured now still recovers.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        check_format(bytes)?;
        codec::decode_with_limit(bytes, bytes.len() as u64).map_err(|e| e.to_string())
    }
}

fn check_format(bytes: &[u8]) -> Result<(), String> {
    match bytes.first() {
        Some(&FORMAT) => Ok(()),
        Some(other) => Err(format!(
            "written in format {other}, this version reads format {FORMAT}"
        )),
        None => Err("empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::envelope::ProducerId;

    #[test]
    fn entries_round_trip_with_their_mark() {
        let mark = Mark {
            producer_id: ProducerId::from("p"),
            incarnation: IncarnationId::from_u128(3),
            seq: 7,
            window_start: 5,
        };
        let bytes = Entry::new(vec![1u32, 2], Some(mark.clone()))
            .encode()
            .unwrap();
        let entry = Entry::<u32>::decode(&bytes).unwrap();
        assert_eq!((entry.events, entry.processed), (vec![1, 2], Some(mark)));
    }

    #[test]
    fn a_foreign_format_or_garbage_is_an_error_not_a_guess() {
        let mut bytes = Entry::new(vec![1u32], None).encode().unwrap();
        bytes[0] = 2;
        assert!(Entry::<u32>::decode(&bytes)
            .unwrap_err()
            .contains("format 2"));
        assert!(Entry::<u32>::decode(&[]).is_err());
        assert!(Entry::<String>::decode(&[FORMAT, 1, 200]).is_err());
    }

    #[test]
    fn snapshots_round_trip() {
        let records = vec![WindowRecord {
            producer_id: ProducerId::from("p"),
            incarnation: IncarnationId::from_u128(1),
            floor: 2,
            contiguous: 4,
            above: vec![6],
        }];
        let bytes = SnapshotOut::new(
            &"state".to_string(),
            records.clone(),
            &OutboxState::default(),
        )
        .encode(codec::MAX_ENCODED_BYTES)
        .unwrap();
        let snapshot = SnapshotIn::<String>::decode(&bytes).unwrap();
        assert_eq!(
            (snapshot.state.as_str(), snapshot.delivered),
            ("state", records)
        );
    }

    #[test]
    fn snapshots_have_their_own_limit_beyond_the_codecs_default() {
        let state = vec![1u8; codec::MAX_ENCODED_BYTES as usize + 1];
        let outbox = OutboxState::default();
        let snapshot = SnapshotOut::new(&state, Vec::new(), &outbox);
        assert_eq!(
            snapshot.encode(codec::MAX_ENCODED_BYTES).unwrap_err(),
            CodecError::TooLarge {
                limit: codec::MAX_ENCODED_BYTES
            }
        );
        let bytes = snapshot.encode(2 * codec::MAX_ENCODED_BYTES).unwrap();
        assert_eq!(SnapshotIn::<Vec<u8>>::decode(&bytes).unwrap().state, state);
    }
}
