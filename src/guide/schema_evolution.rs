//! # Changing your types
//!
//! Event-sourced data lives for years, and messages cross nodes of different versions during a
//! rolling deploy; their types change. Every stored entry (event, snapshot, a durable producer's
//! message) and every body sent across processes records how it was written: its codec, and for
//! stored entries its type name and schema version (the *manifest*, in columns of their own in
//! SQLite and PostgreSQL). Each is read in the codec it was written in.
//!
//! ## Two codecs
//!
//! - **MessagePack** ([`Codec::MessagePack`](crate::codec::Codec::MessagePack), the default):
//!   self-describing, with named fields. A field added with `#[serde(default)]` decodes from old
//!   data, and a field the reader does not know (from a newer writer) is ignored: **additive
//!   changes need no code**.
//! - **bincode** ([`Codec::Bincode`](crate::codec::Codec::Bincode)): smaller and faster, fixed
//!   schema: every change of a type needs a new version and an upcaster. Journals written by
//!   actix-delivery 0.1 are bincode.
//!
//! Stored data chooses with `PersistentConfig::codec` and `DurableOptions::codec`; bodies on the
//! wire with a [`BodySchema`](crate::tcp::BodySchema) (below). What each costs is in
//! `benches/README.md`, "Codecs".
//!
//! ## Breaking changes: one function
//!
//! Raise the type's version
//! ([`EventSourced::EVENT_VERSION`](crate::persistence::EventSourced::EVENT_VERSION) or [`STATE_VERSION`](crate::persistence::EventSourced::STATE_VERSION),
//! [`DurableOptions::message_version`](crate::durable::DurableOptions::message_version)) and read
//! the older versions in an upcaster, which gets the stored value as
//! [`Written`](crate::codec::Written) (its version, and `decode::<OldType>()`):
//!
//! ```
//! use actix_delivery::codec::{UpcastError, Written};
//! use actix_delivery::persistence::{Decision, EventSourced};
//!
//! mod v1 {
//!     #[derive(serde::Deserialize)]
//!     pub enum AccountEvent {
//!         Deposited { amount: u64 }, // whole euros
//!     }
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! enum AccountEvent {
//!     Deposited { cents: u64 },
//! }
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Account {
//!     cents: u64,
//! }
//!
//! impl EventSourced for Account {
//!     type Command = u64;
//!     type Event = AccountEvent;
//!     type Reply = ();
//!     type Rejection = String;
//!     const EVENT_VERSION: u32 = 2;
//!
//!     fn decide(&self, cents: &u64) -> Result<Decision<Self>, String> {
//!         Ok(Decision::persist([AccountEvent::Deposited { cents: *cents }], ()))
//!     }
//!
//!     fn apply(&mut self, AccountEvent::Deposited { cents }: &AccountEvent) {
//!         self.cents += cents;
//!     }
//!
//!     fn upcast_events(old: Written<'_>) -> Result<Vec<AccountEvent>, UpcastError> {
//!         match old.version() {
//!             1 => Ok(old
//!                 .decode::<Vec<v1::AccountEvent>>()? // an entry holds one command's events
//!                 .into_iter()
//!                 .map(|v1::AccountEvent::Deposited { amount }| AccountEvent::Deposited { cents: amount * 100 })
//!                 .collect()),
//!             other => Err(UpcastError::new(format!("no upcaster from version {other}"))),
//!         }
//!     }
//! }
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use std::sync::Arc;
//! # use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! # use actix_delivery::persistence::{PersistentHandle, PersistentOptions};
//! # let account = PersistentHandle::<Account>::start(PersistentOptions::new(
//! #     Arc::new(MemoryJournal::new()), PersistenceId::new("account-1")?))?;
//! # account.ask(250).await?;
//! # Ok(()) }
//! ```
//!
//! A later version 3 adds a `match` arm: one function converts 1 → 2 → 3. A durable producer's
//! stored messages work the same way:
//! `DurableOptions::new(journal, stream, producer_id).message_version(2).upcast(|old| …)`.
//!
//! | change | recipe |
//! |---|---|
//! | **add a field** | `#[serde(default)] currency: Option<String>`. With MessagePack nothing else; with bincode (every journal of 0.1 included) as a breaking change: the old type stays as `V1`, and the upcaster decodes it and maps it. |
//! | **rename a field** (or change its type) | keep the old type as `OrderEventV1`, raise `EVENT_VERSION`, and in `upcast_events` decode it and map each to today's event. |
//! | **remove or split an event** | in the same upcaster: `flat_map` an old event into several new ones, or into none. |
//! | **change the snapshot (state) type** | raise `STATE_VERSION` and convert in `upcast_state`. Without one, an older snapshot is skipped and the state rebuilt from all events (which fails, rather than guessing, if `delete_events_on_snapshot` removed them). |
//!
//! Nothing is guessed or skipped:
//!
//! - An entry whose version is newer than the code's (a rollback) stops the entity or producer
//!   with [`JournalError::Incompatible`](crate::journal::JournalError::Incompatible) naming
//!   stream, seq and both versions; nothing is written.
//! - A bincode type changed without a new version fails stop too:
//!   [`JournalError::Corrupt`](crate::journal::JournalError::Corrupt) naming stream and seq, with
//!   the hint to raise the version and read the old one in an upcaster.
//! - **The type name says whose data it is.** A stream whose entries name another type than the
//!   reader's is another application's: an entity's recovery fails with
//!   [`JournalError::ForeignType`](crate::journal::JournalError::ForeignType) naming both names,
//!   and a durable producer does not open. Names are `std::any::type_name`; a type moved or
//!   renamed declares its former names
//!   ([`EventSourced::FORMER_TYPE_NAMES`](crate::persistence::EventSourced::FORMER_TYPE_NAMES),
//!   [`DurableOptions::accept_type_name`](crate::durable::DurableOptions::accept_type_name)).
//!   Entries of 0.1, which recorded no names, are read by any type.
//!
//! ## Bodies on the wire: rolling deploys
//!
//! Over TCP and NATS every body carries its codec and the schema version of its type (2 bytes),
//! so old and new nodes understand each other during a rolling deploy. The default wire codec is
//! MessagePack with named fields ([`tcp::DEFAULT_WIRE_CODEC`](crate::tcp::DEFAULT_WIRE_CODEC)): a
//! field added with `#[serde(default)]` needs no code, as the new nodes read the old bodies with
//! the field defaulted and the old ones ignore it in the new bodies. A breaking change raises the
//! type's version on the new nodes and gives them an upcaster, per node and per message type,
//! declared before sending or exposing:
//!
//! ```
//! # use actix_delivery::tcp::{BodySchema, NodeHandle, NodeOptions};
//! # use actix_delivery::codec::{Codec, UpcastError, Written};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Order;
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Tick;
//! # fn order_from_v1(_: Written<'_>) -> Result<Order, UpcastError> { Ok(Order) }
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let node = NodeHandle::start(NodeOptions::builder().insecure_no_authentication().build()?).await?;
//! # let _ = Tick;
//! node.body_schema(BodySchema::<Order>::new().version(2).upcast(order_from_v1));
//! node.body_schema(BodySchema::<Tick>::new().codec(Codec::Bincode)); // a type that never changes
//! # Ok(()) }
//! ```
//!
//! A body a receiver cannot read (an unknown codec, a version newer than its own, an older one
//! without an upcaster) is a dead letter with
//! [`DeadLetterReason::IncompatibleBody`](crate::DeadLetterReason::IncompatibleBody), counted and
//! logged with the type's name; as for any dead letter there is no ACK, so the producer
//! retransmits it until its `max_attempts`. Upgrade the consumers' nodes first (they read the old
//! version through the upcaster), then the producers'.
//!
//! The library's own formats (the protocol, the journals) change by the same rule, write old
//! and read new: nodes of two consecutive releases deliver to each other and share a journal,
//! so a deployment upgrades a node at a time ([Upgrading without downtime](super::upgrades)).
//!
//! ## Journals of earlier releases
//!
//! Journals are migrated on open, in one transaction: journal schema 1 (actix-delivery 0.1) gains
//! the manifest columns, and what it holds reads as bincode, version 1; schema 2 gains the tags
//! (`event_tag`), and entries written before have none (SQLite: `PRAGMA user_version`;
//! PostgreSQL: `journal_schema.version`, PostgreSQL 13 or newer, the migration under the lock
//! that creates the tables; with `create_tables` off, run
//! `PostgresJournal::MIGRATE_1_TO_2_SQL` and `MIGRATE_2_TO_3_SQL` by hand). The journal's id
//! (`journal_identity`) is added on open without a new schema version, so the previous release
//! still reads the journal; with `create_tables` off, run `PostgresJournal::IDENTITY_SQL`.
//! Schema 3 is this release's and the previous one's, so rolling from the previous release
//! migrates nothing. A migration from schema 1 or 2 (releases before it) is not a rolling
//! upgrade: nodes of those releases still connected to a shared PostgreSQL journal keep writing,
//! refuse to reconnect, and stop on any stream a new node wrote, so stop them before the first
//! node of this release opens the journal. A journal of a newer schema than the code's is
//! refused, naming both versions.
