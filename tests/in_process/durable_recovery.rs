//! What a durable producer's restart makes of its stored stream: the messages it resumes take
//! room like new ones and every stored message goes out under its stored seq, and a corrupt
//! stream is refused with an error naming the stream and seq.

use crate::common;

use std::sync::atomic::Ordering;

use actix_delivery::journal::{Journal, MemoryJournal};
use actix_delivery::DeliveryError;
use common::{cuttable, durable_u32, out_stream, recording_consumer, settle, settle_for, Log};

/// A restarted durable producer's resumed messages take room like new ones: with them, its
/// inbox admits no more than `window_size + max_pending` messages, so new stores wait
/// (backpressure). Were new ones admitted, stored and then refused by the core
/// (`ProducerCore::handle_send_all`, `QueueFull`), the refusal would be recorded as settled: a
/// message whose `store()` resolved `Ok` would never be sent. And each stored message is handed
/// to the core under its stored seq, so its wire seq is its `MessageId` (under another seq, the
/// next restart's resend would reach the consumer as a new message).
#[actix::test]
async fn messages_stored_after_a_restart_wait_for_room_and_are_sent_under_their_stored_seqs() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<u32>();
    let (to, cut, seen) = cuttable(consumer.consumer_ref());
    // Room: window 1 + max_pending 1 = 2 messages.
    let first = durable_u32(&journal, to.clone(), 1, 1);
    cut.store(true, Ordering::SeqCst); // the consumer is unreachable
    for body in [1, 2] {
        first.store(body).await.unwrap();
    }
    first.stop();
    first.stopped().await.unwrap();

    // The producer's process restarts while the consumer is still unreachable.
    let second = durable_u32(&journal, to, 1, 1);
    settle().await; // open: 1 and 2 resumed
    let storing: Vec<_> = [3, 4]
        .into_iter()
        .map(|body| actix::spawn(second.store(body)))
        .collect();
    settle_for(1_000).await;
    assert!(
        storing.iter().all(|s| !s.is_finished()),
        "the resumed messages hold the room: new ones wait for it (backpressure)"
    );
    cut.store(false, Ordering::SeqCst);
    let mut stored = Vec::new();
    for message in storing {
        stored.push(message.await.unwrap().expect("stored"));
    }
    assert_eq!(
        stored.iter().map(|m| m.id.0).collect::<Vec<_>>(),
        [3, 4],
        "the producer owns 3 and 4 from now on (store() resolved Ok)"
    );
    let outcomes: Vec<Result<(), DeliveryError>> = {
        let mut outcomes = Vec::new();
        for message in stored {
            outcomes.push(message.confirmed().await);
        }
        outcomes
    };
    settle_for(2_000).await;
    // A message the producer owned must reach the consumer.
    assert_eq!(
        handled.snapshot(),
        [1, 2, 3, 4],
        "stored messages lost; their confirmations: {outcomes:?}; on the wire (seq, body): {:?}",
        seen.snapshot()
    );
    // And the wire seq of a message is its stored seq.
    second.store(5).await.unwrap();
    settle_for(1_000).await;
    let wire_seq_of_5 = seen
        .snapshot()
        .iter()
        .find(|(_, b)| *b == 5)
        .map(|(s, _)| *s);
    assert_eq!(
        wire_seq_of_5,
        Some(5),
        "message 5 is sent under another seq"
    );
}

/// The recovered log checks that its events follow each other. Corrupt data in a durable
/// producer's stream (entries reordered, each of them valid) would hand `ProducerCore::resume` a
/// message at or above its next seq, whose `assert!` panics inside the producer actor. Instead
/// the producer refuses with an error naming the stream and seq (SPEC §6.1: a corrupt stored
/// event stops recovery with an error that names the stream and seq), for good, and its actor
/// still answers.
#[actix::test]
async fn a_corrupt_stream_stops_the_producer_with_an_error_naming_it() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = recording_consumer::<u32>();
    let (to, cut, _) = cuttable(consumer.consumer_ref());
    cut.store(true, Ordering::SeqCst);
    let first = durable_u32(&journal, to.clone(), 4, 100);
    first.store(1).await.unwrap();
    first.store(2).await.unwrap();
    first.stop();
    first.stopped().await.unwrap();
    let events = journal
        .replay(&out_stream(), 1, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(events.len(), 3, "created, stored 1, stored 2");
    // The same entries (with their manifest), each valid, the two stores swapped, in a fresh
    // journal.
    let copy = MemoryJournal::new();
    let payloads = vec![
        events[0].payload.clone(),
        events[2].payload.clone(),
        events[1].payload.clone(),
    ];
    let manifest = events[0].manifest.clone();
    copy.append_as(&out_stream(), 1, payloads, manifest)
        .await
        .unwrap();
    let second = durable_u32(&copy, to, 4, 100);
    let failure = Log::default();
    second.tell(3, record_failure(&failure)).unwrap(); // waits for the stream to open
    settle_for(1_000).await;
    let failure = failure.snapshot();
    assert!(
        failure.len() == 1
            && failure[0].contains("stream `durable-out`")
            && failure[0].contains("corrupt: stored message 2 follows message 0"),
        "{failure:?}"
    );
    // A panic in the actor's task would kill it (tokio swallows the panic) and its mailbox
    // with it: the producer refuses with an error naming the stream and seq, and stays an
    // actor that answers.
    let alive = second.stats().await;
    assert!(
        alive.is_ok(),
        "the producer actor panicked on corrupt journal data (see the panic above): {alive:?}"
    );
    let refused = second.send(3).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// A confirmation callback recording the error message it gets.
fn record_failure(
    log: &Log<String>,
) -> impl FnOnce(Result<(), DeliveryError>) + Send + 'static + use<> {
    let log = log.clone();
    move |result| {
        if let Err(error) = result {
            log.push(error.to_string());
        }
    }
}
