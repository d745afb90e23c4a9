//! What sharding costs, printed as the markdown `benches/README.md` quotes.
//!
//! ```text
//! cargo run --release --example sharding_bench                             # SQLite cases
//! cargo run --release --features postgres,nats --example sharding_bench    # and 2 nodes over NATS
//! SHARDING_BENCH_RUNS=5 cargo run --release --example sharding_bench       # more runs
//! ```
//!
//! One process (the entities on one arbiter), an SQLite journal in a temporary directory,
//! entities whose events carry a 100-byte note (as in `persistence_bench`):
//!
//! 0. **the journal alone** (the plain alternative): 2 048 appenders on 10 000 streams, one event
//!    of an entity's size per append, each awaited before the next;
//! 1. **one entity** (`persistence_bench`'s figure, in the same run): 64 callers, each with one
//!    command in flight, to one persistent actor;
//! 2. **10 000 entities, asked**: [`EntityHostHandle::ask`] from 2 048 callers, each with one
//!    command in flight, to random entities (all already running);
//! 3. **10 000 entities, effectively once**: a sharded producer to the host's consumer, in process:
//!    every command a delivery on its entity's stream, its processed mark stored with its event,
//!    confirmed once stored;
//! 4. **activation**: a new host, one read command to each of 2 048 entities of 100 events each, 64
//!    callers: each command starts its entity, which recovers its 100 events;
//! 5. **an open entity stream's memory**: a sharded producer sends one message to each of 25 000
//!    entities (a destination that ACKs at once, so that only the producer holds anything); the
//!    heap bytes still allocated once all are confirmed, while the 25 000 streams stay open
//!    (`cleanup_unused_after`), divided by 25 000.
//!
//! With the features `postgres` and `nats` (servers from `ACTIX_DELIVERY_POSTGRES`,
//! `ACTIX_DELIVERY_NATS_URL`, as for the tests): **2 node processes** (this example re-run)
//! share the 10 000 entities, with their journal and leases in PostgreSQL; this process sends
//! through a sharded producer over NATS (a subject per shard), commands confirmed per second.
//!
//! Each case runs `SHARDING_BENCH_RUNS` times (default 3; a fresh journal each time); the
//! table gives the median and the spread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal};
use actix_delivery::persistence::{PersistentHandle, PersistentOptions};
use actix_delivery::sharding::{
    EntityHostHandle, EntityHostOptions, EntityId, ShardedProducerHandle, ShardedProducerOptions,
};
use actix_delivery::ReliableDelivery;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[cfg(all(feature = "postgres", feature = "nats"))]
#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/counter.rs"]
mod counter;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;
#[path = "support/report_header.rs"]
mod report_header;
#[path = "support/thousands.rs"]
mod thousands;

use counter::Counter;
use thousands::thousands;

const ENTITIES: u64 = 10_000;
const ASKED: u64 = 204_800;
const ASK_CALLERS: u64 = 2048;
const DELIVERED: u64 = 100_000;
const SINGLE: u64 = 64_000;
const SINGLE_CALLERS: u64 = 64;
const RECOVERED_ENTITIES: u64 = 2_048;
const EVENTS_PER_ENTITY: u64 = 100;
const ACTIVATION_CALLERS: u64 = 64;

fn entity(n: u64) -> EntityId {
    EntityId::new(format!("counter-{n}")).expect("a valid id")
}

async fn sqlite(dir: &tempfile::TempDir, name: &str) -> Arc<dyn Journal> {
    let path = dir.path().join(format!("{name}.db"));
    Arc::new(SqliteJournal::open(path).await.expect("open the journal"))
}

fn host(journal: Arc<dyn Journal>) -> EntityHostHandle<Counter> {
    let options = EntityHostOptions::builder("counter")
        .max_active_entities(2 * ENTITIES as usize)
        .build()
        .expect("valid settings");
    EntityHostHandle::start(journal, options).expect("valid versions")
}

/// `callers` tasks, each sending `per_caller` commands one at a time through `ask`.
async fn from_callers<F, Fut>(callers: u64, per_caller: u64, ask: F)
where
    F: Fn(u64, &mut SmallRng) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let tasks = (0..callers).map(|caller| {
        let ask = ask.clone();
        actix::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(caller);
            for n in 0..per_caller {
                ask(caller * per_caller + n, &mut rng).await;
            }
        })
    });
    futures_util::future::join_all(tasks).await;
}

/// The plain alternative: the journal alone, 2 048 appenders on the 10 000 streams (each its
/// own share of them), one event of an entity's size per append.
async fn journal_alone(dir: &tempfile::TempDir, run: usize) -> f64 {
    let journal = sqlite(dir, &format!("journal-{run}")).await;
    let payload = vec![7u8; 130]; // about a `Counted` entry: the 100-byte note and the rest
    let per_appender = ASKED / ASK_CALLERS;
    let start = Instant::now();
    let appenders = (0..ASK_CALLERS).map(|appender| {
        let (journal, payload) = (journal.clone(), payload.clone());
        actix::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(appender);
            let streams: Vec<PersistenceId> = (appender..ENTITIES)
                .step_by(ASK_CALLERS as usize)
                .map(|n| PersistenceId::new(format!("counter|{}", entity(n))).expect("valid"))
                .collect();
            let mut next = vec![1u64; streams.len()];
            for _ in 0..per_appender {
                let pick = rng.random_range(0..streams.len());
                let seq = next[pick];
                next[pick] += 1;
                journal
                    .append(&streams[pick], seq, vec![payload.clone()])
                    .await
                    .expect("appended");
            }
        })
    });
    futures_util::future::join_all(appenders).await;
    (per_appender * ASK_CALLERS) as f64 / start.elapsed().as_secs_f64()
}

/// Case 1: one entity, 64 callers.
async fn single(dir: &tempfile::TempDir, run: usize) -> f64 {
    let journal = sqlite(dir, &format!("single-{run}")).await;
    let id = PersistenceId::new("counter").expect("valid");
    let counter = PersistentHandle::<Counter>::start(PersistentOptions::new(journal, id))
        .expect("valid settings");
    counter.ask(0).await.expect("recovered");
    let start = Instant::now();
    from_callers(SINGLE_CALLERS, SINGLE / SINGLE_CALLERS, move |_, _| {
        let answer = counter.ask(1);
        async move {
            answer.await.expect("stored");
        }
    })
    .await;
    SINGLE as f64 / start.elapsed().as_secs_f64()
}

/// Starts every entity of `host` (a read each).
async fn warm(host: &EntityHostHandle<Counter>) {
    let host = host.clone();
    from_callers(ASK_CALLERS, ENTITIES / ASK_CALLERS + 1, move |n, _| {
        let answer = host.ask(entity(n % ENTITIES), 0);
        async move {
            answer.await.expect("read");
        }
    })
    .await;
}

/// Case 2: 10 000 running entities, asked by 2 048 callers.
async fn asked(dir: &tempfile::TempDir, run: usize) -> f64 {
    let host = host(sqlite(dir, &format!("asked-{run}")).await);
    warm(&host).await;
    let start = Instant::now();
    let asking = host.clone();
    from_callers(ASK_CALLERS, ASKED / ASK_CALLERS, move |_, rng| {
        let answer = asking.ask(entity(rng.random_range(0..ENTITIES)), 1);
        async move {
            answer.await.expect("stored");
        }
    })
    .await;
    let rate = ASKED as f64 / start.elapsed().as_secs_f64();
    host.stop();
    host.stopped().await;
    rate
}

/// Sends `count` commands to random entities and waits until all are confirmed.
async fn deliver(producer: &ShardedProducerHandle<u64>, count: u64, seed: u64) -> f64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let start = Instant::now();
    for _ in 0..count {
        let target = entity(rng.random_range(0..ENTITIES));
        let mut body = 1;
        // The producer holds 100 000 messages (`max_pending`): wait for room beyond.
        while let Err(refused) = producer.tell(target.clone(), body, |_| {}) {
            body = refused.into_body();
            actix::clock::sleep(Duration::from_millis(1)).await;
        }
    }
    producer.idle().await;
    count as f64 / start.elapsed().as_secs_f64()
}

/// Case 3: a sharded producer to the host's consumer, in process.
async fn delivered(dir: &tempfile::TempDir, run: usize) -> f64 {
    let host = host(sqlite(dir, &format!("delivered-{run}")).await);
    warm(&host).await;
    let consumer = host.consumer(|by: u64| by);
    let options = ShardedProducerOptions::builder(&consumer)
        .build()
        .expect("valid settings");
    let producer = ReliableDelivery::sharded_producer(options);
    let rate = deliver(&producer, DELIVERED, run as u64).await;
    producer.stop();
    producer.stopped().await.expect("stopped on request");
    host.stop();
    host.stopped().await;
    rate
}

/// Case 4: activations of entities of 100 events each.
async fn activations(dir: &tempfile::TempDir, run: usize) -> f64 {
    let journal = sqlite(dir, &format!("activations-{run}")).await;
    let writer = host(journal.clone());
    let writing = writer.clone();
    from_callers(
        ACTIVATION_CALLERS * 4,
        RECOVERED_ENTITIES / (ACTIVATION_CALLERS * 4),
        move |n, _| {
            let writing = writing.clone();
            async move {
                for _ in 0..EVENTS_PER_ENTITY {
                    writing.ask(entity(n), 1).await.expect("stored");
                }
            }
        },
    )
    .await;
    writer.stop();
    writer.stopped().await;
    let reader = host(journal);
    let start = Instant::now();
    let reading = reader.clone();
    from_callers(
        ACTIVATION_CALLERS,
        RECOVERED_ENTITIES / ACTIVATION_CALLERS,
        move |n, _| {
            let answer = reading.ask(entity(n), 0);
            async move {
                assert_eq!(answer.await.expect("recovered"), EVENTS_PER_ENTITY);
            }
        },
    )
    .await;
    let rate = RECOVERED_ENTITIES as f64 / start.elapsed().as_secs_f64();
    assert_eq!(reader.stats().activations, RECOVERED_ENTITIES);
    rate
}

/// Case 5: the heap bytes an open entity stream holds with nothing in flight.
async fn lane_bytes() -> f64 {
    use actix_delivery::sharding::EntityEnvelope;
    use actix_delivery::{Ack, ConsumerRef, Delivery};
    const LANES: u64 = 25_000;
    // ACKs every delivery at once: nothing is held beyond the producer.
    let acking = ConsumerRef::from_fn(|deliveries: Vec<Delivery<EntityEnvelope<u64>>>| {
        for delivery in deliveries {
            if let Some(reply_to) = &delivery.reply_to {
                reply_to.do_send(Ack {
                    producer_id: delivery.producer_id.clone(),
                    incarnation: delivery.incarnation,
                    seq: delivery.seq,
                });
            }
        }
    });
    let options = ShardedProducerOptions::builder(acking)
        .max_open_lanes(LANES as usize + 1)
        .build()
        .expect("valid settings");
    let producer = ReliableDelivery::sharded_producer(options);
    producer.send(entity(u64::MAX), 0).await.expect("confirmed"); // warm up
    let before = counting_alloc::live_bytes();
    for n in 0..LANES {
        producer.tell(entity(n), n, |_| {}).expect("room");
        if n % 1024 == 1023 {
            producer.idle().await;
        }
    }
    producer.idle().await;
    let stats = producer.lane_stats().await.expect("running");
    assert_eq!(stats.lanes, LANES + 1, "every stream still open");
    let held = counting_alloc::live_bytes().saturating_sub(before);
    producer.stop();
    producer.stopped().await.expect("stopped on request");
    held as f64 / LANES as f64
}

fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn row(case: &str, values: Vec<f64>, single: f64, journal: f64) {
    let (median, min, max) = spread(values);
    println!(
        "| {case} | {} | {}–{} | {:.2}× | {:.2}× |",
        thousands(median),
        thousands(min),
        thousands(max),
        median / single,
        median / journal
    );
}

fn main() {
    #[cfg(all(feature = "postgres", feature = "nats"))]
    if std::env::args().nth(1).as_deref() == Some("--node") {
        return over_nats::node();
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let runs: usize =
        std::env::var("SHARDING_BENCH_RUNS").map_or(3, |r| r.parse().expect("a number"));
    actix::System::new().block_on(async move {
        report_header::print("Sharding: entities hosted on demand");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut measured: [Vec<f64>; 5] = Default::default();
        // One case alone (for profiling): `SHARDING_BENCH_ONLY=asked` (or `journal`,
        // `single`, `delivered`, `activations`, `memory`).
        let only = std::env::var("SHARDING_BENCH_ONLY").ok();
        let wanted = |case: &str| only.as_deref().is_none_or(|only| only == case);
        for run in 0..runs {
            let mut rates = [0.0; 5];
            if wanted("journal") {
                rates[4] = journal_alone(&dir, run).await;
            }
            if wanted("single") {
                rates[0] = single(&dir, run).await;
            }
            if wanted("asked") {
                rates[1] = asked(&dir, run).await;
            }
            if wanted("delivered") {
                rates[2] = delivered(&dir, run).await;
            }
            if wanted("activations") {
                rates[3] = activations(&dir, run).await;
            }
            eprintln!("run {run}: {:?}", rates.map(|r| r as u64));
            for (values, rate) in measured.iter_mut().zip(rates) {
                values.push(rate);
            }
        }
        if wanted("memory") {
            let bytes = lane_bytes().await;
            println!("\n| memory | bytes |\n|---|---:|");
            println!("| an open entity stream, nothing in flight | {bytes:.0} |");
        }
        if only.is_some() {
            return;
        }
        let single = spread(measured[0].clone()).0;
        let journal = spread(measured[4].clone()).0;
        println!("\nSQLite journal, one process, medians of {runs} runs:\n");
        println!("| case | per second | spread | vs one entity | vs the journal alone |");
        println!("|---|---:|---:|---:|---:|");
        let [one, asked, delivered, activated, alone] = measured;
        let cases = [
            ("the journal alone: 2 048 appenders, 10 000 streams, one event each, appends", alone),
            ("one entity, 64 callers (`persistence_bench`'s case), commands", one),
            ("10 000 entities, `EntityHostHandle::ask` from 2 048 callers, commands", asked),
            (
                "10 000 entities, sharded producer → host consumer (effectively once), commands confirmed",
                delivered,
            ),
            ("activations of 100-event entities (recovery + one read), 64 callers", activated),
        ];
        for (case, values) in cases {
            row(case, values, single, journal);
        }
        #[cfg(all(feature = "postgres", feature = "nats"))]
        over_nats::run(runs).await;
        #[cfg(not(all(feature = "postgres", feature = "nats")))]
        println!("\n(2 nodes over NATS with PostgreSQL: build with `--features postgres,nats`)");
    });
}

/// The case over NATS with PostgreSQL: node processes and the producer.
#[cfg(all(feature = "postgres", feature = "nats"))]
mod over_nats {
    use std::process::Child;

    use actix_delivery::journal::{PostgresJournal, PostgresOptions};
    use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
    use actix_delivery::sharding::{
        CoordinatorOptions, LeaseStore, NatsShards, PostgresLeaseStore, ShardCoordinatorHandle,
    };

    use super::cluster::{nats, postgres, spawn_node, until_stdin_closes};
    use super::*;

    const SHARDS: u32 = 64;
    const SCHEMA: &str = "actix_delivery_bench";
    const COMMANDS: u64 = 50_000;

    async fn leases() -> PostgresLeaseStore {
        PostgresLeaseStore::connect(&postgres(), SCHEMA, Duration::from_secs(5))
            .await
            .expect("the lease store (is PostgreSQL running?)")
    }

    /// A node: `--node <name> <entity type> <subject prefix>`; prints `ready`, runs until
    /// its stdin closes.
    pub fn node() {
        let args: Vec<String> = std::env::args().collect();
        let (name, entity_type, prefix) = (args[2].clone(), args[3].clone(), args[4].clone());
        actix::System::new().block_on(async move {
            let journal = PostgresJournal::connect_with(
                &postgres(),
                PostgresOptions::builder()
                    .schema(SCHEMA)
                    .build()
                    .expect("valid options"),
            )
            .await
            .expect("the journal");
            let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default())
                .await
                .expect("NATS");
            let host = EntityHostOptions::builder(entity_type)
                .shards(SHARDS)
                .max_active_entities(2 * ENTITIES as usize)
                .build()
                .expect("valid settings");
            let options = CoordinatorOptions::builder(name).build().expect("valid");
            let _node = ShardCoordinatorHandle::<Counter>::start(
                Arc::new(journal),
                host,
                Arc::new(leases().await),
                options,
                |host| {
                    NatsShards::new(&carrier, &prefix, host.consumer(|by: u64| by))
                        .expect("a subject")
                },
            )
            .expect("valid versions");
            println!("ready");
            until_stdin_closes().await; // the benchmark closes it (or dies)
        });
    }

    fn spawn(name: &str, entity_type: &str, prefix: &str) -> Child {
        let (child, ready) = spawn_node(&["--node", name, entity_type, prefix]);
        assert_eq!(ready, "ready", "the node did not start");
        child
    }

    /// One run: 2 fresh nodes, a warm-up (one command per entity), then `COMMANDS` timed.
    async fn once(run: usize) -> (f64, f64) {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis();
        let entity_type = format!("bench_{}_{stamp}_{run}", std::process::id());
        let prefix = format!("actix-delivery-bench.{entity_type}");
        let store = leases().await;
        let nodes = [
            spawn("a", &entity_type, &prefix),
            spawn("b", &entity_type, &prefix),
        ];
        while store.view(&entity_type).await.expect("a view").leases.len() < SHARDS as usize {
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
        let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default())
            .await
            .expect("NATS");
        let destination = NatsShards::<u64>::destination(&carrier, &prefix).expect("a subject");
        let options = ShardedProducerOptions::per_shard(destination)
            .shards(SHARDS)
            .build()
            .expect("valid settings");
        let producer = ReliableDelivery::sharded_producer(options);
        let start = Instant::now();
        for n in 0..ENTITIES {
            producer.tell(entity(n), 0, |_| {}).expect("room");
        }
        producer.idle().await;
        let activations = ENTITIES as f64 / start.elapsed().as_secs_f64();
        let rate = deliver(&producer, COMMANDS, run as u64).await;
        producer.stop();
        for mut node in nodes {
            drop(node.stdin.take());
            let _ = node.wait();
        }
        (rate, activations)
    }

    pub async fn run(runs: usize) {
        let (mut rates, mut warmups) = (Vec::new(), Vec::new());
        for run in 0..runs {
            let (rate, warmup) = once(run).await;
            rates.push(rate);
            warmups.push(warmup);
        }
        println!(
            "\n2 node processes, journal and leases in PostgreSQL, a sharded producer over NATS \
             (64 shards), medians of {runs} runs:\n"
        );
        println!("| case | per second | spread |");
        println!("|---|---:|---:|");
        for (case, values) in [
            (
                "first command to each of 10 000 entities (activation over PostgreSQL)",
                warmups,
            ),
            ("10 000 running entities, commands confirmed", rates),
        ] {
            let (median, min, max) = spread(values);
            println!(
                "| {case} | {} | {}–{} |",
                thousands(median),
                thousands(min),
                thousands(max)
            );
        }
    }
}
