//! Sharded entities across processes: three node processes share 200 bank accounts (16
//! shards, leases and journal in PostgreSQL, deliveries over NATS); this process deposits
//! into random accounts through a sharded producer, kills one node with SIGKILL halfway, and
//! checks from the journal that every deposit was applied exactly once.
//!
//! ```text
//! cargo run --features postgres,nats --example sharding
//! ```
//!
//! Needs PostgreSQL and NATS: `ACTIX_DELIVERY_POSTGRES` (default `host=127.0.0.1 port=5432
//! user=postgres dbname=test`) and `ACTIX_DELIVERY_NATS_URL` (default
//! `nats://127.0.0.1:4222`).

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{PersistenceId, PostgresJournal, PostgresOptions};
use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
use actix_delivery::persistence::{recover_state, Decision, EventSourced, PersistentConfig};
use actix_delivery::sharding::{
    CoordinatorOptions, EntityHostOptions, EntityId, LeaseStore, NatsShards, PostgresLeaseStore,
    ShardCoordinatorHandle, ShardedProducerOptions,
};
use actix_delivery::{ProducerConfig, ReliableDelivery};
use serde::{Deserialize, Serialize};

#[path = "support/cluster.rs"]
mod cluster;

use cluster::{nats, postgres, spawn_node, until_stdin_closes};

const SHARDS: u32 = 16;
const ACCOUNTS: u64 = 200;
const DEPOSITS: u64 = 2_000;
const SCHEMA: &str = "actix_delivery_example";

/// A bank account: the deposits applied to it, in order.
#[derive(Default, Serialize, Deserialize)]
struct Account {
    deposits: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Deposited(u64);

impl EventSourced for Account {
    type Command = u64; // the deposit's number
    type Event = Deposited;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &deposit: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Deposited(deposit)], ()))
    }

    fn apply(&mut self, Deposited(deposit): &Deposited) {
        self.deposits.push(*deposit);
    }
}

async fn leases() -> PostgresLeaseStore {
    PostgresLeaseStore::connect(&postgres(), SCHEMA, Duration::from_secs(2))
        .await
        .expect("the lease store (is PostgreSQL running?)")
}

fn account(n: u64) -> EntityId {
    EntityId::new(format!("account-{n}")).expect("a valid id")
}

/// A node: `--node <name> <type> <prefix>`. Prints `ready <member>`, runs until its stdin
/// closes, then leaves the cluster gracefully.
fn node(name: String, entity_type: String, prefix: String) {
    actix::System::new().block_on(async move {
        let options = PostgresOptions::builder()
            .schema(SCHEMA)
            .build()
            .expect("valid options");
        let journal = PostgresJournal::connect_with(&postgres(), options)
            .await
            .expect("the journal");
        let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default())
            .await
            .expect("NATS (is it running?)");
        let host = EntityHostOptions::builder(entity_type)
            .shards(SHARDS)
            .persistent(PersistentConfig {
                must_follow: true, // each account sees the deposits in the order they were sent
                ..PersistentConfig::default()
            })
            .build()
            .expect("valid settings");
        let options = CoordinatorOptions::builder(name)
            .lease_ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_secs(1))
            .build()
            .expect("valid settings");
        let node = ShardCoordinatorHandle::<Account>::start(
            Arc::new(journal),
            host,
            Arc::new(leases().await),
            options,
            |host| {
                NatsShards::new(&carrier, &prefix, host.consumer(|deposit: u64| deposit))
                    .expect("a subject")
            },
        )
        .expect("valid versions");
        println!("ready {}", node.member());
        until_stdin_closes().await;
        node.stop(); // hand the shards off, leave
        node.stopped().await;
    });
}

/// Starts a node process; its member id once it is ready.
fn spawn(name: &str, entity_type: &str, prefix: &str) -> (Child, String) {
    let (child, ready) = spawn_node(&["--node", name, entity_type, prefix]);
    let member = ready.strip_prefix("ready ").expect("ready").to_owned();
    println!("node {name} is up (member {member})");
    (child, member)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--node") {
        return node(args[2].clone(), args[3].clone(), args[4].clone());
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    actix::System::new().block_on(demo());
}

async fn demo() {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let entity_type = format!("account_{}_{stamp}", std::process::id());
    let prefix = format!("actix-delivery-example.{entity_type}");
    let store = leases().await;
    let mut nodes: Vec<(Child, String)> = ["a", "b", "c"]
        .iter()
        .map(|name| spawn(name, &entity_type, &prefix))
        .collect();
    while store.view(&entity_type).await.expect("a view").leases.len() < SHARDS as usize {
        actix::clock::sleep(Duration::from_millis(50)).await;
    }
    println!("all {SHARDS} shards are owned");

    let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default())
        .await
        .expect("NATS");
    let destination = NatsShards::<u64>::destination(&carrier, &prefix).expect("a subject");
    let options = ShardedProducerOptions::per_shard(destination)
        .shards(SHARDS)
        .entity_stream(ProducerConfig {
            resend_timeout: Duration::from_millis(300),
            ..ProducerConfig::default()
        })
        .build()
        .expect("valid settings");
    let producer = ReliableDelivery::sharded_producer(options);
    let confirmed = Arc::new(AtomicU64::new(0));
    let mut sent: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut killed = None;
    for deposit in 0..DEPOSITS {
        let to = deposit * 7919 % ACCOUNTS;
        let counted = confirmed.clone();
        producer
            .tell(account(to), deposit, move |result: Result<(), _>| {
                if result.is_ok() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .expect("room");
        sent.entry(to).or_default().push(deposit);
        if deposit == DEPOSITS / 2 {
            let (mut child, member) = nodes.remove(1);
            let owned = store
                .view(&entity_type)
                .await
                .expect("a view")
                .leases
                .values()
                .filter(|lease| lease.owner == member)
                .count();
            child.kill().expect("SIGKILL");
            let _ = child.wait();
            println!("SIGKILLed node b, which owned {owned} shards, with deposits in flight");
            let (store, entity_type) = (store.clone(), entity_type.clone());
            killed = Some(actix::spawn(async move {
                let killed_at = Instant::now();
                loop {
                    let view = store.view(&entity_type).await.expect("a view");
                    let live = view.leases.values().filter(|l| l.owner != member).count();
                    if live == SHARDS as usize {
                        return killed_at.elapsed();
                    }
                    actix::clock::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
        actix::clock::sleep(Duration::from_millis(2)).await;
    }
    if let Some(taken_over) = killed {
        let after = taken_over.await.expect("watched");
        println!(
            "its shards were taken over by the other nodes {:.1} s after the kill (lease TTL 3 s, \
             renewed every 1 s)",
            after.as_secs_f64()
        );
    }
    producer.idle().await;
    println!(
        "{} of {DEPOSITS} deposits confirmed",
        confirmed.load(Ordering::Relaxed)
    );

    let options = PostgresOptions::builder()
        .schema(SCHEMA)
        .build()
        .expect("valid options");
    let journal = PostgresJournal::connect_with(&postgres(), options)
        .await
        .expect("the journal");
    let mut applied = 0;
    for (to, deposits) in &sent {
        let id = PersistenceId::new(format!("{entity_type}|{}", account(*to))).expect("valid");
        let state = recover_state::<Account>(&journal, &id)
            .await
            .expect("recovered");
        assert_eq!(
            &state.deposits, deposits,
            "account {to}: each deposit once, in order"
        );
        applied += state.deposits.len();
    }
    println!(
        "from the journal: every one of the {applied} deposits was applied exactly once, in the \
         order it was sent, across the kill"
    );
    for (mut child, _) in nodes {
        drop(child.stdin.take()); // the node leaves gracefully
        let _ = child.wait();
    }
}
