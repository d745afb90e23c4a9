//! Durable producers over a MemoryJournal, under virtual time: write-ahead, batching of stores
//! and settlement records, resuming a stream (same incarnation, same seqs), compaction, the
//! fence against a second producer, and journal failures (over SQLite: with their cause).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::codec::Manifest;
use actix_delivery::durable::{DurableOptions, MessageId};
use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot, SqliteJournal,
    StoredEvent,
};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryError, DeliveryHandler,
    Failure, ProducerHandle, ProducerOptions, ReliableDelivery, StartError,
};
use common::{settle, settle_for, Log, Sink};

fn stream() -> PersistenceId {
    PersistenceId::new("orders-out").unwrap()
}

/// A consumer recording each body its handler runs for.
fn consumer() -> (ConsumerHandle<u32>, Log<u32>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// A link to `consumer` that can be cut (deliveries lost) and records what passes.
fn link(consumer: &ConsumerHandle<u32>) -> (ConsumerRef<u32>, Arc<AtomicBool>, Log<(u128, u64)>) {
    let cut = Arc::new(AtomicBool::new(false));
    let seen = Log::default();
    let (target, is_cut, log) = (consumer.consumer_ref(), cut.clone(), seen.clone());
    let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<u32>>| {
        for d in &deliveries {
            log.push((d.incarnation.as_u128(), d.seq));
        }
        if !is_cut.load(Ordering::SeqCst) {
            target.do_send_all(deliveries.into_iter());
        }
    });
    (link, cut, seen)
}

fn durable_producer(
    journal: &MemoryJournal,
    to: ConsumerRef<u32>,
    configure: impl FnOnce(DurableOptions<u32>) -> DurableOptions<u32>,
) -> ProducerHandle<u32> {
    let options = ProducerOptions::builder(to)
        .producer_id("orders")
        .window_size(4)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = configure(DurableOptions::new(
        Arc::new(journal.clone()),
        stream(),
        "orders",
    ));
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

#[actix::test]
async fn a_message_is_stored_before_it_is_sent_and_a_burst_is_one_append() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let (to, _, seen) = link(&consumer);
    let producer = durable_producer(&journal, to, |d| d);
    settle().await; // the stream is open
    let opened = journal.stats();
    journal.faults().hold_commits();
    for body in 1..=10 {
        producer.tell(body, |_| ()).unwrap();
    }
    settle_for(10_000).await;
    assert!(
        seen.snapshot().is_empty(),
        "nothing sent before the store committed"
    );
    assert_eq!(journal.faults().held(), 1, "ten tells, one append");
    journal.faults().release();
    producer.idle().await;
    assert_eq!(handled.snapshot(), (1..=10).collect::<Vec<_>>());
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.stored, stats.confirmed), (10, 10));
    let appends = journal.stats().appends - opened.appends;
    assert!(
        appends <= 4,
        "one store, settlements in a few batches: {appends}"
    );
}

#[actix::test]
async fn store_resolves_when_stored_and_confirmed_when_the_settlement_is_recorded() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    let stored = producer.store(7).await.unwrap();
    assert_eq!(stored.id, MessageId(1));
    assert_eq!(stored.confirmed().await, Ok(()));
    assert_eq!(handled.snapshot(), [7]);
    let plain = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
    assert_eq!(plain.store(1).await.unwrap_err(), DeliveryError::NotDurable);
}

#[actix::test]
async fn a_restarted_producer_keeps_its_incarnation_and_resends_what_is_unsettled_under_the_same_seqs(
) {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let (to, cut, seen) = link(&consumer);
    let first = durable_producer(&journal, to.clone(), |d| d);
    first.send(1).await.unwrap();
    cut.store(true, Ordering::SeqCst); // the consumer is unreachable
    for body in 2..=6 {
        first.store(body).await.unwrap();
    }
    first.stop();
    first.stopped().await.unwrap(); // a crash would do the same: nothing unsettled is lost
    let before = seen.snapshot();
    let incarnation = before[0].0;
    cut.store(false, Ordering::SeqCst);
    let sunk = Log::default();
    let sink = Sink(sunk.clone()).start();
    let second = durable_producer(&journal, to, |d| d.confirmations(sink.recipient()));
    second.idle().await;
    settle().await;
    let after: Vec<(u128, u64)> = seen.snapshot()[before.len()..].to_vec();
    assert!(
        after.iter().all(|&(i, _)| i == incarnation),
        "the same incarnation"
    );
    let mut resent: Vec<u64> = after.iter().map(|&(_, seq)| seq).collect();
    resent.dedup();
    assert_eq!(
        resent,
        [2, 3, 4, 5, 6],
        "under their original seqs, in order"
    );
    assert_eq!(handled.snapshot(), [1, 2, 3, 4, 5, 6]);
    let mut ids: Vec<u64> = sunk.snapshot().iter().map(|c| c.id.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, [2, 3, 4, 5, 6], "their confirmations reach the sink");
    let stats = second.stats().await.unwrap();
    assert_eq!((stats.resumed, stats.resumed_confirmed), (5, 5));
    // It continues the seq.
    second.send(7).await.unwrap();
    assert_eq!(seen.snapshot().last().map(|&(_, seq)| seq), Some(7));
}

#[actix::test]
async fn a_consumer_that_lived_through_the_crash_recognises_what_it_handled() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    // The consumer handles everything, but no ACK comes back.
    let target = consumer.consumer_ref();
    let lost_acks = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<u32>>| {
        let nowhere = actix_delivery::ReplyTo::from_fn(|_| ());
        target.do_send_all(deliveries.into_iter().map(|mut d| {
            d.reply_to = Some(nowhere.clone());
            d
        }));
    });
    let first = durable_producer(&journal, lost_acks, |d| d);
    for body in 1..=3 {
        first.store(body).await.unwrap();
    }
    settle_for(50).await;
    first.stop();
    first.stopped().await.unwrap();
    assert_eq!(handled.snapshot(), [1, 2, 3]);
    let second = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    second.idle().await;
    assert_eq!(
        handled.snapshot(),
        [1, 2, 3],
        "recognised as duplicates, not run again"
    );
    assert_eq!(consumer.stats().await.unwrap().duplicates, 3);
}

#[actix::test]
async fn starting_on_an_empty_or_fully_settled_stream_just_works() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    for round in 0..3 {
        let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d);
        producer.idle().await;
        assert_eq!(producer.stats().await.unwrap().resumed, 0, "round {round}");
        producer.send(round).await.unwrap();
        producer.stop();
        producer.stopped().await.unwrap();
    }
    assert_eq!(handled.snapshot(), [0, 1, 2]);
}

/// Two producers open one stream at once: the journal's fence orders the openings, the later
/// one owns the stream, and the other is refused clearly at its first write and stays stopped.
#[actix::test]
async fn of_two_producers_opening_one_stream_the_newest_owns_it_and_the_other_stops() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let first = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    let second = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    settle().await;
    let refused = first.send(1).await;
    let Err(DeliveryError::Storage(reason)) = refused else {
        panic!("expected a storage error, got {refused:?}");
    };
    assert!(
        reason.contains("stream `orders-out`")
            && reason.contains("the newest opener owns the stream"),
        "{reason}"
    );
    let stopped = tokio::time::timeout(Duration::from_secs(10), first.stopped())
        .await
        .expect("stopped for good, not restarted");
    assert!(
        matches!(&stopped, Err(Failure::TakenOver(reason)) if reason.contains("the newest opener owns the stream")),
        "{stopped:?}"
    );
    second.send(2).await.unwrap();
    assert_eq!(handled.snapshot(), [2]);
    let takeovers = second.stats().await.unwrap().takeovers;
    assert_eq!(takeovers, 1, "the second opening took the stream over");
}

/// With a lease a second instance does not take a stream over from a live owner, even an
/// idle one (it renews the lease); a start after the owner is gone opens it after one lease.
#[actix::test]
async fn with_a_lease_a_live_owner_keeps_its_stream_and_a_gone_ones_is_taken_after_one_lease() {
    tokio::time::pause();
    const LEASE: Duration = Duration::from_secs(3);
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let first = durable_producer(&journal, consumer.consumer_ref(), |d| d.lease(LEASE));
    assert_eq!(
        first.opened().await,
        Ok(()),
        "a new stream: nothing to watch"
    );
    first.send(1).await.unwrap();
    let written = journal.stats().appends;
    settle_for(3_100).await;
    let renewals = journal.stats().appends - written;
    assert_eq!(renewals, 3, "an idle owner writes every third of its lease");

    let second = durable_producer(&journal, consumer.consumer_ref(), |d| d.lease(LEASE));
    let opened = actix::spawn(second.opened());
    settle_for(2_900).await;
    assert!(!opened.is_finished(), "it watches the stream for a lease");
    settle_for(200).await;
    let opened = opened.await.unwrap();
    let Err(StartError::Failed(Failure::InUse(reason))) = &opened else {
        panic!("{opened:?}");
    };
    assert!(
        reason.contains("stream `orders-out`: another producer wrote to it within the lease"),
        "{reason}"
    );
    first.send(2).await.unwrap();
    assert_eq!(first.stats().await.unwrap().takeovers, 0);

    // The owner is gone (stopped here; a crashed one writes nothing either): the next start
    // opens the stream once it watched it for a lease, and no sooner.
    first.stop();
    first.stopped().await.unwrap();
    let third = durable_producer(&journal, consumer.consumer_ref(), |d| d.lease(LEASE));
    third.tell(3, |_| ()).unwrap();
    let opened = actix::spawn(third.opened());
    settle_for(2_900).await;
    assert!(!opened.is_finished(), "it watches the stream for a lease");
    settle_for(200).await;
    assert_eq!(opened.await.unwrap(), Ok(()));
    third.idle().await;
    assert_eq!(third.stats().await.unwrap().takeovers, 1);
    assert_eq!(handled.snapshot(), [1, 2, 3]);
}

#[actix::test]
async fn settled_messages_are_compacted_away() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d.snapshot_every(10));
    for body in 0..500 {
        producer.send(body).await.unwrap();
    }
    settle().await;
    let highest = journal.highest_seq(&stream()).await.unwrap();
    let kept = journal
        .replay(&stream(), 1, u64::MAX, 10_000)
        .await
        .unwrap();
    let snapshot = journal.load_snapshot(&stream()).await.unwrap().unwrap();
    assert!(highest >= 500, "{highest} writes");
    assert!(
        kept.len() <= 10,
        "{} writes kept after the snapshot",
        kept.len()
    );
    assert!(
        snapshot.payload.len() < 200,
        "nothing unsettled in it: {} bytes",
        snapshot.payload.len()
    );
}

#[actix::test]
async fn a_failed_store_reaches_the_caller_and_the_restarted_producer_resumes() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    producer.send(1).await.unwrap();
    journal.faults().fail_nth_append(1);
    // The supervisor restarts it; the journal it reads again settles the store's outcome.
    match producer.send(2).await {
        Err(DeliveryError::Storage(reason)) => {
            assert!(
                reason.contains("stream `orders-out`") && reason.contains("it was not stored"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    producer.send(3).await.unwrap();
    assert_eq!(handled.snapshot(), [1, 3], "2 was never stored, never sent");
}

/// A journal failure reaches the log and the caller with its cause: a durable producer
/// (told to stop at the first failure) whose SQLite journal refuses its store
/// (a trigger) logs why it stops down to SQLite's result code, and the store's caller hears
/// the same in `InDoubt`. Before, both said only the trigger's message.
#[actix::test]
async fn a_journal_failure_reaches_the_log_and_the_caller_with_its_cause() {
    common::logs::keep();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = SqliteJournal::open(&path).await.unwrap();
    let (consumer, handled) = consumer();
    let options = ProducerOptions::builder(&consumer).build().unwrap();
    let durable =
        DurableOptions::new(Arc::new(journal), stream(), "causes").stop_on_journal_failure();
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    producer.store(1).await.unwrap().confirmed().await.unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER quota BEFORE INSERT ON event_buffer \
             BEGIN SELECT RAISE(ABORT, 'quota exceeded'); END",
        )
        .unwrap();
    let error = producer.store(2).await.unwrap_err();
    let cause = "storage error on stream `orders-out`: quota exceeded: Error code 1811: \
                 constraint failed";
    assert!(matches!(error, DeliveryError::InDoubt(_)), "{error:?}");
    assert!(error.to_string().contains(cause), "{error}");
    let logged = common::logs::lines_containing(&[
        "durable producer `causes` stops: its journal failed: stream `orders-out`",
        cause,
    ]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(handled.snapshot(), [1]);
}

/// After a journal failure a durable producer restarts (its supervisor) on what the journal
/// holds and stores again; one told to `stop_on_journal_failure` stops for good instead, and
/// `stopped()` says why.
#[actix::test]
async fn a_durable_producer_restarts_after_a_journal_failure_unless_told_to_stop() {
    tokio::time::pause();
    for stop in [false, true] {
        let journal = MemoryJournal::new();
        let (consumer, handled) = consumer();
        let options = ProducerOptions::builder(&consumer).build().unwrap();
        let mut durable = DurableOptions::new(Arc::new(journal.clone()), stream(), "restarts");
        if stop {
            durable = durable.stop_on_journal_failure();
        }
        let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
        producer.opened().await.unwrap();
        journal.faults().fail_nth_append(1);
        let failed = producer.store(1).await;
        assert!(failed.is_err(), "stop {stop}: {failed:?}");
        let stopped = tokio::time::timeout(Duration::from_secs(60), producer.stopped()).await;
        if stop {
            assert!(matches!(stopped, Ok(Err(Failure::Error(_)))), "{stopped:?}");
        } else {
            assert!(stopped.is_err(), "supervised, it runs on: {stopped:?}");
            producer.store(2).await.unwrap().confirmed().await.unwrap();
            assert_eq!(handled.snapshot(), [2], "1 was never stored");
        }
    }
}

#[actix::test]
async fn a_stream_of_another_producer_id_stops_the_producer_for_good() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    durable_producer(&journal, consumer.consumer_ref(), |d| d)
        .send(1)
        .await
        .unwrap();
    let options = ProducerOptions::builder(&consumer)
        .producer_id("invoices")
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), stream(), "invoices");
    let other = ReliableDelivery::durable_producer(options, durable).unwrap();
    match other.send(2).await {
        Err(DeliveryError::Storage(reason)) => assert!(
            reason.contains("the stream belongs to producer `orders`, not `invoices`"),
            "{reason}"
        ),
        refused => panic!("{refused:?}"),
    }
    let stopped = tokio::time::timeout(Duration::from_secs(10), other.stopped())
        .await
        .expect("stopped for good: restarting cannot help");
    let expected = "stream `orders-out`: the stream belongs to producer `orders`, not `invoices`";
    assert_eq!(stopped, Err(Failure::Error(expected.into())));
    assert_eq!(
        other.opened().await,
        Err(StartError::Failed(Failure::Error(expected.into()))),
        "it never opened, and says why"
    );
}

/// What the handle says of the start: a durable producer is opened once its stream is open
/// (not when it is started), a producer without a journal at once; a stop asked for is `Ok`.
#[actix::test]
async fn opened_resolves_once_the_stream_is_open_and_stopped_says_a_requested_stop_is_ok() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    let plain = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
    assert_eq!(plain.opened().await, Ok(()), "nothing to open");
    journal.faults().hold_commits(); // the opening's write waits
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    let opened = actix::spawn(producer.opened());
    settle_for(5_000).await;
    assert!(
        !opened.is_finished(),
        "not open before its opening committed"
    );
    assert_eq!(producer.stats().await.unwrap().next_message_id, 0);
    journal.faults().release();
    assert_eq!(opened.await.unwrap(), Ok(()));
    assert_eq!(producer.stats().await.unwrap().next_message_id, 1, "open");
    producer.stop();
    assert_eq!(
        producer.stopped().await,
        Ok(()),
        "asked to stop: no failure"
    );
    assert_eq!(producer.opened().await, Ok(()), "it did open");
}

/// A producer stopped while its opening waits for the journal never opened, and says so.
#[actix::test]
async fn a_producer_stopped_before_its_stream_opened_says_it_was_stopped() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    journal.faults().hold_commits();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| {
        d.stop_timeout(Duration::from_secs(1))
    });
    settle().await;
    producer.stop();
    settle_for(2_000).await; // past the stop timeout: the opening is left unanswered
    assert_eq!(producer.opened().await, Err(StartError::Stopped));
    assert_eq!(producer.stopped().await, Ok(()));
    journal.faults().release();
}

/// The service: a durable work-pulling producer renamed from `orders-api` to
/// `orders-service` started on its old stream. The start returns `Ok` (opening is
/// asynchronous), and `opened()` says why the stream did not open.
#[actix::test]
async fn a_renamed_durable_work_pulling_producer_says_at_opened_whose_stream_it_is() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    let old = ProducerOptions::builder(&consumer).build().unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), stream(), "orders-api");
    let old = ReliableDelivery::durable_producer(old, durable).unwrap();
    old.send(1).await.unwrap();
    old.stop();
    old.stopped().await.unwrap();
    let registry = actix_delivery::work_pulling::WorkerRegistry::<u32>::new();
    let options = actix_delivery::work_pulling::WorkPullingOptions::builder(&registry)
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), stream(), "orders-service");
    let renamed = ReliableDelivery::durable_work_pulling_producer(options, durable)
        .expect("the start does not open the stream");
    let why = "stream `orders-out`: the stream belongs to producer `orders-api`, not \
               `orders-service`";
    assert_eq!(
        renamed.opened().await,
        Err(StartError::Failed(Failure::Error(why.into())))
    );
    assert_eq!(renamed.stopped().await, Err(Failure::Error(why.into())));
    assert_eq!(
        renamed.send(2).await,
        Err(DeliveryError::ProducerStopped),
        "stopped for good"
    );
}

/// A journal whose every operation fails, counting them.
#[derive(Clone, Default)]
struct Broken(Arc<AtomicU64>);

impl Broken {
    fn fail<T: Send + 'static>(&self) -> JournalFuture<'_, T> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Err(JournalError::Storage {
                persistence_id: None,
                message: "the disk is gone".into(),
            })
        })
    }
}

impl Journal for Broken {
    fn append_as(
        &self,
        _: &PersistenceId,
        _: u64,
        _: Vec<Vec<u8>>,
        _: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.fail()
    }
    fn replay(
        &self,
        _: &PersistenceId,
        _: u64,
        _: u64,
        _: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.fail()
    }
    fn highest_seq(&self, _: &PersistenceId) -> JournalFuture<'_, u64> {
        self.fail()
    }
    fn delete_to(&self, _: &PersistenceId, _: u64) -> JournalFuture<'_, ()> {
        self.fail()
    }
    fn save_snapshot(&self, _: &PersistenceId, _: Snapshot) -> JournalFuture<'_, ()> {
        self.fail()
    }
    fn load_snapshot(&self, _: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.fail()
    }
}

#[actix::test]
async fn restarts_on_a_failing_journal_back_off() {
    tokio::time::pause();
    let broken = Broken::default();
    let (consumer, _) = consumer();
    let options = ProducerOptions::builder(&consumer)
        .producer_id("orders")
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(broken.clone()), stream(), "orders");
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    let refused = producer.send(1).await;
    assert!(
        matches!(refused, Err(DeliveryError::Storage(_))),
        "{refused:?}"
    );
    settle_for(60_000).await;
    let calls = broken.0.load(Ordering::SeqCst);
    // 100 ms doubling to 10 s: about 12 opens in a minute (each one failed recovery read).
    assert!(
        (5..=20).contains(&calls),
        "{calls} journal calls in a minute"
    );
}

#[actix::test]
async fn a_durable_producer_takes_its_id_from_its_stream_and_refuses_invalid_settings() {
    let journal = MemoryJournal::new();
    let (consumer, _) = consumer();
    let unnamed = || ProducerOptions::builder(&consumer).build().unwrap();
    let durable = || DurableOptions::new(Arc::new(journal.clone()), stream(), "orders");
    let producer = ReliableDelivery::durable_producer(unnamed(), durable()).unwrap();
    assert_eq!(producer.producer_id().as_str(), "orders", "the stream's id");
    producer.stop();
    producer.stopped().await.unwrap();
    let other = ProducerOptions::builder(&consumer)
        .producer_id("invoices")
        .build()
        .unwrap();
    let error = ReliableDelivery::durable_producer(other, durable()).unwrap_err();
    assert_eq!(error.field, "producer_id");
    assert!(error.reason.contains("`invoices`"), "{error}");
    let invalid = [
        (durable().stop_timeout(Duration::ZERO), "stop_timeout_ms"),
        (durable().snapshot_every(0), "snapshot_every"),
        (durable().message_version(0), "message_version"),
        (
            DurableOptions::new(Arc::new(journal.clone()), stream(), ""),
            "producer_id",
        ),
    ];
    for (durable, field) in invalid {
        let error = ReliableDelivery::durable_producer(unnamed(), durable).unwrap_err();
        assert_eq!(error.field, field, "{error}");
    }
}

#[actix::test]
async fn a_crash_before_settlements_are_recorded_resends_without_being_refused_as_stale() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let (to, cut, _) = link(&consumer);
    let producer = durable_producer(&journal, to, |d| d);
    cut.store(true, Ordering::SeqCst);
    let mut stored = Vec::new();
    for body in 1..=8 {
        stored.push(producer.store(body).await.unwrap());
    }
    // ACKs settle 1..=8 in memory, but their records are held, then lost with the process.
    journal.faults().hold_commits();
    cut.store(false, Ordering::SeqCst);
    settle_for(1_000).await;
    assert_eq!(handled.len(), 8);
    journal.faults().crash();
    for message in stored {
        assert!(
            message.confirmed().await.is_ok(),
            "the consumer did confirm them"
        );
    }
    // The restarted producer resends 1..=8 (unsettled in its journal); the consumer, which
    // lived through it all, must recognise them, not refuse them as stale.
    let idle = tokio::time::timeout(Duration::from_secs(60), producer.idle()).await;
    assert!(
        idle.is_ok(),
        "resends were refused: {:?}",
        producer.stats().await
    );
    assert_eq!(handled.len(), 8, "no handler ran twice");
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.duplicates, stats.stale), (8, 0));
}

#[actix::test]
async fn large_bursts_are_compacted_away_too() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d.snapshot_every(100));
    for round in 0..5 {
        for body in 0..2_000 {
            producer.tell(round * 2_000 + body, |_| ()).unwrap();
        }
        producer.idle().await;
    }
    assert_eq!(handled.len(), 10_000);
    let kept = journal
        .replay(&stream(), 1, u64::MAX, 100_000)
        .await
        .unwrap();
    let bodies: usize = kept.iter().map(|e| e.payload.len()).sum();
    // Without compaction about 118 000 bytes (1 261 writes) stay; with it under 1 000.
    assert!(
        bodies < 10_000,
        "{} writes, {bodies} bytes kept: not compacted",
        kept.len()
    );
}

#[actix::test]
async fn store_timeout_on_a_full_producer_times_out_and_the_message_is_neither_stored_nor_sent() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let (to, cut, _) = link(&consumer);
    let producer = common::durable_u32(&journal, to, 1, 1);
    cut.store(true, Ordering::SeqCst); // nothing is confirmed: room stays taken
    producer.store(1).await.unwrap();
    producer.store(2).await.unwrap();
    let timed_out = actix::spawn(producer.store_timeout(3, Duration::from_secs(1)));
    settle_for(999).await;
    assert!(
        !timed_out.is_finished(),
        "it waits for room until the deadline"
    );
    settle_for(2).await;
    assert_eq!(
        timed_out.await.unwrap().unwrap_err(),
        DeliveryError::Timeout
    );
    cut.store(false, Ordering::SeqCst);
    settle_for(1_000).await;
    producer.idle().await;
    assert_eq!(handled.snapshot(), [1, 2], "never sent");
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.stored, stats.confirmed), (2, 2), "never stored");
    assert_eq!(stats.next_message_id, 3, "no id was given to it");
}

#[actix::test]
async fn store_timeout_with_its_journal_write_in_flight_at_the_deadline_waits_for_the_outcome() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = consumer();
    let producer = durable_producer(&journal, consumer.consumer_ref(), |d| d);
    settle().await; // open
    journal.faults().hold_commits();
    let store = actix::spawn(producer.store_timeout(5, Duration::from_millis(100)));
    settle_for(1_000).await;
    assert_eq!(
        journal.faults().held(),
        1,
        "the store is in flight at the deadline"
    );
    assert!(
        !store.is_finished(),
        "not reported either way before the journal answers"
    );
    journal.faults().release();
    let stored = store
        .await
        .unwrap()
        .expect("it committed: reported stored, not timed out");
    assert_eq!(stored.id, MessageId(1));
    assert_eq!(stored.confirmed().await, Ok(()));
    assert_eq!(handled.snapshot(), [5]);
}

#[actix::test]
async fn store_timeout_on_a_plain_producer_is_not_durable() {
    let (consumer, _) = consumer();
    let plain = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
    let stored = plain.store_timeout(1, Duration::from_secs(1)).await;
    assert_eq!(stored.unwrap_err(), DeliveryError::NotDurable);
}
