//! The reader threads: each owns a read-only connection. In WAL mode a reader sees the last
//! committed state and never waits for the writer, so reads do not queue behind commits.
//!
//! A stream's recent events may still be in `event_buffer` (see the writer module); the
//! writer's map of buffered streams tells which streams to look for there, so the reads of
//! all other streams use the index alone.
//!
//! Reads by tag walk `event_tag` by its `(tag, ordering)` index and find each entry in
//! `event_journal` by its key or in `event_buffer` by the rowid the tag row noted (see the
//! schema module); an entry in neither was deleted.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use rusqlite::Statement;
use tokio::sync::{mpsc, oneshot};

use crate::codec::Manifest;
use crate::journal::by_tag::corrupt_tag_row;
use crate::journal::sqlite::writer::Buffered;
use crate::journal::sqlite::{schema, seq_from_sql, storage_error, HIGHEST_SQL};
use crate::journal::{
    stored_manifest, JournalError, Offset, PersistenceId, Snapshot, StoredEvent, TagQuery,
    TaggedEvent,
};
use crate::runtime::error_chain::ErrorChain;

type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

/// One read waiting for a reader thread.
pub(super) enum ReadRequest {
    Replay {
        id: PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
        reply: Reply<Vec<StoredEvent>>,
    },
    Highest {
        id: PersistenceId,
        reply: Reply<u64>,
    },
    LoadSnapshot {
        id: PersistenceId,
        reply: Reply<Option<Snapshot>>,
    },
    ByTag {
        query: TagQuery,
        after: Offset,
        max_events: usize,
        reply: Reply<Vec<TaggedEvent>>,
    },
    Ceiling {
        reply: Reply<Offset>,
    },
}

/// The reader threads share one queue.
pub(super) type SharedQueue = Arc<Mutex<mpsc::Receiver<ReadRequest>>>;

struct Statements<'c> {
    replay: Statement<'c>,
    replay_buffered: Statement<'c>,
    highest: Statement<'c>,
    snapshot: Statement<'c>,
    by_tag: Statement<'c>,
    ceiling: Statement<'c>,
    buffered: Buffered,
}

/// A reader thread's body: opens its connection, reports through `opened`, then serves
/// reads until every sender is gone.
pub(super) fn run(
    path: &Path,
    busy_timeout: Duration,
    queue: SharedQueue,
    buffered: Buffered,
    opened: oneshot::Sender<Result<(), JournalError>>,
) {
    let conn = match schema::open_reader(path, busy_timeout) {
        Ok(conn) => conn,
        Err(err) => {
            let _ = opened.send(Err(err));
            return;
        }
    };
    let prepared = (|| {
        Ok(Statements {
            replay: conn.prepare(
                "SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM event_journal \
                 WHERE persistence_id = ?1 AND seq_nr >= ?2 AND seq_nr <= ?3 \
                 ORDER BY seq_nr LIMIT ?4",
            )?,
            replay_buffered: conn.prepare(
                "SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM event_journal \
                 WHERE persistence_id = ?1 AND seq_nr >= ?2 AND seq_nr <= ?3 \
                 UNION ALL \
                 SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM event_buffer \
                 WHERE persistence_id = ?1 AND seq_nr >= ?2 AND seq_nr <= ?3 \
                 ORDER BY seq_nr LIMIT ?4",
            )?,
            highest: conn.prepare(HIGHEST_SQL)?,
            snapshot: conn.prepare(
                "SELECT seq_nr, payload, ser_codec, ser_manifest, ser_version FROM snapshot \
                 WHERE persistence_id = ?1",
            )?,
            by_tag: conn.prepare(
                "SELECT t.ordering, t.persistence_id, t.seq_nr, t.written_at, \
                 coalesce(j.payload, b.payload), coalesce(j.ser_codec, b.ser_codec), \
                 coalesce(j.ser_manifest, b.ser_manifest), coalesce(j.ser_version, b.ser_version) \
                 FROM event_tag t \
                 LEFT JOIN event_journal j \
                   ON j.persistence_id = t.persistence_id AND j.seq_nr = t.seq_nr \
                 LEFT JOIN event_buffer b ON b.rowid = t.buffer_row \
                   AND b.persistence_id = t.persistence_id AND b.seq_nr = t.seq_nr \
                 WHERE t.tag = ?1 AND t.ordering > ?2 AND t.slice BETWEEN ?3 AND ?4 \
                 ORDER BY t.ordering LIMIT ?5",
            )?,
            // The highest ordering ever given: `AUTOINCREMENT` keeps it in `sqlite_sequence`
            // (tag rows are never deleted, but a row deleted by hand keeps its number there).
            ceiling: conn.prepare(
                "SELECT max(coalesce((SELECT max(ordering) FROM event_tag), 0), \
                 coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'event_tag'), 0))",
            )?,
            buffered,
        })
    })();
    let mut statements = match prepared {
        Ok(statements) => statements,
        Err(err) => {
            let _ = opened.send(Err(storage_error(None)(err)));
            return;
        }
    };
    if opened.send(Ok(())).is_err() {
        return;
    }
    loop {
        // Whoever holds the lock waits for the next read; the others wait for the lock.
        let request = queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .blocking_recv();
        match request {
            None => break,
            Some(ReadRequest::Replay {
                id,
                from_seq,
                to_seq,
                max_events,
                reply,
            }) => {
                let _ = reply.send(statements.replay(&id, from_seq, to_seq, max_events));
            }
            Some(ReadRequest::Highest { id, reply }) => {
                let _ = reply.send(statements.highest(&id));
            }
            Some(ReadRequest::LoadSnapshot { id, reply }) => {
                let _ = reply.send(statements.snapshot(&id));
            }
            Some(ReadRequest::ByTag {
                query,
                after,
                max_events,
                reply,
            }) => {
                let _ = reply.send(statements.by_tag(&query, after, max_events));
            }
            Some(ReadRequest::Ceiling { reply }) => {
                let _ = reply.send(statements.ceiling());
            }
        }
    }
}

/// SQL integers are `i64`; a bound above `i64::MAX` means "no bound".
fn sql_bound(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A stored value that is not what the schema says (NULL, wrong type): corrupt.
fn corrupt(id: &PersistenceId, seq: u64, err: impl std::fmt::Display) -> JournalError {
    JournalError::Corrupt {
        persistence_id: id.clone(),
        seq,
        reason: err.to_string(),
    }
}

impl Statements<'_> {
    fn replay(
        &mut self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        if max_events == 0 || from_seq > to_seq {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        // Checked before the query: a stream that is not in the map then had no buffered
        // events, and any it gets meanwhile are not acknowledged yet.
        let statement = if self.is_buffered(id) {
            &mut self.replay_buffered
        } else {
            &mut self.replay
        };
        let mut rows = statement
            .query(rusqlite::params![
                id.as_str(),
                sql_bound(from_seq),
                sql_bound(to_seq),
                limit
            ])
            .map_err(storage_error(Some(id)))?;
        let mut events = Vec::new();
        let mut expected = from_seq.max(1);
        let mut last: Option<Manifest> = None;
        while let Some(row) = rows.next().map_err(storage_error(Some(id)))? {
            let raw: i64 = row
                .get(0)
                .map_err(|err| corrupt(id, expected, ErrorChain(&err)))?;
            let seq = seq_from_sql(id, raw, expected)?;
            if seq < expected || seq > to_seq {
                return Err(JournalError::Corrupt {
                    persistence_id: id.clone(),
                    seq,
                    reason: format!("out of order: expected seq {expected} or later"),
                });
            }
            let payload: Vec<u8> = row
                .get(1)
                .map_err(|err| corrupt(id, seq, ErrorChain(&err)))?;
            let manifest = manifest(row, id, seq, &mut last)?;
            events.push(StoredEvent {
                seq,
                payload,
                manifest,
            });
            expected = seq + 1;
        }
        Ok(events)
    }

    fn by_tag(
        &mut self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> Result<Vec<TaggedEvent>, JournalError> {
        let (transaction, after) = after.parts();
        if transaction != 0 {
            return Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: format!(
                    "offset {transaction}:{after} is not an offset of a SQLite journal (they \
                     are 0:n)"
                ),
            });
        }
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        let mut rows = self
            .by_tag
            .query(rusqlite::params![
                query.tag.as_str(),
                sql_bound(after),
                query.slices.first(),
                query.slices.last(),
                limit
            ])
            .map_err(storage_error(None))?;
        let mut events = Vec::new();
        let mut last = None;
        while let Some(row) = rows.next().map_err(storage_error(None))? {
            let read = |index| row.get::<_, i64>(index);
            let ordering = read(0).map_err(|err| corrupt_tag_row(query, ErrorChain(&err)))?;
            let id: String = row
                .get(1)
                .map_err(|err| corrupt_tag_row(query, ErrorChain(&err)))?;
            let id =
                PersistenceId::new(id).map_err(|err| corrupt_tag_row(query, ErrorChain(&err)))?;
            let raw_seq = read(2).map_err(|err| corrupt(&id, 0, ErrorChain(&err)))?;
            let seq = seq_from_sql(&id, raw_seq, 0)?;
            let millis = read(3).map_err(|err| corrupt(&id, seq, ErrorChain(&err)))?;
            let written_at = UNIX_EPOCH + Duration::from_millis(u64::try_from(millis).unwrap_or(0));
            let offset = match u64::try_from(ordering) {
                Ok(ordering) if ordering > after => Offset::from_parts(0, ordering),
                _ => {
                    return Err(corrupt(
                        &id,
                        seq,
                        format!("a tag row's ordering of {ordering}"),
                    ))
                }
            };
            let payload: Option<Vec<u8>> = row
                .get(4)
                .map_err(|err| corrupt(&id, seq, ErrorChain(&err)))?;
            let event = match payload {
                Some(payload) => Some(StoredEvent {
                    seq,
                    payload,
                    manifest: manifest_at(row, 5, &id, seq, &mut last)?,
                }),
                None => None, // deleted
            };
            events.push(TaggedEvent {
                offset,
                persistence_id: id,
                seq,
                written_at,
                event,
            });
        }
        Ok(events)
    }

    /// `0:n`, `n` the highest ordering a tag row was ever given (0 if none).
    fn ceiling(&mut self) -> Result<Offset, JournalError> {
        let raw: i64 = self
            .ceiling
            .query_row([], |row| row.get(0))
            .map_err(storage_error(None))?;
        let position = u64::try_from(raw).map_err(|_| {
            JournalError::storage(
                None,
                format!("corrupt journal data: a tag row's ordering of {raw}"),
            )
        })?;
        Ok(Offset::from_parts(0, position))
    }

    fn is_buffered(&self, id: &PersistenceId) -> bool {
        self.buffered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }

    fn highest(&mut self, id: &PersistenceId) -> Result<u64, JournalError> {
        let buffered = self
            .buffered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied();
        let raw: i64 = self
            .highest
            .query_row([id.as_str()], |row| row.get(0))
            .map_err(storage_error(Some(id)))?;
        // Highest seqs only grow, so the larger of the two is the current one.
        Ok(seq_from_sql(id, raw, 0)?.max(buffered.unwrap_or(0)))
    }

    fn snapshot(&mut self, id: &PersistenceId) -> Result<Option<Snapshot>, JournalError> {
        let mut rows = self
            .snapshot
            .query([id.as_str()])
            .map_err(storage_error(Some(id)))?;
        let Some(row) = rows.next().map_err(storage_error(Some(id)))? else {
            return Ok(None);
        };
        let raw_seq: i64 = row.get(0).map_err(|err| corrupt(id, 0, ErrorChain(&err)))?;
        let seq = seq_from_sql(id, raw_seq, 0)?;
        if seq == 0 {
            return Err(JournalError::Corrupt {
                persistence_id: id.clone(),
                seq,
                reason: "a snapshot at seq 0".into(),
            });
        }
        let payload = row
            .get(1)
            .map_err(|err| corrupt(id, seq, ErrorChain(&err)))?;
        let manifest = manifest(row, id, seq, &mut None)?;
        Ok(Some(Snapshot {
            seq,
            payload,
            manifest,
        }))
    }
}

/// The manifest in columns 2 to 4 of `row` (see [`stored_manifest`]).
fn manifest(
    row: &rusqlite::Row<'_>,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    manifest_at(row, 2, id, seq, last)
}

/// The manifest in columns `first` to `first + 2` of `row` (see [`stored_manifest`]).
fn manifest_at(
    row: &rusqlite::Row<'_>,
    first: usize,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    let codec: i64 = row
        .get(first)
        .map_err(|err| corrupt(id, seq, ErrorChain(&err)))?;
    let name = row
        .get_ref(first + 1)
        .and_then(|value| Ok(value.as_str()?))
        .map_err(|err| corrupt(id, seq, ErrorChain(&err)))?;
    let version: i64 = row
        .get(first + 2)
        .map_err(|err| corrupt(id, seq, ErrorChain(&err)))?;
    stored_manifest(id, seq, (codec, name, version), last)
}
