//! A write as the journals' single writers take it: shared by the SQLite and PostgreSQL
//! journals, whose writers batch these into one transaction.

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::codec::Manifest;
use crate::journal::{JournalError, PersistenceId, Snapshot, Tag};

/// One write waiting for a journal's writer.
pub(crate) struct WriteRequest {
    pub(crate) id: PersistenceId,
    pub(crate) op: WriteOp,
    pub(crate) reply: oneshot::Sender<Result<(), JournalError>>,
    /// This write's share of the queue's byte budget, given back when it is done.
    pub(crate) _permit: OwnedSemaphorePermit,
}

/// What a [`WriteRequest`] asks for.
pub(crate) enum WriteOp {
    Append {
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        /// One list per payload (sorted, without repeats), or none at all.
        tags: Vec<Vec<Tag>>,
    },
    DeleteTo {
        to_seq: u64,
    },
    SaveSnapshot(Snapshot),
}

impl WriteOp {
    /// Whether it is an append of tagged events (its commit wakes the readers by tag).
    pub(crate) fn is_tagged(&self) -> bool {
        matches!(self, Self::Append { tags, .. } if !tags.is_empty())
    }

    /// Events, for the batch bound (a delete or a snapshot counts as one).
    pub(crate) fn events(&self) -> usize {
        match self {
            Self::Append { payloads, .. } => payloads.len(),
            Self::DeleteTo { .. } | Self::SaveSnapshot(_) => 1,
        }
    }

    /// Payload bytes, for the batch and queue bounds.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Self::Append { payloads, .. } => payloads.iter().map(Vec::len).sum(),
            Self::DeleteTo { .. } => 0,
            Self::SaveSnapshot(snapshot) => snapshot.payload.len(),
        }
    }
}

/// The span of the transaction that commits `group` in `journal` (the journals of features
/// `sqlite` and `postgres`).
#[cfg(feature = "tracing")]
pub(crate) fn journal_commit(journal: &'static str, group: &[WriteRequest]) -> tracing::Span {
    if !tracing::enabled!(target: "actix_delivery", tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    let stream = group.first().map_or("", |request| request.id.as_str());
    let mut ids: Vec<&str> = group.iter().map(|request| request.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let streams = ids.len();
    let writes = group.len();
    let events: usize = group
        .iter()
        .map(|request| match &request.op {
            WriteOp::Append { payloads, .. } => payloads.len(),
            _ => 0,
        })
        .sum();
    tracing::debug_span!(
        target: "actix_delivery",
        "journal.commit",
        journal,
        stream,
        streams,
        writes,
        events,
    )
}
