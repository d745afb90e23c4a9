//! Sharding in one process, under `tokio::time::pause()`: the entity host (activation,
//! passivation when idle and by LRU, commands during passivation and recovery), the sharded
//! producer (one stream per entity, cleanup, bounds, the durable variant) and the shard
//! coordinator over in-memory leases (acquire, renew, expire, hand off); the lease stores'
//! shared contract, and (feature `postgres`) the PostgreSQL store's errors.

use crate::common;
#[cfg(feature = "postgres")]
use crate::postgres_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};
use actix_delivery::persistence::{recover_state, CommandError, PersistentConfig};
use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions, EntityId, HostError};
use common::entities::{Ledger, Op, Sequence};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn id(n: u64) -> EntityId {
    EntityId::new(format!("e{n}")).unwrap()
}

fn stream(n: u64) -> PersistenceId {
    PersistenceId::new(format!("ledger|e{n}")).unwrap()
}

fn host(journal: Arc<dyn Journal>, options: EntityHostOptions) -> EntityHostHandle<Ledger> {
    EntityHostHandle::start(journal, options).unwrap()
}

fn options() -> actix_delivery::sharding::EntityHostOptionsBuilder {
    EntityHostOptions::builder("ledger")
}

// --- the entity host ------------------------------------------------------------------------

#[actix::test]
async fn an_entity_starts_on_its_first_command_and_recovers_its_state_after_a_restart() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(journal.clone(), options().build().unwrap());
    assert_eq!(ledger.ask(id(1), Op::Apply(10)).await.unwrap(), 1);
    assert_eq!(ledger.ask(id(1), Op::Apply(11)).await.unwrap(), 2);
    assert_eq!(ledger.ask(id(2), Op::Apply(12)).await.unwrap(), 1);
    let stats = ledger.stats();
    assert_eq!((stats.activations, stats.active, stats.routed), (2, 2, 3));
    ledger.stop();
    ledger.stopped().await;
    assert!(matches!(
        ledger.ask(id(1), Op::Total).await,
        Err(HostError::NotHosted(_))
    ));

    let ledger = host(journal, options().build().unwrap());
    assert_eq!(
        ledger.ask(id(1), Op::Total).await.unwrap(),
        2,
        "recovered from the journal"
    );
}

#[actix::test]
async fn an_idle_entity_is_passivated_and_the_next_command_starts_it_again() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal.clone(),
        options()
            .idle_timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    ledger.ask(id(1), Op::Apply(1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    ledger.ask(id(2), Op::Apply(2)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let stats = ledger.stats();
    assert_eq!(
        (stats.active, stats.passivated_idle),
        (1, 1),
        "e1 idle for 11 s, e2 for 6 s"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ledger.stats().active, 0);
    assert_eq!(
        ledger.ask(id(1), Op::Apply(3)).await.unwrap(),
        2,
        "recovered"
    );
    assert_eq!(ledger.stats().activations, 3);
}

#[actix::test]
async fn beyond_max_active_entities_the_least_recently_used_is_passivated() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal.clone(),
        options().max_active_entities(3).build().unwrap(),
    );
    for n in 1..=3 {
        ledger.ask(id(n), Op::Apply(n)).await.unwrap();
    }
    ledger.ask(id(1), Op::Apply(10)).await.unwrap(); // e2 is the least recently used now
    ledger.ask(id(4), Op::Apply(4)).await.unwrap();
    let stats = ledger.stats();
    assert_eq!((stats.active, stats.passivated_over_limit), (3, 1));
    // e2 was the one: asking it starts it again (and passivates e3).
    assert_eq!(ledger.ask(id(2), Op::Total).await.unwrap(), 1);
    let stats = ledger.stats();
    assert_eq!((stats.activations, stats.passivated_over_limit), (5, 2));
}

#[actix::test]
async fn a_command_sent_while_its_entity_stops_waits_and_runs_on_the_next_instance() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal.clone(),
        options()
            .max_active_entities(1)
            .max_held_commands(2)
            .build()
            .unwrap(),
    );
    ledger.ask(id(1), Op::Apply(1)).await.unwrap();
    // e2 starts beyond the limit: e1 is passivated at once, its instance stopping.
    let second = ledger.ask(id(2), Op::Apply(2));
    let held = [2, 3].map(|n| ledger.ask(id(1), Op::Apply(n)));
    let refused = ledger.ask(id(1), Op::Apply(4)).await;
    assert!(
        matches!(refused, Err(HostError::Full { held: 2 })),
        "{refused:?}"
    );
    assert_eq!(ledger.stats().held, 2);
    second.await.unwrap();
    let [a, b] = held;
    assert_eq!(
        (a.await.unwrap(), b.await.unwrap()),
        (2, 3),
        "in order, after e1's first"
    );
    let stats = ledger.stats();
    assert_eq!((stats.waited, stats.refused_full, stats.held), (2, 1, 0));
    let state = recover_state::<Ledger>(&*journal, &stream(1))
        .await
        .unwrap();
    assert_eq!(state.applied.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
}

/// A journal whose reads take a second (virtual): recoveries are slow.
struct SlowReads(MemoryJournal);

impl Journal for SlowReads {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.0.append_as(id, first_seq, payloads, manifest)
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.0.replay(id, from_seq, to_seq, max_events)
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        let id = id.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.0.highest_seq(&id).await
        })
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.0.delete_to(id, to_seq)
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.0.save_snapshot(id, snapshot)
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.0.load_snapshot(id)
    }

    fn max_payload(&self) -> usize {
        self.0.max_payload()
    }
}

#[actix::test]
async fn commands_sent_during_recovery_wait_in_order_and_beyond_the_bound_are_refused() {
    tokio::time::pause();
    let journal = Arc::new(SlowReads(MemoryJournal::new()));
    let persistent = PersistentConfig {
        max_recovery_buffer: 3,
        ..PersistentConfig::default()
    };
    let ledger = host(journal, options().persistent(persistent).build().unwrap());
    let asked: Vec<_> = (1..=4).map(|n| ledger.ask(id(1), Op::Apply(n))).collect();
    let mut answers = Vec::new();
    for answer in asked {
        answers.push(answer.await);
    }
    assert!(matches!(
        answers[3],
        Err(HostError::Command(CommandError::Overloaded { buffered: 3 }))
    ));
    let replies: Vec<i64> = answers[..3].iter().map(|a| *a.as_ref().unwrap()).collect();
    assert_eq!(replies, [1, 2, 3], "in arrival order, once recovered");
}

#[actix::test]
async fn passivation_under_load_loses_no_command_and_applies_each_once() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal.clone(),
        options()
            .max_active_entities(5)
            .idle_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    const CALLERS: u64 = 20;
    const COMMANDS: u64 = 100;
    const ENTITIES: u64 = 40;
    let callers = (0..CALLERS).map(|caller| {
        let ledger = ledger.clone();
        actix::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(caller);
            let mut sent = Vec::new();
            for n in 0..COMMANDS {
                let entity = rng.random_range(0..ENTITIES);
                let command = caller * COMMANDS + n;
                ledger.ask(id(entity), Op::Apply(command)).await.unwrap();
                sent.push((entity, command));
                let pause = rng.random_range(0..200);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            sent
        })
    });
    let mut expected: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for caller in futures_util::future::join_all(callers).await {
        for (entity, command) in caller.unwrap() {
            expected.entry(entity).or_default().push(command);
        }
    }
    for (entity, mut commands) in expected {
        let state = recover_state::<Ledger>(&*journal, &stream(entity))
            .await
            .unwrap();
        commands.sort_unstable();
        let applied: Vec<u64> = state.applied.keys().copied().collect();
        assert_eq!(applied, commands, "entity {entity}");
        assert!(state.applied.values().all(|&times| times == 1));
    }
    let stats = ledger.stats();
    assert!(
        stats.passivated_over_limit > 0 && stats.passivated_idle > 0,
        "{stats:?}"
    );
    assert!(stats.activations > ENTITIES, "{stats:?}");
}

#[actix::test]
async fn under_a_burst_no_more_than_max_active_entities_run_and_the_others_wait_for_room() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal.clone(),
        options().max_active_entities(5).build().unwrap(),
    );
    // 200 commands to 50 entities at once: every running entity busy while the others ask.
    let asks: Vec<_> = (0..200u64)
        .map(|n| ledger.ask(id(n % 50), Op::Apply(n)))
        .collect();
    for (n, answer) in futures_util::future::join_all(asks)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(answer.unwrap(), n as i64 / 50 + 1, "command {n}");
    }
    let stats = ledger.stats();
    assert_eq!(stats.peak_active, 5, "{stats:?}");
    assert!(stats.active <= 5);
    assert!(stats.waited_for_room >= 150, "{stats:?}");
    assert_eq!((stats.activations, stats.held), (50, 0), "{stats:?}");
    for entity in 0..50 {
        let state = recover_state::<Ledger>(&*journal, &stream(entity))
            .await
            .unwrap();
        let expected: Vec<u64> = (0..4).map(|k| entity + 50 * k).collect();
        assert_eq!(state.applied.keys().copied().collect::<Vec<_>>(), expected);
    }
}

// --- the sharded producer ---------------------------------------------------------------

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use actix_delivery::durable::DurableOptions;
use actix_delivery::sharding::{
    EntityEnvelope, ShardId, ShardedProducerHandle, ShardedProducerOptions,
};
use actix_delivery::{ConsumerRef, Delivery, ProducerConfig, ReliableDelivery, TellError};
use common::{confirm_into, settle_for, Confirmations};

fn sequences(
    journal: Arc<dyn Journal>,
    persistent: PersistentConfig,
) -> EntityHostHandle<Sequence> {
    let options = EntityHostOptions::builder("seq")
        .shards(8)
        .persistent(persistent)
        .build()
        .unwrap();
    EntityHostHandle::start(journal, options).unwrap()
}

async fn applied(journal: &dyn Journal, entity: &EntityId) -> Vec<u64> {
    let id = PersistenceId::new(format!("seq|{entity}")).unwrap();
    recover_state::<Sequence>(journal, &id).await.unwrap().0
}

fn fast_streams() -> ProducerConfig {
    ProducerConfig {
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    }
}

#[actix::test]
async fn a_sharded_producer_opens_a_stream_per_entity_and_closes_it_once_unused() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let consumer = host.consumer(|body: u64| body);
    let options = ShardedProducerOptions::builder(&consumer)
        .shards(8)
        .cleanup_unused_after(Duration::from_secs(60))
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    for body in 0..30 {
        producer.send(id(body % 3), body).await.unwrap();
    }
    let stats = producer.lane_stats().await.unwrap();
    assert_eq!((stats.lanes, stats.opened, stats.settled), (3, 3, 30));
    settle_for(61_000).await;
    let stats = producer.lane_stats().await.unwrap();
    assert_eq!((stats.lanes, stats.closed), (0, 3), "unused for 60 s");
    producer.send(id(0), 30).await.unwrap();
    assert_eq!(
        producer.lane_stats().await.unwrap().opened,
        4,
        "opened again"
    );
    let expected: Vec<u64> = (0..=30).step_by(3).collect();
    assert_eq!(applied(&*journal, &id(0)).await, expected);
}

/// Entities of `shard` among 8 shards.
fn entities_of(shard: u32, count: usize) -> Vec<EntityId> {
    (0..)
        .map(id)
        .filter(|e| e.shard(8) == ShardId(shard))
        .take(count)
        .collect()
}

#[actix::test]
async fn an_entity_without_demand_holds_only_its_own_room_and_the_others_go_on() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let consumer = host.consumer(|body: u64| body);
    // Shard 0 is unreachable (its deliveries vanish); the others reach the host.
    let options = ShardedProducerOptions::per_shard(move |shard| match shard {
        ShardId(0) => ConsumerRef::from_fn(|_| {}),
        _ => consumer.consumer_ref(),
    })
    .shards(8)
    .max_pending_per_entity(5)
    .entity_stream(fast_streams())
    .build()
    .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    let stuck = entities_of(0, 1).remove(0);
    let others = entities_of(1, 4);
    let confirmed = Confirmations::default();
    for body in 0..5 {
        producer
            .tell(stuck.clone(), body, confirm_into(&confirmed, body))
            .unwrap();
    }
    let refused = producer.tell(stuck.clone(), 5, confirm_into(&confirmed, 5));
    assert!(
        matches!(refused, Err(TellError::QueueFull(5))),
        "{refused:?}"
    );
    for body in 100..200 {
        let entity = others[body as usize % 4].clone();
        producer.send(entity, body).await.unwrap();
    }
    let confirmations = confirmed.snapshot();
    assert_eq!(
        confirmations,
        [(5, Err(actix_delivery::DeliveryError::QueueFull))],
        "only the refusal: the stuck entity's five are still retransmitted"
    );
    let stats = producer.producer().stats().await.unwrap();
    assert_eq!(stats.in_flight, 5, "the stuck entity holds 5 of the window");
    assert!(applied(&*journal, &stuck).await.is_empty());
}

/// A link that loses deliveries at random (seeded), counting what it dropped.
fn lossy<T: Send + 'static>(
    target: ConsumerRef<T>,
    seed: u64,
    dropped: Arc<AtomicU64>,
) -> ConsumerRef<T> {
    let rng = Mutex::new(SmallRng::seed_from_u64(seed));
    ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
        let kept: Vec<_> = deliveries
            .into_iter()
            .filter(|_| {
                let keep = rng.lock().unwrap().random_bool(0.7);
                if !keep {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                keep
            })
            .collect();
        target.do_send_all(kept.into_iter());
    })
}

/// Sends 300 bodies in order to 10 entities over a lossy link; each entity's applied order.
async fn over_a_lossy_link(must_follow: bool) -> (BTreeMap<EntityId, Vec<u64>>, u64) {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let persistent = PersistentConfig {
        must_follow,
        ..PersistentConfig::default()
    };
    let host = sequences(journal.clone(), persistent);
    let consumer = host.consumer(|body: u64| body);
    let dropped = Arc::new(AtomicU64::new(0));
    let link = lossy(consumer.consumer_ref(), 7, dropped.clone());
    let options = ShardedProducerOptions::builder(link)
        .shards(8)
        .entity_stream(fast_streams())
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    for body in 0..300 {
        producer.tell(id(body % 10), body, |_| {}).unwrap();
    }
    producer.idle().await;
    let mut orders = BTreeMap::new();
    for n in 0..10 {
        orders.insert(id(n), applied(&*journal, &id(n)).await);
    }
    (orders, dropped.load(Ordering::Relaxed))
}

#[actix::test]
async fn with_must_follow_each_entity_applies_a_producers_messages_in_order_despite_loss() {
    tokio::time::pause();
    let (orders, dropped) = over_a_lossy_link(true).await;
    assert!(dropped > 30, "the link lost {dropped}");
    for (entity, order) in &orders {
        let n: u64 = entity.as_str()[1..].parse().unwrap();
        let sent: Vec<u64> = (0..300).filter(|b| b % 10 == n).collect();
        assert_eq!(order, &sent, "{entity}: each once, in the order sent");
    }
    // The same without must-follow: retransmissions overtake (so the check above bites).
    let (orders, _) = over_a_lossy_link(false).await;
    let reordered = orders
        .values()
        .filter(|order| order.windows(2).any(|w| w[0] > w[1]))
        .count();
    assert!(
        reordered > 0,
        "no entity saw a reordering without must-follow"
    );
}

#[actix::test]
async fn a_restarted_durable_sharded_producer_resends_and_each_entity_applies_once() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let consumer = host.consumer(|body: u64| body);
    let producer_journal = MemoryJournal::new();
    let stream = PersistenceId::new("orders-out").unwrap();
    let sink = common::Sink(common::Log::default());
    let resumed = sink.0.clone();
    let sink = actix::Actor::start(sink).recipient();
    let start = |target: ConsumerRef<EntityEnvelope<u64>>| -> ShardedProducerHandle<u64> {
        let options = ShardedProducerOptions::builder(target)
            .shards(8)
            .entity_stream(fast_streams())
            .build()
            .unwrap();
        let durable =
            DurableOptions::new(Arc::new(producer_journal.clone()), stream.clone(), "orders")
                .confirmations(sink.clone());
        ReliableDelivery::durable_sharded_producer(options, durable).unwrap()
    };
    // First life: the entities apply every message, but no ACK comes back.
    let target = consumer.consumer_ref();
    let deaf = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<EntityEnvelope<u64>>>| {
        let lost_acks = deliveries.into_iter().map(|mut d| {
            d.reply_to = Some(actix_delivery::ReplyTo::from_fn(|_| {}));
            d
        });
        target.do_send_all(lost_acks);
    });
    let first = start(deaf);
    for body in 0..20 {
        first.store(id(body % 4), body).await.unwrap();
    }
    settle_for(1_000).await;
    for n in 0..4 {
        assert_eq!(
            applied(&*journal, &id(n)).await.len(),
            5,
            "applied, not confirmed"
        );
    }
    first.stop();
    first.stopped().await.unwrap();
    // Second life: resends the 20 stored messages under their ids; the entities know them.
    let second = start(consumer.consumer_ref());
    second.idle().await;
    settle_for(100).await;
    assert_eq!(resumed.len(), 20, "every stored message confirmed once");
    for n in 0..4 {
        let sent: Vec<u64> = (0..20).filter(|b| b % 4 == n).collect();
        assert_eq!(applied(&*journal, &id(n)).await, sent, "each applied once");
    }
    let refused = second.send(id(0), 99).await;
    assert!(refused.is_ok());
}

// --- the coordinator, over in-memory leases ---------------------------------------------------

use std::collections::HashMap;

use actix_delivery::sharding::{
    CoordinatorOptions, CoordinatorStats, LeaseError, LeaseFuture, LeaseStore, LeaseView,
    LocalFuture, Member, MemoryLeaseStore, ShardCoordinatorHandle, ShardTransport,
};
use actix_delivery::ConsumerHandle;

/// Subjects in one process: a shard's deliveries go to the consumer its owner exposed, or
/// nowhere while it has none (as over NATS).
#[derive(Clone, Default)]
struct Bus(Arc<Mutex<HashMap<ShardId, ConsumerRef<EntityEnvelope<u64>>>>>);

impl Bus {
    fn destination(
        &self,
    ) -> impl Fn(ShardId) -> ConsumerRef<EntityEnvelope<u64>> + Send + Sync + use<> {
        let bus = self.clone();
        move |shard| {
            let bus = bus.clone();
            ConsumerRef::from_fn(move |deliveries| {
                let owner = bus.0.lock().unwrap().get(&shard).cloned();
                if let Some(owner) = owner {
                    owner.do_send_all(deliveries.into_iter());
                }
            })
        }
    }

    fn owner_count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A node's exposure on the [`Bus`].
struct OnBus(Bus, ConsumerHandle<EntityEnvelope<u64>>);

impl ShardTransport for OnBus {
    fn expose(&self, shard: ShardId) -> LocalFuture<Result<(), String>> {
        self.0
             .0
            .lock()
            .unwrap()
            .insert(shard, self.1.consumer_ref());
        Box::pin(std::future::ready(Ok(())))
    }

    fn unexpose(&self, shard: ShardId) {
        self.0 .0.lock().unwrap().remove(&shard);
    }
}

/// A lease store that one node can lose (as if its database connection broke).
#[derive(Clone)]
struct Partitioned {
    inner: MemoryLeaseStore,
    cut_off: Arc<Mutex<Option<String>>>,
}

impl Partitioned {
    fn fails(&self, who: &str) -> bool {
        self.cut_off
            .lock()
            .unwrap()
            .as_deref()
            .is_some_and(|node| who.starts_with(node))
    }

    fn refuse<T: Send + 'static>(&self) -> LeaseFuture<'_, T> {
        Box::pin(std::future::ready(Err(LeaseError::Storage(
            "cut off".into(),
        ))))
    }
}

impl LeaseStore for Partitioned {
    fn heartbeat(&self, ns: &str, member: &Member, ttl: Duration) -> LeaseFuture<'_, ()> {
        if self.fails(&member.id) {
            return self.refuse();
        }
        self.inner.heartbeat(ns, member, ttl)
    }

    fn acquire(
        &self,
        ns: &str,
        shards: &[ShardId],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<(ShardId, u64)>> {
        if self.fails(owner) {
            return self.refuse();
        }
        self.inner.acquire(ns, shards, owner, ttl)
    }

    fn renew(
        &self,
        ns: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<ShardId>> {
        if self.fails(owner) {
            return self.refuse();
        }
        self.inner.renew(ns, leases, owner, ttl)
    }

    fn release(&self, ns: &str, leases: &[(ShardId, u64)], owner: &str) -> LeaseFuture<'_, ()> {
        if self.fails(owner) {
            return self.refuse();
        }
        self.inner.release(ns, leases, owner)
    }

    fn leave(&self, ns: &str, member: &str) -> LeaseFuture<'_, ()> {
        self.inner.leave(ns, member)
    }

    fn view(&self, ns: &str) -> LeaseFuture<'_, LeaseView> {
        self.inner.view(ns)
    }
}

fn node(
    name: &str,
    journal: &Arc<dyn Journal>,
    leases: &Partitioned,
    bus: &Bus,
) -> ShardCoordinatorHandle<Sequence> {
    let host = EntityHostOptions::builder("seq")
        .shards(16)
        .persistent(PersistentConfig {
            must_follow: true,
            ..PersistentConfig::default()
        })
        .build()
        .unwrap();
    let options = CoordinatorOptions::builder(name)
        .lease_ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .max_handoffs(2)
        .build()
        .unwrap();
    let bus = bus.clone();
    ShardCoordinatorHandle::start(
        journal.clone(),
        host,
        Arc::new(leases.clone()),
        options,
        |host| OnBus(bus, host.consumer(|body: u64| body)),
    )
    .unwrap()
}

async fn owned(nodes: &[&ShardCoordinatorHandle<Sequence>]) -> Vec<u64> {
    let mut owned = Vec::new();
    for node in nodes {
        owned.push(node.stats().await.unwrap().shards_owned);
    }
    owned
}

/// How many of the 16 shards the rendezvous allocation gives each of `nodes`.
fn desired(nodes: &[&ShardCoordinatorHandle<Sequence>]) -> Vec<u64> {
    use actix_delivery_proto::sharding::allocation::desired_owner;
    let members: std::collections::BTreeSet<String> =
        nodes.iter().map(|n| n.member().to_owned()).collect();
    nodes
        .iter()
        .map(|node| {
            (0..16)
                .filter(|&s| desired_owner(ShardId(s), &members) == Some(node.member()))
                .count() as u64
        })
        .collect()
}

#[actix::test]
async fn nodes_share_the_shards_hand_off_on_join_and_leave_and_take_over_a_lost_one() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let leases = Partitioned {
        inner: MemoryLeaseStore::new(),
        cut_off: Arc::default(),
    };
    let bus = Bus::default();
    let a = node("a", &journal, &leases, &bus);
    let b = node("b", &journal, &leases, &bus);
    settle_for(10_000).await;
    let split = owned(&[&a, &b]).await;
    assert_eq!(
        split,
        desired(&[&a, &b]),
        "each owns what the allocation gives it"
    );

    let options = ShardedProducerOptions::per_shard(bus.destination())
        .shards(16)
        .entity_stream(fast_streams())
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    let mut sent: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut body = 0;
    let mut send_burst = |producer: &ShardedProducerHandle<u64>| {
        for _ in 0..300 {
            let entity = body % 50;
            producer.tell(id(entity), body, |_| {}).unwrap();
            sent.entry(entity).or_default().push(body);
            body += 1;
        }
    };
    send_burst(&producer);
    producer.idle().await;

    // c joins: the others hand it its share, two shards at a time each.
    let handoffs = |a: CoordinatorStats, b: CoordinatorStats| a.handoffs + b.handoffs;
    let before = handoffs(a.stats().await.unwrap(), b.stats().await.unwrap());
    let c = node("c", &journal, &leases, &bus);
    send_burst(&producer);
    settle_for(10_000).await;
    let split = owned(&[&a, &b, &c]).await;
    assert_eq!(split, desired(&[&a, &b, &c]), "c took its share");
    let after = handoffs(a.stats().await.unwrap(), b.stats().await.unwrap());
    assert_eq!(
        after - before,
        split[2],
        "each of c's shards came by a handoff"
    );
    producer.idle().await;

    // b loses the store: its leases run out here first, then in the store; a and c take its
    // shards.
    *leases.cut_off.lock().unwrap() = Some("b#".into());
    send_burst(&producer);
    settle_for(10_000).await;
    let b_stats = b.stats().await.unwrap();
    assert_eq!(b_stats.shards_owned, 0);
    assert!(
        b_stats.lost >= 1 && b_stats.renew_failures >= 1,
        "{b_stats:?}"
    );
    let split = owned(&[&a, &c]).await;
    assert_eq!(
        split,
        desired(&[&a, &c]),
        "b's shards went to their new owners"
    );
    producer.idle().await;

    // c leaves gracefully: a takes everything.
    c.stop();
    send_burst(&producer);
    c.stopped().await;
    settle_for(10_000).await;
    assert_eq!(owned(&[&a]).await, [16]);
    assert!(c.host().stats().active == 0);
    producer.idle().await;
    assert_eq!(bus.owner_count(), 16);

    for (entity, bodies) in sent {
        assert_eq!(
            applied(&*journal, &id(entity)).await,
            bodies,
            "entity {entity}: each once, in order"
        );
    }
}

// --- over TCP: owners found in the lease table ----------------------------------------------

use actix_delivery::sharding::{NoTransport, ShardDirectory};
use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};

async fn tcp_node() -> NodeHandle {
    let options = NodeOptions::builder()
        .secret(NodeSecret::new([7; 32]).unwrap())
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    NodeHandle::start(options).await.unwrap()
}

/// A node over TCP: its host's consumer exposed as "seq", its address in the lease table.
async fn tcp_member(
    name: &str,
    journal: &Arc<dyn Journal>,
    leases: &MemoryLeaseStore,
) -> (ShardCoordinatorHandle<Sequence>, NodeHandle) {
    let node = tcp_node().await;
    let host = EntityHostOptions::builder("seq").shards(8).build().unwrap();
    let options = CoordinatorOptions::builder(name)
        .address(node.local_addr().unwrap().to_string())
        .lease_ttl(Duration::from_millis(600))
        .renew_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    let exposing = node.clone();
    let coordinator = ShardCoordinatorHandle::start(
        journal.clone(),
        host,
        Arc::new(leases.clone()),
        options,
        |host| {
            exposing
                .expose("seq", &host.consumer(|body: u64| body))
                .unwrap();
            NoTransport
        },
    )
    .unwrap();
    (coordinator, node)
}

#[actix::test]
async fn over_tcp_a_sender_finds_each_shards_owner_in_the_lease_table_also_after_a_handoff() {
    // Real sockets: real time.
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let leases = MemoryLeaseStore::new();
    let (a, _a_node) = tcp_member("a", &journal, &leases).await;
    let (b, _b_node) = tcp_member("b", &journal, &leases).await;
    let directory =
        ShardDirectory::start(Arc::new(leases.clone()), "seq", Duration::from_millis(100));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (0..8).any(|s| directory.owner(ShardId(s)).is_none()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the shards were not all taken"
        );
        actix::clock::sleep(Duration::from_millis(20)).await;
    }
    let sender = tcp_node().await;
    let options = ShardedProducerOptions::per_shard(directory.destination(&sender, "seq"))
        .shards(8)
        .entity_stream(fast_streams())
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    for body in 0..100 {
        producer.send(id(body % 10), body).await.unwrap();
    }
    // a leaves: b owns every shard, and the sender follows.
    a.stop();
    a.stopped().await;
    for body in 100..200 {
        producer.send(id(body % 10), body).await.unwrap();
    }
    assert_eq!(b.stats().await.unwrap().shards_owned, 8);
    for n in 0..10 {
        let sent: Vec<u64> = (0..200).filter(|b| b % 10 == n).collect();
        assert_eq!(applied(&*journal, &id(n)).await, sent, "entity {n}");
    }
}

#[actix::test]
async fn a_host_refuses_envelopes_whose_origin_is_out_of_range_and_counts_them() {
    use actix_delivery::{DeliveryInfo, Incarnation, ProducerId};
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let consumer = host.consumer(|body: u64| body);
    let (reply_to, acks) = common::ack_probe();
    let stream = Incarnation::from_u128(3);
    let envelope = |producer: &str, seq, window_start, previous| EntityEnvelope {
        entity_id: id(1),
        origin: DeliveryInfo {
            producer_id: ProducerId::from(producer),
            incarnation: stream.id(),
            seq,
            window_start,
            trace_context: None,
            first_seq: None,
        },
        previous,
        body: seq,
        shards: 8,
    };
    let ranged = EntityEnvelope {
        origin: DeliveryInfo {
            first_seq: Some(1),
            ..envelope("p", 5, 1, 0).origin
        },
        ..envelope("p", 5, 1, 0)
    };
    let hostile = [
        ranged,                              // a range of seqs: 1..=4 would be marked
        envelope("p", 0, 1, 0),              // seq 0
        envelope("p", 5, 6, 0),              // window start beyond the seq
        envelope("p", 5, 1, 5),              // a predecessor not before it
        envelope(&"p".repeat(257), 5, 1, 0), // an id over 256 bytes
    ];
    for (n, body) in hostile.into_iter().enumerate() {
        let delivery = Delivery::new("p/lane", stream, n as u64 + 1, body, reply_to.clone());
        consumer.recipient().do_send(delivery);
    }
    settle_for(10).await;
    assert_eq!(host.stats().refused_malformed, 5);
    assert!(acks.snapshot().is_empty(), "none acknowledged");
    let fine = Delivery::new(
        "p/lane",
        stream,
        6,
        envelope("p", 7, 1, 0),
        reply_to.clone(),
    );
    consumer.recipient().do_send(fine);
    settle_for(10).await;
    assert_eq!(acks.len(), 1, "the well-formed one");
    assert_eq!(applied(&*journal, &id(1)).await, [7]);
    assert_eq!(host.stats().activations, 1, "no entity ran for the others");
}

#[actix::test]
async fn an_envelope_naming_another_producers_origin_is_a_dead_letter_and_moves_no_window() {
    use actix_delivery::{ConsumerOptions, DeadLetterReason, DeliveryInfo, Incarnation};
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let (sink, dead_letters) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(host.delivery_handler(|body: u64| body))
            .config(EntityHostHandle::<Sequence>::consumer_config())
            .dead_letters(sink)
            .build()
            .unwrap(),
    );
    // The genuine producer's deliveries pass a tap that keeps their origin: what anyone who
    // may read the shard's subject, or a log, learns (the public incarnation id).
    let seen: Arc<Mutex<Option<DeliveryInfo>>> = Arc::default();
    let tap = {
        let (seen, target) = (seen.clone(), ConsumerRef::from(&consumer));
        ConsumerRef::from_fn(move |deliveries: Vec<Delivery<EntityEnvelope<u64>>>| {
            *seen.lock().unwrap() = Some(deliveries[0].body.origin.clone());
            target.do_send_all(deliveries.into_iter());
        })
    };
    let options = ShardedProducerOptions::per_shard(move |_| tap.clone())
        .shards(8)
        .entity_stream(fast_streams())
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    producer.send(id(1), 1).await.unwrap();
    let genuine = seen
        .lock()
        .unwrap()
        .clone()
        .expect("the tap saw the delivery");

    // A sender that holds its own token names the genuine origin, far ahead, on a stream
    // whose id looks like one of the producer's.
    let (reply_to, acks) = common::ack_probe();
    let forged = EntityEnvelope {
        entity_id: id(1),
        origin: DeliveryInfo {
            seq: 1_000_000,
            window_start: 1_000_000,
            ..genuine.clone()
        },
        previous: 0,
        body: 999,
        shards: 8,
    };
    let carrier = format!("{}/0000000000000001", genuine.producer_id);
    let delivery = Delivery::new(carrier, Incarnation::from_u128(666), 1, forged, reply_to);
    consumer.recipient().do_send(delivery);
    settle_for(10).await;

    for body in 2..=5 {
        producer.send(id(1), body).await.unwrap();
    }
    assert_eq!(
        applied(&*journal, &id(1)).await,
        [1, 2, 3, 4, 5],
        "every genuine message applied, the forged one never"
    );
    assert!(
        acks.snapshot().is_empty(),
        "the forged delivery is not ACKed"
    );
    assert_eq!(host.stats().refused_foreign, 1);
    let letters = dead_letters.snapshot();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, DeadLetterReason::ForeignOrigin);
    assert_eq!(consumer.stats().await.unwrap().dead_letters, 1);
}

#[actix::test]
async fn at_max_open_lanes_a_new_entity_waits_for_an_idle_lane_and_tell_refuses_once_the_window_is_full(
) {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default());
    let consumer = host.consumer(|body: u64| body);
    let (link, cut, _) = common::cuttable(ConsumerRef::from(&consumer));
    cut.store(true, Ordering::SeqCst); // every lane stays busy: nothing is confirmed
    let options = ShardedProducerOptions::per_shard(move |_| link.clone())
        .shards(8)
        .max_open_lanes(2)
        .entity_stream(fast_streams())
        .producer(ProducerConfig {
            window_size: 4,
            max_pending: 1,
            ..ShardedProducerOptions::<u64>::default_producer()
        })
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    let confirmed = Confirmations::default();
    for n in 1..=5 {
        producer
            .tell(id(n), n, confirm_into(&confirmed, n))
            .unwrap();
    }
    let refused = producer.tell(id(6), 6, confirm_into(&confirmed, 6));
    assert!(
        matches!(refused, Err(TellError::QueueFull(6))),
        "the window holds 4 (2 on lanes, 2 waiting for one), the queue 1"
    );
    settle_for(1_000).await;
    let stats = producer.lane_stats().await.unwrap();
    assert_eq!(
        (stats.lanes, stats.in_flight, stats.waiting, stats.waited),
        (2, 2, 2, 2)
    );
    assert!(stats.retransmitted > 0, "the cut link lost them");

    cut.store(false, Ordering::SeqCst);
    producer.idle().await;
    let mut results = confirmed.snapshot();
    results.sort_by_key(|(n, _)| *n);
    let expected: Vec<_> = (1..=6).map(|n| (n, n != 6)).collect();
    let got: Vec<_> = results.iter().map(|(n, r)| (*n, r.is_ok())).collect();
    assert_eq!(got, expected, "1-5 confirmed, 6 refused");
    for n in 1..=5 {
        assert_eq!(applied(&*journal, &id(n)).await, [n]);
    }
    let stats = producer.lane_stats().await.unwrap();
    assert_eq!((stats.lanes, stats.waiting, stats.evicted), (2, 0, 3));
    assert_eq!((stats.opened, stats.closed), (5, 3));
}

#[actix::test]
async fn a_host_refuses_messages_routed_by_another_shard_count_naming_both_counts() {
    use actix_delivery::{ConsumerOptions, DeadLetterReason};
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let host = sequences(journal.clone(), PersistentConfig::default()); // 8 shards
    let (sink, dead_letters) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(host.delivery_handler(|body: u64| body))
            .dead_letters(sink)
            .build()
            .unwrap(),
    );
    let options = ShardedProducerOptions::builder(&consumer)
        .shards(16)
        .entity_stream(fast_streams())
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    let confirmed = Confirmations::default();
    producer
        .tell(id(1), 1, confirm_into(&confirmed, 1))
        .unwrap();
    settle_for(1_000).await;
    assert!(confirmed.snapshot().is_empty(), "never confirmed");
    assert!(applied(&*journal, &id(1)).await.is_empty(), "never applied");
    let refused = host.stats().refused_shard_count;
    assert!(refused >= 2, "refused at each retransmission: {refused}");
    let letter = &dead_letters.snapshot()[0];
    let reason = DeadLetterReason::ShardCountMismatch {
        sent: 16,
        hosted: 8,
    };
    assert_eq!(letter.reason, reason);
    assert_eq!(
        reason.to_string(),
        "the sender routes by 16 shards, this host by 8: the shard counts of an entity type \
         must agree"
    );
}

// --- the lease stores ------------------------------------------------------------------------

/// What every lease store does with a shard named twice in one call: takes it once, renews it
/// once and answers it once, as if it were named once.
async fn a_shard_named_twice_counts_once(store: &dyn LeaseStore, namespace: &str) {
    let ttl = Duration::from_secs(60);
    let mut acquired = store
        .acquire(namespace, &[ShardId(3), ShardId(3), ShardId(4)], "a", ttl)
        .await
        .unwrap();
    acquired.sort();
    assert_eq!(acquired, [(ShardId(3), 1), (ShardId(4), 1)]);
    let renewed = store
        .renew(namespace, &[(ShardId(3), 1), (ShardId(3), 1)], "a", ttl)
        .await
        .unwrap();
    assert_eq!(renewed, [ShardId(3)]);
    store
        .release(namespace, &[(ShardId(4), 1), (ShardId(4), 1)], "a")
        .await
        .unwrap();
    let view = store.view(namespace).await.unwrap();
    assert_eq!(view.leases.keys().collect::<Vec<_>>(), [&ShardId(3)]);
}

#[actix::test]
async fn the_memory_lease_store_counts_a_shard_named_twice_once() {
    a_shard_named_twice_counts_once(&MemoryLeaseStore::new(), "dup").await;
}

#[cfg(feature = "postgres")]
mod postgres_leases {
    use actix_delivery::sharding::PostgresLeaseStore;

    use super::*;

    /// A store in a schema of its own, and the admin connection that drops it.
    async fn store() -> (PostgresLeaseStore, String, tokio_postgres::Client) {
        let schema = postgres_support::unique("leases");
        let store =
            PostgresLeaseStore::connect(&postgres_support::url(), &schema, Duration::from_secs(10))
                .await
                .unwrap();
        (store, schema, postgres_support::admin().await)
    }

    #[actix::test]
    async fn the_postgres_lease_store_counts_a_shard_named_twice_once() {
        let (store, schema, admin) = store().await;
        a_shard_named_twice_counts_once(&store, "dup").await;
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }

    /// A coordinator whose lease store fails logs why, with the server's message and
    /// SQLSTATE: each round's heartbeat to a store whose member table was dropped.
    #[actix::test]
    async fn a_coordinator_logs_its_lease_stores_failure_with_the_servers_message() {
        crate::common::logs::keep();
        let (store, schema, admin) = store().await;
        admin
            .batch_execute(&format!("DROP TABLE {schema}.shard_member"))
            .await
            .unwrap();
        let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
        let host = EntityHostOptions::builder("seq").shards(4).build().unwrap();
        let options = CoordinatorOptions::builder("lonely")
            .lease_ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_secs(1))
            .build()
            .unwrap();
        let coordinator = ShardCoordinatorHandle::<Sequence>::start(
            journal,
            host,
            Arc::new(store),
            options,
            |host| OnBus(Bus::default(), host.consumer(|body: u64| body)),
        )
        .unwrap();
        let failed = [
            "sharding `seq`: heartbeat failed: the lease store failed: ERROR: relation",
            &format!("\"{schema}.shard_member\" does not exist (SQLSTATE 42P01)"),
        ];
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while crate::common::logs::lines_containing(&failed).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no heartbeat failure logged"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        coordinator.stop();
        coordinator.stopped().await;
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }

    /// The server's message (with its detail) and SQLSTATE reach the error, not tokio-postgres's
    /// "db error"; a refused connection says why.
    #[actix::test]
    async fn the_postgres_lease_store_errors_name_the_servers_message_and_sqlstate() {
        let (store, schema, admin) = store().await;
        let ttl = Duration::from_secs(60);
        admin
            .batch_execute(&format!(
                "ALTER TABLE {schema}.shard_lease ADD CONSTRAINT not_7 CHECK (shard <> 7); \
                 DROP TABLE {schema}.shard_member"
            ))
            .await
            .unwrap();
        let error = store
            .acquire("t", &[ShardId(7)], "a", ttl)
            .await
            .unwrap_err()
            .to_string();
        for expected in [
            "ERROR: new row for relation \"shard_lease\" violates check constraint \"not_7\"",
            "(SQLSTATE 23514)",
            "DETAIL: Failing row contains (t, 7, a, 1, ",
        ] {
            assert!(error.contains(expected), "{expected:?} in {error}");
        }
        let member = Member {
            id: "a".into(),
            address: None,
        };
        let error = store
            .heartbeat("t", &member, ttl)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!(
                "relation \"{schema}.shard_member\" does not exist"
            )) && error.contains("(SQLSTATE 42P01)"),
            "{error}"
        );
        // Port 1 on loopback: nothing listens there.
        let refused = PostgresLeaseStore::connect(
            "host=127.0.0.1 port=1 user=postgres dbname=test",
            &schema,
            ttl,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("Connection refused (os error 111)"),
            "{refused}"
        );
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
}

/// What an entity host's consumer refuses is kept as the host's dead letter.
#[actix::test]
async fn a_delivery_the_hosts_consumer_refuses_is_kept_as_the_hosts_dead_letter() {
    use actix_delivery::dead_letters::{
        DeadLetterCause, DeadLetterFilter, DeadLetterLimits, DeadLetters, MemoryDeadLetters,
        SourceKind,
    };
    use actix_delivery::sharding::EntityEnvelope;
    use actix_delivery::{Delivery, DeliveryInfo, Incarnation, ProducerId};
    tokio::time::pause();
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let journal = Arc::new(MemoryJournal::new());
    let ledger = host(
        journal,
        options()
            .keep_dead_letters(dead_letters.clone(), "ledger-host")
            .build()
            .unwrap(),
    );
    let consumer = ledger.consumer(Op::Apply);
    let (reply_to, acks) = common::ack_probe();
    let incarnation = Incarnation::from_u128(7);
    let body = EntityEnvelope {
        entity_id: id(1),
        origin: DeliveryInfo {
            producer_id: ProducerId::from("elsewhere"),
            incarnation: Incarnation::from_u128(8).id(),
            seq: 1,
            window_start: 1,
            trace_context: None,
            first_seq: None,
        },
        previous: 0,
        body: 5,
        shards: 0,
    };
    consumer.addr().do_send(Delivery {
        producer_id: ProducerId::from("orders"),
        incarnation,
        seq: 1,
        window_start: 1,
        trace_context: None,
        body,
        reply_to: Some(reply_to),
    });
    common::settle().await;
    assert_eq!(acks.len(), 0, "refused, not ACKed");
    let kept = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(kept.entries.len(), 1);
    let letter = &kept.entries[0].letter;
    assert_eq!(
        (letter.kind, letter.source.as_str(), letter.cause),
        (
            SourceKind::EntityHost,
            "ledger-host",
            DeadLetterCause::Malformed
        )
    );
    assert!(letter.error.contains("origin"), "{}", letter.error);
}
