//! What is specific to the PostgreSQL journal (feature `postgres`; the conformance suite runs
//! in `journal.rs` beside it): group commit, a refused or failing write inside a group, reads
//! beside a blocked writer, the schema check (tables altered by hand included), the message
//! size bound, lost connections: sessions killed by the server, and connections cut by a
//! proxy between a commit and its answer. The server:
//! `ACTIX_DELIVERY_POSTGRES`, see `tests/postgres_support`.

use crate::common::logs;
use crate::postgres_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, PersistenceId, PostgresJournal, PostgresOptions,
    PostgresOptionsBuilder, Snapshot,
};
use futures_util::future::join_all;
use futures_util::FutureExt;
use postgres_support::{admin, journal_named, options, unique, SCHEMA};
use tokio_postgres::Client;

fn fresh_id(name: &str) -> PersistenceId {
    PersistenceId::new(unique(name)).unwrap()
}

fn one(seq: u64) -> Vec<Vec<u8>> {
    vec![format!("w:{seq}").into_bytes()]
}

/// Polls `future` once (outside Tokio's budget), so that it reaches the journal's queue, and
/// hands it back pending.
fn started<T>(mut future: JournalFuture<'_, T>) -> JournalFuture<'_, T> {
    let polled = tokio::task::unconstrained(&mut future).now_or_never();
    assert!(polled.is_none(), "expected the operation to wait");
    future
}

/// Waits (in real time) until `condition` holds.
async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut condition: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The journal's writer, held up: another connection holds the row lock of stream
/// `blocker`, and the writer's append to it waits for that lock inside its transaction.
/// Writes started meanwhile queue up behind it.
struct Blocked<'a> {
    lock: Client,
    first: JournalFuture<'a, ()>,
}

async fn block_writer<'a>(journal: &'a PostgresJournal, name: &str) -> Blocked<'a> {
    let blocker = fresh_id("blocker");
    journal.append(&blocker, 1, one(1)).await.unwrap();
    let lock = admin().await;
    lock.batch_execute("BEGIN").await.unwrap();
    lock.execute(
        &format!("SELECT 1 FROM {SCHEMA}.stream_metadata WHERE persistence_id = $1 FOR UPDATE"),
        &[&blocker.as_str()],
    )
    .await
    .unwrap();
    let first = started(journal.append(&blocker, 2, one(2)));
    let watcher = admin().await;
    wait_until("the writer waits for the row lock", || async {
        let row = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&name],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1
    })
    .await;
    Blocked { lock, first }
}

impl Blocked<'_> {
    async fn release(self) {
        self.lock.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(self.first.await, Ok(()));
    }
}

#[tokio::test]
async fn group_commit_takes_every_queued_append_in_one_transaction() {
    let name = unique("group");
    let journal = journal_named(&name, options()).await;
    let blocked = block_writer(&journal, &name).await;
    let before = journal.stats();
    let ids: Vec<_> = (0..99).map(|i| fresh_id(&format!("group{i}"))).collect();
    let appends: Vec<_> = ids
        .iter()
        .map(|id| started(journal.append(id, 1, one(1))))
        .collect();
    assert_eq!(journal.stats().queued, 99);
    blocked.release().await;
    assert!(join_all(appends).await.iter().all(Result::is_ok));
    let after = journal.stats();
    assert_eq!(
        (
            after.appends - before.appends,
            after.transactions - before.transactions,
            after.rejected
        ),
        (100, 2, 0),
        "the blocked append alone, then the 99 queued behind it together"
    );
    for id in &ids {
        assert_eq!(journal.highest_seq(id).await, Ok(1));
    }
}

#[tokio::test]
async fn concurrent_appenders_share_transactions() {
    let name = unique("share");
    let journal = journal_named(&name, options()).await;
    let ids: Vec<_> = (0..32).map(|i| fresh_id(&format!("share{i}"))).collect();
    let before = journal.stats();
    join_all(ids.iter().map(|id| {
        let journal = &journal;
        async move {
            for seq in 1..=10 {
                journal.append(id, seq, one(seq)).await.unwrap();
            }
        }
    }))
    .await;
    let after = journal.stats();
    let (appends, transactions) = (
        after.appends - before.appends,
        after.transactions - before.transactions,
    );
    assert_eq!(appends, 320);
    assert!(
        transactions * 4 <= appends,
        "{appends} appends took {transactions} transactions: no group commit"
    );
}

#[tokio::test]
async fn a_refused_write_in_a_group_leaves_the_others_committed() {
    let name = unique("refused");
    let journal = journal_named(&name, options()).await;
    let (s1, s2) = (fresh_id("s1"), fresh_id("s2"));
    let blocked = block_writer(&journal, &name).await;
    let before = journal.stats();
    let b = started(journal.append(&s1, 1, one(1)));
    let c = started(journal.append(&s1, 1, vec![b"loser".to_vec()]));
    let d = started(journal.append(
        &s2,
        1,
        vec![one(1).remove(0), one(2).remove(0), one(3).remove(0)],
    ));
    let e = started(journal.append(&s1, 2, one(2)));
    let f = started(journal.save_snapshot(&s2, Snapshot::new(3, b"s2@3".to_vec())));
    let g = started(journal.save_snapshot(&s1, Snapshot::new(5, b"s1@5".to_vec())));
    let h = started(journal.delete_to(&s2, 1));
    let i = started(journal.append(&s2, 3, one(3)));
    blocked.release().await;
    assert_eq!(b.await, Ok(()));
    // The loser learns the stream's highest seq as of its reply: 2, after `e`.
    assert_eq!(
        c.await,
        Err(JournalError::Conflict {
            persistence_id: s1.clone(),
            first_seq: 1,
            highest_seq: 2
        })
    );
    assert_eq!(d.await, Ok(()));
    assert_eq!(e.await, Ok(()));
    assert_eq!(f.await, Ok(()));
    assert!(matches!(g.await, Err(JournalError::InvalidArgument { .. })));
    assert_eq!(h.await, Ok(()));
    assert!(matches!(
        i.await,
        Err(JournalError::Conflict {
            first_seq: 3,
            highest_seq: 3,
            ..
        })
    ));
    let after = journal.stats();
    assert_eq!(
        (
            after.transactions - before.transactions,
            after.appends - before.appends,
            after.rejected - before.rejected
        ),
        (2, 4, 3),
        "the blocked append, then one transaction for all eight writes"
    );
    let seqs = |events: Vec<actix_delivery::journal::StoredEvent>| {
        events
            .into_iter()
            .map(|e| (e.seq, e.payload))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        seqs(journal.replay(&s1, 1, 10, 10).await.unwrap()),
        vec![(1, one(1).remove(0)), (2, one(2).remove(0))]
    );
    assert_eq!(
        seqs(journal.replay(&s2, 1, 10, 10).await.unwrap()),
        vec![(2, one(2).remove(0)), (3, one(3).remove(0))]
    );
    assert_eq!(journal.load_snapshot(&s1).await, Ok(None));
    assert_eq!(
        journal.load_snapshot(&s2).await,
        Ok(Some(Snapshot::new(3, b"s2@3".to_vec())))
    );
}

#[tokio::test]
async fn a_database_error_in_a_group_fails_only_its_own_write() {
    let name = unique("foreign");
    let journal = journal_named(&name, options()).await;
    let (good, bad) = (fresh_id("good"), fresh_id("bad"));
    // An event row written behind the journal's back (no stream_metadata row): the fence
    // lets an append at seq 1 through, the primary key stops it.
    admin()
        .await
        .execute(
            &format!(
                "INSERT INTO {SCHEMA}.event_journal (persistence_id, seq_nr, payload, \
                 ser_codec, ser_manifest, ser_version) VALUES ($1, 1, 'foreign', 0, '', 0)"
            ),
            &[&bad.as_str()],
        )
        .await
        .unwrap();
    let blocked = block_writer(&journal, &name).await;
    let before = journal.stats();
    let a = started(journal.append(&good, 1, one(1)));
    let b = started(journal.append(&bad, 1, one(1)));
    let c = started(journal.append(&good, 2, one(2)));
    blocked.release().await;
    assert_eq!(a.await, Ok(()));
    match b.await {
        Err(JournalError::Storage {
            persistence_id: Some(id),
            message,
        }) => {
            assert_eq!(id, bad);
            assert!(
                message.contains("not stored") && message.contains("23505"),
                "{message}"
            );
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    assert_eq!(c.await, Ok(()));
    assert_eq!(
        journal.stats().appends - before.appends,
        3,
        "the blocked append and both of `good`"
    );
    assert_eq!(journal.highest_seq(&good).await, Ok(2));
    assert_eq!(
        journal.highest_seq(&bad).await,
        Ok(0),
        "nothing of it stored"
    );
    assert_eq!(
        journal.replay(&bad, 1, 9, 9).await.unwrap()[0].payload,
        b"foreign".to_vec()
    );
}

#[tokio::test]
async fn reads_do_not_wait_behind_the_writer() {
    let name = unique("reads");
    let journal = journal_named(&name, options()).await;
    let a = fresh_id("read");
    journal.append(&a, 1, one(1)).await.unwrap();
    let blocked = block_writer(&journal, &name).await;
    let queued = started(journal.append(&a, 2, one(2)));
    let reads = async {
        assert_eq!(journal.highest_seq(&a).await, Ok(1));
        assert_eq!(journal.replay(&a, 1, 9, 9).await.unwrap().len(), 1);
        assert_eq!(journal.load_snapshot(&a).await, Ok(None));
    };
    tokio::time::timeout(Duration::from_secs(5), reads)
        .await
        .expect("reads waited for the blocked writer");
    blocked.release().await;
    assert_eq!(queued.await, Ok(()));
    assert_eq!(journal.highest_seq(&a).await, Ok(2));
}

#[tokio::test]
async fn the_queue_in_front_of_the_writer_is_bounded() {
    let name = unique("bounded");
    let journal = journal_named(&name, options().queue_capacity(4)).await;
    let blocked = block_writer(&journal, &name).await;
    let ids: Vec<_> = (0..10).map(|i| fresh_id(&format!("queue{i}"))).collect();
    let mut appends: Vec<_> = ids.iter().map(|id| journal.append(id, 1, one(1))).collect();
    for append in &mut appends {
        assert!(tokio::task::unconstrained(append).now_or_never().is_none());
    }
    assert_eq!(
        journal.stats().queued,
        4,
        "the other 6 wait outside the queue"
    );
    blocked.release().await;
    assert!(join_all(appends).await.iter().all(Result::is_ok));
}

/// A fresh schema for one schema test, dropped when done.
struct Scratch {
    admin: Client,
    schema: String,
}

impl Scratch {
    async fn new(setup: &str) -> Self {
        let schema = unique("actix_delivery_scratch");
        let admin = admin().await;
        admin
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; SET search_path TO {schema}; {setup}"
            ))
            .await
            .unwrap();
        Self { admin, schema }
    }

    async fn open(&self, options: PostgresOptionsBuilder) -> Result<PostgresJournal, JournalError> {
        let options = options.schema(&self.schema).build().unwrap();
        PostgresJournal::connect_with(&postgres_support::url(), options).await
    }

    async fn tables(&self) -> Vec<String> {
        let rows = self
            .admin
            .query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1",
                &[&self.schema],
            )
            .await
            .unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    }

    async fn drop(self) {
        self.admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .unwrap();
    }
}

fn schema_error(result: Result<PostgresJournal, JournalError>) -> String {
    match result {
        Err(JournalError::Schema { found, expected }) => {
            assert!(expected.contains("schema version 3"), "{expected}");
            found
        }
        Err(other) => panic!("expected a schema error, got {other:?}"),
        Ok(_) => panic!("expected a schema error, the journal opened"),
    }
}

#[tokio::test]
async fn a_newer_or_foreign_schema_is_refused_and_left_untouched() {
    let newer = Scratch::new(
        "CREATE TABLE journal_schema (application text, version int); \
         INSERT INTO journal_schema VALUES ('actix-delivery', 4);",
    )
    .await;
    let found = schema_error(newer.open(PostgresOptions::builder()).await);
    assert!(
        found.contains("version 4") && found.contains("newer") && found.contains("1 to 3"),
        "{found}"
    );
    assert_eq!(newer.tables().await, ["journal_schema"], "nothing created");
    newer.drop().await;

    let foreign = Scratch::new("CREATE TABLE event_journal (id serial, body text);").await;
    let found = schema_error(foreign.open(PostgresOptions::builder()).await);
    assert!(
        found.contains("event_journal") && found.contains("not made by"),
        "{found}"
    );
    assert_eq!(foreign.tables().await, ["event_journal"]);
    foreign.drop().await;

    let other_app = Scratch::new(
        "CREATE TABLE journal_schema (application text, version int); \
         INSERT INTO journal_schema VALUES ('someone-else', 1);",
    )
    .await;
    let found = schema_error(other_app.open(PostgresOptions::builder()).await);
    assert!(found.contains("someone-else"), "{found}");
    other_app.drop().await;

    let incomplete = Scratch::new(
        &PostgresJournal::SCHEMA_SQL
            .replace("CREATE TABLE snapshot (", "CREATE TABLE not_the_snapshot ("),
    )
    .await;
    let found = schema_error(incomplete.open(PostgresOptions::builder()).await);
    assert!(found.contains("without its table `snapshot`"), "{found}");
    incomplete.drop().await;
}

/// Tables altered by hand are a `Schema` error with the details, not a transient `Storage`
/// one: on connect (a column dropped or retyped), and while the journal runs (a column or a
/// table dropped under it: SQLSTATE 42703 / 42P01 kept in the message).
#[tokio::test]
async fn tables_altered_by_hand_are_a_schema_error() {
    for (alter, expected) in [
        (
            "ALTER TABLE event_journal DROP COLUMN written_at",
            "event_journal` has no column `written_at`",
        ),
        (
            "ALTER TABLE event_journal ALTER COLUMN seq_nr TYPE integer",
            "column `seq_nr` of",
        ),
        (
            "ALTER TABLE snapshot ALTER COLUMN payload TYPE text",
            "is of type text, not bytea",
        ),
        (
            "ALTER TABLE stream_metadata RENAME COLUMN highest_seq TO high",
            "has no column `highest_seq`",
        ),
        (
            "ALTER TABLE event_tag ALTER COLUMN txid DROP DEFAULT, ALTER COLUMN txid TYPE bigint USING 0",
            "column `txid` of",
        ),
        ("DROP TABLE event_tag", "without its table `event_tag`"),
    ] {
        let altered = Scratch::new(&format!("{} {alter};", PostgresJournal::SCHEMA_SQL)).await;
        let found = schema_error(altered.open(PostgresOptions::builder()).await);
        assert!(found.contains(expected), "{alter}: {found}");
        altered.drop().await;
    }

    let scratch = Scratch::new(PostgresJournal::SCHEMA_SQL).await;
    let journal = scratch.open(PostgresOptions::builder()).await.unwrap();
    let id = fresh_id("altered");
    journal.append(&id, 1, one(1)).await.unwrap();
    let schema = &scratch.schema;
    scratch
        .admin
        .batch_execute(&format!(
            "ALTER TABLE {schema}.event_journal DROP COLUMN payload; DROP TABLE {schema}.snapshot"
        ))
        .await
        .unwrap();
    let schema_error_of = |result: Result<(), JournalError>, sqlstate: &str| match result {
        Err(JournalError::Schema { found, .. }) => {
            assert!(found.contains(sqlstate), "{found}")
        }
        other => panic!("expected a schema error with SQLSTATE {sqlstate}, got {other:?}"),
    };
    schema_error_of(journal.append(&id, 2, one(2)).await, "42703");
    schema_error_of(journal.replay(&id, 1, 9, 9).await.map(drop), "42703");
    schema_error_of(journal.load_snapshot(&id).await.map(drop), "42P01");
    let snapshot = Snapshot::new(1, vec![1]);
    schema_error_of(journal.save_snapshot(&id, snapshot).await, "42P01");
    assert_eq!(
        journal.highest_seq(&id).await,
        Ok(1),
        "the rest still works"
    );
    journal.close().await;
    scratch.drop().await;
}

/// An append too large for one protocol message (PostgreSQL accepts up to 1 GiB; here three
/// events of 400 MiB, each within the payload limit) is refused as an invalid argument
/// before anything is sent: definitely not stored, the connection kept, the journal usable.
#[tokio::test]
async fn an_append_larger_than_one_protocol_message_is_refused_before_sending() {
    let journal = postgres_support::journal().await;
    let id = fresh_id("huge");
    // Zeroed memory the allocator maps lazily: nothing of the 1.2 GiB is written.
    let events = (0..3).map(|_| vec![0u8; 400 << 20]).collect();
    match journal.append(&id, 1, events).await {
        Err(JournalError::InvalidArgument {
            persistence_id: Some(stream),
            reason,
        }) => {
            assert_eq!(stream, id);
            assert!(reason.contains("in one"), "{reason}");
        }
        other => panic!("expected an invalid argument, got {other:?}"),
    }
    assert_eq!(journal.highest_seq(&id).await, Ok(0));
    journal.append(&id, 1, one(1)).await.unwrap();
    let stats = journal.stats();
    assert_eq!(
        stats.reconnects, 0,
        "the connection was never lost: {stats:?}"
    );
    journal.close().await;
}

#[tokio::test]
async fn tables_are_created_on_first_connect_or_by_hand_from_the_sql_file() {
    let empty = Scratch::new("").await;
    let found = schema_error(
        empty
            .open(PostgresOptions::builder().create_tables(false))
            .await,
    );
    assert!(found.contains("no journal tables"), "{found}");
    assert_eq!(empty.tables().await, Vec::<String>::new());
    let journal = empty.open(PostgresOptions::builder()).await.unwrap();
    assert_eq!(
        empty.tables().await,
        [
            "event_journal",
            "event_tag",
            "journal_identity",
            "journal_schema",
            "snapshot",
            "stream_metadata"
        ]
    );
    assert!(journal.journal_id().is_some());
    let id = fresh_id("created");
    journal.append(&id, 1, one(1)).await.unwrap();
    journal.close().await;
    // Opening again finds the current schema and the data.
    let journal = empty.open(PostgresOptions::builder()).await.unwrap();
    assert_eq!(journal.highest_seq(&id).await, Ok(1));
    journal.close().await;
    empty.drop().await;

    let by_hand = Scratch::new(PostgresJournal::SCHEMA_SQL).await;
    let journal = by_hand
        .open(PostgresOptions::builder().create_tables(false))
        .await
        .unwrap();
    assert!(journal.journal_id().is_some(), "SCHEMA_SQL gives the id");
    journal.append(&id, 1, one(1)).await.unwrap();
    journal.close().await;
    by_hand.drop().await;

    // A schema that does not exist yet is created with the tables.
    let schema = unique("actix_delivery_new");
    let journal = PostgresJournal::connect_with(
        &postgres_support::url(),
        PostgresOptions::builder().schema(&schema).build().unwrap(),
    )
    .await
    .unwrap();
    journal.append(&id, 1, one(1)).await.unwrap();
    journal.close().await;
    admin()
        .await
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
async fn nodes_starting_at_once_create_the_tables_and_the_journal_id_once() {
    let schema = unique("actix_delivery_race");
    let url = postgres_support::url();
    let opened = join_all((0..4).map(|_| {
        let options = PostgresOptions::builder().schema(&schema).build().unwrap();
        PostgresJournal::connect_with(&url, options)
    }))
    .await;
    let mut ids = Vec::new();
    for journal in opened {
        let journal = journal.expect("every node opens the journal");
        ids.push(journal.journal_id().expect("an id"));
        journal.close().await;
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one journal, one id: {ids:?}");
    admin()
        .await
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// A connection string that does not parse is refused by the journal, the read model and the
/// lease store with what did not parse (the option, or where the string broke off), and
/// never with its password: not when the password itself is what breaks it (a space in it,
/// unquoted), not when the URL's scheme is misspelt (the whole URL reads as one option's name).
#[tokio::test]
async fn a_connection_string_that_does_not_parse_says_what_without_the_password() {
    const PASSWORD: &str = "s3cr3t-Pa55";
    let cases = [
        (
            format!("postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?conect_timeout=5"),
            "unknown option `conect_timeout`",
        ),
        (
            format!("postgresql://postgres:{PASSWORD}@127.0.0.1:54x2/test"),
            "invalid value for option `port`",
        ),
        (
            format!("postgresql://postgres:{PASSWORD}@127.0.0.1/test?sslmode=requir"),
            "invalid value for option `sslmode`",
        ),
        (
            format!("postgressql://postgres:{PASSWORD}@127.0.0.1/test?sslmode=require"),
            "postgresql://",
        ),
        (
            format!("host=127.0.0.1 password={PASSWORD} dbname test"),
            "expected `=` at byte 43",
        ),
        // A password with a space, unquoted: its second part reads as an option.
        (
            "host=127.0.0.1 password=s3cr3t Pa55=x dbname=test".to_owned(),
            "unknown option",
        ),
        (
            format!("host=127.0.0.1 password='{PASSWORD} dbname=test"),
            "a quoted value without its closing quote",
        ),
    ];
    for (config, expected) in &cases {
        let journal = match PostgresJournal::connect(config).await {
            Err(error @ JournalError::InvalidArgument { .. }) => error.to_string(),
            other => panic!("{config}: expected an invalid argument, got {other:?}"),
        };
        let model = actix_delivery::projection::PostgresReadModel::connect(config, "model")
            .await
            .unwrap_err()
            .to_string();
        let leases = actix_delivery::sharding::PostgresLeaseStore::connect(
            config,
            "leases",
            Duration::from_secs(1),
        )
        .await
        .expect_err("refused")
        .to_string();
        for message in [journal, model, leases] {
            assert!(message.contains("does not parse"), "{config}: {message}");
            assert!(message.contains(expected), "{config}: {message}");
            assert!(!message.contains("s3cr3t"), "{config}: {message}");
            assert!(!message.contains("Pa55"), "{config}: {message}");
        }
    }
}

#[tokio::test]
async fn bad_connection_strings_and_unreachable_servers_are_errors() {
    let result = PostgresJournal::connect("host=127.0.0.1 port=notaport").await;
    assert!(
        matches!(result, Err(JournalError::InvalidArgument { .. })),
        "{result:?}"
    );
    let refused = options().readers(0).build().unwrap_err();
    assert_eq!(refused.field, "readers", "{refused}");
    // Port 1 on loopback: nothing listens there.
    let result = PostgresJournal::connect("host=127.0.0.1 port=1 user=postgres dbname=test").await;
    match result {
        Err(JournalError::Storage { message, .. }) => {
            assert!(message.contains("cannot connect"), "{message}")
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
}

/// The server's message, with its detail, and its SQLSTATE reach the journal's errors and
/// the writer's log line, not tokio-postgres's "db error"; a refused connection says why.
#[tokio::test]
async fn the_journals_errors_name_the_servers_message_and_sqlstate() {
    logs::keep();
    let scratch = Scratch::new(&format!(
        "{} ALTER TABLE event_journal ADD CONSTRAINT not_7 CHECK (seq_nr <> 7);",
        PostgresJournal::SCHEMA_SQL
    ))
    .await;
    let journal = scratch.open(PostgresOptions::builder()).await.unwrap();
    let id = fresh_id("check");
    journal.append(&id, 1, one(1)).await.unwrap();
    let error = journal.append(&id, 2, vec![vec![2]; 6]).await.unwrap_err();
    let error = error.to_string();
    let violation =
        "ERROR: new row for relation \"event_journal\" violates check constraint \"not_7\"";
    let detail = format!("DETAIL: Failing row contains ({id}, 7, ");
    for expected in [violation, "(SQLSTATE 23514)", &detail] {
        assert!(error.contains(expected), "{expected:?} in {error}");
    }
    let logged = logs::lines_containing(&[
        "journal: a group of 1 writes failed: not stored, the transaction was rolled back",
        violation,
        "(SQLSTATE 23514)",
        &detail,
    ]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(
        journal.highest_seq(&id).await,
        Ok(1),
        "nothing of it stored"
    );
    journal.close().await;
    scratch.drop().await;
    // Port 1 on loopback: nothing listens there.
    let refused = PostgresJournal::connect("host=127.0.0.1 port=1 user=postgres dbname=test")
        .await
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("Connection refused (os error 111)"),
        "{refused}"
    );
}

#[tokio::test]
async fn close_commits_what_was_queued_even_if_its_callers_left() {
    let name = unique("close");
    let journal = journal_named(&name, options()).await;
    let ids: Vec<_> = (0..50).map(|i| fresh_id(&format!("left{i}"))).collect();
    let blocked = block_writer(&journal, &name).await;
    let abandoned: Vec<_> = ids
        .iter()
        .map(|id| started(journal.append(id, 1, one(1))))
        .collect();
    drop(abandoned); // the callers give up; their appends are queued already
    blocked.release().await;
    journal.close().await;
    let journal = postgres_support::journal().await;
    for id in &ids {
        assert_eq!(journal.highest_seq(id).await, Ok(1));
    }
}

/// Kills the journal's server sessions (`pg_terminate_backend`, as a lost connection) three
/// times while 16 appenders run: every append either committed (and is there afterwards)
/// or failed with a storage error that says its outcome is unknown; none reported `Ok` is
/// missing; the journal reconnects and later appends work.
#[tokio::test]
async fn appends_survive_killed_connections_and_none_is_reported_stored_wrongly() {
    let name = unique("killed");
    let journal = journal_named(
        &name,
        options().reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100)),
    )
    .await;
    let streams: Vec<_> = (0..16).map(|s| fresh_id(&format!("killed{s}"))).collect();
    let stop = AtomicBool::new(false);
    let admin = admin().await;
    let killer = async {
        let mut killed = 0;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            killed += postgres_support::terminate(&admin, &name).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        killed
    };
    let (seen, killed) = futures_util::future::join(
        postgres_support::run_appenders(&journal, &streams, &stop),
        killer,
    )
    .await;
    assert!(killed >= 3, "only {killed} sessions were killed");
    let errors: Vec<&String> = seen.iter().flat_map(|s| &s.errors).collect();
    assert!(
        !errors.is_empty(),
        "no append was in flight at a kill: the test proved nothing"
    );
    for message in &errors {
        assert!(
            message.contains("may or may not be stored") || message.contains("not stored"),
            "{message}"
        );
    }
    let committed_unacknowledged =
        postgres_support::check_appended(&journal, &streams, &seen).await;
    // Each appender went on after the last kill.
    for (s, seen) in seen.iter().enumerate() {
        assert!(
            seen.acked.last() > seen.failed.last(),
            "stream {s}: no append succeeded after its last failure: {seen:?}"
        );
    }
    let stats = journal.stats();
    assert!(stats.reconnects >= 3, "{stats:?}");
    println!(
        "{killed} sessions killed, {} appends failed ({committed_unacknowledged} of them \
         committed nevertheless), {} appends acknowledged, {} reconnects; the first error: {}",
        errors.len(),
        seen.iter().map(|s| s.acked.len()).sum::<usize>(),
        stats.reconnects,
        errors[0]
    );
}

/// Cuts the journal's connection five times right after the server committed a group and
/// before the journal heard so (a TCP proxy drops the commit's answer), while 16 appenders
/// run: each cut group is stored, and its appends must be reported as "may or may not be
/// stored", never as not stored; nothing reported `Ok` is missing; the journal reconnects.
#[tokio::test]
async fn connections_cut_mid_commit_are_reported_as_unknown_outcomes() {
    const CUTS: u64 = 5;
    let proxy = postgres_support::proxy::CommitCutter::start().await;
    let journal = PostgresJournal::connect_with(
        &proxy.url(&unique("cut")),
        options()
            .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let streams: Vec<_> = (0..16).map(|s| fresh_id(&format!("cut{s}"))).collect();
    let stop = AtomicBool::new(false);
    proxy.arm(CUTS, 3);
    let cutter = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while proxy.cuts() < CUTS && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A few more commits after the last cut.
        let seen = proxy.commits_seen();
        while proxy.commits_seen() < seen + 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::Relaxed);
    };
    let (seen, ()) = futures_util::future::join(
        postgres_support::run_appenders(&journal, &streams, &stop),
        cutter,
    )
    .await;
    assert_eq!(proxy.cuts(), CUTS, "the proxy cut fewer commits than asked");
    let errors: Vec<&String> = seen.iter().flat_map(|s| &s.errors).collect();
    let committed_unacknowledged =
        postgres_support::check_appended(&journal, &streams, &seen).await;
    assert!(
        committed_unacknowledged >= CUTS as usize,
        "{CUTS} committed groups were cut from their answers, yet only \
         {committed_unacknowledged} failed batches are stored: the cuts missed the window"
    );
    for message in &errors {
        assert!(message.contains("may or may not be stored"), "{message}");
    }
    let stats = journal.stats();
    assert!(stats.reconnects >= CUTS, "{stats:?}");
    println!(
        "{} commits seen, {CUTS} cut after committing, {} appends failed ({committed_unacknowledged} \
         of them stored), {} acknowledged, {} connections; the first error: {}",
        proxy.commits_seen(),
        errors.len(),
        seen.iter().map(|s| s.acked.len()).sum::<usize>(),
        proxy.connections(),
        errors[0]
    );
    journal.close().await;
}

/// TLS to the server (feature `tls`), against the server `.ci/run` configures with `ssl = on`
/// and a certificate for 127.0.0.1 from a CA it makes: `ACTIX_DELIVERY_POSTGRES_TLS_CA` names
/// that CA's PEM (unset: the test skips). verify-full and require both reach the server over
/// an encrypted connection (the server's `pg_stat_ssl` says so); another CA, or a host name the
/// certificate does not carry, is refused under verify-full.
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_verify_full_and_require_reach_the_server_and_a_wrong_ca_or_name_is_refused() {
    use actix_delivery::journal::PostgresTls;
    let Ok(ca) = std::env::var("ACTIX_DELIVERY_POSTGRES_TLS_CA") else {
        eprintln!("skipped: ACTIX_DELIVERY_POSTGRES_TLS_CA is not set (see .ci/run)");
        return;
    };
    let ca = std::fs::read(ca).expect("the CA's PEM");
    let admin = admin().await;
    // A schema of its own: what the connection carries, not the tables, is under test.
    let options = || options().schema("actix_delivery_tls_test_v3");
    for (mode, tls) in [
        ("verify_full", PostgresTls::verify_full(&ca).unwrap()),
        ("require", PostgresTls::require()),
    ] {
        let name = unique(&format!("tls_{mode}"));
        let journal = journal_named(&name, options().tls(tls)).await;
        let id = fresh_id("tls");
        journal.append(&id, 1, one(1)).await.unwrap();
        assert_eq!(journal.highest_seq(&id).await.unwrap(), 1);
        let rows = admin
            .query(
                "SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = $1",
                &[&name],
            )
            .await
            .unwrap();
        assert!(!rows.is_empty(), "{mode}: the journal's connections");
        for row in rows {
            let (ssl, version): (bool, Option<String>) = (row.get(0), row.get(1));
            assert!(ssl, "{mode}: a connection without TLS");
            assert_eq!(version.as_deref(), Some("TLSv1.3"), "{mode}");
        }
    }
    // A CA that did not sign the server's certificate.
    let other = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other = params.self_signed(&other).unwrap().pem();
    let refused = PostgresJournal::connect_with(
        &postgres_support::url(),
        options()
            .tls(PostgresTls::verify_full(other).unwrap())
            .build()
            .unwrap(),
    )
    .await
    .expect_err("another CA is refused");
    assert!(refused.to_string().contains("certificate"), "{refused}");
    // The right CA, another name: the certificate names 127.0.0.1 only.
    let url = postgres_support::url();
    if let Some(rest) = url.strip_prefix("host=127.0.0.1 ") {
        let by_name = format!("host=localhost hostaddr=127.0.0.1 {rest}");
        let refused = PostgresJournal::connect_with(
            &by_name,
            options()
                .tls(PostgresTls::verify_full(&ca).unwrap())
                .build()
                .unwrap(),
        )
        .await
        .expect_err("a name the certificate does not carry is refused");
        assert!(refused.to_string().contains("certificate"), "{refused}");
    }
}
