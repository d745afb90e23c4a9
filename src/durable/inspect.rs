//! What a durable producer's stream holds, read from the journal's storage by a
//! [`JournalInspector`] (without running the producer): its owner, its openings, and the
//! messages stored and not yet settled, with when each was stored.
//!
//! The stream is read as the producer reads it when it opens: its snapshot and entries go
//! through the same recovery and the log's own decision of what an opening would send again, so
//! the inspector never re-implements the log's format. When each message was stored is the
//! commit time of the entry that stored it; a message stored before the stream's snapshot,
//! whose entry was compacted away, was stored no later than that snapshot.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_delivery_proto::durable::inspect::pending;
use actix_delivery_proto::persistence::core::Recovery;
use actix_delivery_proto::persistence::inspect::decode_events;

use crate::durable::log::{type_names, LogEvent, ProducerLog};
use crate::journal::{InspectedEvent, JournalError, JournalInspector, PersistenceId, StreamInfo};
use crate::persistence::{EventSourced, PersistentConfig};
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::IncarnationId;

/// Entries read per page.
const PAGE: usize = 512;

/// A durable producer's stream, as [`read_durable_stream`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurableStreamInfo {
    /// The stream.
    pub persistence_id: PersistenceId,
    /// The producer id that owns it.
    pub producer_id: String,
    /// The public identifier of the incarnation it sends under (the incarnation itself is a
    /// credential, and is not shown).
    pub incarnation: IncarnationId,
    /// The type of its messages, from the names its entries are stored under (`None` for a
    /// stream written before the names held it).
    pub message_type: Option<String>,
    /// How often it was opened (each start of a producer opens it).
    pub openings: u64,
    /// The seq its next message gets.
    pub next_seq: u64,
    /// The messages stored and not yet settled (confirmed or given up), ascending: what its
    /// next opening sends again.
    pub unconfirmed: Vec<UnconfirmedMessage>,
    /// Chunked messages of which only some chunks were stored (the producer ended while
    /// storing them): never sent; the next opening records them settled.
    pub partly_stored: Vec<ChunkHeader>,
}

/// A message stored and not yet settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnconfirmedMessage {
    /// Its seq (a chunked message's last chunk's, as it is confirmed).
    pub seq: u64,
    /// Its first seq: `seq` unless it is chunked.
    pub first_seq: u64,
    /// Its stored size in bytes (all its chunks).
    pub bytes: u64,
    /// When it was stored.
    pub stored: StoredWhen,
}

/// When an unconfirmed message was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredWhen {
    /// When the entry that stored it was committed.
    At(SystemTime),
    /// No later than this: its entry was compacted into the snapshot written then.
    NotAfter(SystemTime),
}

impl StoredWhen {
    /// The time it says (exact or the bound).
    pub fn time(self) -> SystemTime {
        match self {
            Self::At(time) | Self::NotAfter(time) => time,
        }
    }
}

/// Whether `stream` is a durable producer's, by the type name of its newest entry or
/// snapshot.
pub fn is_durable_stream(stream: &StreamInfo) -> bool {
    stream
        .type_name
        .as_deref()
        .is_some_and(|name| log_name(name).is_some())
}

/// The names of a producer log's entries and snapshots, without a message type: the names
/// streams were stored under before the names held it, and the front of every name since.
fn log_prefixes() -> [String; 2] {
    let names = type_names("", &[]);
    [names.events(), names.state()].map(|name| name.trim_end_matches("<>").to_owned())
}

/// `Some(message type)` if `name` is a producer log's (`Some(None)` for a name without
/// one), `None` if it is another type's.
fn log_name(name: &str) -> Option<Option<&str>> {
    log_prefixes().iter().find_map(|prefix| {
        let rest = name.strip_prefix(prefix.as_str())?;
        if rest.is_empty() {
            return Some(None);
        }
        rest.strip_prefix('<')?.strip_suffix('>').map(Some)
    })
}

/// What the durable producer's stream `id` holds, read through `inspector`; `None` if the
/// stream is not a durable producer's (by the names its entries and snapshot are stored
/// under) or holds nothing.
///
/// # Errors
/// The inspector's errors; [`JournalError::Corrupt`] or [`JournalError::Incompatible`] for a
/// stream the producer could not open either (entries missing, undecodable, contradicting each
/// other, of a newer version of the log).
pub async fn read_durable_stream(
    inspector: &dyn JournalInspector,
    id: &PersistenceId,
) -> Result<Option<DurableStreamInfo>, JournalError> {
    let Some(stream) = inspector.stream(id).await? else {
        return Ok(None);
    };
    if !is_durable_stream(&stream) {
        return Ok(None);
    }
    let snapshot = inspector.snapshot(id).await?;
    // From the first event if every entry is still stored (each message's own time is then
    // known), else from the snapshot.
    let use_snapshot = stream.first_stored != Some(1);
    let snapshot = snapshot.filter(|_| use_snapshot);
    let snapshot_at = snapshot.as_ref().map(|snapshot| snapshot.written_at);

    let mut events: Vec<InspectedEvent> = Vec::new();
    let config = PersistentConfig::default();
    let from = snapshot.as_ref().map_or(1, |s| s.snapshot.seq + 1);
    let mut next = from;
    while next <= stream.highest_seq {
        let page = inspector.events(id, next, PAGE).await?;
        let Some(last) = page.last() else { break };
        next = last.event.seq + 1;
        events.extend(page);
    }

    // The names: the newest message type the stream names, the others as former ones.
    let mut message_types = Vec::new();
    let names = snapshot
        .iter()
        .map(|s| s.snapshot.manifest.name())
        .chain(events.iter().map(|e| e.event.manifest.name()));
    for name in names {
        if let Some(Some(message)) = log_name(name)
            && !message_types.iter().any(|known| known == message)
        {
            message_types.push(message.to_owned());
        }
    }
    let message_type = message_types.last().cloned();
    let former = message_types[..message_types.len().saturating_sub(1)].to_vec();
    let names = type_names(message_type.as_deref().unwrap_or(""), &former);

    let mut recovery = Recovery::<ProducerLog>::new(id.clone(), &config, names, Instant::now());
    let from_seq = recovery.restore_snapshot(snapshot.map(|s| s.snapshot), &config)?;
    let mut stored_at = BTreeMap::new();
    for inspected in events {
        if inspected.event.seq < from_seq {
            continue;
        }
        // Which messages this entry stored: its events, read as the log reads them.
        let entry = &inspected.event;
        if let Ok(logged) = decode_events::<LogEvent>(
            &entry.payload,
            &entry.manifest,
            ProducerLog::EVENT_VERSION,
            ProducerLog::upcast_events,
        ) {
            for event in logged {
                if let LogEvent::Stored { seq, .. } | LogEvent::StoredChunk { seq, .. } = event {
                    stored_at.insert(seq, inspected.written_at);
                }
            }
        }
        recovery.apply(inspected.event)?;
    }
    let log = recovery.finish(stream.highest_seq)?.state;

    // What an opening would send again: the log's own decision.
    let pending = pending(&log).map_err(|refusal| JournalError::Corrupt {
        persistence_id: id.clone(),
        seq: stream.highest_seq,
        reason: refusal.to_string(),
    })?;
    let Some(pending) = pending else {
        return Ok(None);
    };
    let unconfirmed = pending
        .messages
        .iter()
        .map(|message| UnconfirmedMessage {
            seq: message.seq,
            first_seq: message.first_seq,
            bytes: message.bytes,
            stored: match (stored_at.get(&message.first_seq), snapshot_at) {
                (Some(&at), _) => StoredWhen::At(at),
                (None, Some(snapshot)) => StoredWhen::NotAfter(snapshot),
                // Neither: an entry the recovery read but whose events did not decode here.
                (None, None) => StoredWhen::NotAfter(stream.last_written_at.unwrap_or(UNIX_EPOCH)),
            },
        })
        .collect();
    Ok(Some(DurableStreamInfo {
        persistence_id: id.clone(),
        producer_id: pending.producer_id,
        incarnation: pending.incarnation.id(),
        message_type,
        openings: pending.openings,
        next_seq: pending.next_seq,
        unconfirmed,
        partly_stored: pending.partly_stored,
    }))
}
