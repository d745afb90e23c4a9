//! What persistence costs, measured on the SQLite journal in a temporary directory:
//!
//! 1. one persistent actor, one command in flight at a time (one commit, one fsync each);
//! 2. the same actor with 64 callers, each with one command in flight (batched appends);
//! 3. the effectively-once consumer end to end (producer → consumer → persistent actor),
//!    messages confirmed per second at window 64;
//! 4. the same delivery with a plain in-memory handler;
//! 5. recovering an entity of 1 M events (one per command, 100-byte notes).
//!
//! 1 to 3 and 5 run with each codec: bincode (fixed schema) and MessagePack (self-describing,
//! the default).
//!
//! `cargo run --release --example persistence_bench` (prints Markdown tables; medians of
//! several runs, each on a fresh journal).

use std::sync::Arc;
use std::time::Instant;

use actix_delivery::codec::Codec;
use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal};
use actix_delivery::persistence::{
    recover_state, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{
    Confirmation, ConsumerOptions, DeliveryHandler, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};

#[path = "support/counter.rs"]
mod counter;

use counter::Counter;

const RUNS: usize = 5;
const SEQUENTIAL: u64 = 1_000;
const CONCURRENT_CALLERS: u64 = 64;
const CONCURRENT: u64 = 64_000;
const DELIVERED: u64 = 50_000;
const WINDOW: usize = 64;
const RECOVERED: u64 = 1_000_000;
const CODECS: [Codec; 2] = [Codec::Bincode, Codec::MessagePack];

async fn open(dir: &tempfile::TempDir, run: usize) -> Arc<dyn Journal> {
    let journal = SqliteJournal::open(dir.path().join(format!("run-{run}.db")))
        .await
        .expect("open the journal");
    Arc::new(journal)
}

fn counter_id() -> PersistenceId {
    PersistenceId::new("counter").expect("a valid id")
}

async fn counter_on(journal: Arc<dyn Journal>, codec: Codec) -> PersistentHandle<Counter> {
    let config = PersistentConfig {
        codec,
        ..PersistentConfig::default()
    };
    let counter =
        PersistentHandle::start(PersistentOptions::new(journal, counter_id()).config(config))
            .expect("valid settings");
    counter.ask(0).await.expect("recovered");
    counter
}

async fn counter(dir: &tempfile::TempDir, run: usize, codec: Codec) -> PersistentHandle<Counter> {
    counter_on(open(dir, run).await, codec).await
}

/// Commands per second with one in flight.
async fn sequential(dir: &tempfile::TempDir, run: usize, codec: Codec) -> f64 {
    let counter = counter(dir, run, codec).await;
    let start = Instant::now();
    for _ in 0..SEQUENTIAL {
        counter.ask(1).await.expect("stored");
    }
    SEQUENTIAL as f64 / start.elapsed().as_secs_f64()
}

/// Commands per second with 64 callers, each with one in flight.
async fn concurrent(dir: &tempfile::TempDir, run: usize, codec: Codec) -> (f64, f64) {
    let counter = counter(dir, run, codec).await;
    let start = Instant::now();
    write(&counter, CONCURRENT).await;
    let rate = CONCURRENT as f64 / start.elapsed().as_secs_f64();
    let stats = counter.stats().await.expect("running");
    (rate, stats.entries as f64 / stats.appends as f64)
}

/// `commands` commands from 64 callers, each with one in flight.
async fn write(counter: &PersistentHandle<Counter>, commands: u64) {
    let callers = (0..CONCURRENT_CALLERS).map(|_| {
        let counter = counter.clone();
        actix::spawn(async move {
            for _ in 0..commands / CONCURRENT_CALLERS {
                counter.ask(1).await.expect("stored");
            }
        })
    });
    futures_util::future::join_all(callers).await;
}

/// A journal holding a stream of [`RECOVERED`] events in `codec`.
async fn recovery_stream(dir: &tempfile::TempDir, run: usize, codec: Codec) -> Arc<dyn Journal> {
    let journal = open(dir, run).await;
    let counter = counter_on(journal.clone(), codec).await;
    write(&counter, RECOVERED).await;
    counter.stop();
    counter.stopped().await.expect("stopped on request");
    journal
}

/// Events recovered per second from [`recovery_stream`]'s stream.
async fn recovery(journal: &Arc<dyn Journal>) -> f64 {
    let start = Instant::now();
    let state = recover_state::<Counter>(&**journal, &counter_id())
        .await
        .expect("recovered");
    assert_eq!(state.count, RECOVERED);
    RECOVERED as f64 / start.elapsed().as_secs_f64()
}

/// Messages confirmed per second through `handler`: N−1 tells and one awaited send.
async fn delivered(handler: DeliveryHandler<u64>) -> f64 {
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(handler)
            .build()
            .expect("valid settings"),
    );
    let producer: ProducerHandle<u64> = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .window_size(WINDOW)
            .build()
            .expect("valid settings"),
    );
    let start = Instant::now();
    for n in 1..DELIVERED {
        producer
            .tell(n, Confirmation::none())
            .expect("max_pending holds them all");
    }
    producer.send(DELIVERED).await.expect("confirmed");
    producer.idle().await;
    DELIVERED as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[actix::main]
async fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Per codec: one in flight, 64 in flight, entries per append, effectively once, recovery.
    let mut measured: Vec<[Vec<f64>; 5]> = CODECS.iter().map(|_| Default::default()).collect();
    let mut memory = Vec::new();
    // The codecs take turns within each run, so that a change of the machine's load (a
    // shared machine) affects both alike.
    for run in 0..RUNS {
        for (index, codec) in CODECS.into_iter().enumerate() {
            let run = 100 * index + 10 * run;
            let m = &mut measured[index];
            m[0].push(sequential(&dir, run, codec).await);
            let (rate, per_append) = concurrent(&dir, run + 1, codec).await;
            m[1].push(rate);
            m[2].push(per_append);
            let counter = counter(&dir, run + 2, codec).await;
            m[3].push(delivered(counter.delivery_handler(|_: u64| 1)).await);
        }
        memory.push(
            delivered(DeliveryHandler::from_fn(|_: u64| async {
                Ok::<(), String>(())
            }))
            .await,
        );
    }
    let streams: Vec<Arc<dyn Journal>> = {
        let mut streams = Vec::new();
        for (index, codec) in CODECS.into_iter().enumerate() {
            streams.push(recovery_stream(&dir, 100 * index + 99, codec).await);
        }
        streams
    };
    for _ in 0..RUNS {
        for (index, journal) in streams.iter().enumerate() {
            measured[index][4].push(recovery(journal).await);
        }
    }
    let rows: Vec<[f64; 5]> = measured.into_iter().map(|m| m.map(median)).collect();
    let memory = median(memory);
    println!("| case (SQLite journal) | codec | per second | vs bincode |");
    println!("|---|---|---:|---:|");
    let cases = [
        (0, "persistent actor, 1 command in flight"),
        (1, "persistent actor, 64 commands in flight"),
        (
            3,
            "effectively-once consumer at window 64, messages confirmed",
        ),
        (4, "recovery of 1 M events, events"),
    ];
    for (case, name) in cases {
        for (codec, row) in CODECS.iter().zip(&rows) {
            println!(
                "| {name} | {codec} | {:.0} | {:.2}× |",
                row[case],
                row[case] / rows[0][case]
            );
        }
    }
    for (codec, row) in CODECS.iter().zip(&rows) {
        println!(
            "\n{codec}: 64 commands in flight are {:.1}× one in flight ({:.1} entries per \
             append); the effectively-once consumer confirms {:.3}× what an in-memory handler \
             does ({memory:.0}/s)",
            row[1] / row[0],
            row[2],
            row[3] / memory
        );
    }
}
