//! The journals: the conformance suite against every implementation, then what is specific
//! to each (the memory journal's fault hook, SQLite's group commit, schema check, read path,
//! bounds and shutdown).

use crate::common::logs;
use crate::journal_conformance;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    slice_of, Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot,
    SqliteJournal, SqliteOptions, SqliteOptionsBuilder, Tag,
};
use futures_util::future::join_all;
use futures_util::FutureExt;
use journal_conformance::{fresh_id, payload, Fixture};

/// Opens the SQLite journal at `path`, and checks that it commits durably.
async fn open(path: impl AsRef<Path>) -> Result<SqliteJournal, JournalError> {
    open_with(path, SqliteOptions::default()).await
}

/// Opens the SQLite journal at `path` with `options`, and checks that it commits durably:
/// every SQLite journal of this test binary is opened here.
async fn open_with(
    path: impl AsRef<Path>,
    options: SqliteOptions,
) -> Result<SqliteJournal, JournalError> {
    let journal = SqliteJournal::open_with(path, options).await?;
    assert_durable(&journal);
    Ok(journal)
}

/// The journal's write connection has `synchronous` FULL and WAL: a commit is on disk when
/// it returns.
fn assert_durable(journal: &SqliteJournal) {
    let durability = journal.durability();
    assert_eq!(
        durability.synchronous, 2,
        "PRAGMA synchronous of the write connection: 2 (FULL) expected, {durability:?}"
    );
    assert_eq!(durability.journal_mode, "wal", "{durability:?}");
}

async fn memory_fixture() -> Fixture {
    Fixture {
        journal: Arc::new(MemoryJournal::new()),
        keep: Box::new(()),
    }
}

async fn sqlite_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path().join("journal.db")).await.unwrap();
    Fixture {
        journal: Arc::new(journal),
        keep: Box::new(dir),
    }
}

mod memory {
    journal_conformance!(super::memory_fixture);
}

mod sqlite {
    journal_conformance!(super::sqlite_fixture);
}

#[cfg(feature = "postgres")]
use crate::postgres_support;

/// PostgreSQL (feature `postgres`): every case on one shared schema of a real server.
#[cfg(feature = "postgres")]
async fn postgres_fixture() -> Fixture {
    Fixture {
        journal: Arc::new(postgres_support::journal().await),
        keep: Box::new(()),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    journal_conformance!(super::postgres_fixture);
}

/// Every commit's events moved on into `event_journal` at once: the same cases through the
/// index alone.
async fn sqlite_unbuffered_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions::builder().buffer_events(1).build().unwrap();
    let journal = open_with(dir.path().join("journal.db"), options)
        .await
        .unwrap();
    Fixture {
        journal: Arc::new(journal),
        keep: Box::new(dir),
    }
}

mod sqlite_unbuffered {
    journal_conformance!(super::sqlite_unbuffered_fixture);
}

fn id(name: &str) -> PersistenceId {
    PersistenceId::new(name).unwrap()
}

fn one(seq: u64) -> Vec<Vec<u8>> {
    vec![payload("w", seq)]
}

/// Polls `future` once, outside Tokio's cooperative budget (a test polls many futures in
/// one go, which would exhaust it and make the journal's queue look full).
fn poll_once<T>(future: &mut JournalFuture<'_, T>) -> Option<Result<T, JournalError>> {
    tokio::task::unconstrained(future).now_or_never()
}

/// Polls `future` once, so that it reaches the journal's queue, and hands it back pending.
fn started<T>(mut future: JournalFuture<'_, T>) -> JournalFuture<'_, T> {
    assert!(
        poll_once(&mut future).is_none(),
        "expected the operation to wait"
    );
    future
}

// --- MemoryJournal --------------------------------------------------------------------------

#[tokio::test]
async fn memory_held_commits_wait_in_virtual_time_until_released() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let faults = journal.faults();
    faults.hold_commits();
    let a = id("a");
    let task = tokio::spawn({
        let (journal, a) = (journal.clone(), a.clone());
        async move { journal.append(&a, 1, one(1)).await }
    });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!task.is_finished());
    assert_eq!(faults.held(), 1);
    assert_eq!(journal.highest_seq(&a).await, Ok(0), "not committed yet");
    faults.release();
    assert_eq!(task.await.unwrap(), Ok(()));
    assert_eq!(journal.highest_seq(&a).await, Ok(1));
    assert_eq!(journal.stats().commits, 1);
}

// --- SqliteJournal --------------------------------------------------------------------------

struct Sqlite {
    dir: tempfile::TempDir,
    journal: SqliteJournal,
}

async fn sqlite(options: SqliteOptionsBuilder) -> Sqlite {
    let dir = tempfile::tempdir().unwrap();
    let journal = open_with(dir.path().join("journal.db"), options.build().unwrap())
        .await
        .unwrap();
    Sqlite { dir, journal }
}

/// Another connection holding the database's write lock: the journal's writer blocks on
/// its next `BEGIN` until [`WriteLock::release`].
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    fn take(path: &Path) -> Self {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        Self(conn)
    }

    fn release(self) {
        self.0.execute_batch("ROLLBACK").unwrap();
    }
}

/// Waits (in real time: the journal's threads are real) until `condition` holds.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Blocks the writer: takes the write lock, starts one append (to stream `blocker`) and
/// waits until the writer has taken it from the queue and is waiting for the lock. Writes
/// started afterwards queue up and are committed together after the lock is released.
async fn block_writer<'a>(db: &'a Sqlite) -> (WriteLock, JournalFuture<'a, ()>) {
    let lock = WriteLock::take(db.journal.path());
    let first = started(db.journal.append(&id("blocker"), 1, one(1)));
    wait_until("the writer took the first append", || {
        db.journal.stats().queued == 0
    })
    .await;
    // The writer drains the queue before its BEGIN; give it time to reach the lock.
    tokio::time::sleep(Duration::from_millis(50)).await;
    (lock, first)
}

#[tokio::test]
async fn sqlite_group_commit_takes_every_queued_append_in_one_transaction() {
    let db = sqlite(SqliteOptions::builder()).await;
    let (lock, first) = block_writer(&db).await;
    let ids: Vec<_> = (0..99).map(|i| fresh_id(&format!("group{i}"))).collect();
    let appends: Vec<_> = ids
        .iter()
        .map(|id| started(db.journal.append(id, 1, one(1))))
        .collect();
    assert_eq!(db.journal.stats().queued, 99);
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert!(join_all(appends).await.iter().all(Result::is_ok));
    let stats = db.journal.stats();
    assert_eq!(
        (
            stats.appends,
            stats.events,
            stats.transactions,
            stats.rejected
        ),
        (100, 100, 2, 0),
        "the blocked append alone, then the 99 queued behind it together"
    );
    for id in &ids {
        assert_eq!(db.journal.highest_seq(id).await, Ok(1));
    }
}

#[tokio::test]
async fn sqlite_a_refused_write_in_a_group_leaves_the_others_committed() {
    let db = sqlite(SqliteOptions::builder()).await;
    let (s1, s2) = (fresh_id("s1"), fresh_id("s2"));
    let (lock, first) = block_writer(&db).await;
    let journal = &db.journal;
    let b = started(journal.append(&s1, 1, one(1)));
    let c = started(journal.append(&s1, 1, vec![b"loser".to_vec()]));
    let d = started(journal.append(
        &s2,
        1,
        vec![payload("w", 1), payload("w", 2), payload("w", 3)],
    ));
    let e = started(journal.append(&s1, 2, one(2)));
    let f = started(journal.save_snapshot(&s2, Snapshot::new(3, b"s2@3".to_vec())));
    let g = started(journal.save_snapshot(&s1, Snapshot::new(5, b"s1@5".to_vec())));
    let h = started(journal.delete_to(&s2, 1));
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert_eq!(b.await, Ok(()));
    assert_eq!(
        c.await,
        Err(JournalError::Conflict {
            persistence_id: s1.clone(),
            first_seq: 1,
            highest_seq: 1
        })
    );
    assert_eq!(d.await, Ok(()));
    assert_eq!(e.await, Ok(()));
    assert_eq!(f.await, Ok(()));
    assert!(matches!(g.await, Err(JournalError::InvalidArgument { .. })));
    assert_eq!(h.await, Ok(()));
    let stats = journal.stats();
    assert_eq!(
        (stats.transactions, stats.appends, stats.rejected),
        (2, 4, 2)
    );
    let replayed = |id| async move { journal.replay(id, 1, 10, 10).await.unwrap() };
    assert_eq!(
        replayed(&s1)
            .await
            .into_iter()
            .map(|e| e.payload)
            .collect::<Vec<_>>(),
        vec![payload("w", 1), payload("w", 2)]
    );
    assert_eq!(
        replayed(&s2)
            .await
            .into_iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(journal.load_snapshot(&s1).await, Ok(None));
    assert_eq!(
        journal.load_snapshot(&s2).await,
        Ok(Some(Snapshot::new(3, b"s2@3".to_vec())))
    );
}

/// A write SQLite refuses says why down to SQLite's extended result code (which tells a
/// trigger's refusal from a full disk or a failed fsync), in the error its caller gets and
/// in the writer's log line; before, both said only the trigger's message.
#[tokio::test]
async fn sqlite_a_refused_write_names_its_cause_in_the_error_and_the_log_line() {
    logs::keep();
    let db = sqlite(SqliteOptions::builder()).await;
    let stream = fresh_id("quota");
    db.journal.append(&stream, 1, one(1)).await.unwrap();
    rusqlite::Connection::open(db.journal.path())
        .unwrap()
        .execute_batch(&format!(
            "CREATE TRIGGER quota BEFORE INSERT ON event_buffer \
             WHEN NEW.persistence_id = '{stream}' AND NEW.seq_nr = 2 \
             BEGIN SELECT RAISE(ABORT, 'quota exceeded'); END"
        ))
        .unwrap();
    let error = db.journal.append(&stream, 2, one(2)).await.unwrap_err();
    let cause = "quota exceeded: Error code 1811: constraint failed";
    assert_eq!(
        error.to_string(),
        format!("storage error on stream `{stream}`: {cause}")
    );
    let logged = logs::lines_containing(&["journal: a group of 1 writes failed", cause]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(
        db.journal.highest_seq(&stream).await,
        Ok(1),
        "nothing of it stored"
    );
}

#[tokio::test]
async fn sqlite_batch_bounds_split_a_long_queue_into_several_transactions() {
    let db = sqlite(SqliteOptions::builder().max_batch_events(10)).await;
    let (lock, first) = block_writer(&db).await;
    let ids: Vec<_> = (0..25).map(|i| fresh_id(&format!("bound{i}"))).collect();
    let appends: Vec<_> = ids
        .iter()
        .map(|id| started(db.journal.append(id, 1, one(1))))
        .collect();
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert!(join_all(appends).await.iter().all(Result::is_ok));
    // The blocked one, then 10 + 10 + 5.
    assert_eq!(db.journal.stats().transactions, 4);
}

#[tokio::test]
async fn sqlite_queue_is_bounded_in_writes_and_bytes() {
    let db = sqlite(SqliteOptions::builder().queue_capacity(4)).await;
    let (lock, first) = block_writer(&db).await;
    let ids: Vec<_> = (0..10).map(|i| fresh_id(&format!("queue{i}"))).collect();
    let mut appends: Vec<_> = ids
        .iter()
        .map(|id| db.journal.append(id, 1, one(1)))
        .collect();
    for append in &mut appends {
        assert!(poll_once(append).is_none());
    }
    assert_eq!(
        db.journal.stats().queued,
        4,
        "the other 6 wait outside the queue"
    );
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert!(join_all(appends).await.iter().all(Result::is_ok));

    // 1000 bytes of queue: the blocked append holds a few, then two 400-byte appends fit.
    let db = sqlite(SqliteOptions::builder().max_queued_bytes(1000)).await;
    let (lock, first) = block_writer(&db).await;
    let mut appends: Vec<_> = ids
        .iter()
        .map(|id| db.journal.append(id, 1, vec![vec![7; 400]]))
        .collect();
    for append in &mut appends {
        assert!(poll_once(append).is_none());
    }
    assert_eq!(db.journal.stats().queued, 2, "the others wait for bytes");
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert!(join_all(appends).await.iter().all(Result::is_ok));
    assert_eq!(db.journal.stats().appends, 11);
}

#[tokio::test]
async fn sqlite_reads_do_not_wait_behind_writes() {
    let db = sqlite(SqliteOptions::builder()).await;
    let a = fresh_id("read");
    db.journal.append(&a, 1, one(1)).await.unwrap();
    let (lock, first) = block_writer(&db).await;
    let mut queued: Vec<_> = (2..=50)
        .map(|seq| started(db.journal.append(&fresh_id("queued"), 1, one(seq))))
        .collect();
    let reads = async {
        assert_eq!(db.journal.highest_seq(&a).await, Ok(1));
        assert_eq!(db.journal.replay(&a, 1, 9, 9).await.unwrap().len(), 1);
        assert_eq!(db.journal.load_snapshot(&a).await, Ok(None));
    };
    tokio::time::timeout(Duration::from_secs(5), reads)
        .await
        .expect("reads waited for the blocked writer");
    for append in &mut queued {
        assert!(poll_once(append).is_none(), "the writes are still queued");
    }
    lock.release();
    assert_eq!(first.await, Ok(()));
    assert!(join_all(queued).await.iter().all(Result::is_ok));
}

/// The journal's own write connection commits with `synchronous` FULL in WAL mode (what
/// [`assert_durable`] checks on every journal opened here), and the file itself is a WAL
/// database, as any other connection to it sees.
#[tokio::test]
async fn sqlite_commits_with_synchronous_full_in_wal_mode() {
    let db = sqlite(SqliteOptions::builder()).await;
    assert_eq!(db.journal.durability().synchronous, 2);
    assert_eq!(db.journal.durability().journal_mode, "wal");
    let other = rusqlite::Connection::open(db.journal.path()).unwrap();
    let mode: String = other
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn sqlite_reopen_sees_everything_and_continues() {
    let db = sqlite(SqliteOptions::builder()).await;
    let path = db.journal.path().to_path_buf();
    let (a, b) = (fresh_id("a"), fresh_id("b"));
    db.journal
        .append(&a, 1, vec![payload("a", 1), payload("a", 2)])
        .await
        .unwrap();
    db.journal.append(&b, 1, one(1)).await.unwrap();
    db.journal
        .append(&a, 3, vec![payload("a", 3)])
        .await
        .unwrap();
    db.journal.delete_to(&b, 1).await.unwrap();
    let snapshot = Snapshot::new(2, b"state".to_vec());
    db.journal
        .save_snapshot(&a, snapshot.clone())
        .await
        .unwrap();
    db.journal.close().await;

    let journal = open(&path).await.unwrap();
    assert_eq!(journal.highest_seq(&a).await, Ok(3));
    assert_eq!(journal.highest_seq(&b).await, Ok(1), "kept after delete_to");
    assert_eq!(
        journal
            .replay(&a, 1, 9, 9)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.payload)
            .collect::<Vec<_>>(),
        vec![payload("a", 1), payload("a", 2), payload("a", 3)]
    );
    assert_eq!(journal.replay(&b, 1, 9, 9).await.unwrap(), Vec::new());
    assert_eq!(journal.load_snapshot(&a).await, Ok(Some(snapshot)));
    assert!(matches!(
        journal.append(&b, 1, one(1)).await,
        Err(JournalError::Conflict { highest_seq: 1, .. })
    ));
    journal.append(&b, 2, one(2)).await.unwrap();
    drop(db.dir);
}

/// A backup taken while 8 appenders keep appending holds every event acknowledged before
/// it started (gapless, byte for byte, possibly more), opens as a journal of its own, and
/// did not stop the writer: appends were acknowledged while the copy ran.
#[tokio::test]
async fn sqlite_backup_under_load_restores_every_event_acknowledged_before_it() {
    const STREAMS: usize = 8;
    let db = sqlite(SqliteOptions::builder()).await;
    let journal = &db.journal;
    // 32 MiB to copy, so that the copy takes many steps and many commits' time.
    let bulk = fresh_id("bulk");
    let bulk_events: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 1 << 20]).collect();
    journal.append(&bulk, 1, bulk_events.clone()).await.unwrap();

    let ids: Vec<_> = (0..STREAMS)
        .map(|s| fresh_id(&format!("load{s}")))
        .collect();
    let acked: Vec<_> = (0..STREAMS)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let appenders = join_all(ids.iter().zip(&acked).map(|(id, acked)| async {
        let mut seq = 1;
        while !stop.load(relaxed) {
            journal
                .append(id, seq, vec![payload(id.as_str(), seq)])
                .await
                .unwrap();
            acked.store(seq, relaxed);
            seq += 1;
        }
    }));
    let dest = db.dir.path().join("backup.db");
    let backup = async {
        wait_until("every appender has appended", || {
            acked.iter().all(|a| a.load(relaxed) >= 10)
        })
        .await;
        let before: Vec<u64> = acked.iter().map(|a| a.load(relaxed)).collect();
        let appends_before = journal.stats().appends;
        journal.backup(&dest).await.unwrap();
        let during = journal.stats().appends - appends_before;
        stop.store(true, relaxed);
        (before, during)
    };
    let (_, (before, during)) = futures_util::future::join(appenders, backup).await;
    assert!(
        during > 0,
        "no append was acknowledged while the backup ran: it proved nothing about load"
    );

    assert!(!db.dir.path().join("backup.db.partial").exists());
    let restored = open(&dest).await.unwrap();
    let bulk_restored = restored
        .replay(&bulk, 1, u64::MAX, usize::MAX)
        .await
        .unwrap();
    assert_eq!(
        bulk_restored
            .into_iter()
            .map(|e| e.payload)
            .collect::<Vec<_>>(),
        bulk_events
    );
    let mut beyond = 0;
    for (s, id) in ids.iter().enumerate() {
        let highest = restored.highest_seq(id).await.unwrap();
        assert!(
            highest >= before[s],
            "stream {s}: {} events acknowledged before the backup, {highest} in it",
            before[s]
        );
        let events = restored.replay(id, 1, u64::MAX, usize::MAX).await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=highest).collect::<Vec<_>>(),
            "stream {s}: gapless"
        );
        for event in &events {
            assert_eq!(event.payload, payload(id.as_str(), event.seq));
        }
        beyond += highest - before[s];
    }
    // The restored journal is a journal: it takes appends where its streams end.
    let next = restored.highest_seq(&ids[0]).await.unwrap() + 1;
    restored.append(&ids[0], next, one(next)).await.unwrap();
    println!(
        "{during} appends acknowledged while the backup ran, {beyond} events in it beyond those acknowledged before it started"
    );

    // A backup never overwrites a file, nor leaves half a file behind.
    let refused = journal.backup(&dest).await;
    assert!(
        matches!(&refused, Err(JournalError::InvalidArgument { reason, .. }) if reason.contains("exists")),
        "{refused:?}"
    );
    let nowhere = db.dir.path().join("missing-dir").join("backup.db");
    assert!(matches!(
        journal.backup(&nowhere).await,
        Err(JournalError::Storage { .. })
    ));
    restored.close().await;
}

#[tokio::test]
async fn sqlite_close_commits_what_was_queued_even_if_its_callers_left() {
    let db = sqlite(SqliteOptions::builder()).await;
    let path = db.journal.path().to_path_buf();
    let ids: Vec<_> = (0..50).map(|i| fresh_id(&format!("left{i}"))).collect();
    {
        let lock = WriteLock::take(&path);
        let abandoned: Vec<_> = ids
            .iter()
            .map(|id| started(db.journal.append(id, 1, one(1))))
            .collect();
        drop(abandoned); // the callers give up; their appends are queued already
        lock.release();
    }
    db.journal.close().await;
    let journal = open(&path).await.unwrap();
    for id in &ids {
        assert_eq!(journal.highest_seq(id).await, Ok(1));
    }
}

/// Writes `setup` into a fresh SQLite file, then opens it as a journal.
async fn open_prepared(setup: &str) -> (tempfile::TempDir, Result<SqliteJournal, JournalError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    if !setup.is_empty() {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
    }
    let result = open(&path).await;
    (dir, result)
}

fn schema_error(result: Result<SqliteJournal, JournalError>) -> String {
    match result {
        Err(JournalError::Schema { found, expected }) => {
            assert!(expected.contains("schema version 3"), "{expected}");
            found
        }
        Err(other) => panic!("expected a schema error, got {other:?}"),
        Ok(_) => panic!("expected a schema error, the file was opened"),
    }
}

#[tokio::test]
async fn sqlite_reports_a_manifest_out_of_range_as_corrupt_naming_the_seq() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let id = PersistenceId::new("s").unwrap();
    let journal = open(&path).await.unwrap();
    journal.append(&id, 1, vec![b"a".to_vec()]).await.unwrap();
    journal.close().await;
    for (column, value) in [("ser_codec", 300), ("ser_version", -1)] {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for table in ["event_journal", "event_buffer"] {
            conn.execute(
                &format!("UPDATE {table} SET ser_codec = 0, ser_version = 0"),
                [],
            )
            .unwrap();
            conn.execute(&format!("UPDATE {table} SET {column} = {value}"), [])
                .unwrap();
        }
        drop(conn);
        let journal = open(&path).await.unwrap();
        match journal.replay(&id, 1, 1, 10).await {
            Err(JournalError::Corrupt { seq: 1, reason, .. }) => {
                assert!(reason.contains("manifest out of range"), "{reason}");
            }
            other => panic!("{column} = {value}: {other:?}"),
        }
        journal.close().await;
    }
}

#[tokio::test]
async fn sqlite_refuses_a_newer_or_foreign_schema_and_leaves_it_untouched() {
    // A journal written by a newer version.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    open(&path).await.unwrap().close().await;
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 4)
        .unwrap();
    let found = schema_error(open(&path).await);
    assert!(
        found.contains("schema version 4, written by a newer version")
            && found.contains("reads schema versions 1 to 3"),
        "{found}"
    );
    let version: i32 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 4);

    // Another application's database: refused, and not even switched to WAL.
    let (dir, result) = open_prepared("CREATE TABLE users (name TEXT);").await;
    assert!(schema_error(result).contains("a foreign database (1 schema objects"));
    let conn = rusqlite::Connection::open(dir.path().join("journal.db")).unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .unwrap();
    assert_eq!(tables, 1);

    let (_dir, result) = open_prepared("PRAGMA application_id = 42;").await;
    assert!(schema_error(result).contains("application_id 0x2a"));
    let (_dir, result) = open_prepared(&format!(
        "PRAGMA application_id = {}; PRAGMA user_version = 1; CREATE TABLE event_journal (x);",
        0x6164_6a6c
    ))
    .await;
    assert!(schema_error(result).contains("without its table `snapshot`"));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    assert!(schema_error(open(&path).await).contains("not an SQLite database"));
}

/// `(persistence_id, seq_nr)` of every row of `table`, in that order.
fn rows(path: &Path, table: &str) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare(&format!(
            "SELECT persistence_id, seq_nr FROM {table} ORDER BY persistence_id, seq_nr"
        ))
        .unwrap();
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn keyed(id: &PersistenceId, seqs: std::ops::RangeInclusive<i64>) -> Vec<(String, i64)> {
    seqs.map(|seq| (id.to_string(), seq)).collect()
}

#[tokio::test]
async fn sqlite_schema_has_the_documented_shape() {
    let db = sqlite(SqliteOptions::builder()).await;
    let path = db.journal.path().to_path_buf();
    let a = fresh_id("shape");
    let tags = vec![vec![Tag::from_static("t1"), Tag::from_static("t2")]];
    db.journal
        .append_tagged(&a, 1, vec![b"x".to_vec()], Manifest::raw(), tags)
        .await
        .unwrap();
    assert_eq!(
        rows(&path, "event_buffer"),
        keyed(&a, 1..=1),
        "recent events"
    );
    let tag_rows = |path: &Path| -> Vec<(i64, String, String, i64, i64, Option<i64>)> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn
            .prepare(
                "SELECT ordering, tag, persistence_id, seq_nr, slice, buffer_row FROM event_tag \
                 ORDER BY ordering",
            )
            .unwrap();
        let rows = statement
            .query_map([], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })
            .unwrap();
        rows.map(Result::unwrap).collect()
    };
    let slice = i64::from(slice_of(&a));
    let tagged = |tag: &str, ordering| (ordering, tag.to_owned(), a.to_string(), 1, slice, Some(1));
    assert_eq!(
        tag_rows(&path),
        [tagged("t1", 1), tagged("t2", 2)],
        "one row per tag, noting the buffer's row"
    );
    db.journal.close().await;
    assert_eq!(
        rows(&path, "event_buffer"),
        Vec::new(),
        "closing moves them"
    );
    assert_eq!(tag_rows(&path).len(), 2, "the tag rows stay");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let row: (String, i64, Vec<u8>, i64) = conn
        .query_row(
            "SELECT persistence_id, seq_nr, payload, written_at FROM event_journal",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(
        (row.0.as_str(), row.1, row.2.as_slice()),
        (a.as_str(), 1, &b"x"[..])
    );
    assert!(
        (now_ms - 60_000..=now_ms).contains(&row.3),
        "written_at {}",
        row.3
    );
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn sqlite_events_move_from_the_buffer_into_event_journal_in_bulk() {
    let db = sqlite(SqliteOptions::builder().buffer_events(10)).await;
    let path = db.journal.path().to_path_buf();
    let (a, b) = (fresh_id("a"), fresh_id("b"));
    let journal = &db.journal;
    journal
        .append(&a, 1, (1..=4).map(|s| payload("a", s)).collect())
        .await
        .unwrap();
    assert_eq!(journal.stats().folds, 0);
    journal
        .append(&b, 1, (1..=7).map(|s| payload("b", s)).collect())
        .await
        .unwrap();
    // 11 buffered events reach the bound of 10: the writer folds after replying.
    wait_until("the buffer was folded", || journal.stats().folds == 1).await;
    journal
        .append(&a, 5, vec![payload("a", 5), payload("a", 6)])
        .await
        .unwrap();
    let mut indexed = keyed(&a, 1..=4);
    indexed.extend(keyed(&b, 1..=7));
    indexed.sort();
    assert_eq!(rows(&path, "event_journal"), indexed);
    assert_eq!(rows(&path, "event_buffer"), keyed(&a, 5..=6));

    // A stream with events in both tables reads as one.
    let seqs = |events: Vec<actix_delivery::journal::StoredEvent>| {
        events.into_iter().map(|e| e.seq).collect::<Vec<_>>()
    };
    assert_eq!(
        seqs(journal.replay(&a, 1, 99, 99).await.unwrap()),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(seqs(journal.replay(&a, 3, 5, 99).await.unwrap()), [3, 4, 5]);
    assert_eq!(
        seqs(journal.replay(&a, 2, 99, 4).await.unwrap()),
        [2, 3, 4, 5]
    );
    assert_eq!(journal.highest_seq(&a).await, Ok(6));
    assert!(matches!(
        journal.append(&a, 6, vec![payload("a", 6)]).await,
        Err(JournalError::Conflict { highest_seq: 6, .. })
    ));

    // Deletion reaches into both tables.
    journal.delete_to(&a, 5).await.unwrap();
    assert_eq!(seqs(journal.replay(&a, 1, 99, 99).await.unwrap()), [6]);
    assert_eq!(rows(&path, "event_buffer"), keyed(&a, 6..=6));
    journal.append(&a, 7, vec![payload("a", 7)]).await.unwrap();
    db.journal.close().await;
    let mut indexed = keyed(&a, 6..=7);
    indexed.extend(keyed(&b, 1..=7));
    indexed.sort();
    assert_eq!(rows(&path, "event_journal"), indexed);
    assert_eq!(rows(&path, "event_buffer"), Vec::new());
    drop(db.dir);
}

#[tokio::test]
async fn sqlite_large_appends_go_straight_to_event_journal() {
    let db = sqlite(SqliteOptions::builder()).await;
    let path = db.journal.path().to_path_buf();
    let a = fresh_id("large");
    let journal = &db.journal;
    journal
        .append(&a, 1, (1..=3).map(|s| payload("a", s)).collect())
        .await
        .unwrap();
    journal
        .append(&a, 4, (4..=40).map(|s| payload("a", s)).collect())
        .await
        .unwrap();
    assert_eq!(rows(&path, "event_buffer"), keyed(&a, 1..=3));
    assert_eq!(rows(&path, "event_journal"), keyed(&a, 4..=40));
    assert_eq!(journal.highest_seq(&a).await, Ok(40));
    let replayed = journal.replay(&a, 2, 99, 99).await.unwrap();
    assert_eq!(
        replayed
            .into_iter()
            .map(|e| (e.seq, e.payload))
            .collect::<Vec<_>>(),
        (2..=40).map(|s| (s, payload("a", s))).collect::<Vec<_>>()
    );
    assert!(matches!(
        journal.append(&a, 40, vec![payload("a", 40)]).await,
        Err(JournalError::Conflict {
            highest_seq: 40,
            ..
        })
    ));
    journal
        .append(&a, 41, vec![payload("a", 41)])
        .await
        .unwrap();

    // A stream written in large appends only is fenced and read through the index.
    let b = fresh_id("large-only");
    let large = |from: u64| {
        (from..from + 40)
            .map(|s| payload("b", s))
            .collect::<Vec<_>>()
    };
    journal.append(&b, 1, large(1)).await.unwrap();
    journal.append(&b, 41, large(41)).await.unwrap();
    assert_eq!(
        journal.append(&b, 41, large(41)).await,
        Err(JournalError::Conflict {
            persistence_id: b.clone(),
            first_seq: 41,
            highest_seq: 80
        })
    );
    assert_eq!(journal.highest_seq(&b).await, Ok(80));
    assert_eq!(journal.replay(&b, 1, 99, 99).await.unwrap().len(), 80);
    journal
        .append(&b, 81, vec![payload("b", 81)])
        .await
        .unwrap();
    assert_eq!(journal.replay(&b, 79, 99, 99).await.unwrap().len(), 3);
    db.journal.close().await;
    let mut all = keyed(&a, 1..=41);
    all.extend(keyed(&b, 1..=81));
    all.sort();
    assert_eq!(rows(&path, "event_journal"), all);
    drop(db.dir);
}

#[tokio::test]
async fn sqlite_a_file_is_open_in_one_journal_at_a_time() {
    let db = sqlite(SqliteOptions::builder()).await;
    let waiting = SqliteOptions::builder()
        .busy_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let second = open_with(db.journal.path(), waiting.clone()).await;
    assert!(
        matches!(&second, Err(JournalError::Storage { message, .. }) if message.contains("open elsewhere")),
        "{:?}",
        second.err()
    );
    let path = db.journal.path().to_path_buf();
    db.journal.close().await;
    open_with(&path, waiting.clone())
        .await
        .unwrap()
        .close()
        .await;
    // Dropping the last handle instead of closing it: the reopen waits for the release.
    drop(open(&path).await.unwrap());
    open(&path).await.unwrap();
    drop(db.dir);
}

/// The one-writer lock belongs to the database file, not to the name it is opened under: a
/// symlink (even one made before the file existed) or a path through `..` reaches the same
/// lock, and a file with a second hard link is refused under either name (the names would get
/// separate locks, and separate write-ahead logs).
#[cfg(unix)]
#[tokio::test]
async fn sqlite_a_file_is_one_journal_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let waiting = SqliteOptions::builder()
        .busy_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let open_elsewhere = |result: Result<SqliteJournal, JournalError>| matches!(&result, Err(JournalError::Storage { message, .. }) if message.contains("open elsewhere"));
    let first = open(&path).await.unwrap();
    let alias = dir.path().join("alias.db");
    std::os::unix::fs::symlink(&path, &alias).unwrap();
    assert!(open_elsewhere(open_with(&alias, waiting.clone()).await));
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let dotted = dir.path().join("sub").join("..").join("journal.db");
    assert!(open_elsewhere(open_with(&dotted, waiting.clone()).await));
    // Through a symlink to a file that does not exist yet: it is created, and locked as itself.
    let target = dir.path().join("later.db");
    let early = dir.path().join("early.db");
    std::os::unix::fs::symlink(&target, &early).unwrap();
    let through_link = open_with(&early, waiting.clone()).await.unwrap();
    assert!(open_elsewhere(open_with(&target, waiting.clone()).await));
    through_link.close().await;

    let hard = dir.path().join("hard.db");
    std::fs::hard_link(&path, &hard).unwrap();
    let refused = open_with(&hard, waiting.clone()).await;
    assert!(
        matches!(&refused, Err(JournalError::Storage { message, .. }) if message.contains("2 hard links")),
        "{:?}",
        refused.err()
    );
    first.close().await;
    let refused = open_with(&path, waiting.clone()).await;
    assert!(
        matches!(&refused, Err(JournalError::Storage { message, .. }) if message.contains("hard links")),
        "refused under its first name too: {:?}",
        refused.err()
    );
    std::fs::remove_file(&hard).unwrap();
    open_with(&alias, waiting).await.unwrap().close().await;
}

#[tokio::test]
async fn sqlite_invalid_options_and_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let refused = SqliteOptions::builder().readers(0).build().unwrap_err();
    assert_eq!(refused.field, "readers", "{refused}");
    let result = open(dir.path().join("missing-dir").join("j.db")).await;
    assert!(
        matches!(&result, Err(JournalError::Storage { persistence_id: None, message }) if message.contains("missing-dir")),
        "{:?}",
        result.err()
    );
}
