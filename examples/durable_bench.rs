//! What a durable producer costs, on SQLite journals in a temporary directory:
//!
//! 1. an in-memory producer → in-memory consumer (the baseline);
//! 2. a durable producer storing one message at a time (one commit, one fsync, each);
//! 3. a durable producer → in-memory consumer, a stream of tells (group-committed stores);
//! 4. a durable producer → persistent consumer: durable on both ends;
//!
//! plus the journal bytes per unconfirmed message, and the file size under a steady stream
//! (compaction keeps it bounded). `cargo run --release --example durable_bench`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
use actix_delivery::{
    Confirmation, ConsumerHandle, ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use serde::{Deserialize, Serialize};

const RUNS: usize = 3;
const MESSAGES: u64 = 50_000;
const ONE_BY_ONE: u64 = 1_000;
const WINDOW: usize = 64;

/// A 100-byte message.
#[derive(Clone, Serialize, Deserialize)]
struct Message {
    n: u64,
    note: String,
}

fn message(n: u64) -> Message {
    Message {
        n,
        note: "x".repeat(92),
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Counter {
    count: u64,
}

#[derive(Serialize, Deserialize)]
struct Counted(u64);

impl EventSourced for Counter {
    type Command = u64;
    type Event = Counted;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &n: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Counted(n)], ()))
    }

    fn apply(&mut self, _: &Counted) {
        self.count += 1;
    }
}

fn in_memory_consumer() -> ConsumerHandle<Message> {
    let handler = DeliveryHandler::from_fn(|_: Message| async { Ok::<(), String>(()) });
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().expect("valid"))
}

fn options(to: impl Into<ConsumerRef<Message>>) -> ProducerOptions<Message> {
    ProducerOptions::builder(to)
        .producer_id("bench")
        .window_size(WINDOW)
        .build()
        .expect("valid")
}

async fn durable(
    to: impl Into<ConsumerRef<Message>>,
    path: &std::path::Path,
) -> ProducerHandle<Message> {
    let journal = SqliteJournal::open(path).await.expect("open");
    let stream = PersistenceId::new("bench-out").expect("valid");
    let durable = DurableOptions::new(Arc::new(journal), stream, "bench");
    let producer = ReliableDelivery::durable_producer(options(to), durable).expect("valid");
    while producer.stats().await.expect("running").next_message_id == 0 {
        actix::clock::sleep(Duration::from_millis(1)).await;
    }
    producer
}

/// Messages confirmed per second: N−1 tells and one awaited send.
async fn stream(producer: &ProducerHandle<Message>, count: u64) -> f64 {
    let start = Instant::now();
    for n in 1..count {
        producer
            .tell(message(n), Confirmation::none())
            .expect("room for all");
    }
    producer.send(message(count)).await.expect("confirmed");
    producer.idle().await;
    count as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn size(path: &std::path::Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            std::fs::metadata(file).ok()
        })
        .map(|m| m.len())
        .sum()
}

#[actix::main]
async fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut plain, mut one, mut durable_memory, mut both) = (vec![], vec![], vec![], vec![]);
    for run in 0..RUNS {
        let consumer = in_memory_consumer();
        plain.push(stream(&ReliableDelivery::producer(options(&consumer)), MESSAGES).await);

        let producer = durable(&consumer, &dir.path().join(format!("one-{run}.db"))).await;
        let start = Instant::now();
        for n in 0..ONE_BY_ONE {
            producer.store(message(n)).await.expect("stored");
        }
        one.push(ONE_BY_ONE as f64 / start.elapsed().as_secs_f64());
        producer.stop();
        producer.stopped().await.expect("stopped on request");

        let producer = durable(&consumer, &dir.path().join(format!("stream-{run}.db"))).await;
        durable_memory.push(stream(&producer, MESSAGES).await);
        producer.stop();

        let journal = SqliteJournal::open(dir.path().join(format!("counter-{run}.db")))
            .await
            .expect("open");
        let counter = PersistentHandle::<Counter>::start(PersistentOptions::new(
            Arc::new(journal),
            PersistenceId::new("counter").expect("valid"),
        ))
        .expect("valid");
        let persistent = ReliableDelivery::consumer(
            ConsumerOptions::builder(counter.delivery_handler(|m: Message| m.n))
                .build()
                .expect("valid"),
        );
        let producer = durable(&persistent, &dir.path().join(format!("both-{run}.db"))).await;
        both.push(stream(&producer, MESSAGES).await);
        producer.stop();
    }
    let (plain, one, durable_memory, both) = (
        median(plain),
        median(one),
        median(durable_memory),
        median(both),
    );
    println!("| case | confirmed messages/s | vs one fsync per message | vs in-memory producer |");
    println!("|---|---:|---:|---:|");
    println!("| in-memory producer → in-memory consumer | {plain:.0} | | 1.00× |");
    println!(
        "| durable producer, one message stored at a time (one fsync each) | {one:.0} | 1.0× | {:.3}× |",
        one / plain
    );
    println!(
        "| durable producer → in-memory consumer, window {WINDOW} | {durable_memory:.0} | {:.0}× | {:.2}× |",
        durable_memory / one,
        durable_memory / plain
    );
    println!(
        "| durable producer → persistent consumer (durable both ends) | {both:.0} | {:.0}× | {:.2}× |",
        both / one,
        both / plain
    );

    // Journal size: 10 000 unconfirmed messages (the consumer unreachable), then a steady
    // stream of confirmed ones.
    let nowhere = ConsumerRef::from_fn(|_: Vec<actix_delivery::Delivery<Message>>| ());
    let path = dir.path().join("size.db");
    let producer = durable(nowhere, &path).await;
    let empty = size(&path);
    for n in 0..10_000 {
        producer
            .tell(message(n), Confirmation::none())
            .expect("room");
    }
    while producer.stats().await.expect("running").stored < 10_000 {
        actix::clock::sleep(Duration::from_millis(10)).await;
    }
    let full = size(&path);
    producer.stop();
    producer.stopped().await.expect("stopped on request");
    println!(
        "\njournal bytes per unconfirmed message (100-byte bodies): {:.0}",
        (full - empty) as f64 / 10_000.0
    );
    let consumer = in_memory_consumer();
    let path = dir.path().join("steady.db");
    let producer = durable(&consumer, &path).await;
    let mut sizes = Vec::new();
    for _ in 0..8 {
        stream(&producer, 25_000).await;
        let wal = std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len());
        sizes.push((
            std::fs::metadata(&path).map_or(0, |m| m.len()) / 1024,
            wal / 1024,
        ));
    }
    println!("(database, WAL) KiB after each 25 000 confirmed messages: {sizes:?}");
}
