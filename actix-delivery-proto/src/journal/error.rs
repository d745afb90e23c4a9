//! Why a journal operation failed.

use std::fmt;

use crate::journal::id::{PersistenceId, PersistenceIdError};

/// Why a `Journal` operation failed. Names the stream and seq
/// where they apply. `Clone`, so one failure can be handed to every caller it concerns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A persistence id that is empty, longer than the limit or holds a NUL character.
    #[error(transparent)]
    InvalidPersistenceId(#[from] PersistenceIdError),
    /// An append at a seq that is not the stream's next one: another writer got there first
    /// (or this one lost track). Nothing of the append was written. Catch up by replaying
    /// from the seq after yours up to `highest_seq`.
    #[error(
        "stream `{persistence_id}`: append at seq {first_seq} refused, the stream's highest \
         seq is {highest_seq} (another writer?)"
    )]
    Conflict {
        /// The stream.
        persistence_id: PersistenceId,
        /// The seq the refused append started at.
        first_seq: u64,
        /// The highest seq the stream actually has.
        highest_seq: u64,
    },
    /// An argument outside what the operation accepts (a seq of 0 or above
    /// `MAX_SEQ`, a snapshot of a seq not yet written, an option
    /// of 0). Nothing was written.
    #[error("invalid argument{}: {reason}", on_stream(.persistence_id))]
    InvalidArgument {
        /// The stream, if the argument concerned one.
        persistence_id: Option<PersistenceId>,
        /// What is wrong.
        reason: String,
    },
    /// The storage failed: an I/O error, a full disk, a read-only file, a lost connection.
    /// The operation may or may not have taken effect (a commit whose fsync failed may still
    /// be on disk), but it was never reported as done: re-read the stream before going on.
    #[error("storage error{}: {message}", on_stream(.persistence_id))]
    Storage {
        /// The stream the failed operation concerned, if any.
        persistence_id: Option<PersistenceId>,
        /// What the storage reported, with its causes (SQLite's extended result code,
        /// PostgreSQL's message, detail and SQLSTATE, an I/O error's).
        message: String,
    },
    /// A stored event or snapshot that cannot be read back as written (a missing seq in the
    /// middle of a stream, a value of the wrong type). Never skipped silently.
    #[error("stream `{persistence_id}`, seq {seq}: corrupt journal data: {reason}")]
    Corrupt {
        /// The stream.
        persistence_id: PersistenceId,
        /// The seq of the unreadable (or missing) event or snapshot.
        seq: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A stored event or snapshot written in a version of its type this code cannot read: a
    /// newer one (the code was rolled back), an older one without an upcaster, or one the
    /// upcaster refused. Fail-stop: nothing is skipped, nothing is written; deploy code that
    /// reads it (or add the upcaster) and start again.
    #[error(
        "stream `{persistence_id}`, seq {seq}: written in a schema this code cannot read: {reason}"
    )]
    Incompatible {
        /// The stream.
        persistence_id: PersistenceId,
        /// The seq of the event (or snapshot).
        seq: u64,
        /// The versions involved and what is wrong.
        reason: String,
    },
    /// A stored event or snapshot of another type than the reader's, by the type name stored
    /// with it (its [`Manifest`](crate::codec::Manifest)): the stream belongs to another
    /// application, or the type was moved or renamed and its former name not declared
    /// ([`EventSourced::FORMER_TYPE_NAMES`](crate::persistence::behavior::EventSourced::FORMER_TYPE_NAMES),
    /// `DurableOptions::accept_type_name`).
    /// Fail-stop: nothing of it is read, nothing is written; start the right application on
    /// it, or declare the former name.
    #[error(
        "stream `{persistence_id}`, seq {seq}: stored as `{stored}`, and this code reads \
         `{expected}`: another application's data is refused (a type moved or renamed reads \
         its stream once its former name is declared)"
    )]
    ForeignType {
        /// The stream.
        persistence_id: PersistenceId,
        /// The seq of the event (or snapshot).
        seq: u64,
        /// The type name stored.
        stored: String,
        /// The type name the reader reads.
        expected: String,
    },
    /// The database was written by a newer version of this crate, or by something else, or
    /// its tables were altered by hand (a column or table missing, a column of another type;
    /// `found` keeps the server's message): it is left untouched, and retrying does not help.
    #[error(
        "journal schema mismatch: found {found}, expected {expected}; the database was not used"
    )]
    Schema {
        /// What the database holds.
        found: String,
        /// What this version of the crate reads and writes.
        expected: String,
    },
    /// The journal has shut down (its last handle was dropped, or its worker thread is gone).
    #[error("the journal is closed")]
    Closed,
    /// The journal does not do what was asked (a journal outside this crate that stores no
    /// tags, say): nothing was written.
    #[error("this journal does not support {0}")]
    Unsupported(String),
}

impl JournalError {
    /// A [`JournalError::Storage`] error.
    pub fn storage(persistence_id: Option<&PersistenceId>, message: impl fmt::Display) -> Self {
        Self::Storage {
            persistence_id: persistence_id.cloned(),
            message: message.to_string(),
        }
    }

    /// A [`JournalError::InvalidArgument`] error about a stream.
    pub fn invalid(persistence_id: &PersistenceId, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            persistence_id: Some(persistence_id.clone()),
            reason: reason.into(),
        }
    }
}

fn on_stream(persistence_id: &Option<PersistenceId>) -> OnStream<'_> {
    OnStream(persistence_id.as_ref())
}

struct OnStream<'a>(Option<&'a PersistenceId>);

impl fmt::Display for OnStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, " on stream `{id}`"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_stream_and_seq() {
        let id = PersistenceId::new("order-7").unwrap();
        let conflict = JournalError::Conflict {
            persistence_id: id.clone(),
            first_seq: 4,
            highest_seq: 9,
        };
        assert_eq!(
            conflict.to_string(),
            "stream `order-7`: append at seq 4 refused, the stream's highest seq is 9 (another writer?)"
        );
        assert_eq!(
            JournalError::storage(Some(&id), "disk full").to_string(),
            "storage error on stream `order-7`: disk full"
        );
        assert_eq!(
            JournalError::storage(None, "disk full").to_string(),
            "storage error: disk full"
        );
        assert_eq!(
            JournalError::invalid(&id, "seq 0").to_string(),
            "invalid argument on stream `order-7`: seq 0"
        );
    }
}
