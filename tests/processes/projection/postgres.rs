//! PostgreSQL (feature `postgres`): exactly once into a PostgreSQL read model, in process; and
//! with real processes, two writers committing at once (one of them slowed inside its
//! transactions, so that commits land out of order) while a projection process, killed again
//! and again, follows the tag live. A naive reader ("ordering greater than the last one")
//! reads the same table beside it and shows the skip the offset design avoids.
//!
//! Replay a seed with `PROJECTION_CRASH_SEED=5 cargo test --features postgres --test
//! projection postgres`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{Journal, Offset, PostgresJournal, TagQuery};
use actix_delivery::persistence::PersistentConfig;
use actix_delivery::projection::{
    Envelope, HandlerFuture, PoisonPolicy, PostgresReadModel, Projection, ProjectionError,
    ProjectionHandle,
};
use futures_util::future::join_all;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::{Client, Transaction};

use super::bank::{self, wait_until, Account, AccountEvent};
use super::crash_sqlite;
use crate::{postgres_support, process};

/// The read model's tables in `schema`: balances, and every event applied (no key: a repeat
/// would show).
fn tables(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.balances (
             account TEXT PRIMARY KEY, balance BIGINT NOT NULL, events INT NOT NULL);
         CREATE TABLE IF NOT EXISTS {schema}.applied (
             n BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, seq BIGINT NOT NULL);"
    )
}

/// The handler of the tests' PostgreSQL read models: applies `events` in `transaction`.
fn apply(
    schema: &str,
) -> impl for<'a> FnMut(&'a Transaction<'a>, &'a [Envelope<AccountEvent>]) -> HandlerFuture<'a>
       + 'static
       + use<> {
    let upsert = format!(
        "INSERT INTO {schema}.balances (account, balance, events) VALUES ($1, $2, 1) \
         ON CONFLICT (account) DO UPDATE SET balance = {schema}.balances.balance + $2, \
         events = {schema}.balances.events + 1"
    );
    let insert = format!("INSERT INTO {schema}.applied (account, seq) VALUES ($1, $2)");
    move |transaction, events| {
        let (upsert, insert) = (upsert.clone(), insert.clone());
        Box::pin(async move {
            for envelope in events {
                let delta = match envelope.event {
                    AccountEvent::Deposited(n) => n,
                    AccountEvent::Withdrew(n) => -n,
                };
                let account = envelope.persistence_id.as_str();
                transaction.execute(&upsert, &[&account, &delta]).await?;
                let seq = envelope.seq as i64;
                transaction.execute(&insert, &[&account, &seq]).await?;
            }
            Ok(())
        })
    }
}

/// The read model's balances, and its applied (account, seq) in order.
async fn read(admin: &Client, schema: &str) -> (BTreeMap<String, Account>, Vec<(String, u64)>) {
    let rows = admin
        .query(
            &format!("SELECT account, balance, events FROM {schema}.balances"),
            &[],
        )
        .await
        .unwrap();
    let balances = rows
        .iter()
        .map(|row| {
            let events: i32 = row.get(2);
            (
                row.get(0),
                Account {
                    balance: row.get(1),
                    events: events as u32,
                },
            )
        })
        .collect();
    let rows = admin
        .query(
            &format!("SELECT account, seq FROM {schema}.applied ORDER BY n"),
            &[],
        )
        .await
        .unwrap();
    let applied = rows
        .iter()
        .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
        .collect();
    (balances, applied)
}

/// Asserts each (account, seq) once, each account's in seq order.
fn assert_once(applied: &[(String, u64)], context: &str) {
    bank::assert_once_in_order(applied.iter().map(|(a, seq)| (a.as_str(), *seq)), context);
}

async fn journal(schema: &str, application_name: &str) -> PostgresJournal {
    let options = actix_delivery::journal::PostgresOptions::builder().schema(schema);
    postgres_support::journal_named(application_name, options).await
}

async fn read_model(schema: &str) -> PostgresReadModel {
    let model = PostgresReadModel::connect(&postgres_support::url(), schema)
        .await
        .unwrap();
    model.client().batch_execute(&tables(schema)).await.unwrap();
    model
}

#[actix::test]
async fn exactly_once_into_postgres_keeps_rows_and_offset_together_across_failed_batches() {
    let (schema, journal, admin) = bank_in(3, 40).await;
    let (calls, mut rows) = (AtomicU32::new(0), apply(&schema));
    let options = bank::options("balances").batch_size(8).build().unwrap();
    let projection = start(
        &journal,
        options,
        read_model(&schema).await,
        move |transaction, events| {
            // Every other call fails after writing its rows: they must be rolled back.
            let fail = calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
            let applying = rows(transaction, events);
            Box::pin(async move {
                applying.await?;
                if fail {
                    return Err("after the rows, before the commit".into());
                }
                Ok(())
            })
        },
    );
    wait_until("40", Duration::from_secs(30), || {
        projection.stats().events == 40
    })
    .await;
    assert!(projection.stats().retries >= 5, "{:?}", projection.stats());
    let (balances, applied) = read(&admin, &schema).await;
    assert_eq!(
        applied.len(),
        40,
        "each event once, none of a failed attempt"
    );
    assert_once(&applied, "in process");
    assert_eq!(balances, bank::fold(&*journal, "", 3).await);
    projection.stop();
    projection.stopped().await.unwrap();
    drop_schema(&admin, &schema).await;
}

fn start<F>(
    journal: &Arc<dyn Journal>,
    options: actix_delivery::projection::ProjectionOptions,
    model: PostgresReadModel,
    handler: F,
) -> ProjectionHandle
where
    F: for<'a> FnMut(&'a Transaction<'a>, &'a [Envelope<AccountEvent>]) -> HandlerFuture<'a>
        + 'static,
{
    Projection::of::<Account>(journal.clone(), options).exactly_once_postgres(model, handler)
}

/// Starts the accounts' events of a fresh schema: the schema, the journal with `events`
/// commands of `accounts` accounts in it, and the admin connection.
async fn bank_in(accounts: usize, events: u64) -> (String, Arc<dyn Journal>, Client) {
    let schema = postgres_support::unique("projection");
    let journal: Arc<dyn Journal> = Arc::new(journal(&schema, "projection-test").await);
    let handles = bank::open(&journal, "", accounts, &PersistentConfig::default());
    bank::run(&handles, 0..events).await;
    (schema, journal, postgres_support::admin().await)
}

async fn drop_schema(admin: &Client, schema: &str) {
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[actix::test]
async fn a_handler_that_swallows_a_failed_statement_is_blamed_not_retried_forever() {
    let (schema, journal, admin) = bank_in(2, 6).await;
    let options = bank::options("balances").max_retries(1).build().unwrap();
    let projection = start(
        &journal,
        options,
        read_model(&schema).await,
        |transaction, _| {
            Box::pin(async move {
                // Fails, and aborts the transaction; the handler goes on as if not.
                let _ = transaction.execute("SELECT 1 / 0", &[]).await;
                Ok(())
            })
        },
    );
    let error = tokio::time::timeout(Duration::from_secs(20), projection.stopped())
        .await
        .expect("the poison policy stops it")
        .unwrap_err()
        .to_string();
    assert!(error.contains("a statement had failed"), "{error}");
    drop_schema(&admin, &schema).await;
}

/// The server's message, with its detail, and its SQLSTATE reach the errors of the read model,
/// not tokio-postgres's "db error": a handler's statement that a CHECK constraint refuses stops
/// the projection with them, and a refused connection says why.
#[actix::test]
async fn the_read_models_errors_name_the_servers_message_and_sqlstate() {
    let (schema, journal, admin) = bank_in(2, 4).await;
    let model = read_model(&schema).await;
    admin
        .batch_execute(&format!(
            "ALTER TABLE {schema}.balances ADD CONSTRAINT no_rows CHECK (events < 0)"
        ))
        .await
        .unwrap();
    let options = bank::options("balances").max_retries(1).build().unwrap();
    let projection = start(&journal, options, model, apply(&schema));
    let error = tokio::time::timeout(Duration::from_secs(20), projection.stopped())
        .await
        .expect("the poison policy stops it")
        .unwrap_err()
        .to_string();
    for expected in [
        "ERROR: new row for relation \"balances\" violates check constraint \"no_rows\"",
        "(SQLSTATE 23514)",
        "DETAIL: Failing row contains (",
    ] {
        assert!(error.contains(expected), "{expected:?} in {error}");
    }
    // Port 1 on loopback: nothing listens there.
    let refused =
        PostgresReadModel::connect("host=127.0.0.1 port=1 user=postgres dbname=test", &schema)
            .await
            .unwrap_err()
            .to_string();
    assert!(
        refused.contains("Connection refused (os error 111)"),
        "{refused}"
    );
    drop_schema(&admin, &schema).await;
}

#[actix::test]
async fn a_batch_the_database_does_not_answer_in_time_is_abandoned_and_done_again() {
    let (schema, journal, admin) = bank_in(2, 10).await;
    let model = read_model(&schema)
        .await
        .with_timeout(Duration::from_millis(500))
        .unwrap();
    let (hung, mut rows) = (AtomicBool::new(false), apply(&schema));
    let projection = start(
        &journal,
        bank::options("balances").build().unwrap(),
        model,
        move |transaction, events| {
            let hang = !hung.swap(true, Ordering::Relaxed);
            let applying = rows(transaction, events);
            Box::pin(async move {
                applying.await?;
                if hang {
                    // As a server that stopped answering: far longer than the timeout.
                    transaction.execute("SELECT pg_sleep(60)", &[]).await?;
                }
                Ok(())
            })
        },
    );
    wait_until("10", Duration::from_secs(20), || {
        projection.stats().events == 10
    })
    .await;
    assert!(
        projection.stats().store_failures >= 1,
        "{:?}",
        projection.stats()
    );
    let (_, applied) = read(&admin, &schema).await;
    assert_eq!(applied.len(), 10);
    assert_once(&applied, "after a timeout");
    projection.stop();
    projection.stopped().await.unwrap();
    drop_schema(&admin, &schema).await;
}

#[actix::test]
async fn two_instances_of_one_projection_on_postgres_apply_each_event_once() {
    let (schema, journal, admin) = bank_in(5, 300).await;
    let options = || bank::options("balances").batch_size(4).build().unwrap();
    let instances = [
        start(
            &journal,
            options(),
            read_model(&schema).await,
            apply(&schema),
        ),
        start(
            &journal,
            options(),
            read_model(&schema).await,
            apply(&schema),
        ),
    ];
    wait_until("300 between them", Duration::from_secs(30), || {
        instances.iter().map(|p| p.stats().events).sum::<u64>() >= 300
    })
    .await;
    for instance in &instances {
        instance.stop();
        instance.stopped().await.unwrap();
    }
    let (balances, applied) = read(&admin, &schema).await;
    assert_eq!(applied.len(), 300, "each event once");
    assert_once(&applied, "two instances");
    assert_eq!(balances, bank::fold(&*journal, "", 5).await);
    let conflicts: u64 = instances.iter().map(|p| p.stats().conflicts).sum();
    assert!(conflicts > 0, "the instances raced for the offset");
    drop_schema(&admin, &schema).await;
}

#[actix::test]
async fn on_postgres_a_missing_table_is_retried_and_a_change_of_slices_refused() {
    let (schema, journal, admin) = bank_in(3, 12).await;
    let model = PostgresReadModel::connect(&postgres_support::url(), &schema)
        .await
        .unwrap();
    let options = bank::options("balances")
        .max_retries(0)
        .poison(PoisonPolicy::Skip)
        .build()
        .unwrap();
    // The tables come only later: the read model's fault, not the events'.
    let whole = start(&journal, options, model, apply(&schema));
    wait_until(
        "failing on the missing tables",
        Duration::from_secs(20),
        || whole.stats().store_failures >= 2,
    )
    .await;
    admin.batch_execute(&tables(&schema)).await.unwrap();
    wait_until("12", Duration::from_secs(20), || whole.stats().events == 12).await;
    assert_eq!(whole.stats().skipped, 0, "no event blamed");
    whole.stop();
    whole.stopped().await.unwrap();
    let before = read(&admin, &schema).await;
    assert_eq!(before.1.len(), 12);

    let options = bank::options("balances")
        .slices(actix_delivery::journal::Slices::split(2, 1).unwrap())
        .build()
        .unwrap();
    let half = start(&journal, options, read_model(&schema).await, apply(&schema));
    let error = tokio::time::timeout(Duration::from_secs(20), half.stopped())
        .await
        .expect("refused at once")
        .unwrap_err();
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    assert_eq!(read(&admin, &schema).await, before, "nothing handled again");
    drop_schema(&admin, &schema).await;
}

/// The offset of the last entry of the accounts' tag in `journal`.
async fn last_offset(journal: &dyn Journal) -> Offset {
    let entries = journal
        .events_by_tag(&TagQuery::new(bank::account_tag()), Offset::START, 1000)
        .await
        .unwrap();
    entries.last().expect("tagged entries").offset
}

/// The server's next transaction id: what every transaction on it, in any schema, raises.
async fn next_transaction_id(admin: &Client) -> u64 {
    let row = admin
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8",
            &[],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) as u64
}

/// The case of issue 33: a read model whose stored offset came from another journal in the
/// same database (its entries written after this journal's, so at higher transaction ids),
/// left by the previous release (its offsets' table alone, no record of the journal
/// followed, which this release adds on connect). Every
/// entry of this journal is below the offset, while the server's next transaction id, which
/// all activity on the server raises, is above it: the projection is refused at once, not
/// left running with nothing to do.
#[actix::test]
async fn a_read_model_offset_from_another_journal_in_the_database_is_refused_not_left_idle() {
    let (schema, journal, admin) = bank_in(2, 6).await;
    let other_schema = postgres_support::unique("projection_other");
    let other: Arc<dyn Journal> = Arc::new(self::journal(&other_schema, "projection-test").await);
    let accounts = bank::open(&other, "other-", 2, &PersistentConfig::default());
    bank::run(&accounts, 0..6).await;
    let stored = last_offset(&*other).await;
    let own = last_offset(&*journal).await;
    assert!(
        own < stored,
        "this journal's entries ({own}) are below {stored}"
    );
    assert!(
        Offset::from_parts(next_transaction_id(&admin).await, 0) > stored,
        "the server has gone past {stored}"
    );

    // The read model as the previous release left it: its offsets' table alone.
    drop(read_model(&schema).await);
    admin
        .batch_execute(&format!("DROP TABLE {schema}.projection_journal"))
        .await
        .unwrap();
    let (transaction, position) = (stored.parts().0 as i64, stored.parts().1 as i64);
    admin
        .execute(
            &format!(
                "INSERT INTO {schema}.projection_offset (projection, first_slice, last_slice, \
                 offset_transaction, offset_position) VALUES ('balances', 0, 1023, $1, $2)"
            ),
            &[&transaction, &position],
        )
        .await
        .unwrap();
    let model = read_model(&schema).await;
    let projection = start(
        &journal,
        bank::options("balances").build().unwrap(),
        model,
        apply(&schema),
    );
    let error = tokio::time::timeout(Duration::from_secs(20), projection.stopped())
        .await
        .unwrap_or_else(|_| panic!("not refused: {:?}", projection.stats()))
        .unwrap_err();
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("stored offset {stored}")),
        "{message}"
    );
    assert!(message.contains(&format!("up to {own}")), "{message}");
    assert_eq!(projection.stats().events, 0);
    assert!(read(&admin, &schema).await.1.is_empty());
    let recorded = admin
        .query(&format!("SELECT 1 FROM {schema}.projection_journal"), &[])
        .await
        .unwrap();
    assert!(recorded.is_empty(), "a refused start records no journal");
    drop_schema(&admin, &schema).await;
    drop_schema(&admin, &other_schema).await;
}

/// A read model that followed one journal, pointed at another journal in the same database
/// whose entries were written before and after the first one's (so its offset is within
/// them, and no ceiling tells): refused at once, nothing handled, where it would have
/// skipped the entries below its offset and handled the rest.
#[actix::test]
async fn a_read_model_that_followed_one_journal_refuses_another_in_the_same_database() {
    let (schema, journal, admin) = bank_in(2, 6).await;
    let followed_schema = postgres_support::unique("projection_followed");
    let followed: Arc<dyn Journal> =
        Arc::new(self::journal(&followed_schema, "projection-test").await);
    let accounts = bank::open(&followed, "followed-", 2, &PersistentConfig::default());
    bank::run(&accounts, 0..6).await;
    let own = bank::open(&journal, "", 2, &PersistentConfig::default());
    bank::run(&own, 6..12).await;
    let first = start(
        &followed,
        bank::options("balances").build().unwrap(),
        read_model(&schema).await,
        apply(&schema),
    );
    wait_until("6", Duration::from_secs(20), || first.stats().events == 6).await;
    first.stop();
    first.stopped().await.unwrap();
    let before = read(&admin, &schema).await;
    assert!(first.stats().offset < last_offset(&*journal).await);

    let projection = start(
        &journal,
        bank::options("balances").build().unwrap(),
        read_model(&schema).await,
        apply(&schema),
    );
    let error = tokio::time::timeout(Duration::from_secs(20), projection.stopped())
        .await
        .unwrap_or_else(|_| panic!("not refused: {:?}", projection.stats()))
        .unwrap_err();
    assert!(matches!(error, ProjectionError::Refused { .. }), "{error}");
    let (followed, own) = (
        followed.journal_id().unwrap(),
        journal.journal_id().unwrap(),
    );
    assert_ne!(followed, own);
    assert!(
        error
            .to_string()
            .contains(&format!("follows journal {followed}, not this one ({own})")),
        "{error}"
    );
    assert_eq!(projection.stats().events, 0);
    assert_eq!(read(&admin, &schema).await, before, "nothing handled");
    drop_schema(&admin, &schema).await;
    drop_schema(&admin, &followed_schema).await;
}

// --- two writer processes, a projection process killed again and again ------------------

/// The children (they do nothing unless [`CHILD_SCHEMA`] is set).
const WRITER: &str = concat!(module_path!(), "::writer_process_entry");
const PROJECTOR: &str = concat!(module_path!(), "::projection_process_entry");
/// Set for the children: the schema of the journal and the read model.
const CHILD_SCHEMA: &str = "PROJECTION_PG_SCHEMA";
/// Set for a writer: its number (its accounts are `w<n>-account-<k>`).
const CHILD_WRITER: &str = "PROJECTION_PG_WRITER";
/// Set for the projection: SIGKILL itself inside this handler call (counted from 1).
const CHILD_KILL_AT: &str = "PROJECTION_PG_KILL_AT";
const ACCOUNTS: usize = 3;
/// The application name of the writer slowed inside its transactions.
const SLOW: &str = "projection-slow-writer";

/// A writer: its accounts write until its stdin closes, then it prints `done`.
#[test]
fn writer_process_entry() {
    let (Ok(schema), Ok(writer)) = (std::env::var(CHILD_SCHEMA), std::env::var(CHILD_WRITER))
    else {
        return;
    };
    let name = if writer == "0" {
        SLOW.to_owned()
    } else {
        format!("projection-writer-{writer}")
    };
    actix::System::new().block_on(async move {
        let journal: Arc<dyn Journal> = Arc::new(journal(&schema, &name).await);
        let prefix = format!("w{writer}-");
        let accounts = bank::open(&journal, &prefix, ACCOUNTS, &PersistentConfig::default());
        let closed = Arc::new(AtomicBool::new(false));
        std::thread::spawn({
            let closed = closed.clone();
            move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
                closed.store(true, Ordering::Relaxed);
            }
        });
        println!("ready");
        join_all(accounts.iter().enumerate().map(|(n, account)| {
            let closed = closed.clone();
            async move {
                let mut k = 0;
                while !closed.load(Ordering::Relaxed) {
                    account
                        .ask(bank::amount(k * ACCOUNTS as u64 + n as u64))
                        .await
                        .unwrap();
                    k += 1;
                }
            }
        }))
        .await;
        println!("done");
    });
}

/// The projection: follows the tag into the read model until killed; prints `begin
/// <position>` as each batch begins.
#[test]
fn projection_process_entry() {
    let Ok(schema) = std::env::var(CHILD_SCHEMA) else {
        return;
    };
    if std::env::var(CHILD_WRITER).is_ok() {
        return;
    }
    let kill_at: Option<u32> = std::env::var(CHILD_KILL_AT)
        .ok()
        .map(|n| n.parse().unwrap());
    actix::System::new().block_on(async move {
        let journal: Arc<dyn Journal> = Arc::new(journal(&schema, "projection-reader").await);
        let (mut rows, mut calls) = (apply(&schema), 0);
        let options = bank::options("balances").batch_size(20).build().unwrap();
        let model = read_model(&schema).await;
        let _runs_until_killed = start(&journal, options, model, move |transaction, events| {
            calls += 1;
            if let Some(last) = events.last() {
                println!("begin {}", last.offset.parts().1);
            }
            let applying = rows(transaction, events);
            let kill = kill_at == Some(calls);
            Box::pin(async move {
                applying.await?;
                // Inside the transaction: the rows are written, the commit not yet sent.
                if kill {
                    process::sigkill_self();
                }
                Ok(())
            })
        });
        println!("ready");
        std::future::pending::<()>().await;
    });
}

/// Where the tag ends once the writers are done: how many entries it has, and the highest
/// `ordering`.
type End = Arc<std::sync::Mutex<Option<(usize, i64)>>>;

/// A reader that follows the tag at its tail, every 2 ms, until it has read to the `end`, and
/// returns the (account, seq) it saw: with the journal's offsets (`naive` false: until it has
/// as many entries as the tag), or as a naive reader would, `ordering > last` on the sequence
/// column alone (`naive` true: until its `last` is the highest).
fn tail_reader(
    schema: String,
    naive: bool,
    end: End,
) -> std::thread::JoinHandle<Vec<(String, u64)>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let admin = postgres_support::admin().await;
            let journal = journal(&schema, "projection-tail").await;
            let query = TagQuery::new(bank::account_tag());
            let sql = format!(
                "SELECT ordering, persistence_id, seq_nr FROM {schema}.event_tag \
                 WHERE tag = 'account' AND ordering > $1 ORDER BY ordering"
            );
            let (mut last, mut after, mut seen) = (0i64, Offset::START, Vec::new());
            let mut deadline = None;
            loop {
                if naive {
                    for row in admin.query(&sql, &[&last]).await.unwrap() {
                        last = row.get(0);
                        seen.push((row.get(1), row.get::<_, i64>(2) as u64));
                    }
                } else {
                    for event in journal.events_by_tag(&query, after, 1000).await.unwrap() {
                        after = event.offset;
                        seen.push((event.persistence_id.to_string(), event.seq));
                    }
                }
                if let Some((count, highest)) = *end.lock().unwrap() {
                    if (naive && last >= highest) || (!naive && seen.len() >= count) {
                        return seen;
                    }
                    let deadline =
                        *deadline.get_or_insert(Instant::now() + Duration::from_secs(60));
                    assert!(
                        Instant::now() < deadline,
                        "a tail reader did not reach the end"
                    );
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    })
}

#[test]
fn two_writer_processes_and_a_projection_killed_20_times_every_event_exactly_once() {
    let seed: u64 = std::env::var("PROJECTION_CRASH_SEED").map_or(3, |s| s.parse().unwrap());
    let kills: u32 = std::env::var("PROJECTION_CRASH_KILLS").map_or(20, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let schema = postgres_support::unique("projection_crash");
    // The parent's own async work: the admin connection lives on this system's runtime.
    let runtime = actix::System::new();
    let admin = runtime.block_on(async {
        let admin = postgres_support::admin().await;
        journal(&schema, "projection-setup").await.close().await;
        // The slow writer sleeps inside each transaction after its tag rows took their
        // numbers: the other writer's later numbers commit first.
        admin
            .batch_execute(&format!(
                "CREATE FUNCTION {schema}.slow_writer() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF current_setting('application_name') = '{SLOW}' THEN \
                 PERFORM pg_sleep(0.02); END IF; RETURN NULL; END $$; \
                 CREATE TRIGGER slow_writer AFTER INSERT ON {schema}.event_tag \
                 FOR EACH STATEMENT EXECUTE FUNCTION {schema}.slow_writer();"
            ))
            .await
            .unwrap();
        admin
    });
    let end: End = Arc::default();
    let naive = tail_reader(schema.clone(), true, end.clone());
    let tail = tail_reader(schema.clone(), false, end.clone());
    let writers: Vec<process::Child> = (0..2)
        .map(|n| {
            let env = [
                (CHILD_SCHEMA, schema.clone()),
                (CHILD_WRITER, n.to_string()),
            ];
            let writer = process::spawn(WRITER, &env);
            writer.expect_line("ready", Duration::from_secs(30));
            writer
        })
        .collect();
    let mut inside_a_transaction = 0;
    for life in 0..kills {
        let context = format!("seed {seed}, life {life}");
        let kill_at = rng.random_ratio(1, 3).then(|| rng.random_range(1..=15u32));
        let mut env = vec![(CHILD_SCHEMA, schema.clone())];
        if let Some(n) = kill_at {
            env.push((CHILD_KILL_AT, n.to_string()));
        }
        let child = process::spawn(PROJECTOR, &env);
        child
            .wait_for("ready", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{context}: the projection did not start"));
        let life = Duration::from_millis(rng.random_range(20..=200));
        let begun = crash_sqlite::end_life(child, kill_at.is_some(), life, &context);
        let (stored, applied) = runtime.block_on(async {
            let stored: Option<i64> = admin
                .query_opt(
                    &format!("SELECT offset_position FROM {schema}.projection_offset"),
                    &[],
                )
                .await
                .unwrap()
                .map(|row| row.get(0));
            (stored.unwrap_or(0) as u64, read(&admin, &schema).await.1)
        });
        assert_once(&applied, &context);
        if begun.is_some_and(|begun| begun > stored) {
            inside_a_transaction += 1;
        }
    }
    for writer in writers {
        assert!(writer.finish().success(), "seed {seed}: a writer failed");
    }
    // Everything is committed: the tag's rows, counted without the horizon (which a
    // transaction elsewhere on the server may hold back for a while).
    let (total, highest): (i64, i64) = runtime.block_on(async {
        let row = admin
            .query_one(
                &format!(
                    "SELECT count(*), coalesce(max(ordering), 0) FROM {schema}.event_tag \
                     WHERE tag = 'account'"
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    *end.lock().unwrap() = Some((total as usize, highest));
    // A last life runs until the read model holds every event.
    let child = process::spawn(PROJECTOR, &[(CHILD_SCHEMA, schema.clone())]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while runtime.block_on(read(&admin, &schema)).1.len() < total as usize {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the last life did not catch up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill();
    let (naive, tail) = (naive.join().unwrap(), tail.join().unwrap());

    let (balances, applied, tagged) = runtime.block_on(async {
        let (balances, applied) = read(&admin, &schema).await;
        let journal = journal(&schema, "projection-check").await;
        let query = TagQuery::new(bank::account_tag());
        let mut tagged: Vec<(String, u64)> = Vec::new();
        while tagged.len() < total as usize {
            assert!(
                Instant::now() < deadline,
                "seed {seed}: the journal shows every entry"
            );
            tagged = journal
                .events_by_tag(&query, Offset::START, usize::MAX)
                .await
                .unwrap()
                .into_iter()
                .map(|e| (e.persistence_id.to_string(), e.seq))
                .collect();
        }
        tagged.sort();
        let mut folded = BTreeMap::new();
        for writer in 0..2 {
            folded.extend(bank::fold(&journal, &format!("w{writer}-"), ACCOUNTS).await);
        }
        journal.close().await;
        assert_eq!(
            balances, folded,
            "seed {seed}: the read model is the fold of the journal"
        );
        (balances, applied, tagged)
    });
    assert_once(&applied, &format!("seed {seed}, at the end"));
    let mut sorted = applied.clone();
    sorted.sort();
    assert_eq!(sorted, tagged, "seed {seed}: every tagged event, once");
    let mut tail = tail;
    tail.sort();
    assert_eq!(
        tail, tagged,
        "seed {seed}: the journal's offsets at the tail: each once"
    );
    let naive: BTreeSet<(String, u64)> = naive.into_iter().collect();
    let missed = tagged
        .iter()
        .filter(|event| !naive.contains(*event))
        .count();
    println!(
        "seed {seed}: {} events of {} accounts, {kills} kills ({inside_a_transaction} inside a \
         read-model transaction); the naive reader missed {missed}, the journal's none",
        tagged.len(),
        balances.len()
    );
    assert!(
        inside_a_transaction * 4 >= kills,
        "seed {seed}: only {inside_a_transaction} of {kills} kills landed inside a transaction"
    );
    assert!(
        missed > 0,
        "seed {seed}: the writers never committed out of order: the test proved nothing"
    );
    runtime.block_on(drop_schema(&admin, &schema));
}
