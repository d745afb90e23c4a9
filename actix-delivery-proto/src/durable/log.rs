//! What a durable producer stores: its identity, every message before its first transmission,
//! and which messages were settled. An [`EventSourced`] entity, so the persistent actor gives
//! it batching, snapshots (with the settled messages deleted) and recovery.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{self, Codec, CodecError, Manifest, UpcastError, Written};
use crate::persistence::behavior::{Decision, EventSourced};
use crate::persistence::type_names::TypeNames;
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::Incarnation;

/// A durable producer's journal state: who it is, which opening of the stream owns it, the
/// next seq, and the messages stored but not yet settled (their stored bodies, see
/// [`encode_body`]). A snapshot of it is O(unsettled).
///
/// Version 3 of its events and state: a message of a producer with `chunk_size` is stored
/// chunk by chunk, each under its seq with its message's chunk header (a message is whole
/// once all its chunks are stored; opening the stream drops one that is not, see
/// [`LogReply::Opened`]). Version 2: bodies start with their codec and the message type's
/// version. Version 1 (before manifests) stored bare bincode bodies; [`ProducerLog`]'s
/// upcasters add the header bincode, version 1 to them.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ProducerLog {
    identity: Option<(String, Incarnation)>,
    /// How often the stream was opened: the latest opening owns it.
    epoch: u64,
    /// The seq the next stored message gets (from 1).
    next_seq: u64,
    unsettled: BTreeMap<u64, Vec<u8>>,
    /// The chunk header of each unsettled seq that is a chunk of a message.
    chunks: BTreeMap<u64, ChunkHeader>,
    /// What a recovered event contradicted: the stream is corrupt, every command is refused
    /// (so nothing is written, and no snapshot carries it).
    #[serde(skip)]
    corrupt: Option<String>,
}

/// The type names the log's entries and snapshots were stored under before they named the
/// producer's message type ([`std::any::type_name`] of [`LogEvent`] and [`ProducerLog`] then):
/// whose messages such a stream holds is unknown, so it is read.
const LOG_EVENTS: &str = "actix_delivery::durable::log::LogEvent";
const LOG_STATE: &str = "actix_delivery::durable::log::ProducerLog";

/// The names of the log of a producer of messages of type `message` (its
/// [`std::any::type_name`]): `<log type><message type>`, so that the stream says whose
/// messages it holds and a producer of another type is refused. It reads its own, those of
/// its messages' `former` names, and those written before the names held the message type.
pub fn type_names(message: &str, former: &[String]) -> TypeNames {
    let named = |log: &str, message: &str| format!("{log}<{message}>");
    let former_names = former
        .iter()
        .flat_map(|old| [named(LOG_EVENTS, old), named(LOG_STATE, old)])
        .chain([LOG_EVENTS.to_owned(), LOG_STATE.to_owned()]);
    TypeNames::new(
        named(LOG_EVENTS, message),
        named(LOG_STATE, message),
        former_names,
    )
}

/// What the producer asks of its log.
#[derive(Debug)]
pub enum LogCommand {
    /// Opens the stream as producer `producer_id` and takes it over (a new stream takes
    /// `incarnation`). `reopening: (epoch, unsure)`: a producer restarted after a journal
    /// failure, whose last opening was `epoch`, followed by `unsure` openings of unknown
    /// outcome; refused if another producer's opening may have come after it.
    Open {
        /// The producer's id.
        producer_id: String,
        /// The incarnation a new stream takes.
        incarnation: Incarnation,
        /// `(epoch, unsure)` of a producer restarted after a journal failure.
        reopening: Option<(u64, u64)>,
        /// The version of the whole messages the producer reads, and of the chunked ones if
        /// it chunks: a stream holding newer ones (the code was rolled back) is refused before
        /// anything is written.
        message_version: u32,
        /// The version of the chunked messages it reads, if it chunks.
        chunk_version: Option<u32>,
    },
    /// Stores messages `first_seq..`, for the opening `epoch` (refused once another opening
    /// took the stream over).
    Store {
        /// The opening that stores them.
        epoch: u64,
        /// The seq of the first body.
        first_seq: u64,
        /// The encoded messages.
        bodies: Vec<Vec<u8>>,
    },
    /// Stores chunks `first_seq..` of the message of `chunk`, as `Store` stores messages (a
    /// message's chunks may take several).
    StoreChunks {
        /// The opening that stores them.
        epoch: u64,
        /// The seq of the first chunk.
        first_seq: u64,
        /// The header of the message they are chunks of.
        chunk: ChunkHeader,
        /// The chunks.
        bodies: Vec<Bytes>,
    },
    /// Records messages settled (confirmed or given up): they are not resent. A chunked
    /// message is named by its last seq, and settled with all its chunks.
    Settle {
        /// The opening that records them.
        epoch: u64,
        /// The seqs settled.
        seqs: Vec<u64>,
    },
    /// Writes to the stream, to show that the opening `epoch` is alive (a lease): an empty
    /// settlement, which every version of the log reads. Refused once another opening took
    /// the stream over.
    Renew {
        /// The opening that renews.
        epoch: u64,
    },
}

/// What the log stores in its journal stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LogEvent {
    /// The stream's first event: whose it is, and the incarnation it sends under.
    Created {
        /// The producer's id.
        producer_id: String,
        /// Its incarnation.
        incarnation: Incarnation,
    },
    /// A producer opened the stream: from now on it is the owner.
    Opened {
        /// The opening's number.
        epoch: u64,
    },
    /// One message (an event each, so compaction counts messages).
    Stored {
        /// Its seq.
        seq: u64,
        /// The encoded message.
        #[serde(with = "bytes_field")]
        body: Vec<u8>,
    },
    /// Messages settled (confirmed or given up).
    Settled {
        /// Their seqs (a chunked message's last).
        seqs: Vec<u64>,
    },
    /// One chunk of a message (version 3 on).
    StoredChunk {
        /// Its seq.
        seq: u64,
        /// The header of its message.
        chunk: ChunkHeader,
        /// The chunk.
        #[serde(with = "bytes_field")]
        body: Vec<u8>,
    },
}

/// A chunked message as stored: its header and its chunks.
pub type StoredChunks = (ChunkHeader, Vec<Vec<u8>>);

/// What the log answers.
#[derive(Debug)]
pub enum LogReply {
    /// The stream is open: the producer's incarnation, its next seq, and the messages to send
    /// again (ascending): whole ones, and chunked ones with every chunk stored. A chunked
    /// message of which only some chunks were stored (the producer ended while storing it)
    /// was never sent: the opening records it settled and names it in `dropped`.
    Opened {
        /// This opening's number.
        epoch: u64,
        /// The incarnation to send under.
        incarnation: Incarnation,
        /// The seq of the next new message.
        next_seq: u64,
        /// Whole messages to send again, by seq.
        unsettled: Vec<(u64, Vec<u8>)>,
        /// Chunked messages to send again.
        chunked: Vec<StoredChunks>,
        /// Chunked messages only partly stored, recorded settled.
        dropped: Vec<ChunkHeader>,
    },
    /// Stored or recorded.
    Done,
}

/// Why the log refused a command.
#[derive(Debug, thiserror::Error)]
pub enum LogRefusal {
    /// Not open, or the producer lost track of its seqs.
    #[error("{0}")]
    Refused(String),
    /// The stream belongs to another producer id.
    #[error("the stream belongs to producer `{owner}`, not `{producer_id}`")]
    OtherProducer {
        /// The id that owns it.
        owner: String,
        /// The id that asked.
        producer_id: String,
    },
    /// Another producer opened the stream after this one: it owns it now.
    #[error(
        "another producer opened this stream after this one (opening {current}, this one \
         {ours}): the newest opener owns the stream, this one stops"
    )]
    TakenOver {
        /// The asking producer's opening.
        ours: u64,
        /// The owner's opening.
        current: u64,
    },
    /// The recovered stream contradicts itself.
    #[error("the stream is corrupt: {0}")]
    Corrupt(String),
    /// The stream holds a message of a newer version than the producer reads.
    #[error("written in a schema this code cannot read: {0}")]
    Newer(String),
}

impl EventSourced for ProducerLog {
    type Command = LogCommand;
    type Event = LogEvent;
    type Reply = LogReply;
    type Rejection = LogRefusal;

    const EVENT_VERSION: u32 = 3;
    const STATE_VERSION: u32 = 3;

    /// Versions 1 and 2 have the events of version 3 but `StoredChunk`; version 1's bodies
    /// get their header.
    fn upcast_events(old: Written<'_>) -> Result<Vec<LogEvent>, UpcastError> {
        let legacy = old.version() == 1;
        let mut events: Vec<LogEvent> = old.decode()?;
        for event in &mut events {
            if let (LogEvent::Stored { body, .. }, true) = (event, legacy) {
                *body = legacy_body(std::mem::take(body));
            }
        }
        Ok(events)
    }

    /// Versions 1 and 2 have the state of version 3 but the chunks; version 1's bodies get
    /// their header.
    fn upcast_state(old: Written<'_>) -> Result<Self, UpcastError> {
        #[derive(Deserialize)]
        struct Before3 {
            identity: Option<(String, Incarnation)>,
            epoch: u64,
            next_seq: u64,
            unsettled: BTreeMap<u64, Vec<u8>>,
        }
        let legacy = old.version() == 1;
        let mut log: Before3 = old.decode()?;
        if legacy {
            for body in log.unsettled.values_mut() {
                *body = legacy_body(std::mem::take(body));
            }
        }
        Ok(Self {
            identity: log.identity,
            epoch: log.epoch,
            next_seq: log.next_seq,
            unsettled: log.unsettled,
            ..Self::default()
        })
    }

    fn decide(&self, command: &LogCommand) -> Result<Decision<Self>, LogRefusal> {
        if let Some(reason) = &self.corrupt {
            return Err(LogRefusal::Corrupt(reason.clone()));
        }
        match command {
            LogCommand::Open {
                producer_id,
                incarnation,
                reopening,
                message_version,
                chunk_version,
            } => {
                self.check_versions(*message_version, *chunk_version)?;
                if let Some((ours, unsure)) = *reopening
                    && (self.epoch < ours || self.epoch - ours > unsure)
                {
                    let current = self.epoch;
                    return Err(LogRefusal::TakenOver { ours, current });
                }
                self.open(producer_id, *incarnation)
            }
            LogCommand::Store {
                epoch,
                first_seq,
                bodies,
            } => {
                self.check_store(*epoch, *first_seq)?;
                let events = (*first_seq..)
                    .zip(bodies)
                    .map(|(seq, body)| LogEvent::Stored {
                        seq,
                        body: body.clone(),
                    });
                Ok(Decision::persist(events, LogReply::Done))
            }
            LogCommand::StoreChunks {
                epoch,
                first_seq,
                chunk,
                bodies,
            } => {
                self.check_store(*epoch, *first_seq)?;
                let events = (*first_seq..)
                    .zip(bodies)
                    .map(|(seq, body)| LogEvent::StoredChunk {
                        seq,
                        chunk: *chunk,
                        body: body.to_vec(),
                    });
                Ok(Decision::persist(events, LogReply::Done))
            }
            LogCommand::Settle { epoch, seqs } => {
                self.check_owner(*epoch)?;
                let seqs: Vec<u64> = seqs
                    .iter()
                    .flat_map(|&seq| match self.chunks.get(&seq) {
                        Some(chunk) => chunk.first_seq..=chunk.last_seq(),
                        None => seq..=seq,
                    })
                    .filter(|seq| self.unsettled.contains_key(seq))
                    .collect();
                if seqs.is_empty() {
                    return Ok(Decision::reply(LogReply::Done));
                }
                Ok(Decision::persist(
                    [LogEvent::Settled { seqs }],
                    LogReply::Done,
                ))
            }
            LogCommand::Renew { epoch } => {
                self.check_owner(*epoch)?;
                let renewal = LogEvent::Settled { seqs: Vec::new() };
                Ok(Decision::persist([renewal], LogReply::Done))
            }
        }
    }

    /// A snapshot holds every unsettled message: take one only after as many writes.
    fn snapshot_weight(&self) -> u64 {
        self.unsettled.len() as u64
    }

    fn apply(&mut self, event: &LogEvent) {
        if self.corrupt.is_some() {
            return;
        }
        match event {
            LogEvent::Created {
                producer_id,
                incarnation,
            } => {
                if self.identity.is_some() {
                    return self.contradicted("the stream is created a second time".into());
                }
                self.identity = Some((producer_id.clone(), *incarnation));
                self.next_seq = 1;
            }
            LogEvent::Opened { epoch } => {
                if self.identity.is_none() || *epoch != self.epoch + 1 {
                    let found = format!("opening {epoch} follows opening {}", self.epoch);
                    return self.contradicted(found);
                }
                self.epoch = *epoch;
            }
            LogEvent::Stored { seq, body } => self.store(*seq, body, None),
            LogEvent::StoredChunk { seq, chunk, body } => self.store(*seq, body, Some(*chunk)),
            LogEvent::Settled { seqs } => {
                for seq in seqs {
                    self.unsettled.remove(seq);
                    self.chunks.remove(seq);
                }
            }
        }
    }
}

/// What an opening finds unsettled in the stream.
struct Unsettled {
    /// Whole messages, by seq.
    whole: Vec<(u64, Vec<u8>)>,
    /// Chunked messages with every chunk stored.
    chunked: Vec<StoredChunks>,
    /// Chunked messages with chunks missing, with the seqs of those stored.
    partial: Vec<(ChunkHeader, Vec<u64>)>,
}

impl ProducerLog {
    /// Applies a stored message or chunk (`chunk`) under `seq`.
    fn store(&mut self, seq: u64, body: &[u8], chunk: Option<ChunkHeader>) {
        if self.identity.is_none() || seq != self.next_seq {
            let found = format!(
                "stored message {seq} follows message {}",
                self.next_seq.saturating_sub(1)
            );
            return self.contradicted(found);
        }
        self.unsettled.insert(seq, body.to_vec());
        if let Some(chunk) = chunk {
            self.chunks.insert(seq, chunk);
        }
        self.next_seq = seq + 1;
    }

    /// Whether the opening `epoch` may store from `first_seq` on.
    fn check_store(&self, epoch: u64, first_seq: u64) -> Result<(), LogRefusal> {
        self.check_owner(epoch)?;
        if first_seq != self.next_seq {
            return Err(LogRefusal::Refused(format!(
                "the producer lost track of its seqs: the stream stored up to seq {}, the \
                 producer expected to store seq {first_seq} next",
                self.next_seq - 1
            )));
        }
        Ok(())
    }

    /// The unsettled messages, sorted by how much of them is stored.
    fn unsettled_messages(&self) -> Unsettled {
        let (mut whole, mut chunked, mut partial) = (Vec::new(), Vec::new(), Vec::new());
        let mut current: Option<(ChunkHeader, Vec<u64>)> = None;
        let mut flush = |message: Option<(ChunkHeader, Vec<u64>)>| {
            if let Some((header, seqs)) = message {
                if seqs.len() == header.chunks as usize {
                    let bodies = seqs.iter().map(|seq| self.unsettled[seq].clone());
                    chunked.push((header, bodies.collect()));
                } else {
                    partial.push((header, seqs));
                }
            }
        };
        for (&seq, body) in &self.unsettled {
            let Some(&header) = self.chunks.get(&seq) else {
                flush(current.take());
                whole.push((seq, body.clone()));
                continue;
            };
            match &mut current {
                Some((of, seqs)) if *of == header && header.index_of(seq).is_some() => {
                    seqs.push(seq);
                }
                _ => {
                    flush(current.take());
                    current = Some((header, vec![seq]));
                }
            }
        }
        flush(current);
        Unsettled {
            whole,
            chunked,
            partial,
        }
    }

    /// Opens the stream for `producer_id`, creating it if it is new: the opening takes the
    /// stream over (a process cannot tell a live predecessor from a dead one, so the newest
    /// opener wins and the one before it is refused at its next write).
    fn open(
        &self,
        producer_id: &str,
        incarnation: Incarnation,
    ) -> Result<Decision<Self>, LogRefusal> {
        let epoch = self.epoch + 1;
        let opened = LogEvent::Opened { epoch };
        match &self.identity {
            None => Ok(Decision::persist(
                [
                    LogEvent::Created {
                        producer_id: producer_id.to_owned(),
                        incarnation,
                    },
                    opened,
                ],
                LogReply::Opened {
                    epoch,
                    incarnation,
                    next_seq: 1,
                    unsettled: Vec::new(),
                    chunked: Vec::new(),
                    dropped: Vec::new(),
                },
            )),
            Some((owner, _)) if owner != producer_id => Err(LogRefusal::OtherProducer {
                owner: owner.clone(),
                producer_id: producer_id.to_owned(),
            }),
            Some((_, incarnation)) => {
                let Unsettled {
                    whole: unsettled,
                    chunked,
                    partial,
                } = self.unsettled_messages();
                let dropped_seqs: Vec<u64> = partial
                    .iter()
                    .flat_map(|(_, seqs)| seqs.iter().copied())
                    .collect();
                let mut events = vec![opened];
                if !dropped_seqs.is_empty() {
                    events.push(LogEvent::Settled { seqs: dropped_seqs });
                }
                Ok(Decision::persist(
                    events,
                    LogReply::Opened {
                        epoch,
                        incarnation: *incarnation,
                        next_seq: self.next_seq,
                        unsettled,
                        chunked,
                        dropped: partial.into_iter().map(|(header, _)| header).collect(),
                    },
                ))
            }
        }
    }

    /// Refuses a stream holding an unsettled message stored at a newer version than it is
    /// read at (a rollback): `current` for whole messages, `chunked` for chunked ones (their
    /// version is in their first chunk; not checked for a producer that does not chunk, which
    /// refuses them anyway). Opening it would take it over from the newer producer.
    fn check_versions(&self, current: u32, chunked: Option<u32>) -> Result<(), LogRefusal> {
        for (seq, body) in &self.unsettled {
            let (current, named) = match self.chunks.get(seq) {
                None => (current, format!("stored message {seq}")),
                Some(chunk) if chunk.first_seq == *seq => match chunked {
                    Some(chunked) => (
                        chunked,
                        format!(
                            "stored message {} (chunks {seq} to {})",
                            chunk.last_seq(),
                            chunk.last_seq()
                        ),
                    ),
                    None => continue,
                },
                Some(_) => continue, // not the first chunk: no header
            };
            if let Ok(((codec, version), _)) =
                codec::decode_prefix::<(u8, u32)>(body, body.len() as u64)
                && version > current
            {
                let manifest = Manifest::from_stored(codec, "", version);
                return Err(LogRefusal::Newer(format!(
                    "{named} is written as {manifest}, newer than this code's version \
                         {current} (was the code rolled back?)"
                )));
            }
        }
        Ok(())
    }

    /// Whether the opening `epoch` still owns the stream.
    fn check_owner(&self, epoch: u64) -> Result<(), LogRefusal> {
        if self.identity.is_none() {
            return Err(LogRefusal::Refused("the stream is not open".into()));
        }
        if epoch != self.epoch {
            return Err(LogRefusal::TakenOver {
                ours: epoch,
                current: self.epoch,
            });
        }
        Ok(())
    }

    fn contradicted(&mut self, found: String) {
        self.corrupt = Some(found);
    }
}

/// A message as a durable producer stores it: its codec and the version of its type (in
/// bincode, two bytes for small versions), then its encoding in that codec, at most `limit`
/// bytes in all.
pub fn encode_body<T: Serialize>(
    body: &T,
    codec: Codec,
    version: u32,
    limit: u64,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    codec::encode_into(&(codec.id(), version), &mut out)?;
    let left = limit.saturating_sub(out.len() as u64);
    codec
        .encode_into(body, &mut out, left)
        .map_err(|err| match err {
            CodecError::TooLarge { .. } => CodecError::TooLarge { limit },
            other => other,
        })?;
    Ok(out)
}

/// Reads a stored message (see [`encode_body`]) as a `T` of version `current`: directly if it
/// was stored at that version, through `upcast` if at an older one.
///
/// # Errors
/// Why not: a malformed header, a newer version, an older one `upcast` cannot read.
pub fn decode_body<T: DeserializeOwned>(
    bytes: &[u8],
    current: u32,
    upcast: fn(Written<'_>) -> Result<T, UpcastError>,
) -> Result<T, String> {
    let limit = bytes.len() as u64;
    let ((codec, version), body) = codec::decode_prefix::<(u8, u32)>(bytes, limit)
        .map_err(|err| format!("its header does not decode: {err}"))?;
    let manifest = Manifest::from_stored(codec, "", version);
    Written::new(&manifest, body, limit)
        .read(current, upcast)
        .map_err(|err| err.to_string())
}

/// A body as bytes, not as a sequence of numbers: in bincode (the log's codec) the very same
/// encoding (a length, then the bytes), written and read at once rather than byte by byte.
mod bytes_field {
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(body: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(body)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        struct Bytes;

        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }

            fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }

            fn visit_byte_buf<E>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(bytes)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(byte) = seq.next_element()? {
                    bytes.push(byte);
                }
                Ok(bytes)
            }
        }

        deserializer.deserialize_byte_buf(Bytes)
    }
}

/// A body as version 1 of the log stored it (bare bincode, no header), with its header.
fn legacy_body(bytes: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 2);
    codec::encode_into(&(Codec::Bincode.id(), 1u32), &mut out).expect("a header encodes");
    out.extend_from_slice(&bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(log: &mut ProducerLog, command: &LogCommand) -> Result<LogReply, String> {
        let decision = log.decide(command).map_err(|e| e.to_string())?;
        for event in &decision.events {
            log.apply(event);
        }
        Ok(decision.reply)
    }

    /// Opens the stream; its epoch.
    fn open(log: &mut ProducerLog, id: &str, incarnation: u128) -> Result<u64, String> {
        let command = LogCommand::Open {
            producer_id: id.into(),
            incarnation: Incarnation::from_u128(incarnation),
            reopening: None,
            message_version: 1,
            chunk_version: Some(1),
        };
        match replay(log, &command)? {
            LogReply::Opened { epoch, .. } => Ok(epoch),
            LogReply::Done => unreachable!(),
        }
    }

    fn store(epoch: u64, first_seq: u64, n: u8) -> LogCommand {
        LogCommand::Store {
            epoch,
            first_seq,
            bodies: (0..n).map(|b| vec![b]).collect(),
        }
    }

    /// The command that opens the stream of "p" again, after its first opening (epoch 1).
    fn reopen_first() -> LogCommand {
        LogCommand::Open {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(2),
            reopening: Some((1, 0)),
            message_version: 1,
            chunk_version: Some(1),
        }
    }

    #[test]
    fn a_stream_keeps_its_incarnation_and_hands_back_what_is_unsettled() {
        let mut log = ProducerLog::default();
        assert_eq!(open(&mut log, "p", 1), Ok(1));
        replay(&mut log, &store(1, 1, 3)).unwrap();
        let settle = |seqs| LogCommand::Settle { epoch: 1, seqs };
        replay(&mut log, &settle(vec![2, 99])).unwrap();
        match replay(&mut log, &reopen_first()).unwrap() {
            LogReply::Opened {
                epoch,
                incarnation,
                next_seq,
                unsettled,
                ..
            } => {
                assert_eq!(epoch, 2);
                assert_eq!(
                    incarnation,
                    Incarnation::from_u128(1),
                    "kept, not the new one"
                );
                assert_eq!(next_seq, 4);
                assert_eq!(unsettled, [(1, vec![0]), (3, vec![2])]);
            }
            other => panic!("{other:?}"),
        }
        // Settling only what is unsettled: nothing to record otherwise.
        let nothing = log.decide(&LogCommand::Settle {
            epoch: 2,
            seqs: vec![2],
        });
        assert!(nothing.unwrap().events.is_empty());
    }

    fn store_chunks(epoch: u64, first_seq: u64, chunk: ChunkHeader, n: u8) -> LogCommand {
        LogCommand::StoreChunks {
            epoch,
            first_seq,
            chunk,
            bodies: (0..n).map(|b| Bytes::from(vec![b])).collect(),
        }
    }

    #[test]
    fn bodies_are_written_as_bytes_in_the_encoding_of_a_sequence_of_numbers() {
        #[derive(Serialize)]
        enum Before {
            _Created,
            _Opened,
            Stored { seq: u64, body: Vec<u8> },
        }
        let body = vec![1, 2, 250, 251, 255];
        let before = codec::encode(&Before::Stored {
            seq: 7,
            body: body.clone(),
        })
        .unwrap();
        let now = LogEvent::Stored { seq: 7, body };
        assert_eq!(codec::encode(&now).unwrap(), before, "the same bytes");
        let read: LogEvent = codec::decode(&before).unwrap();
        assert!(matches!(read, LogEvent::Stored { seq: 7, body } if body == [1, 2, 250, 251, 255]));
    }

    #[test]
    fn a_chunked_message_is_resent_whole_or_if_partly_stored_dropped_and_named() {
        let mut log = ProducerLog::default();
        open(&mut log, "p", 1).unwrap();
        let whole = ChunkHeader {
            first_seq: 1,
            chunks: 3,
            message_len: 3,
        };
        replay(&mut log, &store_chunks(1, 1, whole, 2)).unwrap();
        replay(&mut log, &store_chunks(1, 3, whole, 1)).unwrap();
        let partial = ChunkHeader {
            first_seq: 4,
            chunks: 4,
            message_len: 4,
        };
        replay(&mut log, &store_chunks(1, 4, partial, 2)).unwrap();
        match replay(&mut log, &reopen_first()).unwrap() {
            LogReply::Opened {
                next_seq,
                unsettled,
                chunked,
                dropped,
                ..
            } => {
                assert_eq!(next_seq, 6, "seqs 6 and 7 were never stored nor sent");
                assert!(unsettled.is_empty());
                assert_eq!(chunked, [(whole, vec![vec![0], vec![1], vec![0]])]);
                assert_eq!(dropped, [partial]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            log.unsettled.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3],
            "the partly stored message is recorded settled by the opening"
        );
        // Settled by its last seq: all its chunks go.
        replay(
            &mut log,
            &LogCommand::Settle {
                epoch: 2,
                seqs: vec![3],
            },
        )
        .unwrap();
        assert!(log.unsettled.is_empty() && log.chunks.is_empty());
    }

    #[test]
    fn a_stream_holding_chunked_messages_of_a_newer_version_is_refused_before_it_is_opened() {
        let mut log = ProducerLog::default();
        open(&mut log, "p", 1).unwrap();
        let chunk = ChunkHeader {
            first_seq: 1,
            chunks: 3,
            message_len: 30,
        };
        let mut first = codec::encode(&(Codec::MessagePack.id(), 3u32)).unwrap();
        first.extend([0; 8]);
        let store = LogCommand::StoreChunks {
            epoch: 1,
            first_seq: 1,
            chunk,
            bodies: vec![
                Bytes::from(first),
                Bytes::from(vec![9; 10]),
                Bytes::from(vec![9; 10]),
            ],
        };
        replay(&mut log, &store).unwrap();
        let reopen = |chunk_version| LogCommand::Open {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(1),
            reopening: Some((1, 0)),
            message_version: 1,
            chunk_version,
        };
        let refused = log.decide(&reopen(Some(2))).err().map(|e| e.to_string());
        let refused = refused.expect("newer than version 2");
        for part in ["stored message 3 (chunks 1 to 3)", "version 3", "version 2"] {
            assert!(refused.contains(part), "{part}: {refused}");
        }
        assert!(log.decide(&reopen(Some(3))).is_ok());
        assert!(
            log.decide(&reopen(None)).is_ok(),
            "a producer without chunks refuses the stream for holding chunks, later"
        );
    }

    #[test]
    fn a_renewal_is_an_empty_settlement_written_by_the_owner_only() {
        let mut log = ProducerLog::default();
        let first = open(&mut log, "p", 1).unwrap();
        replay(&mut log, &store(first, 1, 2)).unwrap();
        let renewal = log.decide(&LogCommand::Renew { epoch: first }).unwrap();
        assert!(
            matches!(&renewal.events[..], [LogEvent::Settled { seqs }] if seqs.is_empty()),
            "{:?}",
            renewal.events
        );
        replay(&mut log, &LogCommand::Renew { epoch: first }).unwrap();
        assert_eq!(log.unsettled.len(), 2, "it settles nothing");
        let second = open(&mut log, "p", 1).unwrap();
        let error = replay(&mut log, &LogCommand::Renew { epoch: first }).unwrap_err();
        assert!(
            error.contains("opened this stream after this one"),
            "{error}"
        );
        assert!(replay(&mut log, &LogCommand::Renew { epoch: second }).is_ok());
    }

    #[test]
    fn the_newest_opener_owns_the_stream_and_another_producer_id_is_refused() {
        let mut log = ProducerLog::default();
        let first = open(&mut log, "p", 1).unwrap();
        replay(&mut log, &store(first, 1, 1)).unwrap();
        let second = open(&mut log, "p", 1).unwrap();
        let error = replay(&mut log, &store(first, 2, 1)).unwrap_err();
        assert!(
            error.contains("opened this stream after this one"),
            "{error}"
        );
        let settle = LogCommand::Settle {
            epoch: first,
            seqs: vec![1],
        };
        assert!(
            replay(&mut log, &settle).is_err(),
            "nor records settlements"
        );
        replay(&mut log, &store(second, 2, 1)).unwrap();
        let error = replay(&mut log, &store(second, 2, 1)).unwrap_err();
        assert!(error.contains("lost track of its seqs"), "{error}");
        let error = open(&mut log, "q", 1).unwrap_err();
        assert!(error.contains("belongs to producer `p`"), "{error}");
        // The first opener, restarted after a journal failure, does not take it back.
        let reopening = |unsure| LogCommand::Open {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(1),
            reopening: Some((first, unsure)),
            message_version: 1,
            chunk_version: None,
        };
        let error = replay(&mut log, &reopening(0)).unwrap_err();
        assert!(
            error.contains("opened this stream after this one"),
            "{error}"
        );
        // One opening of its own of unknown outcome: the next one may be its own.
        assert!(replay(&mut log, &reopening(1)).is_ok());
    }

    #[test]
    fn events_that_contradict_the_stream_make_it_corrupt_and_every_command_is_refused() {
        let created = LogEvent::Created {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(1),
        };
        let stored = |seq| LogEvent::Stored { seq, body: vec![1] };
        let cases = [
            (vec![stored(1)], "stored message 1 follows message 0"),
            (
                vec![created.clone(), LogEvent::Opened { epoch: 1 }, stored(2)],
                "stored message 2 follows message 0",
            ),
            (
                vec![
                    created.clone(),
                    LogEvent::Opened { epoch: 1 },
                    stored(1),
                    stored(1),
                ],
                "stored message 1 follows message 1",
            ),
            (
                vec![created.clone(), LogEvent::Opened { epoch: 2 }],
                "opening 2 follows opening 0",
            ),
            (vec![created.clone(), created], "created a second time"),
        ];
        for (events, expected) in cases {
            let mut log = ProducerLog::default();
            for event in &events {
                log.apply(event);
            }
            let error = open(&mut log, "p", 1).unwrap_err();
            assert!(error.contains(expected), "{events:?}: {error}");
            assert!(error.contains("corrupt"), "{error}");
        }
    }

    #[test]
    fn stored_bodies_carry_their_codec_and_version_and_version_1_bodies_are_upcast() {
        fn no_upcast(old: Written<'_>) -> Result<(u32, String), UpcastError> {
            Err(UpcastError::new(format!("none for {}", old.version())))
        }
        let body = (7u32, "seven".to_string());
        for codec in [Codec::Bincode, Codec::MessagePack] {
            let bytes = encode_body(&body, codec, 3, 1024).unwrap();
            assert_eq!(decode_body(&bytes, 3, no_upcast), Ok(body.clone()));
            let newer = decode_body(&bytes, 2, no_upcast).unwrap_err();
            assert!(
                newer.contains("version 3") && newer.contains("version 2"),
                "{newer}"
            );
            assert_eq!(decode_body(&bytes, 4, no_upcast).unwrap_err(), "none for 3");
        }
        let bare = codec::encode(&body).unwrap();
        assert_eq!(
            decode_body(&legacy_body(bare), 1, no_upcast),
            Ok(body.clone())
        );
        assert!(matches!(
            encode_body(&"x".repeat(100), Codec::MessagePack, 1, 50),
            Err(CodecError::TooLarge { limit: 50 })
        ));
        // Version 1 of the log (bare bodies) reads through the log's own upcasters.
        let v1_events = codec::encode(&vec![LogEvent::Stored {
            seq: 1,
            body: codec::encode(&body).unwrap(),
        }])
        .unwrap();
        let manifest = Manifest::legacy();
        let events =
            ProducerLog::upcast_events(Written::new(&manifest, &v1_events, 1 << 20)).unwrap();
        match &events[..] {
            [LogEvent::Stored {
                seq: 1,
                body: stored,
            }] => {
                assert_eq!(decode_body(stored, 1, no_upcast), Ok(body));
            }
            other => panic!("{other:?}"),
        }
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_stored_bodies_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            fn upcast(old: Written<'_>) -> Result<Vec<String>, UpcastError> {
                old.decode()
            }
            let _ = decode_body::<Vec<String>>(&bytes, 2, upcast);
        }
    }
}
