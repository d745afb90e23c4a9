//! Reliable delivery to a consumer node in another process that is SIGKILLed and restarted
//! again and again: this test binary runs itself as the child (a node listening on a fixed
//! port of 127.0.0.1 with the consumer), while the test keeps a producer node and a producer
//! alive throughout. Every message is confirmed exactly once and none is lost; with the
//! effectively-once consumer on SQLite the journal shows no business event stored twice.
//!
//! The in-memory child holds each message's ACK back a seeded 5–50 ms after its handler ran
//! (`handled <n>`, then `done <n>` as the ACK goes out), so its kills land while messages are
//! handled and not acknowledged: those are delivered again to the next life (counted, and
//! asserted), and every confirmed message was done by some life. The persistent child holds
//! each ACK back the same way after the commit (`committed <n>`), and is killed after a seeded
//! number of commits, so kills land between a commit and its ACK in any build profile.
//!
//! Replay a seed with `CRASH_SEED=5 cargo test --test processes remote_crash:: -- --nocapture`; set
//! `REMOTE_CRASH_KILLS` for more kills (default 12).

use crate::common;
use crate::process;
use crate::remote;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::PersistenceId;
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentHandle, PersistentOptions,
};
use actix_delivery::tcp::{NodeHandle, NodeOptions};
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerHandle, ReliableDelivery};
use common::{confirm_into, Confirmations};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The test that is the child (it does nothing unless [`CHILD_PORT`] is set).
const ENTRY: &str = concat!(module_path!(), "::child_node_entry");
/// Set for the child: the port to listen on.
const CHILD_PORT: &str = "REMOTE_CRASH_PORT";
/// Set for the child of the persistent variant: its journal file.
const CHILD_DB: &str = "REMOTE_CRASH_DB";
/// Set for the child: how long each handler holds its ACK back, in ms (the persistent one
/// after its commit).
const CHILD_ACK_DELAY: &str = "REMOTE_CRASH_ACK_DELAY_MS";

const MESSAGES: u64 = 800;

/// The persistent child's entity: each message applied, counted per message.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied(u64);

impl EventSourced for Ledger {
    type Command = u64;
    type Event = Applied;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, message: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Applied(*message)], ()))
    }

    fn apply(&mut self, Applied(message): &Applied) {
        *self.applied.entry(*message).or_default() += 1;
    }
}

fn ledger_id() -> PersistenceId {
    PersistenceId::new("ledger").unwrap()
}

/// The child: a node on the given port exposing "numbers", printing `ready <node id>` once it
/// listens and `handled <n>` when a message's handler runs (before its ACK can be sent); the
/// in-memory one prints `done <n>` when the handler finishes, [`CHILD_ACK_DELAY`] later, and
/// its ACK goes out.
#[test]
fn child_node_entry() {
    let Ok(port) = std::env::var(CHILD_PORT) else {
        return; // run as an ordinary test: nothing to do
    };
    let journal = std::env::var(CHILD_DB).ok();
    let delay: u64 = std::env::var(CHILD_ACK_DELAY).map_or(0, |d| d.parse().unwrap());
    actix::System::new().block_on(async move {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let options = remote::secured(NodeOptions::builder())
            .listen(addr)
            .build()
            .unwrap();
        let node = NodeHandle::start(options).await.expect("bind the port");
        let handler = match journal {
            Some(path) => {
                let journal = process::open_journal(&path)
                    .await
                    .expect("open the journal");
                let ledger = PersistentHandle::<Ledger>::start(PersistentOptions::new(
                    Arc::new(journal),
                    ledger_id(),
                ))
                .unwrap();
                // The entity's delivery handler, with the ACK held back after the commit
                // (`committed <n>`), so that kills land between a commit and its ACK
                // however fast the build.
                DeliveryHandler::pipelined(move |info, n: u64| {
                    println!("handled {n}"); // decided now, stored when the append commits
                    let stored = ledger.ask_delivered(info, n);
                    async move {
                        stored.await.map_err(|error| error.to_string())?;
                        println!("committed {n}");
                        actix::clock::sleep(Duration::from_millis(delay)).await;
                        Ok::<(), String>(())
                    }
                })
            }
            // Pipelined: the held ACKs overlap, so messages keep flowing.
            None => DeliveryHandler::pipelined(move |_, n: u64| {
                println!("handled {n}");
                async move {
                    actix::clock::sleep(Duration::from_millis(delay)).await;
                    println!("done {n}");
                    Ok::<(), String>(())
                }
            }),
        };
        let consumer =
            ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
        node.expose("numbers", &consumer).unwrap();
        println!("ready {}", node.id());
        std::future::pending::<()>().await;
    });
}

/// Collects the child's lines without blocking the test's runtime.
async fn lines_until(
    child: &process::Child,
    deadline: Instant,
    mut stop: impl FnMut(&str) -> bool,
    seen: &mut Vec<String>,
) -> bool {
    while Instant::now() < deadline {
        match child.try_line() {
            Ok(Some(line)) => {
                let done = stop(&line);
                seen.push(line);
                if done {
                    return true;
                }
            }
            Ok(None) => tokio::time::sleep(Duration::from_millis(2)).await,
            Err(()) => return false,
        }
    }
    false
}

struct Run {
    kills: u32,
    lives_with_traffic: u64,
    /// How many lives handled each message.
    handled: HashMap<u64, u32>,
    /// Messages whose handler finished (its ACK sent) in some life.
    done: HashSet<u64>,
    peers: HashSet<String>,
}

/// Runs the producer against a child that is killed `kills` times at seeded moments, then
/// left to finish. `after_kill` inspects the durable state between lives.
async fn run(
    seed: u64,
    kills: u32,
    db: Option<&std::path::Path>,
    mut after_kill: impl AsyncFnMut(u32, HashSet<u64>),
) -> Run {
    let mut rng = SmallRng::seed_from_u64(seed);
    let addr = remote::reusable_addr();
    let port = addr.port();
    let node = remote::sending_node().await;
    let producer: ProducerHandle<u64> =
        remote::producer(node.consumer_ref::<u64>(addr, "numbers").unwrap(), 32, 50);
    let confirmations = Confirmations::<u64>::default();
    // Messages keep coming while the child is killed and restarted.
    let (sender, log) = (producer.clone(), confirmations.clone());
    actix::spawn(async move {
        for n in 1..=MESSAGES {
            sender.tell(n, confirm_into(&log, n)).unwrap();
            if n % 4 == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let mut env = vec![(CHILD_PORT, port.to_string())];
    env.extend(remote::child_env());
    if let Some(db) = db {
        env.push((CHILD_DB, db.display().to_string()));
    }
    let started = Instant::now();
    let mut run = Run {
        kills: 0,
        lives_with_traffic: 0,
        handled: HashMap::new(),
        done: HashSet::new(),
        peers: HashSet::new(),
    };
    loop {
        let mut env = env.clone();
        env.push((
            CHILD_ACK_DELAY,
            [5, 20, 50][rng.random_range(0..3)].to_string(),
        ));
        let child = process::spawn(ENTRY, &env);
        let mut lines = Vec::new();
        let ready = lines_until(
            &child,
            Instant::now() + Duration::from_secs(30),
            |l| l.starts_with("ready "),
            &mut lines,
        )
        .await;
        assert!(ready, "seed {seed}: the child did not start: {lines:?}");
        let last = run.kills >= kills;
        let all_confirmed = || confirmations.len() as u64 == MESSAGES;
        if last {
            // The last life runs until everything is confirmed.
            while !all_confirmed() && started.elapsed() < Duration::from_secs(120) {
                let soon = Instant::now() + Duration::from_millis(20);
                lines_until(&child, soon, |_| false, &mut lines).await;
            }
        } else {
            // Kill after a seeded number of handled (persistent: committed) messages, or a
            // seeded time.
            let life = Duration::from_millis(rng.random_range(50..=300));
            let handled_before_kill: usize = rng.random_range(1..=60);
            let trigger = if db.is_some() {
                "committed "
            } else {
                "handled "
            };
            let mut handled_here = 0;
            lines_until(
                &child,
                Instant::now() + life,
                |l| {
                    handled_here += usize::from(l.starts_with(trigger));
                    handled_here >= handled_before_kill
                },
                &mut lines,
            )
            .await;
        }
        // The pipe holds what the child printed before it died: collect it too.
        lines.extend(child.kill_collect());
        run.lives_with_traffic += u64::from(lines.iter().any(|l| l.starts_with("handled ")));
        let mut handled_here = HashSet::new();
        for line in &lines {
            let number = |n: &str| -> u64 {
                n.parse()
                    .unwrap_or_else(|_| panic!("seed {seed}: the child printed {line:?}"))
            };
            if let Some(n) = line.strip_prefix("handled ") {
                handled_here.insert(number(n));
            }
            if let Some(n) = line.strip_prefix("done ") {
                run.done.insert(number(n));
            }
            if let Some(id) = line.strip_prefix("ready ") {
                run.peers.insert(id.to_string());
            }
        }
        for n in handled_here {
            *run.handled.entry(n).or_default() += 1; // lives that handled it
        }
        if last {
            break;
        }
        run.kills += 1;
        let confirmed: HashSet<u64> = confirmations
            .snapshot()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if db.is_none() {
            let never_done: Vec<&u64> = confirmed
                .iter()
                .filter(|n| !run.done.contains(n))
                .take(10)
                .collect();
            assert!(
                never_done.is_empty(),
                "seed {seed}, kill {}: confirmed, but no life finished handling them: \
                 {never_done:?}",
                run.kills
            );
        }
        after_kill(run.kills, confirmed).await;
    }
    assert_eq!(
        confirmations.len() as u64,
        MESSAGES,
        "seed {seed}: not everything was confirmed"
    );
    remote::assert_each_confirmed_once(&confirmations, MESSAGES, &format!("seed {seed}"));
    let stats = node.stats();
    assert!(
        stats.connections_opened >= run.lives_with_traffic,
        "seed {seed}: {stats:?}"
    );
    assert!(
        run.lives_with_traffic > u64::from(run.kills) / 2,
        "seed {seed}: most kills must land while messages flow"
    );
    assert!(producer.stats().await.unwrap().retransmitted > 0);
    println!(
        "seed {seed}: {} kills, {} connections, {} deliveries dropped while disconnected",
        run.kills, stats.connections_opened, stats.deliveries_dropped_disconnected
    );
    run
}

#[actix::test]
async fn every_message_is_confirmed_across_sigkills_of_the_consumer_node() {
    let seed: u64 = std::env::var("CRASH_SEED").map_or(11, |s| s.parse().unwrap());
    let kills: u32 = std::env::var("REMOTE_CRASH_KILLS").map_or(12, |s| s.parse().unwrap());
    let run = run(seed, kills, None, async |_, _| {}).await;
    assert!(run.kills >= kills.min(10));
    let never_done: Vec<u64> = (1..=MESSAGES)
        .filter(|n| !run.done.contains(n))
        .take(10)
        .collect();
    assert!(
        never_done.is_empty(),
        "seed {seed}: confirmed, but no life finished handling them: {never_done:?}"
    );
    assert_eq!(
        run.peers.len() as u32,
        run.kills + 1,
        "a new node id per life"
    );
    // Handled, killed before the ACK, delivered again to the next life.
    let again = run.handled.values().filter(|&&c| c > 1).count();
    assert!(
        again > 0,
        "seed {seed}: no kill landed while a handled message was unacknowledged"
    );
    println!("seed {seed}: {again} messages handled by more than one life (at least once)");
}

#[actix::test]
async fn with_the_persistent_consumer_no_business_event_is_stored_twice() {
    let seed: u64 = std::env::var("CRASH_SEED").map_or(12, |s| s.parse().unwrap());
    let kills: u32 = std::env::var("REMOTE_CRASH_KILLS").map_or(12, |s| s.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let stored = async |path: &std::path::Path| -> Ledger {
        let journal = process::open_journal(path)
            .await
            .expect("reopen the journal");
        let ledger = recover_state::<Ledger>(&journal, &ledger_id())
            .await
            .expect("recover");
        journal.close().await; // releases the file's lock before the next child opens it
        ledger
    };
    let mut committed_unconfirmed = 0;
    let run = run(seed, kills, Some(&path), async |kill, confirmed| {
        let ledger = stored(&path).await;
        let twice: Vec<_> = ledger.applied.iter().filter(|&(_, &n)| n > 1).collect();
        assert!(
            twice.is_empty(),
            "seed {seed}, kill {kill}: stored twice: {twice:?}"
        );
        for n in &confirmed {
            assert!(
                ledger.applied.contains_key(n),
                "seed {seed}, kill {kill}: message {n} confirmed but not stored"
            );
        }
        committed_unconfirmed += ledger
            .applied
            .keys()
            .filter(|n| !confirmed.contains(n))
            .count();
    })
    .await;
    assert!(run.kills >= kills.min(10));
    let ledger = stored(&path).await;
    let expected: BTreeMap<u64, u32> = (1..=MESSAGES).map(|n| (n, 1)).collect();
    assert_eq!(
        ledger.applied, expected,
        "seed {seed}: every message stored exactly once"
    );
    // Messages stored but not yet confirmed when their consumer died: resent, and recognised
    // by the recovered record instead of being stored again.
    assert!(
        committed_unconfirmed > 0,
        "seed {seed}: no kill landed between a commit and its ACK"
    );
    println!("seed {seed}: {committed_unconfirmed} committed-but-unconfirmed at kills");
}
