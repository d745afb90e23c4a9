//! Three versions of one message type, as a rolling deploy meets them: `OrderV1` on the old
//! nodes, `OrderV2` (a field added with `#[serde(default)]`, no new schema version) and
//! `Order` (schema version 2: `total` renamed `total_cents` and in cents, read from version 1
//! by `upcast`); consumers that record what they handle and their dead letters.

use std::time::Duration;

use actix_delivery::codec::{UpcastError, Written};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, DeadLetter, DeadLetterReason, DeliveryHandler, ProducerHandle,
    ReliableDelivery,
};
use serde::{Deserialize, Serialize};

use super::Handled;
use crate::common::{confirm_into, dead_letter_log, Confirmations, Log};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderV1 {
    pub id: u64,
    pub total: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderV2 {
    pub id: u64,
    pub total: u64,
    #[serde(default)]
    pub currency: Option<String>,
}

/// Schema version 2.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
    pub total_cents: u64,
}

/// Reads version 1 (`OrderV1`) as an `Order`.
pub fn upcast(old: Written<'_>) -> Result<Order, UpcastError> {
    match old.version() {
        1 => {
            let v1: OrderV1 = old.decode()?;
            Ok(Order {
                id: v1.id,
                total_cents: v1.total * 100,
            })
        }
        other => Err(UpcastError::new(format!(
            "no upcaster from version {other}"
        ))),
    }
}

pub fn v1(id: u64) -> OrderV1 {
    OrderV1 { id, total: id * 2 }
}

pub fn v2(id: u64) -> OrderV2 {
    OrderV2 {
        id,
        total: id * 2,
        currency: Some("EUR".into()),
    }
}

/// A consumer recording what it handles and its dead letters.
pub fn consumer<T>() -> (ConsumerHandle<T>, Handled<T>, Log<DeadLetter>)
where
    T: std::hash::Hash + Eq + Clone + Send + 'static,
{
    let handled = Handled::<T>(Default::default());
    let record = handled.clone();
    let (sink, dead) = dead_letter_log();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |body: T| {
            record.record(body);
            async { Ok::<(), String>(()) }
        }))
        .dead_letters(sink)
        .build()
        .unwrap(),
    );
    (consumer, handled, dead)
}

/// Tells `producer` the messages `make(1..=n)`, each confirmed into the returned log.
pub fn send<T: Clone + Send + 'static>(
    producer: &ProducerHandle<T>,
    n: u64,
    make: impl Fn(u64) -> T,
) -> Confirmations<u64> {
    let confirmations = Confirmations::<u64>::default();
    for id in 1..=n {
        producer
            .tell(make(id), confirm_into(&confirmations, id))
            .unwrap();
    }
    confirmations
}

/// Waits until `dead` holds at least `n` letters, then checks that every one has `reason`.
pub async fn assert_dead_letters(dead: &Log<DeadLetter>, n: usize, reason: DeadLetterReason) {
    assert!(
        super::wait_until(Duration::from_secs(10), || dead.len() >= n).await,
        "{} dead letters",
        dead.len()
    );
    for letter in dead.snapshot() {
        assert_eq!(letter.reason, reason, "{letter:?}");
    }
}
