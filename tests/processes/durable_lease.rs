//! Two real instances of an application on one durable stream in PostgreSQL: this test binary
//! re-runs itself as the instances (selected by environment variables).
//!
//! - `without_a_lease_a_second_instance_takes_the_stream_over_and_the_first_says_so`: the
//!   default. The second instance opens the stream (a takeover, counted); the first, healthy
//!   one is refused at its next write and its `stopped()` says `TakenOver`.
//! - `with_a_lease_a_second_instance_is_refused_and_a_killed_owners_restart_waits_one_lease`:
//!   with a lease, a second instance started while the first is alive (and idle: it renews its
//!   lease) is refused (`InUse`) and the first keeps storing; once the first is SIGKILLed, its
//!   restart opens the stream after watching it for one lease, and no longer.

use crate::postgres_support;
use crate::process;

use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::PersistenceId;
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};

/// Set (to the stream) in the children.
const CHILD_STREAM: &str = "DURABLE_LEASE_STREAM";
/// The children's lease in milliseconds (0: none).
const CHILD_LEASE_MS: &str = "DURABLE_LEASE_MS";
/// Marks the children's own lines.
const MARK: &str = "@@";
/// The lease of the test with one.
const LEASE: Duration = Duration::from_secs(2);
/// How long a child may take to start and answer.
const ANSWER: Duration = Duration::from_secs(30);

fn say(line: std::fmt::Arguments<'_>) {
    println!("{MARK}{line}");
}

/// An instance: a durable producer on the stream (with the lease, if any) feeding a consumer
/// of its own. It prints `opened takeovers=<n> after_ms=<how long its opening took>` or
/// `refused <why>`; then, for each line `store <n>` on its stdin, `stored <n>` or
/// `store-failed <why>`, and `stopped <how>` once its producer stopped.
#[test]
fn instance_child() {
    let Ok(stream) = std::env::var(CHILD_STREAM) else {
        return; // not a child
    };
    let lease: u64 = std::env::var(CHILD_LEASE_MS).unwrap().parse().unwrap();
    actix::System::new().block_on(async move {
        let journal = Arc::new(postgres_support::journal().await);
        let handler = DeliveryHandler::from_fn(|_: u64| async { Ok::<(), String>(()) });
        let consumer =
            ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
        let stream = PersistenceId::new(stream).unwrap();
        let mut durable = DurableOptions::new(journal, stream, "orders-api");
        if lease > 0 {
            durable = durable.lease(Duration::from_millis(lease));
        }
        let options = ProducerOptions::builder(&consumer).build().unwrap();
        let started = Instant::now();
        let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
        if let Err(error) = producer.opened().await {
            return say(format_args!("refused {error}"));
        }
        let took = started.elapsed().as_millis();
        let takeovers = producer.stats().await.unwrap().takeovers;
        say(format_args!("opened takeovers={takeovers} after_ms={took}"));
        let (lines, mut commands) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let stopped = producer.stopped();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    let n: u64 = command.strip_prefix("store ").unwrap().parse().unwrap();
                    match producer.send(n).await {
                        Ok(()) => say(format_args!("stored {n}")),
                        Err(error) => say(format_args!("store-failed {error}")),
                    }
                }
                how = &mut stopped => {
                    say(format_args!("stopped {how:?}"));
                    break;
                }
            }
        }
    });
}

/// Starts an instance on `stream` with a lease of `lease_ms` (0: none).
fn instance(stream: &str, lease_ms: u128) -> process::Child {
    process::spawn(
        concat!(module_path!(), "::instance_child"),
        &[
            (CHILD_STREAM, stream.to_owned()),
            (CHILD_LEASE_MS, lease_ms.to_string()),
        ],
    )
}

/// The `opened` line's takeovers and opening time.
fn opened(line: &str) -> (u64, Duration) {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let field = |name: &str| -> u64 {
        let prefix = format!("{name}=");
        let value = fields.iter().find_map(|f| f.strip_prefix(prefix.as_str()));
        value.unwrap_or_else(|| panic!("{line}")).parse().unwrap()
    };
    (field("takeovers"), Duration::from_millis(field("after_ms")))
}

#[test]
fn without_a_lease_a_second_instance_takes_the_stream_over_and_the_first_says_so() {
    if std::env::var(CHILD_STREAM).is_ok() {
        return; // a child runs `instance_child` only
    }
    let stream = postgres_support::unique("takeover");
    let mut first = instance(&stream, 0);
    let line = first.expect_line(&format!("{MARK}opened"), ANSWER);
    assert_eq!(opened(&line).0, 0, "a new stream: {line}");
    assert!(first.send("store 1"));
    first.expect_line(&format!("{MARK}stored 1"), ANSWER);

    let mut second = instance(&stream, 0);
    let line = second.expect_line(&format!("{MARK}opened"), ANSWER);
    assert_eq!(opened(&line).0, 1, "it took the stream over: {line}");
    assert!(first.send("store 2"));
    let failed = first.expect_line(&format!("{MARK}store-failed"), ANSWER);
    assert!(
        failed.contains("the newest opener owns the stream"),
        "{failed}"
    );
    let stopped = first.expect_line(&format!("{MARK}stopped"), ANSWER);
    assert!(
        stopped.starts_with(&format!("{MARK}stopped Err(TakenOver(")),
        "{stopped}"
    );
    assert!(second.send("store 3"));
    second.expect_line(&format!("{MARK}stored 3"), ANSWER);
}

#[test]
fn with_a_lease_a_second_instance_is_refused_and_a_killed_owners_restart_waits_one_lease() {
    if std::env::var(CHILD_STREAM).is_ok() {
        return; // a child runs `instance_child` only
    }
    let stream = postgres_support::unique("lease");
    let lease = LEASE.as_millis();
    let mut first = instance(&stream, lease);
    let line = first.expect_line(&format!("{MARK}opened"), ANSWER);
    assert_eq!(opened(&line).0, 0, "a new stream: {line}");
    assert!(
        opened(&line).1 < LEASE,
        "nothing to watch on a new stream: {line}"
    );

    // The first is alive, and idle: its renewals show it.
    let second = instance(&stream, lease);
    let refused = second.expect_line(&format!("{MARK}refused"), ANSWER);
    assert!(
        refused.contains("another producer wrote to it within the lease"),
        "{refused}"
    );
    assert!(first.send("store 1"));
    first.expect_line(&format!("{MARK}stored 1"), ANSWER);

    // SIGKILLed, it writes nothing: its restart opens after one lease.
    first.kill();
    let third = instance(&stream, lease);
    let line = third.expect_line(&format!("{MARK}opened"), ANSWER);
    let (takeovers, took) = opened(&line);
    assert_eq!(takeovers, 1, "{line}");
    assert!(
        took >= LEASE && took < LEASE + Duration::from_secs(2),
        "the restart waits one lease, not more: {line}"
    );
    drop(third);
}
