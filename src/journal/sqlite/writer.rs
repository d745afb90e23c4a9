//! The writer thread: owns the write connection and commits in groups.
//!
//! It blocks until a write arrives, then takes every write already queued behind it (from any
//! stream, up to the batch bounds) and commits them in one transaction: one fsync for the group. If
//! the last commit answered several writers, it first [`linger`]s briefly for them to come back, so
//! that they share one commit. Each write is checked on its own inside the transaction (the fence,
//! a snapshot's seq) before it writes anything, so a refused write changes nothing and the others
//! of the group commit. A storage error (I/O, full disk, busy lock) aborts the transaction: every
//! write of the group gets the error, none is reported done. Replies go out after the commit.
//!
//! Appended events go to `event_buffer` first, a table without a secondary index, so a
//! commit dirties the buffer's last page or two however many streams it touches; inserting
//! into the `(persistence_id, seq_nr)` index of `event_journal` instead dirties one index page
//! per stream, and on this kind of machine each dirty page costs about as much as the whole
//! rest of an append. Once the buffer holds `buffer_events` events or [`FOLD_BYTES`] bytes,
//! one transaction moves it into `event_journal` (a fold), writing each touched index page
//! once for all the events it receives. Appends of [`DIRECT_EVENTS`] or more events go
//! straight to `event_journal`. The writer keeps the highest seq of every stream with events
//! in the buffer in memory, for the fence and for the readers, which look into the buffer
//! only for those streams.
//!
//! A tagged append also writes one `event_tag` row per tag of each entry, in the same
//! transaction (see the schema module), and once it is committed the writer says so to the
//! journal's [`TagSignal`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Statement};
use tokio::sync::{mpsc, oneshot};

use crate::journal::sqlite::config::{Counters, SqliteConfig, SqliteDurability};
use crate::journal::sqlite::options::SqliteOptions;
use crate::journal::sqlite::{schema, seq_from_sql, storage_error, HIGHEST_SQL};
use crate::journal::write::{WriteOp, WriteRequest};
use crate::journal::{
    check_fence, check_snapshot, slice_of, JournalError, JournalId, PersistenceId, TagSignal,
};
use crate::runtime::error_chain::ErrorChain;

/// Fold the buffer into `event_journal` once it holds this many payload bytes (or
/// `buffer_events` events).
const FOLD_BYTES: usize = 4 << 20;
/// An append of this many events goes straight into `event_journal`: its index pages are
/// shared by its own events, so the buffer would only copy it twice.
const DIRECT_EVENTS: usize = 32;
/// How long the writer waits for the first of the writers it just answered to come back…
const LINGER_FIRST: Duration = Duration::from_micros(50);
/// … and for each next one.
const LINGER_GAP: Duration = Duration::from_micros(10);

/// The highest seq of every stream with events in `event_buffer`, as committed (and of a
/// few more: deletion does not remove entries). Shared with the readers;
/// updated after each commit (so an acknowledged append is always in it) and emptied after
/// each fold commits (so a stream missing from it has no buffered events).
pub(super) type Buffered = Arc<Mutex<HashMap<PersistenceId, u64>>>;

/// The prepared statements of the write connection, prepared once.
struct Statements<'c> {
    highest: Statement<'c>,
    buffer: Statement<'c>,
    insert: Statement<'c>,
    delete: Statement<'c>,
    delete_buffered: Statement<'c>,
    mark_deleted: Statement<'c>,
    save_snapshot: Statement<'c>,
    tag: Statement<'c>,
}

impl<'c> Statements<'c> {
    fn prepare(conn: &'c Connection) -> rusqlite::Result<Self> {
        Ok(Self {
            highest: conn.prepare(HIGHEST_SQL)?,
            buffer: conn.prepare(
                "INSERT INTO event_buffer (persistence_id, seq_nr, payload, written_at, \
                 ser_codec, ser_manifest, ser_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?,
            insert: conn.prepare(
                "INSERT INTO event_journal (persistence_id, seq_nr, payload, written_at, \
                 ser_codec, ser_manifest, ser_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?,
            delete: conn
                .prepare("DELETE FROM event_journal WHERE persistence_id = ?1 AND seq_nr <= ?2")?,
            delete_buffered: conn
                .prepare("DELETE FROM event_buffer WHERE persistence_id = ?1 AND seq_nr <= ?2")?,
            mark_deleted: conn.prepare(
                "INSERT INTO stream_metadata (persistence_id, deleted_to) VALUES (?1, ?2) \
                 ON CONFLICT (persistence_id) DO UPDATE \
                 SET deleted_to = max(deleted_to, excluded.deleted_to)",
            )?,
            save_snapshot: conn.prepare(
                "INSERT INTO snapshot (persistence_id, seq_nr, payload, written_at, \
                 ser_codec, ser_manifest, ser_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (persistence_id) DO UPDATE \
                 SET seq_nr = excluded.seq_nr, payload = excluded.payload, \
                     written_at = excluded.written_at, ser_codec = excluded.ser_codec, \
                     ser_manifest = excluded.ser_manifest, ser_version = excluded.ser_version \
                 WHERE excluded.seq_nr >= snapshot.seq_nr",
            )?,
            tag: conn.prepare(
                "INSERT INTO event_tag (tag, persistence_id, seq_nr, slice, written_at, \
                 buffer_row) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?,
        })
    }
}

/// The writer's state between groups.
struct Writer<'c> {
    conn: &'c Connection,
    statements: Statements<'c>,
    /// The writer's own copy of [`Buffered`], read without a lock.
    buffered: HashMap<PersistenceId, u64>,
    shared: Buffered,
    buffered_events: usize,
    buffered_bytes: usize,
    counters: Arc<Counters>,
    signal: Arc<TagSignal>,
}

/// The body of the writer thread: opens the connection, folds what a previous run left in
/// the buffer, reports through `opened` (with the connection's durability settings and the
/// file's journal id), then commits groups until every sender is gone and the queue is empty,
/// and folds once more.
pub(super) fn run(
    path: &Path,
    options: &SqliteOptions,
    mut requests: mpsc::Receiver<WriteRequest>,
    shared: Buffered,
    counters: Arc<Counters>,
    signal: Arc<TagSignal>,
    opened: oneshot::Sender<Result<(SqliteDurability, JournalId), JournalError>>,
) {
    // `_lock` keeps other processes out for as long as this thread runs.
    let (conn, _lock, id) = match schema::open_writer(path, &options.config) {
        Ok(opened) => opened,
        Err(err) => {
            let _ = opened.send(Err(err));
            return;
        }
    };
    let statements = match Statements::prepare(&conn) {
        Ok(statements) => statements,
        Err(err) => {
            let _ = opened.send(Err(storage_error(None)(err)));
            return;
        }
    };
    let mut writer = Writer {
        conn: &conn,
        statements,
        buffered: HashMap::new(),
        shared,
        buffered_events: 0,
        buffered_bytes: 0,
        counters,
        signal,
    };
    // A crashed run may have left events in the buffer; the fence needs them indexed.
    let leftover = conn.query_row("SELECT EXISTS (SELECT 1 FROM event_buffer)", [], |row| {
        row.get::<_, bool>(0)
    });
    if let Err(err) = leftover.and_then(|leftover| if leftover { writer.fold() } else { Ok(()) }) {
        let _ = opened.send(Err(storage_error(None)(err)));
        return;
    }
    // What the connection says now, after all of its setup: the journal reports it.
    let durability = match SqliteDurability::of(&conn) {
        Ok(durability) => durability,
        Err(err) => {
            let _ = opened.send(Err(storage_error(None)(err)));
            return;
        }
    };
    if opened.send(Ok((durability, id))).is_err() {
        return; // the opener gave up waiting
    }
    #[cfg(feature = "metrics")]
    let mut meter = crate::journal::metrics::SqliteMeter::new(
        options
            .metrics_label
            .as_deref()
            .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
    );
    let mut carried = None;
    let (mut last_replies, mut last_commit) = (0, Duration::ZERO);
    loop {
        let first = match carried.take() {
            Some(request) => request,
            None => match requests.blocking_recv() {
                Some(request) => request,
                None => break,
            },
        };
        let mut group = Group::new(first, &options.config);
        while let Ok(request) = requests.try_recv() {
            if let Some(over) = group.push(request) {
                carried = Some(over);
                break;
            }
        }
        if carried.is_none() && last_replies > 1 {
            linger(&mut requests, &mut group, &mut carried, last_commit);
        }
        let group = group.requests;
        last_replies = group.len();
        let started = Instant::now();
        let _committed = writer.commit(group);
        last_commit = started.elapsed();
        if (writer.buffered_events >= options.config.buffer_events
            || writer.buffered_bytes >= FOLD_BYTES)
            && let Err(err) = writer.fold()
        {
            log::warn!(
                "journal: moving buffered events into event_journal failed: {}",
                ErrorChain(&err)
            );
        }
        #[cfg(feature = "metrics")]
        meter.transaction(
            _committed.then_some((last_replies, last_commit)),
            &writer.counters.read(requests.len()),
        );
    }
    // Leave a tidy file: every event in event_journal.
    if writer.buffered_events > 0
        && let Err(err) = writer.fold()
    {
        log::warn!(
            "journal: moving buffered events into event_journal failed: {}",
            ErrorChain(&err)
        );
    }
}

/// The writes of the next transaction, within the batch bounds.
struct Group {
    requests: Vec<WriteRequest>,
    events: usize,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

impl Group {
    fn new(first: WriteRequest, options: &SqliteConfig) -> Self {
        Self {
            events: first.op.events(),
            bytes: first.op.bytes(),
            requests: vec![first],
            max_events: options.max_batch_events,
            max_bytes: options.max_batch_bytes,
        }
    }

    /// Adds `request`, or hands it back if it would cross a bound.
    fn push(&mut self, request: WriteRequest) -> Option<WriteRequest> {
        let (events, bytes) = (request.op.events(), request.op.bytes());
        if self.events + events > self.max_events || self.bytes + bytes > self.max_bytes {
            return Some(request);
        }
        self.events += events;
        self.bytes += bytes;
        self.requests.push(request);
        None
    }
}

/// Waits for the writers just answered to send their next writes, so that they join this
/// group instead of forming a small one of their own while it commits: as long as they keep
/// arriving (each within [`LINGER_GAP`] of the previous one, the first within
/// [`LINGER_FIRST`]), and never longer than the last commit took. Only called when the last
/// commit answered more than one write: a lone sequential writer never waits.
fn linger(
    requests: &mut mpsc::Receiver<WriteRequest>,
    group: &mut Group,
    carried: &mut Option<WriteRequest>,
    last_commit: Duration,
) {
    let start = Instant::now();
    let deadline = start + last_commit;
    let mut last_arrival = None;
    loop {
        match requests.try_recv() {
            Ok(request) => {
                if let Some(over) = group.push(request) {
                    *carried = Some(over);
                    return;
                }
                last_arrival = Some(Instant::now());
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                let now = Instant::now();
                let quiet = match last_arrival {
                    None => now - start > LINGER_FIRST,
                    Some(at) => now - at > LINGER_GAP,
                };
                if quiet || now > deadline {
                    return;
                }
                std::thread::yield_now();
            }
        }
    }
}

/// Rolls back a transaction that failed; SQLite may have done so already.
fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        // If this fails too, the next transaction retries it before its BEGIN.
        let _ = conn.execute_batch("ROLLBACK");
    }
}

fn begin(conn: &Connection) -> rusqlite::Result<()> {
    if !conn.is_autocommit() {
        // A ROLLBACK after an earlier failure did not go through; try again.
        conn.execute_batch("ROLLBACK")?;
    }
    conn.execute_batch("BEGIN IMMEDIATE")
}

/// A stream appended to by the transaction being built.
struct Appended {
    highest: u64,
    /// Whether some of its events went into the buffer.
    buffered: bool,
}

impl Writer<'_> {
    /// The stream's highest seq, as this transaction sees it: from the group's own appends,
    /// then the buffer, then the indexed table.
    fn highest(
        &mut self,
        group: &HashMap<PersistenceId, Appended>,
        id: &PersistenceId,
    ) -> rusqlite::Result<Result<u64, JournalError>> {
        let known = group.get(id).map(|appended| appended.highest);
        if let Some(seq) = known.or_else(|| self.buffered.get(id).copied()) {
            return Ok(Ok(seq));
        }
        let raw: i64 = self
            .statements
            .highest
            .query_row([id.as_str()], |row| row.get(0))?;
        Ok(seq_from_sql(id, raw, 0))
    }

    /// Carries out one write inside the open transaction, noting appended streams in
    /// `group`. The outer error is a storage failure (the group is aborted); the inner one
    /// refuses this write alone, which then has written nothing.
    fn apply(
        &mut self,
        group: &mut HashMap<PersistenceId, Appended>,
        request: &WriteRequest,
        now: i64,
    ) -> rusqlite::Result<Result<(), JournalError>> {
        let id = &request.id;
        let highest = match self.highest(group, id)? {
            Ok(highest) => highest,
            Err(corrupt) => return Ok(Err(corrupt)),
        };
        let statements = &mut self.statements;
        match &request.op {
            WriteOp::Append {
                first_seq,
                payloads,
                manifest,
                tags,
            } => {
                if let Err(conflict) = check_fence(id, *first_seq, highest) {
                    return Ok(Err(conflict));
                }
                let slice = slice_of(id);
                let buffered = payloads.len() < DIRECT_EVENTS;
                let insert = if buffered {
                    &mut statements.buffer
                } else {
                    &mut statements.insert
                };
                // check_append bounded every seq by MAX_SEQ, so they fit an i64.
                let (codec, name, version) =
                    (manifest.codec_id(), manifest.name(), manifest.version());
                for (index, (seq, payload)) in (*first_seq as i64..).zip(payloads).enumerate() {
                    insert.execute(params![
                        id.as_str(),
                        seq,
                        payload,
                        now,
                        codec,
                        name,
                        version
                    ])?;
                    let Some(entry_tags) = tags.get(index) else {
                        continue;
                    };
                    let buffer_row = buffered.then(|| self.conn.last_insert_rowid());
                    for tag in entry_tags {
                        statements.tag.execute(params![
                            tag.as_str(),
                            id.as_str(),
                            seq,
                            slice,
                            now,
                            buffer_row
                        ])?;
                    }
                }
                let appended = group.entry(id.clone()).or_insert(Appended {
                    highest: 0,
                    buffered: false,
                });
                appended.highest = first_seq + payloads.len() as u64 - 1;
                appended.buffered |= buffered;
            }
            WriteOp::DeleteTo { to_seq } => {
                let to = (*to_seq).min(highest) as i64;
                if to > 0 {
                    statements.delete.execute(params![id.as_str(), to])?;
                    if group.get(id).is_some_and(|appended| appended.buffered)
                        || self.buffered.contains_key(id)
                    {
                        statements
                            .delete_buffered
                            .execute(params![id.as_str(), to])?;
                    }
                    statements.mark_deleted.execute(params![id.as_str(), to])?;
                }
            }
            WriteOp::SaveSnapshot(snapshot) => {
                if let Err(invalid) = check_snapshot(id, snapshot.seq, highest) {
                    return Ok(Err(invalid));
                }
                statements.save_snapshot.execute(params![
                    id.as_str(),
                    snapshot.seq as i64,
                    snapshot.payload,
                    now,
                    snapshot.manifest.codec_id(),
                    snapshot.manifest.name(),
                    snapshot.manifest.version()
                ])?;
            }
        }
        Ok(Ok(()))
    }

    /// Commits `group` in one transaction and replies to each write; whether it committed.
    fn commit(&mut self, group: Vec<WriteRequest>) -> bool {
        #[cfg(feature = "tracing")]
        let _span = crate::journal::write::journal_commit("sqlite", &group).entered();
        let now = unix_millis();
        let mut appended = HashMap::new();
        let outcome = (|| {
            begin(self.conn)?;
            let results = group
                .iter()
                .map(|request| self.apply(&mut appended, request, now))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            self.conn.execute_batch("COMMIT")?;
            Ok(results)
        })();
        let results = match outcome {
            Ok(results) => results,
            Err(err) => {
                let err: rusqlite::Error = err;
                rollback(self.conn);
                Counters::add(&self.counters.rejected, group.len() as u64);
                let err = ErrorChain(&err);
                log::warn!("journal: a group of {} writes failed: {err}", group.len());
                for request in group {
                    let _ = request
                        .reply
                        .send(Err(JournalError::storage(Some(&request.id), &err)));
                }
                return false;
            }
        };
        // Committed: the buffer's new events become visible to the readers before any
        // caller hears of them. A stream written only to event_journal needs no entry (the
        // index answers for it), so the map stays as small as the buffer.
        let buffered: Vec<(PersistenceId, u64)> = appended
            .into_iter()
            .filter(|(id, appended)| appended.buffered || self.buffered.contains_key(id))
            .map(|(id, appended)| (id, appended.highest))
            .collect();
        self.shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(buffered.iter().cloned());
        self.buffered.extend(buffered);
        Counters::add(&self.counters.transactions, 1);
        let tagged = group
            .iter()
            .zip(&results)
            .any(|(request, result)| request.op.is_tagged() && result.is_ok());
        if tagged {
            // Before any caller hears of the commit: a reader woken now finds the entries.
            self.signal.notify();
        }
        for (request, result) in group.into_iter().zip(results) {
            match (&request.op, &result) {
                (WriteOp::Append { payloads, .. }, Ok(())) => {
                    Counters::add(&self.counters.appends, 1);
                    Counters::add(&self.counters.events, payloads.len() as u64);
                    if payloads.len() < DIRECT_EVENTS {
                        self.buffered_events += payloads.len();
                        self.buffered_bytes += request.op.bytes();
                    }
                }
                (_, Ok(())) => {}
                (_, Err(_)) => Counters::add(&self.counters.rejected, 1),
            }
            // A caller that dropped its future has left; the write stands regardless.
            let _ = request.reply.send(result);
        }
        true
    }

    /// Moves every buffered event into `event_journal` in one transaction.
    fn fold(&mut self) -> rusqlite::Result<()> {
        let result = (|| {
            begin(self.conn)?;
            self.conn.execute_batch(
                "INSERT INTO event_journal (persistence_id, seq_nr, payload, written_at, \
                 ser_codec, ser_manifest, ser_version) \
                 SELECT persistence_id, seq_nr, payload, written_at, \
                 ser_codec, ser_manifest, ser_version FROM event_buffer; \
                 DELETE FROM event_buffer; \
                 COMMIT",
            )
        })();
        if result.is_err() {
            rollback(self.conn);
            return result;
        }
        // Only now: a reader that no longer finds a stream here finds its events indexed.
        self.shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.buffered.clear();
        self.buffered_events = 0;
        self.buffered_bytes = 0;
        Counters::add(&self.counters.folds, 1);
        Ok(())
    }
}

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}
