//! Exactly once into a SQLite read model, in process: rows and offset commit together, a
//! failed batch leaves nothing, a restart goes on, offset 0 rebuilds the same model; and a
//! SQLite file as the offset store of an at-least-once projection.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalFuture, JournalId, Offset, PersistenceId, Slices, Snapshot, SqliteJournal,
    StoredEvent, TagNotifications, TagQuery, TaggedEvent,
};
use actix_delivery::persistence::PersistentConfig;
use actix_delivery::projection::{
    Envelope, HandlerError, OffsetStore, PoisonPolicy, Projection, ProjectionError,
    ProjectionHandle, SqliteReadModel,
};
use rusqlite::Transaction;

use super::bank::{self, wait_until, Account, AccountEvent, Balances};

const WITHIN: Duration = Duration::from_secs(30);

/// The read model's tables: balances, and every event applied (no key: a repeat would show).
pub const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS balances (
        account TEXT PRIMARY KEY, balance INTEGER NOT NULL, events INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS applied (
        account TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL);";

/// Applies `events` in `transaction`: the handler of the tests' SQLite read models.
pub fn apply(
    transaction: &Transaction<'_>,
    events: &[Envelope<AccountEvent>],
) -> Result<(), HandlerError> {
    for envelope in events {
        let delta = match envelope.event {
            AccountEvent::Deposited(n) => n,
            AccountEvent::Withdrew(n) => -n,
        };
        let account = envelope.persistence_id.as_str();
        transaction.execute(
            "INSERT INTO balances (account, balance, events) VALUES (?1, ?2, 1) \
             ON CONFLICT (account) DO UPDATE SET balance = balance + ?2, events = events + 1",
            rusqlite::params![account, delta],
        )?;
        transaction.execute(
            "INSERT INTO applied (account, seq, event) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                account,
                envelope.seq as i64,
                format!("{:?}", envelope.event)
            ],
        )?;
    }
    Ok(())
}

/// A read model's balances, and its applied events (account, seq, event) in order.
pub type Rows = (BTreeMap<String, Account>, Vec<(String, u64, String)>);

/// The read model's balances and applied events, read by a connection of its own.
pub fn read(path: &Path) -> Rows {
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut balances = BTreeMap::new();
    let mut statement = connection
        .prepare("SELECT account, balance, events FROM balances")
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    for row in rows {
        let (account, balance, events) = row.unwrap();
        balances.insert(account, Account { balance, events });
    }
    let mut statement = connection
        .prepare("SELECT account, seq, event FROM applied ORDER BY rowid")
        .unwrap();
    let applied = statement
        .query_map([], |row| {
            Ok((row.get(0)?, row.get::<_, i64>(1)? as u64, row.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (balances, applied)
}

/// Asserts each (account, seq) in `applied` once, each account's in seq order (`context` in
/// the message).
pub fn assert_applied_once(applied: &[(String, u64, String)], context: &str) {
    bank::assert_once_in_order(
        applied.iter().map(|(a, seq, _)| (a.as_str(), *seq)),
        context,
    );
}

async fn model(path: &Path) -> SqliteReadModel {
    let mut model = SqliteReadModel::open(path).await.unwrap();
    model.execute_batch(TABLES).await.unwrap();
    model
}

fn project(
    journal: &Arc<dyn Journal>,
    name: &str,
    model: SqliteReadModel,
    handler: impl FnMut(&Transaction<'_>, &[Envelope<AccountEvent>]) -> Result<(), HandlerError>
        + Send
        + 'static,
) -> ProjectionHandle {
    let options = bank::options(name).batch_size(8).build().unwrap();
    Projection::of::<Account>(journal.clone(), options).exactly_once_sqlite(model, handler)
}

async fn journal(dir: &Path) -> Arc<dyn Journal> {
    Arc::new(SqliteJournal::open(dir.join("journal.db")).await.unwrap())
}

/// A directory with a journal in which `accounts` accounts ran `commands` commands, and the
/// path of a read model beside it.
async fn bank_in(accounts: usize, commands: u64) -> (tempfile::TempDir, Arc<dyn Journal>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal(dir.path()).await;
    let handles = bank::open(&journal, "", accounts, &PersistentConfig::default());
    bank::run(&handles, 0..commands).await;
    let path = dir.path().join("model.db");
    (dir, journal, path)
}

#[actix::test]
async fn rows_and_offset_commit_together_and_a_failed_batch_leaves_nothing_behind() {
    let (_dir, journal, path) = bank_in(3, 40).await;
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |transaction: &Transaction<'_>, events: &[Envelope<AccountEvent>]| {
            apply(transaction, events)?;
            // Every other call fails after writing its rows: they must be rolled back.
            if calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
                return Err("after the rows, before the commit".into());
            }
            Ok(())
        }
    };
    let projection = project(&journal, "balances", model(&path).await, handler);
    wait_until("40", WITHIN, || projection.stats().events == 40).await;
    let stats = projection.stats();
    assert!(stats.retries >= 5, "every batch failed once: {stats:?}");
    let (balances, applied) = read(&path);
    assert_eq!(
        applied.len(),
        40,
        "each event once, none of a failed attempt"
    );
    assert_applied_once(&applied, "in process");
    assert_eq!(balances, bank::fold(&*journal, "", 3).await);
    projection.stop();
    projection.stopped().await.unwrap();
    let mut reopened = SqliteReadModel::open(&path).await.unwrap();
    let stored = reopened.load("balances", Slices::ALL).await.unwrap();
    assert_eq!(
        stored, stats.offset,
        "the offset of the last committed batch"
    );
}

#[actix::test]
async fn a_restart_goes_on_and_a_rebuild_from_offset_zero_gives_the_same_read_model() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal(dir.path()).await;
    let accounts = bank::open(&journal, "", 4, &PersistentConfig::default());
    bank::run(&accounts, 0..30).await;
    let path = dir.path().join("model.db");
    let first = project(&journal, "balances", model(&path).await, apply);
    wait_until("30", WITHIN, || first.stats().events == 30).await;
    first.stop();
    first.stopped().await.unwrap();
    bank::run(&accounts, 30..50).await;
    let second = project(&journal, "balances", model(&path).await, apply);
    wait_until("20 more", WITHIN, || second.stats().events == 20).await;
    second.stop();
    second.stopped().await.unwrap();
    let (balances, applied) = read(&path);
    assert_eq!(applied.len(), 50);
    assert_applied_once(&applied, "in process");
    assert_eq!(balances, bank::fold(&*journal, "", 4).await);

    let rebuilt_path = dir.path().join("rebuilt.db");
    let rebuilt = project(&journal, "balances-v2", model(&rebuilt_path).await, apply);
    wait_until("50 from offset 0", WITHIN, || rebuilt.stats().events == 50).await;
    assert_eq!(
        read(&rebuilt_path),
        (balances, applied),
        "the same rows, in the same order"
    );
}

#[actix::test]
async fn a_sqlite_file_keeps_the_offset_of_an_at_least_once_projection() {
    let (_dir, journal, path) = bank_in(2, 10).await;
    let balances = Balances::default();
    let options = bank::options("search-index").build().unwrap();
    let projection = Projection::of::<Account>(journal.clone(), options).at_least_once(
        SqliteReadModel::open(&path).await.unwrap(),
        balances.handler(),
    );
    wait_until("10", WITHIN, || projection.stats().events == 10).await;
    projection.stop();
    projection.stopped().await.unwrap();
    let mut store = SqliteReadModel::open(&path).await.unwrap();
    assert_eq!(
        store.load("search-index", Slices::ALL).await.unwrap(),
        projection.stats().offset
    );
    assert!(projection.stats().offset > Offset::START);
}

#[actix::test]
async fn a_handler_that_ends_the_transaction_itself_never_gets_the_offset_stored_without_its_rows()
{
    let (_dir, journal, path) = bank_in(2, 10).await;
    let options = bank::options("balances")
        .max_retries(0)
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .unwrap();
    let projection = Projection::of::<Account>(journal.clone(), options).exactly_once_sqlite(
        model(&path).await,
        |transaction: &Transaction<'_>, events: &[Envelope<AccountEvent>]| {
            apply(transaction, events)?;
            // Ends the projection's transaction: in autocommit, the offset alone would commit.
            transaction.execute_batch("ROLLBACK")?;
            Ok(())
        },
    );
    let stopped = tokio::time::timeout(WITHIN, projection.stopped())
        .await
        .expect("the projection stops at the first entry");
    let error = stopped.unwrap_err().to_string();
    assert!(
        error.contains("the handler ended the projection's transaction"),
        "{error}"
    );
    let mut reopened = SqliteReadModel::open(&path).await.unwrap();
    assert_eq!(
        reopened.load("balances", Slices::ALL).await.unwrap(),
        Offset::START,
        "no offset stored"
    );
    assert!(read(&path).1.is_empty(), "no rows");
}

/// A journal whose first read by tag waits until the other instance's first read has come
/// too: both instances have loaded the stored offset, and both handle the same first batch.
struct FirstReadsMeet {
    inner: Arc<dyn Journal>,
    meeting: Arc<tokio::sync::Barrier>,
    met: AtomicBool,
}

impl FirstReadsMeet {
    /// One journal per instance, all forwarding to `inner`.
    fn pair(inner: &Arc<dyn Journal>) -> [Arc<dyn Journal>; 2] {
        let meeting = Arc::new(tokio::sync::Barrier::new(2));
        [(); 2].map(|()| {
            Arc::new(Self {
                inner: inner.clone(),
                meeting: meeting.clone(),
                met: AtomicBool::new(false),
            }) as Arc<dyn Journal>
        })
    }
}

impl Journal for FirstReadsMeet {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.inner.append_as(id, first_seq, payloads, manifest)
    }
    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.inner.replay(id, from_seq, to_seq, max_events)
    }
    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }
    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to_seq)
    }
    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, snapshot)
    }
    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.inner.load_snapshot(id)
    }
    fn events_by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<TaggedEvent>> {
        let query = query.clone();
        Box::pin(async move {
            if !self.met.swap(true, Ordering::SeqCst) {
                self.meeting.wait().await;
            }
            self.inner.events_by_tag(&query, after, max_events).await
        })
    }
    fn tag_notifications(&self) -> Option<TagNotifications> {
        self.inner.tag_notifications()
    }
    fn offset_ceiling(&self) -> JournalFuture<'_, Offset> {
        self.inner.offset_ceiling()
    }
    fn journal_id(&self) -> Option<JournalId> {
        self.inner.journal_id()
    }
}

#[actix::test]
async fn two_instances_of_one_projection_on_one_read_model_apply_each_event_once() {
    let (_dir, journal, path) = bank_in(5, 300).await;
    let (first, second) = (model(&path).await, model(&path).await);
    let [to_first, to_second] = FirstReadsMeet::pair(&journal);
    let instances = [
        project(&to_first, "balances", first, apply),
        project(&to_second, "balances", second, apply),
    ];
    wait_until("300 applied", WITHIN, || read(&path).1.len() >= 300).await;
    for instance in &instances {
        instance.stop();
    }
    for instance in &instances {
        instance.stopped().await.unwrap();
    }
    let (balances, applied) = read(&path);
    assert_eq!(applied.len(), 300, "each event once");
    assert_applied_once(&applied, "two instances");
    assert_eq!(balances, bank::fold(&*journal, "", 5).await);
    let conflicts: u64 = instances.iter().map(|p| p.stats().conflicts).sum();
    assert!(
        conflicts > 0,
        "both handled the first batch from the same offset: one of them must roll it back"
    );
    let events: u64 = instances.iter().map(|p| p.stats().events).sum();
    assert_eq!(
        events, 300,
        "each batch counted by the instance that committed it"
    );
}

#[actix::test]
async fn a_change_of_slices_is_refused_instead_of_handling_events_again() {
    let (_dir, journal, path) = bank_in(4, 20).await;
    let whole = project(&journal, "balances", model(&path).await, apply);
    wait_until("20", WITHIN, || whole.stats().events == 20).await;
    whole.stop();
    whole.stopped().await.unwrap();
    let before = read(&path);
    for part in 0..2 {
        let options = bank::options("balances")
            .slices(Slices::split(2, part).unwrap())
            .build()
            .unwrap();
        let half = Projection::of::<Account>(journal.clone(), options)
            .exactly_once_sqlite(model(&path).await, apply);
        let error = tokio::time::timeout(WITHIN, half.stopped())
            .await
            .expect("refused at once")
            .unwrap_err();
        assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
        assert!(error.to_string().contains("slices 0-1023"), "{error}");
    }
    assert_eq!(read(&path), before, "nothing handled again");
}

/// A read model file that followed one journal file, pointed at another (whose entries go
/// on past its offset, so no ceiling tells): refused at once, nothing handled, where it
/// would have skipped the other journal's first entries and handled the rest.
#[actix::test]
async fn a_read_model_of_one_journal_file_pointed_at_another_is_refused() {
    let (dir, followed, path) = bank_in(2, 6).await;
    let first = project(&followed, "balances", model(&path).await, apply);
    wait_until("6", WITHIN, || first.stats().events == 6).await;
    first.stop();
    first.stopped().await.unwrap();
    let before = read(&path);

    let other: Arc<dyn Journal> = Arc::new(
        SqliteJournal::open(dir.path().join("other.db"))
            .await
            .unwrap(),
    );
    let accounts = bank::open(&other, "other-", 2, &PersistentConfig::default());
    bank::run(&accounts, 0..10).await;
    let projection = project(&other, "balances", model(&path).await, apply);
    let error = tokio::time::timeout(WITHIN, projection.stopped())
        .await
        .unwrap_or_else(|_| panic!("not refused: {:?}", projection.stats()))
        .unwrap_err();
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    let message = error.to_string();
    let (followed, other) = (followed.journal_id().unwrap(), other.journal_id().unwrap());
    assert_ne!(followed, other);
    assert!(
        message.contains(&format!(
            "follows journal {followed}, not this one ({other})"
        )),
        "{message}"
    );
    assert_eq!(projection.stats().events, 0);
    assert_eq!(read(&path), before, "nothing of the other journal handled");
}

#[actix::test]
async fn a_read_model_missing_its_table_is_retried_never_skipped_as_poison() {
    crate::common::logs::keep();
    let (_dir, journal, path) = bank_in(2, 10).await;
    let options = bank::options("balances")
        .max_retries(0)
        .poison(PoisonPolicy::Skip)
        .build()
        .unwrap();
    // Writes into a table created only later: the read model's fault, not the events'.
    let projection = Projection::of::<Account>(journal.clone(), options).exactly_once_sqlite(
        SqliteReadModel::open(&path).await.unwrap(),
        |transaction: &Transaction<'_>, events: &[Envelope<AccountEvent>]| {
            for envelope in events {
                transaction.execute(
                    "INSERT INTO applied (account, seq, event) VALUES (?1, ?2, '')",
                    rusqlite::params![envelope.persistence_id.as_str(), envelope.seq as i64],
                )?;
            }
            Ok(())
        },
    );
    wait_until("failing on the missing table", WITHIN, || {
        projection.stats().store_failures >= 2
    })
    .await;
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(TABLES)
        .unwrap();
    wait_until("10", WITHIN, || projection.stats().events == 10).await;
    assert_eq!(projection.stats().skipped, 0, "no event blamed");
    let (_, applied) = read(&path);
    assert_eq!(applied.len(), 10);
    assert_applied_once(&applied, "after the table appeared");
    // Each failure is logged with SQLite's result code below its message.
    let logged = crate::common::logs::lines_containing(&[
        "projection `balances`: handling a batch failed: no such table: applied: Error code 1: \
         SQL logic error",
    ]);
    assert_eq!(
        logged.len() as u64,
        projection.stats().store_failures,
        "{logged:?}"
    );
}
