//! The pure protocol cores alone, no actors: a `ProducerCore` and a `ConsumerCore` wired
//! directly in a loop (`handle_send` → `poll_transmit` → `handle_delivery` →
//! `handle_outcome(Succeeded)` → `handle_ack` → `poll_settled`).
//!
//! - `cores/window/1`: one message at a time through both cores (lockstep); the reported time
//!   is ns per message.
//! - `cores/window/<w>`: `w` messages sent at once, all `w` transmitted, delivered (one runs,
//!   the others wait in the consumer's queue), handled and ACKed; one iteration is `w`
//!   messages, so read the elements/s figure (or divide the time by `w`).
//!
//! Time is an argument of the cores; this bench passes one fixed `Instant` (the actors read
//! the clock once per event, which this does not measure). Bodies are `u64`, confirmation
//! tokens and reply addresses are `()`.
//!
//! `cargo bench -p actix-delivery-benches --bench cores`

use std::hint::black_box;
use std::time::Instant;

use actix_delivery_proto::config::{ConsumerConfig, ProducerConfig};
use actix_delivery_proto::protocol::consumer::{ConsumerCore, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::envelope::Incarnation;
use actix_delivery_proto::protocol::producer::ProducerCore;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

type Producer = ProducerCore<u64, ()>;
type Consumer = ConsumerCore<u64, ()>;

fn cores(window: usize) -> (Producer, Consumer) {
    let producer = ProducerCore::seeded(
        &ProducerConfig {
            window_size: window,
            producer_id: Some("bench-producer".into()),
            ..ProducerConfig::default()
        },
        Incarnation::from_u128(0x5eed),
        || 0x5eed,
    );
    let consumer = ConsumerCore::new(&ConsumerConfig::default());
    (producer, consumer)
}

/// Sends `n` messages (at most `window` of them in flight) through both cores until all are
/// settled. Returns how many were settled `Ok`.
fn pump(
    producer: &mut Producer,
    consumer: &mut Consumer,
    next: &mut u64,
    n: u64,
    now: Instant,
) -> u64 {
    for _ in 0..n {
        *next += 1;
        if producer.handle_send(*next, ()).is_err() {
            panic!("pending queue full");
        }
    }
    let mut settled = 0;
    loop {
        let mut running = None;
        while let Some(transmission) = producer.poll_transmit(now) {
            let inbound = Inbound {
                header: transmission.header,
                body: transmission.body,
                reply_to: Some(()),
            };
            match consumer.handle_delivery(inbound, now) {
                Step::Run(body) => running = Some(body),
                Step::Hold => {}
                Step::Ack(..) | Step::DeadLetter(..) => panic!("unexpected step"),
            }
        }
        // The handler: succeeds at once; the completion starts the next waiting message.
        while let Some(body) = running.take() {
            black_box(body);
            let completion = consumer.handle_outcome(&HandlerOutcome::Succeeded, now);
            if let Some(((), ack)) = completion.ack {
                assert!(producer.handle_ack(&ack), "a valid ACK");
            }
            running = completion.next;
        }
        while let Some(((), result)) = producer.poll_settled() {
            settled += u64::from(result.is_ok());
        }
        if producer.is_idle() {
            return settled;
        }
    }
}

fn bench_cores(c: &mut Criterion) {
    let now = Instant::now();
    let mut group = c.benchmark_group("cores");

    for window in [1, 16, 64, 256] {
        group.throughput(Throughput::Elements(window));
        let (mut producer, mut consumer) = cores(window as usize);
        let mut next = 0;
        group.bench_with_input(BenchmarkId::new("window", window), &window, |b, &w| {
            b.iter(|| {
                let settled = pump(&mut producer, &mut consumer, &mut next, w, now);
                debug_assert_eq!(settled, w);
            })
        });
        assert_eq!(producer.stats().confirmed, next);
        assert_eq!(consumer.stats().delivered, next);
    }
    group.finish();
}

criterion_group!(benches, bench_cores);
criterion_main!(benches);
