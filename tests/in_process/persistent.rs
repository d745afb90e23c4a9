//! The PersistentActor and the effectively-once consumer over a MemoryJournal, under virtual
//! time: replies after the commit, batching, recovery, fail-stop, crashes at every step, and
//! two instances of one entity.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId};
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, Execute, Outcome, PersistentConfig,
    PersistentHandle, PersistentOptions,
};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryInfo, Failure, IncarnationId,
    ProducerId, ProducerOptions, ReliableDelivery, ReplyTo, StartError,
};
use common::journals::SlowRecovery;
use common::{settle, settle_for};
use serde::{Deserialize, Serialize};

/// A ledger of transfers: each applied once, counted per transfer id.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
    total: i64,
}

#[derive(Debug)]
enum Op {
    Apply { id: u64, amount: i64 },
    Total,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied {
    id: u64,
    amount: i64,
}

impl EventSourced for Ledger {
    type Command = Op;
    type Event = Applied;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
        match *command {
            Op::Apply { amount, .. } if amount < 0 => Err("negative amount".into()),
            Op::Apply { id, amount } => Ok(Decision::persist(
                [Applied { id, amount }],
                self.total + amount,
            )),
            Op::Total => Ok(Decision::reply(self.total)),
        }
    }

    fn apply(&mut self, event: &Applied) {
        *self.applied.entry(event.id).or_default() += 1;
        self.total += event.amount;
    }
}

fn id() -> PersistenceId {
    PersistenceId::new("ledger-1").unwrap()
}

fn start(journal: &MemoryJournal, config: PersistentConfig) -> PersistentHandle<Ledger> {
    PersistentHandle::start(PersistentOptions::new(Arc::new(journal.clone()), id()).config(config))
        .unwrap()
}

fn apply(id: u64) -> Op {
    Op::Apply { id, amount: 1 }
}

async fn durable(journal: &MemoryJournal) -> Ledger {
    recover_state::<Ledger>(journal, &id()).await.unwrap()
}

/// Every id in `ids` applied exactly once, nothing else.
fn assert_exactly_once(ledger: &Ledger, ids: impl IntoIterator<Item = u64>) {
    let expected: BTreeMap<u64, u32> = ids.into_iter().map(|id| (id, 1)).collect();
    assert_eq!(ledger.applied, expected);
}

#[actix::test]
async fn a_reply_comes_only_after_the_commit() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    assert_eq!(
        ledger.ask(Op::Total).await.unwrap(),
        0,
        "recovered an empty stream"
    );
    journal.faults().hold_commits();
    let pending = actix::spawn(ledger.ask(apply(1)));
    settle_for(60_000).await;
    assert!(!pending.is_finished(), "no reply before the commit");
    assert_eq!(journal.faults().held(), 1);
    journal.faults().release();
    assert_eq!(pending.await.unwrap().unwrap(), 1);
}

#[actix::test]
async fn commands_in_flight_together_share_one_append() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    ledger.ask(Op::Total).await.unwrap();
    let asks: Vec<_> = (0..64).map(|n| ledger.ask(apply(n))).collect();
    let replies = futures_util::future::join_all(asks).await;
    let totals: Vec<i64> = replies.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        totals,
        (1..=64).collect::<Vec<_>>(),
        "replies in command order"
    );
    let stats = journal.stats();
    assert_eq!(
        (stats.commits, stats.events),
        (1, 64),
        "one append, one commit"
    );
    let actor = ledger.stats().await.unwrap();
    assert_eq!((actor.appends, actor.entries, actor.events), (1, 64, 64));
}

#[actix::test]
async fn commands_sent_during_recovery_wait_and_run_in_order_and_a_restart_recovers() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    let asks: Vec<_> = (1..=3).map(|n| ledger.ask(apply(n))).collect();
    let totals: Vec<i64> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(totals, [1, 2, 3]);
    ledger.stop();
    ledger.stopped().await.unwrap();
    assert!(matches!(
        ledger.ask(Op::Total).await,
        Err(CommandError::Stopped)
    ));
    let again = start(&journal, PersistentConfig::default());
    assert_eq!(
        again.ask(Op::Total).await.unwrap(),
        3,
        "state recovered from the journal"
    );
    assert_eq!(
        again.ask(apply(4)).await.unwrap(),
        4,
        "and it continues at the right seq"
    );
}

#[actix::test]
async fn a_rejection_is_the_callers_error_and_stores_nothing() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    let refused = ledger.ask(Op::Apply { id: 1, amount: -5 }).await;
    assert!(matches!(refused, Err(CommandError::Rejected(r)) if r == "negative amount"));
    assert_eq!(journal.stats().events, 0);
}

#[actix::test]
async fn a_failed_append_answers_every_waiting_command_with_the_error_and_stops() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    ledger.ask(apply(1)).await.unwrap();
    journal.faults().fail_nth_append(1);
    let asks: Vec<_> = (2..=5).map(|n| ledger.ask(apply(n))).collect();
    for answer in futures_util::future::join_all(asks).await {
        assert!(
            matches!(answer, Err(CommandError::Journal(_))),
            "{answer:?}"
        );
    }
    // Without a Supervisor the failure ends it, and its handle says so.
    let stopped = ledger.stopped().await;
    assert!(
        matches!(&stopped, Err(Failure::Error(reason)) if reason.contains("storage error")),
        "{stopped:?}"
    );
    assert!(!ledger.addr().connected() || ledger.stats().await.is_err());
    assert_exactly_once(&durable(&journal).await, [1]);
}

#[actix::test]
async fn under_a_supervisor_a_failed_append_restarts_the_actor_on_the_durable_state() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(journal.clone()), id()).supervised(),
    )
    .unwrap();
    ledger.ask(apply(1)).await.unwrap();
    // Crash before the commit: the held append is lost.
    journal.faults().hold_commits();
    let lost = actix::spawn(ledger.ask(apply(2)));
    settle().await;
    journal.faults().crash();
    assert!(matches!(lost.await.unwrap(), Err(CommandError::Journal(_))));
    // The restarted actor recovered what is durable: 1, not 2.
    assert_eq!(ledger.ask(Op::Total).await.unwrap(), 1);
    assert_eq!(ledger.ask(apply(3)).await.unwrap(), 2);
    assert_exactly_once(&durable(&journal).await, [1, 3]);
    let stats = ledger.stats().await.unwrap();
    assert_eq!(stats.recoveries, 1, "counters restart with the actor");
}

/// An entity is opened once it recovered, at once afterwards; a stop it was asked for is `Ok`.
#[actix::test]
async fn opened_resolves_once_the_entity_recovered_and_a_requested_stop_is_ok() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    start(&journal, PersistentConfig::default())
        .ask(apply(1))
        .await
        .unwrap();
    let slow = SlowRecovery::new(journal.clone());
    slow.hold_next();
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(Arc::new(slow.clone()), id()))
            .unwrap();
    let opened = actix::spawn(ledger.opened());
    settle_for(5_000).await;
    assert!(!opened.is_finished(), "not opened while recovering");
    slow.release();
    assert_eq!(opened.await.unwrap(), Ok(()));
    assert_eq!(ledger.stats().await.unwrap().recoveries, 1, "recovered");
    assert_eq!(ledger.opened().await, Ok(()), "at once afterwards");
    ledger.stop();
    assert_eq!(ledger.stopped().await, Ok(()));
}

#[actix::test]
async fn a_corrupt_stream_fails_recovery_naming_stream_and_seq_and_stops_for_good() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    journal
        .append_as(&id(), 1, vec![vec![1, 0xff]], Manifest::legacy())
        .await
        .unwrap();
    let ledger = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(journal.clone()), id()).supervised(),
    )
    .unwrap();
    let answer = ledger.ask(Op::Total).await;
    let Err(CommandError::Recovery(error)) = answer else {
        panic!("expected a recovery error, got {answer:?}");
    };
    assert!(
        error.to_string().contains("stream `ledger-1`, seq 1"),
        "{error}"
    );
    // No restart loop: corrupt data stays corrupt, and the handle says so.
    let stopped = ledger.stopped().await.unwrap_err();
    assert!(
        stopped.to_string().contains("stream `ledger-1`, seq 1"),
        "{stopped}"
    );
    assert_eq!(ledger.opened().await, Err(StartError::Failed(stopped)));
    assert!(matches!(
        ledger.ask(Op::Total).await,
        Err(CommandError::Stopped)
    ));
}

/// Recovery reads the snapshot again when the entries after it are missing (another writer may
/// have compacted the stream meanwhile), but a gap that the current snapshot does not explain
/// is corruption, reported at once.
#[actix::test]
async fn events_missing_with_no_newer_snapshot_are_corrupt() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    for n in 1..=3 {
        ledger.ask(apply(n)).await.unwrap();
    }
    journal.delete_to(&id(), 2).await.unwrap(); // no snapshot covers 1..=2
    let error = recover_state::<Ledger>(&journal, &id()).await.unwrap_err();
    assert!(
        error.to_string().contains("stream `ledger-1`, seq 1")
            && error.to_string().contains("missing"),
        "{error}"
    );
}

#[actix::test]
async fn snapshots_keep_recovery_and_the_journal_small_and_a_lost_snapshot_costs_nothing() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let config = PersistentConfig {
        snapshot_every: Some(10),
        delete_events_on_snapshot: true,
        ..Default::default()
    };
    let ledger = start(&journal, config.clone());
    for n in 1..=25 {
        ledger.ask(apply(n)).await.unwrap();
    }
    settle().await;
    assert_eq!(ledger.stats().await.unwrap().snapshots, 2);
    let snapshot = journal.load_snapshot(&id()).await.unwrap().unwrap();
    assert_eq!(snapshot.seq, 20);
    let kept = journal.replay(&id(), 1, u64::MAX, 100).await.unwrap();
    assert_eq!(
        kept.first().map(|e| e.seq),
        Some(21),
        "covered events deleted"
    );
    assert_eq!(journal.highest_seq(&id()).await.unwrap(), 25);
    ledger.stop();
    ledger.stopped().await.unwrap();
    let again = start(&journal, config.clone());
    assert_eq!(again.ask(Op::Total).await.unwrap(), 25);
    assert_exactly_once(&durable(&journal).await, 1..=25);
    // Stopped right after a commit, before its snapshot was saved: the events are replayed.
    for n in 26..=30 {
        again.ask(apply(n)).await.unwrap();
    }
    again.stop();
    again.stopped().await.unwrap();
    assert_eq!(journal.load_snapshot(&id()).await.unwrap().unwrap().seq, 30);
    let third = start(&journal, config);
    assert_eq!(third.ask(Op::Total).await.unwrap(), 30);
}

/// A delivery's info as a consumer would report it.
fn info(seq: u64) -> DeliveryInfo {
    DeliveryInfo {
        producer_id: ProducerId::from("p"),
        incarnation: IncarnationId::from_u128(1),
        seq,
        window_start: 1,
        trace_context: None,
        first_seq: None,
    }
}

#[actix::test]
async fn two_instances_racing_over_the_same_deliveries_store_each_event_once() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let first = start(&journal, PersistentConfig::default());
    let second = start(&journal, PersistentConfig::default());
    // Both have recovered the empty stream before the deliveries come.
    first.ask(Op::Total).await.unwrap();
    second.ask(Op::Total).await.unwrap();
    let mut asks = Vec::new();
    for seq in 1..=200u64 {
        // Both get every delivery, in different orders of arrival.
        asks.push(first.ask_delivered(info(seq), apply(seq)));
        asks.push(second.ask_delivered(info(201 - seq), apply(201 - seq)));
    }
    let answers = futures_util::future::join_all(asks).await;
    let mut done = 0;
    for answer in answers {
        match answer {
            Ok(Outcome::Done(_)) => done += 1,
            Ok(Outcome::AlreadyProcessed) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(done, 200, "each delivery decided once in effect");
    assert_exactly_once(&durable(&journal).await, 1..=200);
    let conflicts =
        first.stats().await.unwrap().conflicts + second.stats().await.unwrap().conflicts;
    assert!(conflicts > 0, "the instances really raced");
}

/// A consumer whose handler hands each message to `ledger`.
fn effectively_once_consumer(ledger: &PersistentHandle<Ledger>) -> ConsumerHandle<u64> {
    let handler = ledger.delivery_handler(apply);
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
}

#[actix::test]
async fn the_effectively_once_consumer_survives_crashes_at_every_step() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let faults = journal.faults();
    let mut ledger = start(&journal, PersistentConfig::default());
    let consumer = Arc::new(Mutex::new(effectively_once_consumer(&ledger)));
    // The producer outlives the consumer's crashes; its link always reaches the current
    // consumer, and can lose every ACK for a while.
    let lose_acks = Arc::new(AtomicBool::new(false));
    let (target, lose) = (consumer.clone(), lose_acks.clone());
    let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<u64>>| {
        let lost = ReplyTo::from_fn(|_| ());
        let deliveries = deliveries.into_iter().map(|mut d| {
            if lose.load(Ordering::SeqCst) {
                d.reply_to = Some(lost.clone());
            }
            d
        });
        target
            .lock()
            .unwrap()
            .consumer_ref()
            .do_send_all(deliveries);
    });
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(link)
            .producer_id("p")
            .window_size(8)
            .resend_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    let confirmations = common::Confirmations::default();
    let tell = |range: std::ops::RangeInclusive<u64>| {
        for n in range {
            producer
                .tell(n, common::confirm_into(&confirmations, n))
                .unwrap();
        }
    };
    let crash = |ledger: &mut PersistentHandle<Ledger>| {
        // The process dies: consumer (with its in-memory dedup) and entity are gone, and what
        // the journal had not committed is lost.
        consumer.lock().unwrap().stop();
        ledger.stop();
        faults.crash();
        *ledger = start(&journal, PersistentConfig::default());
        *consumer.lock().unwrap() = effectively_once_consumer(ledger);
    };
    tell(1..=20);
    producer.idle().await;
    // 1. Before the commit: appends are held, then lost with the process.
    faults.hold_commits();
    tell(21..=40);
    settle_for(50).await;
    assert!(faults.held() > 0, "an append was waiting for its commit");
    crash(&mut ledger);
    // 2. After the commit, before the ACK: commits happen, their ACKs are lost.
    lose_acks.store(true, Ordering::SeqCst);
    settle_for(300).await;
    let committed = durable(&journal).await.applied.len();
    assert!(
        committed > confirmations.len(),
        "committed messages whose ACK never arrived"
    );
    crash(&mut ledger);
    lose_acks.store(false, Ordering::SeqCst);
    // 3. During recovery: a new entity is crashed before it could recover.
    tell(41..=100);
    crash(&mut ledger);
    producer.idle().await;
    let confirmed = confirmations.snapshot();
    assert_eq!(confirmed.len(), 100);
    assert!(confirmed.iter().all(|(_, r)| r.is_ok()));
    assert_exactly_once(&durable(&journal).await, 1..=100);
    let stats = ledger.stats().await.unwrap();
    assert!(
        stats.duplicates > 0,
        "retransmissions of committed messages were answered from the recovered record"
    );
}

#[actix::test]
async fn a_plain_execute_message_works_through_the_address() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    let reply = ledger.addr().send(Execute::new(apply(9))).await.unwrap();
    assert_eq!(reply.unwrap(), Outcome::Done(1));
}

/// Dropping every handle lets the actor finish what it decided (the reply to a command whose
/// append is in flight comes after its commit), then stop for good and free itself.
#[actix::test]
async fn the_last_handle_dropped_stops_the_actor_after_what_it_decided() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    ledger.ask(Op::Total).await.unwrap();
    journal.faults().hold_commits();
    // Through the address: an ask would keep the actor running by itself.
    let pending = actix::spawn(ledger.addr().send(Execute::new(apply(1))));
    settle().await;
    assert_eq!(journal.faults().held(), 1);
    let weak = ledger.addr().downgrade();
    let stopped = actix::spawn(ledger.stopped());
    drop(ledger);
    settle_for(60_000).await;
    assert!(
        !stopped.is_finished(),
        "the command in flight waits for its commit"
    );
    journal.faults().release();
    assert_eq!(pending.await.unwrap().unwrap().unwrap(), Outcome::Done(1));
    assert_eq!(
        stopped.await.unwrap(),
        Ok(()),
        "left by its handles: no failure"
    );
    settle().await;
    assert!(weak.upgrade().is_none(), "the actor is freed");
    assert_exactly_once(&durable(&journal).await, [1]);
}

/// What counts as a handle: a clone inside a delivery handler keeps the entity running for its
/// consumer; a handle made with `new` does not own the actor.
#[actix::test]
async fn a_delivery_handler_keeps_the_entity_and_a_handle_from_new_does_not_own_it() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = start(&journal, PersistentConfig::default());
    let consumer = effectively_once_consumer(&ledger);
    let weak = ledger.addr().downgrade();
    drop(ledger);
    settle_for(60_000).await;
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.consumer_ref())
            .producer_id("p")
            .build()
            .unwrap(),
    );
    producer.send(7).await.unwrap();
    assert_exactly_once(&durable(&journal).await, [7]);
    consumer.stop();
    consumer.stopped().await;
    settle_for(60_000).await;
    assert!(
        weak.upgrade().is_none(),
        "the consumer's handler was the last handle"
    );

    let owner = start(&journal, PersistentConfig::default());
    let borrowed = PersistentHandle::new(owner.addr().clone());
    drop(borrowed);
    settle_for(60_000).await;
    assert_eq!(owner.ask(Op::Total).await.unwrap(), 1);
}

#[actix::test]
async fn asks_are_queued_when_called_so_commands_awaited_in_turn_share_appends() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let id = PersistenceId::new("asked-in-turn").unwrap();
    let ledger = PersistentHandle::<common::entities::Ledger>::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        id,
    ))
    .unwrap();
    ledger.ask(common::entities::Op::Total).await.unwrap(); // recovered
    let before = journal.stats().appends;
    // Far more than the mailbox's capacity (16), created first and awaited one by one.
    let asks: Vec<_> = (0..1_000)
        .map(|n| ledger.ask(common::entities::Op::Apply(n)))
        .collect();
    for (n, ask) in asks.into_iter().enumerate() {
        assert_eq!(ask.await.unwrap(), n as i64 + 1);
    }
    let appends = journal.stats().appends - before;
    assert!(appends <= 3, "1 000 commands in {appends} appends");
}
