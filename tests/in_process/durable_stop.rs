//! Stopping durable parts gracefully (SPEC §9): `stop()` of a durable producer or a persistent
//! entity finishes the journal writes in flight and records what they decided before the
//! actor stops, so every message's outcome reaches exactly one party: its caller (callback,
//! `store()`, `Stored::confirmed()`) or, after the next start, the sink. A corrupt stream stops
//! its producer for good. Under virtual time, over MemoryJournals.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::codec::Manifest;
use actix_delivery::durable::{DurableConfirmation, DurableOptions, MessageId};
use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId};
use actix_delivery::persistence::{
    Decision, EventSourced, Outbox, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{
    Ack, ConsumerRef, Delivery, DeliveryError, Failure, Happened, ProducerConfig, ProducerHandle,
    ProducerOptions, ReliableDelivery, SingleAck,
};
use common::journals::SlowRecovery;
use common::{recording_consumer, settle, settle_for, Log, Sink};
use serde::{Deserialize, Serialize};

fn stream() -> PersistenceId {
    PersistenceId::new("stop-out").unwrap()
}

/// A link that loses every delivery and records it (so a test can ACK by hand).
fn black_hole<T: Send + 'static>() -> (ConsumerRef<T>, Log<(Ack, u64)>) {
    let seen = Log::default();
    let log = seen.clone();
    let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
        for d in deliveries {
            let ack = Ack {
                producer_id: d.producer_id,
                incarnation: d.incarnation,
                seq: d.seq,
            };
            log.push((ack, d.seq));
        }
    });
    (link, seen)
}

fn durable_producer(
    journal: &dyn Fn() -> Arc<dyn Journal>,
    to: ConsumerRef<u32>,
    configure: impl FnOnce(DurableOptions<u32>) -> DurableOptions<u32>,
) -> ProducerHandle<u32> {
    let options = ProducerOptions::builder(to)
        .producer_id("stopping")
        .window_size(4)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = configure(DurableOptions::new(journal(), stream(), "stopping"));
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

/// The next start of the stream, delivering to a recording consumer, with a sink: what it
/// sends again and what its sink hears, once it is idle.
async fn next_start(journal: &MemoryJournal) -> (Vec<u32>, Vec<DurableConfirmation>) {
    let (consumer, handled) = recording_consumer::<u32>();
    let heard = Log::default();
    let sink = Sink(heard.clone()).start().recipient();
    let memory = journal.clone();
    let producer = durable_producer(
        &move || Arc::new(memory.clone()),
        consumer.consumer_ref(),
        |d| d.confirmations(sink),
    );
    settle().await;
    producer.idle().await;
    settle().await;
    producer.stop();
    producer.stopped().await.unwrap();
    (handled.snapshot(), heard.snapshot())
}

fn memory(journal: &MemoryJournal) -> impl Fn() -> Arc<dyn Journal> + use<> {
    let journal = journal.clone();
    move || Arc::new(journal.clone())
}

#[actix::test]
async fn stop_while_a_store_is_in_flight_reports_it_stored_and_the_next_start_sends_it() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (to, _) = black_hole();
    let producer = durable_producer(&memory(&journal), to, |d| d);
    settle().await; // open
    journal.faults().hold_commits();
    let store = actix::spawn(producer.store(1));
    settle().await;
    assert_eq!(journal.faults().held(), 1, "the store is in flight");
    producer.stop();
    settle().await;
    journal.faults().release();
    let stored = store.await.unwrap().expect("it committed: reported stored");
    assert_eq!(stored.id, MessageId(1));
    let unconfirmed = stored.confirmed().await.unwrap_err();
    assert_eq!(
        (unconfirmed.clone(), unconfirmed.happened()),
        (DeliveryError::StoppedUnconfirmed, Happened::FailedAfter),
        "stored, not confirmed in this life"
    );
    producer.stopped().await.unwrap();
    let (handled, heard) = next_start(&journal).await;
    assert_eq!(handled, [1], "the next start sends it");
    let ok = DurableConfirmation {
        id: MessageId(1),
        result: Ok(()),
    };
    assert_eq!(heard, [ok], "and its sink reports it, once");
}

#[actix::test]
async fn a_store_unanswered_at_the_stop_timeout_is_in_doubt_and_settled_by_the_next_start() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (to, _) = black_hole();
    let producer = durable_producer(&memory(&journal), to, |d| {
        d.stop_timeout(Duration::from_secs(2))
    });
    settle().await;
    journal.faults().hold_commits();
    let store = actix::spawn(producer.store(1));
    settle().await;
    producer.stop();
    settle_for(2_500).await;
    let outcome = store.await.unwrap().map(|stored| stored.id);
    assert!(
        matches!(&outcome, Err(DeliveryError::InDoubt(reason)) if reason.contains("may have been stored")),
        "{outcome:?}"
    );
    assert_eq!(outcome.unwrap_err().happened(), Happened::InDoubt);
    producer.stopped().await.unwrap();
    journal.faults().release(); // the commit lands after all
    let (handled, heard) = next_start(&journal).await;
    assert_eq!(handled, [1]);
    assert_eq!(heard.len(), 1, "the sink reports it: {heard:?}");
}

#[actix::test]
async fn an_ack_in_the_same_mailbox_drain_as_stop_is_recorded_and_reported_once() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (to, seen) = black_hole();
    let producer = durable_producer(&memory(&journal), to, |d| d);
    let confirmed = Log::default();
    let log = confirmed.clone();
    producer.tell(1, move |result| log.push(result)).unwrap();
    settle().await;
    let (ack, _) = seen.snapshot()[0].clone();
    // One drain: the ACK, then the stop.
    producer.addr().do_send(SingleAck(ack));
    producer.stop();
    producer.stopped().await.unwrap();
    assert_eq!(confirmed.snapshot(), [Ok(())]);
    let (handled, heard) = next_start(&journal).await;
    assert_eq!(handled, Vec::<u32>::new(), "its settlement was recorded");
    assert_eq!(heard, [], "the callback heard of it, not the sink");
}

#[actix::test]
async fn stop_while_a_settlement_record_is_in_flight_waits_for_it() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (to, seen) = black_hole();
    let producer = durable_producer(&memory(&journal), to, |d| d);
    let confirmed = Log::default();
    let log = confirmed.clone();
    producer.tell(1, move |result| log.push(result)).unwrap();
    settle().await;
    let (ack, _) = seen.snapshot()[0].clone();
    journal.faults().hold_commits();
    producer.addr().do_send(SingleAck(ack));
    settle().await;
    assert_eq!(journal.faults().held(), 1, "the record is in flight");
    producer.stop();
    settle().await;
    assert_eq!(
        confirmed.snapshot(),
        [],
        "nothing is said before the record's outcome"
    );
    journal.faults().release();
    producer.stopped().await.unwrap();
    assert_eq!(confirmed.snapshot(), [Ok(())]);
    let (handled, heard) = next_start(&journal).await;
    assert_eq!((handled, heard), (Vec::new(), Vec::new()));
}

#[actix::test]
async fn a_stream_with_an_undecodable_event_stops_the_producer_for_good() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    journal
        .append_as(&stream(), 1, vec![vec![0xff; 7]], Manifest::legacy())
        .await
        .unwrap();
    let (to, _) = black_hole();
    let producer = durable_producer(&memory(&journal), to, |d| d);
    let error = producer.store(1).await.unwrap_err();
    assert!(matches!(error, DeliveryError::Storage(_)), "{error:?}");
    let stopped = tokio::time::timeout(Duration::from_secs(60), producer.stopped())
        .await
        .expect("a corrupt stream stops the producer for good");
    assert!(
        matches!(&stopped, Err(Failure::Error(reason)) if reason.contains("corrupt")),
        "{stopped:?}"
    );
    settle_for(600_000).await;
    let error = producer.store(2).await.unwrap_err();
    assert_eq!(
        (error.clone(), error.happened()),
        (DeliveryError::ProducerStopped, Happened::CertainlyNot),
        "a store on a stopped producer certainly stored nothing"
    );
}

/// A producer stopped before its stream opened, whose stop timed out while its journal was
/// slow, is stopped for good once `stopped()` resolves: nothing of it writes to the stream
/// afterwards, so a producer started on the stream after it keeps the stream.
#[actix::test]
async fn a_producer_stopped_at_its_timeout_before_it_opened_never_takes_the_stream_back() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let slow = SlowRecovery::new(journal.clone());
    slow.hold_next();
    let (to, _) = black_hole();
    let slow_journal = slow.clone();
    let first = durable_producer(&move || Arc::new(slow_journal.clone()), to, |d| {
        d.stop_timeout(Duration::from_secs(1))
    });
    settle().await; // its opening waits for the journal's reads
    first.stop();
    let stopped = tokio::time::timeout(Duration::from_secs(5), first.stopped()).await;
    assert!(stopped.is_ok(), "the stop is bounded by its timeout");

    // Its successor opens the stream and stores.
    let (to, _) = black_hole();
    let second = durable_producer(&memory(&journal), to, |d| d);
    let stored = second.store(1).await.expect("the successor stores");
    assert_eq!(stored.id, MessageId(1));

    // The journal answers the stopped producer's reads now.
    slow.release();
    settle_for(100).await;

    let next = second.store(2).await.map(|stored| stored.id);
    assert_eq!(
        next,
        Ok(MessageId(2)),
        "the stopped producer's opening must not land after it stopped for good"
    );
}

/// Orders: placing one stores `Placed` and delivers `Ship` to "shipping".
#[derive(Debug, Default, Serialize, Deserialize)]
struct Orders;

#[derive(Debug, Serialize, Deserialize)]
struct Placed(u64);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Ship(u64);

impl EventSourced for Orders {
    type Command = u64;
    type Event = Placed;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Placed(*order)], ()).deliver("shipping", &Ship(*order)))
    }

    fn apply(&mut self, _: &Placed) {}
}

fn start_orders(journal: &MemoryJournal, to: ConsumerRef<Ship>) -> PersistentHandle<Orders> {
    let lane = ProducerConfig {
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    };
    let outbox = Outbox::new().destination("shipping", to, lane).unwrap();
    let id = PersistenceId::new("orders").unwrap();
    let config = PersistentConfig::default();
    PersistentHandle::start(
        PersistentOptions::new(Arc::new(journal.clone()), id)
            .config(config)
            .outbox(outbox)
            .supervised(),
    )
    .unwrap()
}

#[actix::test]
async fn an_outbox_ack_in_the_same_mailbox_drain_as_stop_is_recorded() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (to, seen) = black_hole();
    let orders = start_orders(&journal, to);
    orders.ask(1).await.unwrap();
    settle().await;
    let (ack, _) = seen.snapshot()[0].clone();
    // One drain: the destination's ACK, then the stop.
    orders.addr().do_send(SingleAck(ack));
    orders.stop();
    orders.stopped().await.unwrap();
    // The next start resends only what is unconfirmed: nothing.
    let (again, seen_again) = black_hole::<Ship>();
    let restarted = start_orders(&journal, again);
    restarted.ask(2).await.unwrap();
    settle_for(1_000).await;
    let resent: Vec<u64> = seen_again.snapshot().iter().map(|(_, seq)| *seq).collect();
    assert!(
        resent.iter().all(|&seq| seq == 2),
        "delivery 1 was confirmed before the stop: {resent:?}"
    );
}
