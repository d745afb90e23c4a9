//! Reliable delivery over NATS with failover in a queue group: two worker processes share a
//! subject, one of them is killed mid-run, the other takes over, and every order is still
//! confirmed. Needs a NATS server (`NATS_URL`, by default `nats://127.0.0.1:4222`).
//!
//! One command runs it all (the workers as child processes, the producer here):
//!
//! ```text
//! cargo run --features nats --example nats
//! ```
//!
//! Or in several terminals (start and kill workers whenever you like):
//!
//! ```text
//! cargo run --features nats --example nats -- worker a
//! cargo run --features nats --example nats -- worker b
//! cargo run --features nats --example nats -- producer
//! ```
//!
//! The workers' consumers are in-memory, so an order that a dying worker had handled but not
//! yet acknowledged is handled again by the other one (at-least-once): the output shows it.
//! For effectively-once across workers, give each a persistent consumer of one entity on a
//! shared journal (see the `nats` module docs and `tests/nats_failover.rs`).

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery,
};

const MESSAGES: u64 = 60;
const SUBJECT: &str = "actix-delivery-example.orders";

fn url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("worker") => {
            let name = args.get(1).cloned().unwrap_or_else(|| "worker".into());
            actix::System::new().block_on(worker(name))
        }
        Some("producer") => actix::System::new().block_on(producer(None)),
        None => {
            let workers = [start_worker("a")?, start_worker("b")?];
            actix::System::new().block_on(producer(Some(workers)))
        }
        Some(other) => Err(format!("unknown role {other:?}: worker, producer or none").into()),
    }
}

/// A worker: one member of the queue group "workers" on the orders subject.
async fn worker(name: String) -> Result<(), Box<dyn std::error::Error>> {
    let carrier = NatsCarrierHandle::connect(&url(), NatsOptions::default()).await?;
    let me = name.clone();
    let orders = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |order: String| {
            println!("  [worker {me}] handled {order}");
            async { Ok::<(), std::io::Error>(()) }
        }))
        .build()?,
    );
    carrier.expose_in_group(SUBJECT, "workers", &orders).await?;
    println!("  [worker {name}] ready");
    std::future::pending::<()>().await;
    Ok(())
}

fn start_worker(name: &str) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["worker", name])
        .spawn()
}

/// Sends `MESSAGES` orders to the subject, one every 30 ms. With `workers`, kills the first
/// after a third of them.
async fn producer(mut workers: Option<[Child; 2]>) -> Result<(), Box<dyn std::error::Error>> {
    let carrier = NatsCarrierHandle::connect(&url(), NatsOptions::default()).await?;
    if workers.is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await; // let the workers subscribe
    }
    let orders = carrier.consumer_ref::<String>(SUBJECT)?;
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(orders)
            .resend_timeout(Duration::from_millis(300))
            .build()?,
    );
    let confirmed = Arc::new(AtomicU64::new(0));
    for n in 1..=MESSAGES {
        let count = confirmed.clone();
        producer.tell(
            format!("order #{n}"),
            move |result: Result<(), DeliveryError>| match result {
                Ok(()) => {
                    count.fetch_add(1, Ordering::Relaxed);
                    println!("[producer] order #{n} confirmed");
                }
                Err(err) => println!("[producer] order #{n} NOT confirmed: {err}"),
            },
        )?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        if n == MESSAGES / 3
            && let Some([first, _]) = &mut workers
        {
            println!("[producer] killing worker a (SIGKILL): worker b takes over");
            first.kill()?;
            first.wait()?;
        }
    }
    producer.idle().await;
    let confirmed = confirmed.load(Ordering::Relaxed);
    let stats = carrier.stats();
    println!(
        "[producer] {confirmed} of {MESSAGES} confirmed; {} deliveries published for them \
         ({} retransmissions)",
        stats.deliveries_out,
        stats.deliveries_out.saturating_sub(MESSAGES)
    );
    for mut worker in workers.into_iter().flatten() {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    if confirmed != MESSAGES {
        return Err("messages were lost".into());
    }
    Ok(())
}
