//! An existing actor made a reliable consumer with `DeliveryHandler::forward_to`.

use crate::common;

use actix::prelude::*;
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery,
};
use common::{settle, Log};

#[derive(Clone, Debug, Message)]
#[rtype(result = "Result<(), String>")]
struct Reserve(u32);

/// Fails the first `failures` reservations, records the successful ones.
struct Inventory {
    failures: u32,
    reserved: Log<u32>,
}

impl Actor for Inventory {
    type Context = Context<Self>;
}

impl Handler<Reserve> for Inventory {
    type Result = Result<(), String>;
    fn handle(&mut self, Reserve(n): Reserve, _: &mut Context<Self>) -> Self::Result {
        if self.failures > 0 {
            self.failures -= 1;
            return Err("busy".into());
        }
        self.reserved.push(n);
        Ok(())
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Shutdown;

impl Handler<Shutdown> for Inventory {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[actix::test]
async fn existing_actor_receives_each_message_once_and_its_errors_are_retried() {
    tokio::time::pause();
    let reserved = Log::default();
    let inventory = Inventory {
        failures: 2,
        reserved: reserved.clone(),
    }
    .start();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::forward_to(inventory.recipient()))
            .build()
            .unwrap(),
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.recipient())
            .build()
            .unwrap(),
    );
    for n in 1..=3 {
        producer.send(Reserve(n)).await.unwrap();
    }
    assert_eq!(reserved.snapshot(), [1, 2, 3]);
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.handler_failures), (3, 2));
}

#[actix::test]
async fn a_stopped_target_actor_means_no_ack() {
    tokio::time::pause();
    let inventory = Inventory {
        failures: 0,
        reserved: Log::default(),
    }
    .start();
    let recipient = inventory.clone().recipient();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::forward_to(recipient))
            .build()
            .unwrap(),
    );
    inventory.do_send(Shutdown);
    settle().await;
    assert!(!inventory.connected());
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.recipient())
            .max_attempts(2)
            .build()
            .unwrap(),
    );
    assert_eq!(
        producer.send(Reserve(1)).await,
        Err(DeliveryError::GaveUp { attempts: 2 })
    );
    assert_eq!(consumer.stats().await.unwrap().handler_failures, 2);
}

/// A reservation whose reply carries a value (the stock left), as existing actors' replies do.
#[derive(Clone, Debug, Message)]
#[rtype(result = "Result<u32, String>")]
struct Take(u32);

/// Stock that refuses to go below 0, answering with what is left.
struct Stock(u32);

impl Actor for Stock {
    type Context = Context<Self>;
}

impl Handler<Take> for Stock {
    type Result = Result<u32, String>;
    fn handle(&mut self, Take(n): Take, _: &mut Context<Self>) -> Self::Result {
        self.0 = self.0.checked_sub(n).ok_or("out of stock")?;
        Ok(self.0)
    }
}

#[actix::test]
async fn an_actor_replying_a_value_is_forwarded_to_its_ok_is_acked_and_its_err_retried() {
    tokio::time::pause();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::forward_to(Stock(5).start().recipient()))
            .build()
            .unwrap(),
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.recipient())
            .max_attempts(3)
            .build()
            .unwrap(),
    );
    assert_eq!(producer.send(Take(2)).await, Ok(()), "Ok(3): handled");
    assert_eq!(producer.send(Take(3)).await, Ok(()), "Ok(0): handled");
    assert_eq!(
        producer.send(Take(1)).await,
        Err(DeliveryError::GaveUp { attempts: 3 }),
        "Err: not ACKed, retried until given up"
    );
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.handler_failures), (2, 3));
}
