//! Event-sourced delivery: an order service whose decisions deliver shipment requests to a
//! shipping entity, both persistent (SQLite). Placing an order stores `Placed` and the record
//! "ship it" in one journal entry; the shipment is sent after the commit, sent again after a
//! crash until shipping confirms it, and shipping (must-follow on) applies each shipment once,
//! in order.
//!
//! `cargo run --example outbox [-- <directory>]`: kill it at any moment (`kill -9`) and run it
//! again: it prints what both sides recovered, resends what shipping had not confirmed, and
//! continues. No order is shipped twice or skipped. Each "shipped" line is printed after the
//! shipment's commit, so across all runs no order is reported shipped twice (a resend of a
//! stored shipment says "arrived again" instead; a kill between a commit and its line leaves
//! that order to such a line), and the last line checks shipping's journal: every order
//! shipped once, in order.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::persistence::{
    Decision, EventSourced, Outbox, Outcome, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{
    ConsumerOptions, DeliveryHandler, DeliveryInfo, ProducerConfig, ReliableDelivery,
};
use serde::{Deserialize, Serialize};

/// The order service.
#[derive(Default, Serialize, Deserialize)]
struct Orders {
    placed: u64,
}

enum OrderCommand {
    Place,
    Count,
}

#[derive(Serialize, Deserialize)]
struct Placed(u64);

#[derive(Clone, Serialize, Deserialize)]
struct Ship {
    order: u64,
}

impl EventSourced for Orders {
    type Command = OrderCommand;
    type Event = Placed;
    type Reply = u64;
    type Rejection = String;

    fn decide(&self, command: &OrderCommand) -> Result<Decision<Self>, String> {
        Ok(match command {
            OrderCommand::Place => {
                let order = self.placed + 1;
                Decision::persist([Placed(order)], order).deliver("shipping", &Ship { order })
            }
            OrderCommand::Count => Decision::reply(self.placed),
        })
    }

    fn apply(&mut self, Placed(order): &Placed) {
        self.placed = *order;
    }
}

/// The shipping entity: what it shipped, in order.
#[derive(Default, Serialize, Deserialize)]
struct Shipping {
    shipped: Vec<u64>,
}

enum ShippingCommand {
    Ship(u64),
    Shipped,
}

#[derive(Serialize, Deserialize)]
struct ShipmentSent(u64);

impl EventSourced for Shipping {
    type Command = ShippingCommand;
    type Event = ShipmentSent;
    type Reply = Vec<u64>;
    type Rejection = String;

    fn decide(&self, command: &ShippingCommand) -> Result<Decision<Self>, String> {
        Ok(match *command {
            // No printing here: `decide` is pure, and runs again for a delivery decided but not
            // stored before a crash. What happened is printed once its commit is known (below).
            ShippingCommand::Ship(order) => Decision::persist([ShipmentSent(order)], Vec::new()),
            ShippingCommand::Shipped => Decision::reply(self.shipped.clone()),
        })
    }

    fn apply(&mut self, ShipmentSent(order): &ShipmentSent) {
        self.shipped.push(*order);
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let dir: PathBuf = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join("actix-delivery-outbox"),
        Into::into,
    );
    std::fs::create_dir_all(&dir)?;

    let shipping = PersistentHandle::<Shipping>::start(
        PersistentOptions::new(
            Arc::new(SqliteJournal::open(dir.join("shipping.db")).await?),
            PersistenceId::new("shipping")?,
        )
        .config(PersistentConfig {
            must_follow: true,
            ..Default::default()
        }),
    )?;
    // `shipping.delivery_handler(…)` does this without the printing: hand each delivery to
    // the entity in order (pipelined), ACK once its reply says the shipment is stored.
    let entity = shipping.clone();
    let handler = DeliveryHandler::pipelined(move |info: DeliveryInfo, ship: Ship| {
        let stored = entity.ask_delivered(info, ShippingCommand::Ship(ship.order));
        async move {
            match stored.await.map_err(|error| error.to_string())? {
                Outcome::Done(_) => println!("  shipping: order {} shipped", ship.order),
                Outcome::AlreadyProcessed => println!(
                    "  shipping: order {} arrived again (its ACK was lost in a crash): already \
                     shipped, not shipped again",
                    ship.order
                ),
            }
            Ok::<(), String>(())
        }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build()?);
    let outbox = Outbox::new().destination("shipping", &consumer, ProducerConfig::default())?;
    let orders = PersistentHandle::<Orders>::start(
        PersistentOptions::new(
            Arc::new(SqliteJournal::open(dir.join("orders.db")).await?),
            PersistenceId::new("orders")?,
        )
        .outbox(outbox)
        .supervised(),
    )?;

    let placed = orders.ask(OrderCommand::Count).await?;
    let shipped = shipping.ask(ShippingCommand::Shipped).await?;
    println!(
        "recovered from {}: {placed} orders placed, {} shipped (the rest is sent again)",
        dir.display(),
        shipped.len()
    );
    for _ in 0..10 {
        let order = orders.ask(OrderCommand::Place).await?;
        println!("orders: order {order} placed (kill me now)");
        actix::clock::sleep(Duration::from_millis(300)).await;
    }
    actix::clock::sleep(Duration::from_secs(1)).await;
    let shipped = shipping.ask(ShippingCommand::Shipped).await?;
    let in_order = shipped.iter().copied().eq(1..=shipped.len() as u64);
    println!(
        "done: {} orders shipped, each once and in order: {in_order}; run me again",
        shipped.len()
    );
    Ok(())
}
