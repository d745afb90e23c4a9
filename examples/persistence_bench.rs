//! What persistence costs, measured on the SQLite journal in a temporary directory:
//!
//! 1. one persistent actor, one command in flight at a time (one commit, one fsync each);
//! 2. the same actor with 64 callers, each with one command in flight (batched appends);
//! 3. the effectively-once consumer end to end (producer → consumer → persistent actor),
//!    messages confirmed per second at window 64;
//! 4. the same delivery with a plain in-memory handler.
//!
//! `cargo run --release --example persistence_bench` (prints a Markdown table; medians of
//! several runs, each on a fresh journal).

use std::sync::Arc;
use std::time::Instant;

use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::persistence::{Decision, EventSourced, PersistentConfig, PersistentHandle};
use actix_delivery::{
    Confirmation, ConsumerOptions, DeliveryHandler, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};
use serde::{Deserialize, Serialize};

const RUNS: usize = 5;
const SEQUENTIAL: u64 = 1_000;
const CONCURRENT_CALLERS: u64 = 64;
const CONCURRENT: u64 = 64_000;
const DELIVERED: u64 = 50_000;
const WINDOW: usize = 64;

/// A counter whose events carry a 100-byte note, so entries are of a realistic size.
#[derive(Default, Serialize, Deserialize)]
struct Counter {
    count: u64,
}

#[derive(Serialize, Deserialize)]
struct Counted {
    by: u64,
    note: String,
}

impl EventSourced for Counter {
    type Command = u64;
    type Event = Counted;
    type Reply = u64;
    type Rejection = String;

    fn decide(&self, &by: &u64) -> Result<Decision<Self>, String> {
        let note = "x".repeat(100);
        Ok(Decision::persist([Counted { by, note }], self.count + by))
    }

    fn apply(&mut self, event: &Counted) {
        self.count += event.by;
    }
}

async fn counter(dir: &tempfile::TempDir, run: usize) -> PersistentHandle<Counter> {
    let journal = SqliteJournal::open(dir.path().join(format!("run-{run}.db")))
        .await
        .expect("open the journal");
    let id = PersistenceId::new("counter").expect("a valid id");
    let counter = PersistentHandle::start(Arc::new(journal), id, PersistentConfig::default())
        .expect("valid settings");
    counter.ask(0).await.expect("recovered");
    counter
}

/// Commands per second with one in flight.
async fn sequential(dir: &tempfile::TempDir, run: usize) -> f64 {
    let counter = counter(dir, run).await;
    let start = Instant::now();
    for _ in 0..SEQUENTIAL {
        counter.ask(1).await.expect("stored");
    }
    SEQUENTIAL as f64 / start.elapsed().as_secs_f64()
}

/// Commands per second with 64 callers, each with one in flight.
async fn concurrent(dir: &tempfile::TempDir, run: usize) -> (f64, f64) {
    let counter = counter(dir, run).await;
    let start = Instant::now();
    let callers = (0..CONCURRENT_CALLERS).map(|_| {
        let counter = counter.clone();
        actix::spawn(async move {
            for _ in 0..CONCURRENT / CONCURRENT_CALLERS {
                counter.ask(1).await.expect("stored");
            }
        })
    });
    futures_util::future::join_all(callers).await;
    let rate = CONCURRENT as f64 / start.elapsed().as_secs_f64();
    let stats = counter.stats().await.expect("running");
    (rate, stats.entries as f64 / stats.appends as f64)
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
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut one = Vec::new();
    let mut many = Vec::new();
    let mut batch = Vec::new();
    let mut persistent = Vec::new();
    let mut memory = Vec::new();
    for run in 0..RUNS {
        one.push(sequential(&dir, run * 10).await);
        let (rate, per_append) = concurrent(&dir, run * 10 + 1).await;
        many.push(rate);
        batch.push(per_append);
        let counter = counter(&dir, run * 10 + 2).await;
        persistent.push(delivered(counter.delivery_handler(|_: u64| 1)).await);
        memory.push(
            delivered(DeliveryHandler::from_fn(|_: u64| async {
                Ok::<(), String>(())
            }))
            .await,
        );
    }
    let (one, many, batch) = (median(one), median(many), median(batch));
    let (persistent, memory) = (median(persistent), median(memory));
    println!("| case | per second | vs one in flight |");
    println!("|---|---:|---:|");
    println!("| persistent actor, 1 command in flight | {one:.0} | 1.0× |");
    println!(
        "| persistent actor, {CONCURRENT_CALLERS} commands in flight ({batch:.1} per append) | {many:.0} | {:.1}× |",
        many / one
    );
    println!("\n| delivery at window {WINDOW} | confirmed messages/s | vs in-memory handler |");
    println!("|---|---:|---:|");
    println!("| in-memory handler | {memory:.0} | 1.0× |");
    println!(
        "| effectively-once consumer (persistent actor on SQLite) | {persistent:.0} | {:.2}× |",
        persistent / memory
    );
}
