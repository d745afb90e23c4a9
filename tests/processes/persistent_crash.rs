//! Effectively once across real crashes: a child process runs an effectively-once consumer (a
//! persistent ledger over a SQLite journal, snapshots with deletion on) fed through its stdin by
//! this test, which plays a producer that survives the child's crashes. The test SIGKILLs the child
//! at seeded moments (its ACKs are delayed, and a kill is aimed into the delay after a window is
//! sent again, so kills land between commit and ACK), restarts it, and resends, with the same
//! producer id, incarnation and seq, every message it has not seen ACKed. After each kill, and at
//! the end, it reads the journal: every ACKed message is stored, none twice, each child recovered
//! exactly the state the journal held when it started (compared entry by entry: which messages, how
//! often each), and at the end all messages are stored exactly once. At each kill the ACKs the
//! child printed before it died are collected from the pipe too: the last ACKs are the ones most
//! likely to outrun a commit.
//!
//! Replay a seed with `CRASH_SEED=5 cargo test --test processes persistent_crash:: -- --nocapture`.

use crate::process;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::PersistenceId;
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerOptions, Delivery, Incarnation, ReliableDelivery, ReplyTo};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The test that is the child (it does nothing unless [`CHILD_DB`] is set).
const ENTRY: &str = concat!(module_path!(), "::child_process_entry");
/// Set for the child: its journal file.
const CHILD_DB: &str = "PERSISTENT_CRASH_CHILD_DB";
/// Set for the child: how long it holds each ACK back, in ms.
const CHILD_ACK_DELAY: &str = "PERSISTENT_CRASH_ACK_DELAY_MS";

const MESSAGES: u64 = 600;
const WINDOW: usize = 32;
const KILLS: u32 = 30;
const RESEND: Duration = Duration::from_millis(100);
const INCARNATION: Incarnation = Incarnation::from_u128(0x5eed_0f11_fe00);

/// Each message applied to the ledger, counted per message.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied(u64);

enum Op {
    Apply(u64),
    /// Replies with the whole ledger.
    State,
}

impl EventSourced for Ledger {
    type Command = Op;
    type Event = Applied;
    type Reply = Option<BTreeMap<u64, u32>>;
    type Rejection = String;

    fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
        Ok(match *command {
            Op::Apply(message) => Decision::persist([Applied(message)], None),
            Op::State => Decision::reply(Some(self.applied.clone())),
        })
    }

    fn apply(&mut self, Applied(message): &Applied) {
        *self.applied.entry(*message).or_default() += 1;
    }
}

fn id() -> PersistenceId {
    PersistenceId::new("ledger").unwrap()
}

fn config() -> PersistentConfig {
    PersistentConfig {
        snapshot_every: Some(50),
        delete_events_on_snapshot: true,
        ..Default::default()
    }
}

/// The child: recovers its ledger and prints `ready <ledger>` (what it holds, see
/// [`encode`]), then takes
/// `d <seq> <window_start>` lines on stdin as deliveries of message `seq` from producer `p`
/// and prints `ack <seq>` for every ACK (after the delay).
#[test]
fn child_process_entry() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return; // run as an ordinary test: nothing to do
    };
    let delay: u64 = std::env::var(CHILD_ACK_DELAY).map_or(0, |d| d.parse().unwrap());
    actix::System::new().block_on(async move {
        let journal = process::open_journal(&path)
            .await
            .expect("open the journal");
        let ledger = PersistentHandle::<Ledger>::start(
            PersistentOptions::new(Arc::new(journal), id()).config(config()),
        )
        .unwrap();
        let recovered = ledger.ask(Op::State).await.expect("the ledger recovers");
        let recovered = encode(&recovered.unwrap_or_default());
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
        std::future::pending::<()>().await;
    });
}

/// A ledger as one line: `<message>:<count>` for each message, comma separated.
fn encode(applied: &BTreeMap<u64, u32>) -> String {
    let entries: Vec<String> = applied.iter().map(|(m, n)| format!("{m}:{n}")).collect();
    entries.join(",")
}

/// What [`encode`] wrote, or `None` for anything else.
fn decode(line: &str) -> Option<BTreeMap<u64, u32>> {
    line.split(',')
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (message, count) = entry.split_once(':')?;
            Some((message.parse().ok()?, count.parse().ok()?))
        })
        .collect()
}

/// The ledger as the journal holds it (read while no child runs).
fn durable(path: &Path, context: &str) -> Ledger {
    actix::System::new().block_on(async {
        let journal = process::open_journal(path)
            .await
            .unwrap_or_else(|e| panic!("{context}: reopen the journal: {e}"));
        let ledger = recover_state::<Ledger>(&journal, &id())
            .await
            .unwrap_or_else(|e| panic!("{context}: recover the ledger: {e}"));
        // Closed before the next child opens the file: a dropped journal releases its lock
        // only when its writer thread has ended, which under load came after the child tried.
        journal.close().await;
        ledger
    })
}

/// Takes an `ack <seq>` line: true if it acknowledged a message not acknowledged before.
fn take_ack(line: &str, unacked: &mut BTreeSet<u64>, seed: u64) -> bool {
    let Some(seq) = line.strip_prefix("ack ") else {
        return false;
    };
    let seq = seq
        .parse()
        .unwrap_or_else(|_| panic!("seed {seed}: the child printed {line:?}"));
    unacked.remove(&seq)
}

#[test]
fn every_message_is_stored_exactly_once_across_sigkills() {
    let seed: u64 = std::env::var("CRASH_SEED").map_or(7, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let mut unacked: BTreeSet<u64> = (1..=MESSAGES).collect();
    let (mut kills, mut committed_unacked_seen) = (0, 0);
    let mut stored_at_spawn = BTreeMap::new();
    let mut acks_collected_at_kills = 0;
    let started = Instant::now();
    loop {
        let delay: u64 = [0, 20, 60][rng.random_range(0..3)];
        let env = [
            (CHILD_DB, path.display().to_string()),
            (CHILD_ACK_DELAY, delay.to_string()),
        ];
        let mut child = process::spawn(ENTRY, &env);
        let ready = child
            .wait_for("ready ", Duration::from_secs(30))
            .unwrap_or_else(|| panic!("seed {seed}, life {kills}: the child did not start"));
        let recovered = decode(&ready["ready ".len()..])
            .unwrap_or_else(|| panic!("seed {seed}, life {kills}: the child printed {ready:?}"));
        assert_eq!(
            recovered, stored_at_spawn,
            "seed {seed}, life {kills}: the child recovered another state than the journal holds"
        );
        // Kill after a seeded number of ACKs or of milliseconds, whichever comes first.
        let (acks_before_kill, life) = if kills < KILLS {
            (
                rng.random_range(0..=30),
                Duration::from_millis(rng.random_range(0..=400)),
            )
        } else {
            (u64::MAX, Duration::from_secs(120))
        };
        let born = Instant::now();
        let (mut acked_here, mut last_send) = (0, None::<Instant>);
        while !unacked.is_empty() && acked_here < acks_before_kill && born.elapsed() < life {
            if last_send.is_none_or(|at| at.elapsed() >= RESEND) {
                let window_start = *unacked.first().unwrap();
                for seq in unacked.iter().take(WINDOW) {
                    child.send(&format!("d {seq} {window_start}"));
                }
                last_send = Some(Instant::now());
            }
            let Some(line) = child.next_line(Instant::now() + Duration::from_millis(10)) else {
                continue;
            };
            acked_here += u64::from(take_ack(&line, &mut unacked, seed));
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "no progress (seed {seed})"
            );
        }
        // Aim the kill between a commit and its ACK: a consumer ACKs all it committed
        // together in one batch, held back `delay` ms, so a kill right after an ACK batch
        // finds nothing committed and unacknowledged. Send what is left once more and kill
        // three quarters of the hold later: after the commit, before the ACK leaves.
        if kills < KILLS && delay > 0 && !unacked.is_empty() {
            let window_start = *unacked.first().unwrap();
            for seq in unacked.iter().take(WINDOW) {
                child.send(&format!("d {seq} {window_start}"));
            }
            std::thread::sleep(Duration::from_millis(delay * 3 / 4));
        }
        // What the child printed before it died counts: an ACK sent is an ACK given.
        for line in child.kill_collect() {
            acks_collected_at_kills += usize::from(take_ack(&line, &mut unacked, seed));
        }
        if unacked.is_empty() && kills >= KILLS {
            break;
        }
        kills += 1;
        // What is stored now: every ACKed message, each at most once.
        let ledger = durable(&path, &format!("seed {seed}, kill {kills}"));
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
        committed_unacked_seen += unacked
            .iter()
            .filter(|m| ledger.applied.contains_key(m))
            .count();
        stored_at_spawn = ledger.applied;
    }
    let ledger = durable(&path, &format!("seed {seed}, the end"));
    let expected: BTreeMap<u64, u32> = (1..=MESSAGES).map(|m| (m, 1)).collect();
    assert_eq!(
        ledger.applied, expected,
        "seed {seed}: every message exactly once"
    );
    assert!(kills >= KILLS);
    assert!(
        committed_unacked_seen > 0,
        "seed {seed}: no kill landed between a commit and its ACK"
    );
    println!(
        "seed {seed}: {kills} kills, {committed_unacked_seen} committed-but-unACKed at kills, \
         {acks_collected_at_kills} ACKs read from the pipe after a kill"
    );
}
