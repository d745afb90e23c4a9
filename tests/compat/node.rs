//! A node of the compatibility suite (`tests/compat/main.rs`), one source built twice: as this
//! release's example `compat_node`, and, copied into a worktree of the previous release
//! (`.ci/compat`), against that release. It uses only the public API both releases share, so
//! that the two binaries differ in nothing but the library.
//!
//! Roles (the first argument), each printing what the suite reads on stdout, one fact a line:
//!
//! - `consume tcp <listen> <secret|mtls> <tls dir>` and `consume nats <subject>`: a consumer
//!   of `u64` bodies named `orders` (over mutual TLS exposed to `producer.example` only);
//!   prints `ready <addr>`, then `got <n>` for each message handled; ends when stdin closes.
//! - `produce tcp <addr> <secret|mtls> <tls dir> <first> <count> <plain|journal file>` and
//!   `produce nats <subject> <first> <count> <plain|journal file>`: sends `count` numbers
//!   from `first` on to `orders` through a plain producer or a durable one on a SQLite journal
//!   (which may hold the stream of an earlier run, of either release), prints
//!   `confirmed <n>` with the number of messages confirmed once every message is settled, and
//!   exits (with an error if one was not confirmed, or when stdin closes first).
//! - `shard <name> <entity type> <subject prefix> <schema> <feed addr> <first feed number>`: a
//!   member of a sharded cluster of accounts (journal and leases in PostgreSQL schema
//!   `<schema>`, deliveries over NATS under the prefix) that also feeds a durable producer
//!   (its stream in the same journal) over TCP to the consumer `feed` at `<feed addr>`, storing
//!   a number every 10 ms from `<first feed number>` on and printing `stored <n>` once each is
//!   in the journal. Prints `ready <member>` first; on SIGTERM (or when stdin closes) it stops
//!   feeding, hands its shards off, prints `stopped` and exits 0.
//!
//! PostgreSQL and NATS are found as the tests find them: `ACTIX_DELIVERY_POSTGRES` and
//! `ACTIX_DELIVERY_NATS_URL`; the TCP secret is `COMPAT_SECRET`.

use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{PersistenceId, PostgresJournal, PostgresOptions, SqliteJournal};
use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
use actix_delivery::persistence::PersistentConfig;
use actix_delivery::sharding::{
    CoordinatorOptions, EntityHostOptions, NatsShards, PostgresLeaseStore, ShardCoordinatorHandle,
};
use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret, NodeTls};
use actix_delivery::{
    ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerOptions, ReliableDelivery,
};

#[path = "account.rs"]
mod account;

use account::{Account, SHARDS};

type Failed = Box<dyn std::error::Error>;

fn postgres() -> String {
    std::env::var("ACTIX_DELIVERY_POSTGRES")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into())
}

fn nats() -> String {
    std::env::var("ACTIX_DELIVERY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = actix::System::new().block_on(async move {
        match args.as_slice() {
            ["consume", "tcp", listen, auth, dir] => consume_tcp(listen.parse()?, auth, dir).await,
            ["consume", "nats", subject] => consume_nats(subject).await,
            ["produce", "tcp", addr, auth, dir, first, count, journal] => {
                let node = NodeHandle::start(tcp_options(auth, dir, "producer")?.build()?).await?;
                let to = node.consumer_ref::<u64>(addr.parse::<SocketAddr>()?, "orders")?;
                produce(to, numbers(first, count)?, journal).await
            }
            ["produce", "nats", subject, first, count, journal] => {
                let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default()).await?;
                let to = carrier.consumer_ref::<u64>(subject)?;
                produce(to, numbers(first, count)?, journal).await
            }
            ["shard", name, entity_type, prefix, schema, feed, first] => {
                shard(
                    name,
                    entity_type,
                    prefix,
                    schema,
                    feed.parse()?,
                    first.parse()?,
                )
                .await
            }
            _ => Err(format!("unknown arguments {args:?}: see tests/compat/node.rs").into()),
        }
    });
    if let Err(error) = outcome {
        eprintln!("compat_node: {error}");
        std::process::exit(1);
    }
}

/// The TCP node options of `role` (`consumer` or `producer`): the shared secret, or mutual TLS
/// with the PEM files of `dir`.
fn tcp_options(
    auth: &str,
    dir: &str,
    role: &str,
) -> Result<actix_delivery::tcp::NodeOptionsBuilder, Failed> {
    match auth {
        "secret" => {
            let secret = std::env::var("COMPAT_SECRET").map_err(|_| "COMPAT_SECRET is unset")?;
            Ok(NodeOptions::builder().secret(NodeSecret::new(secret)?))
        }
        "mtls" => {
            let read = |name: String| std::fs::read(std::path::Path::new(dir).join(name));
            let tls = NodeTls::builder(read("ca.pem".into())?)?
                .certificate(read(format!("{role}.pem"))?, read(format!("{role}.key"))?)?
                .mutual()
                .build()?;
            Ok(NodeOptions::builder().tls(tls))
        }
        other => Err(format!("unknown authentication {other:?}: secret or mtls").into()),
    }
}

/// A consumer that prints `got <n>` for each message it handles.
fn printing_consumer() -> Result<actix_delivery::ConsumerHandle<u64>, Failed> {
    let handler = DeliveryHandler::from_fn(|n: u64| async move {
        println!("got {n}");
        Ok::<(), std::io::Error>(())
    });
    Ok(ReliableDelivery::consumer(
        ConsumerOptions::builder(handler).build()?,
    ))
}

async fn consume_tcp(listen: SocketAddr, auth: &str, dir: &str) -> Result<(), Failed> {
    let node =
        NodeHandle::start(tcp_options(auth, dir, "consumer")?.listen(listen).build()?).await?;
    let orders = printing_consumer()?;
    if auth == "mtls" {
        node.expose_to("orders", &orders, ["producer.example"])?;
    } else {
        node.expose("orders", &orders)?;
    }
    println!("ready {}", node.local_addr().ok_or("the node listens")?);
    until_stdin_closes().await;
    Ok(())
}

async fn consume_nats(subject: &str) -> Result<(), Failed> {
    let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default()).await?;
    let orders = printing_consumer()?;
    carrier.expose(subject, &orders).await?;
    println!("ready {subject}");
    until_stdin_closes().await;
    Ok(())
}

/// `count` numbers from `first` on.
fn numbers(first: &str, count: &str) -> Result<std::ops::Range<u64>, Failed> {
    let first: u64 = first.parse()?;
    Ok(first..first + count.parse::<u64>()?)
}

/// Sends `numbers` to `to` and waits until each is confirmed: through a plain producer, or a
/// durable one whose journal is the SQLite file `journal`.
async fn produce(
    to: ConsumerRef<u64>,
    numbers: std::ops::Range<u64>,
    journal: &str,
) -> Result<(), Failed> {
    let options = ProducerOptions::builder(to)
        .resend_timeout(Duration::from_millis(200))
        .build()?;
    let producer = if journal == "plain" {
        ReliableDelivery::producer(options)
    } else {
        let journal = Arc::new(SqliteJournal::open(journal).await?);
        let stream = PersistenceId::new("compat-orders")?;
        ReliableDelivery::durable_producer(options, DurableOptions::new(journal, stream, "compat"))?
    };
    let sends = futures_util::future::join_all(numbers.map(|n| producer.send(n)));
    let outcomes = tokio::select! {
        outcomes = sends => outcomes,
        () = until_stdin_closes() => {
            return Err("stdin closed before every message was confirmed".into());
        }
    };
    let confirmed = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    println!("confirmed {confirmed}");
    outcomes
        .into_iter()
        .try_for_each(|outcome| outcome.map(drop))?;
    Ok(())
}

/// A member of the sharded cluster that also feeds a durable producer over TCP.
async fn shard(
    name: &str,
    entity_type: &str,
    prefix: &str,
    schema: &str,
    feed: SocketAddr,
    first: u64,
) -> Result<(), Failed> {
    let journal = Arc::new(
        PostgresJournal::connect_with(
            &postgres(),
            PostgresOptions::builder().schema(schema).build()?,
        )
        .await?,
    );
    let carrier = NatsCarrierHandle::connect(&nats(), NatsOptions::default()).await?;
    let leases = PostgresLeaseStore::connect(&postgres(), schema, Duration::from_secs(2)).await?;
    let host = EntityHostOptions::builder(entity_type.to_owned())
        .shards(SHARDS)
        .persistent(PersistentConfig {
            must_follow: true,
            ..PersistentConfig::default()
        })
        .build()?;
    let coordinator = CoordinatorOptions::builder(name.to_owned())
        .lease_ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .build()?;
    let member = ShardCoordinatorHandle::<Account>::start(
        journal.clone(),
        host,
        Arc::new(leases),
        coordinator,
        |host| {
            NatsShards::new(&carrier, prefix, host.consumer(|deposit: u64| deposit))
                .expect("a valid subject prefix")
        },
    )?;

    let node = NodeHandle::start(tcp_options("secret", "", "producer")?.build()?).await?;
    let to = node.consumer_ref::<u64>(feed, "feed")?;
    let feed_id = format!("feed-{name}");
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(to)
            .resend_timeout(Duration::from_millis(200))
            .build()?,
        DurableOptions::new(journal, PersistenceId::new(feed_id.clone())?, feed_id),
    )?;
    println!("ready {}", member.member());

    let mut terminate =
        actix_rt::signal::unix::signal(actix_rt::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            () = until_stdin_closes() => {}
        }
    };
    let feeding = async {
        let mut ticks = actix::clock::interval(Duration::from_millis(10));
        for n in first.. {
            ticks.tick().await;
            producer.store(n).await?;
            println!("stored {n}");
        }
        Ok::<(), Failed>(())
    };
    tokio::select! {
        () = stop => {}
        fed = feeding => fed?,
    }
    // What is stored and not yet confirmed stays in the journal: the node's next life sends it.
    producer.stop();
    let _ = producer.stopped().await;
    member.stop();
    member.stopped().await;
    println!("stopped");
    Ok(())
}

/// Resolves when this process's stdin closes (its parent ended or closed it). The reading
/// thread is not the runtime's: a blocking task would hold the runtime's shutdown until the
/// parent closes stdin.
async fn until_stdin_closes() {
    let (closed, on_close) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin()
            .lock()
            .read_line(&mut line)
            .is_ok_and(|n| n > 0)
        {}
        drop(closed);
    });
    let _ = on_close.await;
}
