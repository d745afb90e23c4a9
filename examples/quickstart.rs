//! Producer → consumer with a confirmation per message, then a throughput comparison with a
//! plain `do_send` loop in the same process.
//!
//! Run with `cargo run --example quickstart` (add `--release` for meaningful numbers).

use std::time::Instant;

use actix::prelude::*;
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery,
};

#[derive(Clone, Debug)]
struct Order {
    id: u32,
    item: &'static str,
}

/// The plain-actor baseline: counts what it receives.
struct Counter(u64);

impl Actor for Counter {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct Count;

#[derive(Message)]
#[rtype(result = "u64")]
struct Total;

impl Handler<Count> for Counter {
    type Result = ();
    fn handle(&mut self, _: Count, _: &mut Context<Self>) {
        self.0 += 1;
    }
}

impl Handler<Total> for Counter {
    type Result = u64;
    fn handle(&mut self, _: Total, _: &mut Context<Self>) -> u64 {
        self.0
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // 1. A consumer whose handler processes each new order; Ok(()) means "handled, ACK it".
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|order: Order| async move {
            println!("consumer: handling order {} ({})", order.id, order.item);
            Ok::<(), DeliveryError>(())
        }))
        .build()?,
    );

    // 2. A producer sending to it.
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .window_size(16)
            .build()?,
    );

    // 3. tell + confirmation callback: fires exactly once, after the consumer's ACK.
    for (id, item) in [(1, "coffee"), (2, "tea"), (3, "cake")] {
        producer.tell(
            Order { id, item },
            move |result: Result<(), DeliveryError>| {
                println!("producer: order {id} confirmed: {result:?}");
            },
        )?;
    }
    // send().await resolves at the same moment (and waits for room when the queue is full).
    producer
        .send(Order {
            id: 4,
            item: "water",
        })
        .await?;
    println!("producer: order 4 confirmed via send().await");

    // 4. What does reliability cost? The same number of messages both ways, same process.
    const N: u64 = 200_000;
    let counter = Counter(0).start();
    let started = Instant::now();
    for _ in 0..N {
        counter.do_send(Count);
    }
    assert_eq!(counter.send(Total).await?, N);
    let plain = started.elapsed();

    let quiet = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            Ok::<(), DeliveryError>(())
        }))
        .build()?,
    );
    let reliable = ReliableDelivery::producer(
        ProducerOptions::builder(&quiet)
            .window_size(64)
            .max_pending(N as usize)
            .build()?,
    );
    let started = Instant::now();
    for n in 1..N {
        reliable.tell(n, actix_delivery::Confirmation::none())?;
    }
    reliable.send(N).await?; // FIFO: the last confirmation means all were handled
    let elapsed = started.elapsed();
    let rate = |d: std::time::Duration| N as f64 / d.as_secs_f64();
    println!(
        "\n{N} messages: plain do_send {:.2} M msg/s, reliable (window 64) {:.2} M msg/s confirmed = {:.0} % of plain",
        rate(plain) / 1e6,
        rate(elapsed) / 1e6,
        100.0 * plain.as_secs_f64() / elapsed.as_secs_f64()
    );
    let stats = quiet.stats().await?;
    assert_eq!(stats.delivered, N);
    Ok(())
}
