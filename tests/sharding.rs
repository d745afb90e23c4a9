//! Sharding in one process, under `tokio::time::pause()`: the entity host (activation,
//! passivation when idle and by LRU, commands during passivation and recovery), the sharded
//! producer (one stream per entity, cleanup, bounds, the durable variant) and the shard
//! coordinator over in-memory leases (acquire, renew, expire, hand off).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};
use actix_delivery::persistence::{recover_state, CommandError, PersistentConfig};
use actix_delivery::sharding::{EntityHost, EntityHostOptions, EntityId, HostError};
use common::entities::{Ledger, Op};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn id(n: u64) -> EntityId {
    EntityId::new(format!("e{n}")).unwrap()
}

fn stream(n: u64) -> PersistenceId {
    PersistenceId::new(format!("ledger|e{n}")).unwrap()
}

fn host(journal: Arc<dyn Journal>, options: EntityHostOptions) -> EntityHost<Ledger> {
    EntityHost::start(journal, options).unwrap()
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
    assert_eq!(
        (stats.held_total, stats.refused_full, stats.held),
        (2, 1, 0)
    );
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
