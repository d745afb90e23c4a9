//! Make an existing Actix actor a reliable consumer without changing it.
//!
//! `Inventory` is an ordinary actor that answers `Reserve` with `Result<(), String>`.
//! `DeliveryHandler::forward_to` puts a `ConsumerController` in front of it: each new message
//! is forwarded, `Ok` is ACKed, `Err` is retried by the producer. The inventory fails the first
//! reservation (a "transient" error) to show the retry.
//!
//! Run with `cargo run --example wrap_actor`.

use std::time::Duration;

use actix::prelude::*;
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};

/// The existing message type: it only needs `Clone` (the producer keeps a copy for retransmission).
#[derive(Clone, Debug, Message)]
#[rtype(result = "Result<(), String>")]
struct Reserve {
    sku: &'static str,
    quantity: u32,
}

/// The existing actor, unchanged.
struct Inventory {
    attempts: u32,
}

impl Actor for Inventory {
    type Context = Context<Self>;
}

impl Handler<Reserve> for Inventory {
    type Result = Result<(), String>;

    fn handle(&mut self, reserve: Reserve, _: &mut Context<Self>) -> Self::Result {
        self.attempts += 1;
        if self.attempts == 1 {
            println!("inventory: {reserve:?} failed (database busy)");
            return Err("database busy".into());
        }
        println!("inventory: reserved {} x {}", reserve.quantity, reserve.sku);
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let inventory = Inventory { attempts: 0 }.start();

    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::forward_to(inventory.recipient())).build()?,
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .resend_timeout(Duration::from_millis(100))
            .build()?,
    );

    producer
        .send(Reserve {
            sku: "espresso-beans",
            quantity: 2,
        })
        .await?;
    println!("producer: reservation confirmed (after one retry)");
    let stats = consumer.stats().await?;
    println!(
        "consumer: {} delivered, {} handler failure(s)",
        stats.delivered, stats.handler_failures
    );
    Ok(())
}
