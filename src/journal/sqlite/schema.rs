//! Opening the database file: connection settings, the schema, and its version check.
//!
//! The tables have the shape Akka Persistence users know:
//!
//! ```sql
//! event_journal(persistence_id TEXT, seq_nr INTEGER, payload BLOB, written_at INTEGER,
//!               PRIMARY KEY (persistence_id, seq_nr))
//! snapshot(persistence_id TEXT PRIMARY KEY, seq_nr INTEGER, payload BLOB, written_at INTEGER)
//! stream_metadata(persistence_id TEXT PRIMARY KEY, deleted_to INTEGER)
//! event_buffer(persistence_id TEXT, seq_nr INTEGER, payload BLOB, written_at INTEGER)
//! ```
//!
//! `event_buffer` holds the most recent appends in commit order, without an index: the
//! writer moves them into `event_journal` in bulk (see the writer module), and on open. A
//! stream's events are those of both tables.
//!
//! `written_at` is milliseconds since the Unix epoch. A stream's highest seq is its largest
//! `seq_nr`, or its `deleted_to` if that is larger (when deletion removed the newest events):
//! deletion never lowers it. One process at a time writes a file: the writer holds an
//! exclusive lock on `<file>-lock` (the fence relies on the writer knowing the buffer). The file is marked with `PRAGMA application_id` and
//! `PRAGMA user_version`; a file marked otherwise is refused and left untouched.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension, MAIN_DB};

use crate::journal::sqlite::{storage_error, SqliteOptions};
use crate::journal::JournalError;

/// `PRAGMA application_id` of a journal file: "adjl" (actix-delivery journal).
pub(super) const APPLICATION_ID: i32 = 0x6164_6a6c;
/// `PRAGMA user_version` of the schema this crate writes.
pub(super) const SCHEMA_VERSION: i32 = 1;

const CREATE: &str = "
    CREATE TABLE event_journal (
        persistence_id TEXT NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL,
        PRIMARY KEY (persistence_id, seq_nr)
    );
    CREATE TABLE snapshot (
        persistence_id TEXT PRIMARY KEY NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL
    );
    CREATE TABLE stream_metadata (
        persistence_id TEXT PRIMARY KEY NOT NULL,
        deleted_to INTEGER NOT NULL
    );
    CREATE TABLE event_buffer (
        persistence_id TEXT NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL
    );
";

const TABLES: [&str; 4] = [
    "event_journal",
    "snapshot",
    "stream_metadata",
    "event_buffer",
];

/// What the file holds.
enum Found {
    /// Nothing yet: the schema is to be created.
    Empty,
    /// This crate's schema, current version.
    Current,
}

/// Opens the write connection: takes the lock file, checks (or creates) the schema, then
/// WAL and `synchronous=FULL`. Refuses a foreign or newer file without changing it. The
/// returned file holds the lock until it is dropped.
pub(super) fn open_writer(
    path: &Path,
    options: &SqliteOptions,
) -> Result<(Connection, File), JournalError> {
    let lock = take_lock(path, options.busy_timeout)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(storage_error(None))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(storage_error(None))?;
    // SQLite falls back to a read-only connection when the file cannot be opened for
    // writing; say so now rather than at the first append.
    if conn.is_readonly(MAIN_DB).map_err(storage_error(None))? {
        return Err(JournalError::storage(
            None,
            format!("{} is read-only", path.display()),
        ));
    }
    let found = inspect(&conn)?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(storage_error(None))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(JournalError::storage(
            None,
            format!("the database cannot use WAL mode (journal_mode is {mode})"),
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(storage_error(None))?;
    if let Some(bytes) = options.max_size_bytes {
        let page_size: i64 = conn
            .pragma_query_value(None, "page_size", |row| row.get(0))
            .map_err(storage_error(None))?;
        let page_size = u64::try_from(page_size).unwrap_or(4096).max(1);
        let pages = i64::try_from(bytes.div_ceil(page_size)).unwrap_or(i64::MAX);
        conn.pragma_update(None, "max_page_count", pages)
            .map_err(storage_error(None))?;
    }
    if let Found::Empty = found {
        create(&conn)?;
    }
    Ok((conn, lock))
}

/// Takes an exclusive lock on `<path>-lock` (created if needed), waiting up to
/// `busy_timeout` for another journal to let go of it (a journal whose last handle was just
/// dropped does so once its queue is drained). A separate file, because SQLite's own POSIX
/// locks on the database file would be dropped by the closing of any other handle to it.
fn take_lock(path: &Path, busy_timeout: Duration) -> Result<File, JournalError> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push("-lock");
    let lock_path = PathBuf::from(lock_path);
    let cannot = |err: &dyn std::fmt::Display| {
        JournalError::storage(None, format!("cannot lock {}: {err}", lock_path.display()))
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|err| cannot(&err))?;
    let deadline = Instant::now() + busy_timeout;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(cannot(
                    &"the journal is open elsewhere (in another process, or not yet closed here)",
                ))
            }
            Err(TryLockError::Error(err)) => return Err(cannot(&err)),
        }
    }
}

/// Opens a read connection to a file [`open_writer`] has set up.
pub(super) fn open_reader(path: &Path, busy_timeout: Duration) -> Result<Connection, JournalError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(storage_error(None))?;
    conn.busy_timeout(busy_timeout)
        .map_err(storage_error(None))?;
    Ok(conn)
}

/// Creates the schema, unless another process did so meanwhile.
fn create(conn: &Connection) -> Result<(), JournalError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(storage_error(None))?;
    let result = (|| {
        if let Found::Empty = inspect(conn)? {
            conn.execute_batch(CREATE).map_err(storage_error(None))?;
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(storage_error(None))?;
            conn.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(storage_error(None))?;
        }
        conn.execute_batch("COMMIT").map_err(storage_error(None))
    })();
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

fn expected() -> String {
    format!("an actix-delivery journal (application_id {APPLICATION_ID:#x}), schema version {SCHEMA_VERSION}")
}

/// Reads the file's marks and tables, and refuses anything but an empty file or this
/// crate's current schema.
fn inspect(conn: &Connection) -> Result<Found, JournalError> {
    let pragma = |name: &str| -> Result<i32, JournalError> {
        conn.pragma_query_value(None, name, |row| row.get(0))
            .map_err(|err| match err.sqlite_error_code() {
                Some(rusqlite::ErrorCode::NotADatabase) => JournalError::Schema {
                    found: "a file that is not an SQLite database".into(),
                    expected: expected(),
                },
                _ => storage_error(None)(err),
            })
    };
    let application_id = pragma("application_id")?;
    let version = pragma("user_version")?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .map_err(storage_error(None))?;
    let schema = |found: String| JournalError::Schema {
        found,
        expected: expected(),
    };
    match (application_id, version) {
        (0, 0) if objects == 0 => Ok(Found::Empty),
        (0, _) => Err(schema(format!(
            "a foreign database ({objects} schema objects, user_version {version}, no application_id)"
        ))),
        (APPLICATION_ID, SCHEMA_VERSION) => {
            for table in TABLES {
                let exists = conn
                    .query_row(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                        [table],
                        |_| Ok(()),
                    )
                    .optional()
                    .map_err(storage_error(None))?;
                if exists.is_none() {
                    return Err(schema(format!(
                        "schema version {version} without its table `{table}`"
                    )));
                }
            }
            Ok(Found::Current)
        }
        (APPLICATION_ID, newer) if newer > SCHEMA_VERSION => Err(schema(format!(
            "schema version {newer}, written by a newer version of actix-delivery"
        ))),
        (APPLICATION_ID, other) => Err(schema(format!("schema version {other}"))),
        (other, _) => Err(schema(format!(
            "a foreign database (application_id {other:#x})"
        ))),
    }
}
