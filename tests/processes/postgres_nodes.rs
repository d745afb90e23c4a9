//! The PostgreSQL journal shared by real processes ("nodes"): this test binary re-runs
//! itself as the children (selected by environment variables), all on one database.
//!
//! - `two_nodes_racing_on_one_stream_are_fenced`: two children append to the same stream at
//!   once, each with two writers, each catching up after every conflict: every seq is stored
//!   once, by the node that was told `Ok`, byte for byte; nothing doubled, no gap.
//! - `a_persistent_entity_fails_over_between_processes_without_duplicates`: a child owns a
//!   persistent entity fed by this test (a producer that survives the child's deaths) through
//!   an effectively-once consumer; the test SIGKILLs it and starts the entity in another
//!   child, sometimes only after the new one is already running and taking the same
//!   deliveries (an overlapping failover: the fence decides). Every message is stored exactly
//!   once, and each child recovered the state the journal held.
//!
//! Replay a seed:
//! `FAILOVER_SEED=5 cargo test --features postgres --test processes postgres_nodes::`.

use crate::postgres_support;
use crate::process;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{Journal, JournalError, PersistenceId};
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerOptions, Delivery, Incarnation, ReliableDelivery, ReplyTo};
use futures_util::future::join_all;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Marks the children's own lines.
const MARK: &str = "@@";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn say(line: std::fmt::Arguments<'_>) {
    println!("{MARK}{line}");
}

// --- two nodes racing on one stream -----------------------------------------------------

const RACE_NODE: &str = "PG_RACE_NODE";
const RACE_STREAM: &str = "PG_RACE_STREAM";
const RACE_TARGET: u64 = 300;

fn race_payload(node: &str, writer: usize, seq: u64) -> Vec<u8> {
    format!("{node}{writer}:{seq}").into_bytes()
}

/// The racing node: waits for `go`, then two writers append to the stream until it holds
/// [`RACE_TARGET`] events, printing `ack <writer> <first> <last>` for every append that
/// resolved `Ok`, and `done <conflicts>` at the end.
#[test]
fn race_child() {
    let Ok(node) = std::env::var(RACE_NODE) else {
        return; // run as an ordinary test: nothing to do
    };
    let id = PersistenceId::new(std::env::var(RACE_STREAM).unwrap()).unwrap();
    runtime().block_on(async {
        let journal = postgres_support::journal().await;
        say(format_args!("ready"));
        let mut go = String::new();
        std::io::stdin().lock().read_line(&mut go).unwrap();
        let writers = (0..2).map(|w| {
            let (journal, id, node) = (&journal, &id, &node);
            async move {
                let mut conflicts = 0u64;
                let mut next = journal.highest_seq(id).await.unwrap() + 1;
                let mut round = 0;
                // A pause of up to 2 ms after each won append lets the other node in: without
                // it, one node's writers can win every seq after the first few (seen in an
                // optimized build), and the test would show no race.
                let mut pauses =
                    SmallRng::seed_from_u64(w as u64 + u64::from(node.as_bytes()[0]) * 7);
                while next <= RACE_TARGET {
                    let last = next + (round + w as u64) % 3;
                    round += 1;
                    let batch = (next..=last)
                        .map(|seq| race_payload(node, w, seq))
                        .collect();
                    match journal.append(id, next, batch).await {
                        Ok(()) => {
                            say(format_args!("ack {w} {next} {last}"));
                            next = last + 1;
                            let pause = pauses.random_range(0..2_000);
                            tokio::time::sleep(Duration::from_micros(pause)).await;
                        }
                        Err(JournalError::Conflict { highest_seq, .. }) => {
                            conflicts += 1;
                            next = highest_seq + 1;
                        }
                        Err(other) => {
                            say(format_args!("err {other}"));
                            std::process::exit(2);
                        }
                    }
                }
                conflicts
            }
        });
        let conflicts: u64 = join_all(writers).await.into_iter().sum();
        say(format_args!("done {conflicts}"));
    });
}

#[test]
fn two_nodes_racing_on_one_stream_are_fenced() {
    let id = PersistenceId::new(postgres_support::unique("race")).unwrap();
    let mut nodes: Vec<_> = ["a", "b"]
        .iter()
        .map(|node| {
            let env = [(RACE_NODE, node.to_string()), (RACE_STREAM, id.to_string())];
            (
                node.to_string(),
                process::spawn(concat!(module_path!(), "::race_child"), &env),
            )
        })
        .collect();
    for (_, child) in &nodes {
        child.expect_line(&format!("{MARK}ready"), Duration::from_secs(30));
    }
    for (_, child) in &mut nodes {
        assert!(child.send("go"));
    }
    // seq → (node, writer) that was told Ok for it.
    let mut owner: BTreeMap<u64, (String, usize)> = BTreeMap::new();
    let mut conflicts = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (node, child) in &nodes {
        loop {
            let line = child
                .next_line(deadline)
                .unwrap_or_else(|| panic!("node {node} stopped talking"));
            let Some(said) = line.strip_prefix(MARK) else {
                continue;
            };
            let fields: Vec<&str> = said.split(' ').collect();
            match fields[0] {
                "ack" => {
                    let writer: usize = fields[1].parse().unwrap();
                    let (first, last): (u64, u64) =
                        (fields[2].parse().unwrap(), fields[3].parse().unwrap());
                    for seq in first..=last {
                        let previous = owner.insert(seq, (node.clone(), writer));
                        assert_eq!(previous, None, "seq {seq} acknowledged twice");
                    }
                }
                "done" => {
                    conflicts += fields[1].parse::<u64>().unwrap();
                    break;
                }
                _ => panic!("node {node}: {said}"),
            }
        }
    }
    for (_, child) in nodes {
        assert!(child.finish().success());
    }

    let stored = runtime().block_on(async {
        let journal = postgres_support::journal().await;
        let stored = journal.replay(&id, 1, u64::MAX, usize::MAX).await.unwrap();
        assert_eq!(journal.highest_seq(&id).await, Ok(stored.len() as u64));
        stored
    });
    assert!(stored.len() as u64 >= RACE_TARGET);
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "gapless"
    );
    assert_eq!(
        owner.keys().copied().collect::<Vec<_>>(),
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        "every stored seq was acknowledged to exactly one writer, and every acknowledged one is stored"
    );
    for event in &stored {
        let (node, writer) = &owner[&event.seq];
        assert_eq!(event.payload, race_payload(node, *writer, event.seq));
    }
    // Both nodes won seqs, taking turns: they really raced.
    let node_changes = owner
        .values()
        .zip(owner.values().skip(1))
        .filter(|(a, b)| a.0 != b.0)
        .count();
    let by_a = owner.values().filter(|(node, _)| node == "a").count();
    println!(
        "{} events: {by_a} by node a, {} by node b, the owner changed {node_changes} times, \
         {conflicts} conflicts",
        stored.len(),
        stored.len() - by_a
    );
    assert!(conflicts > 0 && node_changes >= 2, "the nodes never raced");
}

// --- a persistent entity failing over between processes ---------------------------------

const ENTITY_STREAM: &str = "PG_FAILOVER_STREAM";
const ENTITY_ACK_DELAY: &str = "PG_FAILOVER_ACK_DELAY_MS";
/// The `application_name` of the child's connections, so the test can see when the server
/// is done with them.
const ENTITY_APP: &str = "PG_FAILOVER_APP";
const MESSAGES: u64 = 300;
const WINDOW: usize = 32;
const KILLS: u32 = 10;
const RESEND: Duration = Duration::from_millis(100);
const INCARNATION: Incarnation = Incarnation::from_u128(0xfa11_0e7e);

/// Each message applied to the ledger, counted per message.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied(u64);

enum Op {
    Apply(u64),
    Count,
}

impl EventSourced for Ledger {
    type Command = Op;
    type Event = Applied;
    type Reply = usize;
    type Rejection = String;

    fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
        Ok(match *command {
            Op::Apply(message) => Decision::persist([Applied(message)], self.applied.len() + 1),
            Op::Count => Decision::reply(self.applied.len()),
        })
    }

    fn apply(&mut self, Applied(message): &Applied) {
        *self.applied.entry(*message).or_default() += 1;
    }
}

fn config() -> PersistentConfig {
    PersistentConfig {
        snapshot_every: Some(50),
        delete_events_on_snapshot: true,
        ..Default::default()
    }
}

/// The entity's process: recovers the ledger from PostgreSQL and prints `ready <n>` (the
/// messages it holds), then takes `d <seq> <window_start>` lines on stdin as deliveries of
/// message `seq` from producer `p`, prints `ack <seq>` for every ACK (after the delay) and,
/// every 20 ms, `stats <conflicts> <duplicates>` of the entity.
#[test]
fn entity_child() {
    let Ok(stream) = std::env::var(ENTITY_STREAM) else {
        return; // run as an ordinary test: nothing to do
    };
    let delay: u64 = std::env::var(ENTITY_ACK_DELAY).map_or(0, |d| d.parse().unwrap());
    let app = std::env::var(ENTITY_APP).unwrap();
    actix::System::new().block_on(async move {
        let journal = postgres_support::journal_named(&app, postgres_support::options()).await;
        let id = PersistenceId::new(stream).unwrap();
        let ledger = PersistentHandle::<Ledger>::start(
            PersistentOptions::new(Arc::new(journal), id).config(config()),
        )
        .unwrap();
        let recovered = ledger.ask(Op::Count).await.expect("the ledger recovers");
        let consumer = ReliableDelivery::consumer(
            ConsumerOptions::builder(ledger.delivery_handler(Op::Apply))
                .build()
                .unwrap(),
        );
        let reply_to = ReplyTo::from_fn(move |acks| {
            let lines: Vec<String> = acks.iter().map(|ack| format!("ack {}", ack.seq)).collect();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay));
                println!("{}", lines.join("\n"));
            });
        });
        let addr = consumer.addr().clone();
        println!("ready {recovered}");
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let fields: Vec<u64> = line
                    .split(' ')
                    .skip(1)
                    .map(|f| f.parse().unwrap())
                    .collect();
                let delivery =
                    Delivery::new("p", INCARNATION, fields[0], fields[0], reply_to.clone())
                        .with_window_start(fields[1]);
                addr.do_send(delivery);
            }
            std::process::exit(0); // stdin closed: the test is done with this child
        });
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Ok(stats) = ledger.stats().await {
                println!("stats {} {}", stats.conflicts, stats.duplicates);
            }
        }
    });
}

/// One running entity process and the highest counters it reported.
struct Entity {
    child: process::Child,
    app: String,
    conflicts: u64,
    duplicates: u64,
}

impl Entity {
    /// Starts one and waits for its `ready`; returns it and the size it recovered.
    fn start(stream: &PersistenceId, delay: u64) -> (Self, usize) {
        let app = postgres_support::unique("failover");
        let env = [
            (ENTITY_STREAM, stream.to_string()),
            (ENTITY_ACK_DELAY, delay.to_string()),
            (ENTITY_APP, app.clone()),
        ];
        let child = process::spawn(concat!(module_path!(), "::entity_child"), &env);
        let ready = child.expect_line("ready ", Duration::from_secs(30));
        let recovered = ready["ready ".len()..].parse().unwrap();
        let entity = Self {
            child,
            app,
            conflicts: 0,
            duplicates: 0,
        };
        (entity, recovered)
    }

    /// SIGKILLs the process, then waits until the server is done with its sessions: a
    /// transaction the process had sent before it died still runs to its end on the
    /// server, and may commit (that is what the fence is for).
    fn kill(self, admin: &tokio_postgres::Client, rt: &tokio::runtime::Runtime) {
        self.child.kill();
        rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let row = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        &[&self.app],
                    )
                    .await
                    .unwrap();
                if row.get::<_, i64>(0) == 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the killed process's sessions linger"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }

    fn send_window(&mut self, unacked: &BTreeSet<u64>) {
        let Some(&window_start) = unacked.first() else {
            return;
        };
        for seq in unacked.iter().take(WINDOW) {
            self.child.send(&format!("d {seq} {window_start}"));
        }
    }

    /// Takes the child's lines for a moment: removes ACKed messages from `unacked`, returns
    /// how many it removed.
    fn take_acks(&mut self, unacked: &mut BTreeSet<u64>) -> u64 {
        let mut acked = 0;
        while let Some(line) = self
            .child
            .next_line(Instant::now() + Duration::from_millis(5))
        {
            if let Some(seq) = line.strip_prefix("ack ") {
                acked += u64::from(unacked.remove(&seq.parse().unwrap()));
            } else if let Some(stats) = line.strip_prefix("stats ") {
                let mut fields = stats.split(' ').map(|f| f.parse::<u64>().unwrap());
                self.conflicts = self.conflicts.max(fields.next().unwrap());
                self.duplicates = self.duplicates.max(fields.next().unwrap());
            }
        }
        acked
    }
}

#[test]
fn a_persistent_entity_fails_over_between_processes_without_duplicates() {
    let seed: u64 = std::env::var("FAILOVER_SEED").map_or(11, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let stream = PersistenceId::new(postgres_support::unique("ledger")).unwrap();
    let rt = runtime();
    let (journal, admin) = rt.block_on(async {
        (
            postgres_support::journal().await,
            postgres_support::admin().await,
        )
    });
    let durable = || {
        rt.block_on(recover_state::<Ledger>(&journal, &stream))
            .expect("recover the ledger")
    };
    let mut unacked: BTreeSet<u64> = (1..=MESSAGES).collect();
    let (mut kills, mut overlaps, mut conflicts, mut duplicates) = (0, 0, 0, 0);
    let mut committed_unacked = 0;
    let started = Instant::now();
    let (mut entity, recovered) = Entity::start(&stream, 0);
    assert_eq!(recovered, 0);
    loop {
        // Run until a seeded number of ACKs or milliseconds, whichever comes first.
        let (acks_before_kill, life) = if kills < KILLS {
            (
                rng.random_range(0..=40),
                Duration::from_millis(rng.random_range(50..=300)),
            )
        } else {
            (u64::MAX, Duration::from_secs(60))
        };
        let born = Instant::now();
        let (mut acked_here, mut last_send) = (0, None::<Instant>);
        while !unacked.is_empty() && acked_here < acks_before_kill && born.elapsed() < life {
            if last_send.is_none_or(|at| at.elapsed() >= RESEND) {
                entity.send_window(&unacked);
                last_send = Some(Instant::now());
            }
            acked_here += entity.take_acks(&mut unacked);
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no progress (seed {seed})"
            );
        }
        if kills >= KILLS && unacked.is_empty() {
            entity.take_acks(&mut unacked);
            conflicts += entity.conflicts;
            duplicates += entity.duplicates;
            entity.kill(&admin, &rt);
            break;
        }
        let delay = [0, 30, 60][rng.random_range(0..3)];
        let overlap = kills % 2 == 1;
        let next = if overlap {
            // The new instance starts while the old one still runs, and both take the
            // same deliveries for a while: two writers of one stream.
            let (mut next, _) = Entity::start(&stream, delay);
            let until = Instant::now() + Duration::from_millis(150);
            while Instant::now() < until {
                entity.send_window(&unacked);
                next.send_window(&unacked);
                entity.take_acks(&mut unacked);
                next.take_acks(&mut unacked);
            }
            entity.take_acks(&mut unacked);
            overlaps += 1;
            Some(next)
        } else {
            // Let a window be committed while its ACKs are still held back: the kill lands
            // between commit and ACK.
            entity.send_window(&unacked);
            std::thread::sleep(Duration::from_millis(15));
            None
        };
        conflicts += entity.conflicts;
        duplicates += entity.duplicates;
        entity.kill(&admin, &rt);
        kills += 1;
        // What is stored now: every ACKed message, each at most once.
        let ledger = durable();
        for message in (1..=MESSAGES).filter(|m| !unacked.contains(m)) {
            assert!(
                ledger.applied.contains_key(&message),
                "seed {seed}, kill {kills}: message {message} was ACKed but is not stored"
            );
        }
        assert!(
            ledger.applied.values().all(|&n| n == 1),
            "seed {seed}, kill {kills}: a message stored twice: {:?}",
            ledger
                .applied
                .iter()
                .filter(|&(_, &n)| n > 1)
                .collect::<Vec<_>>()
        );
        committed_unacked += unacked
            .iter()
            .filter(|m| ledger.applied.contains_key(m))
            .count();
        entity = match next {
            Some(next) => next,
            None => {
                let (next, recovered) = Entity::start(&stream, delay);
                assert_eq!(
                    recovered,
                    ledger.applied.len(),
                    "seed {seed}, life {kills}: the new process recovered another state than \
                     the journal holds"
                );
                next
            }
        };
    }
    let ledger = durable();
    let expected: BTreeMap<u64, u32> = (1..=MESSAGES).map(|m| (m, 1)).collect();
    assert_eq!(
        ledger.applied, expected,
        "seed {seed}: every message exactly once"
    );
    println!(
        "seed {seed}: {kills} kills ({overlaps} overlapping), {committed_unacked} messages \
         committed but not ACKed at a kill, {conflicts} conflicts, {duplicates} duplicates \
         answered from the journal's record"
    );
    assert!(
        committed_unacked > 0,
        "seed {seed}: no kill landed between a commit and its ACK"
    );
    assert!(
        conflicts > 0,
        "seed {seed}: the overlapping instances never raced: the fence was not exercised"
    );
}
