//! A durable work-pulling producer's given-up job across a SIGKILL: the give-up is durable
//! once its record committed, and not before. This test binary runs itself as the child
//! (selected by [`ROLE`]): a durable work-pulling producer on a SQLite file of its own, with
//! two in-process workers, that `store`s each body read from stdin.
//!
//! - In its first life the workers fail job 13 every time (its streams give it up after 2
//!   transmissions, 100 ms apart) and the pool gives it up after 2 failures. The journal is
//!   wrapped in [`Hooked`], which holds the give-up's record (the producer's third append:
//!   after the opening and the store of 13) before it reaches the journal, or after its
//!   commit; the test SIGKILLs the child once the held append's marker is out.
//! - In its second life the workers handle every job and print it.
//!
//! Held before the journal (decided, never stored), the job is sent again by the next life,
//! which handles it and reports it to its sink; held after the commit (stored, nobody told),
//! the next life does not send it again.

use crate::process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, DurableOptions};
use actix_delivery::journal::PersistenceId;
use actix_delivery::work_pulling::{GivenUpJob, Job, WorkPullingOptions, WorkerRegistry};
use actix_delivery::{ConsumerOptions, DeliveryHandler, Limit, ProducerConfig, ReliableDelivery};
use process::hook::{Hold, Hooked};

/// The test that is the child (it does nothing unless [`ROLE`] is set).
const ENTRY: &str = concat!(module_path!(), "::child_entry");
/// Set for the child: `failing` (its workers fail job 13) or `healthy`.
const ROLE: &str = "WP_GIVE_UP_ROLE";
/// The child's SQLite journal.
const DB: &str = "WP_GIVE_UP_DB";
/// The append its journal holds ([`Hold::encode`]).
const HOLD: &str = "WP_GIVE_UP_HOLD";
/// The marker of the child's journal lines.
const MARKER: &str = "producer-journal";
/// The give-up's record is the producer's third append (after the opening and the store of
/// job 13), and its journal entry the third.
const RECORD_APPEND: u64 = 3;
const RECORD_SEQ: u64 = 3;

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is set for the child"))
}

/// Prints the confirmations of jobs resent after a restart.
struct Sink;

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<DurableConfirmation> for Sink {
    type Result = ();

    fn handle(&mut self, confirmation: DurableConfirmation, _: &mut Context<Self>) {
        println!("resumed {} {:?}", confirmation.id.0, confirmation.result);
    }
}

/// Prints the jobs the pool gave up.
struct Graveyard;

impl Actor for Graveyard {
    type Context = Context<Self>;
}

impl Handler<GivenUpJob<u64>> for Graveyard {
    type Result = ();

    fn handle(&mut self, given_up: GivenUpJob<u64>, _: &mut Context<Self>) {
        println!(
            "dead-lettered {} {}",
            given_up.job.body, given_up.job.info.seq
        );
    }
}

/// The child: see the module docs. Never returns.
async fn producer(failing: bool) {
    let journal = process::open_journal(env(DB)).await.unwrap();
    let journal = Hooked::new(journal, MARKER, Hold::parse(&env(HOLD)));
    let durable = DurableOptions::new(
        Arc::new(journal),
        PersistenceId::new("jobs").unwrap(),
        "jobs",
    )
    .confirmations(Sink.start().recipient());
    let registry = WorkerRegistry::<u64>::new();
    let mut workers = Vec::new();
    for name in ["a", "b"] {
        let handler = DeliveryHandler::from_fn(move |job: Job<u64>| {
            let result = if failing && job.body == 13 {
                Err(format!("job {} cannot be parsed", job.body))
            } else {
                println!("handled {} {name}", job.body);
                Ok(())
            };
            async move { result }
        });
        let worker = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
        registry.register_consumer(name, &worker).unwrap();
        workers.push(worker);
    }
    let streams = ProducerConfig {
        window_size: 2,
        resend_timeout: Duration::from_millis(100),
        max_attempts: Limit::At(2),
        ..ProducerConfig::default()
    };
    let options = WorkPullingOptions::builder(&registry)
        .worker(streams)
        .give_up_after(2)
        .dead_letters(Graveyard.start().recipient())
        .build()
        .unwrap();
    let jobs = ReliableDelivery::durable_work_pulling_producer(options, durable).unwrap();
    while jobs.stats().await.unwrap().next_message_id == 0 {
        actix::clock::sleep(Duration::from_millis(1)).await;
    }
    println!("ready");

    let (lines, mut read) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = read.recv().await {
        if line == "idle" {
            let jobs = jobs.clone();
            actix::spawn(async move {
                jobs.idle().await;
                println!("idle");
            });
            continue;
        }
        let body: u64 = line.parse().expect("a body");
        let store = jobs.store(body);
        actix::spawn(async move {
            let stored = store.await.expect("stored");
            println!("stored {body} {}", stored.id.0);
            match stored.confirmed().await {
                Ok(()) => println!("confirmed {body}"),
                Err(error) => println!("failed {body} {error}"),
            }
        });
    }
    std::future::pending::<()>().await;
}

/// The child, by [`ROLE`].
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return; // run as an ordinary test: nothing to do
    };
    actix::System::new().block_on(producer(role == "failing"));
}

/// Starts the child on `db` as `role`, holding `hold`; returns it with the lines it printed
/// until it was ready.
fn start(db: &std::path::Path, role: &str, hold: Hold) -> (process::Child, Vec<String>) {
    let child = process::spawn(
        ENTRY,
        &[
            (ROLE, role.to_string()),
            (DB, db.display().to_string()),
            (HOLD, hold.encode()),
        ],
    );
    let lines = lines_until(&child, "ready");
    (child, lines)
}

/// Every line the child prints until one starts with `prefix` (included).
///
/// # Panics
/// If none comes within 30 s.
fn lines_until(child: &process::Child, prefix: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = Vec::new();
    while let Some(line) = child.next_line(deadline) {
        let done = line.starts_with(prefix);
        lines.push(line);
        if done {
            return lines;
        }
    }
    panic!("no line starting with {prefix:?} within 30 s: {lines:?}");
}

/// The first life: job 13 is stored, fails at both workers and is given up; the child is
/// SIGKILLed once the record of the give-up is held (`hold` says where). Returns its lines.
fn first_life(db: &std::path::Path, hold: Hold) -> Vec<String> {
    let (mut child, mut lines) = start(db, "failing", hold);
    assert!(child.send("13"));
    let marker = match hold {
        Hold::Before(_) => format!("{MARKER} appending {RECORD_SEQ}"),
        _ => format!("{MARKER} committed {RECORD_SEQ}"),
    };
    lines.extend(lines_until(&child, &marker));
    lines.extend(child.kill_collect());
    assert!(lines.iter().any(|l| l == "stored 13 1"), "{lines:?}");
    assert!(lines.iter().any(|l| l == "dead-lettered 13 1"), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("failed 13")),
        "killed before its sender heard of it: {lines:?}"
    );
    lines
}

/// The second life: every job is handled; job 14 is stored, and the child is SIGKILLed once
/// it holds nothing unsettled. Returns its lines.
fn second_life(db: &std::path::Path) -> Vec<String> {
    let (mut child, mut lines) = start(db, "healthy", Hold::Never);
    assert!(child.send("14"));
    lines.extend(lines_until(&child, "confirmed 14"));
    assert!(child.send("idle"));
    lines.extend(lines_until(&child, "idle"));
    lines.extend(child.kill_collect());
    lines
}

#[test]
fn a_give_up_whose_record_committed_before_a_sigkill_is_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.sqlite");
    first_life(&db, Hold::After(RECORD_APPEND));
    let second = second_life(&db);
    let handled: Vec<_> = second.iter().filter(|l| l.starts_with("handled")).collect();
    assert_eq!(handled.len(), 1, "job 14 only: {second:?}");
    assert!(handled[0].starts_with("handled 14"), "{second:?}");
    assert!(
        !second.iter().any(|l| l.starts_with("resumed")),
        "{second:?}"
    );
}

#[test]
fn a_give_up_not_recorded_at_a_sigkill_is_sent_again_by_the_next_life() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.sqlite");
    first_life(&db, Hold::Before(RECORD_APPEND));
    let second = second_life(&db);
    let handled_13 = second
        .iter()
        .filter(|l| l.starts_with("handled 13"))
        .count();
    assert_eq!(handled_13, 1, "{second:?}");
    assert!(
        second.iter().any(|l| l == "resumed 1 Ok(())"),
        "its sink hears of it: {second:?}"
    );
}
