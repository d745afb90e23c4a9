//! The embedded durable journal: one SQLite file, WAL, `synchronous=FULL`, group commit
//! (feature `sqlite`, on by default).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use tokio::sync::{mpsc, oneshot, Semaphore};

mod backup;
mod config;
mod dead_letters;
mod inspect;
mod options;
mod reader;
mod schema;
mod writer;
pub(crate) use writer::unix_millis;

pub use config::{SqliteConfig, SqliteDurability, SqliteStats};
pub use dead_letters::SqliteDeadLetters;
pub use inspect::SqliteInspector;
pub use options::{SqliteOptions, SqliteOptionsBuilder};

use crate::codec::Manifest;
use crate::journal::write::{WriteOp, WriteRequest};
use crate::journal::{
    check_max_events, check_payload, check_tagged_append, normalized, Journal, JournalError,
    JournalFuture, JournalId, Offset, PersistenceId, Snapshot, StoredEvent, Tag, TagNotifications,
    TagQuery, TagSignal, TaggedEvent, MAX_SEQ,
};
use crate::runtime::error_chain::ErrorChain;
use config::Counters;
use reader::ReadRequest;

/// A stream's highest seq: its largest stored seq, or how far it was deleted if that is
/// more. One row, for `?1` = the persistence id.
const HIGHEST_SQL: &str = "SELECT max(\
     coalesce((SELECT max(seq_nr) FROM event_journal WHERE persistence_id = ?1), 0), \
     coalesce((SELECT deleted_to FROM stream_metadata WHERE persistence_id = ?1), 0))";

/// The embedded durable [`Journal`]: one SQLite file (plus its `-wal`, `-shm` and `-lock`
/// companions) in WAL mode with `synchronous=FULL`, so a commit is on disk when it returns.
/// No server, no system library (SQLite is compiled in: feature `sqlite`, on by default; an
/// application that only uses PostgreSQL turns it off and compiles no SQLite).
///
/// ```no_run
/// use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal};
///
/// # async fn _demo() -> Result<(), actix_delivery::journal::JournalError> {
/// let journal = SqliteJournal::open("orders.journal").await?;
/// let id = PersistenceId::new("order-4711")?;
/// let next = journal.highest_seq(&id).await? + 1;
/// journal.append(&id, next, vec![b"created".to_vec()]).await?; // on disk when Ok
/// # Ok(()) }
/// ```
///
/// **Group commit.** One writer thread owns the write connection. It takes every write that
/// arrived while the previous commit ran, from all streams, up to the batch bounds of
/// [`SqliteConfig`], and commits them in one transaction (one fsync); each caller's future
/// resolves after that commit. Inside the transaction each write is fenced on its own, so a
/// conflicting append is refused alone and the rest of the group commits. A storage error
/// fails the whole group: nothing is reported durable that was not committed.
///
/// **Bounded.** Writes queue in front of the writer up to `queue_capacity` writes and
/// `max_queued_bytes` payload bytes; beyond that callers wait (backpressure, never unbounded
/// memory). Events and snapshots larger than [`SqliteJournal::MAX_PAYLOAD_BYTES`] are refused.
///
/// **Tags.** A tagged append ([`Journal::append_tagged`]) writes an `event_tag` row per tag
/// of each entry in its transaction; the single writer numbers them in commit order, which is
/// the offset [`Journal::events_by_tag`] reads after. [`Journal::tag_notifications`] hears of
/// every commit of tagged entries, as it happens (only this journal writes the file).
///
/// **Reads** (`replay`, `highest_seq`, `load_snapshot`, `events_by_tag`) run on separate read-only
/// connections on their own threads: WAL readers see the last commit and never wait behind
/// writes. No operation blocks the caller's thread, so the futures can be awaited on an Actix
/// arbiter.
///
/// **Recent events** go into an unindexed table first and move on into `event_journal` in
/// bulk (every `buffer_events` events, and on open and close): a commit that touches many
/// streams then writes a page or two instead of an index page per stream. Replays and
/// highest seqs see both tables as one.
///
/// **One journal per file.** The writer keeps the highest seq of recently written streams in
/// memory, so a file is open in one `SqliteJournal` at a time, across processes: opening it again
/// waits up to `busy_timeout` for the other to let go (a dropped journal does once its queue is
/// drained; [`close`](Self::close) waits for that; a killed process does at once), then fails with
/// a [`JournalError::Storage`] error. The lock belongs to the file, not to the name it is opened
/// under: a symlink or a relative path reaches the same lock, and a file with more than one hard
/// link is refused (on Unix). Clones share one journal. When the last handle is dropped (or
/// closed), the threads finish the writes already queued, reply to each, and close the file.
/// Applications whose nodes share a journal need a server database.
#[derive(Clone)]
pub struct SqliteJournal {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    writes: mpsc::Sender<WriteRequest>,
    reads: mpsc::Sender<ReadRequest>,
    queued_bytes: Arc<Semaphore>,
    max_queued_bytes: u32,
    counters: Arc<Counters>,
    signal: Arc<TagSignal>,
    durability: SqliteDurability,
    /// The file's identity.
    id: JournalId,
    busy_timeout: std::time::Duration,
    /// Each resolves (with an error: its sender is dropped) when its thread has ended.
    threads: Mutex<Vec<oneshot::Receiver<()>>>,
}

impl SqliteJournal {
    /// The largest event or snapshot payload the SQLite journal stores: 512 MiB (SQLite's
    /// own limit for a value is just under 1 GB).
    pub const MAX_PAYLOAD_BYTES: usize = crate::journal::MAX_PAYLOAD_BYTES;

    /// Opens (or creates) the journal at `path` with default [`SqliteOptions`].
    ///
    /// # Errors
    /// As [`open_with`](Self::open_with).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (or creates) the journal at `path`. A new file gets the schema; an existing one
    /// must hold this crate's schema in its current version.
    ///
    /// # Errors
    /// [`JournalError::Schema`] for a file with a newer schema, another application's
    /// database or not a database at all (the file is left untouched);
    /// [`JournalError::Storage`] if the file cannot be opened for writing (missing
    /// directory, read-only file, I/O error), is open in another journal (this process or
    /// another), or a thread cannot be started. (Invalid settings were refused when the
    /// `options` were built.)
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, JournalError> {
        let config = &options.config;
        let path = path.as_ref().to_path_buf();
        let counters = Arc::new(Counters::default());
        let signal = Arc::new(TagSignal::default());
        let buffered = writer::Buffered::default();
        let mut threads = Vec::with_capacity(1 + config.readers);

        let (writes, write_queue) = mpsc::channel(config.queue_capacity);
        let (opened, writer_ready) = oneshot::channel();
        threads.push(spawn("actix-delivery-journal-writer", {
            let (path, options) = (path.clone(), options.clone());
            let (buffered, counters, signal) = (buffered.clone(), counters.clone(), signal.clone());
            move || {
                writer::run(
                    &path,
                    &options,
                    write_queue,
                    buffered,
                    counters,
                    signal,
                    opened,
                )
            }
        })?);
        // The writer creates the schema; readers open only after it is done.
        let (durability, id) = match writer_ready.await.unwrap_or(Err(JournalError::Closed)) {
            Ok(opened) => opened,
            Err(err) => {
                for thread in threads {
                    let _ = thread.await; // the writer has let go of the file
                }
                return Err(err);
            }
        };

        let (reads, read_queue) = mpsc::channel(config.queue_capacity);
        let read_queue: reader::SharedQueue = Arc::new(Mutex::new(read_queue));
        let readers = async {
            let mut readers_ready = Vec::with_capacity(config.readers);
            for _ in 0..config.readers {
                let (opened, ready) = oneshot::channel();
                readers_ready.push(ready);
                threads.push(spawn("actix-delivery-journal-reader", {
                    let (path, queue) = (path.clone(), read_queue.clone());
                    let (buffered, busy_timeout) = (buffered.clone(), config.busy_timeout);
                    move || reader::run(&path, busy_timeout, queue, buffered, opened)
                })?);
            }
            for ready in readers_ready {
                ready.await.unwrap_or(Err(JournalError::Closed))?;
            }
            Ok(())
        };
        if let Err(err) = readers.await {
            // Let the writer release the file before reporting, so a retry can open it.
            drop((writes, reads, read_queue));
            for thread in threads {
                let _ = thread.await;
            }
            return Err(err);
        }

        // Validated: fits a u32.
        let max_queued_bytes = u32::try_from(config.max_queued_bytes).unwrap_or(u32::MAX);
        Ok(Self {
            shared: Arc::new(Shared {
                path,
                writes,
                reads,
                queued_bytes: Arc::new(Semaphore::new(max_queued_bytes as usize)),
                max_queued_bytes,
                counters,
                signal,
                durability,
                id,
                busy_timeout: config.busy_timeout,
                threads: Mutex::new(threads),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Writes a consistent copy of the journal to the new file `path`, while the journal
    /// goes on: everything committed before the call is in the copy (and possibly some of
    /// what commits while it runs: the copy is the journal as of one commit). The copy is a
    /// journal file of its own, which [`open`](Self::open) accepts; to restore, put it where
    /// the journal was (with no `-wal` or `-shm` file of the old one beside it) and open it.
    ///
    /// This is the way to back up a live journal: a copy of its files is not one. The newest
    /// commits are in the `-wal` file until a checkpoint moves them into the database file,
    /// so a copy of the database file alone lacks acknowledged events, and a `-wal` copied
    /// while a commit is being written is cut short, which SQLite takes as "the transactions
    /// after the cut never happened", without an error. (Copying files is safe only with the
    /// journal closed, and then the database file holds everything.)
    ///
    /// Runs SQLite's online backup API on a connection and thread of its own, a few pages
    /// per step, all from one read transaction: in WAL mode that never blocks the writer, so
    /// appends go on meanwhile (the `-wal` just grows until the copy is done).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if `path` exists; [`JournalError::Storage`] if the
    /// copy cannot be written (missing directory, full disk) or the journal read. Nothing is
    /// left at `path` then (the copy is written as `<path>.partial` and renamed when done).
    pub async fn backup(&self, path: impl AsRef<Path>) -> Result<(), JournalError> {
        let (source, dest) = (self.shared.path.clone(), path.as_ref().to_path_buf());
        let busy_timeout = self.shared.busy_timeout;
        let (done, result) = oneshot::channel();
        // Ends by itself when the copy is done; its result comes through `done`.
        drop(spawn("actix-delivery-journal-backup", move || {
            let _ = done.send(backup::run(&source, &dest, busy_timeout));
        })?);
        result.await.unwrap_or(Err(JournalError::Closed))
    }

    /// The write connection's durability settings (`synchronous`, `journal_mode`), as that
    /// connection reported them when the journal was opened: FULL and WAL. For tests that
    /// check no build of the journal commits less durably.
    pub fn durability(&self) -> &SqliteDurability {
        &self.shared.durability
    }

    /// The counters since the journal was opened (shared by all clones).
    pub fn stats(&self) -> SqliteStats {
        let writes = &self.shared.writes;
        self.shared
            .counters
            .read(writes.max_capacity() - writes.capacity())
    }

    /// Drops this handle; if it was the last one, waits until every queued write has been
    /// committed or failed (and its caller told) and the file is closed. With other clones
    /// alive it returns at once and the journal stays open.
    pub async fn close(self) {
        let Ok(shared) = Arc::try_unwrap(self.shared) else {
            return;
        };
        let threads =
            std::mem::take(&mut *shared.threads.lock().unwrap_or_else(|e| e.into_inner()));
        drop(shared); // closes both queues: the threads drain them and end
        for thread in threads {
            let _ = thread.await;
        }
    }

    async fn write(&self, id: PersistenceId, op: WriteOp) -> Result<(), JournalError> {
        let bytes = u32::try_from(op.bytes()).unwrap_or(u32::MAX);
        let permit = self
            .shared
            .queued_bytes
            .clone()
            .acquire_many_owned(bytes.min(self.shared.max_queued_bytes))
            .await
            .map_err(|_| JournalError::Closed)?;
        let (reply, result) = oneshot::channel();
        self.shared
            .writes
            .send(WriteRequest {
                id,
                op,
                reply,
                _permit: permit,
            })
            .await
            .map_err(|_| JournalError::Closed)?;
        result.await.unwrap_or(Err(JournalError::Closed))
    }

    async fn read<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, JournalError>>) -> ReadRequest,
    ) -> Result<T, JournalError> {
        let (reply, result) = oneshot::channel();
        self.shared
            .reads
            .send(request(reply))
            .await
            .map_err(|_| JournalError::Closed)?;
        result.await.unwrap_or(Err(JournalError::Closed))
    }
}

impl Journal for SqliteJournal {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.append_tagged(id, first_seq, payloads, manifest, Vec::new())
    }

    fn append_tagged(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        tags: Vec<Vec<Tag>>,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            check_tagged_append(
                &id,
                first_seq,
                &payloads,
                &tags,
                self.max_payload(),
                "SQLite",
            )?;
            if payloads.is_empty() {
                return Ok(());
            }
            let op = WriteOp::Append {
                first_seq,
                payloads,
                manifest,
                tags: normalized(tags),
            };
            self.write(id, op).await
        })
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        let id = id.clone();
        Box::pin(async move {
            if max_events == 0 || from_seq > to_seq {
                return Ok(Vec::new());
            }
            self.read(|reply| ReadRequest::Replay {
                id,
                from_seq,
                to_seq,
                max_events,
                reply,
            })
            .await
        })
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        let id = id.clone();
        Box::pin(async move { self.read(|reply| ReadRequest::Highest { id, reply }).await })
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            if to_seq == 0 {
                return Ok(());
            }
            self.write(id, WriteOp::DeleteTo { to_seq }).await
        })
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            check_payload(&id, snapshot.payload.len(), self.max_payload(), "SQLite")?;
            self.write(id, WriteOp::SaveSnapshot(snapshot)).await
        })
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        let id = id.clone();
        Box::pin(async move {
            self.read(|reply| ReadRequest::LoadSnapshot { id, reply })
                .await
        })
    }

    fn events_by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<TaggedEvent>> {
        let query = query.clone();
        Box::pin(async move {
            check_max_events(max_events)?;
            self.read(|reply| ReadRequest::ByTag {
                query,
                after,
                max_events,
                reply,
            })
            .await
        })
    }

    fn tag_notifications(&self) -> Option<TagNotifications> {
        Some(self.shared.signal.subscribe())
    }

    /// `0:n`, `n` the highest ordering a tag row was ever given (`event_tag`'s
    /// `AUTOINCREMENT` counter), read on a read connection like every read.
    fn offset_ceiling(&self) -> JournalFuture<'_, Offset> {
        Box::pin(async move { self.read(|reply| ReadRequest::Ceiling { reply }).await })
    }

    /// The file's, from its table `journal_identity`: a copy or backup of the file has the
    /// same one.
    fn journal_id(&self) -> Option<JournalId> {
        Some(self.shared.id.clone())
    }

    fn max_payload(&self) -> usize {
        Self::MAX_PAYLOAD_BYTES
    }
}

/// Starts a named thread; its receiver resolves when the thread ends.
fn spawn(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<oneshot::Receiver<()>, JournalError> {
    let (alive, ended) = oneshot::channel::<()>();
    thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _alive = alive; // dropped when the body returns (or unwinds)
            body();
        })
        .map_err(|err| {
            JournalError::storage(None, format!("cannot start a thread: {}", ErrorChain(&err)))
        })?;
    Ok(ended)
}

/// Maps a SQLite error to [`JournalError::Storage`] for `id`, with its cause (the extended
/// result code, which tells a failed fsync from a full disk).
fn storage_error(id: Option<&PersistenceId>) -> impl Fn(rusqlite::Error) -> JournalError + '_ {
    move |err| JournalError::storage(id, ErrorChain(&err))
}

/// A seq read from the database: must be within `0..=MAX_SEQ`, else the data is corrupt
/// (reported at `context_seq`).
fn seq_from_sql(id: &PersistenceId, raw: i64, context_seq: u64) -> Result<u64, JournalError> {
    match u64::try_from(raw) {
        Ok(seq) if seq <= MAX_SEQ => Ok(seq),
        _ => Err(JournalError::Corrupt {
            persistence_id: id.clone(),
            seq: context_seq,
            reason: format!("a stored seq_nr of {raw} is out of range"),
        }),
    }
}
