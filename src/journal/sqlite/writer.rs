//! The writer thread: owns the write connection and commits in groups.
//!
//! It blocks until a write arrives, then takes every write already queued behind it (from any
//! stream, up to the batch bounds) and commits them in one transaction: one fsync for the
//! group. Each write is checked on its own inside the transaction (the fence, a snapshot's
//! seq) before it writes anything, so a refused write changes nothing and the others of the
//! group commit. A storage error (I/O, full disk, busy lock) aborts the transaction: every
//! write of the group gets the error, none is reported done. Replies go out after the commit.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Statement};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::journal::sqlite::options::Counters;
use crate::journal::sqlite::{schema, seq_from_sql, storage_error, SqliteOptions, HIGHEST_SQL};
use crate::journal::{check_fence, check_snapshot, JournalError, PersistenceId, Snapshot};

/// One write waiting for the writer thread.
pub(super) struct WriteRequest {
    pub(super) id: PersistenceId,
    pub(super) op: WriteOp,
    pub(super) reply: oneshot::Sender<Result<(), JournalError>>,
    /// This write's share of the queue's byte budget, given back when it is done.
    pub(super) _permit: OwnedSemaphorePermit,
}

/// What a [`WriteRequest`] asks for.
pub(super) enum WriteOp {
    Append {
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
    },
    DeleteTo {
        to_seq: u64,
    },
    SaveSnapshot(Snapshot),
}

impl WriteOp {
    /// Events, for the batch bound (a delete or a snapshot counts as one).
    fn events(&self) -> usize {
        match self {
            Self::Append { payloads, .. } => payloads.len(),
            Self::DeleteTo { .. } | Self::SaveSnapshot(_) => 1,
        }
    }

    /// Payload bytes, for the batch and queue bounds.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Self::Append { payloads, .. } => payloads.iter().map(Vec::len).sum(),
            Self::DeleteTo { .. } => 0,
            Self::SaveSnapshot(snapshot) => snapshot.payload.len(),
        }
    }
}

/// The prepared statements of the write connection, prepared once.
struct Statements<'c> {
    highest: Statement<'c>,
    insert: Statement<'c>,
    delete: Statement<'c>,
    mark_deleted: Statement<'c>,
    save_snapshot: Statement<'c>,
}

impl<'c> Statements<'c> {
    fn prepare(conn: &'c Connection) -> rusqlite::Result<Self> {
        Ok(Self {
            highest: conn.prepare(HIGHEST_SQL)?,
            insert: conn.prepare(
                "INSERT INTO event_journal (persistence_id, seq_nr, payload, written_at) \
                 VALUES (?1, ?2, ?3, ?4)",
            )?,
            delete: conn
                .prepare("DELETE FROM event_journal WHERE persistence_id = ?1 AND seq_nr <= ?2")?,
            mark_deleted: conn.prepare(
                "INSERT INTO stream_metadata (persistence_id, deleted_to) VALUES (?1, ?2) \
                 ON CONFLICT (persistence_id) DO UPDATE \
                 SET deleted_to = max(deleted_to, excluded.deleted_to)",
            )?,
            save_snapshot: conn.prepare(
                "INSERT INTO snapshot (persistence_id, seq_nr, payload, written_at) \
                 VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (persistence_id) DO UPDATE \
                 SET seq_nr = excluded.seq_nr, payload = excluded.payload, \
                     written_at = excluded.written_at \
                 WHERE excluded.seq_nr >= snapshot.seq_nr",
            )?,
        })
    }

    /// The stream's highest seq, as this transaction sees it.
    fn highest(&mut self, id: &PersistenceId) -> rusqlite::Result<Result<u64, JournalError>> {
        let raw: i64 = self.highest.query_row([id.as_str()], |row| row.get(0))?;
        Ok(seq_from_sql(id, raw, 0))
    }

    /// Carries out one write inside the open transaction. The outer error is a storage
    /// failure (the group is aborted); the inner one refuses this write alone, which then
    /// has written nothing.
    fn apply(
        &mut self,
        request: &WriteRequest,
        now: i64,
    ) -> rusqlite::Result<Result<(), JournalError>> {
        let id = &request.id;
        let highest = match self.highest(id)? {
            Ok(highest) => highest,
            Err(corrupt) => return Ok(Err(corrupt)),
        };
        match &request.op {
            WriteOp::Append {
                first_seq,
                payloads,
            } => {
                if let Err(conflict) = check_fence(id, *first_seq, highest) {
                    return Ok(Err(conflict));
                }
                // check_append bounded every seq by MAX_SEQ, so they fit an i64.
                for (seq, payload) in (*first_seq as i64..).zip(payloads) {
                    self.insert
                        .execute(params![id.as_str(), seq, payload, now])?;
                }
            }
            WriteOp::DeleteTo { to_seq } => {
                let to = (*to_seq).min(highest) as i64;
                if to > 0 {
                    self.delete.execute(params![id.as_str(), to])?;
                    self.mark_deleted.execute(params![id.as_str(), to])?;
                }
            }
            WriteOp::SaveSnapshot(snapshot) => {
                if let Err(invalid) = check_snapshot(id, snapshot.seq, highest) {
                    return Ok(Err(invalid));
                }
                self.save_snapshot.execute(params![
                    id.as_str(),
                    snapshot.seq as i64,
                    snapshot.payload,
                    now
                ])?;
            }
        }
        Ok(Ok(()))
    }
}

/// The writer thread's body: opens the connection, reports the outcome through `opened`,
/// then commits groups until every sender is gone and the queue is empty.
pub(super) fn run(
    path: &Path,
    options: &SqliteOptions,
    mut requests: mpsc::Receiver<WriteRequest>,
    counters: Arc<Counters>,
    opened: oneshot::Sender<Result<(), JournalError>>,
) {
    let conn = match schema::open_writer(path, options) {
        Ok(conn) => conn,
        Err(err) => {
            let _ = opened.send(Err(err));
            return;
        }
    };
    let mut statements = match Statements::prepare(&conn) {
        Ok(statements) => statements,
        Err(err) => {
            let _ = opened.send(Err(storage_error(None)(err)));
            return;
        }
    };
    if opened.send(Ok(())).is_err() {
        return; // the opener gave up waiting
    }
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(request) => request,
            None => match requests.blocking_recv() {
                Some(request) => request,
                None => break,
            },
        };
        let (mut events, mut bytes) = (first.op.events(), first.op.bytes());
        let mut group = vec![first];
        while let Ok(request) = requests.try_recv() {
            events += request.op.events();
            bytes += request.op.bytes();
            if events > options.max_batch_events || bytes > options.max_batch_bytes {
                carried = Some(request);
                break;
            }
            group.push(request);
        }
        commit(&conn, &mut statements, group, &counters);
    }
}

/// Commits `group` in one transaction and replies to each write.
fn commit(
    conn: &Connection,
    statements: &mut Statements<'_>,
    group: Vec<WriteRequest>,
    counters: &Counters,
) {
    let now = unix_millis();
    let outcome = (|| {
        if !conn.is_autocommit() {
            // A ROLLBACK after an earlier failure did not go through; try again.
            conn.execute_batch("ROLLBACK")?;
        }
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let results = group
            .iter()
            .map(|request| statements.apply(request, now))
            .collect::<rusqlite::Result<Vec<_>>>()?;
        conn.execute_batch("COMMIT")?;
        Ok(results)
    })();
    match outcome {
        Ok(results) => {
            Counters::add(&counters.transactions, 1);
            for (request, result) in group.into_iter().zip(results) {
                match (&request.op, &result) {
                    (WriteOp::Append { payloads, .. }, Ok(())) => {
                        Counters::add(&counters.appends, 1);
                        Counters::add(&counters.events, payloads.len() as u64);
                    }
                    (_, Ok(())) => {}
                    (_, Err(_)) => Counters::add(&counters.rejected, 1),
                }
                // A caller that dropped its future has left; the write stands regardless.
                let _ = request.reply.send(result);
            }
        }
        Err(err) => {
            let err: rusqlite::Error = err;
            if !conn.is_autocommit() {
                // SQLite may have rolled back already; if this fails, the next group retries
                // it before its BEGIN.
                let _ = conn.execute_batch("ROLLBACK");
            }
            Counters::add(&counters.rejected, group.len() as u64);
            log::warn!("journal: a group of {} writes failed: {err}", group.len());
            for request in group {
                let _ = request
                    .reply
                    .send(Err(JournalError::storage(Some(&request.id), &err)));
            }
        }
    }
}

/// Milliseconds since the Unix epoch (0 for a clock set before it).
fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}
