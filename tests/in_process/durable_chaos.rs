//! A durable producer sends through a lossy link (retransmissions duplicate) to an effectively-once
//! consumer (a persistent ledger) while, at seeded moments, either side is restarted abruptly or
//! gracefully and either journal fails an append (before its commit, or after it: the outcome is
//! then unknown to the writer). Every path that ends a life (`stop()`, a journal failure, a
//! supervised restart) must settle the writes it had in flight by what the journal holds.
//!
//! Exact invariants per seed, checked against the ledger's journal at the end:
//! - a message reported stored is applied exactly once;
//! - a message reported not stored is never applied; one reported in doubt at most once;
//! - every stored message's confirmation reaches its caller or, after a restart, the sink:
//!   exactly one of them, once.
//!
//! `ACTIX_DELIVERY_CHAOS_SEEDS` sets how many seeds run (default 500), and
//! `ACTIX_DELIVERY_CHAOS_SEED` runs one seed alone.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, DurableOptions, MessageId};
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{recover_state, PersistentHandle, PersistentOptions};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryError, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use common::entities::{ledger_id, Ledger, Op};
use common::journals::{Fault, Faulty};
use common::{settle, settle_for, Log, Sink};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The consumer side: the ledger and the effectively-once consumer feeding it.
struct Ledgers {
    journal: Faulty,
    entity: PersistentHandle<Ledger>,
    consumer: ConsumerHandle<u64>,
}

impl Ledgers {
    fn start(journal: Faulty) -> Self {
        let entity = PersistentHandle::<Ledger>::start(
            PersistentOptions::new(Arc::new(journal.clone()), ledger_id()).supervised(),
        )
        .unwrap();
        let handler = entity.delivery_handler(Op::Apply);
        let consumer =
            ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
        Self {
            journal,
            entity,
            consumer,
        }
    }

    async fn stop(self) {
        self.consumer.stop();
        self.entity.stop();
        let _ = self.entity.stopped().await; // the faults may have ended it
    }
}

/// What the callers heard: per body, the store's outcome; per message, its confirmations.
#[derive(Default)]
struct Heard {
    stores: Mutex<Vec<(u64, Result<MessageId, DeliveryError>)>>,
    confirmed: Mutex<Vec<(MessageId, Result<(), DeliveryError>)>>,
}

fn producer(
    journal: &Faulty,
    to: ConsumerRef<u64>,
    sink: &Recipient<DurableConfirmation>,
) -> ProducerHandle<u64> {
    let options = ProducerOptions::builder(to)
        .producer_id("chaos")
        .window_size(8)
        .resend_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let stream = PersistenceId::new("chaos-out").unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), stream, "chaos")
        .snapshot_every(16)
        .stop_timeout(Duration::from_secs(1))
        .confirmations(sink.clone());
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

fn store(producer: &ProducerHandle<u64>, body: u64, heard: &Arc<Heard>) {
    let (stored, heard) = (producer.store(body), heard.clone());
    actix::spawn(async move {
        let stored = stored.await;
        heard
            .stores
            .lock()
            .unwrap()
            .push((body, stored.as_ref().map(|s| s.id).map_err(Clone::clone)));
        if let Ok(stored) = stored {
            let id = stored.id;
            let result = stored.confirmed().await;
            heard.confirmed.lock().unwrap().push((id, result));
        }
    });
}

/// One seeded run; `Err` says which invariant broke.
async fn run(seed: u64) -> Result<(u64, u64), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let heard = Arc::new(Heard::default());
    let sink_heard = Log::default();
    let sink = Sink(sink_heard.clone()).start().recipient();
    let journal = Faulty::new(MemoryJournal::new());
    let mut ledgers = Ledgers::start(Faulty::new(MemoryJournal::new()));
    // The link: loses and duplicates deliveries, to whichever consumer is current.
    let target = Arc::new(Mutex::new(ledgers.consumer.consumer_ref()));
    let link_rng = Arc::new(Mutex::new(SmallRng::seed_from_u64(seed ^ 0x5eed)));
    let lossy = Arc::new(AtomicBool::new(true));
    let link = {
        let (target, rng, lossy) = (target.clone(), link_rng.clone(), lossy.clone());
        ConsumerRef::from_fn(move |deliveries: Vec<Delivery<u64>>| {
            let mut rng = rng.lock().unwrap();
            let to = target.lock().unwrap().clone();
            for delivery in deliveries {
                let lossy = lossy.load(Ordering::SeqCst);
                if lossy && rng.random_bool(0.2) {
                    continue;
                }
                to.do_send_all([delivery].into_iter());
            }
        })
    };
    let mut producer = producer(&journal, link.clone(), &sink);
    let mut next_body = 1;
    let mut overlapped = false;
    let mut stalled = false;
    for _ in 0..rng.random_range(10..30) {
        match rng.random_range(0..100) {
            0..=44 => {
                for _ in 0..rng.random_range(1..6) {
                    store(&producer, next_body, &heard);
                    next_body += 1;
                }
            }
            45..=64 => settle_for(rng.random_range(0..300)).await,
            65..=71 => journal.arm(Fault::BeforeCommit),
            72..=78 => journal.arm(Fault::AfterCommit),
            79..=82 => ledgers.journal.arm(Fault::BeforeCommit),
            83..=86 => ledgers.journal.arm(Fault::AfterCommit),
            87..=89 => {
                // The journal stalls while the producer stops: the stop timeout passes with
                // writes unanswered, which commit afterwards; then the next life starts.
                stalled = true;
                journal.inner.faults().hold_commits();
                for _ in 0..rng.random_range(0..3) {
                    store(&producer, next_body, &heard);
                    next_body += 1;
                }
                settle().await;
                producer.stop();
                settle_for(1_500).await;
                let _ = producer.stopped().await; // the faults may have ended it
                journal.inner.faults().release();
                producer = self::producer(&journal, link.clone(), &sink);
            }
            90..=93 => {
                // The producer's life ends (gracefully), and a new one takes the stream.
                producer.stop();
                if rng.random_bool(0.3) {
                    // The next life starts before this one finished stopping: for a while two
                    // lives share the stream, and the newest opener owns it.
                    overlapped = true;
                    settle().await;
                } else {
                    let _ = producer.stopped().await; // the faults may have ended it
                }
                producer = self::producer(&journal, link.clone(), &sink);
            }
            _ => {
                // The consumer side's life ends: dedup in memory is gone, the ledger recovers.
                let fresh = Ledgers::start(ledgers.journal.clone());
                *target.lock().unwrap() = fresh.consumer.consumer_ref();
                std::mem::replace(&mut ledgers, fresh).stop().await;
            }
        }
        settle().await;
    }
    // Calm: no more faults or losses; the last life delivers everything stored.
    journal.arm(Fault::None);
    ledgers.journal.arm(Fault::None);
    lossy.store(false, Ordering::SeqCst);
    settle_for(1_000).await;
    producer.stop();
    let _ = producer.stopped().await; // the faults may have ended it
    let last = self::producer(&journal, link.clone(), &sink);
    settle_for(1_000).await;
    last.idle().await;
    last.stop();
    last.stopped().await.unwrap();
    settle_for(100).await;
    let injected = |journal: &Faulty| {
        journal.injected(Fault::BeforeCommit) + journal.injected(Fault::AfterCommit)
    };
    let injected = (injected(&journal), injected(&ledgers.journal));
    let ledger_journal = ledgers.journal.inner.clone();
    ledgers.stop().await;
    let ledger = recover_state::<Ledger>(&ledger_journal, &ledger_id())
        .await
        .map_err(|e| format!("the ledger does not recover: {e}"))?;
    // What a producer cannot tell apart: another opening of its stream from one of its own
    // whose outcome it did not learn.
    let ambiguous = overlapped || stalled || journal.injected(Fault::AfterCommit) > 0;
    check(&heard, &sink_heard.snapshot(), &ledger, ambiguous)?;
    Ok(injected)
}

/// The invariants of the module docs.
///
/// One exception: a producer that opens its stream after another producer's opening cannot
/// tell who settled a message whose store or settlement record it did not see answered (it or
/// the other): it says `InDoubt`, and the outcome then reaches another party once or not at
/// all. Only runs in which lives overlapped, or in which an append reported failed had
/// committed (the producer cannot tell its own opening of unknown outcome from another's), or
/// in which a stop timed out, may have such an outcome.
fn check(
    heard: &Heard,
    sink: &[DurableConfirmation],
    ledger: &Ledger,
    ambiguous: bool,
) -> Result<(), String> {
    let applied = |body: u64| ledger.applied.get(&body).copied().unwrap_or(0);
    let mut outcomes: BTreeMap<MessageId, u32> = BTreeMap::new();
    let mut in_doubt = std::collections::BTreeSet::new();
    for (id, result) in heard.confirmed.lock().unwrap().iter() {
        match result {
            Ok(()) => *outcomes.entry(*id).or_default() += 1,
            // Stored: the next start sends it again.
            Err(DeliveryError::StoppedUnconfirmed) => {}
            Err(DeliveryError::InDoubt(_)) if ambiguous => {
                in_doubt.insert(*id);
            }
            Err(other) => return Err(format!("message {id:?} confirmed with {other:?}")),
        }
    }
    for confirmation in sink {
        match confirmation.result {
            Ok(()) => *outcomes.entry(confirmation.id).or_default() += 1,
            Err(DeliveryError::InDoubt(_)) if ambiguous => {
                in_doubt.insert(confirmation.id);
            }
            ref other => return Err(format!("the sink heard {confirmation:?}: {other:?}")),
        }
    }
    for (body, stored) in heard.stores.lock().unwrap().iter() {
        match stored {
            Ok(id) => {
                if applied(*body) != 1 {
                    return Err(format!(
                        "body {body} stored as {id:?} is applied {} times",
                        applied(*body)
                    ));
                }
                let told = outcomes.remove(id).unwrap_or(0);
                if told > 1 || (told == 0 && !in_doubt.contains(id)) {
                    return Err(format!(
                        "stored {id:?} (body {body}): its confirmation reached {told} parties \
                         (its callback heard {:?}; the sink {:?})",
                        heard
                            .confirmed
                            .lock()
                            .unwrap()
                            .iter()
                            .filter(|(i, _)| i == id)
                            .collect::<Vec<_>>(),
                        sink.iter().filter(|c| c.id == *id).collect::<Vec<_>>()
                    ));
                }
            }
            Err(DeliveryError::InDoubt(_)) if applied(*body) <= 1 => {}
            Err(DeliveryError::Storage(_) | DeliveryError::ProducerStopped)
                if applied(*body) == 0 => {}
            Err(error) => {
                return Err(format!(
                    "body {body}: store said {error:?}, applied {} times",
                    applied(*body)
                ))
            }
        }
    }
    // Sink reports of messages whose store was in doubt (stored after all) remain.
    if let Some((id, n)) = outcomes.iter().find(|&(_, &n)| n != 1) {
        return Err(format!("{id:?} was reported confirmed {n} times"));
    }
    let total: u32 = ledger.applied.values().sum();
    if total as i64 != ledger.total || ledger.applied.values().any(|&n| n > 1) {
        return Err(format!("a body was applied twice: {:?}", ledger.applied));
    }
    Ok(())
}

#[actix::test]
async fn every_outcome_reaches_exactly_one_party_across_restarts_and_journal_failures() {
    common::logs::keep();
    tokio::time::pause();
    let seeds: Vec<u64> = match std::env::var("ACTIX_DELIVERY_CHAOS_SEED") {
        Ok(seed) => vec![seed.parse().expect("ACTIX_DELIVERY_CHAOS_SEED is a number")],
        Err(_) => {
            let count = std::env::var("ACTIX_DELIVERY_CHAOS_SEEDS").map_or(500, |n| {
                n.parse().expect("ACTIX_DELIVERY_CHAOS_SEEDS is a number")
            });
            (1..=count).collect()
        }
    };
    let (mut producer_faults, mut consumer_faults) = (0u64, 0u64);
    for &seed in &seeds {
        match run(seed).await {
            Ok((p, c)) => {
                producer_faults += p;
                consumer_faults += c;
            }
            Err(broken) => {
                panic!("seed {seed}: {broken} (rerun: ACTIX_DELIVERY_CHAOS_SEED={seed})")
            }
        }
    }
    // The fault injector injected: the runs are not vacuous.
    if seeds.len() >= 100 {
        assert!(
            producer_faults > 50,
            "producer journal faults: {producer_faults}"
        );
        assert!(
            consumer_faults > 20,
            "ledger journal faults: {consumer_faults}"
        );
    }
}
