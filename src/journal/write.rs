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
