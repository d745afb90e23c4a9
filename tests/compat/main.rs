//! The compatibility suite: nodes of this release and of the previous one (the commit in
//! `previous-release`) deliver to each other, over TCP (a shared secret, mutual TLS) and NATS,
//! in both directions, through plain and durable producers; a cluster of the previous release
//! is upgraded node by node under load, and one node rolled back; and each release opens the
//! journals the other wrote.
//!
//! Both releases run as processes of the same program, `node.rs`, built against each release
//! (`.ci/compat` builds them and runs this suite with their paths in
//! `ACTIX_DELIVERY_COMPAT_PREVIOUS` and `ACTIX_DELIVERY_COMPAT_CURRENT`): every test here is
//! `#[ignore]`d without them. PostgreSQL and NATS as for the feature suites.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use actix_delivery::journal::{PersistenceId, PostgresJournal, PostgresOptions};
use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
use actix_delivery::persistence::recover_state;
use actix_delivery::sharding::{
    EntityId, LeaseStore, NatsShards, PostgresLeaseStore, ShardedProducerOptions,
};
use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerConfig, ReliableDelivery,
};

#[path = "account.rs"]
mod account;

use account::{Account, SHARDS};

/// The commit of the previous release: what `.ci/compat` builds.
const PREVIOUS_RELEASE: &str = include_str!("previous-release");

const SECRET: &str = "the compatibility suite's shared secret";

/// Which release a node process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Previous,
    Current,
}

impl Release {
    fn binary(self) -> PathBuf {
        let variable = match self {
            Release::Previous => "ACTIX_DELIVERY_COMPAT_PREVIOUS",
            Release::Current => "ACTIX_DELIVERY_COMPAT_CURRENT",
        };
        std::env::var_os(variable)
            .unwrap_or_else(|| panic!("{variable} is unset: run the suite with .ci/compat"))
            .into()
    }

    fn other(self) -> Self {
        match self {
            Release::Previous => Release::Current,
            Release::Current => Release::Previous,
        }
    }
}

/// A node process: its stdin (closing it ends the node) and the lines it prints.
struct Node {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Node {
    fn start(release: Release, args: &[&str]) -> Self {
        let mut child = Command::new(release.binary())
            .args(args)
            .env("COMPAT_SECRET", SECRET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a node process");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: format!("{release:?} {}", args[..2].join(" ")),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The rest of the next line starting with `prefix`, skipping others.
    fn expect(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(error) => panic!("{}: no `{prefix}` line ({error})", self.name),
            }
        }
    }

    /// Closes its stdin and waits for it to exit successfully; the lines it printed.
    fn finish(mut self) -> Vec<String> {
        drop(self.stdin.take());
        self.exit_within(Duration::from_secs(60))
    }

    /// Sends SIGTERM and waits for it to exit successfully; the lines it printed.
    fn terminate(mut self) -> Vec<String> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.expect("kill").success(), "SIGTERM to {}", self.name);
        self.exit_within(Duration::from_secs(60))
    }

    /// Waits for the process to exit successfully within `limit` (else kills it and fails);
    /// every line it printed that was not taken yet, to its last.
    fn exit_within(&mut self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the node's status") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{} did not end within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{} ended with {status}", self.name);
        // The reader ends at the end of the output: every line is in.
        self.lines.iter().collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The numbers in the `got <n>` lines.
fn got(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix("got ")?.parse().ok())
        .collect()
}

/// A directory of PEM files for mutual TLS: `ca.pem`, `consumer.pem`/`.key` (for 127.0.0.1)
/// and `producer.pem`/`.key` (for `producer.example`), made by a CA of this run.
fn tls_files(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, ca_key);
    for (role, name) in [("consumer", "127.0.0.1"), ("producer", "producer.example")] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{role}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{role}.key")), key.serialize_pem()).unwrap();
    }
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
}

const MESSAGES: u64 = 300;

/// A unique name for this run's subjects, schemas and entity types.
fn unique(what: &str) -> String {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!("{what}_{}_{stamp}", std::process::id())
}

/// Over one transport (`tcp secret`, `tcp mtls` or `nats`): for each release as the consumer,
/// a plain producer of the other release delivers `MESSAGES` numbers; then a durable producer
/// of the other release delivers as many on a fresh SQLite journal, and a durable producer of
/// the consumer's release continues the same journal stream with as many more. Every number
/// must be handled exactly once, and every producer must see each of its messages confirmed.
fn mixed_pairs(transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().to_str().unwrap().to_owned();
    if transport == "tcp mtls" {
        tls_files(dir.path());
    }
    for consumer_release in [Release::Previous, Release::Current] {
        let producer_release = consumer_release.other();
        let subject = unique("actix-delivery-compat.orders");
        let consumer = match transport {
            "nats" => Node::start(consumer_release, &["consume", "nats", &subject]),
            _ => {
                let auth = transport.strip_prefix("tcp ").unwrap();
                let args = ["consume", "tcp", "127.0.0.1:0", auth, &tls_dir];
                Node::start(consumer_release, &args)
            }
        };
        let ready = consumer.expect("ready", Duration::from_secs(30));
        let journal = dir.path().join(format!("{consumer_release:?}.db"));
        let journal = journal.to_str().unwrap();
        let runs = [
            (producer_release, 0, "plain"),
            (producer_release, MESSAGES, journal),
            (consumer_release, 2 * MESSAGES, journal),
        ];
        for (release, first, journal) in runs {
            let (first, count) = (first.to_string(), MESSAGES.to_string());
            let producer = match transport {
                "nats" => {
                    let args = ["produce", "nats", &subject, &first, &count, journal];
                    Node::start(release, &args)
                }
                _ => {
                    let auth = transport.strip_prefix("tcp ").unwrap();
                    let args = [
                        "produce", "tcp", &ready, auth, &tls_dir, &first, &count, journal,
                    ];
                    Node::start(release, &args)
                }
            };
            // (The producer counts the confirmations it saw succeed.)
            let confirmed = producer.expect("confirmed", Duration::from_secs(60));
            assert_eq!(confirmed, count, "{transport}: {release:?} producer");
            producer.finish();
        }
        let mut numbers = got(&consumer.finish());
        let handled = numbers.len();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(
            (handled, numbers),
            (3 * MESSAGES as usize, (0..3 * MESSAGES).collect::<Vec<_>>()),
            "{transport}: a consumer of the {consumer_release:?} release handles every number \
             of producers of both releases exactly once"
        );
        println!(
            "{transport}: {consumer_release:?} consumer, {producer_release:?} plain and durable \
             producers, then a {consumer_release:?} durable producer on the same journal: {} \
             messages, each handled once",
            3 * MESSAGES
        );
    }
}

#[test]
#[ignore = "needs both releases' nodes: run .ci/compat"]
fn the_releases_deliver_to_each_other_over_tcp_with_a_secret() {
    mixed_pairs("tcp secret");
}

#[test]
#[ignore = "needs both releases' nodes: run .ci/compat"]
fn the_releases_deliver_to_each_other_over_mutual_tls() {
    mixed_pairs("tcp mtls");
}

#[test]
#[ignore = "needs both releases' nodes and NATS: run .ci/compat"]
fn the_releases_deliver_to_each_other_over_nats() {
    mixed_pairs("nats");
}

const ACCOUNTS: u64 = 100;
/// A deposit every this often during the roll.
const DEPOSIT_EVERY: Duration = Duration::from_millis(4);

fn postgres() -> String {
    std::env::var("ACTIX_DELIVERY_POSTGRES")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into())
}

fn nats() -> String {
    std::env::var("ACTIX_DELIVERY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn account(n: u64) -> EntityId {
    EntityId::new(format!("account-{n}")).unwrap()
}

/// Starts a node of the sharded cluster (`shard` and `args`, see `node.rs`) and waits, off
/// this test's arbiter, until it is ready.
async fn start_shard(release: Release, args: [String; 6]) -> Node {
    tokio::task::spawn_blocking(move || {
        let mut all = vec!["shard"];
        all.extend(args.iter().map(String::as_str));
        let node = Node::start(release, &all);
        node.expect("ready", Duration::from_secs(60));
        node
    })
    .await
    .unwrap()
}

/// A percentile of sorted `values`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

/// Three nodes of the previous release (sharded accounts on a shared PostgreSQL journal and
/// lease store, deposits over NATS from this process, each node feeding a durable producer
/// over TCP to this process) are replaced one at a time, by SIGTERM, with nodes of this
/// release, under a steady load of deposits; then one node is rolled back to the previous
/// release, which reads what this release wrote. Every deposit is confirmed and applied once
/// (the journal says), every number a node stored is delivered, and the confirmation
/// latencies during the roll are reported.
#[actix::test]
#[ignore = "needs both releases' nodes, PostgreSQL and NATS: run .ci/compat"]
async fn a_rolling_upgrade_under_load_loses_nothing_and_applies_each_deposit_once() {
    let schema = unique("compat_roll");
    let entity_type = unique("account");
    let prefix = format!("actix-delivery-compat.{entity_type}");

    // The feed consumer: what the nodes' durable producers deliver, counted by number.
    let fed: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let counts = fed.clone();
    let feed = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |n: u64| {
            *counts.lock().unwrap().entry(n).or_default() += 1;
            async { Ok::<(), std::io::Error>(()) }
        }))
        .build()
        .unwrap(),
    );
    let secret = NodeSecret::new(SECRET).unwrap();
    let options = NodeOptions::builder()
        .secret(secret)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let tcp = NodeHandle::start(options).await.unwrap();
    tcp.expose("feed", &feed).unwrap();
    let feed_addr: SocketAddr = tcp.local_addr().unwrap();

    let leases = PostgresLeaseStore::connect(&postgres(), &schema, Duration::from_secs(2))
        .await
        .unwrap();
    let feed_addr = feed_addr.to_string();
    let mut generation = 0u64;
    let mut shard_args = |name: &str| {
        generation += 1;
        let first = (generation * 1_000_000).to_string();
        [name, &entity_type, &prefix, &schema, &feed_addr, &first].map(str::to_owned)
    };
    let mut stored = BTreeSet::new();
    let mut take_stored = |lines: Vec<String>| {
        let before = stored.len();
        stored.extend(
            lines
                .iter()
                .filter_map(|line| line.strip_prefix("stored ")?.parse::<u64>().ok()),
        );
        assert!(
            lines.iter().any(|line| line == "stopped"),
            "the node stopped gracefully"
        );
        stored.len() - before
    };
    let mut nodes = BTreeMap::new();
    for name in ["a", "b", "c"] {
        let node = start_shard(Release::Previous, shard_args(name)).await;
        nodes.insert(name, node);
    }
    let all_owned = |leases: PostgresLeaseStore, entity_type: String| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        while leases.view(&entity_type).await.unwrap().leases.len() < SHARDS as usize {
            assert!(Instant::now() < deadline, "every shard is owned");
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
    };
    all_owned(leases.clone(), entity_type.clone()).await;

    // The load: a deposit every DEPOSIT_EVERY, each timed from when it was due to its
    // confirmation.
    let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default())
        .await
        .unwrap();
    let destination = NatsShards::<u64>::destination(&carrier, &prefix).unwrap();
    let producer = ReliableDelivery::sharded_producer(
        ShardedProducerOptions::per_shard(destination)
            .shards(SHARDS)
            .entity_stream(ProducerConfig {
                resend_timeout: Duration::from_millis(300),
                ..ProducerConfig::default()
            })
            .build()
            .unwrap(),
    );
    type Confirmed = Vec<(u64, Instant, Result<(), DeliveryError>)>;
    let confirmed: Arc<Mutex<Confirmed>> = Arc::default();
    let due_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let (producer, confirmed, due_at, running) = (
            producer.clone(),
            confirmed.clone(),
            due_at.clone(),
            running.clone(),
        );
        actix::spawn(async move {
            let mut ticks = actix::clock::interval(DEPOSIT_EVERY);
            let mut deposit = 0u64;
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                // Timed from when it was due, not from when this task got to send it: a
                // stall of this arbiter counts.
                let due = ticks.tick().await.into_std();
                let confirmed = confirmed.clone();
                due_at.lock().unwrap().push(due);
                let to = account(deposit * 7919 % ACCOUNTS);
                let confirm = move |result| {
                    confirmed
                        .lock()
                        .unwrap()
                        .push((deposit, Instant::now(), result))
                };
                if producer.tell(to, deposit, confirm).is_err() {
                    panic!("the sharded producer refused deposit {deposit}");
                }
                deposit += 1;
            }
            deposit
        })
    };
    let settle = Duration::from_secs(3);
    actix::clock::sleep(settle).await;

    // The roll: each node of the previous release replaced by one of this release; then node
    // `a` back to the previous release, reading what this release wrote.
    let roll_started = Instant::now();
    let mut step_started = Vec::new();
    let steps = [
        ("a", Release::Current),
        ("b", Release::Current),
        ("c", Release::Current),
        ("a", Release::Previous),
    ];
    for (name, release) in steps {
        let old = nodes.remove(name).unwrap();
        let stopping = Instant::now();
        step_started.push((format!("{name} to {release:?}"), stopping));
        let lines = actix::clock::timeout(
            Duration::from_secs(60),
            tokio::task::spawn_blocking(move || old.terminate()),
        )
        .await
        .expect("the node stops within a minute")
        .unwrap();
        let fed_by_it = take_stored(lines);
        let stopped_in = stopping.elapsed();
        let node = start_shard(release, shard_args(name)).await;
        println!(
            "node {name}: stopped by SIGTERM in {:.2} s (it stored {fed_by_it} feed numbers), \
             started again as the {release:?} release",
            stopped_in.as_secs_f64()
        );
        nodes.insert(name, node);
        actix::clock::sleep(settle).await;
    }
    let roll_ended = Instant::now();
    all_owned(leases.clone(), entity_type.clone()).await;

    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let deposits = load.await.unwrap();
    actix::clock::timeout(Duration::from_secs(120), producer.idle())
        .await
        .expect("every deposit is confirmed within two minutes of the roll");
    for (_, node) in std::mem::take(&mut nodes) {
        let lines = tokio::task::spawn_blocking(move || node.terminate())
            .await
            .unwrap();
        take_stored(lines);
    }

    // Every deposit confirmed once, and applied once, in order, as the journal says.
    let confirmed = std::mem::take(&mut *confirmed.lock().unwrap());
    let failed: Vec<_> = confirmed.iter().filter(|(_, _, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "deposits not confirmed: {failed:?}");
    let mut ids: Vec<u64> = confirmed.iter().map(|(d, _, _)| *d).collect();
    ids.sort_unstable();
    let all: Vec<u64> = (0..deposits).collect();
    assert_eq!(ids, all, "each deposit confirmed once");
    let journal = PostgresJournal::connect_with(
        &postgres(),
        PostgresOptions::builder().schema(&schema).build().unwrap(),
    )
    .await
    .unwrap();
    let mut applied = 0;
    for to in 0..ACCOUNTS {
        let id = PersistenceId::new(format!("{entity_type}|{}", account(to))).unwrap();
        let state = recover_state::<Account>(&journal, &id).await.unwrap();
        let sent: Vec<u64> = (0..deposits)
            .filter(|d| d * 7919 % ACCOUNTS == to)
            .collect();
        assert_eq!(
            state.deposits, sent,
            "account {to}: each deposit once, in order"
        );
        applied += state.deposits.len();
    }

    // Every number a node stored reached the feed consumer (at least once: a durable producer
    // with a plain consumer).
    let fed = fed.lock().unwrap();
    let missing: Vec<_> = stored.iter().filter(|n| !fed.contains_key(n)).collect();
    assert!(
        missing.is_empty(),
        "stored and never delivered: {missing:?}"
    );
    let again = fed.values().filter(|&&times| times > 1).count();

    // The confirmation latencies of the deposits sent during the roll, and the longest time
    // without any confirmation.
    let due_at = due_at.lock().unwrap();
    let mut latencies: Vec<Duration> = confirmed
        .iter()
        .filter(|(d, _, _)| {
            let at = due_at[*d as usize];
            at >= roll_started && at <= roll_ended
        })
        .map(|(d, at, _)| at.duration_since(due_at[*d as usize]))
        .collect();
    latencies.sort_unstable();
    // The slowest deposit due in each step (from its SIGTERM to the next one).
    let mut slowest = vec![Duration::ZERO; step_started.len()];
    for (d, at, _) in &confirmed {
        let due = due_at[*d as usize];
        if let Some(step) = step_started.iter().rposition(|(_, began)| *began <= due) {
            slowest[step] = slowest[step].max(at.duration_since(due));
        }
    }
    let by_step: Vec<String> = step_started
        .iter()
        .zip(&slowest)
        .map(|((step, _), took)| format!("{step} {:.0} ms", took.as_secs_f64() * 1e3))
        .collect();
    println!(
        "the slowest deposit due in each step of the roll: {}",
        by_step.join(", ")
    );
    let mut times: Vec<Instant> = confirmed.iter().map(|(_, at, _)| *at).collect();
    times.sort_unstable();
    let longest_gap = times
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]))
        .max()
        .unwrap_or_default();
    println!(
        "rolling upgrade from {} (previous) to this release and one node back: {deposits} \
         deposits, {applied} applied once each (journal); {} feed numbers stored, all \
         delivered ({again} twice); confirmation latency during the roll ({} deposits): \
         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; the longest time without a confirmation \
         {:.0} ms",
        PREVIOUS_RELEASE.trim(),
        stored.len(),
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
        longest_gap.as_secs_f64() * 1e3,
    );
}
