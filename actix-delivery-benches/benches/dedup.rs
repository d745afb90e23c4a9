//! The dedup table under churn: deliveries from 1, 100, 10 000 and 1 000 000 distinct
//! producer ids, round robin (each id sends seq `r + 1` in round `r`, with
//! `window_start = seq`), at the default `max_producers` of 1 024.
//!
//! Up to 1 024 ids every delivery finds its window; beyond, every delivery evicts the least
//! recently used window and creates one. The cost per delivery must not grow with the number
//! of ids past that point (10 000 vs 1 000 000).
//!
//! - `dedup/consumer_core/<ids>`: `ConsumerCore::handle_delivery` (admission, lookup or
//!   eviction, dedup decision) + `handle_outcome(Succeeded)` (record, ACK), per delivery.
//! - `dedup/table/<ids>`: `DedupTable::window_for` + `complete`, per delivery (what the
//!   consumer does for a message whose handler runs at once; `begin` is only for messages that
//!   wait behind a running handler).
//!
//! The ids are built before measuring (no string formatting in the loop); a delivery clones
//! one (`Arc<str>`). One iteration is one delivery.
//!
//! `cargo bench -p actix-delivery-benches --bench dedup`

use std::hint::black_box;
use std::time::{Duration, Instant};

use actix_delivery_proto::config::ConsumerConfig;
use actix_delivery_proto::protocol::consumer::{ConsumerCore, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::dedup::DedupTable;
use actix_delivery_proto::protocol::envelope::{Header, Incarnation, ProducerId};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const ID_COUNTS: [usize; 4] = [1, 100, 10_000, 1_000_000];
const MAX_PRODUCERS: usize = 1024;
const INCARNATION: Incarnation = Incarnation::from_u128(0x5eed);

/// Round-robin delivery headers over a set of ids.
struct Churn<'a> {
    ids: &'a [ProducerId],
    next: usize,
    round: u64,
}

impl<'a> Churn<'a> {
    fn new(ids: &'a [ProducerId]) -> Self {
        Self {
            ids,
            next: 0,
            round: 0,
        }
    }

    fn header(&mut self) -> Header {
        let seq = self.round + 1;
        let header = Header {
            producer_id: self.ids[self.next].clone(),
            incarnation: INCARNATION,
            seq,
            window_start: seq,
            trace_context: None,
            chunk: None,
        };
        self.next += 1;
        if self.next == self.ids.len() {
            self.next = 0;
            self.round += 1;
        }
        header
    }
}

fn bench_dedup(c: &mut Criterion) {
    let max_ids = ID_COUNTS[ID_COUNTS.len() - 1];
    // The format of `ProducerId::random()`: "producer-" + 16 hex digits.
    let ids: Vec<ProducerId> = (0..max_ids as u64)
        .map(|i| {
            ProducerId::from(format!(
                "producer-{:016x}",
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ))
        })
        .collect();
    let now = Instant::now();
    let config = ConsumerConfig {
        max_producers: MAX_PRODUCERS.into(),
        ..ConsumerConfig::default()
    };

    let mut group = c.benchmark_group("dedup");
    group.throughput(Throughput::Elements(1));
    for count in ID_COUNTS {
        let mut churn = Churn::new(&ids[..count]);
        let mut consumer: ConsumerCore<u64, ()> = ConsumerCore::new(&config);
        group.bench_with_input(BenchmarkId::new("consumer_core", count), &count, |b, _| {
            b.iter(|| {
                let inbound = Inbound {
                    header: churn.header(),
                    body: 0u64,
                    reply_to: Some(()),
                };
                match consumer.handle_delivery(inbound, now) {
                    Step::Run(body) => {
                        black_box(body);
                    }
                    _ => panic!("every delivery is a new message"),
                }
                let completion = consumer.handle_outcome(&HandlerOutcome::Succeeded, now);
                black_box(completion.ack);
            })
        });
        let stats = consumer.stats();
        assert!(stats.tracked_producers <= MAX_PRODUCERS.min(count));
        assert_eq!(stats.duplicates, 0);
    }
    for count in ID_COUNTS {
        let mut churn = Churn::new(&ids[..count]);
        let mut table = DedupTable::new(Some(MAX_PRODUCERS), Some(Duration::from_secs(300)));
        group.bench_with_input(BenchmarkId::new("table", count), &count, |b, _| {
            b.iter(|| {
                let header = churn.header();
                let (window, _, _) = table.window_for(
                    &header.producer_id,
                    header.incarnation,
                    header.window_start,
                    now,
                );
                assert!(!window.is_handled(header.seq) && !window.is_waiting(header.seq));
                window.complete(header.seq);
            })
        });
        assert!(table.len() <= MAX_PRODUCERS.min(count));
    }
    group.finish();
}

criterion_group!(benches, bench_dedup);
criterion_main!(benches);
