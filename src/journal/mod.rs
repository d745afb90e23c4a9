//! The journal: durable, fenced streams of events, the storage under all persistence in this
//! crate.
//!
//! A [`Journal`] holds streams named by a [`PersistenceId`]. Each stream is a gapless sequence
//! of events numbered 1, 2, 3, … (payloads are bytes; typed events go through
//! [`codec`](crate::codec)) plus at most one current [`Snapshot`]. Next to every event and
//! snapshot a journal keeps its [`Manifest`]: how its payload was written (codec, type name,
//! schema version), so that a reader can decode entries written by earlier versions of its
//! types ([Changing your types](crate::guide::schema_evolution)). Implementations:
//!
//! - `SqliteJournal` (feature `sqlite`, on by default): the embedded durable default. One
//!   SQLite file in WAL mode with `synchronous=FULL`; a single writer thread commits every
//!   append that arrived while the previous commit ran in one transaction (group commit: many
//!   appends, one fsync).
//! - `PostgresJournal` (feature `postgres`): one database shared by the nodes of an
//!   application. Group commit through one writer connection (one pipelined transaction for
//!   all the appends that arrived meanwhile); the fence is a conditional update in the
//!   database, so writers on different nodes are fenced against each other too.
//! - [`MemoryJournal`]: the same semantics in memory, with fault injection, for tests.
//!
//! # The contract
//!
//! - **Durable means committed.** An append resolves `Ok` only once its events are committed
//!   (for SQLite: on disk); a batch is stored whole or not at all.
//! - **Single writer per stream, fenced.** A stream should have one writer at a time. If a
//!   second one appears (a duplicate actor, a split brain, a restarted node racing the old
//!   one), the fence makes it harmless: an append is stored only if its `first_seq` is the
//!   stream's highest seq + 1, and otherwise fails with [`JournalError::Conflict`], writing
//!   nothing and telling the loser the real highest seq so it can catch up. For the same
//!   reason a writer should have one append per stream in flight at a time.
//! - **Highest seq survives deletion.** [`Journal::delete_to`] removes events, never the
//!   knowledge of how far the stream got, so a seq is never handed out twice.
//!
//! # Edge cases, decided
//!
//! | call | result |
//! |---|---|
//! | `append` of an empty batch | `Ok`, nothing written, no fence check (nothing to fence) |
//! | `append` with `first_seq` 0, or a last seq above [`MAX_SEQ`] | [`JournalError::InvalidArgument`] |
//! | `replay` with `from_seq > to_seq`, or `max_events` 0 | `Ok` with no events |
//! | `delete_to` beyond the highest seq | deletes every event; the highest seq stays |
//! | `save_snapshot` at seq 0 or above the highest seq | [`JournalError::InvalidArgument`] |
//! | `save_snapshot` older than the current snapshot | `Ok`, the newer one is kept |
//! | `save_snapshot` at the current snapshot's seq | `Ok`, replaces it |
//! | any call on an unknown stream | as for an empty stream (highest seq 0) |
//!
//! # Tags
//!
//! An entry can be filed under [`Tag`]s when it is appended ([`Journal::append_tagged`]; a
//! persistent entity tags its entries with
//! [`EventSourced::tags`](crate::persistence::EventSourced::tags)), in the same atomic
//! append. [`Journal::events_by_tag`] reads the entries of a tag across all streams, after
//! an [`Offset`] that never skips (how each journal makes sure of that: [`Offset`]),
//! optionally only those of some [`Slices`] of the streams; [`Journal::tag_notifications`]
//! says when new ones were committed. The projections of [`crate::projection`] are built on
//! these.
//!
//! - Entries written before a journal stored tags (journal schema 2 or older, migrated on
//!   open) have none.
//! - [`Journal::delete_to`] removes entries, never their place in a tag: a reader that comes
//!   by afterwards gets the entry's offset, stream and seq without its event, so it knows what
//!   it missed (a projection stops there, or skips it if told to: see
//!   [`PoisonPolicy`](crate::projection::PoisonPolicy)). The tag rows of deleted entries stay.

use std::future::Future;
use std::pin::Pin;

use crate::codec::Manifest;

pub(crate) use actix_delivery_proto::journal::by_tag;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod dead_letter_sql;
pub(crate) use actix_delivery_proto::journal::error;
pub(crate) use actix_delivery_proto::journal::event;
pub(crate) use actix_delivery_proto::journal::id;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod inspect;
pub(crate) use actix_delivery_proto::journal::journal_id;
mod memory;
#[cfg(all(feature = "metrics", any(feature = "sqlite", feature = "postgres")))]
pub(crate) mod metrics;
mod notifications;
#[cfg(feature = "postgres")]
mod postgres;
mod replay;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) use actix_delivery_proto::journal::tag;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod write;

pub(crate) use by_tag::{check_max_events, check_tags, normalized};
pub use by_tag::{Offset, TagQuery, TaggedEvent};
pub use error::JournalError;
pub use event::{Snapshot, StoredEvent, MAX_PAYLOAD_BYTES, MAX_SEQ};
pub use id::{PersistenceId, PersistenceIdError};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use inspect::{
    CheckReport, DeadLetterListing, InspectedEvent, InspectedSnapshot, JournalInspector,
    ListedDeadLetter, Problem, ProblemKind, SchemaInfo, StreamInfo,
};
pub use journal_id::JournalId;
pub use memory::{MemoryFaults, MemoryJournal, MemoryStats};
pub use notifications::TagNotifications;
pub(crate) use notifications::TagSignal;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresInspector;
#[cfg(all(feature = "postgres", feature = "tls"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "postgres", feature = "tls"))))]
pub use postgres::PostgresTls;
#[cfg(feature = "postgres")]
pub(crate) use postgres::{is_connection_lost, is_plain_identifier, parse_config};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{
    PostgresConfig, PostgresDeadLetters, PostgresJournal, PostgresOptions, PostgresOptionsBuilder,
    PostgresStats,
};
pub use replay::replay_all;
#[cfg(feature = "sqlite")]
pub(crate) use sqlite::unix_millis;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteInspector;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{
    SqliteConfig, SqliteDeadLetters, SqliteDurability, SqliteJournal, SqliteOptions,
    SqliteOptionsBuilder, SqliteStats,
};
pub use tag::{slice_of, Slices, Tag, MAX_TAG_BYTES, SLICES};

/// The future every [`Journal`] operation returns: `Send`, boxed so the trait is object safe.
pub type JournalFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, JournalError>> + Send + 'a>>;

/// Durable streams of events; see the [module documentation](self) for the contract.
///
/// Object safe (used as `Arc<dyn Journal>`). Implementations never block the caller's thread:
/// the futures can run on an Actix arbiter or a current-thread Tokio runtime. An operation
/// that has reached the storage is carried out even if its future is dropped; only its result
/// is lost.
///
/// Persistent entities and durable producers use a journal themselves; direct use looks like
/// this (the same on `SqliteJournal` and `PostgresJournal`):
///
/// ```
/// use actix_delivery::journal::{Journal, JournalError, MemoryJournal, PersistenceId};
///
/// # #[actix::main] async fn main() -> Result<(), JournalError> {
/// let journal = MemoryJournal::new();
/// let stream = PersistenceId::new("account-17")?;
/// journal.append(&stream, 1, vec![b"opened".to_vec(), b"deposited 5".to_vec()]).await?;
/// // Appending at a seq that is not the next one is refused: one writer wins.
/// let late = journal.append(&stream, 2, vec![b"deposited 7".to_vec()]).await;
/// assert!(matches!(late, Err(JournalError::Conflict { .. })));
/// assert_eq!(journal.highest_seq(&stream).await?, 2);
/// let events = journal.replay(&stream, 1, u64::MAX, 100).await?;
/// assert_eq!(events[1].payload, b"deposited 5");
/// # Ok(()) }
/// ```
pub trait Journal: Send + Sync + 'static {
    /// Appends `payloads` as events `first_seq`, `first_seq + 1`, … in one atomic batch,
    /// each with `manifest` (how they were written); resolves `Ok` only after the batch is
    /// committed.
    ///
    /// # Errors
    /// [`JournalError::Conflict`] (nothing written) unless `first_seq` is the stream's highest
    /// seq + 1; [`JournalError::InvalidArgument`] if `first_seq` is 0 or the last seq would
    /// exceed [`MAX_SEQ`]; [`JournalError::Storage`] or [`JournalError::Closed`] if it could
    /// not be committed.
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()>;

    /// [`append_as`](Journal::append_as) with [`Manifest::raw`]: bytes that are their own
    /// meaning.
    ///
    /// # Errors
    /// As [`append_as`](Journal::append_as).
    fn append(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
    ) -> JournalFuture<'_, ()> {
        self.append_as(id, first_seq, payloads, Manifest::raw())
    }

    /// The events with `from_seq <= seq <= to_seq`, ascending, at most `max_events` of them:
    /// one page. Deleted events are skipped. [`replay_all`] walks a range page by page.
    ///
    /// # Errors
    /// [`JournalError::Corrupt`] for an event that cannot be read back;
    /// [`JournalError::Storage`] or [`JournalError::Closed`].
    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>>;

    /// The highest seq ever appended to the stream, 0 for an unknown one; unchanged by
    /// [`delete_to`](Journal::delete_to).
    ///
    /// # Errors
    /// [`JournalError::Corrupt`], [`JournalError::Storage`] or [`JournalError::Closed`].
    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64>;

    /// Deletes the events with `seq <= to_seq` (the highest seq stays known).
    ///
    /// # Errors
    /// [`JournalError::Storage`] or [`JournalError::Closed`].
    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()>;

    /// Stores `snapshot` as the stream's current snapshot, unless the current one is newer
    /// (then it is kept, and this resolves `Ok`).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `snapshot.seq` is 0 or above the stream's highest
    /// seq; [`JournalError::Storage`] or [`JournalError::Closed`].
    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()>;

    /// The stream's current snapshot, if it has one.
    ///
    /// # Errors
    /// [`JournalError::Corrupt`], [`JournalError::Storage`] or [`JournalError::Closed`].
    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>>;

    /// [`append_as`](Journal::append_as), each entry filed under its tags (`tags[i]` for
    /// `payloads[i]`; an empty `tags` files none), in the same atomic append:
    /// [`events_by_tag`](Journal::events_by_tag) finds an entry once the append is committed.
    /// A tag given twice for one entry counts once.
    ///
    /// The default stores untagged appends through `append_as` and refuses tagged ones with
    /// [`JournalError::Unsupported`] (the crate's journals store tags). A journal that wraps
    /// another should forward this, [`events_by_tag`](Journal::events_by_tag) and
    /// [`tag_notifications`](Journal::tag_notifications) to it.
    ///
    /// # Errors
    /// As [`append_as`](Journal::append_as); [`JournalError::InvalidArgument`] unless `tags`
    /// is empty or has one list per payload.
    fn append_tagged(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        tags: Vec<Vec<Tag>>,
    ) -> JournalFuture<'_, ()> {
        if tags.iter().all(Vec::is_empty) {
            return self.append_as(id, first_seq, payloads, manifest);
        }
        Box::pin(async { Err(JournalError::Unsupported("tags".into())) })
    }

    /// The entries of `query`'s tag (in its slices) with an offset above `after`, in offset
    /// order, at most `max_events` of them: one page of what is committed now (a *current*
    /// query; go on from the last offset for the next page, and poll, or wait for
    /// [`tag_notifications`](Journal::tag_notifications), to follow it *live*). An entry
    /// deleted since it was tagged comes with no event ([`TaggedEvent::event`] `None`). The
    /// offset never skips: an entry committed later always has a higher offset than every
    /// entry returned before (see [`Offset`]).
    ///
    /// The default refuses with [`JournalError::Unsupported`].
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `max_events` is 0; [`JournalError::Corrupt`],
    /// [`JournalError::Storage`] or [`JournalError::Closed`].
    fn events_by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<TaggedEvent>> {
        let _ = (query, after, max_events);
        Box::pin(async { Err(JournalError::Unsupported("reading by tag".into())) })
    }

    /// A signal that tagged entries were committed, if this journal has one (the crate's
    /// journals do; PostgreSQL's covers the commits of every process through `LISTEN/NOTIFY`).
    /// The default has none: readers poll.
    fn tag_notifications(&self) -> Option<TagNotifications> {
        None
    }

    /// The offset ceiling: an offset that no tagged entry committed so far exceeds. Every
    /// entry committed before this call has an offset `<=` it (later ones may have higher
    /// offsets), so an offset above it cannot have come from this journal: it was read from
    /// another journal, from this one before it was reset or replaced, or (PostgreSQL) from
    /// the database before it was restored by a logical dump into another cluster. A reader
    /// that stored such an offset would wait forever for entries "after" it and skip every
    /// new one; a [projection](crate::projection) can compare its stored offset with this
    /// before it resumes and stop instead.
    ///
    /// The crate's journals return the highest offset of their own committed tagged
    /// entries, in any tag ([`Offset::START`] before the first):
    ///
    /// - [`MemoryJournal`] and `SqliteJournal`: `0:n`, `n` the position of the last
    ///   tagged entry committed; the next one gets a higher offset.
    /// - `PostgresJournal`: the highest `txid:ordering` of its own tag rows. An entry
    ///   committed later may get a lower offset (its transaction began earlier; see
    ///   [`Offset`]). The server's transaction ids, which every transaction on the server
    ///   raises, do not count: an offset read from another journal in the same database is
    ///   above the ceiling unless that journal's entries are older than this one's
    ///   ([`journal_id`](Journal::journal_id) tells those apart).
    ///
    /// The default refuses with [`JournalError::Unsupported`] (a caller then skips its
    /// check). A journal that wraps another should forward this to it.
    ///
    /// # Errors
    /// [`JournalError::Unsupported`] if the journal cannot tell; [`JournalError::Storage`] or
    /// [`JournalError::Closed`].
    fn offset_ceiling(&self) -> JournalFuture<'_, Offset> {
        Box::pin(async { Err(JournalError::Unsupported("an offset ceiling".into())) })
    }

    /// This journal's identity, given to its storage when it was created: a
    /// [projection](crate::projection) records it in its read model and refuses to go on
    /// with a journal of another identity, whatever its stored offset (an offset of another
    /// journal can lie within this one's, and every entry below it would be skipped; only an
    /// offset above [`offset_ceiling`](Journal::offset_ceiling) shows itself). The crate's
    /// journals all have one: [`MemoryJournal`] per journal made, `SqliteJournal` in its
    /// file, `PostgresJournal` in its schema (unless the schema lacks the table and
    /// `create_tables` is off: see `PostgresJournal::IDENTITY_SQL`).
    ///
    /// The default: `None`, and readers check nothing. A journal that wraps another should
    /// forward this to it.
    fn journal_id(&self) -> Option<JournalId> {
        None
    }

    /// The largest event or snapshot payload this journal stores, in bytes: an
    /// [`append`](Journal::append) with a larger event, or a larger snapshot, is refused with
    /// [`JournalError::InvalidArgument`] and writes nothing. The crate's journals all take
    /// [`MAX_PAYLOAD_BYTES`] (the default); a journal that wraps another should return the
    /// inner one's.
    fn max_payload(&self) -> usize {
        MAX_PAYLOAD_BYTES
    }
}

/// Checks the arguments of an append of `count` events at `first_seq`.
pub(crate) fn check_append(
    id: &PersistenceId,
    first_seq: u64,
    count: usize,
) -> Result<(), JournalError> {
    if first_seq == 0 {
        return Err(JournalError::invalid(id, "seqs start at 1, not 0"));
    }
    let last = (count as u64)
        .checked_sub(1)
        .and_then(|extra| first_seq.checked_add(extra));
    match last {
        Some(last) if last > MAX_SEQ => Err(JournalError::invalid(
            id,
            format!("an append of {count} events at seq {first_seq} would exceed the largest seq {MAX_SEQ}"),
        )),
        None if count > 0 => Err(JournalError::invalid(id, "seq overflow")),
        _ => Ok(()),
    }
}

/// Checks an append of `payloads` tagged `tags` at `first_seq` (its seqs, one list of tags
/// per payload or none, every payload within the `journal`'s limit of `max` bytes): what
/// every journal checks before it writes anything.
pub(crate) fn check_tagged_append(
    id: &PersistenceId,
    first_seq: u64,
    payloads: &[Vec<u8>],
    tags: &[Vec<Tag>],
    max: usize,
    journal: &str,
) -> Result<(), JournalError> {
    check_append(id, first_seq, payloads.len())?;
    check_tags(id, payloads.len(), tags)?;
    check_payloads(id, payloads, max, journal)
}

/// Checks that every payload of an append fits the journal's limit of `max` bytes
/// (`journal` names it in the error).
pub(crate) fn check_payloads(
    id: &PersistenceId,
    payloads: &[Vec<u8>],
    max: usize,
    journal: &str,
) -> Result<(), JournalError> {
    payloads
        .iter()
        .try_for_each(|payload| check_payload(id, payload.len(), max, journal))
}

/// Checks that a payload of `len` bytes fits the journal's limit of `max` bytes (`journal`
/// names it in the error).
pub(crate) fn check_payload(
    id: &PersistenceId,
    len: usize,
    max: usize,
    journal: &str,
) -> Result<(), JournalError> {
    if len > max {
        return Err(JournalError::invalid(
            id,
            format!(
                "a payload of {len} bytes exceeds the {journal} journal's limit of {max} bytes"
            ),
        ));
    }
    Ok(())
}

/// The manifest a journal read back from its columns (codec id, name, version, as SQL
/// integers); the same as `last` (of the row before) shares its name instead of allocating it
/// again.
///
/// # Errors
/// [`JournalError::Corrupt`] for a codec id or version out of range.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn stored_manifest(
    id: &PersistenceId,
    seq: u64,
    (codec, name, version): (i64, &str, i64),
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    let (Ok(codec), Ok(version)) = (u8::try_from(codec), u32::try_from(version)) else {
        return Err(JournalError::Corrupt {
            persistence_id: id.clone(),
            seq,
            reason: format!("a manifest out of range: codec {codec}, version {version}"),
        });
    };
    if let Some(last) = last
        && (last.codec_id(), last.name(), last.version()) == (codec, name, version)
    {
        return Ok(last.clone());
    }
    let manifest = Manifest::from_stored(codec, name, version);
    *last = Some(manifest.clone());
    Ok(manifest)
}

/// The fence: `first_seq` must follow `highest_seq`.
pub(crate) fn check_fence(
    id: &PersistenceId,
    first_seq: u64,
    highest_seq: u64,
) -> Result<(), JournalError> {
    if highest_seq.checked_add(1) == Some(first_seq) {
        Ok(())
    } else {
        Err(JournalError::Conflict {
            persistence_id: id.clone(),
            first_seq,
            highest_seq,
        })
    }
}

/// Checks that a snapshot at `seq` describes events that exist (or existed).
pub(crate) fn check_snapshot(
    id: &PersistenceId,
    seq: u64,
    highest_seq: u64,
) -> Result<(), JournalError> {
    if seq == 0 {
        return Err(JournalError::invalid(
            id,
            "a snapshot's seq starts at 1, not 0",
        ));
    }
    if seq > highest_seq {
        return Err(JournalError::invalid(
            id,
            format!("a snapshot at seq {seq} is beyond the stream's highest seq {highest_seq}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> PersistenceId {
        PersistenceId::new("s").unwrap()
    }

    #[test]
    fn append_arguments() {
        assert!(check_append(&id(), 0, 1).is_err());
        assert!(check_append(&id(), 0, 0).is_err());
        assert!(check_append(&id(), 1, 0).is_ok());
        assert!(check_append(&id(), MAX_SEQ, 1).is_ok());
        assert!(check_append(&id(), MAX_SEQ, 2).is_err());
        assert!(check_append(&id(), MAX_SEQ + 1, 1).is_err());
        assert!(check_append(&id(), u64::MAX, 2).is_err());
        assert!(check_append(&id(), MAX_SEQ - 9, 10).is_ok());
    }

    #[test]
    fn fence() {
        assert!(check_fence(&id(), 1, 0).is_ok());
        assert_eq!(
            check_fence(&id(), 3, 3),
            Err(JournalError::Conflict {
                persistence_id: id(),
                first_seq: 3,
                highest_seq: 3
            })
        );
        assert!(check_fence(&id(), 5, 3).is_err());
        assert!(check_fence(&id(), 0, u64::MAX).is_err());
    }

    #[test]
    fn snapshot_arguments() {
        assert!(check_snapshot(&id(), 0, 5).is_err());
        assert!(check_snapshot(&id(), 5, 5).is_ok());
        assert!(check_snapshot(&id(), 6, 5).is_err());
    }
}
