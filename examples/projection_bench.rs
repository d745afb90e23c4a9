//! What projections cost, printed as the markdown `benches/README.md` quotes.
//!
//! ```text
//! cargo run --release --example projection_bench                      # SQLite only
//! cargo run --release --features postgres --example projection_bench  # and PostgreSQL
//! PROJECTION_BENCH_EVENTS=400000 cargo run --release --example projection_bench
//! ```
//!
//! **Catch-up**: a journal holds N tagged entries (one event each) that a new projection
//! reads from offset 0, in pages of 1 024, and hands to its handler in batches of 256. Timed
//! from the start until the handler has seen every event. Against, in the same run, the
//! plain alternative: a hand-written loop over [`Journal::events_by_tag`] pages that decodes
//! and hands the same events to the same handler. Cases:
//!
//! - SQLite journal, raw entries (the bytes as stored), into an in-memory handler (at least
//!   once, offsets in memory, stored every 10 000 events);
//! - SQLite journal, a persistent entity's entries (decoded as its recovery decodes them),
//!   into an in-memory handler;
//! - SQLite journal into a SQLite read model, exactly once: one upsert per event, and the
//!   offset, in one transaction per batch (`synchronous=FULL`); the plain alternative writes
//!   the same rows and offset in its own transaction per page of 256;
//! - PostgreSQL journal, raw entries, into an in-memory handler (feature `postgres`).
//!
//! **Live lag**: one writer appends a tagged entry every 3 to 7 ms (400 of them) while a
//! projection follows the tag; each entry carries the time its append started, and the
//! handler takes the difference: append (commit included) to handler. The append's own
//! commit latency is given beside it. With notifications (SQLite: the journal's own; for
//! PostgreSQL the writer is a second journal instance, so only `LISTEN/NOTIFY` can wake the
//! reader) and with polling only (every 100 ms).
//!
//! Each catch-up case gets a warm-up run (not counted), then 3 runs, interleaved with the
//! plain alternative's; the table gives the median (and the spread).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, Offset, PersistenceId, SqliteJournal, StoredEvent, Tag, TagQuery, TaggedEvent,
};
use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
use actix_delivery::projection::{
    EntityEvents, Envelope, EventDecoder, MemoryOffsetStore, Projection, ProjectionHandle,
    ProjectionOptions, RawEvents, SqliteReadModel,
};
use futures_util::future::join_all;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[path = "support/report_header.rs"]
mod report_header;
#[path = "support/thousands.rs"]
mod thousands;

use thousands::thousands;

const RUNS: usize = 3;
const STREAMS: usize = 100;
const PAGE: usize = 1024;
const BATCH: usize = 256;
const LAG_SAMPLES: usize = 400;

/// The benchmark's entity: one event per command.
#[derive(Default, Serialize, Deserialize)]
struct Account {
    balance: i64,
}

#[derive(Serialize, Deserialize)]
struct Deposited(i64);

impl EventSourced for Account {
    type Command = i64;
    type Event = Deposited;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Deposited(amount)], ()))
    }

    fn apply(&mut self, Deposited(amount): &Deposited) {
        self.balance += amount;
    }

    fn tags(_: &Deposited) -> Vec<Tag> {
        vec![Tag::from_static("account")]
    }
}

fn raw_tag() -> Tag {
    Tag::from_static("raw")
}

/// Appends `events` raw tagged entries of 40 bytes over [`STREAMS`] streams, 1 000 per append.
async fn fill_raw(journal: &dyn Journal, events: usize) {
    let per_stream = events / STREAMS;
    join_all((0..STREAMS).map(|stream| async move {
        let id = PersistenceId::new(format!("raw-{stream}")).unwrap();
        let mut next = 1;
        while next <= per_stream as u64 {
            let count = (per_stream as u64 + 1 - next).min(1000);
            let payloads = (0..count).map(|i| vec![(i % 251) as u8; 40]).collect();
            let tags = vec![vec![raw_tag()]; count as usize];
            journal
                .append_tagged(&id, next, payloads, Manifest::raw(), tags)
                .await
                .unwrap();
            next += count;
        }
    }))
    .await;
}

/// Runs `events` commands over [`STREAMS`] accounts (asks queued at once, so that each
/// account stores many per append).
async fn fill_entities(journal: &Arc<dyn Journal>, events: usize) {
    let accounts: Vec<PersistentHandle<Account>> = (0..STREAMS)
        .map(|n| {
            let id = PersistenceId::new(format!("account-{n}")).unwrap();
            PersistentHandle::start(PersistentOptions::new(journal.clone(), id)).unwrap()
        })
        .collect();
    for chunk in (0..events).collect::<Vec<_>>().chunks(20_000) {
        let asks = chunk
            .iter()
            .map(|&k| accounts[k % STREAMS].ask(k as i64 % 100));
        for reply in join_all(asks).await {
            reply.unwrap();
        }
    }
    for account in &accounts {
        account.stop();
        account.stopped().await.expect("stopped on request");
    }
}

/// A handler's work on an event: something the optimiser cannot drop.
fn touch<Ev: Weigh>(events: &[Envelope<Ev>], sum: &AtomicU64) {
    let weight: u64 = events.iter().map(|e| e.event.weigh()).sum();
    sum.fetch_add(weight, Ordering::Relaxed);
}

/// A number out of an event, for [`touch`].
trait Weigh {
    fn weigh(&self) -> u64;
}

impl Weigh for StoredEvent {
    fn weigh(&self) -> u64 {
        self.payload.len() as u64
    }
}

impl Weigh for Deposited {
    fn weigh(&self) -> u64 {
        self.0 as u64
    }
}

fn options(name: &str, tag: Tag) -> ProjectionOptions {
    ProjectionOptions::builder(name, tag)
        .batch_size(BATCH)
        .fetch_size(PAGE)
        .commit_every(10_000)
        .build()
        .unwrap()
}

/// Waits until `projection` has handled `events`; the time since `start`.
async fn until_handled(projection: &ProjectionHandle, events: u64, start: Instant) -> Duration {
    while projection.stats().events < events {
        actix::clock::sleep(Duration::from_micros(500)).await;
    }
    let took = start.elapsed();
    projection.stop();
    projection.stopped().await.unwrap();
    took
}

/// The runner: a new projection (a new name: from offset 0) into an in-memory handler.
async fn runner_into_memory<D: EventDecoder>(projection: Projection<D>, events: usize) -> Duration
where
    D::Event: Weigh,
{
    let sum = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handle = projection.at_least_once(MemoryOffsetStore::new(), {
        let sum = sum.clone();
        move |batch| {
            touch(batch, &sum);
            Box::pin(async { Ok(()) })
        }
    });
    until_handled(&handle, events as u64, start).await
}

/// The events of a page of tagged entries, decoded by `decoder`, in envelopes.
fn envelopes<D: EventDecoder>(decoder: &D, page: Vec<TaggedEvent>) -> Vec<Envelope<D::Event>> {
    let mut events = Vec::with_capacity(page.len());
    for tagged in page {
        let stored = tagged.event.expect("not deleted");
        for event in decoder.decode(stored).unwrap() {
            events.push(Envelope {
                offset: tagged.offset,
                persistence_id: tagged.persistence_id.clone(),
                seq: tagged.seq,
                written_at: tagged.written_at,
                event,
            });
        }
    }
    events
}

/// The plain alternative: pages of `events_by_tag`, decoded, to the same handler.
async fn plain_into_memory<D: EventDecoder>(
    journal: &dyn Journal,
    tag: Tag,
    decoder: D,
    events: usize,
) -> Duration
where
    D::Event: Weigh,
{
    let (sum, query) = (AtomicU64::new(0), TagQuery::new(tag));
    let start = Instant::now();
    let (mut after, mut seen) = (Offset::START, 0);
    while seen < events {
        let page = journal.events_by_tag(&query, after, PAGE).await.unwrap();
        after = page.last().map_or(after, |last| last.offset);
        let batch = envelopes(&decoder, page);
        for chunk in batch.chunks(BATCH) {
            touch(chunk, &sum);
        }
        seen += batch.len();
    }
    start.elapsed()
}

const BALANCES: &str = "CREATE TABLE IF NOT EXISTS balances (
    account TEXT PRIMARY KEY, balance INTEGER NOT NULL)";

fn upsert(
    transaction: &rusqlite::Connection,
    events: &[Envelope<Deposited>],
) -> rusqlite::Result<()> {
    let mut statement = transaction.prepare(
        "INSERT INTO balances (account, balance) VALUES (?1, ?2) \
         ON CONFLICT (account) DO UPDATE SET balance = balance + ?2",
    )?;
    for envelope in events {
        statement.execute(rusqlite::params![
            envelope.persistence_id.as_str(),
            envelope.event.0
        ])?;
    }
    Ok(())
}

/// The runner, exactly once into a new SQLite read model.
async fn runner_into_sqlite(
    journal: &Arc<dyn Journal>,
    path: &std::path::Path,
    events: usize,
) -> Duration {
    let mut model = SqliteReadModel::open(path).await.unwrap();
    model.execute_batch(BALANCES).await.unwrap();
    let options = options("sqlite-model", Tag::from_static("account"));
    let start = Instant::now();
    let handle = Projection::of::<Account>(journal.clone(), options)
        .exactly_once_sqlite(model, |transaction, batch| Ok(upsert(transaction, batch)?));
    until_handled(&handle, events as u64, start).await
}

/// The plain alternative: pages of `events_by_tag`, each batch's rows and the offset in one
/// transaction of a connection of its own.
async fn plain_into_sqlite(
    journal: &dyn Journal,
    path: &std::path::Path,
    events: usize,
) -> Duration {
    let mut connection = rusqlite::Connection::open(path).unwrap();
    connection
        .pragma_update(None, "journal_mode", "WAL")
        .unwrap();
    connection
        .pragma_update(None, "synchronous", "FULL")
        .unwrap();
    connection
        .execute_batch(&format!(
            "{BALANCES}; CREATE TABLE IF NOT EXISTS offsets (name TEXT PRIMARY KEY, offset INTEGER)"
        ))
        .unwrap();
    let (query, decoder) = (
        TagQuery::new(Tag::from_static("account")),
        EntityEvents::<Account>::default(),
    );
    let start = Instant::now();
    let (mut after, mut seen) = (Offset::START, 0);
    while seen < events {
        let page = journal.events_by_tag(&query, after, PAGE).await.unwrap();
        after = page.last().map_or(after, |last| last.offset);
        let batch = envelopes(&decoder, page);
        for chunk in batch.chunks(BATCH) {
            let transaction = connection.transaction().unwrap();
            upsert(&transaction, chunk).unwrap();
            let offset = chunk.last().unwrap().offset.parts().1 as i64;
            transaction
                .execute(
                    "INSERT OR REPLACE INTO offsets (name, offset) VALUES ('plain', ?1)",
                    [offset],
                )
                .unwrap();
            transaction.commit().unwrap();
        }
        seen += batch.len();
    }
    start.elapsed()
}

/// Median and spread of `runs`, as events per second.
fn rate(events: usize, runs: &mut [Duration]) -> (f64, f64, f64) {
    runs.sort();
    let per_second = |d: &Duration| events as f64 / d.as_secs_f64();
    (
        per_second(&runs[runs.len() / 2]),
        per_second(&runs[runs.len() - 1]),
        per_second(&runs[0]),
    )
}

fn row(case: &str, events: usize, runner: &mut [Duration], plain: &mut [Duration]) {
    let (median, low, high) = rate(events, runner);
    let (plain_median, plain_low, plain_high) = rate(events, plain);
    println!(
        "| {case} | {} | **{}** ({}–{}) | {} ({}–{}) | {:.2}× |",
        thousands(events as f64),
        thousands(median),
        thousands(low),
        thousands(high),
        thousands(plain_median),
        thousands(plain_low),
        thousands(plain_high),
        plain_median / median
    );
}

/// Warm-up, then [`RUNS`] runs of each, interleaved.
async fn compare<R, P>(
    mut runner: impl FnMut(usize) -> R,
    mut plain: impl FnMut(usize) -> P,
) -> (Vec<Duration>, Vec<Duration>)
where
    R: std::future::Future<Output = Duration>,
    P: std::future::Future<Output = Duration>,
{
    runner(0).await;
    plain(0).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for run in 1..=RUNS {
        a.push(runner(run).await);
        b.push(plain(run).await);
    }
    (a, b)
}

/// Lag samples (append start → handler) and commit latencies (append start → Ok).
async fn live_lag(
    writer: Arc<dyn Journal>,
    reader: Arc<dyn Journal>,
    notifications: bool,
    name: &str,
) -> (Vec<Duration>, Vec<Duration>) {
    let epoch = Instant::now();
    let lags = Arc::new(Mutex::new(Vec::new()));
    let tag = Tag::new(format!("lag-{name}")).unwrap();
    let options = ProjectionOptions::builder(name, tag.clone())
        .notifications(notifications)
        .poll_interval(Duration::from_millis(100))
        .max_poll_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let handle = Projection::raw(reader, options).at_least_once(MemoryOffsetStore::new(), {
        let lags = lags.clone();
        move |batch| {
            let now = epoch.elapsed();
            let mut lags = lags.lock().unwrap();
            for envelope in batch {
                let sent = u64::from_le_bytes(envelope.event.payload[..8].try_into().unwrap());
                lags.push(now.saturating_sub(Duration::from_nanos(sent)));
            }
            Box::pin(async { Ok(()) })
        }
    });
    actix::clock::sleep(Duration::from_millis(300)).await; // idle: at the tail
    let id = PersistenceId::new(format!("lag-{name}-{}", std::process::id())).unwrap();
    let mut next = writer.highest_seq(&id).await.unwrap() + 1;
    let mut commits = Vec::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    for _ in 0..LAG_SAMPLES {
        let sent = epoch.elapsed();
        let payload = (sent.as_nanos() as u64).to_le_bytes().to_vec();
        writer
            .append_tagged(
                &id,
                next,
                vec![payload],
                Manifest::raw(),
                vec![vec![tag.clone()]],
            )
            .await
            .unwrap();
        commits.push(epoch.elapsed() - sent);
        next += 1;
        actix::clock::sleep(Duration::from_millis(rng.random_range(3..=7))).await;
    }
    until_handled(&handle, LAG_SAMPLES as u64, Instant::now()).await;
    let lags = lags.lock().unwrap().clone();
    (lags, commits)
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

fn lag_row(case: &str, (mut lags, mut commits): (Vec<Duration>, Vec<Duration>)) {
    println!(
        "| {case} | {} | **{:.1}** | {:.1} | {:.1} |",
        lags.len(),
        percentile(&mut lags, 0.5),
        percentile(&mut lags, 0.99),
        percentile(&mut commits, 0.5)
    );
}

fn main() {
    let events: usize =
        std::env::var("PROJECTION_BENCH_EVENTS").map_or(200_000, |n| n.parse().unwrap());
    report_header::print("actix-delivery projection benchmark");
    let system = actix::System::new();
    system.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let journal: Arc<dyn Journal> =
            Arc::new(SqliteJournal::open(dir.path().join("journal.db")).await.unwrap());
        fill_raw(&*journal, events).await;
        let entity_events = events / 4;
        fill_entities(&journal, entity_events).await;

        println!("\n## Catch-up from offset 0 (events per second)\n");
        println!("| case | events | projection runner | plain loop over `events_by_tag` | plain ÷ runner |");
        println!("|---|---:|---:|---:|---:|");
        let name = Rc::new(Cell::new(0));
        let next_name = |prefix: &str| {
            name.set(name.get() + 1);
            format!("{prefix}-{}", name.get())
        };
        let (mut a, mut b) = compare(
            |_| runner_into_memory(Projection::raw(journal.clone(), options(&next_name("raw"), raw_tag())), events),
            |_| plain_into_memory(&*journal, raw_tag(), RawEvents, events),
        )
        .await;
        row("SQLite, raw entries → memory", events, &mut a, &mut b);
        let (mut a, mut b) = compare(
            |_| {
                let options = options(&next_name("entity"), Tag::from_static("account"));
                runner_into_memory(Projection::of::<Account>(journal.clone(), options), entity_events)
            },
            |_| plain_into_memory(&*journal, Tag::from_static("account"), EntityEvents::<Account>::default(), entity_events),
        )
        .await;
        row("SQLite, entity entries → memory", entity_events, &mut a, &mut b);
        let (mut a, mut b) = compare(
            |run| {
                let path = dir.path().join(format!("runner-model-{run}.db"));
                let journal = journal.clone();
                async move { runner_into_sqlite(&journal, &path, entity_events).await }
            },
            |run| {
                let path = dir.path().join(format!("plain-model-{run}.db"));
                let journal = journal.clone();
                async move { plain_into_sqlite(&*journal, &path, entity_events).await }
            },
        )
        .await;
        row("SQLite → SQLite read model, exactly once", entity_events, &mut a, &mut b);
        #[cfg(feature = "postgres")]
        let postgres = postgres::Bench::new(events / 2).await;
        #[cfg(feature = "postgres")]
        {
            let pg = postgres.journal();
            let (mut a, mut b) = compare(
                |_| runner_into_memory(Projection::raw(pg.clone(), options(&next_name("pg"), raw_tag())), postgres.events),
                |_| plain_into_memory(&*pg, raw_tag(), RawEvents, postgres.events),
            )
            .await;
            row("PostgreSQL, raw entries → memory", postgres.events, &mut a, &mut b);
        }
        #[cfg(not(feature = "postgres"))]
        println!("| PostgreSQL | – | (build with `--features postgres`) | | |");

        println!("\n## Live lag: append (commit included) → handler, ms\n");
        println!("| case | entries | p50 | p99 | the append's commit, p50 |");
        println!("|---|---:|---:|---:|---:|");
        lag_row("SQLite, notified", live_lag(journal.clone(), journal.clone(), true, "sqlite-notified").await);
        lag_row("SQLite, polling every 100 ms", live_lag(journal.clone(), journal.clone(), false, "sqlite-polled").await);
        #[cfg(feature = "postgres")]
        {
            let writer = postgres.second_journal().await;
            lag_row("PostgreSQL, `LISTEN/NOTIFY` (writer: another journal)", live_lag(writer.clone(), postgres.journal(), true, "pg-notified").await);
            lag_row("PostgreSQL, polling every 100 ms", live_lag(writer, postgres.journal(), false, "pg-polled").await);
            postgres.drop_schema().await;
        }
    });
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The PostgreSQL journal of the benchmark: a schema of its own, dropped at the end.

    use std::sync::Arc;

    use actix_delivery::journal::{Journal, PostgresJournal, PostgresOptions};

    pub struct Bench {
        pub events: usize,
        schema: String,
        journal: Arc<PostgresJournal>,
    }

    fn url() -> String {
        std::env::var("ACTIX_DELIVERY_POSTGRES")
            .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into())
    }

    impl Bench {
        pub async fn new(events: usize) -> Self {
            let schema = format!("projection_bench_{}", std::process::id());
            let options = PostgresOptions::builder().schema(&schema).build().unwrap();
            let journal = Arc::new(
                PostgresJournal::connect_with(&url(), options)
                    .await
                    .unwrap(),
            );
            super::fill_raw(&*journal, events).await;
            Self {
                events,
                schema,
                journal,
            }
        }

        pub fn journal(&self) -> Arc<dyn Journal> {
            self.journal.clone()
        }

        pub async fn second_journal(&self) -> Arc<dyn Journal> {
            let options = PostgresOptions::builder()
                .schema(&self.schema)
                .build()
                .unwrap();
            Arc::new(
                PostgresJournal::connect_with(&url(), options)
                    .await
                    .unwrap(),
            )
        }

        pub async fn drop_schema(&self) {
            let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                .await
                .unwrap();
            actix::spawn(async move {
                let _ = connection.await;
            });
            client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await
                .unwrap();
        }
    }
}
