//! Two writers of one stream (two nodes on a shared journal, an overlapping failover, one
//! database opened under two names): the newest durable producer owns the stream, a recovery
//! racing the other writer's snapshot and delete still recovers, a second SQLite writer cannot
//! commit under a taken seq, and two outbox instances deliver each delivery once and go quiet.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, Outbox, PersistentConfig, PersistentHandle,
    PersistentOptions,
};
use actix_delivery::{
    ConsumerOptions, ConsumerRef, Delivery, DeliveryError, ProducerConfig, ReliableDelivery,
};
use common::entities::{ledger_id, orders_id, Ledger, Op, Orders, Ship};
use common::{cuttable, durable_u32, recording_consumer, settle, settle_for};
use serde::{Deserialize, Serialize};

/// The newest opener owns the stream. A process cannot tell a live predecessor from a dead one
/// (refusing the newcomer would block every failover), so a second durable producer opened on a
/// stream that a live producer writes takes it over: the journal's fence refuses the previous
/// owner at its next write, clearly, and it stops for good instead of restarting (supervised)
/// and fighting back.
#[actix::test]
async fn a_second_durable_producer_takes_the_stream_over_and_the_first_stops() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<u32>();
    let first = durable_u32(&journal, consumer.consumer_ref(), 4, 100);
    first.send(1).await.unwrap();
    let second = durable_u32(&journal, consumer.consumer_ref(), 4, 100);
    settle().await; // the second one opened the stream the first one writes
    let by_first = first.send(2).await;
    match &by_first {
        Err(DeliveryError::Storage(reason)) => {
            assert!(
                reason.contains("the newest opener owns the stream"),
                "{reason}"
            )
        }
        other => panic!("the superseded producer stored: {other:?}"),
    }
    let stopped = tokio::time::timeout(Duration::from_secs(10), first.stopped())
        .await
        .expect("the superseded producer stops for good");
    assert!(
        matches!(stopped, Err(actix_delivery::Failure::TakenOver(_))),
        "{stopped:?}"
    );
    assert_eq!(second.send(3).await, Ok(()));
    settle_for(1_000).await;
    assert!(first.send(4).await.is_err(), "it does not fight back");
    assert_eq!(second.send(5).await, Ok(()));
    assert_eq!(handled.snapshot(), [1, 3, 5]);
}

/// A journal whose `load_snapshot` waits at a gate once armed: holds a recovery between
/// reading the snapshot and reading the events after it.
#[derive(Clone)]
struct GatedSnapshots {
    inner: MemoryJournal,
    gate: Arc<Mutex<Option<Arc<tokio::sync::Notify>>>>,
    waiting: Arc<AtomicU64>,
}

impl Journal for GatedSnapshots {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.inner.append_as(id, first_seq, payloads, manifest)
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.inner.replay(id, from_seq, to_seq, max_events)
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to_seq)
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, snapshot)
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        let id = id.clone();
        Box::pin(async move {
            let snapshot = self.inner.load_snapshot(&id).await?;
            let gate = self.gate.lock().unwrap().take();
            if let Some(gate) = gate {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
            }
            Ok(snapshot)
        })
    }
}

/// Recovery reads the snapshot, then the highest seq, then the events after the snapshot. If the
/// stream's other writer (the old instance of an overlapping failover) saves a newer snapshot
/// and deletes the events it covers in between, the events after the old snapshot are gone,
/// though the journal is perfectly consistent; a single instance whose catch-up after a
/// conflict races its own spawned `save_snapshot` + `delete_to` meets the same. That gap is not
/// `JournalError::Corrupt` (which stops the actor for good, even under a Supervisor): as Akka
/// does, recovery reads the snapshot again and, finding a newer one, recovers from it.
#[actix::test]
async fn a_recovery_racing_another_writers_snapshot_and_delete_recovers_from_the_newer_snapshot() {
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let config = PersistentConfig {
        snapshot_every: Some(1),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let old = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(memory.clone()), ledger_id()).config(config.clone()),
    )
    .unwrap();
    for n in 1..=3 {
        old.ask(Op::Apply(n)).await.unwrap();
    }
    settle().await; // snapshot at 3 saved, 1..=3 deleted
    let gate = Arc::new(tokio::sync::Notify::new());
    let gated = GatedSnapshots {
        inner: memory.clone(),
        gate: Arc::new(Mutex::new(Some(gate.clone()))),
        waiting: Arc::new(AtomicU64::new(0)),
    };
    // The failover's new instance starts while the old one still runs.
    let new = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(gated.clone()), ledger_id())
            .config(config)
            .supervised(),
    )
    .unwrap();
    settle().await;
    assert_eq!(
        gated.waiting.load(Ordering::SeqCst),
        1,
        "read the snapshot at 3"
    );
    for n in 4..=5 {
        old.ask(Op::Apply(n)).await.unwrap();
    }
    settle().await; // snapshot at 5 saved, 4..=5 deleted
    let waiting = actix::spawn(new.ask(Op::Total)); // waits for the recovery
    settle().await;
    gate.notify_one();
    let total = waiting.await.unwrap();
    settle_for(100).await;
    let later = new.ask(Op::Total).await;
    assert!(
        matches!(total, Ok(5)) && matches!(later, Ok(5)),
        "the new instance could not recover a consistent journal: {total:?}; \
         supervised, it then answers: {later:?}"
    );
}

/// The SQLite journal's fence trusts the writer's in-memory map of buffered streams (the writer
/// consults `event_buffer` only for streams in it), and the one-writer rule rests on a lock file.
/// Were the lock file named after the path as given (`<path>-lock`), the same database reached
/// through another name (a symlink or hard link to the file) would get another lock file: two
/// journals would open it as writers, each fencing against its own map only, and both would
/// acknowledge an append at seq 1, two different events committed under one seq (the documented "a
/// loser gets `Conflict`" would fail). The lock file is named after the canonical path and a file
/// with several hard links is refused (see `sqlite_a_file_is_one_journal_whatever_its_name` in
/// `tests/features/journal.rs`), so the second open fails; one that opened would have to get
/// `Conflict`.
#[actix::test]
async fn a_second_sqlite_writer_through_a_symlink_cannot_commit_under_a_taken_seq() {
    use actix_delivery::journal::{SqliteJournal, SqliteOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let alias = dir.path().join("alias.db");
    let first = SqliteJournal::open(&path).await.unwrap();
    std::os::unix::fs::symlink(&path, &alias).unwrap();
    // Refused after waiting this long for the first to let go.
    let waiting = SqliteOptions::builder()
        .busy_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let second = SqliteJournal::open_with(&alias, waiting).await;
    let Ok(second) = second else {
        return; // refused: sound
    };
    let id = PersistenceId::new("s").unwrap();
    first
        .append(&id, 1, vec![b"from first".to_vec()])
        .await
        .unwrap();
    let raced = second.append(&id, 1, vec![b"from second".to_vec()]).await;
    let events = first.replay(&id, 1, u64::MAX, 10).await;
    assert!(
        matches!(raced, Err(JournalError::Conflict { .. })),
        "the second writer's append at seq 1 was acknowledged: {raced:?}; stream now: {events:?}"
    );
}

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

/// Two live instances of one entity with an outbox, commands alternating between them:
/// conflicts hit batches that carry deliveries and confirmations. Every order is stored once,
/// every shipment is applied once by an effectively-once receiver, and the outboxes go quiet.
#[actix::test]
async fn two_outbox_instances_racing_deliver_each_once_and_go_quiet() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse_id = PersistenceId::new("warehouse").unwrap();
    let warehouse = PersistentHandle::<Warehouse>::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        warehouse_id.clone(),
    ))
    .unwrap();
    let receiver = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    let sent = Arc::new(AtomicU64::new(0));
    let start_instance = || {
        let (target, count) = (receiver.consumer_ref(), sent.clone());
        let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Ship>>| {
            count.fetch_add(deliveries.len() as u64, Ordering::SeqCst);
            target.do_send_all(deliveries.into_iter());
        });
        let lane = ProducerConfig {
            window_size: 8,
            resend_timeout: Duration::from_millis(100),
            ..ProducerConfig::default()
        };
        let outbox = Outbox::new().destination("shipping", link, lane).unwrap();
        PersistentHandle::<Orders>::start(
            PersistentOptions::new(Arc::new(journal.clone()), orders_id())
                .outbox(outbox)
                .supervised(),
        )
        .unwrap()
    };
    let (a, b) = (start_instance(), start_instance());
    let mut asks = Vec::new();
    for order in 1..=40u64 {
        let instance = if order % 2 == 0 { &a } else { &b };
        asks.push(actix::spawn(instance.ask(order)));
        if order % 5 == 0 {
            settle_for(30).await;
        }
    }
    for ask in asks {
        ask.await.unwrap().unwrap();
    }
    settle_for(20_000).await;
    let quiet = sent.load(Ordering::SeqCst);
    settle_for(5_000).await;
    let orders = recover_state::<Orders>(&journal, &orders_id())
        .await
        .unwrap();
    let mut placed = orders.placed.clone();
    placed.sort_unstable();
    assert_eq!(placed, (1..=40).collect::<Vec<_>>());
    let shipped = recover_state::<Warehouse>(&journal, &warehouse_id)
        .await
        .unwrap();
    let mut got = shipped.shipped.clone();
    got.sort_unstable();
    assert_eq!(got, (1..=40).collect::<Vec<_>>(), "each shipment once");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        quiet,
        "the outboxes keep resending confirmed deliveries"
    );
    let conflicts = a.stats().await.unwrap().conflicts + b.stats().await.unwrap().conflicts;
    assert!(conflicts > 0, "the instances really raced");
}

/// Two live instances of an entity with an outbox (two nodes on a shared journal, or an
/// overlapping failover): the instance that does not write learns of the other's confirmations
/// from no append of its own, and its lane resends the deliveries it recovered as unconfirmed.
/// Once the other instance's lane has moved the receiver's floor past them (its
/// `window_start`), those resends are *stale* at the receiver and never ACKed, so the idle
/// instance would record nothing, never hit the fence, never catch up, and (with the default
/// unbounded `max_attempts`) retransmit them forever. When its deliveries stall, the actor
/// reads the journal's highest seq and catches up if another writer appended: it stops
/// resending.
#[actix::test]
async fn an_idle_second_outbox_instance_catches_up_and_stops_resending() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse = PersistentHandle::<Warehouse>::start(PersistentOptions::new(
        Arc::new(journal.clone()),
        PersistenceId::new("warehouse").unwrap(),
    ))
    .unwrap();
    let receiver = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    let instance = |link: ConsumerRef<Ship>| {
        let lane = ProducerConfig {
            window_size: 8,
            resend_timeout: Duration::from_millis(100),
            ..ProducerConfig::default()
        };
        let outbox = Outbox::new().destination("shipping", link, lane).unwrap();
        PersistentHandle::<Orders>::start(
            PersistentOptions::new(Arc::new(journal.clone()), orders_id())
                .outbox(outbox)
                .supervised(),
        )
        .unwrap()
    };
    let (link_a, cut_a, _) = cuttable(receiver.consumer_ref());
    let (link_b, cut_b, seen_b) = cuttable(receiver.consumer_ref());
    cut_a.store(true, Ordering::SeqCst);
    cut_b.store(true, Ordering::SeqCst);
    let a = instance(link_a);
    for order in 1..=5 {
        a.ask(order).await.unwrap();
    }
    // The second node starts: it recovers 1..=5 as unconfirmed.
    let b = instance(link_b);
    settle().await; // recovered (it writes nothing)
    cut_a.store(false, Ordering::SeqCst);
    settle_for(2_000).await; // A delivers 1..=5, records their confirmations
    a.ask(6).await.unwrap();
    settle_for(2_000).await; // 6 goes out with window_start 6
    cut_b.store(false, Ordering::SeqCst);
    settle_for(10_000).await;
    let before = seen_b.len();
    settle_for(60_000).await;
    let after = seen_b.len();
    let stats = receiver.stats().await.unwrap();
    assert!(
        b.stats().await.unwrap().catch_ups >= 1,
        "the idle one caught up"
    );
    assert_eq!(
        after,
        before,
        "the idle instance sent {} more resends in a minute (receiver: {} stale, {} duplicates)",
        after - before,
        stats.stale,
        stats.duplicates
    );
}
