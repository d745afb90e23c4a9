//! The delivery record of a persistent entity, which answers a delivery it has seen as a
//! duplicate: a retransmission while the commit is held, a retry of a commit reported failed,
//! and a recovery from a snapshot answer as the full history would, so each event is stored
//! once.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::journal::{Journal, MemoryJournal};
use actix_delivery::persistence::{
    recover_state, CommandError, Outbox, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerOptions, ProducerConfig, ProducerOptions, ReliableDelivery};
use common::entities::{ledger_id, orders_id, Ledger, Op, Orders, Ship};
use common::journals::{Fault, Faulty};
use common::{recording_consumer, settle_for};

/// The effectively-once consumer with a `handler_timeout` shorter than the commit: the consumer
/// abandons the deferred outcome, the producer retransmits, and the second command is answered
/// as a duplicate of the one still in flight (held until its commit): nothing is ACKed before
/// the commit, and each event is stored once.
#[actix::test]
async fn a_delivery_retransmitted_while_its_commit_is_held_is_applied_once() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = PersistentHandle::<Ledger>::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        ledger_id(),
    ))
    .unwrap();
    ledger.ask(Op::Total).await.unwrap();
    let handler = ledger.delivery_handler(Op::Apply);
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(handler)
            .handler_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.consumer_ref())
            .producer_id("p")
            .window_size(4)
            .resend_timeout(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    journal.faults().hold_commits();
    let confirmations = common::Confirmations::default();
    for n in 1..=6u64 {
        producer
            .tell(n, common::confirm_into(&confirmations, n))
            .unwrap();
    }
    settle_for(3_000).await; // many handler timeouts and retransmissions
    assert!(
        confirmations.snapshot().is_empty(),
        "nothing ACKed before the commit"
    );
    journal.faults().release();
    settle_for(3_000).await;
    producer.idle().await;
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    let state = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    let expected: BTreeMap<u64, u32> = (1..=6).map(|n| (n, 1)).collect();
    assert_eq!(state.applied, expected, "each message's event exactly once");
    assert!(ledger.stats().await.unwrap().duplicates > 0);
    assert!(
        consumer.stats().await.unwrap().handler_timeouts > 0,
        "the consumer really abandoned outcomes"
    );
}

/// Recovery from a snapshot plus later entries rebuilds the same delivery record as a
/// full replay, LRU eviction (`max_producers`), incarnations, window starts (stale) and
/// must-follow included: two entities fed the same random deliveries, one snapshotting every
/// 3 events and one never, answer every command alike, before and after restarts.
#[actix::test]
async fn snapshot_recovery_equals_full_replay_for_the_delivery_record() {
    use actix_delivery::persistence::Outcome;
    use actix_delivery::{DeliveryInfo, IncarnationId, ProducerId};
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    tokio::time::pause();
    for (seed, must_follow) in [(1u64, false), (2, true), (3, false), (4, true)] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (with_snapshots, without) = (MemoryJournal::new(), MemoryJournal::new());
        let config = |snapshot_every| PersistentConfig {
            snapshot_every,
            max_producers: 2,
            must_follow,
            ..PersistentConfig::default()
        };
        let start = |journal: &MemoryJournal, every| {
            PersistentHandle::<Ledger>::start(
                PersistentOptions::new(Arc::new(journal.clone()), ledger_id())
                    .config(config(every)),
            )
            .unwrap()
        };
        let mut n = 0u64;
        let mut kinds: BTreeMap<String, u32> = BTreeMap::new();
        for life in 0..4 {
            let a = start(&with_snapshots, Some(3));
            let b = start(&without, None);
            for _ in 0..60 {
                let seq = rng.random_range(1..=8u64);
                let info = DeliveryInfo {
                    producer_id: ProducerId::from(["p", "q", "r"][rng.random_range(0..3)]),
                    incarnation: IncarnationId::from_u128(rng.random_range(1..=2)),
                    seq,
                    window_start: rng.random_range(1..=seq),
                    trace_context: None,
                    first_seq: None,
                };
                n += 1;
                let show = |answer: Result<Outcome<i64>, CommandError<String>>| match answer {
                    Ok(Outcome::Done(_)) => "done".to_string(),
                    Ok(Outcome::AlreadyProcessed) => "duplicate".to_string(),
                    Err(error) => error.to_string(),
                };
                let left = show(a.ask_delivered(info.clone(), Op::Apply(n)).await);
                let right = show(b.ask_delivered(info.clone(), Op::Apply(n)).await);
                assert_eq!(
                    left, right,
                    "seed {seed}, life {life}, command {n}: {info:?}"
                );
                *kinds.entry(left).or_default() += 1;
            }
            a.stop();
            b.stop();
            a.stopped().await.unwrap();
            b.stopped().await.unwrap();
        }
        assert!(with_snapshots
            .load_snapshot(&ledger_id())
            .await
            .unwrap()
            .is_some());
        assert!(kinds.len() >= 3, "seed {seed}: {kinds:?}");
    }
}

/// An append committed but reported failed (fsync error, lost connection after COMMIT):
/// the entity answers the error and restarts on the journal; the retransmission of the same
/// delivery is answered "already processed", never applied twice. And an outbox delivery of
/// that append, which does exist, is sent after the restart.
#[actix::test]
async fn a_commit_reported_failed_is_deduplicated_on_retry_and_its_delivery_sent() {
    use actix_delivery::persistence::Outcome;
    use actix_delivery::{DeliveryInfo, IncarnationId, ProducerId};
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let journal = Faulty::new(memory.clone());
    let ledger = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(journal.clone()), ledger_id()).supervised(),
    )
    .unwrap();
    let info = DeliveryInfo {
        producer_id: ProducerId::from("p"),
        incarnation: IncarnationId::from_u128(9),
        seq: 1,
        window_start: 1,
        trace_context: None,
        first_seq: None,
    };
    journal.arm(Fault::AfterCommit);
    let failed = ledger.ask_delivered(info.clone(), Op::Apply(1)).await;
    assert!(
        matches!(failed, Err(CommandError::Journal(_))),
        "{failed:?}"
    );
    let retried = ledger.ask_delivered(info, Op::Apply(1)).await;
    assert!(
        matches!(retried, Ok(Outcome::AlreadyProcessed)),
        "{retried:?}"
    );
    let state = recover_state::<Ledger>(&memory, &ledger_id())
        .await
        .unwrap();
    assert_eq!(state.total, 1);

    let (consumer, shipped) = recording_consumer::<Ship>();
    let outbox = Outbox::new()
        .destination(
            "shipping",
            consumer.consumer_ref(),
            ProducerConfig::default(),
        )
        .unwrap();
    let orders = PersistentHandle::<Orders>::start(
        PersistentOptions::new(Arc::new(journal.clone()), orders_id())
            .outbox(outbox)
            .supervised(),
    )
    .unwrap();
    journal.arm(Fault::AfterCommit);
    assert!(orders.ask(1).await.is_err());
    settle_for(5_000).await;
    assert_eq!(
        shipped.snapshot(),
        [Ship(1)],
        "its events exist, so it is delivered"
    );
}
