//! [`SqliteDeadLetters`]: the dead-letter store in a SQLite journal's file, in tables of its
//! own (`dead_letter`, `dead_letter_totals`; see the schema module) that raise no schema
//! version.
//!
//! The store writes on a connection and thread of its own, not through the journal's writer:
//! its transactions are SQLite's to order against the journal's group commits (both wait up to
//! the journal's `busy_timeout` for the other's), and a failing keep can never fail a group of
//! appends. Keeps queued behind one another commit together, each in a savepoint of its own
//! (one fsync for many); a keep that fails is rolled back alone. The totals row counts the
//! entries and their weight, so a keep reads and drops only the oldest entries it must and
//! never scans the table (the totals are counted again, once, when the store is opened).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, Statement};
use tokio::sync::mpsc;

use crate::delivery::dead_letter_store::DeadLetterError;
use crate::delivery::dead_letters::{
    cut_text, DeadLetterCounts, DeadLetterFilter, DeadLetterLimits, DeadLetterPage, FieldError,
    Kept, StoredDeadLetter,
};
use crate::error::Happened;
use crate::journal::dead_letter_sql::{
    check_limits, counts, group, int, list_clause, list_columns, peer_input_causes, storage,
    store_through_client, FilterParams, KeepRequest, Opened, Request, Row, StoreClient, COLUMNS,
};
use crate::journal::sqlite::schema::journal_identity;
use crate::journal::sqlite::SqliteJournal;
use crate::journal::{Journal, JournalError, JournalId};
use crate::runtime::error_chain::ErrorChain;

/// The tables, created when a store is first opened on a journal file. Neither is one of the
/// journal's: the journal's schema check and version ignore them.
const CREATE: &str = concat!(
    "
    CREATE TABLE IF NOT EXISTS dead_letter (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        source TEXT NOT NULL,
        cause TEXT NOT NULL,
        key TEXT NOT NULL,
        weight INTEGER NOT NULL,
        body_len INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        first_at INTEGER NOT NULL,
        last_at INTEGER NOT NULL,
        replay_failures INTEGER NOT NULL,
        ser_codec INTEGER NOT NULL,
        ser_manifest TEXT NOT NULL,
        ser_version INTEGER NOT NULL,
        error TEXT NOT NULL,
        origin BLOB,
        body BLOB,
        UNIQUE (kind, source, key)
    );
    CREATE INDEX IF NOT EXISTS dead_letter_by_source ON dead_letter (source, id);
    CREATE INDEX IF NOT EXISTS dead_letter_peer_input ON dead_letter (id)
        WHERE cause IN (",
    peer_input_causes!(),
    ");
    CREATE TABLE IF NOT EXISTS dead_letter_totals (
        entries INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    );
"
);

/// Drops the oldest entry a peer's input caused but `?1` (the entry just kept), found by the
/// partial index; returns its weight.
const EVICT_PEER_INPUT: &str = concat!(
    "DELETE FROM dead_letter WHERE id = \
         (SELECT id FROM dead_letter WHERE cause IN (",
    peer_input_causes!(),
    ") AND id <> ?1 ORDER BY id LIMIT 1) \
     RETURNING weight"
);

/// Drops the oldest entry but `?1`; returns its weight.
const EVICT_OLDEST: &str = "DELETE FROM dead_letter WHERE id = \
     (SELECT id FROM dead_letter WHERE id <> ?1 ORDER BY id LIMIT 1) \
     RETURNING weight";

/// Drops the body of the entry `?1` (its length stays); returns its weight without it.
const DROP_BODY: &str = "UPDATE dead_letter SET weight = weight - length(body), body = NULL \
     WHERE id = ?1 AND body IS NOT NULL RETURNING weight";

/// Counts the totals again from the entries (on open: entries may have been deleted by hand
/// meanwhile).
const RECOUNT: &str = "
    DELETE FROM dead_letter_totals;
    INSERT INTO dead_letter_totals (entries, bytes)
        SELECT count(*), coalesce(sum(weight), 0) FROM dead_letter;
";

/// A page of entries: [`FilterParams`] as `?1` to `?8`.
static LIST_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM dead_letter {}",
        list_columns("?8"),
        list_clause(|n| format!("?{n}"))
    )
});
/// The entry `?1`.
static GET_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS} FROM dead_letter WHERE id = ?1"));

/// Dead letters kept in a [`SqliteJournal`]'s file (feature `sqlite`): durable, bounded by
/// [`DeadLetterLimits`], one entry per source and key, the oldest a peer's input caused dropped
/// first, then the oldest.
///
/// Its id ([`store_id`](crate::dead_letters::DeadLetterStore::store_id)) is the journal's
/// [`JournalId`](crate::journal::JournalId), so the ids of replays stay the same across
/// restarts and in a backup of the file. Entry ids are never reused (`AUTOINCREMENT`).
///
/// ```no_run
/// use actix_delivery::dead_letters::{DeadLetterLimits, DeadLetters};
/// use actix_delivery::journal::{SqliteDeadLetters, SqliteJournal};
///
/// # async fn _demo() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = SqliteJournal::open("orders.journal").await?;
/// let store = SqliteDeadLetters::open(&journal, DeadLetterLimits::default()).await?;
/// let dead_letters = DeadLetters::new(store); // give clones to the parts, and to the console
/// println!("{} dead letters kept", dead_letters.counts().await?.entries);
/// # Ok(()) }
/// ```
///
/// The store writes on a connection and thread of its own (not through the journal's writer),
/// waiting up to the journal's `busy_timeout` for the journal's commits; keeps that arrive
/// together commit together. Clones share one store; when the last is dropped, its thread
/// finishes the requests already queued and closes its connection. The journal may be closed
/// before it.
#[derive(Clone)]
pub struct SqliteDeadLetters {
    client: StoreClient,
}

impl SqliteDeadLetters {
    /// Opens the store in `journal`'s file, creating its tables if they are not there yet.
    ///
    /// # Errors
    /// [`DeadLetterError::Invalid`] naming the bound of `limits` that is invalid (nothing is
    /// opened); [`DeadLetterError::Storage`] if the file cannot be opened or the tables
    /// created, or the thread cannot start.
    pub async fn open(
        journal: &SqliteJournal,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        check_limits(&limits)?;
        let id = journal
            .journal_id()
            .ok_or_else(|| storage(Happened::CertainlyNot, "the journal has no id"))?;
        // As the journal's lock names it: the same file if the working directory changes.
        let path =
            std::fs::canonicalize(journal.path()).unwrap_or_else(|_| journal.path().to_path_buf());
        let busy_timeout = journal.shared.busy_timeout;
        Self::start(path, busy_timeout, Identity::Known(id), limits).await
    }

    /// Opens the store in the journal file at `path` without opening the journal: for a tool
    /// that removes or lists entries beside the application that has the journal open (the
    /// command-line inspector's `dead-letters delete`). It takes no journal lock (the store
    /// never does: it writes its own tables on a connection of its own, waiting up to 5 s for
    /// the journal's commits), reads the file's [`JournalId`](crate::journal::JournalId) from
    /// its identity table, and creates the store's tables if they are not there.
    ///
    /// # Errors
    /// [`DeadLetterError::Invalid`] naming the bound of `limits` that is invalid, or naming
    /// `journal` for a file that is not a journal (no file at `path`, not an SQLite database,
    /// an empty one, another application's, a journal of a newer schema version or without an
    /// id), which is left untouched; [`DeadLetterError::Storage`] if the file cannot be
    /// opened for writing or the tables created, or the thread cannot start.
    pub async fn open_file(
        path: impl AsRef<Path>,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        check_limits(&limits)?;
        let path = path.as_ref();
        let path = std::fs::canonicalize(path).map_err(|err| {
            let reason = if err.kind() == std::io::ErrorKind::NotFound {
                format!("no journal at {}: no such file", path.display())
            } else {
                format!("cannot open {}: {}", path.display(), ErrorChain(&err))
            };
            FieldError::new("journal", reason)
        })?;
        if path.is_dir() {
            return Err(
                FieldError::new("journal", format!("{} is a directory", path.display())).into(),
            );
        }
        Self::start(path, FILE_BUSY_TIMEOUT, Identity::FromFile, limits).await
    }

    /// Starts the store's thread on the file at `path` and waits until it opened.
    async fn start(
        path: PathBuf,
        busy_timeout: Duration,
        identity: Identity,
        limits: DeadLetterLimits,
    ) -> Result<Self, DeadLetterError> {
        let worker_limits = limits.clone();
        let client = StoreClient::start(
            "actix-delivery-dead-letters",
            limits,
            move |queue, opened| run(&path, busy_timeout, identity, worker_limits, queue, opened),
        )
        .await?;
        Ok(Self { client })
    }
}

/// How long a store opened with [`SqliteDeadLetters::open_file`] waits for a lock held by the
/// journal (the journal's default `busy_timeout`).
const FILE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the store's id comes from.
enum Identity {
    /// The journal's, which opened the file.
    Known(JournalId),
    /// The file's identity table, read (and the file's marks checked) when the store opens.
    FromFile,
}

store_through_client!(SqliteDeadLetters);

/// A failed SQLite call: what was done, and the error with its extended result code.
fn failed(happened: Happened, what: &str, err: &rusqlite::Error) -> DeadLetterError {
    storage(
        happened,
        format_args!("dead letters: {what}: {}", ErrorChain(err)),
    )
}

/// The store's connection and the statements prepared on it (each once, when first run).
struct Db<'c> {
    conn: &'c Connection,
    statements: HashMap<&'static str, Statement<'c>>,
}

impl<'c> Db<'c> {
    fn prepare(&mut self, sql: &'static str) -> rusqlite::Result<&mut Statement<'c>> {
        match self.statements.entry(sql) {
            Entry::Occupied(statement) => Ok(statement.into_mut()),
            Entry::Vacant(place) => Ok(place.insert(self.conn.prepare(sql)?)),
        }
    }
}

/// The body of the store's thread: opens the connection and the tables, then serves the
/// requests until every sender is gone.
fn run(
    path: &Path,
    busy_timeout: Duration,
    identity: Identity,
    limits: DeadLetterLimits,
    mut requests: mpsc::Receiver<Request>,
    opened: Opened,
) {
    let (conn, id) = match open(path, busy_timeout, identity) {
        Ok(opened) => opened,
        Err(err) => {
            let _ = opened.send(Err(err));
            return;
        }
    };
    if opened.send(Ok(id)).is_err() {
        return;
    }
    let db = &mut Db {
        conn: &conn,
        statements: HashMap::new(),
    };
    let mut carried = None;
    loop {
        let Some(request) = carried.take().or_else(|| requests.blocking_recv()) else {
            break;
        };
        match request {
            Request::Keep(first) => {
                let (keeps, next) = group(first, || requests.try_recv().ok());
                carried = next;
                keep_group(db, &limits, keeps);
            }
            Request::List { filter, reply } => {
                let _ = reply.send(list(db, &filter));
            }
            Request::Get { id, reply } => {
                let _ = reply.send(get(db, id));
            }
            Request::Remove { id, reply } => {
                let _ = reply.send(write(db, "remove an entry", |db| remove(db, id)));
            }
            Request::ReplayFailed {
                id,
                mut error,
                now_ms,
                reply,
            } => {
                cut_text(&mut error);
                let result = write(db, "note a failed replay", |db| {
                    replay_failed(db, id, &error, now_ms)
                });
                let _ = reply.send(result);
            }
            Request::Counts { reply } => {
                let _ = reply.send(count(db));
            }
        }
    }
}

/// Opens the store's connection to the journal file (made by the journal: never created
/// here) with the journal's durability, reads the journal's id from the file if it is not
/// known (refusing a file that is not a journal before anything is written), creates the
/// tables if needed and counts the totals.
fn open(
    path: &Path,
    busy_timeout: Duration,
    identity: Identity,
) -> Result<(Connection, JournalId), DeadLetterError> {
    let opening =
        |err: rusqlite::Error| failed(Happened::CertainlyNot, "cannot open the store", &err);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(opening)?;
    conn.busy_timeout(busy_timeout).map_err(opening)?;
    let id = match identity {
        Identity::Known(id) => id,
        Identity::FromFile => journal_identity(&conn).map_err(|err| match err {
            JournalError::Schema { .. } => {
                FieldError::new("journal", format!("{}: {err}", path.display())).into()
            }
            other => storage(
                Happened::CertainlyNot,
                format_args!("dead letters: cannot open {}: {other}", path.display()),
            ),
        })?,
    };
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .map_err(opening)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(storage(
            Happened::CertainlyNot,
            format_args!("dead letters: the journal file is not in WAL mode ({mode})"),
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(opening)?;
    let mut db = Db {
        conn: &conn,
        statements: HashMap::new(),
    };
    write(&mut db, "cannot create the tables", |db| {
        db.conn.execute_batch(CREATE)?;
        db.conn.execute_batch(RECOUNT)
    })?;
    drop(db);
    Ok((conn, id))
}

/// `BEGIN IMMEDIATE` (waiting up to the busy timeout for another writer), rolling back what
/// an earlier failure left open first.
fn begin(conn: &Connection) -> rusqlite::Result<()> {
    if !conn.is_autocommit() {
        conn.execute_batch("ROLLBACK")?;
    }
    conn.execute_batch("BEGIN IMMEDIATE")
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
}

/// `COMMIT`; a failure says whether it happened: a busy database leaves the transaction open
/// (rolled back here: it did not happen), any other failure (an I/O error while syncing) may
/// leave it on disk.
fn commit(conn: &Connection, what: &str) -> Result<(), DeadLetterError> {
    conn.execute_batch("COMMIT").map_err(|err| {
        let busy = matches!(
            err.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        );
        rollback(conn);
        let happened = if busy {
            Happened::CertainlyNot
        } else {
            Happened::InDoubt
        };
        failed(happened, &format!("{what}, at its commit"), &err)
    })
}

/// Runs `body` in a transaction of its own, reporting done only once it committed.
fn write<T>(
    db: &mut Db<'_>,
    what: &str,
    body: impl FnOnce(&mut Db<'_>) -> rusqlite::Result<T>,
) -> Result<T, DeadLetterError> {
    let result = begin(db.conn).and_then(|()| body(db));
    match result {
        Ok(value) => commit(db.conn, what).map(|()| value),
        Err(err) => {
            rollback(db.conn);
            Err(failed(Happened::CertainlyNot, what, &err))
        }
    }
}

/// How many entries the store holds and their weight: `dead_letter_totals`, read once per
/// transaction and written back at its end (the transaction holds the write lock).
#[derive(Clone, Copy)]
struct Totals {
    entries: i64,
    bytes: i64,
}

fn read_totals(db: &mut Db<'_>) -> rusqlite::Result<Totals> {
    db.prepare("SELECT entries, bytes FROM dead_letter_totals")?
        .query_row([], |row| {
            Ok(Totals {
                entries: row.get(0)?,
                bytes: row.get(1)?,
            })
        })
}

fn write_totals(db: &mut Db<'_>, totals: Totals) -> rusqlite::Result<()> {
    db.prepare("UPDATE dead_letter_totals SET entries = ?1, bytes = ?2")?
        .execute([totals.entries, totals.bytes])
        .map(drop)
}

/// Commits `keeps` in one transaction, each in a savepoint of its own, and answers each once
/// the transaction committed (or failed).
fn keep_group(db: &mut Db<'_>, limits: &DeadLetterLimits, keeps: Vec<KeepRequest>) {
    let conn = db.conn;
    let mut results = Vec::with_capacity(keeps.len());
    let mut aborted = None;
    let mut totals = match begin(conn).and_then(|()| read_totals(db)) {
        Ok(totals) => totals,
        Err(err) => {
            aborted = Some(err);
            Totals {
                entries: 0,
                bytes: 0,
            }
        }
    };
    for keep in &keeps {
        if aborted.is_some() {
            break;
        }
        let mut after = totals;
        let result = db
            .prepare("SAVEPOINT keep")
            .and_then(|statement| statement.execute([]))
            .and_then(|_| keep_one(db, limits, keep, &mut after));
        let result = match result {
            Ok(kept) => db
                .prepare("RELEASE keep")
                .and_then(|statement| statement.execute([]))
                .map(|_| kept),
            Err(err) if conn.is_autocommit() => Err(err),
            Err(err) => conn
                .execute_batch("ROLLBACK TO keep; RELEASE keep")
                .and(Err(err)),
        };
        match result {
            Ok(kept) => {
                totals = after;
                results.push(Ok(kept));
            }
            // SQLite rolled the whole transaction back (a full disk, an I/O error): what was
            // kept before this one is gone too.
            Err(err) if conn.is_autocommit() => aborted = Some(err),
            Err(err) => results.push(Err(failed(Happened::CertainlyNot, "keep a letter", &err))),
        }
    }
    if aborted.is_none()
        && let Err(err) = write_totals(db, totals)
    {
        aborted = Some(err);
    }
    if let Some(err) = aborted {
        rollback(conn);
        let err = failed(Happened::CertainlyNot, "keep a letter", &err);
        for keep in keeps {
            let _ = keep.reply.send(Err(err.clone()));
        }
        return;
    }
    let committed = commit(conn, "keep a letter");
    for (keep, result) in keeps.into_iter().zip(results) {
        let answer = match (&committed, result) {
            (Ok(()), result) => result,
            (Err(err), Ok(_)) => Err(err.clone()),
            (Err(_), Err(err)) => Err(err),
        };
        let _ = keep.reply.send(answer);
    }
}

/// Keeps one letter inside the open transaction: updates the entry of its source and key or
/// adds one, then, while the store is beyond its bounds, makes room by the rule of
/// `DeadLetterBook::keep`: the oldest other entry a peer's input caused, the body of a peer's
/// letter just kept (only the bytes over), the oldest other entry; `totals` follow.
fn keep_one(
    db: &mut Db<'_>,
    limits: &DeadLetterLimits,
    keep: &KeepRequest,
    totals: &mut Totals,
) -> rusqlite::Result<Kept> {
    let letter = &keep.letter;
    let weight = int(letter.weight());
    let now = int(keep.now_ms);
    let manifest = &letter.manifest;
    let existing: Option<(i64, i64)> = db
        .prepare("SELECT id, weight FROM dead_letter WHERE kind = ?1 AND source = ?2 AND key = ?3")?
        .query_row(
            params![letter.kind.as_str(), letter.source, letter.key],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    // One parameter list for both statements: the key, the letter, the time, the weight.
    let statement = if existing.is_some() {
        "UPDATE dead_letter SET cause = ?4, origin = ?5, ser_codec = ?6, ser_manifest = ?7, \
         ser_version = ?8, body = ?9, body_len = ?10, attempts = ?11, error = ?12, \
         last_at = ?13, weight = ?14 WHERE kind = ?1 AND source = ?2 AND key = ?3"
    } else {
        "INSERT INTO dead_letter (kind, source, key, cause, origin, ser_codec, ser_manifest, \
         ser_version, body, body_len, attempts, error, first_at, last_at, replay_failures, \
         weight) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, 0, ?14)"
    };
    db.prepare(statement)?.execute(params![
        letter.kind.as_str(),
        letter.source,
        letter.key,
        letter.cause.as_str(),
        keep.origin,
        manifest.codec_id(),
        manifest.name(),
        manifest.version(),
        letter.body,
        int(letter.body_len),
        letter.attempts,
        letter.error,
        now,
        weight
    ])?;
    let (id, added, grown) = match existing {
        Some((id, old_weight)) => (id, 0, weight - old_weight),
        None => (db.conn.last_insert_rowid(), 1, weight),
    };
    totals.entries += added;
    totals.bytes += grown;
    let mut evicted = 0;
    let peer_input = letter.cause.is_peer_input();
    while over(limits, totals.entries, totals.bytes) {
        let mut next: Option<i64> = db
            .prepare(EVICT_PEER_INPUT)?
            .query_row([id], |row| row.get(0))
            .optional()?;
        if next.is_none() && peer_input && totals.entries <= int(limits.max_entries) {
            let without_body: Option<i64> = db
                .prepare(DROP_BODY)?
                .query_row([id], |row| row.get(0))
                .optional()?;
            if let Some(without_body) = without_body {
                totals.bytes -= weight - without_body;
                continue;
            }
        }
        if next.is_none() {
            next = db
                .prepare(EVICT_OLDEST)?
                .query_row([id], |row| row.get(0))
                .optional()?;
        }
        let Some(dropped) = next else {
            // The totals count entries that are not there: they are counted again on open.
            log::warn!(
                "dead letters: the totals say {} entries of {} bytes, but only the one just \
                 kept is left",
                totals.entries,
                totals.bytes
            );
            break;
        };
        totals.entries -= 1;
        totals.bytes -= dropped;
        evicted += 1;
    }
    Ok(Kept {
        id: id as u64,
        updated: added == 0,
        evicted,
    })
}

/// Removes the entry `id` inside the open transaction; whether there was one.
fn remove(db: &mut Db<'_>, id: u64) -> rusqlite::Result<bool> {
    let weight: Option<i64> = db
        .prepare("DELETE FROM dead_letter WHERE id = ?1 RETURNING weight")?
        .query_row([int(id)], |row| row.get(0))
        .optional()?;
    let Some(weight) = weight else {
        return Ok(false);
    };
    db.prepare("UPDATE dead_letter_totals SET entries = entries - 1, bytes = bytes - ?1")?
        .execute([weight])?;
    Ok(true)
}

/// Notes a failed replay of `id` inside the open transaction: its count, time and error (cut
/// already), and the weight of its new error; whether there was such an entry.
fn replay_failed(db: &mut Db<'_>, id: u64, error: &str, now_ms: u64) -> rusqlite::Result<bool> {
    let id = int(id);
    let old: Option<i64> = db
        .prepare("SELECT length(CAST(error AS BLOB)) FROM dead_letter WHERE id = ?1")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    let Some(old) = old else {
        return Ok(false);
    };
    let grown = error.len() as i64 - old;
    db.prepare(
        "UPDATE dead_letter SET replay_failures = min(replay_failures + 1, 4294967295), \
         last_at = ?2, error = ?3, weight = weight + ?4 WHERE id = ?1",
    )?
    .execute(params![id, int(now_ms), error, grown])?;
    db.prepare("UPDATE dead_letter_totals SET bytes = bytes + ?1")?
        .execute([grown])?;
    Ok(true)
}

/// Whether a store holding `entries` entries of `bytes` is beyond `limits` and may drop one
/// (the rule of `DeadLetterBook::keep`).
fn over(limits: &DeadLetterLimits, entries: i64, bytes: i64) -> bool {
    entries > 1 && (entries > int(limits.max_entries) || bytes > int(limits.max_bytes))
}

/// Reads an entry's columns ([`COLUMNS`]; the inspector's reads too).
pub(super) fn row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: row.get(0)?,
        kind: row.get(1)?,
        source: row.get(2)?,
        cause: row.get(3)?,
        key: row.get(4)?,
        origin: row.get(5)?,
        codec: row.get(6)?,
        manifest: row.get(7)?,
        version: row.get(8)?,
        body: row.get(9)?,
        body_len: row.get(10)?,
        attempts: row.get(11)?,
        error: row.get(12)?,
        first_at: row.get(13)?,
        last_at: row.get(14)?,
        replay_failures: row.get(15)?,
    })
}

/// A failed read: it changed nothing.
fn read_failed(what: &str) -> impl Fn(rusqlite::Error) -> DeadLetterError + '_ {
    move |err| failed(Happened::CertainlyNot, what, &err)
}

fn list(db: &mut Db<'_>, filter: &DeadLetterFilter) -> Result<DeadLetterPage, DeadLetterError> {
    let what = "list entries";
    let p = FilterParams::of(filter);
    let statement = db.prepare(&LIST_SQL).map_err(read_failed(what))?;
    let rows = statement
        .query_map(
            params![
                p.after,
                p.cause,
                p.kind,
                p.source,
                p.since,
                p.until,
                p.rows,
                p.without_bodies
            ],
            row,
        )
        .and_then(Iterator::collect::<rusqlite::Result<Vec<Row>>>)
        .map_err(read_failed(what))?;
    let entries = rows
        .into_iter()
        .map(Row::into_entry)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DeadLetterPage::of(entries, filter))
}

fn get(db: &mut Db<'_>, id: u64) -> Result<Option<StoredDeadLetter>, DeadLetterError> {
    let what = "read an entry";
    db.prepare(&GET_SQL)
        .and_then(|statement| statement.query_row([int(id)], row).optional())
        .map_err(read_failed(what))?
        .map(Row::into_entry)
        .transpose()
}

fn count(db: &mut Db<'_>) -> Result<DeadLetterCounts, DeadLetterError> {
    let what = "count the entries";
    let statement = db
        .prepare("SELECT cause, count(*), coalesce(sum(weight), 0) FROM dead_letter GROUP BY cause")
        .map_err(read_failed(what))?;
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(read_failed(what))?;
    counts(rows)
}
