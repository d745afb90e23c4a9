//! # Effectively once: persistent entities
//!
//! The consumer's duplicate filter lives in memory, so after a consumer crash a retransmitted
//! message runs again. For effectively-once processing, hand each message to a **persistent
//! entity**: an event-sourced type whose pure `decide` turns a command into events, run by a
//! [`PersistentActor`](crate::persistence::PersistentActor) over a [journal](super::journals). The
//! actor stores the delivery's processed mark in the same journal entry as the command's events
//! and replies only after the commit; the consumer ACKs only after that reply.
//!
//! ```
//! use std::sync::Arc;
//!
//! use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
//! use actix_delivery::{ConsumerOptions, ProducerOptions, ReliableDelivery};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Account {
//!     balance: u64,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Deposited(u64);
//!
//! impl EventSourced for Account {
//!     type Command = u64;
//!     type Event = Deposited;
//!     type Reply = u64;
//!     type Rejection = String;
//!
//!     fn decide(&self, amount: &u64) -> Result<Decision<Self>, String> {
//!         Ok(Decision::persist([Deposited(*amount)], self.balance + amount))
//!     }
//!
//!     fn apply(&mut self, Deposited(amount): &Deposited) {
//!         self.balance += amount;
//!     }
//! }
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // SqliteJournal::open("accounts.db") in production; the memory journal for tests.
//!     let journal = Arc::new(MemoryJournal::new());
//!     let account = PersistentHandle::<Account>::start(PersistentOptions::new(
//!         journal,
//!         PersistenceId::new("account-42")?,
//!     ))?;
//!     // Each message becomes a command; it is ACKed once its events and mark are committed.
//!     let consumer = ReliableDelivery::consumer(
//!         ConsumerOptions::builder(account.delivery_handler(|amount: u64| amount)).build()?,
//!     );
//!     let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
//!     producer.send(50).await?;
//!     assert_eq!(account.ask(0).await?, 50);
//!     Ok(())
//! }
//! ```
//!
//! A crash before the commit: no ACK, the message is retransmitted and decided again on the
//! recovered state. A crash after the commit, before the ACK: the retransmission finds its mark
//! in the recovered record and is ACKed without deciding again. So every message's events are
//! stored exactly once; side effects outside the journal still happen at least once (make them
//! idempotent, or emit them as deliveries of their own:
//! [the outbox](super::durable_producers#the-outbox)).
//! `cargo run --example persistent_consumer` shows a bank account that survives `kill -9`. The
//! [`persistence`](crate::persistence) module has the rules; what the crash tests prove is in
//! `tests/README.md`.
//!
//! ## What the actor does for you
//!
//! - **Batching.** Commands are decided at once and their replies held until the commit; all
//!   commands decided while one append is in flight go into the next one. The consumer's handler
//!   is [pipelined](crate::DeliveryHandler::pipelined): messages reach the entity in order
//!   without waiting for each other's commit.
//! - **Fail-stop.** A failed append answers every waiting command with the error and stops the
//!   actor; supervised (`PersistentOptions::supervised()`) it restarts on the durable state. A
//!   second writer of the same stream (an overlapping failover) loses the journal's fence,
//!   catches up and decides again.
//! - **Snapshots** every N events (optional), with deletion of the events they cover. A snapshot
//!   has its own size limit (`max_snapshot_bytes`, 256 MiB; events have the codec's 16 MiB); one
//!   that fails is counted (`snapshot_failures`) and tried again only after another interval. A
//!   recovery that races another writer's snapshot and deletion starts again from the newer
//!   snapshot.
//! - **Bounded.** Commands waiting for the recovery (`max_recovery_buffer`) and decided commands
//!   waiting for their commit behind a slow append (`max_pending_commands`, 10 000;
//!   `max_pending_bytes`, 64 MiB) are bounded; beyond,
//!   [`CommandError::Overloaded`](crate::persistence::CommandError::Overloaded), counted.
//! - **Lifetime.** The [`PersistentHandle`](crate::persistence::PersistentHandle)s (with the
//!   clones inside delivery handlers) own the entity: when the last is dropped it finishes what it
//!   decided, delivers its outbox until confirmed, then stops and releases the journal. `stop()`
//!   stores what it decided and records its outbox's confirmations first, within
//!   `PersistentConfig::stop_timeout` (10 s); a command whose append is unanswered then gets
//!   [`CommandError::InDoubt`](crate::persistence::CommandError::InDoubt).
//!
//! Many entities of one type, started on demand and spread over nodes, are
//! [sharding](super::sharding)'s job. Changing the entity's types later:
//! [Changing your types](super::schema_evolution).
