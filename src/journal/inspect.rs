//! Reading a journal's storage as it is, without opening the journal: what the command-line
//! inspector (`actix-delivery-cli`) and operators' tools read.
//!
//! The types both inspectors return, and the checks they share; [`JournalInspector`] says
//! what an inspector is.

use std::fmt;
use std::time::SystemTime;

use crate::delivery::dead_letter_store::DeadLetterError;
use crate::delivery::dead_letters::{DeadLetterFilter, StoredDeadLetter};
use crate::journal::dead_letter_sql::Row;
use crate::journal::{
    JournalError, JournalFuture, JournalId, PersistenceId, Snapshot, StoredEvent, Tag,
};

/// What a journal's storage says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaInfo {
    /// Where the journal is: the file, or the PostgreSQL schema.
    pub location: String,
    /// The schema version of its tables.
    pub version: u32,
    /// The schema version this code writes; an older one is migrated when a journal opens it.
    pub current: u32,
    /// Its identity ([`Journal::journal_id`](crate::journal::Journal::journal_id)), if it has
    /// one (a journal gives its file or schema one when it opens it).
    pub journal_id: Option<JournalId>,
}

/// One stream, as its storage holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamInfo {
    /// The stream.
    pub persistence_id: PersistenceId,
    /// Its highest seq (unchanged by deletions).
    pub highest_seq: u64,
    /// How far its events were deleted, where the storage records it (SQLite); `None` where it
    /// does not (PostgreSQL: [`first_stored`](Self::first_stored) tells) or nothing was.
    pub deleted_to: Option<u64>,
    /// The lowest seq of an event still stored (`None`: none is).
    pub first_stored: Option<u64>,
    /// When the newest stored event was written.
    pub last_written_at: Option<SystemTime>,
    /// The type name of the newest stored event (its manifest's), or else of the snapshot;
    /// `None` if neither records one.
    pub type_name: Option<String>,
    /// The seq of its snapshot, and when that was written.
    pub snapshot: Option<(u64, SystemTime)>,
}

/// An event, with what its storage records beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InspectedEvent {
    /// The event: seq, payload, manifest.
    pub event: StoredEvent,
    /// When it was written (committed).
    pub written_at: SystemTime,
    /// The tags it is filed under, in the order they were written.
    pub tags: Vec<Tag>,
}

/// A stream's snapshot, with when it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InspectedSnapshot {
    /// The snapshot: seq, payload, manifest.
    pub snapshot: Snapshot,
    /// When it was written.
    pub written_at: SystemTime,
}

/// One page of the dead letters a journal's storage keeps (the tables of its dead-letter
/// store), as [`JournalInspector::dead_letters`] lists them: without their bodies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterListing {
    /// The entries, oldest (lowest id) first.
    pub entries: Vec<ListedDeadLetter>,
    /// The `after_id` of the next page, if there may be one.
    pub next: Option<u64>,
}

/// A kept dead letter, listed without its body.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedDeadLetter {
    /// The entry, every field but its body: `letter.body` is `None` whether the body was
    /// kept or not (`letter.body_len` is its length; [`JournalInspector::dead_letter`] reads
    /// it).
    pub entry: StoredDeadLetter,
    /// Whether the store kept the body.
    pub body_kept: bool,
}

/// What [`JournalInspector::check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// The storage's schema.
    pub schema: SchemaInfo,
    /// How many streams the storage holds.
    pub streams: u64,
    /// How many tag rows it holds.
    pub tag_rows: u64,
    /// What breaks an invariant, at most the number asked for.
    pub problems: Vec<Problem>,
    /// Whether there were more problems than those listed.
    pub truncated: bool,
    /// What is worth knowing and breaks nothing (an older schema version, which the journal
    /// migrates when it next opens it).
    pub notes: Vec<String>,
}

impl CheckReport {
    /// Whether every invariant holds.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// Which invariant.
    pub kind: ProblemKind,
    /// The stream it concerns, if one, as stored (it may not be a valid [`PersistenceId`]).
    pub persistence_id: Option<String>,
    /// What was found.
    pub detail: String,
}

impl Problem {
    pub(crate) fn new(kind: ProblemKind, stream: Option<&str>, detail: impl Into<String>) -> Self {
        Self {
            kind,
            persistence_id: stream.map(str::to_owned),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind)?;
        if let Some(stream) = &self.persistence_id {
            write!(f, "stream `{stream}`: ")?;
        }
        f.write_str(&self.detail)
    }
}

/// The invariants [`JournalInspector::check`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The journal's identity is missing or malformed (read models cannot tell it from
    /// another journal).
    Identity,
    /// A persistence id that is empty, too long or holds a NUL character.
    InvalidId,
    /// Seqs missing between the stream's deletion point and its highest seq.
    Gap,
    /// One seq stored twice.
    Duplicate,
    /// An event stored at or below the point its stream was deleted to.
    DeletedButStored,
    /// An event above the stream's recorded highest seq.
    BeyondHighest,
    /// Events of a stream without the row that records its highest seq (the fence).
    NoHighestSeq,
    /// A snapshot beyond its stream's highest seq, or at seq 0.
    Snapshot,
    /// A tag row whose event is neither stored nor deleted.
    DanglingTag,
    /// A tag row whose offset does not rise with its seq: readers of the tag would get the
    /// stream's entries out of order (or one twice).
    TagOrder,
    /// A tag row of a slice that is not its stream's: readers of slices would miss it.
    TagSlice,
    /// A tag row of a transaction the server has not reached (PostgreSQL: restored from a
    /// logical dump into another cluster).
    TagTransaction,
}

impl ProblemKind {
    /// Its name, as the inspector prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::InvalidId => "invalid-id",
            Self::Gap => "gap",
            Self::Duplicate => "duplicate",
            Self::DeletedButStored => "deleted-but-stored",
            Self::BeyondHighest => "beyond-highest",
            Self::NoHighestSeq => "no-highest-seq",
            Self::Snapshot => "snapshot",
            Self::DanglingTag => "dangling-tag",
            Self::TagOrder => "tag-order",
            Self::TagSlice => "tag-slice",
            Self::TagTransaction => "tag-transaction",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Collects problems up to a bound, noting whether more were found.
pub(crate) struct Problems {
    max: usize,
    pub(crate) found: Vec<Problem>,
    pub(crate) truncated: bool,
}

impl Problems {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            found: Vec::new(),
            truncated: false,
        }
    }

    /// How many more a query should fetch: one beyond the room left, to know whether more
    /// exist.
    pub(crate) fn room(&self) -> i64 {
        i64::try_from(self.max.saturating_sub(self.found.len()).saturating_add(1))
            .unwrap_or(i64::MAX)
    }

    pub(crate) fn extend(&mut self, problem: Option<Problem>) {
        if let Some(problem) = problem {
            self.push(problem);
        }
    }

    pub(crate) fn push(&mut self, problem: Problem) {
        if self.found.len() < self.max {
            self.found.push(problem);
        } else {
            self.truncated = true;
        }
    }
}

/// A read-only view of a journal's storage, without opening the journal: what the
/// command-line inspector (`actix-delivery-cli`) and operators' tools read.
///
/// An inspector reads the tables of a SQLite file (`SqliteInspector`, feature `sqlite`) or of
/// a PostgreSQL schema (`PostgresInspector`, feature `postgres`) through a read-only connection
/// of its own: it never writes, never migrates, never takes the journal's writer lock, so it
/// works beside the application that has the journal open. It checks the storage's marks as
/// the journal does (a file or schema that is not a journal, or of a newer schema version, is
/// refused with [`JournalError::Schema`](crate::journal::JournalError::Schema)) and reads older
/// schema versions as they are (the journal migrates them when it next opens them).
///
/// What it reads: the streams with their highest seqs ([`StreamInfo`]), a stream's events with
/// when they were written and their tags ([`InspectedEvent`]), its snapshot, a
/// [`check`](JournalInspector::check) of the storage's invariants ([`CheckReport`]), and the
/// dead letters kept in the journal's database by its dead-letter store
/// ([`dead_letters`](JournalInspector::dead_letters),
/// [`dead_letter`](JournalInspector::dead_letter)). A durable producer's stream is read with
/// [`read_durable_stream`](crate::durable::read_durable_stream).
///
/// Object safe; its futures are `Send` and can be awaited on any runtime.
pub trait JournalInspector: Send + Sync {
    /// The storage's schema, as read when the inspector was opened.
    fn schema(&self) -> &SchemaInfo;

    /// The streams whose persistence id sorts after `after` (from the first without), in
    /// order, at most `limit` of them: one page.
    ///
    /// # Errors
    /// [`JournalError::Storage`](crate::journal::JournalError::Storage);
    /// [`JournalError::Corrupt`](crate::journal::JournalError::Corrupt) for a stored value
    /// that is not what the schema says.
    fn streams(
        &self,
        after: Option<&PersistenceId>,
        limit: usize,
    ) -> JournalFuture<'_, Vec<StreamInfo>>;

    /// One stream, `None` if the storage holds nothing of it.
    ///
    /// # Errors
    /// As [`streams`](Self::streams).
    fn stream(&self, id: &PersistenceId) -> JournalFuture<'_, Option<StreamInfo>>;

    /// The stored events of stream `id` from `from_seq` on, ascending, at most `max_events`
    /// of them, with when each was written and its tags.
    ///
    /// # Errors
    /// As [`streams`](Self::streams).
    fn events(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<InspectedEvent>>;

    /// The snapshot of stream `id`, if it has one.
    ///
    /// # Errors
    /// As [`streams`](Self::streams).
    fn snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<InspectedSnapshot>>;

    /// Checks the storage's invariants (see [`ProblemKind`]) in one consistent read, listing
    /// at most `max_problems` problems.
    ///
    /// # Errors
    /// [`JournalError::Storage`](crate::journal::JournalError::Storage) if it cannot be read.
    fn check(&self, max_problems: usize) -> JournalFuture<'_, CheckReport>;

    /// The page of the kept dead letters that `filter` matches, oldest first, without their
    /// bodies (read as the dead-letter store lists them: `SqliteDeadLetters`,
    /// `PostgresDeadLetters`); `None` if the storage has no dead-letter table (no store was
    /// ever opened on it).
    ///
    /// # Errors
    /// [`JournalError::Storage`](crate::journal::JournalError::Storage) if it cannot be read,
    /// or an entry holds a value out of range (naming the entry).
    fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> JournalFuture<'_, Option<DeadLetterListing>>;

    /// The kept dead letter `id`, with its body if the store kept it; `None` if there is no
    /// such entry (or no dead-letter table).
    ///
    /// # Errors
    /// As [`dead_letters`](Self::dead_letters).
    fn dead_letter(&self, id: u64) -> JournalFuture<'_, Option<StoredDeadLetter>>;
}

/// The entry a dead-letter row holds; a value out of range is a storage error naming it.
pub(crate) fn dead_letter_entry(row: Row) -> Result<StoredDeadLetter, JournalError> {
    row.into_entry().map_err(dead_letter_error)
}

/// A dead-letter row that cannot be read, as the inspector's error.
pub(crate) fn dead_letter_error(err: DeadLetterError) -> JournalError {
    match err {
        DeadLetterError::Storage { message, .. } => JournalError::storage(None, message),
        other => JournalError::storage(None, other),
    }
}

/// Gives `events` (of the stream `id`, by ascending seq) their tags, the `(seq, tag)` rows of
/// the tag table in their order; a row of a seq not among them is passed over.
///
/// # Errors
/// [`JournalError::Corrupt`] for a tag row that is not a valid tag.
pub(crate) fn attach_tags(
    id: &PersistenceId,
    events: &mut [InspectedEvent],
    tags: Vec<(i64, String)>,
) -> Result<(), JournalError> {
    for (seq, tag) in tags {
        let Ok(index) = events.binary_search_by_key(&seq, |event| event.event.seq as i64) else {
            continue;
        };
        let tag = Tag::new(tag).map_err(|err| JournalError::Corrupt {
            persistence_id: id.clone(),
            seq: events[index].event.seq,
            reason: format!("a tag row with {err}"),
        })?;
        events[index].tags.push(tag);
    }
    Ok(())
}

/// The listing of `rows` (each a row without its body, and whether the body was kept), read
/// for `filter`: at most one more than its page, which says whether there is a next one.
pub(crate) fn dead_letter_listing(
    rows: Vec<(Row, bool)>,
    filter: &DeadLetterFilter,
) -> Result<DeadLetterListing, JournalError> {
    let size = filter.page_size();
    let more = rows.len() > size;
    let entries = rows
        .into_iter()
        .take(size)
        .map(|(row, body_kept)| {
            Ok(ListedDeadLetter {
                entry: dead_letter_entry(row)?,
                body_kept,
            })
        })
        .collect::<Result<Vec<_>, JournalError>>()?;
    let next = if more {
        entries.last().map(|listed| listed.entry.id)
    } else {
        None
    };
    Ok(DeadLetterListing { entries, next })
}

/// The slice a tag row should have, and a problem if it has another.
pub(crate) fn check_slice(id: &str, slice: i64) -> Option<Problem> {
    let expected = PersistenceId::new(id)
        .ok()
        .map(|id| crate::journal::slice_of(&id))?;
    (i64::from(expected) != slice).then(|| {
        Problem::new(
            ProblemKind::TagSlice,
            Some(id),
            format!(
                "tag rows of slice {slice}, but the stream is in slice {expected}: readers of \
                 slices miss them"
            ),
        )
    })
}

/// The problem of a stored persistence id that is not a valid one, if it is not.
pub(crate) fn check_id(id: &str) -> Option<Problem> {
    PersistenceId::new(id).err().map(|err| {
        Problem::new(
            ProblemKind::InvalidId,
            Some(id),
            format!("not a valid persistence id: {err}"),
        )
    })
}

/// The problems of a journal's identity rows (the `journal_id`s stored), if any.
pub(crate) fn check_identity(rows: &[String], how_to_give: &str) -> Option<Problem> {
    let detail = match rows {
        [] => format!(
            "no journal id (no row in journal_identity): read models cannot tell this journal \
             from another; {how_to_give}"
        ),
        [id] => match JournalId::new(id.as_str()) {
            Ok(_) => return None,
            Err(err) => format!("journal_identity holds {err}"),
        },
        more => format!("journal_identity holds {} rows instead of one", more.len()),
    };
    Some(Problem::new(ProblemKind::Identity, None, detail))
}

/// The problem of one row of a stream's seqs in order, if it breaks the stream's run of seqs:
/// `seq` follows `previous` (the stored seq before it, if any), the stream deleted to
/// `deleted_to`.
pub(crate) fn check_seq(
    id: &str,
    previous: Option<i64>,
    seq: i64,
    deleted_to: i64,
) -> Option<Problem> {
    if previous == Some(seq) {
        return Some(Problem::new(
            ProblemKind::Duplicate,
            Some(id),
            format!("seq {seq} is stored twice"),
        ));
    }
    if seq <= deleted_to {
        return Some(Problem::new(
            ProblemKind::DeletedButStored,
            Some(id),
            format!("event {seq} is stored, but the stream was deleted to seq {deleted_to}"),
        ));
    }
    let expected = previous.unwrap_or(0).max(deleted_to) + 1;
    (seq > expected).then(|| gap(id, expected, seq - 1))
}

/// The problem of seqs `from..=to` missing from stream `id`.
pub(crate) fn gap(id: &str, from: i64, to: i64) -> Problem {
    let missing = if from == to {
        format!("event {from} is missing")
    } else {
        format!("events {from} to {to} are missing")
    };
    Problem::new(ProblemKind::Gap, Some(id), missing)
}

/// The problem of a snapshot at `seq` of a stream whose highest seq is `highest`.
pub(crate) fn snapshot_problem(id: &str, seq: i64, highest: i64) -> Problem {
    let detail = if seq < 1 {
        format!("a snapshot at seq {seq}")
    } else {
        format!("a snapshot at seq {seq}, beyond the stream's highest seq {highest}")
    };
    Problem::new(ProblemKind::Snapshot, Some(id), detail)
}

/// The problem of a tag row at `offset` (of event `seq`) that follows the row at `before`
/// in its tag and stream without a higher seq.
pub(crate) fn tag_order_problem(
    tag: &str,
    id: &str,
    (offset, seq): (&str, i64),
    (before, before_seq): (&str, i64),
) -> Problem {
    let detail = if seq == before_seq {
        format!(
            "event {seq} is filed twice under tag `{tag}` (offsets {before} and {offset}): its \
             readers get it twice"
        )
    } else {
        format!(
            "under tag `{tag}`, event {seq} (offset {offset}) follows event {before_seq} (offset \
             {before}): an entry's offset must rise with its seq, or the tag's readers get the \
             stream out of order"
        )
    };
    Problem::new(ProblemKind::TagOrder, Some(id), detail)
}
