//! Three versions of one message type, as a rolling deploy meets them: `OrderV1` on the old
//! nodes, `OrderV2` (a field added with `#[serde(default)]`, no new schema version) and
//! `Order` (schema version 2: `total` renamed `total_cents` and in cents, read from version 1
//! by `upcast`); consumers that record what they handle and their dead letters.

use std::collections::HashMap;
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

/// What an old and a new side exchanged, `n` messages each way.
pub struct Exchanged<'a> {
    pub from_old: &'a Confirmations<u64>,
    pub from_new: &'a Confirmations<u64>,
    pub old: (&'a Handled<OrderV1>, &'a Log<DeadLetter>),
    pub new: (&'a Handled<OrderV2>, &'a Log<DeadLetter>),
}

/// Waits until both directions are confirmed, then checks that every message was confirmed
/// once, handled once as the receiver's own type (the added field defaulted on the new side),
/// and none was a dead letter.
pub async fn assert_read_both_ways(n: u64, exchanged: Exchanged<'_>) {
    let Exchanged {
        from_old,
        from_new,
        old,
        new,
    } = exchanged;
    assert!(
        super::wait_until(Duration::from_secs(20), || from_old.len() as u64 == n
            && from_new.len() as u64 == n)
        .await
    );
    super::assert_each_confirmed_once(from_old, n, "old to new");
    super::assert_each_confirmed_once(from_new, n, "new to old");
    let expected_new: HashMap<OrderV2, u32> = (1..=n)
        .map(|id| {
            let read = OrderV2 {
                currency: None,
                ..v2(id)
            };
            (read, 1)
        })
        .collect();
    assert_eq!(new.0.snapshot(), expected_new);
    let expected_old: HashMap<OrderV1, u32> = (1..=n).map(|id| (v1(id), 1)).collect();
    assert_eq!(old.0.snapshot(), expected_old);
    assert_eq!((old.1.len(), new.1.len()), (0, 0), "no dead letters");
}
