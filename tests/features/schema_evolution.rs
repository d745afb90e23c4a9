//! Schema evolution: entities, snapshots and durable producers recover from journals written by
//! earlier versions of their types, on every journal: an added field needs no code, breaking
//! changes one upcaster (chained over versions), a newer version than the code fails stop and
//! writes nothing, and the journals written by the previous releases (committed fixtures of
//! journal schemas 1 and 2) are migrated on open with every event kept byte for byte (and no
//! tags on what was written before tags).

use crate::common;
#[cfg(feature = "postgres")]
use crate::postgres_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::{Codec, Manifest, UpcastError, Written};
use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{
    replay_all, Journal, JournalError, MemoryJournal, Offset, PersistenceId, SqliteJournal, Tag,
    TagQuery,
};
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, PersistentConfig, PersistentHandle,
    PersistentOptions,
};
use actix_delivery::{
    ConsumerOptions, DeliveryHandler, Failure, ProducerOptions, ReliableDelivery, StartError,
};
use common::{recording_consumer, settle_for};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The names the versions of the account were stored under. In an application a type keeps
/// its name across versions; here each version is a module of its own (and the fixtures were
/// written by a program of their own), so each version declares the others' names as its
/// former ones.
const ACCOUNT_TYPES: &[&str] = &[
    "make_fixture_v2::Account",
    "make_fixture_v2::AccountEvent",
    concat!(module_path!(), "::v1::Account"),
    concat!(module_path!(), "::v1::AccountEvent"),
    concat!(module_path!(), "::v1_added::Account"),
    concat!(module_path!(), "::v1_added::AccountEvent"),
    concat!(module_path!(), "::v2::Entity"),
    concat!(module_path!(), "::v2::AccountEvent"),
    concat!(module_path!(), "::v3::Account"),
    concat!(module_path!(), "::v3::AccountEvent"),
];

/// The names the versions of the order were stored under (as [`ACCOUNT_TYPES`]).
const ORDER_TYPES: [&str; 3] = [
    concat!(module_path!(), "::Order"),
    concat!(module_path!(), "::OrderWithNote"),
    concat!(module_path!(), "::OrderV2"),
];

/// `durable` reading every version of the order as its own.
fn reading_every_order_version<T>(durable: DurableOptions<T>) -> DurableOptions<T> {
    ORDER_TYPES
        .iter()
        .fold(durable, |durable, name| durable.accept_type_name(*name))
}

/// Version 1 of an account: as the fixture journals were written (`Audited` added since,
/// at the end, which keeps the fixture's bincode as it was).
mod v1 {
    use super::*;

    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Account {
        pub balance: i64,
        pub deposits: u32,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub enum AccountEvent {
        Deposited { amount: i64 },
        Withdrew { amount: i64 },
        Audited,
    }

    impl EventSourced for Account {
        type Command = i64;
        type Event = AccountEvent;
        type Reply = i64;
        type Rejection = String;
        const FORMER_TYPE_NAMES: &'static [&'static str] = super::ACCOUNT_TYPES;

        fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
            let event = match amount {
                0 => AccountEvent::Audited,
                1.. => AccountEvent::Deposited { amount },
                _ => AccountEvent::Withdrew { amount: -amount },
            };
            Ok(Decision::persist([event], self.balance + amount))
        }

        fn apply(&mut self, event: &AccountEvent) {
            match *event {
                AccountEvent::Deposited { amount } => {
                    self.balance += amount;
                    self.deposits += 1;
                }
                AccountEvent::Withdrew { amount } => self.balance -= amount,
                AccountEvent::Audited => {}
            }
        }
    }
}

/// An additive change of version 1: a field with a default, in an event and in the state. No
/// new version, no code.
mod v1_added {
    use super::*;

    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Account {
        pub balance: i64,
        pub deposits: u32,
        #[serde(default)]
        pub currency: Option<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub enum AccountEvent {
        Deposited {
            amount: i64,
            #[serde(default)]
            currency: Option<String>,
        },
        Withdrew {
            amount: i64,
        },
        Audited,
    }

    impl EventSourced for Account {
        type Command = i64;
        type Event = AccountEvent;
        type Reply = i64;
        type Rejection = String;
        const FORMER_TYPE_NAMES: &'static [&'static str] = super::ACCOUNT_TYPES;

        fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
            let event = match amount {
                0 => AccountEvent::Audited,
                1.. => AccountEvent::Deposited {
                    amount,
                    currency: None,
                },
                _ => AccountEvent::Withdrew { amount: -amount },
            };
            Ok(Decision::persist([event], self.balance + amount))
        }

        fn apply(&mut self, event: &AccountEvent) {
            match event {
                AccountEvent::Deposited { amount, currency } => {
                    self.balance += amount;
                    self.deposits += 1;
                    self.currency.clone_from(currency);
                }
                AccountEvent::Withdrew { amount } => self.balance -= amount,
                AccountEvent::Audited => {}
            }
        }
    }
}

/// Version 2: a field renamed (`amount` → `value`).
mod v2 {
    use super::*;

    pub use super::v1::Account;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub enum AccountEvent {
        Deposited { value: i64 },
        Withdrew { value: i64 },
        Audited,
    }

    /// The one function of this change.
    pub fn from_v1(event: v1::AccountEvent) -> AccountEvent {
        match event {
            v1::AccountEvent::Deposited { amount } => AccountEvent::Deposited { value: amount },
            v1::AccountEvent::Withdrew { amount } => AccountEvent::Withdrew { value: amount },
            v1::AccountEvent::Audited => AccountEvent::Audited,
        }
    }

    /// Version 2's entity: its own type (the state is version 1's).
    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(transparent)]
    pub struct Entity(pub Account);

    impl EventSourced for Entity {
        type Command = i64;
        type Event = AccountEvent;
        type Reply = i64;
        type Rejection = String;
        const FORMER_TYPE_NAMES: &'static [&'static str] = super::ACCOUNT_TYPES;
        const EVENT_VERSION: u32 = 2;

        fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
            let event = match amount {
                0 => AccountEvent::Audited,
                1.. => AccountEvent::Deposited { value: amount },
                _ => AccountEvent::Withdrew { value: -amount },
            };
            Ok(Decision::persist([event], self.0.balance + amount))
        }

        fn apply(&mut self, event: &AccountEvent) {
            match *event {
                AccountEvent::Deposited { value } => {
                    self.0.balance += value;
                    self.0.deposits += 1;
                }
                AccountEvent::Withdrew { value } => self.0.balance -= value,
                AccountEvent::Audited => {}
            }
        }

        fn upcast_events(old: Written<'_>) -> Result<Vec<AccountEvent>, UpcastError> {
            let events: Vec<v1::AccountEvent> = old.decode()?;
            Ok(events.into_iter().map(from_v1).collect())
        }
    }
}

/// Version 3: amounts in cents (a changed type), a withdrawal split into the withdrawal and
/// its fee, `Audited` removed; the state in cents too (a changed snapshot type).
mod v3 {
    use super::*;

    pub const FEE_CENTS: i64 = 50;

    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Account {
        pub balance_cents: i64,
        pub deposits: u32,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub enum AccountEvent {
        Deposited { cents: i64 },
        Withdrew { cents: i64 },
        FeeCharged { cents: i64 },
    }

    fn from_v2(event: v2::AccountEvent) -> Vec<AccountEvent> {
        match event {
            v2::AccountEvent::Deposited { value } => {
                vec![AccountEvent::Deposited { cents: value * 100 }]
            }
            v2::AccountEvent::Withdrew { value } => withdrawal(value),
            v2::AccountEvent::Audited => Vec::new(),
        }
    }

    fn withdrawal(value: i64) -> Vec<AccountEvent> {
        vec![
            AccountEvent::Withdrew {
                cents: value * 100 - FEE_CENTS,
            },
            AccountEvent::FeeCharged { cents: FEE_CENTS },
        ]
    }

    impl EventSourced for Account {
        type Command = i64;
        type Event = AccountEvent;
        type Reply = i64;
        type Rejection = String;
        const FORMER_TYPE_NAMES: &'static [&'static str] = super::ACCOUNT_TYPES;
        const EVENT_VERSION: u32 = 3;
        const STATE_VERSION: u32 = 2;

        fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
            let events = match amount {
                0 => Vec::new(),
                1.. => vec![AccountEvent::Deposited {
                    cents: amount * 100,
                }],
                _ => withdrawal(-amount),
            };
            Ok(Decision::persist(events, self.balance_cents + amount * 100))
        }

        fn apply(&mut self, event: &AccountEvent) {
            match *event {
                AccountEvent::Deposited { cents } => {
                    self.balance_cents += cents;
                    self.deposits += 1;
                }
                AccountEvent::Withdrew { cents } | AccountEvent::FeeCharged { cents } => {
                    self.balance_cents -= cents;
                }
            }
        }

        /// Chained: version 1 through version 2's function, then version 2's.
        fn upcast_events(old: Written<'_>) -> Result<Vec<AccountEvent>, UpcastError> {
            let v2_events: Vec<v2::AccountEvent> = match old.version() {
                1 => old
                    .decode::<Vec<v1::AccountEvent>>()?
                    .into_iter()
                    .map(v2::from_v1)
                    .collect(),
                2 => old.decode()?,
                other => return Err(UpcastError::new(format!("no version {other}"))),
            };
            Ok(v2_events.into_iter().flat_map(from_v2).collect())
        }

        fn upcast_state(old: Written<'_>) -> Result<Account, UpcastError> {
            let v1: v1::Account = old.decode()?;
            Ok(Account {
                balance_cents: v1.balance * 100,
                deposits: v1.deposits,
            })
        }
    }
}

/// The commands the histories are made of: deposits, withdrawals and an audit.
const COMMANDS: [i64; 6] = [100, 50, -30, 0, 20, -10];

fn config(codec: Codec, snapshot_every: Option<u64>) -> PersistentConfig {
    PersistentConfig {
        codec,
        snapshot_every,
        delete_events_on_snapshot: snapshot_every.is_some(),
        ..PersistentConfig::default()
    }
}

/// A journal of a test, and how its stream ids are made unique (PostgreSQL keeps its tables
/// across runs).
struct Under {
    name: &'static str,
    journal: Arc<dyn Journal>,
    prefix: String,
    _dir: Option<tempfile::TempDir>,
}

impl Under {
    fn id(&self, stream: &str) -> PersistenceId {
        PersistenceId::new(format!("{}{stream}", self.prefix)).unwrap()
    }

    /// Runs `commands` against entity `E` of `stream` (after recovering what is there), then
    /// stops it.
    async fn run<E>(&self, stream: &str, config: PersistentConfig, commands: &[i64])
    where
        E: EventSourced<Command = i64>,
        E::Rejection: std::fmt::Debug,
    {
        let entity = self.start::<E>(stream, config);
        for &command in commands {
            entity.ask(command).await.unwrap();
        }
        entity.stop();
        entity.stopped().await.unwrap();
    }

    fn start<E: EventSourced>(
        &self,
        stream: &str,
        config: PersistentConfig,
    ) -> PersistentHandle<E> {
        PersistentHandle::start(
            PersistentOptions::new(self.journal.clone(), self.id(stream)).config(config),
        )
        .unwrap()
    }

    /// The state entity `E` recovers from `stream`.
    async fn state<E: EventSourced>(&self, stream: &str) -> Result<E, JournalError> {
        recover_state::<E>(&*self.journal, &self.id(stream)).await
    }
}

/// Every journal the tests run on: memory, a fresh SQLite file, and with the `postgres` feature
/// the PostgreSQL journal of the tests' schema.
async fn journals() -> Vec<Under> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteJournal::open(dir.path().join("journal.db"))
        .await
        .unwrap();
    #[allow(unused_mut)]
    let mut journals = vec![
        Under {
            name: "memory",
            journal: Arc::new(MemoryJournal::new()),
            prefix: String::new(),
            _dir: None,
        },
        Under {
            name: "sqlite",
            journal: Arc::new(sqlite),
            prefix: String::new(),
            _dir: Some(dir),
        },
    ];
    #[cfg(feature = "postgres")]
    journals.push(Under {
        name: "postgres",
        journal: Arc::new(postgres_support::journal().await),
        prefix: postgres_support::unique("evolution"),
        _dir: None,
    });
    journals
}

#[actix::test]
async fn an_added_field_with_a_default_needs_no_code_on_every_journal() {
    for under in journals().await {
        let name = under.name;
        let msgpack = || config(Codec::MessagePack, None);
        under
            .run::<v1::Account>("added", msgpack(), &COMMANDS)
            .await;
        under
            .run::<v1_added::Account>("added", msgpack(), &[7])
            .await;
        let recovered = under.state::<v1_added::Account>("added").await.unwrap();
        under
            .run::<v1_added::Account>("fresh", msgpack(), &COMMANDS)
            .await;
        under
            .run::<v1_added::Account>("fresh", msgpack(), &[7])
            .await;
        let fresh = under.state::<v1_added::Account>("fresh").await.unwrap();
        assert_eq!(recovered, fresh, "{name}");
        assert_eq!(recovered.balance, 137, "{name}");
        // What bincode, fixed schema, cannot do without an upcaster: a clear error.
        under
            .run::<v1::Account>("bincode", config(Codec::Bincode, None), &COMMANDS)
            .await;
        let error = under
            .state::<v1_added::Account>("bincode")
            .await
            .unwrap_err();
        assert!(
            matches!(&error, JournalError::Corrupt { seq: 1, reason, .. }
                if reason.contains("raise the version")),
            "{name}: {error}"
        );
    }
}

#[actix::test]
async fn renamed_retyped_split_and_removed_events_are_read_through_a_chained_upcaster() {
    for under in journals().await {
        let name = under.name;
        for codec in [Codec::MessagePack, Codec::Bincode] {
            let id = format!("chain-{codec}");
            // Version 1 wrote the first half, version 2 the second; version 3 reads both.
            under
                .run::<v1::Account>(&id, config(codec, None), &COMMANDS[..3])
                .await;
            under
                .run::<v2::Entity>(&id, config(codec, None), &COMMANDS[3..])
                .await;
            let v2 = under.state::<v2::Entity>(&id).await.unwrap();
            assert_eq!((v2.0.balance, v2.0.deposits), (130, 3), "{name}, {codec}");
            let upcast = under.state::<v3::Account>(&id).await.unwrap();
            let fresh_id = format!("fresh-v3-{codec}");
            under
                .run::<v3::Account>(&fresh_id, config(codec, None), &COMMANDS)
                .await;
            let fresh = under.state::<v3::Account>(&fresh_id).await.unwrap();
            assert_eq!(upcast, fresh, "{name}, {codec}");
            assert_eq!((upcast.balance_cents, upcast.deposits), (13_000, 3));
            // Version 3 goes on writing the stream: old and new entries side by side.
            under
                .run::<v3::Account>(&id, config(codec, None), &[-1])
                .await;
            let state = under.state::<v3::Account>(&id).await.unwrap();
            assert_eq!(state.balance_cents, 12_900, "{name}, {codec}");
        }
    }
}

#[actix::test]
async fn a_snapshot_of_an_older_state_type_is_read_through_the_state_upcaster() {
    for under in journals().await {
        let name = under.name;
        // A snapshot after 4 events, the events it covers deleted: the snapshot is needed.
        under
            .run::<v1::Account>("snap", config(Codec::MessagePack, Some(4)), &COMMANDS)
            .await;
        let id = under.id("snap");
        let snapshot = under
            .journal
            .load_snapshot(&id)
            .await
            .unwrap()
            .expect("one");
        let highest = under.journal.highest_seq(&id).await.unwrap();
        assert_eq!((snapshot.seq, highest), (4, 6), "{name}");
        assert_eq!(snapshot.manifest.version(), 1, "{name}");
        let upcast = under.state::<v3::Account>("snap").await.unwrap();
        assert_eq!(
            (upcast.balance_cents, upcast.deposits),
            (13_000, 3),
            "{name}"
        );
    }
}

#[actix::test]
async fn a_journal_of_a_newer_version_fails_stop_naming_stream_seq_and_versions_and_nothing_is_written(
) {
    for under in journals().await {
        let name = under.name;
        under
            .run::<v3::Account>("newer", PersistentConfig::default(), &COMMANDS)
            .await;
        let id = under.id("newer");
        let highest = under.journal.highest_seq(&id).await.unwrap();
        let entity = under.start::<v2::Entity>("newer", PersistentConfig::default());
        match entity.ask(1).await {
            Err(CommandError::Recovery(JournalError::Incompatible {
                persistence_id,
                seq,
                reason,
            })) => {
                assert_eq!((&persistence_id, seq), (&id, 1), "{name}");
                assert!(
                    reason.contains("version 3") && reason.contains("this code's version 2"),
                    "{name}: {reason}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(
            entity.stopped().await.is_err(),
            "{name}: stopped by its failure"
        );
        let after = under.journal.highest_seq(&id).await.unwrap();
        assert_eq!(after, highest, "{name}: nothing written");
        // A snapshot of a newer state version: the same, not a silent replay.
        under
            .run::<v3::Account>("newer-snap", config(Codec::MessagePack, Some(2)), &COMMANDS)
            .await;
        let error = under.state::<v1::Account>("newer-snap").await.unwrap_err();
        assert!(
            matches!(&error, JournalError::Incompatible { reason, .. }
                if reason.contains("snapshot") && reason.contains("version 2")),
            "{name}: {error}"
        );
    }
}

/// An order as version 1 of a durable producer's application stores it (and the fixture's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    total: u64,
}

/// The same order with a field added: no code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OrderWithNote {
    id: u64,
    total: u64,
    #[serde(default)]
    note: Option<String>,
}

/// Version 2: the total in cents, under a new name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OrderV2 {
    id: u64,
    total_cents: u64,
}

fn order_v2_from_v1(old: Written<'_>) -> Result<OrderV2, UpcastError> {
    let Order { id, total } = old.decode()?;
    Ok(OrderV2 {
        id,
        total_cents: total * 100,
    })
}

fn producer_options<T: Clone + Send + 'static>(
    consumer: &actix_delivery::ConsumerHandle<T>,
    producer_id: &str,
) -> ProducerOptions<T> {
    ProducerOptions::builder(consumer)
        .producer_id(producer_id)
        .resend_timeout(Duration::from_millis(50))
        .build()
        .unwrap()
}

/// Stores `orders` with a durable producer on `stream` (`configure`d) whose consumer never
/// confirms, then stops it: they stay stored and unconfirmed.
async fn store_unconfirmed<T>(
    under: &Under,
    stream: &str,
    configure: impl FnOnce(DurableOptions<T>) -> DurableOptions<T>,
    orders: Vec<T>,
) where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    let handler = DeliveryHandler::from_fn(|_: T| async { Err::<(), _>("not now".to_string()) });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let durable = configure(DurableOptions::new(
        under.journal.clone(),
        under.id(stream),
        "orders",
    ));
    let options = producer_options(&consumer, "orders");
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    for order in orders {
        producer.store(order).await.unwrap();
    }
    producer.stop();
    producer.stopped().await.unwrap();
}

/// Resumes durable producer `producer_id` of `stream` with messages `T` (`configure`d), and
/// returns what its consumer handled once everything was confirmed, or the producer stopped.
async fn resume<T>(
    journal: &Arc<dyn Journal>,
    stream: PersistenceId,
    producer_id: &str,
    configure: impl FnOnce(DurableOptions<T>) -> DurableOptions<T>,
) -> Vec<T>
where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    let (consumer, handled) = recording_consumer::<T>();
    let durable = configure(reading_every_order_version(DurableOptions::new(
        journal.clone(),
        stream,
        producer_id,
    )));
    let options = producer_options(&consumer, producer_id);
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    // Resumed messages count as told: idle once they are confirmed (or the producer stopped).
    settle_for(20).await;
    tokio::time::timeout(Duration::from_secs(20), producer.idle())
        .await
        .expect("settled");
    producer.stop();
    producer.stopped().await.unwrap();
    handled.snapshot()
}

#[actix::test]
async fn a_durable_producer_resumes_messages_stored_by_an_earlier_version_of_their_type() {
    for under in journals().await {
        let name = under.name;
        let orders = || vec![Order { id: 1, total: 5 }, Order { id: 2, total: 7 }];
        // Added field, no code.
        store_unconfirmed(&under, "added", |d| d, orders()).await;
        let handled =
            resume::<OrderWithNote>(&under.journal, under.id("added"), "orders", |d| d).await;
        let ids: Vec<_> = handled
            .iter()
            .map(|o| (o.id, o.total, o.note.clone()))
            .collect();
        assert_eq!(ids, [(1, 5, None), (2, 7, None)], "{name}");
        // A breaking change: version 2 with its upcaster, in either codec.
        for codec in [Codec::MessagePack, Codec::Bincode] {
            let stream = format!("breaking-{codec}");
            store_unconfirmed(&under, &stream, |d| d.codec(codec), orders()).await;
            let handled = resume::<OrderV2>(&under.journal, under.id(&stream), "orders", |d| {
                d.message_version(2).upcast(order_v2_from_v1)
            })
            .await;
            let expected =
                [(1, 500), (2, 700)].map(|(id, total_cents)| OrderV2 { id, total_cents });
            assert_eq!(handled, expected, "{name}, {codec}");
        }
        // Stored at a newer version than the code's (a rollback): it stops for good and sends
        // nothing, though the body would decode.
        let newer = vec![OrderWithNote {
            id: 3,
            total: 1,
            note: Some("new".into()),
        }];
        store_unconfirmed(&under, "newer", |d| d.message_version(2), newer).await;
        let highest = under.journal.highest_seq(&under.id("newer")).await.unwrap();
        let (consumer, handled) = recording_consumer::<Order>();
        let durable = reading_every_order_version(DurableOptions::new(
            under.journal.clone(),
            under.id("newer"),
            "orders",
        ));
        let options = producer_options(&consumer, "orders");
        let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
        let stopped = tokio::time::timeout(Duration::from_secs(20), producer.stopped())
            .await
            .expect("stopped for good");
        assert!(
            matches!(&stopped, Err(Failure::Error(reason)) if reason.contains("newer")),
            "{stopped:?}"
        );
        settle_for(100).await;
        assert!(handled.snapshot().is_empty(), "{name}");
        let after = under.journal.highest_seq(&under.id("newer")).await.unwrap();
        assert_eq!(
            after, highest,
            "{name}: nothing written, not even the opening"
        );
    }
}

/// Another application's types, of the very shapes of this one's: decoding its data as this
/// application's would succeed, so only the names stored with it tell them apart.
mod other_app {
    use super::*;

    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Account {
        pub balance: i64,
        pub deposits: u32,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub enum AccountEvent {
        Deposited { amount: i64 },
        Withdrew { amount: i64 },
        Audited,
    }

    impl EventSourced for Account {
        type Command = i64;
        type Event = AccountEvent;
        type Reply = i64;
        type Rejection = String;

        fn decide(&self, &amount: &i64) -> Result<Decision<Self>, String> {
            let event = match amount {
                0 => AccountEvent::Audited,
                1.. => AccountEvent::Deposited { amount },
                _ => AccountEvent::Withdrew { amount: -amount },
            };
            Ok(Decision::persist([event], self.balance + amount))
        }

        fn apply(&mut self, event: &AccountEvent) {
            match *event {
                AccountEvent::Deposited { amount } => {
                    self.balance += amount;
                    self.deposits += 1;
                }
                AccountEvent::Withdrew { amount } => self.balance -= amount,
                AccountEvent::Audited => {}
            }
        }
    }

    /// An order of the other application.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Order {
        pub id: u64,
        pub total: u64,
    }
}

#[actix::test]
async fn an_entitys_stream_of_another_type_is_refused_naming_both_unless_its_name_is_declared() {
    for under in journals().await {
        let name = under.name;
        for (stream, snapshot_every) in [("foreign-entries", None), ("foreign-snapshot", Some(2))] {
            let config = || config(Codec::MessagePack, snapshot_every);
            under.run::<v1::Account>(stream, config(), &COMMANDS).await;
            let highest = under.journal.highest_seq(&under.id(stream)).await.unwrap();
            // The snapshot is read first, when there is one: it is what names the other type.
            let (stored, expected) = match snapshot_every {
                None => ("v1::AccountEvent", "other_app::AccountEvent"),
                Some(_) => ("v1::Account", "other_app::Account"),
            };
            let error = under.state::<other_app::Account>(stream).await.unwrap_err();
            let JournalError::ForeignType {
                stored: found,
                expected: read,
                ..
            } = &error
            else {
                panic!("{name}, {stream}: {error}");
            };
            assert_eq!(found, &format!("{}::{stored}", module_path!()), "{name}");
            assert_eq!(read, &format!("{}::{expected}", module_path!()), "{name}");
            let entity = under.start::<other_app::Account>(stream, config());
            let opened = entity.opened().await.unwrap_err().to_string();
            assert!(
                opened.contains(stored) && opened.contains(expected),
                "{name}, {stream}: {opened}"
            );
            assert!(
                matches!(entity.ask(1).await, Err(CommandError::Stopped)),
                "{name}: stopped for good"
            );
            let after = under.journal.highest_seq(&under.id(stream)).await.unwrap();
            assert_eq!(after, highest, "{name}, {stream}: nothing written");
            // A type that declares the other's names as its former ones reads the stream.
            let renamed = under.state::<v1_added::Account>(stream).await.unwrap();
            assert_eq!(renamed.balance, 130, "{name}, {stream}");
        }
    }
}

#[actix::test]
async fn a_durable_producers_stream_of_another_message_type_is_refused_unless_its_name_is_accepted()
{
    for under in journals().await {
        let name = under.name;
        let theirs = |id| other_app::Order { id, total: 5 };
        store_unconfirmed(&under, "foreign", |d| d, vec![theirs(1), theirs(2)]).await;
        let highest = under
            .journal
            .highest_seq(&under.id("foreign"))
            .await
            .unwrap();
        let (consumer, handled) = recording_consumer::<Order>();
        let durable = DurableOptions::new(under.journal.clone(), under.id("foreign"), "orders");
        let options = producer_options(&consumer, "orders");
        let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
        let Err(StartError::Failed(Failure::Error(reason))) = producer.opened().await else {
            panic!("{name}: opened");
        };
        assert!(
            reason.contains(concat!("<", module_path!(), "::other_app::Order>"))
                && reason.contains(concat!("<", module_path!(), "::Order>")),
            "{name}: {reason}"
        );
        assert_eq!(producer.stopped().await, Err(Failure::Error(reason)));
        settle_for(100).await;
        assert!(
            handled.snapshot().is_empty(),
            "{name}: nothing of theirs sent"
        );
        let after = under
            .journal
            .highest_seq(&under.id("foreign"))
            .await
            .unwrap();
        assert_eq!(
            after, highest,
            "{name}: nothing written, not even the opening"
        );
        // The same type under its former name (a move or a rename): it is read.
        let handled = resume::<Order>(&under.journal, under.id("foreign"), "orders", |d| {
            d.accept_type_name(concat!(module_path!(), "::other_app::Order"))
        })
        .await;
        assert_eq!(handled, [1, 2].map(|id| Order { id, total: 5 }), "{name}");
    }
}

#[actix::test]
async fn a_durable_producer_refuses_version_0() {
    let (consumer, _) = recording_consumer::<Order>();
    let durable = DurableOptions::new(
        Arc::new(MemoryJournal::new()),
        PersistenceId::new("s").unwrap(),
        "p",
    )
    .message_version(0);
    let error =
        ReliableDelivery::durable_producer(producer_options(&consumer, "p"), durable).unwrap_err();
    assert!(error.to_string().contains("message_version"), "{error}");
}

// --- the journals of the previous release ------------------------------------------------

/// The fixture's entities and their states after its commands (see tests/fixtures/README.md).
const FIXTURE_ACCOUNTS: [(&str, i64, u32); 2] = [("account-1", 130, 3), ("account-2", 5, 1)];

/// Checks a journal opened on a fixture: every event as the raw rows held it, with the legacy
/// manifest if `legacy` (schema 1) or a named one (schema 2); the entities recover (as version
/// 1, and as version 3 through the upcasters, from the fixture's snapshot and entries); the
/// durable producer resumes orders 2 and 3; what was written before tags has none, and a
/// tagged append after the migration is read by its tag.
async fn check_fixture(
    journal: Arc<dyn Journal>,
    raw: BTreeMap<(String, u64), Vec<u8>>,
    accounts: &[(&str, i64, u32)],
    legacy: bool,
) {
    let mut replayed = BTreeMap::new();
    for stream in raw
        .keys()
        .map(|(id, _)| id.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let id = PersistenceId::new(stream.clone()).unwrap();
        replay_all(&*journal, &id, 1, u64::MAX, 100, |event| {
            if legacy {
                assert_eq!(event.manifest, Manifest::legacy(), "{stream} {}", event.seq);
            } else {
                assert!(!event.manifest.name().is_empty(), "{stream} {}", event.seq);
            }
            replayed.insert((stream.clone(), event.seq), event.payload);
            Ok::<_, JournalError>(())
        })
        .await
        .unwrap();
    }
    assert_eq!(replayed, raw, "every event, byte for byte");
    for &(stream, balance, deposits) in accounts {
        let id = PersistenceId::new(stream).unwrap();
        let state = recover_state::<v1::Account>(&*journal, &id).await.unwrap();
        assert_eq!(
            (state.balance, state.deposits),
            (balance, deposits),
            "{stream}"
        );
        let upcast = recover_state::<v3::Account>(&*journal, &id).await.unwrap();
        let upcast = (upcast.balance_cents, upcast.deposits);
        assert_eq!(upcast, (balance * 100, deposits), "{stream}");
    }
    let stream = PersistenceId::new("orders-out").unwrap();
    let handled = resume::<Order>(&journal, stream.clone(), "fixture-producer", |d| d).await;
    let expected = [(2, 700), (3, 900)].map(|(id, total)| Order { id, total });
    assert_eq!(handled, expected, "the unconfirmed orders, sent again");
    let handled = resume::<OrderV2>(&journal, stream, "fixture-producer", |d| {
        d.message_version(2).upcast(order_v2_from_v1)
    })
    .await;
    assert!(handled.is_empty(), "confirmed the first time: {handled:?}");

    let tag = Tag::from_static("account");
    let query = TagQuery::new(tag.clone());
    let id = PersistenceId::new(accounts[0].0).unwrap();
    let next = journal.highest_seq(&id).await.unwrap() + 1;
    journal
        .append_tagged(
            &id,
            next,
            vec![b"tagged".to_vec()],
            Manifest::raw(),
            vec![vec![tag]],
        )
        .await
        .unwrap();
    // Readable once every older transaction on the server has ended (PostgreSQL); then
    // whatever was written before it is readable too, and has no tags.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let tagged = loop {
        let tagged = journal
            .events_by_tag(&query, Offset::START, 100)
            .await
            .unwrap();
        if !tagged.is_empty() || std::time::Instant::now() > deadline {
            break tagged;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        tagged
            .iter()
            .map(|e| (e.persistence_id.clone(), e.seq))
            .collect::<Vec<_>>(),
        [(id, next)],
        "only the entry written after the migration has a tag"
    );
}

/// The events of a SQLite journal file as its tables hold them.
fn raw_sqlite_events(path: &Path) -> BTreeMap<(String, u64), Vec<u8>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT persistence_id, seq_nr, payload FROM event_journal \
             UNION ALL SELECT persistence_id, seq_nr, payload FROM event_buffer",
        )
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok(((row.get(0)?, row.get::<_, i64>(1)? as u64), row.get(2)?))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn user_version(path: &Path) -> i32 {
    rusqlite::Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

/// The journal id a migrated SQLite file holds: the one its journal reports, its only row.
fn sqlite_journal_ids(path: &Path) -> Vec<String> {
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut statement = connection
        .prepare("SELECT journal_id FROM journal_identity")
        .unwrap();

    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[actix::test]
async fn the_sqlite_journal_of_the_previous_release_is_migrated_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal-v1.sqlite");
    std::fs::copy("tests/fixtures/journal-v1.sqlite", &path).unwrap();
    assert_eq!(user_version(&path), 1);
    let raw = raw_sqlite_events(&path);
    assert_eq!(raw.len(), 12, "the fixture as committed");
    let journal = SqliteJournal::open(&path).await.unwrap();
    assert_eq!(user_version(&path), 3, "migrated on open");
    let id = journal.journal_id().expect("given an id on open");
    assert_eq!(sqlite_journal_ids(&path), [id.as_str().to_owned()]);
    check_fixture(Arc::new(journal), raw, &FIXTURE_ACCOUNTS, true).await;
}

/// A type changed without a new version fails stop on the previous release's entries with the
/// same hint as on its own: raise the version and read the old one in an upcaster. In their
/// layout the application's part comes first, so the changed type reads past its end and it is
/// the crate's part after it that does not decode.
#[actix::test]
async fn an_entry_of_the_previous_release_read_by_a_changed_type_says_to_raise_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal-v1.sqlite");
    std::fs::copy("tests/fixtures/journal-v1.sqlite", &path).unwrap();
    let journal = SqliteJournal::open(&path).await.unwrap();
    let id = PersistenceId::new("account-2").unwrap();
    let error = recover_state::<v1_added::Account>(&journal, &id)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, JournalError::Corrupt { seq: 1, reason, .. }
            if reason.contains("the type changed without a new version: raise the version and \
                read the old one in an upcaster")),
        "{error}"
    );
}

#[actix::test]
async fn the_sqlite_journal_of_schema_2_is_migrated_and_what_it_held_has_no_tags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal-v2.sqlite");
    std::fs::copy("tests/fixtures/journal-v2.sqlite", &path).unwrap();
    assert_eq!(user_version(&path), 2);
    let raw = raw_sqlite_events(&path);
    assert_eq!(raw.len(), 12, "the fixture as committed");
    let journal = SqliteJournal::open(&path).await.unwrap();
    assert_eq!(user_version(&path), 3, "migrated on open");
    let id = journal.journal_id().expect("given an id on open");
    assert_eq!(sqlite_journal_ids(&path), [id.as_str().to_owned()]);
    check_fixture(Arc::new(journal), raw, &FIXTURE_ACCOUNTS, false).await;
}

/// Loads a PostgreSQL fixture into a schema of its own, opens the journal on it (which
/// migrates it) and checks it; `legacy` as for [`check_fixture`].
#[cfg(feature = "postgres")]
async fn check_postgres_fixture(fixture: &str, legacy: bool) {
    let schema = postgres_support::unique("fixture");
    let admin = postgres_support::admin().await;
    let fixture = std::fs::read_to_string(fixture).unwrap();
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema}; {fixture}"
        ))
        .await
        .unwrap();
    let rows = admin
        .query(
            &format!("SELECT persistence_id, seq_nr, payload FROM {schema}.event_journal"),
            &[],
        )
        .await
        .unwrap();
    let raw: BTreeMap<(String, u64), Vec<u8>> = rows
        .iter()
        .map(|row| ((row.get(0), row.get::<_, i64>(1) as u64), row.get(2)))
        .collect();
    assert_eq!(raw.len(), 10, "the fixture as committed");
    let options = || actix_delivery::journal::PostgresOptions::builder().schema(&schema);
    let refused = actix_delivery::journal::PostgresJournal::connect_with(
        &postgres_support::url(),
        options().create_tables(false).build().unwrap(),
    )
    .await;
    match refused {
        Err(JournalError::Schema { found, .. }) => assert!(
            found.contains("MIGRATE_2_TO_3_SQL") && found.contains("in one transaction"),
            "names the migrations to run by hand: {found}"
        ),
        other => panic!("expected a schema error, got {:?}", other.map(drop)),
    }
    let journal = actix_delivery::journal::PostgresJournal::connect_with(
        &postgres_support::url(),
        options().build().unwrap(),
    )
    .await
    .unwrap();
    let version: i32 = admin
        .query_one(&format!("SELECT version FROM {schema}.journal_schema"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 3, "migrated on connect");
    let id = journal
        .journal_id()
        .expect("given an id with the migration");
    let ids: Vec<String> = admin
        .query(
            &format!("SELECT journal_id FROM {schema}.journal_identity"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ids, [id.as_str().to_owned()]);
    check_fixture(Arc::new(journal), raw, &FIXTURE_ACCOUNTS[..1], legacy).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[cfg(feature = "postgres")]
#[actix::test]
async fn the_postgres_tables_of_the_previous_release_are_migrated_and_recover() {
    check_postgres_fixture("tests/fixtures/journal-v1.postgres.sql", true).await;
}

#[cfg(feature = "postgres")]
#[actix::test]
async fn the_postgres_tables_of_schema_2_are_migrated_and_what_they_held_has_no_tags() {
    check_postgres_fixture("tests/fixtures/journal-v2.postgres.sql", false).await;
}
