//! Opening the database file: connection settings, the schema, and its version check.
//!
//! The tables have the shape Akka Persistence users know:
//!
//! ```sql
//! event_journal(persistence_id TEXT, seq_nr INTEGER, payload BLOB, written_at INTEGER,
//!               ser_codec INTEGER, ser_manifest TEXT, ser_version INTEGER,
//!               PRIMARY KEY (persistence_id, seq_nr))
//! snapshot(persistence_id TEXT PRIMARY KEY, seq_nr INTEGER, payload BLOB, written_at INTEGER,
//!          ser_codec INTEGER, ser_manifest TEXT, ser_version INTEGER)
//! stream_metadata(persistence_id TEXT PRIMARY KEY, deleted_to INTEGER)
//! event_buffer(persistence_id TEXT, seq_nr INTEGER, payload BLOB, written_at INTEGER,
//!              ser_codec INTEGER, ser_manifest TEXT, ser_version INTEGER)
//! event_tag(ordering INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT, persistence_id TEXT,
//!           seq_nr INTEGER, slice INTEGER, written_at INTEGER, buffer_row INTEGER)
//!   with an index on (tag, ordering)
//! ```
//!
//! `ser_codec`, `ser_manifest` and `ser_version` are the payload's
//! [`Manifest`](crate::codec::Manifest): codec id, type name, schema version.
//!
//! `event_buffer` holds the most recent appends in commit order, without an index: the
//! writer moves them into `event_journal` in bulk (see the writer module), and on open. A
//! stream's events are those of both tables.
//!
//! `event_tag` files an entry under each of its tags, in the transaction that appends it:
//! `ordering` (never reused: `AUTOINCREMENT`) is the entry's offset in the tag; the single
//! writer commits in ordering order, so a reader sees a prefix of it. `slice` is
//! [`slice_of`](crate::journal::slice_of) the stream. An entry appended into `event_buffer`
//! notes that row's rowid in `buffer_row`, so a reader finds it there by rowid (checking
//! stream and seq, as the buffer's rowids start again after each fold) until a fold moves it
//! into `event_journal`. Deletion keeps the tag rows.
//!
//! `written_at` is milliseconds since the Unix epoch. A stream's highest seq is its largest
//! `seq_nr`, or its `deleted_to` if that is larger (when deletion removed the newest events):
//! deletion never lowers it. One journal at a time writes a file (the fence relies on the
//! writer knowing the buffer): the writer holds an exclusive lock on `<file>-lock`, named
//! after the file's canonical path (symlinks resolved, as SQLite resolves them for its
//! `-wal`), and a file with more than one hard link is refused (each name would get a lock,
//! and a write-ahead log, of its own). The file is marked with `PRAGMA application_id` and
//! `PRAGMA user_version`; a file marked otherwise is refused and left untouched.
//!
//! `journal_identity` holds one row, the file's [`JournalId`]: random, given to the file when
//! it is created, and to a file made before ids existed on its first open by this version.
//! Read models record it (see [`Journal::journal_id`](crate::journal::Journal::journal_id)).
//! Adding it changes no version: the previous release does not know the table and leaves it
//! alone, so it still opens the file.
//!
//! `dead_letter` (one row per kept dead letter: `id INTEGER PRIMARY KEY AUTOINCREMENT`, never
//! reused, `UNIQUE (kind, source, key)`, its manifest in `ser_*` columns and its origin as
//! bincode) and `dead_letter_totals` (one row: entries and their weight) belong to
//! [`SqliteDeadLetters`](crate::journal::SqliteDeadLetters), which creates them when first
//! opened on the file. They raise no schema version: neither the journal's check nor the
//! previous release looks at them.
//!
//! Schema versions: 1 (actix-delivery 0.1) had no manifest columns; 2 had no `event_tag`.
//! Opening an older file migrates it to 3 in one transaction (1 to 2: the three columns are
//! added, rows written before read as [`Manifest::legacy`](crate::codec::Manifest::legacy):
//! bincode, no name, version 1; 2 to 3: `event_tag` is created, entries written before have
//! no tags). A file of a newer version than this code's is refused, naming both versions.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension, MAIN_DB};

use crate::journal::sqlite::config::SqliteConfig;
use crate::journal::sqlite::storage_error;
use crate::journal::{JournalError, JournalId};
use crate::runtime::error_chain::ErrorChain;

/// `PRAGMA application_id` of a journal file: "adjl" (actix-delivery journal).
pub(super) const APPLICATION_ID: i32 = 0x6164_6a6c;
/// `PRAGMA user_version` of the schema this crate writes.
pub(super) const SCHEMA_VERSION: i32 = 3;

const CREATE: &str = "
    CREATE TABLE event_journal (
        persistence_id TEXT NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL,
        ser_codec INTEGER NOT NULL,
        ser_manifest TEXT NOT NULL,
        ser_version INTEGER NOT NULL,
        PRIMARY KEY (persistence_id, seq_nr)
    );
    CREATE TABLE snapshot (
        persistence_id TEXT PRIMARY KEY NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL,
        ser_codec INTEGER NOT NULL,
        ser_manifest TEXT NOT NULL,
        ser_version INTEGER NOT NULL
    );
    CREATE TABLE stream_metadata (
        persistence_id TEXT PRIMARY KEY NOT NULL,
        deleted_to INTEGER NOT NULL
    );
    CREATE TABLE event_buffer (
        persistence_id TEXT NOT NULL,
        seq_nr INTEGER NOT NULL,
        payload BLOB NOT NULL,
        written_at INTEGER NOT NULL,
        ser_codec INTEGER NOT NULL,
        ser_manifest TEXT NOT NULL,
        ser_version INTEGER NOT NULL
    );
";

/// From schema 1 to 2: the manifest columns. What was written before reads as
/// `Manifest::legacy()` (bincode, no name, version 1).
const MIGRATE_1_TO_2: &str = "
    ALTER TABLE event_journal ADD COLUMN ser_codec INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE event_journal ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '';
    ALTER TABLE event_journal ADD COLUMN ser_version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE snapshot ADD COLUMN ser_codec INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE snapshot ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '';
    ALTER TABLE snapshot ADD COLUMN ser_version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE event_buffer ADD COLUMN ser_codec INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE event_buffer ADD COLUMN ser_manifest TEXT NOT NULL DEFAULT '';
    ALTER TABLE event_buffer ADD COLUMN ser_version INTEGER NOT NULL DEFAULT 1;
";

/// The tags of schema 3: created with the rest ([`CREATE`]), or by the migration from 2 (what
/// was written before has none).
const TAGS: &str = "
    CREATE TABLE event_tag (
        ordering INTEGER PRIMARY KEY AUTOINCREMENT,
        tag TEXT NOT NULL,
        persistence_id TEXT NOT NULL,
        seq_nr INTEGER NOT NULL,
        slice INTEGER NOT NULL,
        written_at INTEGER NOT NULL,
        buffer_row INTEGER
    );
    CREATE INDEX event_tag_by_tag ON event_tag (tag, ordering);
";

/// The file's identity: one row, a random id, given once (by the first open of a version
/// that knows ids).
const IDENTITY: &str = "
    CREATE TABLE IF NOT EXISTS journal_identity (journal_id TEXT NOT NULL);
    INSERT INTO journal_identity (journal_id)
        SELECT lower(hex(randomblob(16))) WHERE NOT EXISTS (SELECT 1 FROM journal_identity);
";

/// The migrations, in order: `MIGRATIONS[v - 1]` takes schema `v` to `v + 1` (and then
/// `PRAGMA user_version` is set to `v + 1`).
const MIGRATIONS: [&str; 2] = [MIGRATE_1_TO_2, TAGS];

/// The tables of every schema version.
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
    /// This crate's schema, an older version: to be migrated.
    Older(i32),
}

/// Opens the write connection: takes the lock file, checks (or creates) the schema and the
/// file's identity, then WAL and `synchronous=FULL`. Refuses a foreign or newer file without
/// changing it. The returned file holds the lock until it is dropped.
pub(super) fn open_writer(
    path: &Path,
    options: &SqliteConfig,
) -> Result<(Connection, File, JournalId), JournalError> {
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
    match found {
        Found::Empty => create(&conn)?,
        Found::Older(_) => migrate(&conn)?,
        Found::Current => {}
    }
    let id = identity(&conn)?;
    Ok((conn, lock, id))
}

/// The file's [`JournalId`], given to it now (in a transaction of its own) if it has none.
fn identity(conn: &Connection) -> Result<JournalId, JournalError> {
    if let Some(id) = read_identity(conn)? {
        return Ok(id);
    }
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(storage_error(None))?;
    let result = conn
        .execute_batch(IDENTITY)
        .and_then(|()| conn.execute_batch("COMMIT"))
        .map_err(storage_error(None));
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result?;
    read_identity(conn)?.ok_or_else(|| JournalError::Schema {
        found: "no row in journal_identity after one was given".into(),
        expected: expected(),
    })
}

/// The [`JournalId`] of the journal file `conn` is open on, its marks checked as the journal
/// checks a file it opens (an empty database, another application's, a newer schema version
/// and a file that is not an SQLite database are refused), without writing anything: what a
/// store that writes beside the journal without opening it names the file by.
pub(super) fn journal_identity(conn: &Connection) -> Result<JournalId, JournalError> {
    let schema = |found: &str| JournalError::Schema {
        found: found.to_owned(),
        expected: expected(),
    };
    if let Found::Empty = inspect(conn)? {
        return Err(schema(
            "an empty database (no journal was ever created in it)",
        ));
    }
    read_identity(conn)?.ok_or_else(|| {
        schema("a journal without an id (no row in journal_identity): opening it with the journal gives it one")
    })
}

/// What `journal_identity` holds: `None` without the table or a row.
fn read_identity(conn: &Connection) -> Result<Option<JournalId>, JournalError> {
    let table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal_identity'",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(storage_error(None))?;
    if table.is_none() {
        return Ok(None);
    }
    let mut statement = conn
        .prepare("SELECT journal_id FROM journal_identity")
        .map_err(storage_error(None))?;
    let ids = statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(storage_error(None))?;
    let schema = |found: String| JournalError::Schema {
        found,
        expected: expected(),
    };
    match ids.as_slice() {
        [] => Ok(None),
        [id] => JournalId::new(id.as_str())
            .map(Some)
            .map_err(|err| schema(format!("journal_identity holds {err}"))),
        more => Err(schema(format!(
            "journal_identity with {} rows instead of one",
            more.len()
        ))),
    }
}

/// Takes an exclusive lock on `<canonical path>-lock` (created if needed), waiting up to
/// `busy_timeout` for another journal to let go of it (a journal whose last handle was just
/// dropped does so once its queue is drained). A separate file, because SQLite's own POSIX
/// locks on the database file would be dropped by the closing of any other handle to it (and
/// on some systems `flock` and POSIX locks on one file conflict). The lock is an `flock`-style
/// lock of the open file: the kernel releases it when the process dies.
///
/// The lock is keyed by the database file's identity, not by the name it was opened under:
/// the name is canonicalized (so a symlink, a `..` or a relative path reach the same lock),
/// and a file with more than one hard link, whose names canonicalize differently, is refused.
fn take_lock(path: &Path, busy_timeout: Duration) -> Result<File, JournalError> {
    let canonical = canonical_name(path)?;
    check_one_name(&canonical)?;
    let mut lock_path = canonical.into_os_string();
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
        .map_err(|err| cannot(&ErrorChain(&err)))?;
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
            Err(TryLockError::Error(err)) => return Err(cannot(&ErrorChain(&err))),
        }
    }
}

/// The database file's canonical path: symlinks, `.` and `..` resolved. A file that does not
/// exist yet is created (empty, which SQLite reads as an empty database), so that a symlink
/// to it resolves as well.
fn canonical_name(path: &Path) -> Result<PathBuf, JournalError> {
    let cannot = |err: std::io::Error| {
        let err = ErrorChain(&err);
        JournalError::storage(None, format!("cannot open {}: {err}", path.display()))
    };
    match std::fs::canonicalize(path) {
        Ok(canonical) => return Ok(canonical),
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(cannot(err)),
        Err(_) => {}
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(cannot)?;
    std::fs::canonicalize(path).map_err(cannot)
}

/// Refuses a database file with more than one hard link: its names would get separate lock
/// files (and separate write-ahead logs: SQLite calls a link count other than 1 undefined
/// behaviour), so two journals could write it at once.
#[cfg(unix)]
fn check_one_name(path: &Path) -> Result<(), JournalError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).map_err(|err| {
        let err = ErrorChain(&err);
        JournalError::storage(None, format!("cannot open {}: {err}", path.display()))
    })?;
    match metadata.nlink() {
        0 | 1 => Ok(()),
        links => Err(JournalError::storage(
            None,
            format!(
                "{} has {links} hard links: a journal file must have exactly one name (each \
                 name would get its own lock and write-ahead log)",
                path.display()
            ),
        )),
    }
}

/// Hard links cannot be counted here with the standard library.
#[cfg(not(unix))]
fn check_one_name(_: &Path) -> Result<(), JournalError> {
    Ok(())
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
            conn.execute_batch(TAGS).map_err(storage_error(None))?;
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

/// Migrates a file of an older schema to the current one, through every version between, in
/// one transaction (all of it or nothing). The lock file makes this the only writer.
fn migrate(conn: &Connection) -> Result<(), JournalError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(storage_error(None))?;
    let mut from = None;
    let result = (|| {
        if let Found::Older(version) = inspect(conn)? {
            from = Some(version);
            for (to, migration) in (version + 1..).zip(&MIGRATIONS[(version - 1) as usize..]) {
                conn.execute_batch(migration).map_err(storage_error(None))?;
                conn.pragma_update(None, "user_version", to)
                    .map_err(storage_error(None))?;
            }
        }
        conn.execute_batch("COMMIT").map_err(storage_error(None))
    })();
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    if let (Ok(()), Some(version)) = (&result, from) {
        log::info!("journal migrated from schema version {version} to {SCHEMA_VERSION}");
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
        (APPLICATION_ID, version @ 1..=SCHEMA_VERSION) => {
            let tags = (version >= 3).then_some("event_tag");
            for table in TABLES.into_iter().chain(tags) {
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
            Ok(if version < SCHEMA_VERSION {
                Found::Older(version)
            } else {
                Found::Current
            })
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
