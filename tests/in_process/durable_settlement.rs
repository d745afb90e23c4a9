//! How a durable producer settles what it stored: a store whose outcome the journal left
//! unknown is settled by the restart that reads the journal, the `window_start` cap set when a
//! settlement record commits never passes a store in flight, the last settlement of a burst is
//! recorded at once, and a settlement record of unknown outcome is settled `InDoubt` only when
//! the journal cannot prove who recorded it. See also
//! `a_caught_up_durable_producer_with_the_shipped_cap_never_stalls` in `tests/in_process/simulator.rs`.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::{
    ConsumerConfig, ConsumerOptions, DeliveryError, DeliveryHandler, ProducerConfig,
    ProducerOptions, ReliableDelivery,
};
use actix_delivery_proto::protocol::consumer::{ConsumerCore, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::envelope::Incarnation;
use actix_delivery_proto::protocol::producer::{ProducerCore, Transmission};
use common::journals::{Fault, Faulty};
use common::{cuttable, out_stream, recording_consumer, settle_for};

/// A store whose commit reached the disk but was reported failed has an unknown outcome; the
/// supervised producer restarts in the same process, finds the message in its journal and sends
/// it, and that restart settles the store. The message was committed, so its caller hears
/// "stored" and then "confirmed", and sends nothing twice. Settling it `DeliveryError::Storage`
/// ("a message that was not stored is not sent") would make the caller send it again under a
/// new id while the restart sends the stored one: the consumer would run it twice.
#[actix::test]
async fn a_store_reported_failed_but_committed_is_confirmed_after_the_restart() {
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let journal = Faulty::new(memory.clone());
    let (consumer, handled) = recording_consumer::<u32>();
    let options = ProducerOptions::builder(consumer.consumer_ref())
        .producer_id("uncertain-commit")
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream(), "uncertain-commit");
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    producer.send(1).await.unwrap();
    journal.arm(Fault::AfterCommit);
    let outcome = producer.send(2).await;
    if outcome.is_err() {
        producer.send(2).await.unwrap(); // what an application told "not stored" does
    }
    assert_eq!(outcome, Ok(()), "the restart found it committed");
    settle_for(2_000).await;
    assert_eq!(handled.snapshot(), [1, 2]);
    let stats = producer.stats().await.unwrap();
    assert_eq!(
        (stats.resumed, stats.resumed_confirmed),
        (0, 0),
        "its own caller heard of it, not the sink"
    );
    assert_eq!(
        stats.stored, 2,
        "the store found committed counts as stored"
    );
}

/// After a record commits, the shell caps `window_start` at "the lowest stored unsettled seq,
/// else the next seq", but its next seq already counts a store in flight. The core calls it
/// makes, replayed one by one: seq 2's record is lost in a crash after a retransmission told
/// the consumer that everything below 3 is settled; had the cap passed the store in flight, the
/// consumer (which lived through the crash) would refuse the resend of seq 2 as stale, forever.
/// The core clamps `set_durably_settled_below` at its next seq, so the resend is re-ACKed.
#[test]
fn a_cap_set_while_a_store_is_in_flight_never_strands_a_resend() {
    let config = ProducerConfig {
        producer_id: Some("p".into()),
        ..ProducerConfig::default()
    };
    let incarnation = Incarnation::from_u128(7);
    let t0 = Instant::now();
    let mut consumer = ConsumerCore::<u32, ()>::new(&ConsumerConfig::default());
    // Hands one delivery to the consumer and runs its handler to success: the decision.
    let mut deliver = |t: Transmission<u32>| -> &'static str {
        let inbound = Inbound {
            header: t.header,
            body: t.body,
            reply_to: Some(()),
        };
        match consumer.handle_delivery(inbound, t0) {
            Step::Run(_) => {
                let completion = consumer.handle_outcome(&HandlerOutcome::Succeeded, t0);
                assert!(completion.ack.is_some());
                "run"
            }
            Step::Ack(..) => "duplicate, re-ACKed",
            Step::Hold => "held",
            Step::DeadLetter(..) => "dead letter",
        }
    };
    let mut producer = ProducerCore::<u32, u32>::resume(&config, incarnation, 1, [], || 7);
    // Seq 1 is stored, sent, handled and ACKed; its record starts (from the stale timer).
    producer.handle_send(1, 1).unwrap();
    let first = producer.poll_transmit(t0).unwrap();
    let ack = |seq| actix_delivery_proto::protocol::envelope::Ack {
        producer_id: "p".into(),
        incarnation,
        seq,
    };
    assert_eq!(deliver(first), "run");
    assert!(producer.handle_ack(&ack(1)));
    // Seq 2's store starts behind it; the record of 1 commits first: nothing stored is
    // unsettled, so the shell caps at its next seq, 3, which counts the store in flight.
    producer.set_durably_settled_below(3);
    // Seqs 2 and 3 are stored and sent; 2 is handled and ACKed, its record starts.
    producer.handle_send(2, 2).unwrap();
    producer.handle_send(3, 3).unwrap();
    let second = producer.poll_transmit(t0).unwrap();
    let third = producer.poll_transmit(t0).unwrap();
    assert_eq!((second.header.seq, third.header.seq), (2, 3));
    assert_eq!(deliver(second), "run");
    assert!(producer.handle_ack(&ack(2)));
    // Seq 3's ACK is lost: its retransmission says that everything below 3 is settled.
    let later = t0 + config.resend_timeout;
    producer.handle_timeout(later);
    let resent = producer.poll_transmit(later).unwrap();
    assert_eq!(resent.header.seq, 3);
    deliver(resent);
    // The process crashes before the record of 2 commits: 2 and 3 are stored, unsettled.
    let mut producer = ProducerCore::resume(&config, incarnation, 4, [(2, 2, 2), (3, 3, 3)], || 7);
    let stranded = producer.poll_transmit(later).unwrap();
    assert_eq!(stranded.header.seq, 2);
    assert_eq!(
        deliver(stranded),
        "duplicate, re-ACKed",
        "the consumer handled seq 2: it must re-ACK its resend, not refuse it as stale"
    );
}

/// A settlement the core yields in a flush that already started its writes is held back to the
/// next flush. After the last ACK of a burst nothing flushes again but the retransmission timer
/// armed for that message (never disarmed), so its confirmation, and `window_start`, would come
/// a whole `resend_timeout` late (the simulator counts such records: "records started by a stale
/// timer"). A flush that holds a settlement back starts its record too: the confirmation comes
/// at once.
#[actix::test]
async fn the_last_confirmation_does_not_wait_for_the_resend_timeout() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let handler = DeliveryHandler::from_fn(|_: u32| async { Ok::<(), String>(()) });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let options = ProducerOptions::builder(&consumer)
        .producer_id("orders")
        .resend_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let stream = PersistenceId::new("orders-out").unwrap();
    let durable = DurableOptions::new(Arc::new(journal), stream, "orders");
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    let start = tokio::time::Instant::now();
    let stored = producer.store(7).await.unwrap();
    assert_eq!(stored.confirmed().await, Ok(()));
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "confirmed {waited:?} after it was stored, with nothing lost on the way"
    );
}

/// A settlement record that commits but is reported failed leaves its outcome open: the
/// supervised producer restarts, and its next opening of the stream settles it from the
/// journal. Here the first reopening fails too, and `fault` says how. Returns what the
/// message's caller heard, what the consumer handled, and the producer's `resumed` and
/// `resumed_confirmed` counts.
async fn confirm_through_a_lost_record_and_a_failed_reopening(
    fault: Fault,
) -> (Result<(), DeliveryError>, Vec<u32>, (u64, u64)) {
    tokio::time::pause();
    let journal = Faulty::new(MemoryJournal::new());
    let (consumer, handled) = recording_consumer::<u32>();
    let (link, cut, _) = cuttable(consumer.consumer_ref());
    let options = ProducerOptions::builder(link)
        .producer_id("lost-record")
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream(), "lost-record");
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    cut.store(true, Ordering::SeqCst);
    let stored = producer.store(1).await.unwrap();
    // The next append is the settlement record of message 1, after its resend gets through.
    journal.arm(Fault::AfterCommit);
    cut.store(false, Ordering::SeqCst);
    for _ in 0..500 {
        if journal.injected(Fault::AfterCommit) == 1 {
            break;
        }
        settle_for(1).await;
    }
    assert_eq!(
        journal.injected(Fault::AfterCommit),
        1,
        "the record was lost"
    );
    // The restart waits 100 ms before it reopens: its opening is the next append.
    journal.arm(fault);
    let outcome = stored.confirmed().await;
    let reopenings_failed = match fault {
        Fault::AfterCommit => journal.injected(fault) - 1, // the first was the record's
        _ => journal.injected(fault),
    };
    assert_eq!(reopenings_failed, 1, "the first reopening failed as armed");
    settle_for(1_000).await;
    let stats = producer.stats().await.unwrap();
    (
        outcome,
        handled.snapshot(),
        (stats.resumed, stats.resumed_confirmed),
    )
}

/// The stream's openings are numbered. When the restart's first reopening failed before it
/// wrote, the one that succeeds is exactly the next number after the producer's last opening:
/// no other opening came in between, so nobody but this producer can have recorded (and
/// reported) the settlement the journal holds, and its caller hears `Ok`.
#[actix::test]
async fn a_lost_record_is_confirmed_when_the_journal_proves_no_opening_came_between() {
    let (outcome, handled, resumed) =
        confirm_through_a_lost_record_and_a_failed_reopening(Fault::BeforeCommit).await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(handled, [1], "handled once");
    assert_eq!(
        resumed,
        (0, 0),
        "settled: nothing sent again, nothing for the sink"
    );
}

/// When the failed reopening did commit, the stream shows an opening between the producer's
/// last one and its new one that it cannot tell from another producer's (which may have
/// recorded and reported the settlement): in doubt.
#[actix::test]
async fn a_lost_record_is_in_doubt_when_an_opening_of_unknown_origin_came_between() {
    let (outcome, handled, resumed) =
        confirm_through_a_lost_record_and_a_failed_reopening(Fault::AfterCommit).await;
    assert!(
        matches!(&outcome, Err(DeliveryError::InDoubt(reason))
            if reason.contains("another producer opened the stream meanwhile")),
        "{outcome:?}"
    );
    assert_eq!(handled, [1], "handled once");
    assert_eq!(
        resumed,
        (0, 0),
        "settled: nothing sent again, nothing for the sink"
    );
}
