//! A durable producer of chunked messages SIGKILLed mid-message, again and again: every
//! message reported stored is delivered once, whole; a message stored in part is dropped,
//! never half delivered. The in-process chunking tests are in `tests/features/chunking.rs`.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, DurableOptions};
use actix_delivery::journal::PersistenceId;
use actix_delivery::{
    ConsumerRef, DeliveryError, ProducerHandle, ProducerOptions, ReliableDelivery,
};
use bytes::Bytes;

use crate::common::blobs::{blob, blob_consumer, durable_sink};
use crate::process;

/// Where the crash test's child keeps its journal (set: this process is the child).
const CRASH_DB: &str = "CHUNK_CRASH_DB";
/// Which journal append the child holds (see `process::hook::Hold`).
const CRASH_HOLD: &str = "CHUNK_CRASH_HOLD";
/// The tag of the child's first message.
const CRASH_FROM: &str = "CHUNK_CRASH_FROM";
/// A crash test message: 16 MiB in chunks of 1 MiB, stored in two journal entries.
const CRASH_LEN: usize = 16 << 20;

/// The durable producer of the crash test, on the journal at `path` (held as `hold` says).
fn crash_producer(
    journal: Arc<dyn actix_delivery::journal::Journal>,
    to: ConsumerRef<Bytes>,
    sink: Recipient<DurableConfirmation>,
) -> ProducerHandle<Bytes> {
    ReliableDelivery::durable_producer(
        ProducerOptions::builder(to)
            .chunk_size(1 << 20)
            .build()
            .unwrap(),
        DurableOptions::new(journal, PersistenceId::new("big").unwrap(), "big").confirmations(sink),
    )
    .unwrap()
}

/// The crash test's child: opens the stream (printing `opened <partially stored>`, and
/// `dropped <id>` for each message found partly stored), then stores messages, printing
/// `stored <tag> <id>` once each is; it sends to a consumer that is never there.
#[test]
fn chunking_crash_child() {
    let Ok(path) = std::env::var(CRASH_DB) else {
        return; // run as an ordinary test: nothing to do
    };
    let hold = process::hook::Hold::parse(&std::env::var(CRASH_HOLD).unwrap_or_default());
    let from: u64 = std::env::var(CRASH_FROM).unwrap().parse().unwrap();
    actix::System::new().block_on(async move {
        let journal = process::open_journal(&path)
            .await
            .expect("open the journal");
        let journal = Arc::new(process::hook::Hooked::new(journal, "log", hold));
        let (sink, reported) = durable_sink();
        let nowhere = ConsumerRef::from_fn(|_| {}).with_chunks(|_| {});
        let producer = crash_producer(journal, nowhere, sink);
        while producer.stats().await.unwrap().next_message_id == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await; // opening
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // the sink's reports
        for (id, result) in reported.snapshot() {
            if let Err(DeliveryError::Storage(_)) = result {
                println!("dropped {}", id.0);
            }
        }
        println!(
            "opened {}",
            producer.stats().await.unwrap().partially_stored
        );
        for tag in from.. {
            let stored = producer.store(blob(tag, CRASH_LEN).0).await.unwrap();
            println!("stored {tag} {}", stored.id.0);
        }
    });
}

/// A durable producer of 16 MiB messages (two journal entries each), SIGKILLed while it
/// stores them: after a message's first entry committed (its second held), before its second
/// entry reaches the journal, after both committed (before it hears), or right after it
/// reported a message stored. Whichever: every message
/// reported stored is delivered once, whole, when the stream is opened with a consumer;
/// every message found stored in part is dropped (reported, never sent), and no handler runs
/// on a part. The kills land mid-message (partly stored messages are found).
#[actix::test]
async fn a_durable_producer_killed_mid_message_never_half_delivers_and_loses_no_stored_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("big.db");
    // Appends of a child: 1 opens the stream, then two per message.
    let holds = ["after:2", "before:3", "after:5", "never"];
    let (mut stored, mut partially, mut dropped) = (Vec::new(), 0, 0);
    let mut from = 0;
    for (round, hold) in holds.iter().enumerate() {
        let env = [
            (CRASH_DB, db.display().to_string()),
            (CRASH_HOLD, hold.to_string()),
            (CRASH_FROM, from.to_string()),
        ];
        let child = process::spawn(concat!(module_path!(), "::chunking_crash_child"), &env);
        // Every line the child prints, until the moment to kill it: the held append's marker
        // (the n-th of its kind; the opening's is the first), or a message stored.
        let held = process::hook::Hold::parse(hold);
        let (mut appending, mut committed) = (0, 0);
        let mut lines = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let line = child
                .next_line(deadline)
                .unwrap_or_else(|| panic!("round {round} ({hold}): the child went silent"));
            appending += u64::from(line.starts_with("log appending"));
            committed += u64::from(line.starts_with("log committed"));
            let stored_one = line.starts_with("stored");
            lines.push(line);
            let now = match held {
                process::hook::Hold::Before(n) => appending == n,
                process::hook::Hold::After(n) => committed == n,
                process::hook::Hold::Never => stored_one,
            };
            if now {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20)); // the held append waits for good
        while let Ok(Some(line)) = child.try_line() {
            lines.push(line);
        }
        child.kill();
        for line in lines {
            if let Some(rest) = line.strip_prefix("stored ") {
                stored.push(rest.split(' ').next().unwrap().parse::<u64>().unwrap());
            }
            if let Some(found) = line.strip_prefix("opened ") {
                partially += found.parse::<u64>().unwrap();
            }
            dropped += u64::from(line.starts_with("dropped"));
        }
        println!("round {round} ({hold}): stored {stored:?}, partly stored found {partially}");
        from += 3;
    }
    // The stream opened with a consumer: what is stored arrives, once, whole.
    let journal = Arc::new(process::open_journal(&db).await.unwrap());
    let (sink, reported) = durable_sink();
    let (consumer, runs) = blob_consumer(CRASH_LEN as u64 + 1024);
    let producer = crash_producer(journal, (&consumer).into(), sink);
    let idle = tokio::time::timeout(Duration::from_secs(60), producer.idle()).await;
    let c = consumer.stats().await.unwrap();
    assert!(idle.is_ok(), "every stored message confirmed: {c:?}");
    let stats = producer.stats().await.unwrap();
    partially += stats.partially_stored;
    let runs = runs.snapshot();
    let expected = |tag: u64| blob(tag, CRASH_LEN).1;
    for tag in &stored {
        let n = runs
            .iter()
            .filter(|run| *run == &(CRASH_LEN, expected(*tag)))
            .count();
        assert_eq!(
            n, 1,
            "message {tag} was reported stored: delivered once, whole ({runs:?})"
        );
    }
    let tried: Vec<u64> = (0..from).map(expected).collect();
    for run in &runs {
        assert!(
            run.0 == CRASH_LEN && tried.contains(&run.1),
            "a whole message: {run:?}"
        );
    }
    assert!(
        partially >= 2,
        "the kills landed mid-message: {partially} found partly stored"
    );
    let reported_dropped = reported
        .snapshot()
        .iter()
        .filter(|(_, result)| matches!(result, Err(DeliveryError::Storage(_))))
        .count() as u64;
    assert_eq!(dropped + reported_dropped, partially, "each reported once");
    assert_eq!(
        (c.dead_letters, c.partial_messages, c.reassembly_bytes),
        (0, 0, 0)
    );
}
