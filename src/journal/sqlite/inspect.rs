//! Reading a journal file as it is, read-only, beside the application that has it open: the
//! [`SqliteInspector`] (see [`JournalInspector`]).
//!
//! It opens the file with a read-only connection of its own (`SQLITE_OPEN_READONLY`, and
//! `PRAGMA query_only`), and never takes the writer's lock (`<file>-lock`): a live journal's
//! writer goes on while it reads (in WAL mode a reader never blocks the writer, and sees the
//! last commit). It reads the file's marks as the journal does (`application_id`,
//! `user_version`, the tables of the version), refusing what the journal would refuse, and reads
//! schema versions 1 and 2 as they are (without manifests, without tags) instead of migrating
//! them. A stream's events are those of `event_journal` and `event_buffer` together, as for the
//! journal's readers. The dead letters its dead-letter store keeps in the file are read as
//! the store lists them (a listing never reads the bodies).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::oneshot;

use crate::codec::Manifest;
use crate::delivery::dead_letters::{DeadLetterFilter, StoredDeadLetter};
use crate::journal::dead_letter_sql::{list_clause, listing_columns, FilterParams, COLUMNS};
use crate::journal::inspect::{
    attach_tags, check_id, check_identity, check_seq, check_slice, dead_letter_entry,
    dead_letter_listing, snapshot_problem, tag_order_problem, CheckReport, DeadLetterListing,
    InspectedEvent, InspectedSnapshot, JournalInspector, Problem, ProblemKind, Problems,
    SchemaInfo, StreamInfo,
};
use crate::journal::sqlite::dead_letters::row as dead_letter_row;
use crate::journal::sqlite::schema::{APPLICATION_ID, SCHEMA_VERSION};
use crate::journal::sqlite::{backup, seq_from_sql, spawn, storage_error};
use crate::journal::{
    stored_manifest, JournalError, JournalFuture, PersistenceId, Snapshot, StoredEvent,
};
use crate::runtime::error_chain::ErrorChain;

/// How long a read waits for a lock (the writer's checkpoint, a backup's restart) before it
/// fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A read-only view of a SQLite journal file (feature `sqlite`): see [`JournalInspector`].
///
/// ```no_run
/// use actix_delivery::journal::{JournalInspector, SqliteInspector};
///
/// # async fn _demo() -> Result<(), actix_delivery::journal::JournalError> {
/// // Beside the application that has the journal open.
/// let inspector = SqliteInspector::open("orders.journal").await?;
/// for stream in inspector.streams(None, 100).await? {
///     println!("{}: {}", stream.persistence_id, stream.highest_seq);
/// }
/// let report = inspector.check(100).await?;
/// assert!(report.passed(), "{:?}", report.problems);
/// # Ok(()) }
/// ```
///
/// Each read runs on a thread of its own, so no future blocks its caller's thread. Clones
/// share one connection. The database file is never written; as any connection to a file in
/// WAL mode, it creates the file's `-wal` and `-shm` companions if they are missing (a journal
/// closed cleanly removes them), and leaves them.
#[derive(Clone)]
pub struct SqliteInspector {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    conn: Mutex<Connection>,
    schema: SchemaInfo,
    /// The file's schema version: which columns and tables there are.
    version: i32,
}

impl SqliteInspector {
    /// Opens the journal file at `path` read-only (see the [type's](Self) documentation).
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] if there is no file at `path`;
    /// [`JournalError::Schema`] for a file that is not a journal (not an SQLite database,
    /// an empty one, another application's) or of a newer schema version than this code's;
    /// [`JournalError::Storage`] if it cannot be read.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path = path.as_ref().to_path_buf();
        let (done, opened) = oneshot::channel();
        drop(spawn("actix-delivery-inspector", move || {
            let _ = done.send(open(path));
        })?);
        let shared = opened.await.unwrap_or(Err(JournalError::Closed))?;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Writes a consistent copy of the journal to the new file `path`, as
    /// [`SqliteJournal::backup`](super::SqliteJournal::backup) does (the same online backup,
    /// from one read transaction), without opening the journal: beside the application that has
    /// it open, whose appends go on meanwhile. Writes nothing but `path`.
    ///
    /// # Errors
    /// As [`SqliteJournal::backup`](super::SqliteJournal::backup):
    /// [`JournalError::InvalidArgument`] if `path` exists; [`JournalError::Storage`] if the
    /// copy cannot be written or the journal read (nothing is left at `path` then).
    pub async fn backup(&self, path: impl AsRef<Path>) -> Result<(), JournalError> {
        let (source, dest) = (self.shared.path.clone(), path.as_ref().to_path_buf());
        let (done, result) = oneshot::channel();
        drop(spawn("actix-delivery-inspector-backup", move || {
            let _ = done.send(backup::run(&source, &dest, BUSY_TIMEOUT));
        })?);
        result.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Runs `read` on the connection, on a thread of its own.
    fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection, &Columns) -> Result<T, JournalError> + Send + 'static,
    ) -> JournalFuture<'_, T> {
        let shared = self.shared.clone();
        Box::pin(async move {
            let (done, result) = oneshot::channel();
            drop(spawn("actix-delivery-inspector", move || {
                let conn = shared.conn.lock().unwrap_or_else(PoisonError::into_inner);
                let _ = done.send(read(&conn, &Columns::of(shared.version)));
            })?);
            result.await.unwrap_or(Err(JournalError::Closed))
        })
    }
}

impl std::fmt::Debug for SqliteInspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteInspector")
            .field("path", &self.shared.path)
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

impl JournalInspector for SqliteInspector {
    fn schema(&self) -> &SchemaInfo {
        &self.shared.schema
    }

    fn streams(
        &self,
        after: Option<&PersistenceId>,
        limit: usize,
    ) -> JournalFuture<'_, Vec<StreamInfo>> {
        let after = after.map_or_else(String::new, |id| id.as_str().to_owned());
        self.read(move |conn, columns| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            // A loose index scan of event_journal (one probe per stream), and the streams of
            // the other tables.
            let mut statement = conn
                .prepare(
                    "WITH RECURSIVE ids(id) AS ( \
                         SELECT (SELECT min(persistence_id) FROM event_journal \
                                 WHERE persistence_id > ?1) \
                         UNION ALL \
                         SELECT (SELECT min(persistence_id) FROM event_journal \
                                 WHERE persistence_id > ids.id) \
                         FROM ids WHERE ids.id IS NOT NULL LIMIT ?2 \
                     ) \
                     SELECT id FROM ( \
                         SELECT id FROM ids WHERE id IS NOT NULL \
                         UNION SELECT persistence_id FROM event_buffer WHERE persistence_id > ?1 \
                         UNION SELECT * FROM (SELECT persistence_id FROM stream_metadata \
                             WHERE persistence_id > ?1 ORDER BY persistence_id LIMIT ?2) \
                         UNION SELECT * FROM (SELECT persistence_id FROM snapshot \
                             WHERE persistence_id > ?1 ORDER BY persistence_id LIMIT ?2) \
                     ) ORDER BY id LIMIT ?2",
                )
                .map_err(storage_error(None))?;
            let ids = statement
                .query_map(rusqlite::params![after, limit], |row| {
                    row.get::<_, String>(0)
                })
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(storage_error(None))?;
            let mut streams = Vec::with_capacity(ids.len());
            for id in ids {
                let id = PersistenceId::new(id).map_err(|err| {
                    JournalError::storage(None, format!("corrupt journal data: {err}"))
                })?;
                if let Some(stream) = stream_info(conn, columns, &id)? {
                    streams.push(stream);
                }
            }
            Ok(streams)
        })
    }

    fn stream(&self, id: &PersistenceId) -> JournalFuture<'_, Option<StreamInfo>> {
        let id = id.clone();
        self.read(move |conn, columns| stream_info(conn, columns, &id))
    }

    fn events(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<InspectedEvent>> {
        let id = id.clone();
        self.read(move |conn, columns| events(conn, columns, &id, from_seq, max_events))
    }

    fn snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<InspectedSnapshot>> {
        let id = id.clone();
        self.read(move |conn, columns| {
            let sql = format!(
                "SELECT seq_nr, payload, {}, written_at FROM snapshot WHERE persistence_id = ?1",
                columns.manifest
            );
            let mut statement = conn.prepare(&sql).map_err(storage_error(Some(&id)))?;
            let mut rows = statement
                .query([id.as_str()])
                .map_err(storage_error(Some(&id)))?;
            let Some(row) = rows.next().map_err(storage_error(Some(&id)))? else {
                return Ok(None);
            };
            let seq = seq_from_sql(&id, int(row, 0, &id, 0)?, 0)?;
            let payload: Vec<u8> = row.get(1).map_err(|err| corrupt(&id, seq, &err))?;
            let manifest = manifest(row, 2, &id, seq, &mut None)?;
            let written_at = from_millis(int(row, 5, &id, seq)?);
            Ok(Some(InspectedSnapshot {
                snapshot: Snapshot {
                    seq,
                    payload,
                    manifest,
                },
                written_at,
            }))
        })
    }

    fn check(&self, max_problems: usize) -> JournalFuture<'_, CheckReport> {
        let schema = self.shared.schema.clone();
        self.read(move |conn, columns| {
            // One read transaction: every query sees the same commit.
            conn.execute_batch("BEGIN").map_err(storage_error(None))?;
            let report = check(conn, columns, schema, max_problems);
            let _ = conn.execute_batch("COMMIT");
            report
        })
    }

    fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> JournalFuture<'_, Option<DeadLetterListing>> {
        let filter = filter.clone();
        self.read(move |conn, _| {
            if !table_exists(conn, "dead_letter")? {
                return Ok(None);
            }
            let failed = storage_error(None);
            let sql = format!(
                "SELECT {} FROM dead_letter {}",
                listing_columns("NULL", "length"),
                list_clause(|n| format!("?{n}"))
            );
            let p = FilterParams::of(&filter);
            let mut statement = conn.prepare(&sql).map_err(&failed)?;
            let rows = statement
                .query_map(
                    rusqlite::params![p.after, p.cause, p.kind, p.source, p.since, p.until, p.rows],
                    |row| {
                        let kept: Option<i64> = row.get(16)?;
                        Ok((dead_letter_row(row)?, kept.is_some()))
                    },
                )
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(&failed)?;
            dead_letter_listing(rows, &filter).map(Some)
        })
    }

    fn dead_letter(&self, id: u64) -> JournalFuture<'_, Option<StoredDeadLetter>> {
        self.read(move |conn, _| {
            if !table_exists(conn, "dead_letter")? {
                return Ok(None);
            }
            let Ok(id) = i64::try_from(id) else {
                return Ok(None);
            };
            conn.query_row(
                &format!("SELECT {COLUMNS} FROM dead_letter WHERE id = ?1"),
                [id],
                dead_letter_row,
            )
            .optional()
            .map_err(storage_error(None))?
            .map(dead_letter_entry)
            .transpose()
        })
    }
}

/// The SQL that differs between schema versions.
struct Columns {
    /// The manifest's three columns (`1, '', 1`, legacy, in schema 1, which had none).
    manifest: &'static str,
    /// The manifest's name column (`''` in schema 1).
    name: &'static str,
    /// The snapshot's (aliased `s`) name column.
    snapshot_name: &'static str,
    /// Whether there is an `event_tag` table (schema 3 on).
    tags: bool,
}

impl Columns {
    fn of(version: i32) -> Self {
        Self {
            manifest: if version >= 2 {
                "ser_codec, ser_manifest, ser_version"
            } else {
                "1, '', 1"
            },
            name: if version >= 2 { "ser_manifest" } else { "''" },
            snapshot_name: if version >= 2 { "s.ser_manifest" } else { "''" },
            tags: version >= 3,
        }
    }
}

/// Opens the file read-only and checks its marks.
fn open(path: PathBuf) -> Result<Shared, JournalError> {
    let invalid = |reason: String| JournalError::InvalidArgument {
        persistence_id: None,
        reason,
    };
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.is_dir() => {
            return Err(invalid(format!("{} is a directory", path.display())));
        }
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(invalid(format!(
                "no journal at {}: no such file",
                path.display()
            )));
        }
        Err(err) => {
            return Err(JournalError::storage(
                None,
                format!("cannot open {}: {}", path.display(), ErrorChain(&err)),
            ));
        }
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let cannot = |err: rusqlite::Error| {
        JournalError::storage(
            None,
            format!("cannot read {}: {}", path.display(), ErrorChain(&err)),
        )
    };
    let conn = Connection::open_with_flags(&path, flags).map_err(cannot)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(cannot)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(cannot)?;
    let location = path.display().to_string();
    let version = marks(&conn, &location)?;
    let journal_id = identity_rows(&conn)?.and_then(|rows| match rows.as_slice() {
        [id] => crate::journal::JournalId::new(id.as_str()).ok(),
        _ => None,
    });
    Ok(Shared {
        schema: SchemaInfo {
            location,
            version: version.unsigned_abs(),
            current: SCHEMA_VERSION.unsigned_abs(),
            journal_id,
        },
        path,
        conn: Mutex::new(conn),
        version,
    })
}

/// What the journal expects a file to be.
fn expected() -> String {
    format!(
        "an actix-delivery journal (application_id {APPLICATION_ID:#x}), schema version 1 to \
         {SCHEMA_VERSION}"
    )
}

/// The file's schema version, read from its marks as the journal reads them; anything but a
/// journal of a version this code reads is refused.
fn marks(conn: &Connection, location: &str) -> Result<i32, JournalError> {
    let schema = |found: String| JournalError::Schema {
        found: format!("{location}: {found}"),
        expected: expected(),
    };
    let pragma = |name: &str| -> Result<i32, JournalError> {
        conn.pragma_query_value(None, name, |row| row.get(0))
            .map_err(|err| match err.sqlite_error_code() {
                Some(rusqlite::ErrorCode::NotADatabase) => {
                    schema("a file that is not an SQLite database".into())
                }
                _ => storage_error(None)(err),
            })
    };
    let application_id = pragma("application_id")?;
    let version = pragma("user_version")?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .map_err(storage_error(None))?;
    match (application_id, version) {
        (0, 0) if objects == 0 => Err(schema(
            "an empty database (no journal was ever created in it)".into(),
        )),
        (0, _) => Err(schema(format!(
            "a foreign database ({objects} schema objects, user_version {version}, no \
             application_id)"
        ))),
        (APPLICATION_ID, version @ 1..=SCHEMA_VERSION) => {
            let tags = (version >= 3).then_some("event_tag");
            let tables = [
                "event_journal",
                "snapshot",
                "stream_metadata",
                "event_buffer",
            ];
            for table in tables.into_iter().chain(tags) {
                if !table_exists(conn, table)? {
                    return Err(schema(format!(
                        "schema version {version} without its table `{table}`"
                    )));
                }
            }
            Ok(version)
        }
        (APPLICATION_ID, newer) if newer > SCHEMA_VERSION => Err(schema(format!(
            "schema version {newer}, written by a newer version of actix-delivery (this one \
             reads schema versions 1 to {SCHEMA_VERSION})"
        ))),
        (APPLICATION_ID, other) => Err(schema(format!("schema version {other}"))),
        (other, _) => Err(schema(format!(
            "a foreign database (application_id {other:#x})"
        ))),
    }
}

fn table_exists(conn: &Connection, table: &str) -> Result<bool, JournalError> {
    conn.query_row(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
    .map_err(storage_error(None))
}

/// The rows of `journal_identity`; `None` without the table.
fn identity_rows(conn: &Connection) -> Result<Option<Vec<String>>, JournalError> {
    if !table_exists(conn, "journal_identity")? {
        return Ok(None);
    }
    let mut statement = conn
        .prepare("SELECT CAST(journal_id AS TEXT) FROM journal_identity")
        .map_err(storage_error(None))?;
    statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map(Some)
        .map_err(storage_error(None))
}

/// A time stored as milliseconds since the Unix epoch (negative or overflowing: the epoch).
fn from_millis(millis: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

fn corrupt(id: &PersistenceId, seq: u64, err: &rusqlite::Error) -> JournalError {
    JournalError::Corrupt {
        persistence_id: id.clone(),
        seq,
        reason: ErrorChain(err).to_string(),
    }
}

/// Column `index` of `row` as an integer; a value of another type is corrupt data.
fn int(row: &Row<'_>, index: usize, id: &PersistenceId, seq: u64) -> Result<i64, JournalError> {
    row.get(index).map_err(|err| corrupt(id, seq, &err))
}

/// Column `index` of `row` as an optional integer.
fn opt_int(row: &Row<'_>, index: usize, id: &PersistenceId) -> Result<Option<i64>, JournalError> {
    row.get(index).map_err(|err| corrupt(id, 0, &err))
}

/// The manifest in columns `first` to `first + 2` of `row`.
fn manifest(
    row: &Row<'_>,
    first: usize,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    let codec = int(row, first, id, seq)?;
    let name: String = row.get(first + 1).map_err(|err| corrupt(id, seq, &err))?;
    let version = int(row, first + 2, id, seq)?;
    stored_manifest(id, seq, (codec, &name, version), last)
}

/// What the file holds of stream `id`; `None` if nothing.
fn stream_info(
    conn: &Connection,
    columns: &Columns,
    id: &PersistenceId,
) -> Result<Option<StreamInfo>, JournalError> {
    let (name, snapshot_name) = (columns.name, columns.snapshot_name);
    let sql = format!(
        "SELECT (SELECT deleted_to FROM stream_metadata WHERE persistence_id = ?1), \
         (SELECT min(seq_nr) FROM event_journal WHERE persistence_id = ?1), \
         (SELECT max(seq_nr) FROM event_journal WHERE persistence_id = ?1), \
         (SELECT min(seq_nr) FROM event_buffer WHERE persistence_id = ?1), \
         (SELECT max(seq_nr) FROM event_buffer WHERE persistence_id = ?1), \
         s.seq_nr, s.written_at, {snapshot_name} \
         FROM (SELECT 1) LEFT JOIN snapshot s ON s.persistence_id = ?1"
    );
    let mut statement = conn.prepare(&sql).map_err(storage_error(Some(id)))?;
    let mut rows = statement
        .query([id.as_str()])
        .map_err(storage_error(Some(id)))?;
    let Some(row) = rows.next().map_err(storage_error(Some(id)))? else {
        return Ok(None);
    };
    let seq = |index| -> Result<Option<u64>, JournalError> {
        opt_int(row, index, id)?
            .map(|raw| seq_from_sql(id, raw, 0))
            .transpose()
    };
    let deleted_to = seq(0)?;
    let first = [seq(1)?, seq(3)?].into_iter().flatten().min();
    let last = [seq(2)?, seq(4)?].into_iter().flatten().max();
    let snapshot_seq = seq(5)?;
    let snapshot_at = opt_int(row, 6, id)?.map(from_millis);
    let snapshot_name: Option<String> = row.get(7).map_err(|err| corrupt(id, 0, &err))?;
    drop(rows);
    if deleted_to.is_none() && last.is_none() && snapshot_seq.is_none() {
        return Ok(None);
    }
    let (mut last_written_at, mut type_name) = (None, None);
    if let Some(last) = last {
        let sql = format!(
            "SELECT written_at, {name} FROM event_journal WHERE persistence_id = ?1 AND seq_nr = ?2 \
             UNION ALL \
             SELECT written_at, {name} FROM event_buffer WHERE persistence_id = ?1 AND seq_nr = ?2 \
             LIMIT 1"
        );
        let mut statement = conn.prepare(&sql).map_err(storage_error(Some(id)))?;
        let newest = statement
            .query_row(rusqlite::params![id.as_str(), last as i64], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .optional()
            .map_err(|err| corrupt(id, last, &err))?;
        if let Some((written_at, name)) = newest {
            last_written_at = Some(from_millis(written_at));
            type_name = Some(name).filter(|name| !name.is_empty());
        }
    }
    let type_name = type_name.or(snapshot_name.filter(|name| !name.is_empty()));
    Ok(Some(StreamInfo {
        persistence_id: id.clone(),
        highest_seq: [deleted_to, last].into_iter().flatten().max().unwrap_or(0),
        deleted_to,
        first_stored: first,
        last_written_at,
        type_name,
        snapshot: snapshot_seq.map(|seq| (seq, snapshot_at.unwrap_or(SystemTime::UNIX_EPOCH))),
    }))
}

/// One page of a stream's events, with their tags.
fn events(
    conn: &Connection,
    columns: &Columns,
    id: &PersistenceId,
    from_seq: u64,
    max_events: usize,
) -> Result<Vec<InspectedEvent>, JournalError> {
    if max_events == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
    let from = i64::try_from(from_seq).unwrap_or(i64::MAX);
    let sql = format!(
        "SELECT seq_nr, payload, {m}, written_at FROM event_journal \
         WHERE persistence_id = ?1 AND seq_nr >= ?2 \
         UNION ALL \
         SELECT seq_nr, payload, {m}, written_at FROM event_buffer \
         WHERE persistence_id = ?1 AND seq_nr >= ?2 \
         ORDER BY seq_nr LIMIT ?3",
        m = columns.manifest
    );
    let mut statement = conn.prepare(&sql).map_err(storage_error(Some(id)))?;
    let mut rows = statement
        .query(rusqlite::params![id.as_str(), from, limit])
        .map_err(storage_error(Some(id)))?;
    let mut events = Vec::new();
    let mut last = None;
    while let Some(row) = rows.next().map_err(storage_error(Some(id)))? {
        let seq = seq_from_sql(id, int(row, 0, id, from_seq)?, from_seq)?;
        let payload: Vec<u8> = row.get(1).map_err(|err| corrupt(id, seq, &err))?;
        let manifest = manifest(row, 2, id, seq, &mut last)?;
        let written_at = from_millis(int(row, 5, id, seq)?);
        events.push(InspectedEvent {
            event: StoredEvent {
                seq,
                payload,
                manifest,
            },
            written_at,
            tags: Vec::new(),
        });
    }
    drop(rows);
    if let (true, Some(first), Some(last)) = (columns.tags, events.first(), events.last()) {
        // event_tag has no index by stream: one scan per page.
        let mut statement = conn
            .prepare(
                "SELECT seq_nr, tag FROM event_tag \
                 WHERE persistence_id = ?1 AND seq_nr BETWEEN ?2 AND ?3 ORDER BY ordering",
            )
            .map_err(storage_error(Some(id)))?;
        let tags = statement
            .query_map(
                rusqlite::params![id.as_str(), first.event.seq as i64, last.event.seq as i64],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(storage_error(Some(id)))?;
        attach_tags(id, &mut events, tags)?;
    }
    Ok(events)
}

/// Every invariant, in the read transaction the caller began.
fn check(
    conn: &Connection,
    columns: &Columns,
    schema: SchemaInfo,
    max_problems: usize,
) -> Result<CheckReport, JournalError> {
    let failed = storage_error(None);
    let mut problems = Problems::new(max_problems);
    let mut notes = Vec::new();
    if schema.version < schema.current {
        notes.push(format!(
            "schema version {} (this code's is {}): the journal migrates the file when it next \
             opens it",
            schema.version, schema.current
        ));
    }
    let identity = identity_rows(conn)?.unwrap_or_default();
    if let Some(problem) =
        check_identity(&identity, "opening the file with the journal gives it one")
    {
        problems.push(problem);
    }

    let all_ids = "SELECT persistence_id FROM event_journal \
                   UNION SELECT persistence_id FROM event_buffer \
                   UNION SELECT persistence_id FROM stream_metadata \
                   UNION SELECT persistence_id FROM snapshot";
    let streams: i64 = conn
        .query_row(&format!("SELECT count(*) FROM ({all_ids})"), [], |row| {
            row.get(0)
        })
        .map_err(&failed)?;
    let invalid_ids = format!(
        "SELECT persistence_id FROM ({all_ids}) \
         WHERE length(CAST(persistence_id AS BLOB)) NOT BETWEEN 1 AND 256 \
            OR instr(CAST(persistence_id AS BLOB), x'00') > 0 LIMIT ?1"
    );
    for id in strings(conn, &invalid_ids, problems.room())? {
        problems.extend(check_id(&id));
    }

    // Each stream's seqs, in order, from above its deletion point to its highest seq.
    let mut statement = conn
        .prepare(
            "WITH events AS ( \
                 SELECT persistence_id, seq_nr FROM event_journal \
                 UNION ALL SELECT persistence_id, seq_nr FROM event_buffer \
             ), ordered AS ( \
                 SELECT persistence_id, seq_nr, \
                 lag(seq_nr) OVER (PARTITION BY persistence_id ORDER BY seq_nr) AS prev \
                 FROM events \
             ) \
             SELECT o.persistence_id, o.prev, o.seq_nr, coalesce(m.deleted_to, 0) FROM ordered o \
             LEFT JOIN stream_metadata m ON m.persistence_id = o.persistence_id \
             WHERE o.seq_nr = o.prev OR o.seq_nr <= coalesce(m.deleted_to, 0) \
                OR o.seq_nr > max(coalesce(o.prev, 0), coalesce(m.deleted_to, 0)) + 1 \
             ORDER BY o.persistence_id, o.seq_nr LIMIT ?1",
        )
        .map_err(&failed)?;
    let rows = statement
        .query_map([problems.room()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<i64>>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, i64>(3)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&failed)?;
    for (id, previous, seq, deleted_to) in rows {
        problems.extend(check_seq(&id, previous, seq, deleted_to));
    }

    // Snapshots within their streams.
    let mut statement = conn
        .prepare(
            "SELECT persistence_id, seq_nr, highest FROM ( \
                 SELECT s.persistence_id, s.seq_nr, max( \
                     coalesce((SELECT max(seq_nr) FROM event_journal j \
                               WHERE j.persistence_id = s.persistence_id), 0), \
                     coalesce((SELECT max(seq_nr) FROM event_buffer b \
                               WHERE b.persistence_id = s.persistence_id), 0), \
                     coalesce((SELECT deleted_to FROM stream_metadata m \
                               WHERE m.persistence_id = s.persistence_id), 0)) AS highest \
                 FROM snapshot s \
             ) WHERE seq_nr > highest OR seq_nr < 1 ORDER BY persistence_id LIMIT ?1",
        )
        .map_err(&failed)?;
    let rows = statement
        .query_map([problems.room()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&failed)?;
    for (id, seq, highest) in rows {
        problems.push(snapshot_problem(&id, seq, highest));
    }

    let mut tag_rows = 0;
    if columns.tags {
        tag_rows = conn
            .query_row("SELECT count(*) FROM event_tag", [], |row| row.get(0))
            .map_err(&failed)?;
        check_tags(conn, &mut problems)?;
    }
    Ok(CheckReport {
        schema,
        streams: streams.unsigned_abs(),
        tag_rows: u64::try_from(tag_rows).unwrap_or(0),
        problems: problems.found,
        truncated: problems.truncated,
        notes,
    })
}

/// The tag rows: each one's event stored or deleted, offsets rising with seqs within a
/// stream, each row in its stream's slice.
fn check_tags(conn: &Connection, problems: &mut Problems) -> Result<(), JournalError> {
    let failed = storage_error(None);
    // An entry is found as the journal's readers find it: by key in event_journal, by the
    // row the tag row noted in event_buffer.
    let mut statement = conn
        .prepare(
            "SELECT t.ordering, t.tag, t.persistence_id, t.seq_nr FROM event_tag t \
             LEFT JOIN stream_metadata m ON m.persistence_id = t.persistence_id \
             WHERE t.seq_nr > coalesce(m.deleted_to, 0) \
               AND NOT EXISTS (SELECT 1 FROM event_journal j \
                   WHERE j.persistence_id = t.persistence_id AND j.seq_nr = t.seq_nr) \
               AND NOT EXISTS (SELECT 1 FROM event_buffer b WHERE b.rowid = t.buffer_row \
                   AND b.persistence_id = t.persistence_id AND b.seq_nr = t.seq_nr) \
             ORDER BY t.ordering LIMIT ?1",
        )
        .map_err(&failed)?;
    let rows = statement
        .query_map([problems.room()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, i64>(3)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&failed)?;
    for (ordering, tag, id, seq) in rows {
        problems.push(Problem::new(
            ProblemKind::DanglingTag,
            Some(&id),
            format!(
                "the tag row of tag `{tag}` at offset 0:{ordering} points at event {seq}, which \
                 is neither stored nor deleted"
            ),
        ));
    }

    let mut statement = conn
        .prepare(
            "SELECT tag, persistence_id, ordering, seq_nr, prev_ordering, prev_seq FROM ( \
                 SELECT tag, persistence_id, ordering, seq_nr, \
                 lag(ordering) OVER w AS prev_ordering, lag(seq_nr) OVER w AS prev_seq \
                 FROM event_tag WINDOW w AS (PARTITION BY tag, persistence_id ORDER BY ordering) \
             ) WHERE seq_nr <= prev_seq ORDER BY ordering LIMIT ?1",
        )
        .map_err(&failed)?;
    let rows = statement
        .query_map([problems.room()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&failed)?;
    for (tag, id, ordering, seq, prev_ordering, prev_seq) in rows {
        problems.push(tag_order_problem(
            &tag,
            &id,
            (&format!("0:{ordering}"), seq),
            (&format!("0:{prev_ordering}"), prev_seq),
        ));
    }

    let mut statement = conn
        .prepare("SELECT DISTINCT persistence_id, slice FROM event_tag")
        .map_err(&failed)?;
    let rows = statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(&failed)?;
    for (id, slice) in rows {
        problems.extend(check_slice(&id, slice));
    }
    Ok(())
}

/// The first column of each row of `sql` (one parameter: a limit).
fn strings(conn: &Connection, sql: &str, limit: i64) -> Result<Vec<String>, JournalError> {
    let mut statement = conn.prepare(sql).map_err(storage_error(None))?;
    statement
        .query_map([limit], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(storage_error(None))
}
