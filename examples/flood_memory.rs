//! Memory figures: bookkeeping bytes per in-flight and per queued message, bytes per dedup
//! entry, and a consumer flooded with 1 000 000 distinct producer ids at the default
//! `max_producers` (1 024), whose memory must stay flat.
//!
//! ```text
//! cargo run --release --example flood_memory          # flood in batches of 10 000
//! cargo run --release --example flood_memory -- 1000  # flood in batches of 1 000
//! ```
//!
//! "Heap" figures come from a counting global allocator (bytes requested and not yet freed;
//! the allocator's own per-block overhead is not included). RSS figures are `VmRSS` and `VmHWM`
//! (peak) from `/proc/self/status`; the peak is reset before the flood where the kernel allows
//! it (`/proc/self/clear_refs`), so the flood's peak is its own.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_delivery::{
    Ack, Confirmation, ConsumerConfig, ConsumerOptions, Delivery, DeliveryHandler, DeliveryInfo,
    Incarnation, Limit, ProducerConfig, ProducerId, ProducerOptions, ReliableDelivery, ReplyTo,
    SingleAck, Tell,
};
use actix_delivery_proto::protocol::consumer::{ConsumerCore, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::dedup::{DedupTable, ProducerWindow};
use actix_delivery_proto::protocol::envelope::Header;
use actix_delivery_proto::protocol::producer::{ProducerCore, Transmission};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{heap_since, live_blocks, live_bytes};

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`), in bytes.
fn proc_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets `VmHWM` to the current RSS (Linux ≥ 4.0). Returns whether it worked.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn rss() -> String {
    proc_status("VmRSS:").map_or_else(|| "n/a".into(), mib)
}

fn peak_rss() -> String {
    proc_status("VmHWM:").map_or_else(|| "n/a".into(), mib)
}

fn kib(bytes: i64) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}

/// A producer id of the same shape as `ProducerId::random()` ("producer-" + 16 hex digits).
fn flood_id(i: u64) -> ProducerId {
    ProducerId::from(format!("producer-{i:016x}"))
}

const FLOOD_IDS: u64 = 1_000_000;
const CHECKPOINTS: [u64; 4] = [10_000, 100_000, 500_000, 1_000_000];

// ---------------------------------------------------------------------------------------------
// Actors for the flood

/// Receives the consumer's ACKs and counts them.
#[derive(Default)]
struct AckSink(u64);

impl Actor for AckSink {
    type Context = Context<Self>;
}

impl Handler<SingleAck> for AckSink {
    type Result = ();

    fn handle(&mut self, _: SingleAck, _: &mut Context<Self>) {
        self.0 += 1;
    }
}

#[derive(Message)]
#[rtype(result = "u64")]
struct Received;

impl Handler<Received> for AckSink {
    type Result = u64;

    fn handle(&mut self, _: Received, _: &mut Context<Self>) -> u64 {
        self.0
    }
}

/// A consumer stand-in that drops every delivery (never ACKs), to keep messages in flight.
struct BlackHole;

impl Actor for BlackHole {
    type Context = Context<Self>;
}

impl Handler<Delivery<u64>> for BlackHole {
    type Result = ();

    fn handle(&mut self, _: Delivery<u64>, _: &mut Context<Self>) {}
}

impl Handler<Received> for BlackHole {
    type Result = u64;

    fn handle(&mut self, _: Received, _: &mut Context<Self>) -> u64 {
        0
    }
}

// ---------------------------------------------------------------------------------------------

#[actix::main]
async fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    println!("# actix-delivery memory figures\n");
    println!(
        "Heap = bytes requested from the allocator and not freed (no allocator overhead); \
         RSS from /proc/self/status. Bodies are u64.\n"
    );
    let batch: u64 = std::env::args()
        .nth(1)
        .map_or(10_000, |a| a.parse().expect("batch size: a number"));
    assert!(batch > 0);
    actor_flood(batch).await;
    core_flood();
    per_dedup_entry();
    per_message_in_producer().await;
    type_sizes();
}

/// 1 000 000 distinct producer ids into a real `ConsumerController` (default options), in
/// batches of `batch` deliveries each followed by a stats round trip.
async fn actor_flood(batch: u64) {
    println!("## Flood: 1,000,000 distinct producer ids into a ConsumerController\n");
    println!(
        "Default options (max_producers 1024). Each id sends one delivery (seq 1) with a \
         reply_to to an ACK sink actor; batches of {batch} deliveries, then a `stats()` \
         round trip.\n"
    );
    let sink = AckSink::default().start();
    let reply_to = ReplyTo::from(sink.clone().recipient::<SingleAck>());
    // Let the sink start, then take the baseline.
    sink.send(Received).await.expect("the sink runs");
    let reset = reset_peak_rss();
    let baseline = live_bytes();
    let rss_before = rss();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            Ok::<(), std::convert::Infallible>(())
        }))
        .build()
        .expect("default options are valid"),
    );
    println!(
        "Before: RSS {rss_before}{}\n",
        if reset {
            " (peak RSS reset here)"
        } else {
            " (peak RSS could not be reset: VmHWM includes earlier peaks)"
        }
    );
    println!("| distinct ids | tracked windows | evictions | ACKs | heap Δ | RSS | peak RSS |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let started = Instant::now();
    let mut sent = 0;
    for checkpoint in CHECKPOINTS {
        while sent < checkpoint {
            let end = (sent + batch).min(checkpoint);
            for i in sent..end {
                consumer.addr().do_send(Delivery {
                    producer_id: flood_id(i),
                    incarnation: Incarnation::from_u128(u128::from(i) + 1),
                    seq: 1,
                    window_start: 1,
                    body: i,
                    reply_to: Some(reply_to.clone()),
                    trace_context: None,
                });
            }
            sent = end;
            consumer.stats().await.expect("the consumer runs");
        }
        let stats = consumer.stats().await.expect("the consumer runs");
        let acks = sink.send(Received).await.expect("the sink runs");
        assert_eq!(
            stats.delivered, checkpoint,
            "every id's message was handled once"
        );
        println!(
            "| {checkpoint} | {} | {} | {acks} | {} | {} | {} |",
            stats.tracked_producers,
            stats.evictions,
            kib(heap_since(baseline)),
            rss(),
            peak_rss()
        );
    }
    println!(
        "\n{FLOOD_IDS} deliveries in {:.2} s. The heap beyond the pure core's (next table) is \
         buffer capacity the actors keep from their largest mailbox drain: it follows the batch \
         size (try `-- 1000` or `-- 100000`), not the number of ids.\n",
        started.elapsed().as_secs_f64()
    );
}

/// The same flood into the pure `ConsumerCore`.
fn core_flood() {
    println!("## Flood: 1,000,000 distinct producer ids into the pure ConsumerCore\n");
    let baseline = live_bytes();
    let mut core: ConsumerCore<u64, ()> = ConsumerCore::new(&ConsumerConfig::default());
    let now = Instant::now();
    println!("| distinct ids | tracked windows | evictions | heap Δ |");
    println!("|---:|---:|---:|---:|");
    let mut sent = 0;
    for checkpoint in CHECKPOINTS {
        while sent < checkpoint {
            deliver_once(&mut core, flood_id(sent), sent, now);
            sent += 1;
        }
        let stats = core.stats();
        println!(
            "| {checkpoint} | {} | {} | {} |",
            stats.tracked_producers,
            stats.evictions,
            kib(heap_since(baseline))
        );
    }
    println!();
}

/// One delivery (seq 1) from `id`, handled successfully.
fn deliver_once(core: &mut ConsumerCore<u64, ()>, id: ProducerId, i: u64, now: Instant) {
    let inbound = Inbound {
        header: Header {
            producer_id: id,
            incarnation: Incarnation::from_u128(u128::from(i) + 1),
            seq: 1,
            window_start: 1,
            trace_context: None,
            chunk: None,
        },
        body: i,
        reply_to: Some(()),
    };
    match core.handle_delivery(inbound, now) {
        Step::Run(..) => {}
        _ => panic!("a new producer's first message runs"),
    }
    let completion = core.handle_outcome(&HandlerOutcome::Succeeded, now);
    assert!(completion.ack.is_some());
}

/// Heap per dedup entry, from unbounded tables of 100 000 producers.
fn per_dedup_entry() {
    const N: u64 = 100_000;
    println!("## Bytes per dedup entry ({N} producers, unbounded table)\n");
    println!(
        "Ids are {} bytes (\"producer-\" + 16 hex digits), allocated per delivery, so the \
         figures include the id string the table keeps alive.\n",
        flood_id(0).len()
    );
    println!("| what | heap per entry |");
    println!("|---|---:|");
    let now = Instant::now();

    // Heap per window of a table holding N producers, with or without a handled message each.
    let per_window = |handle: bool| {
        let baseline = live_bytes();
        let mut table = DedupTable::new(None, None);
        for i in 0..N {
            let header = Header {
                producer_id: flood_id(i),
                incarnation: Incarnation::from_u128(1),
                seq: 1,
                window_start: 1,
                trace_context: None,
                chunk: None,
            };
            let (window, _, _) = table.window_for(
                &header.producer_id,
                header.incarnation,
                header.window_start,
                now,
            );
            if handle {
                window.complete(1);
            }
        }
        heap_since(baseline) as f64 / N as f64
    };
    let lookup_only = per_window(false);
    println!(
        "| `DedupTable::window_for` only (window created, nothing handled) | {lookup_only:.1} B |"
    );
    let handled = per_window(true);
    println!("| `DedupTable`, one message handled (`complete`) | {handled:.1} B |");

    let baseline = live_bytes();
    let mut core: ConsumerCore<u64, ()> = ConsumerCore::new(&ConsumerConfig {
        max_producers: Limit::Unbounded,
        ..ConsumerConfig::default()
    });
    for i in 0..N {
        deliver_once(&mut core, flood_id(i), i, now);
    }
    let in_core = heap_since(baseline) as f64 / N as f64;
    println!("| `ConsumerCore`, one message handled | {in_core:.1} B |");
    drop(core);
    // 1024 entries × `in_core` bytes = `in_core` KiB.
    println!(
        "\nAt max_producers = 1024 the table holds at most 1024 × {in_core:.0} B ≈ \
         {in_core:.0} KiB.\n"
    );
}

/// Heap per in-flight and per queued message in a real `ProducerController`, and in the pure
/// `ProducerCore`.
async fn per_message_in_producer() {
    const N: usize = 1 << 14; // a power of two: the queues' capacity equals their length
    const CHUNK: u64 = 256;
    println!("## Bytes per message held by a producer ({N} messages)\n");
    println!(
        "The consumer is a black hole (never ACKs), resend_timeout 1 h. {N} tells in chunks \
         of {CHUNK} (a `stats()` round trip between chunks), measured once all were handled \
         and transmitted. Queues are VecDeques: in general add up to 2× for capacity not yet \
         used, and a producer that receives a large burst in one mailbox drain keeps the \
         capacity its pending and transmit queues grew to.\n"
    );
    println!("| what | heap per message |");
    println!("|---|---:|");

    let hits = Arc::new(AtomicU64::new(0));
    for (window, callback) in [(N, false), (N, true), (1, false)] {
        let hole = BlackHole.start();
        let producer = ReliableDelivery::producer(
            ProducerOptions::builder(hole.clone().recipient::<Delivery<u64>>())
                .window_size(window)
                .max_pending(N)
                .resend_timeout(Duration::from_secs(3600))
                .build()
                .expect("valid options"),
        );
        producer.stats().await.expect("the producer runs");
        let baseline = live_bytes();
        for body in 0..N as u64 {
            if body % CHUNK == 0 {
                // Let the producer drain its mailbox now and then, so that its transient
                // queues (pending, transmit) stay short and only the bookkeeping remains.
                producer.stats().await.expect("the producer runs");
            }
            let told = if callback {
                let hits = hits.clone();
                producer.tell(body, move |_| {
                    hits.fetch_add(1, Ordering::Relaxed);
                })
            } else {
                producer.tell(body, Confirmation::none())
            };
            assert!(told.is_ok());
        }
        let stats = producer.stats().await.expect("the producer runs");
        hole.send(Received).await.expect("the black hole runs");
        assert_eq!(stats.in_flight + stats.queued, N);
        let per = heap_since(baseline) as f64 / N as f64;
        let what = match (window, callback) {
            (1, _) => "`ProducerController`, queued (window full), `Confirmation::none()`",
            (_, false) => "`ProducerController`, in flight, `Confirmation::none()`",
            (_, true) => "`ProducerController`, in flight, callback capturing an `Arc`",
        };
        println!("| {what} | {per:.1} B |");
        producer.stop();
    }

    for (window, what) in [
        (N, "`ProducerCore<u64, ()>`, in flight"),
        (1, "`ProducerCore<u64, ()>`, queued"),
    ] {
        let baseline = live_bytes();
        let mut core: ProducerCore<u64, ()> = ProducerCore::seeded(
            &ProducerConfig {
                window_size: window,
                max_pending: N,
                producer_id: Some("p".into()),
                ..ProducerConfig::default()
            },
            Incarnation::from_u128(1),
            || 1,
        );
        let now = Instant::now();
        for body in 0..N as u64 {
            core.handle_send(body, ()).expect("room");
            while core.poll_transmit(now).is_some() {}
        }
        let per = heap_since(baseline) as f64 / N as f64;
        println!("| {what} | {per:.1} B |");
    }
    println!();
}

fn type_sizes() {
    println!("## Sizes of the public types (`size_of`, bytes, body u64)\n");
    println!("| type | bytes |");
    println!("|---|---:|");
    let rows: [(&str, usize); 13] = [
        ("Delivery<u64>", size_of::<Delivery<u64>>()),
        ("Tell<u64>", size_of::<Tell<u64>>()),
        ("Confirmation", size_of::<Confirmation>()),
        ("Ack", size_of::<Ack>()),
        ("ReplyTo", size_of::<ReplyTo>()),
        ("Header", size_of::<Header>()),
        ("DeliveryInfo", size_of::<DeliveryInfo>()),
        ("ProducerId", size_of::<ProducerId>()),
        ("Incarnation", size_of::<Incarnation>()),
        ("Transmission<u64>", size_of::<Transmission<u64>>()),
        ("Inbound<u64, ReplyTo>", size_of::<Inbound<u64, ReplyTo>>()),
        ("ProducerWindow", size_of::<ProducerWindow>()),
        (
            "ProducerCore<u64, Confirmation>",
            size_of::<ProducerCore<u64, Confirmation>>(),
        ),
    ];
    for (name, bytes) in rows {
        println!("| `{name}` | {bytes} |");
    }
    println!("\n`ProducerWindow` is the value of one dedup entry (keyed by `ProducerId`).");
    println!("\nLive heap blocks at exit: {}", live_blocks());
    System::current().stop();
}
