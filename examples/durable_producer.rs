//! A durable producer over SQLite: every message is stored in the journal before it is sent,
//! so a producer that stops or crashes loses nothing it reported stored.
//!
//! `cargo run --example durable_producer [-- <journal file>]` (default: a fresh file in a
//! temporary directory). The first life stores six orders; the consumer is reachable for the
//! first three (confirmed), then cut off, so the last three stay stored and unconfirmed when
//! the producer stops. The second life opens the same stream: it keeps its incarnation and
//! seqs, sends the three again, and reports their confirmations to its sink (their callers
//! died with the first life). With a file argument, try `kill -9` during a run and run it
//! again: what was reported stored is sent by the next run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, DurableOptions};
use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};

/// Where confirmations of messages sent again after a restart go.
struct Sink;

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<DurableConfirmation> for Sink {
    type Result = ();

    fn handle(&mut self, confirmation: DurableConfirmation, _: &mut Context<Self>) {
        println!(
            "  sink: message {} of an earlier life: {:?}",
            confirmation.id.0, confirmation.result
        );
    }
}

/// A link to `consumer` that delivers only while `online` (a network that goes away).
fn link(consumer: &ConsumerHandle<String>, online: Arc<AtomicBool>) -> ConsumerRef<String> {
    let target = consumer.consumer_ref();
    ConsumerRef::from_fn(move |deliveries: Vec<Delivery<String>>| {
        if online.load(Ordering::SeqCst) {
            target.do_send_all(deliveries.into_iter());
        }
    })
}

/// A durable producer of stream `orders-out`, as producer `orders`, through `to`.
fn producer(
    journal: &Arc<SqliteJournal>,
    to: ConsumerRef<String>,
) -> Result<ProducerHandle<String>, Box<dyn std::error::Error>> {
    let durable = DurableOptions::new(journal.clone(), PersistenceId::new("orders-out")?, "orders")
        .confirmations(Sink.start().recipient());
    let options = ProducerOptions::builder(to).window_size(4).build()?;
    Ok(ReliableDelivery::durable_producer(options, durable)?)
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let dir = tempfile::tempdir()?;
    let path: PathBuf = std::env::args()
        .nth(1)
        .map_or_else(|| dir.path().join("orders.journal"), Into::into);
    let journal = Arc::new(SqliteJournal::open(&path).await?);
    println!("journal: {}", path.display());
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
            println!("  consumer: handled {order}");
            Ok::<(), String>(())
        }))
        .build()?,
    );
    let online = Arc::new(AtomicBool::new(true));

    println!("life 1: store six orders, the consumer reachable for the first three");
    let first = producer(&journal, link(&consumer, online.clone()))?;
    first.idle().await; // the stream is open: whatever an earlier run left is settled
    let run = first.stats().await?.next_message_id;
    let mut unconfirmed = Vec::new();
    for n in 0..6 {
        if n == 3 {
            println!("  (the consumer is cut off)");
            online.store(false, Ordering::SeqCst);
        }
        let order = format!("order-{}", run + n);
        let stored = first.store(order.clone()).await?;
        let id = stored.id.0;
        println!("  producer: {order} stored as message {id}");
        if n < 3 {
            stored.confirmed().await?;
            println!("  producer: message {id} confirmed");
        } else {
            unconfirmed.push(stored);
        }
    }
    first.stop(); // as a deploy would (a crash keeps them stored too)
    first.stopped().await?;
    for stored in unconfirmed {
        let id = stored.id.0;
        let outcome = stored.confirmed().await;
        println!("  producer: message {id} not confirmed in life 1 ({outcome:?}); it stays stored");
    }

    println!("life 2: the same stream, the consumer reachable again");
    online.store(true, Ordering::SeqCst);
    let second = producer(&journal, link(&consumer, online))?;
    second.idle().await; // everything resent is confirmed
    let stats = second.stats().await?;
    println!(
        "  producer: {} message(s) sent again after the restart, {} confirmed (to the sink)",
        stats.resumed, stats.resumed_confirmed
    );
    let order = format!("order-{}", run + 6);
    second.store(order.clone()).await?.confirmed().await?;
    println!("  producer: {order} stored and confirmed in life 2");
    second.stop();
    second.stopped().await?;
    println!("done: every stored order was handled, none was lost");
    Ok(())
}
