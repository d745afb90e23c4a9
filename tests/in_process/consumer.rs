//! The ConsumerController actor, fed hand-made deliveries, under virtual time.

use crate::common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::{
    Acks, ConsumerController, ConsumerHandle, ConsumerOptions, DeadLetter, DeadLetterReason,
    Deliveries, Delivery, DeliveryHandler, DeliveryInfo, Incarnation, Limit, ProducerId,
    ReliableDelivery, ReplyTo, SingleAck,
};
use actix_delivery_proto::protocol::envelope::MAX_SEQ;
use common::{ack_probe, settle, settle_for, Gate, Log};

fn delivery(id: &str, incarnation: u128, seq: u64, body: u32, reply_to: &ReplyTo) -> Delivery<u32> {
    Delivery {
        producer_id: ProducerId::from(id),
        incarnation: Incarnation::from_u128(incarnation),
        seq,
        window_start: 1,
        body,
        reply_to: Some(reply_to.clone()),
        trace_context: None,
    }
}

/// A consumer whose handler records each body and succeeds.
fn recording_consumer(
    configure: impl FnOnce(
        actix_delivery::ConsumerOptionsBuilder<u32>,
    ) -> actix_delivery::ConsumerOptionsBuilder<u32>,
) -> (ConsumerHandle<u32>, Log<u32>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = configure(ConsumerOptions::builder(handler))
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), handled)
}

#[actix::test]
async fn new_message_runs_the_handler_once_and_duplicates_are_re_acked() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b);
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 5, 1, 10, &reply_to));
    settle().await;
    assert_eq!(handled.snapshot(), [10]);
    assert_eq!(acks.len(), 1);
    let ack = &acks.snapshot()[0];
    assert_eq!(
        (ack.producer_id.as_str(), ack.incarnation, ack.seq),
        ("p", Incarnation::from_u128(5), 1)
    );

    consumer.addr().do_send(delivery("p", 5, 1, 10, &reply_to));
    settle().await;
    assert_eq!(
        handled.snapshot(),
        [10],
        "a duplicate must not run the handler"
    );
    assert_eq!(acks.len(), 2, "a duplicate is re-ACKed");
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.duplicates), (1, 1));
}

#[actix::test]
async fn a_batch_of_deliveries_is_handled_like_single_ones_with_acks_batched_per_producer() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b);
    let batches = Log::default();
    let single_acks = Log::default();
    let probe = BatchProbe {
        batches: batches.clone(),
        singles: single_acks.clone(),
    }
    .start();
    let reply_to = ReplyTo::batching(probe.clone().recipient(), probe.recipient());
    let mut malformed = delivery("p", 1, 2, 99, &reply_to);
    malformed.seq = 0;
    let batch = vec![
        delivery("p", 1, 1, 1, &reply_to),
        malformed,
        delivery("p", 1, 3, 3, &reply_to),
        delivery("p", 1, 1, 1, &reply_to), // duplicate within the batch: re-ACKed
    ];
    consumer.addr().do_send(Deliveries(batch));
    settle().await;
    assert_eq!(handled.snapshot(), [1, 3]);
    assert_eq!(
        batches.snapshot(),
        [vec![1, 3, 1]],
        "one Acks message for the drain"
    );
    assert_eq!(single_acks.len(), 0);
    let stats = consumer.stats().await.unwrap();
    assert_eq!(
        (stats.delivered, stats.duplicates, stats.dead_letters),
        (2, 1, 1)
    );

    // Single deliveries queued together are one mailbox drain: their ACKs share one batch.
    for seq in 4..=6 {
        consumer
            .addr()
            .do_send(delivery("p", 1, seq, seq as u32, &reply_to));
    }
    settle().await;
    assert_eq!(batches.snapshot()[1], [4, 5, 6]);
    // A lone ACK goes out as a plain `Ack`.
    consumer.addr().do_send(delivery("p", 1, 7, 7, &reply_to));
    settle().await;
    assert_eq!((batches.len(), single_acks.snapshot()), (2, vec![7]));
}

#[actix::test]
async fn failing_handler_gets_no_ack_and_runs_again_on_retransmit() {
    tokio::time::pause();
    let attempts = Rc::new(Cell::new(0));
    let counter = attempts.clone();
    let handler = DeliveryHandler::from_fn(move |_: u32| {
        counter.set(counter.get() + 1);
        let fail = counter.get() == 1;
        async move {
            if fail {
                Err("transient")
            } else {
                Ok(())
            }
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 0, &reply_to));
    settle().await;
    assert_eq!((attempts.get(), acks.len()), (1, 0));
    consumer.addr().do_send(delivery("p", 1, 1, 0, &reply_to));
    settle().await;
    assert_eq!((attempts.get(), acks.len()), (2, 1));
    assert_eq!(consumer.stats().await.unwrap().handler_failures, 1);
}

#[actix::test]
async fn panicking_handler_gets_no_ack_and_the_consumer_survives() {
    tokio::time::pause();
    let handler = DeliveryHandler::from_fn(|body: u32| async move {
        assert!(body != 13, "unlucky body");
        Ok::<(), String>(())
    });
    // A panic while creating the future, too.
    let eager = DeliveryHandler::from_fn(|body: u32| {
        assert!(body != 13, "unlucky body, eagerly");
        async { Ok::<(), String>(()) }
    });
    for handler in [handler, eager] {
        let consumer =
            ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
        let (reply_to, acks) = ack_probe();
        consumer.addr().do_send(delivery("p", 1, 1, 13, &reply_to));
        consumer.addr().do_send(delivery("p", 1, 2, 14, &reply_to));
        settle().await;
        let stats = consumer
            .stats()
            .await
            .expect("the consumer survived the panic");
        assert_eq!((stats.handler_panics, stats.delivered), (1, 1));
        assert_eq!(
            acks.snapshot().iter().map(|a| a.seq).collect::<Vec<_>>(),
            [2]
        );
    }
}

/// Records ACK batches (as seq lists) and single ACKs separately.
struct BatchProbe {
    batches: Log<Vec<u64>>,
    singles: Log<u64>,
}

impl Actor for BatchProbe {
    type Context = Context<Self>;
}

impl Handler<Acks> for BatchProbe {
    type Result = ();
    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        self.batches.push(acks.iter().map(|a| a.seq).collect());
    }
}

impl Handler<SingleAck> for BatchProbe {
    type Result = ();
    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.singles.push(ack.seq);
    }
}

/// An error whose `Display` panics: user code the consumer must contain too.
struct RudeError;

impl std::fmt::Display for RudeError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("Display of the handler's error panicked")
    }
}

#[actix::test]
async fn a_panicking_error_display_counts_as_a_panic_and_the_consumer_survives() {
    tokio::time::pause();
    let handler = DeliveryHandler::from_fn(|body: u32| async move {
        if body == 1 {
            Err(RudeError)
        } else {
            Ok(())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    consumer.addr().do_send(delivery("p", 1, 2, 2, &reply_to));
    settle().await;
    let stats = consumer.stats().await.expect("the consumer survived");
    assert_eq!(
        (stats.handler_panics, stats.delivered, acks.len()),
        (1, 1, 1)
    );
}

/// Records dead letters.
struct Sink(Log<DeadLetter>);

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<DeadLetter> for Sink {
    type Result = ();
    fn handle(&mut self, letter: DeadLetter, _: &mut Context<Self>) {
        self.0.push(letter);
    }
}

/// Refused deliveries are kept in a dead-letter store with their ids and why; a flood of them
/// keeps the sampling burst and counts the rest, however many the peer sends.
#[actix::test]
async fn refused_deliveries_are_kept_and_a_flood_of_them_is_sampled() {
    use actix_delivery::dead_letters::{
        DeadLetterCause, DeadLetterFilter, DeadLetterLimits, DeadLetters, MemoryDeadLetters,
        SourceKind,
    };
    tokio::time::pause();
    let limits = DeadLetterLimits {
        sample_burst: 5,
        sample_interval_ms: 3_600_000,
        ..DeadLetterLimits::default()
    };
    let dead_letters = DeadLetters::new(MemoryDeadLetters::new(limits).unwrap());
    let (consumer, handled) =
        recording_consumer(|b| b.keep_dead_letters(dead_letters.clone(), "orders"));
    let (reply_to, acks) = ack_probe();
    for seq in 2..102 {
        let mut bad_window = delivery("p", 1, seq, 0, &reply_to);
        bad_window.window_start = seq + 1;
        consumer.addr().do_send(bad_window);
    }
    settle().await;
    assert!(handled.snapshot().is_empty() && acks.len() == 0);
    let page = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 5, "the burst is kept");
    let letter = &page.entries[0].letter;
    assert_eq!(
        (letter.kind, letter.source.as_str(), letter.cause),
        (SourceKind::Consumer, "orders", DeadLetterCause::Malformed)
    );
    let origin = letter.origin.as_ref().expect("its delivery id");
    assert_eq!((origin.producer_id.as_str(), origin.seq), ("p", 2));
    assert_eq!(letter.key, format!("p/{}/2", origin.incarnation));
    assert!(letter.error.contains("window_start 3"), "{}", letter.error);
    let stats = dead_letters.stats();
    assert_eq!((stats.kept, stats.sampled_out), (5, 95));
    assert_eq!(
        consumer.stats().await.unwrap().dead_letters,
        100,
        "all counted"
    );
}

#[actix::test]
async fn malformed_deliveries_become_dead_letters_and_the_consumer_keeps_serving() {
    tokio::time::pause();
    let letters = Log::default();
    let sink = Sink(letters.clone()).start();
    let (consumer, handled) = recording_consumer(|b| b.dead_letters(sink.recipient()));
    let (reply_to, acks) = ack_probe();
    let mut no_reply = delivery("p", 1, 1, 0, &reply_to);
    no_reply.reply_to = None;
    let mut bad_window = delivery("p", 1, 3, 0, &reply_to);
    bad_window.window_start = 4;
    let malformed = [
        no_reply,
        delivery("p", 1, 0, 0, &reply_to),
        delivery("p", 1, MAX_SEQ + 1, 0, &reply_to),
        delivery("", 1, 1, 0, &reply_to),
        delivery(&"x".repeat(257), 1, 1, 0, &reply_to),
        bad_window,
    ];
    for d in malformed {
        consumer.addr().do_send(d);
    }
    settle().await;
    assert!(
        handled.snapshot().is_empty(),
        "no handler call for a dead letter"
    );
    assert_eq!(acks.len(), 0, "no ACK for a dead letter");
    let reasons: Vec<DeadLetterReason> = letters.snapshot().iter().map(|l| l.reason).collect();
    assert_eq!(
        reasons,
        [
            DeadLetterReason::MissingReplyTo,
            DeadLetterReason::SeqOutOfRange(0),
            DeadLetterReason::SeqOutOfRange(MAX_SEQ + 1),
            DeadLetterReason::EmptyProducerId,
            DeadLetterReason::ProducerIdTooLong(257),
            DeadLetterReason::WindowStartOutOfRange {
                window_start: 4,
                seq: 3
            },
        ]
    );
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.dead_letters, stats.tracked_producers), (6, 0));
    let letter = &letters.snapshot()[1];
    assert_eq!(
        letter.incarnation,
        Incarnation::from_u128(1).id(),
        "dead letters carry the public id, not the token"
    );

    consumer
        .addr()
        .do_send(delivery(&"x".repeat(256), 1, 1, 256, &reply_to));
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    settle().await;
    assert_eq!(
        handled.snapshot(),
        [256, 1],
        "256 bytes is admitted; service continues"
    );
    assert_eq!(acks.len(), 2);
}

#[actix::test]
async fn slow_handler_does_not_block_the_mailbox_and_its_retransmit_is_not_rerun() {
    tokio::time::pause();
    let gate = Gate::default();
    let calls = Rc::new(Cell::new(0));
    let (g, c) = (gate.clone(), calls.clone());
    let handler = DeliveryHandler::from_fn(move |_: u32| {
        c.set(c.get() + 1);
        let g = g.clone();
        async move {
            g.pass().await;
            Ok::<(), String>(())
        }
    });
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(handler)
            .producer_idle_ttl(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let (reply_to, acks) = ack_probe();
    consumer
        .addr()
        .do_send(delivery("slow", 1, 1, 0, &reply_to));
    settle().await;
    consumer
        .addr()
        .do_send(delivery("slow", 1, 1, 0, &reply_to));
    // Control messages are answered while the handler runs.
    let stats = consumer.stats().await.unwrap();
    assert_eq!((calls.get(), stats.in_progress, acks.len()), (1, 1, 0));
    // Timers fire while the handler runs: the idle sweep removes the window after 1-2 TTLs.
    settle_for(2_500).await;
    assert_eq!(consumer.tracked_producers().await.unwrap(), 0);
    gate.open();
    settle().await;
    assert_eq!((calls.get(), acks.len()), (1, 1), "one run, one ACK");
}

#[actix::test]
async fn handlers_run_one_at_a_time_in_arrival_order() {
    tokio::time::pause();
    let active = Rc::new(Cell::new(0));
    let order = Log::default();
    let (a, o) = (active.clone(), order.clone());
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        let (a, o) = (a.clone(), o.clone());
        async move {
            a.set(a.get() + 1);
            assert_eq!(a.get(), 1, "handlers overlapped");
            tokio::time::sleep(Duration::from_millis(3)).await;
            o.push(body);
            a.set(a.get() - 1);
            Ok::<(), String>(())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (reply_to, acks) = ack_probe();
    for seq in 1..=5 {
        consumer
            .addr()
            .do_send(delivery("a", 1, seq, seq as u32, &reply_to));
        consumer
            .addr()
            .do_send(delivery("b", 1, seq, 100 + seq as u32, &reply_to));
    }
    settle_for(100).await;
    assert_eq!(order.snapshot(), [1, 101, 2, 102, 3, 103, 4, 104, 5, 105]);
    assert_eq!(acks.len(), 10);
    assert_eq!(consumer.stats().await.unwrap().handler_panics, 0);
}

#[actix::test]
async fn idle_producers_are_swept_after_one_to_two_ttls_in_virtual_time() {
    tokio::time::pause();
    let ttl = Duration::from_secs(10);
    let (consumer, _) = recording_consumer(|b| b.producer_idle_ttl(ttl));
    let (reply_to, _) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 0, &reply_to));
    settle().await;
    settle_for(5_000).await;
    consumer.addr().do_send(delivery("q", 1, 1, 0, &reply_to));
    settle_for(4_900).await;
    assert_eq!(
        consumer.tracked_producers().await.unwrap(),
        2,
        "nothing idle for a TTL yet"
    );
    settle_for(200).await; // sweep at 10 s: p idle 10 s, q idle 5 s
    assert_eq!(consumer.tracked_producers().await.unwrap(), 1);
    settle_for(10_000).await; // sweep at 20 s: q idle 15 s
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.tracked_producers, stats.swept), (0, 2));
}

#[actix::test]
async fn ttl_never_keeps_windows_forever() {
    tokio::time::pause();
    let (consumer, _) = recording_consumer(|b| b.producer_idle_ttl(Limit::Unbounded));
    let (reply_to, _) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 0, &reply_to));
    settle_for(24 * 3600 * 1000).await;
    assert_eq!(consumer.tracked_producers().await.unwrap(), 1);
}

#[actix::test]
async fn a_flood_of_distinct_producer_ids_stays_at_max_producers() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b.max_producers(8));
    let (reply_to, _) = ack_probe();
    for i in 0..1_000 {
        consumer
            .addr()
            .do_send(delivery(&format!("flood-{i}"), 1, 1, i, &reply_to));
    }
    settle().await;
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.tracked_producers, stats.evictions), (8, 992));
    assert_eq!(handled.len(), 1_000);
}

#[actix::test]
async fn out_of_order_seqs_are_observable_per_producer() {
    tokio::time::pause();
    let (consumer, _) = recording_consumer(|b| b);
    let (reply_to, _) = ack_probe();
    for seq in [1, 3, 4] {
        consumer.addr().do_send(delivery("p", 1, seq, 0, &reply_to));
    }
    settle().await;
    assert_eq!(consumer.out_of_order_for("p").await.unwrap(), Some(2));
    assert_eq!(consumer.out_of_order_for("nobody").await.unwrap(), None);
}

#[actix::test]
async fn ordered_mode_runs_messages_in_seq_order() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b.ordered(true));
    let (reply_to, acks) = ack_probe();
    for seq in [2, 3, 1, 2, 3] {
        consumer
            .addr()
            .do_send(delivery("p", 1, seq, seq as u32, &reply_to));
    }
    settle().await;
    assert_eq!(handled.snapshot(), [1, 2, 3]);
    assert_eq!(
        acks.snapshot().iter().map(|a| a.seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(consumer.stats().await.unwrap().refused, 2);
}

#[actix::test]
async fn new_incarnation_is_not_absorbed_as_duplicates() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b);
    let (reply_to, _) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    consumer.addr().do_send(delivery("p", 2, 1, 2, &reply_to));
    settle().await;
    assert_eq!(handled.snapshot(), [1, 2]);
    assert_eq!(consumer.tracked_producers().await.unwrap(), 1);
}

#[actix::test]
async fn handler_with_info_sees_producer_the_public_incarnation_id_and_seq() {
    tokio::time::pause();
    let seen = Log::default();
    let log = seen.clone();
    let handler = DeliveryHandler::from_fn_with_info(move |info: DeliveryInfo, body: u32| {
        log.push((info, body));
        async { Ok::<(), String>(()) }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (reply_to, _) = ack_probe();
    consumer.addr().do_send(delivery("p", 9, 4, 40, &reply_to));
    settle().await;
    let expected = DeliveryInfo {
        producer_id: ProducerId::from("p"),
        incarnation: Incarnation::from_u128(9).id(),
        seq: 4,
        window_start: 1,
        trace_context: None,
        first_seq: None,
    };
    assert_eq!(seen.snapshot(), [(expected, 40)]);
    assert_ne!(
        Incarnation::from_u128(9).id().as_u128(),
        9,
        "the handler never sees the token"
    );
}

#[actix::test]
async fn a_handler_that_succeeded_in_the_stopping_drain_still_gets_its_ack() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b);
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    consumer.stop();
    settle().await;
    assert_eq!((handled.snapshot(), acks.len()), (vec![1], 1));
}

#[actix::test]
async fn a_consumer_reached_again_through_a_weak_address_still_drives_its_handlers() {
    tokio::time::pause();
    let gate = Gate::default();
    let handled = Log::default();
    let (g, log) = (gate.clone(), handled.clone());
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        let (g, log) = (g.clone(), log.clone());
        async move {
            if body == 2 {
                g.pass().await; // not ready on its first poll
            }
            log.push(body);
            Ok::<(), String>(())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to)); // arms the idle sweep timer
    settle().await;
    let weak = consumer.addr().downgrade();
    drop(consumer); // no strong address left; the sweep timer keeps the actor alive
    settle().await;
    let again = weak.upgrade().expect("alive until the idle sweep");
    again.do_send(delivery("p", 1, 2, 2, &reply_to));
    settle().await;
    gate.open();
    settle().await;
    assert_eq!((handled.snapshot(), acks.len()), (vec![1, 2], 2));
}

#[actix::test]
async fn stopping_the_consumer_stops_the_actor() {
    tokio::time::pause();
    let (consumer, _) = recording_consumer(|b| b);
    consumer.stop();
    settle().await;
    assert!(!consumer.addr().connected());
    assert!(consumer.stats().await.is_err());
}

/// A consumer whose handler never finishes for the bodies in `stuck` (the first time each is
/// seen), and records the others.
fn consumer_with_stuck_bodies(
    stuck: &'static [u32],
    timeout: Duration,
) -> (ConsumerHandle<u32>, Log<u32>) {
    let handled = Log::default();
    let log = handled.clone();
    let seen_stuck = Rc::new(Cell::new(0u32));
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        let (log, seen_stuck) = (log.clone(), seen_stuck.clone());
        async move {
            if stuck.contains(&body) && seen_stuck.get() & (1 << body) == 0 {
                seen_stuck.set(seen_stuck.get() | (1 << body));
                std::future::pending::<()>().await; // a lost reply, a deadlock
            }
            tokio::task::yield_now().await; // not ready at once: driven after the drain
            log.push(body);
            Ok::<(), String>(())
        }
    });
    let options = ConsumerOptions::builder(handler)
        .handler_timeout(timeout)
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), handled)
}

#[actix::test]
async fn a_stuck_handler_is_abandoned_after_handler_timeout_and_the_next_message_runs() {
    tokio::time::pause();
    let timeout = Duration::from_secs(30);
    let (consumer, handled) = consumer_with_stuck_bodies(&[1], timeout);
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    consumer.addr().do_send(delivery("q", 1, 1, 2, &reply_to));
    settle_for(29_000).await;
    assert!(
        handled.snapshot().is_empty(),
        "everything waits behind the stuck run"
    );
    settle_for(1_001).await;
    assert_eq!(
        handled.snapshot(),
        [2],
        "the next message runs after the timeout"
    );
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.handler_timeouts, stats.delivered), (1, 1));
    assert_eq!(
        acks.snapshot()
            .iter()
            .map(|a| a.producer_id.as_str())
            .collect::<Vec<_>>(),
        ["q"]
    );
    // p retransmits seq 1: it runs again (this time it finishes) and is ACKed.
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    settle().await;
    assert_eq!(handled.snapshot(), [2, 1]);
    assert_eq!(acks.len(), 2);
}

#[actix::test]
async fn stop_stops_a_supervised_consumer_for_good_and_stopped_says_when() {
    tokio::time::pause();
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    let consumer =
        ConsumerHandle::new(Supervisor::start(move |_| ConsumerController::new(options)));
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    settle().await;
    consumer.stop();
    consumer.stopped().await;
    consumer.addr().do_send(delivery("p", 1, 2, 2, &reply_to));
    settle_for(1_000).await;
    assert_eq!(
        handled.snapshot(),
        [1],
        "no handler runs after stop, no restart"
    );
    assert_eq!(acks.len(), 1);
    consumer.stopped().await;
}

#[actix::test]
async fn stopped_resolves_for_an_unsupervised_consumer_too() {
    tokio::time::pause();
    let (consumer, _) = recording_consumer(|b| b);
    consumer.stop();
    consumer.stopped().await;
    assert!(!consumer.addr().connected());
}

#[actix::test]
async fn a_hand_made_delivery_needs_no_knowledge_of_window_start() {
    tokio::time::pause();
    let (consumer, handled) = recording_consumer(|b| b);
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(Delivery::new(
        "p",
        Incarnation::from_u128(3),
        7,
        70,
        reply_to.clone(),
    ));
    consumer.addr().do_send(
        Delivery::new("p", Incarnation::from_u128(3), 9, 90, reply_to).with_window_start(9),
    );
    settle().await;
    assert_eq!(handled.snapshot(), [70, 90]);
    assert_eq!(acks.len(), 2);
}

/// A pipelined consumer: every call is logged at once; its outcome waits for the test to
/// resolve it (`Ok` unless the body is odd and `fail_odd`).
fn pipelined_consumer(
    configure: impl FnOnce(
        actix_delivery::ConsumerOptionsBuilder<u32>,
    ) -> actix_delivery::ConsumerOptionsBuilder<u32>,
) -> (ConsumerHandle<u32>, Log<u32>, Gate) {
    let called = Log::default();
    let gate = Gate::default();
    let (log, outcome_gate) = (called.clone(), gate.clone());
    let handler = DeliveryHandler::pipelined(move |_: DeliveryInfo, body: u32| {
        log.push(body);
        let gate = outcome_gate.clone();
        async move {
            gate.pass().await;
            if body == 13 {
                return Err("unlucky");
            }
            Ok(())
        }
    });
    let options = configure(ConsumerOptions::builder(handler))
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), called, gate)
}

#[actix::test]
async fn a_pipelined_handler_is_called_in_order_without_waiting_and_acks_after_each_outcome() {
    tokio::time::pause();
    let (consumer, called, gate) = pipelined_consumer(|b| b);
    let (reply_to, acks) = ack_probe();
    for seq in 1..=3 {
        consumer
            .addr()
            .do_send(delivery("p", 1, seq, seq as u32, &reply_to));
    }
    consumer.addr().do_send(delivery("p", 1, 4, 13, &reply_to));
    settle().await;
    assert_eq!(
        called.snapshot(),
        [1, 2, 3, 13],
        "no call waited for an outcome"
    );
    assert_eq!(acks.len(), 0, "no ACK before the outcome");
    assert_eq!(consumer.stats().await.unwrap().deferred, 4);
    consumer.addr().do_send(delivery("p", 1, 2, 2, &reply_to)); // a retransmission
    settle().await;
    assert_eq!(called.len(), 4, "a deferred message is not run again");
    gate.open();
    settle().await;
    let mut acked: Vec<u64> = acks.snapshot().iter().map(|a| a.seq).collect();
    acked.sort_unstable(); // in the order the outcomes resolved
    assert_eq!(acked, [1, 2, 3], "the failed one is not ACKed");
    let stats = consumer.stats().await.unwrap();
    assert_eq!(
        (stats.delivered, stats.handler_failures, stats.deferred),
        (3, 1, 0)
    );
    consumer.addr().do_send(delivery("p", 1, 4, 13, &reply_to));
    settle().await;
    assert_eq!(
        called.len(),
        5,
        "the failed one runs again when retransmitted"
    );
}

#[actix::test]
async fn a_pipelined_outcome_that_never_comes_is_abandoned_after_handler_timeout() {
    tokio::time::pause();
    let (consumer, called, _never_opened) =
        pipelined_consumer(|b| b.handler_timeout(Duration::from_secs(5)));
    let (reply_to, acks) = ack_probe();
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    settle_for(5_001).await;
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.handler_timeouts, stats.deferred), (1, 0));
    consumer.addr().do_send(delivery("p", 1, 1, 1, &reply_to));
    settle().await;
    assert_eq!(called.snapshot(), [1, 1], "retried after the timeout");
    assert_eq!(acks.len(), 0);
}

#[actix::test]
async fn in_ordered_mode_a_pipelined_handler_is_awaited_before_the_next_call() {
    tokio::time::pause();
    let (consumer, called, gate) = pipelined_consumer(|b| b.ordered(true));
    let (reply_to, acks) = ack_probe();
    for seq in 1..=3 {
        consumer
            .addr()
            .do_send(delivery("p", 1, seq, seq as u32, &reply_to));
    }
    settle().await;
    assert_eq!(
        called.snapshot(),
        [1],
        "the next call waits for the outcome"
    );
    gate.open();
    settle().await;
    assert_eq!(called.snapshot(), [1, 2, 3]);
    assert_eq!(acks.len(), 3);
}
