//! Event-sourced delivery (the outbox) and must-follow, over MemoryJournals under virtual time.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, Outbox, PersistentConfig,
    PersistentHandle, PersistentOptions,
};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryHandler, ProducerConfig,
    ReliableDelivery,
};
use common::{settle, settle_for, Log};
use serde::{Deserialize, Serialize};

/// Orders: placing one stores `Placed` and delivers `Ship` to "shipping".
#[derive(Debug, Default, Serialize, Deserialize)]
struct Orders {
    placed: Vec<u64>,
}

#[derive(Debug)]
enum OrderCommand {
    Place(u64),
    PlaceTo(u64, &'static str),
}

#[derive(Debug, Serialize, Deserialize)]
struct Placed(u64);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Ship(u64);

impl EventSourced for Orders {
    type Command = OrderCommand;
    type Event = Placed;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, command: &OrderCommand) -> Result<Decision<Self>, String> {
        let (order, to) = match *command {
            OrderCommand::Place(order) => (order, "shipping"),
            OrderCommand::PlaceTo(order, to) => (order, to),
        };
        Ok(Decision::persist([Placed(order)], ()).deliver(to, &Ship(order)))
    }

    fn apply(&mut self, Placed(order): &Placed) {
        self.placed.push(*order);
    }
}

fn orders_id() -> PersistenceId {
    PersistenceId::new("orders").unwrap()
}

/// A plain consumer of shipments, recording each it handles.
fn shipping() -> (ConsumerHandle<Ship>, Log<u64>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |Ship(order): Ship| {
        log.push(order);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// A link that can be cut, and counts what it saw.
fn link<T: Send + 'static>(
    to: ConsumerRef<T>,
) -> (ConsumerRef<T>, Arc<AtomicBool>, Arc<AtomicU64>) {
    let (cut, seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (is_cut, count) = (cut.clone(), seen.clone());
    let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
        count.fetch_add(deliveries.len() as u64, Ordering::SeqCst);
        if !is_cut.load(Ordering::SeqCst) {
            to.do_send_all(deliveries.into_iter());
        }
    });
    (link, cut, seen)
}

fn lane() -> ProducerConfig {
    ProducerConfig {
        window_size: 8,
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    }
}

fn start_orders(
    journal: &MemoryJournal,
    to: ConsumerRef<Ship>,
    config: PersistentConfig,
) -> PersistentHandle<Orders> {
    let outbox = Outbox::new().destination("shipping", to, lane()).unwrap();
    PersistentHandle::start(
        PersistentOptions::new(Arc::new(journal.clone()), orders_id())
            .config(config)
            .outbox(outbox)
            .supervised(),
    )
    .unwrap()
}

#[actix::test]
async fn a_delivery_is_sent_only_after_its_events_are_committed() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let (to, _, seen) = link(consumer.consumer_ref());
    let orders = start_orders(&journal, to, PersistentConfig::default());
    orders.ask(OrderCommand::Place(1)).await.unwrap();
    settle().await;
    assert_eq!(shipped.snapshot(), [1]);
    journal.faults().hold_commits();
    let placing = actix::spawn(orders.ask(OrderCommand::Place(2)));
    settle_for(5_000).await;
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "nothing sent before the commit"
    );
    journal.faults().release();
    placing.await.unwrap().unwrap();
    settle().await;
    assert_eq!(shipped.snapshot(), [1, 2]);
}

#[actix::test]
async fn a_delivery_whose_events_were_not_stored_is_never_sent() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let orders = start_orders(
        &journal,
        consumer.consumer_ref(),
        PersistentConfig::default(),
    );
    orders.ask(OrderCommand::Place(1)).await.unwrap();
    journal.faults().fail_nth_append(1);
    let failed = orders.ask(OrderCommand::Place(2)).await;
    assert!(
        matches!(failed, Err(CommandError::Journal(_))),
        "{failed:?}"
    );
    // The supervisor restarted the entity on the journal: 2 does not exist.
    orders.ask(OrderCommand::Place(3)).await.unwrap();
    settle_for(5_000).await;
    assert_eq!(shipped.snapshot(), [1, 3]);
    let state = recover_state::<Orders>(&journal, &orders_id())
        .await
        .unwrap();
    assert_eq!(state.placed, [1, 3]);
}

#[actix::test]
async fn unconfirmed_deliveries_are_sent_again_after_a_recovery() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let (to, cut, _) = link(consumer.consumer_ref());
    cut.store(true, Ordering::SeqCst);
    let orders = start_orders(&journal, to.clone(), PersistentConfig::default());
    for order in 1..=5 {
        orders.ask(OrderCommand::Place(order)).await.unwrap();
    }
    settle_for(1_000).await;
    assert!(shipped.snapshot().is_empty());
    orders.stop();
    orders.stopped().await.unwrap();
    cut.store(false, Ordering::SeqCst);
    let again = start_orders(&journal, to, PersistentConfig::default());
    again.ask(OrderCommand::Place(6)).await.unwrap();
    settle_for(1_000).await;
    assert_eq!(
        shipped.snapshot(),
        [1, 2, 3, 4, 5, 6],
        "recovered ones first, in order"
    );
    // Confirmations are recorded, in batches: a third life sends nothing again.
    let appends = journal.stats().appends;
    again.stop();
    again.stopped().await.unwrap();
    let third = start_orders(
        &journal,
        consumer.consumer_ref(),
        PersistentConfig::default(),
    );
    third.ask(OrderCommand::Place(7)).await.unwrap();
    settle_for(1_000).await;
    assert_eq!(shipped.snapshot(), [1, 2, 3, 4, 5, 6, 7]);
    assert!(
        appends <= 6 + 3,
        "6 commands, confirmations in few appends: {appends}"
    );
}

#[actix::test]
async fn max_unconfirmed_refuses_clearly_and_an_unknown_destination_is_an_error() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = shipping();
    let (to, cut, _) = link(consumer.consumer_ref());
    cut.store(true, Ordering::SeqCst);
    let config = PersistentConfig {
        max_unconfirmed: 3,
        ..Default::default()
    };
    let orders = start_orders(&journal, to, config);
    for order in 1..=3 {
        orders.ask(OrderCommand::Place(order)).await.unwrap();
    }
    let full = orders.ask(OrderCommand::Place(4)).await;
    assert!(
        matches!(&full, Err(CommandError::OutboxFull { destination, unconfirmed: 3 }) if destination == "shipping"),
        "{full:?}"
    );
    cut.store(false, Ordering::SeqCst);
    settle_for(1_000).await;
    orders.ask(OrderCommand::Place(4)).await.unwrap();
    let unknown = orders.ask(OrderCommand::PlaceTo(5, "billing")).await;
    assert!(matches!(unknown, Err(CommandError::UnknownDestination(d)) if d == "billing"));
    let state = recover_state::<Orders>(&journal, &orders_id())
        .await
        .unwrap();
    assert_eq!(state.placed, [1, 2, 3, 4]);
}

#[actix::test]
async fn snapshots_keep_the_outbox() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let (to, cut, _) = link(consumer.consumer_ref());
    cut.store(true, Ordering::SeqCst);
    let config = PersistentConfig {
        snapshot_every: Some(2),
        delete_events_on_snapshot: true,
        ..Default::default()
    };
    let orders = start_orders(&journal, to.clone(), config.clone());
    for order in 1..=5 {
        orders.ask(OrderCommand::Place(order)).await.unwrap();
    }
    settle().await;
    orders.stop();
    orders.stopped().await.unwrap();
    cut.store(false, Ordering::SeqCst);
    let _again = start_orders(&journal, to, config);
    settle_for(1_000).await;
    assert_eq!(shipped.snapshot(), [1, 2, 3, 4, 5]);
}

/// The receiving side of must-follow: a ledger that records shipments in the order applied.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Warehouse {
    shipped: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Shipped(u64);

impl EventSourced for Warehouse {
    type Command = u64;
    type Event = Shipped;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Shipped(order)], ()))
    }

    fn apply(&mut self, Shipped(order): &Shipped) {
        self.shipped.push(*order);
    }
}

#[actix::test]
async fn with_must_follow_the_receiver_applies_in_send_order_exactly_once_despite_reordering() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse_id = PersistenceId::new("warehouse").unwrap();
    let warehouse = PersistentHandle::<Warehouse>::start(
        PersistentOptions::new(Arc::new(journal.clone()), warehouse_id.clone()).config(
            PersistentConfig {
                must_follow: true,
                ..Default::default()
            },
        ),
    )
    .unwrap();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    // A link that drops every third delivery and reverses each batch: messages arrive out
    // of order, and predecessors go missing.
    let dropped = Arc::new(AtomicU64::new(0));
    let (target, count) = (consumer.consumer_ref(), dropped.clone());
    let n = AtomicU64::new(0);
    let shuffling = ConsumerRef::from_fn(move |mut deliveries: Vec<Delivery<Ship>>| {
        deliveries.reverse();
        let kept = deliveries.into_iter().filter(|_| {
            let keep = n.fetch_add(1, Ordering::SeqCst) % 3 != 2;
            count.fetch_add(u64::from(!keep), Ordering::SeqCst);
            keep
        });
        target.do_send_all(kept);
    });
    let orders = start_orders(&journal, shuffling, PersistentConfig::default());
    for order in 1..=60 {
        orders.ask(OrderCommand::Place(order)).await.unwrap();
    }
    settle_for(60_000).await;
    let state = recover_state::<Warehouse>(&journal, &warehouse_id)
        .await
        .unwrap();
    assert_eq!(
        state.shipped,
        (1..=60).collect::<Vec<_>>(),
        "send order, each once"
    );
    assert!(dropped.load(Ordering::SeqCst) > 0);
    let stats = warehouse.stats().await.unwrap();
    assert!(
        stats.refused > 0,
        "out-of-order deliveries were refused: {stats:?}"
    );
    let counts: BTreeMap<u64, usize> = state.shipped.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(*o).or_default() += 1;
        m
    });
    assert!(counts.values().all(|&c| c == 1));
}

#[actix::test]
async fn a_command_that_waited_for_the_recovery_delivers_only_after_its_own_commit() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let (to, _, seen) = link(consumer.consumer_ref());
    journal.faults().hold_commits();
    let orders = start_orders(&journal, to, PersistentConfig::default());
    let placing = actix::spawn(orders.ask(OrderCommand::Place(1))); // arrives during recovery
    settle_for(5_000).await;
    assert_eq!(
        journal.faults().held(),
        1,
        "decided after the recovery, waiting for its commit"
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "nothing sent before the commit"
    );
    journal.faults().release();
    placing.await.unwrap().unwrap();
    settle_for(1_000).await;
    assert_eq!(shipped.snapshot(), [1], "sent once, under one seq");
}

/// Dropping the entity's last handle does not abandon its outbox: the actor delivers until
/// every recorded delivery is confirmed, then stops for good.
#[actix::test]
async fn the_last_handle_dropped_stops_the_entity_once_its_outbox_is_confirmed() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = shipping();
    let (to, cut, seen) = link(consumer.consumer_ref());
    let orders = start_orders(&journal, to, PersistentConfig::default());
    cut.store(true, Ordering::SeqCst);
    orders.ask(OrderCommand::Place(1)).await.unwrap();
    let stopped = actix::spawn(orders.stopped());
    drop(orders);
    settle_for(10_000).await;
    assert!(seen.load(Ordering::SeqCst) > 1, "resent while unconfirmed");
    assert!(!stopped.is_finished(), "a delivery is unconfirmed");
    cut.store(false, Ordering::SeqCst);
    settle_for(1_000).await;
    assert_eq!(shipped.snapshot(), [1]);
    assert!(
        stopped.is_finished(),
        "stopped once the delivery was confirmed"
    );
    let restarted = start_orders(
        &journal,
        consumer.consumer_ref(),
        PersistentConfig::default(),
    );
    restarted.ask(OrderCommand::Place(2)).await.unwrap();
    settle().await;
    assert_eq!(shipped.snapshot(), [1, 2], "the confirmation was recorded");
}

/// An outbox lane's public incarnation id (in every `DeliveryInfo`, log and dead letter)
/// grants nothing: a sender that knows it and the lane's id, and sends far ahead under a
/// token of its own, gets a window of its own at the receiver, and the lane's genuine
/// deliveries go on being applied, each once.
#[actix::test]
async fn a_forged_delivery_under_an_outbox_lanes_id_moves_not_the_lanes_window() {
    use actix_delivery::{DeliveryInfo, Incarnation};
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse_id = PersistenceId::new("warehouse").unwrap();
    let warehouse = PersistentHandle::<Warehouse>::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        warehouse_id.clone(),
    ))
    .unwrap();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    // What the lane's deliveries show anyone who reads them or the logs: its id and the
    // public id of its token.
    let seen: Arc<std::sync::Mutex<Option<DeliveryInfo>>> = Arc::default();
    let tap = {
        let (seen, target) = (seen.clone(), consumer.consumer_ref());
        ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Ship>>| {
            let first = &deliveries[0];
            *seen.lock().unwrap() = Some(DeliveryInfo {
                producer_id: first.producer_id.clone(),
                incarnation: first.incarnation.id(),
                seq: first.seq,
                window_start: first.window_start,
                trace_context: None,
                first_seq: None,
            });
            target.do_send_all(deliveries.into_iter());
        })
    };
    let orders = start_orders(&journal, tap, PersistentConfig::default());
    orders.ask(OrderCommand::Place(1)).await.unwrap();
    settle_for(1_000).await;
    let lane = seen.lock().unwrap().clone().expect("the lane delivered");
    let (reply_to, _acks) = common::ack_probe();
    let mut forged = Delivery::new(
        lane.producer_id.clone(),
        Incarnation::from_u128(666),
        1_000_000,
        Ship(999),
        reply_to,
    );
    forged.window_start = 1_000_000;
    consumer.recipient().do_send(forged);
    settle_for(10).await;
    for order in 2..=5 {
        orders.ask(OrderCommand::Place(order)).await.unwrap();
    }
    settle_for(1_000).await;
    let state = recover_state::<Warehouse>(&journal, &warehouse_id)
        .await
        .unwrap();
    let genuine: Vec<u64> = state
        .shipped
        .iter()
        .copied()
        .filter(|&o| o != 999)
        .collect();
    assert_eq!(
        genuine,
        [1, 2, 3, 4, 5],
        "every genuine delivery applied once"
    );
}
