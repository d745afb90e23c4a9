//! The ProducerController and its handle, with real consumers and lossy links, under virtual
//! time.

use crate::common;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::{
    Ack, ConsumerHandle, ConsumerOptions, ConsumerRef, DeliveryError, DeliveryHandler, Happened,
    Incarnation, ProducerHandle, ProducerId, ProducerOptions, ReliableDelivery, SingleAck, Tell,
    TellError,
};
use common::{confirm_into, settle, settle_for, Confirmations, Gate, Link, Log};

/// A consumer recording bodies; its handler waits for `gate` if one is given.
fn consumer(gate: Option<Gate>) -> (ConsumerHandle<u32>, Log<u32>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        let (log, gate) = (log.clone(), gate.clone());
        async move {
            if let Some(gate) = gate {
                gate.pass().await;
            }
            log.push(body);
            Ok::<(), String>(())
        }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    (ReliableDelivery::consumer(options), handled)
}

fn producer_to(
    target: impl Into<ConsumerRef<u32>>,
    configure: impl FnOnce(
        actix_delivery::ProducerOptionsBuilder<u32>,
    ) -> actix_delivery::ProducerOptionsBuilder<u32>,
) -> ProducerHandle<u32> {
    let options = configure(ProducerOptions::builder(target).producer_id("p"))
        .build()
        .unwrap();
    ReliableDelivery::producer(options)
}

#[actix::test]
async fn window_bounds_in_flight_and_the_queue_drains_in_order() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(4));
    let confirmations = Confirmations::default();
    for body in 0..10 {
        producer
            .tell(body, confirm_into(&confirmations, body))
            .unwrap();
    }
    settle().await;
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.sent, stats.in_flight, stats.queued), (4, 4, 6));
    assert_eq!(confirmations.len(), 0);
    gate.open();
    settle().await;
    assert_eq!(handled.snapshot(), (0..10).collect::<Vec<_>>());
    let confirmed: Vec<u32> = confirmations
        .snapshot()
        .into_iter()
        .map(|(b, r)| {
            assert_eq!(r, Ok(()));
            b
        })
        .collect();
    assert_eq!(confirmed, (0..10).collect::<Vec<_>>());
    let stats = producer.stats().await.unwrap();
    assert_eq!(
        (
            stats.confirmed,
            stats.in_flight,
            stats.queued,
            stats.retransmitted
        ),
        (10, 0, 0, 0)
    );
}

#[actix::test]
async fn dropped_deliveries_are_retransmitted_until_acked() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let mut to_drop = 3;
    let link = Link::new(consumer.recipient(), move |_| {
        to_drop -= 1;
        to_drop < 0
    });
    let (seen, dropped) = (link.seen.clone(), link.dropped.clone());
    let producer = producer_to(link.start().recipient(), |b| b);
    let started = tokio::time::Instant::now();
    producer.send(7).await.unwrap();
    // Three resend timeouts; Tokio's timer rounds each up by at most one 1 ms tick.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1_500) && elapsed <= Duration::from_millis(1_503),
        "{elapsed:?}"
    );
    assert_eq!(dropped.load(Ordering::Relaxed), 3);
    assert_eq!(handled.snapshot(), [7]);
    let seqs: Vec<u64> = seen.snapshot().iter().map(|s| s.2).collect();
    assert_eq!(seqs, [1, 1, 1, 1], "same seq on every retransmission");
    assert_eq!(producer.stats().await.unwrap().retransmitted, 3);
}

#[actix::test]
async fn handler_error_leads_to_retransmit_then_success() {
    tokio::time::pause();
    let calls = Rc::new(Cell::new(0));
    let c = calls.clone();
    let handler = DeliveryHandler::from_fn(move |_: u32| {
        c.set(c.get() + 1);
        let fail = c.get() <= 2;
        async move {
            if fail {
                Err("database busy")
            } else {
                Ok(())
            }
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let producer = producer_to(&consumer, |b| b);
    producer.send(1).await.unwrap();
    assert_eq!(calls.get(), 3);
    assert_eq!(consumer.stats().await.unwrap().handler_failures, 2);
}

#[actix::test]
async fn forged_acks_change_nothing_and_retransmission_continues() {
    tokio::time::pause();
    let (consumer, _) = consumer(None);
    let blocked = Rc::new(Cell::new(true));
    let b = blocked.clone();
    let link = Link::new(consumer.recipient(), move |_| !b.get());
    let seen = link.seen.clone();
    let producer = producer_to(link.start().recipient(), |b| b);
    let confirmations = Confirmations::default();
    producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
    settle().await;
    let (_, incarnation, seq) = seen.snapshot()[0].clone();
    let forged = [
        Ack {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(incarnation ^ 1),
            seq,
        },
        Ack {
            producer_id: "other".into(),
            incarnation: Incarnation::from_u128(incarnation),
            seq,
        },
        Ack {
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(incarnation),
            seq: seq + 1,
        },
    ];
    for ack in forged {
        producer.addr().do_send(SingleAck(ack));
    }
    settle_for(510).await; // one resend timeout (plus Tokio's 1 ms timer tick)
    assert_eq!(confirmations.len(), 0, "a forged ACK must not confirm");
    let stats = producer.stats().await.unwrap();
    assert_eq!(
        (stats.ignored_acks, stats.in_flight, stats.retransmitted),
        (3, 1, 1)
    );
    assert_eq!(seen.len(), 2, "retransmission continued");
    blocked.set(false);
    settle_for(510).await;
    assert_eq!(confirmations.snapshot(), [(1, Ok(()))]);
}

/// `stop` settles each message once and says which were sent: the two in flight (the window)
/// `StoppedUnconfirmed`, which happened and failed after (the consumer may have handled
/// them), the queued ones and those told afterwards `ProducerStopped`, which certainly did not
/// (a retry is safe). Before, all were `ProducerStopped`, which said "may or may not".
#[actix::test]
async fn stop_settles_each_message_once_saying_whether_it_was_sent() {
    tokio::time::pause();
    let (consumer, _) = consumer(Some(Gate::default())); // never opens
    let producer = producer_to(&consumer, |b| b.window_size(2));
    let confirmations = Confirmations::default();
    for body in 0..5 {
        producer
            .tell(body, confirm_into(&confirmations, body))
            .unwrap();
    }
    let waiting = producer.send(5);
    settle().await;
    producer.stop();
    assert_eq!(waiting.await, Err(DeliveryError::ProducerStopped));
    settle_for(10_000).await;
    let mut settled = confirmations.snapshot();
    settled.sort_by_key(|(b, _)| *b);
    let expected: Vec<_> = (0..5)
        .map(|b| match b {
            0 | 1 => (b, Err(DeliveryError::StoppedUnconfirmed)),
            _ => (b, Err(DeliveryError::ProducerStopped)),
        })
        .collect();
    assert_eq!(settled, expected, "each message settled exactly once");
    let happened: Vec<_> = settled
        .iter()
        .map(|(_, result)| result.as_ref().unwrap_err().happened())
        .collect();
    assert_eq!(
        happened,
        [
            Happened::FailedAfter,
            Happened::FailedAfter,
            Happened::CertainlyNot,
            Happened::CertainlyNot,
            Happened::CertainlyNot
        ]
    );
    let late = Confirmations::default();
    assert!(matches!(
        producer.tell(9, confirm_into(&late, 9)),
        Err(TellError::Stopped(9))
    ));
    assert_eq!(late.snapshot(), [(9, Err(DeliveryError::ProducerStopped))]);
    let refused = producer.send(10).await.unwrap_err();
    assert_eq!(refused.happened(), Happened::CertainlyNot);
}

#[actix::test]
async fn full_queue_hands_the_body_back_and_send_waits_for_room() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(1).max_pending(2));
    let confirmations = Confirmations::default();
    for body in 0..3 {
        producer
            .tell(body, confirm_into(&confirmations, body))
            .unwrap();
    }
    match producer.tell(3, confirm_into(&confirmations, 3)) {
        Err(TellError::QueueFull(body)) => assert_eq!(body, 3),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(
        confirmations.snapshot(),
        [(3, Err(DeliveryError::QueueFull))]
    );
    let waiting = actix::spawn(producer.send(4));
    settle_for(100).await;
    assert!(!waiting.is_finished(), "send waits while the queue is full");
    gate.open();
    assert_eq!(waiting.await.unwrap(), Ok(()));
    assert_eq!(handled.snapshot(), [0, 1, 2, 4]);
}

#[actix::test]
async fn a_panicking_confirmation_callback_does_not_kill_the_producer() {
    tokio::time::pause();
    let (consumer, _) = consumer(None);
    let producer = producer_to(&consumer, |b| b);
    producer
        .tell(1, |_: Result<(), DeliveryError>| panic!("callback bug"))
        .unwrap();
    settle().await;
    assert_eq!(producer.send(2).await, Ok(()));
    assert_eq!(producer.stats().await.unwrap().confirmed, 2);
}

#[actix::test]
async fn max_attempts_gives_the_message_up() {
    tokio::time::pause();
    let (consumer, _) = consumer(None);
    let link = Link::new(consumer.recipient(), |_| false);
    let producer = producer_to(link.start().recipient(), |b| b.max_attempts(3));
    assert_eq!(
        producer.send(1).await,
        Err(DeliveryError::GaveUp { attempts: 3 })
    );
    assert_eq!(producer.stats().await.unwrap().given_up, 1);
}

#[actix::test]
async fn every_start_draws_a_fresh_incarnation_and_numbers_from_one() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let link = Link::new(consumer.recipient(), |_| true);
    let seen = link.seen.clone();
    let link = link.start();
    let first = producer_to(link.clone().recipient(), |b| b);
    first.send(1).await.unwrap();
    first.stop();
    first.stopped().await.unwrap();
    let second = producer_to(link.clone().recipient(), |b| b);
    second.send(2).await.unwrap();
    let seen = seen.snapshot();
    assert_eq!((seen[0].0.as_str(), seen[0].2), ("p", 1));
    assert_eq!((seen[1].0.as_str(), seen[1].2), ("p", 1), "seqs start at 1");
    assert_ne!(seen[0].1, seen[1].1, "a new start draws a new incarnation");
    assert_eq!(
        handled.snapshot(),
        [1, 2],
        "the second seq 1 is new, not a duplicate"
    );
}

#[actix::test]
async fn stop_stops_a_producer_for_good_and_stopped_says_when() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, _) = consumer(Some(gate.clone()));
    let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
    let confirmations = Confirmations::default();
    producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
    settle().await;
    producer.stop();
    producer.stopped().await.unwrap();
    assert_eq!(
        confirmations.snapshot(),
        [(1, Err(DeliveryError::StoppedUnconfirmed))],
        "settled before stopped() resolved"
    );
    gate.open();
    settle().await;
    assert!(matches!(
        producer.tell(2, |_| ()),
        Err(TellError::Stopped(2))
    ));
    assert_eq!(producer.send(3).await, Err(DeliveryError::ProducerStopped));
    let direct = producer
        .addr()
        .send(Tell {
            body: 4,
            confirm: actix_delivery::Confirmation::none(),
        })
        .await;
    assert!(direct.is_err(), "the actor is gone: {direct:?}");
    producer.stopped().await.unwrap(); // resolves again at once
}

#[actix::test]
async fn a_confirmation_callback_can_tell_a_follow_up_without_queue_full() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let producer = producer_to(&consumer, |b| b.window_size(1).max_pending(1));
    let confirmations = Confirmations::default();
    let (again, log) = (producer.clone(), confirmations.clone());
    producer
        .tell(1, move |result: Result<(), DeliveryError>| {
            log.push((1, result));
            let follow_up = again.tell(2, confirm_into(&log, 2));
            assert!(
                follow_up.is_ok(),
                "room is given back before the callback runs"
            );
        })
        .unwrap();
    producer.tell(10, confirm_into(&confirmations, 10)).unwrap();
    settle().await;
    assert_eq!(handled.snapshot(), [1, 10, 2]);
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    assert_eq!(confirmations.len(), 3);
}

#[actix::test]
async fn send_waits_for_room_taken_by_direct_tells() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(1).max_pending(1));
    for body in [1, 2] {
        let told = producer
            .addr()
            .send(Tell {
                body,
                confirm: actix_delivery::Confirmation::none(),
            })
            .await
            .unwrap();
        assert!(told.is_ok());
    }
    let full = producer.addr().send(Tell {
        body: 99,
        confirm: actix_delivery::Confirmation::none(),
    });
    assert!(matches!(full.await.unwrap(), Err(TellError::QueueFull(99))));
    assert!(matches!(
        producer.tell(98, |_| ()),
        Err(TellError::QueueFull(98))
    ));
    let waiting = actix::spawn(producer.send(3));
    settle().await;
    assert!(
        !waiting.is_finished(),
        "send waits for room instead of failing"
    );
    gate.open();
    assert_eq!(waiting.await.unwrap(), Ok(()));
    assert_eq!(handled.snapshot(), [1, 2, 3]);
}

#[actix::test]
async fn send_queues_at_call_time_when_there_is_room() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let producer = producer_to(&consumer, |b| b);
    let first = producer.send(1);
    producer.tell(2, |_| ()).unwrap();
    settle().await;
    assert_eq!(handled.snapshot(), [1, 2], "queued when send was called");
    assert_eq!(first.await, Ok(()));
}

#[actix::test]
async fn idle_resolves_once_everything_handed_over_is_settled() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(2));
    for body in 0..5 {
        producer.tell(body, |_| ()).unwrap();
    }
    let idle = actix::spawn(producer.idle());
    settle_for(10_000).await;
    assert!(!idle.is_finished(), "messages are unconfirmed");
    gate.open();
    idle.await.unwrap();
    assert_eq!(handled.len(), 5);
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.confirmed, stats.in_flight, stats.queued), (5, 0, 0));
    producer.idle().await; // idle already: at once
    producer.stop();
    producer.idle().await; // stopped: nothing unsettled
}

#[actix::test]
async fn a_link_is_one_closure_and_keeps_batching() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let batches = Log::default();
    let (log, target) = (batches.clone(), consumer.consumer_ref());
    let link = ConsumerRef::from_fn(move |deliveries: Vec<actix_delivery::Delivery<u32>>| {
        log.push(deliveries.len());
        target.do_send_all(deliveries.into_iter());
    });
    let producer = producer_to(link, |b| b.window_size(64));
    for body in 0..63 {
        producer.tell(body, |_| ()).unwrap();
    }
    producer.send(63).await.unwrap();
    assert_eq!(handled.len(), 64);
    assert_eq!(batches.snapshot(), [64], "one batch for the burst");
}

#[actix::test]
async fn two_producers_into_one_consumer_keep_separate_seq_spaces() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let a = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .producer_id("a")
            .build()
            .unwrap(),
    );
    let b = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .producer_id("b")
            .build()
            .unwrap(),
    );
    for n in 0..50 {
        a.tell(n, actix_delivery::Confirmation::none()).unwrap();
        b.tell(1_000 + n, actix_delivery::Confirmation::none())
            .unwrap();
    }
    a.send(50).await.unwrap();
    b.send(1_050).await.unwrap();
    let mut all = handled.snapshot();
    all.sort_unstable();
    let expected: Vec<u32> = (0..=50).chain(1_000..=1_050).collect();
    assert_eq!(all, expected);
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.tracked_producers, stats.duplicates), (2, 0));
}

#[actix::test]
async fn dropping_the_last_handle_delivers_what_is_held_then_stops() {
    tokio::time::pause();
    let (consumer, handled) = consumer(None);
    let link = Link::new(consumer.recipient(), {
        let mut first = true;
        move |_| !std::mem::take(&mut first) // lose the first delivery: one retransmit
    });
    let producer = producer_to(link.start().recipient(), |b| b);
    let addr = producer.addr().clone();
    let confirmations = Confirmations::default();
    for body in 0..3 {
        producer
            .tell(body, confirm_into(&confirmations, body))
            .unwrap();
    }
    drop(producer);
    settle_for(1_000).await;
    assert_eq!(handled.len(), 3);
    assert_eq!(
        confirmations
            .snapshot()
            .iter()
            .filter(|(_, r)| r.is_ok())
            .count(),
        3
    );
    assert!(
        !addr.connected(),
        "the producer stopped once everything was settled"
    );
}

#[actix::test]
async fn producer_ids_default_to_random_and_can_be_chosen() {
    tokio::time::pause();
    let (consumer, _) = consumer(None);
    let random = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build().unwrap());
    assert!(random.producer_id().as_str().starts_with("producer-"));
    let chosen = producer_to(&consumer, |b| b);
    assert_eq!(chosen.producer_id(), &ProducerId::from("p"));
}

#[actix::test]
async fn send_timeout_on_a_full_producer_times_out_and_the_message_is_never_delivered() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(1).max_pending(1));
    producer.tell(1, |_| ()).unwrap(); // in flight, its handler waits for the gate
    producer.tell(2, |_| ()).unwrap(); // queued: the producer is full
    let timed_out = actix::spawn(producer.send_timeout(3, Duration::from_secs(1)));
    settle_for(999).await;
    assert!(
        !timed_out.is_finished(),
        "it waits for room until the deadline"
    );
    settle_for(2).await;
    assert_eq!(timed_out.await.unwrap(), Err(DeliveryError::Timeout));
    gate.open();
    settle_for(5_000).await;
    producer.idle().await;
    assert_eq!(
        handled.snapshot(),
        [1, 2],
        "the timed-out message never reaches the consumer"
    );
    let stats = producer.stats().await.unwrap();
    assert_eq!((stats.confirmed, stats.in_flight, stats.queued), (2, 0, 0));
    assert_eq!(stats.timed_out, 1, "the refusal is counted");
}

#[actix::test]
async fn send_timeout_bounds_only_the_wait_for_room_not_the_confirmation() {
    tokio::time::pause();
    let gate = Gate::default();
    let (consumer, handled) = consumer(Some(gate.clone()));
    let producer = producer_to(&consumer, |b| b.window_size(1).max_pending(1));
    // Room at once: queued at the call, and confirmed however long the handler takes.
    let sent = actix::spawn(producer.send_timeout(1, Duration::from_millis(1)));
    producer.tell(2, |_| ()).unwrap(); // now full
                                       // No room at the call, room before the deadline: queued when it comes.
    let waited = actix::spawn(producer.send_timeout(3, Duration::from_secs(10)));
    settle_for(5_000).await;
    assert!(!sent.is_finished() && !waited.is_finished());
    gate.open();
    assert_eq!(
        sent.await.unwrap(),
        Ok(()),
        "past its deadline, not timed out"
    );
    assert_eq!(waited.await.unwrap(), Ok(()), "got room in time");
    assert_eq!(handled.snapshot(), [1, 2, 3]);
}

#[actix::test]
async fn send_timeout_on_a_stopped_producer_says_stopped_not_timeout() {
    tokio::time::pause();
    let (consumer, _) = consumer(None);
    let producer = producer_to(&consumer, |b| b);
    producer.stop();
    producer.stopped().await.unwrap();
    let sent = producer.send_timeout(1, Duration::from_secs(1)).await;
    assert_eq!(sent, Err(DeliveryError::ProducerStopped));
}
