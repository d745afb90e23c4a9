//! Sharding: many persistent entities, hosted on demand, addressed by id, spread over nodes,
//! failing over without duplicates.
//!
//! ```text
//!  your code              sharded producer                          entity host (per node)
//!  tell / send / store ─▶ producer ─▶ router ── one stream ─▶ consumer ─▶ entity "alice" (started on
//!  (entity id, body)      (plain or   per entity  per entity   (effectively  demand, recovered from
//!                          durable)              ───────────▶   once)        the journal; passivated
//!  confirm(Ok) ◀───────── ACK ◀──────── once the entity stored the command ◀─ when idle or by LRU)
//! ```
//!
//! # On one node
//!
//! An [`EntityHostHandle`] runs the entities of one
//! [`EventSourced`](crate::persistence::EventSourced) type over a journal. An entity is a
//! [`PersistentActor`](crate::persistence::PersistentActor) of stream `<type>|<id>`, started on its
//! first command (it recovers from the journal; commands sent meanwhile wait in it, up to
//! `max_recovery_buffer`), found by [`EntityId`], and **passivated** (stopped gracefully: what it
//! decided is stored first) when idle for `idle_timeout`, or as the least recently used idle one
//! when `max_active_entities` run and another must start (when all of them are busy, the other's
//! commands wait for room: at most `max_active_entities` ever run at once). A command that arrives
//! while its entity stops waits and goes to the next instance, in order (at most
//! `max_held_commands` wait over all entities; beyond, [`HostError::Full`]).
//!
//! A [`ShardedProducerHandle`] (from [`ReliableDelivery::sharded_producer`](crate::ReliableDelivery::sharded_producer))
//! sends to entities by id: an ordinary producer numbers and holds the messages, and its
//! router, in process, keeps **one reliable stream per destination entity**, opened on the
//! entity's first message and closed after `cleanup_unused_after` without one in flight. So
//! one slow entity does not hold the others back, and an entity without demand holds at most
//! `max_pending_per_entity` of the producer's window. Each message carries its stable id at
//! the producer and its predecessor to the same entity ([`EntityEnvelope`]); the host's
//! consumer ([`EntityHostHandle::consumer`]) stores that id as the command's processed mark with
//! its events and ACKs once they are committed: **every message's events are stored once**,
//! across crashes of the host, and with a durable producer
//! ([`ReliableDelivery::durable_sharded_producer`](crate::ReliableDelivery::durable_sharded_producer):
//! one durable stream holding every message with its entity id) across the producer's
//! crashes too. With `must_follow` an entity also keeps each producer's order.
//!
//! ```
//! use std::sync::Arc;
//! use actix_delivery::journal::MemoryJournal;
//! use actix_delivery::persistence::{Decision, EventSourced};
//! use actix_delivery::sharding::{EntityHostHandle, EntityHostOptions, EntityId, ShardedProducerOptions};
//! use actix_delivery::ReliableDelivery;
//! # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Account { balance: u64 }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Deposited(u64);
//! # impl EventSourced for Account {
//! #     type Command = u64; type Event = Deposited; type Reply = u64; type Rejection = String;
//! #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> {
//! #         Ok(Decision::persist([Deposited(*n)], self.balance + n)) }
//! #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
//! # }
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let accounts = EntityHostHandle::<Account>::start(
//!     Arc::new(MemoryJournal::new()), // SqliteJournal, PostgresJournal in production
//!     EntityHostOptions::builder("account").build()?,
//! )?;
//! let deposits = ReliableDelivery::sharded_producer(
//!     ShardedProducerOptions::builder(&accounts.consumer(|amount: u64| amount)).build()?,
//! );
//! let alice: EntityId = "alice".parse()?;
//! deposits.send(alice.clone(), 50).await?; // confirmed once alice stored it
//! assert_eq!(accounts.ask(alice, 0).await?, 50);
//! # Ok(()) }
//! ```
//!
//! # Across nodes
//!
//! An entity belongs to one of a fixed number of **shards**: [`ShardId::of`] its id (FNV-1a,
//! modulo `shards`). A [`ShardCoordinatorHandle`] per node and type owns shards through **leases**
//! in a [`LeaseStore`] (`PostgresLeaseStore` in the shared journal's database, feature
//! `postgres`; [`MemoryLeaseStore`] in one process): acquired only once free or expired, with
//! a **fencing token** that grows with every acquisition; renewed every `renew_interval`;
//! valid here for nine tenths of `lease_ttl` after the renewal was sent, judged by the store's
//! clock over there. No consensus of our own: the store decides who holds a lease.
//!
//! - **Who owns what.** Each shard's desired owner is the live member with the highest rendezvous
//!   score ([`allocation`]): every node computes the same answer from the table. A node acquires
//!   the free shards it should own.
//! - **Joining and leaving: handoff.** A node holding a shard another member should own hands it
//!   off, at most `max_handoffs` at a time: it stops receiving the shard's deliveries, stops the
//!   shard's entities (gracefully), then releases the lease; the new owner acquires it and its
//!   entities recover on their next command. [`ShardCoordinatorHandle::stop`] hands off every shard
//!   and leaves.
//! - **Crashes.** A SIGKILLed node's leases expire after `lease_ttl`; the others take its shards.
//!   Deliveries in flight to it are retransmitted and reach the new owner, whose entities answer
//!   those they had stored (the processed marks) without applying them again.
//! - **Two owners at once** (a node paused beyond its lease, a network split from the store): the
//!   journal's fence decides; an entity instance whose append conflicts catches up from the journal
//!   and decides again, so nothing is stored twice. The old owner stops acting on its shards when
//!   its lease is no longer valid here, before the store gives them away.
//! - **Transport.** Deliveries reach the owner over NATS (`NatsShards`, feature `nats`: a subject
//!   per shard, subscribed by its owner only), over TCP (each node exposes its host's consumer on
//!   its [`NodeHandle`](crate::tcp::NodeHandle); senders find a shard's owner in the lease table
//!   through a [`ShardDirectory`]), or any [`ShardTransport`].
//!
//! # Settings
//!
//! | setting | on | default | |
//! |---|---|---|---|
//! | `idle_timeout_ms` | [`EntityHostConfig`] | 120 s | passivate an entity idle this long (`"unbounded"`: never) |
//! | `max_active_entities` | [`EntityHostConfig`] | 10 000 | at most this many run; one more passivates the least recently used idle one, or waits |
//! | `max_held_commands` | [`EntityHostConfig`] | 10 000 | commands waiting for stopping entities |
//! | `shards` | all | 64 | fixed per type: every node and producer must agree |
//! | `max_pending_per_entity` | [`ShardedProducerConfig`] | 1 000 | unconfirmed messages per entity |
//! | `cleanup_unused_after_ms` | [`ShardedProducerConfig`] | 120 s | close an entity's stream unused this long |
//! | `max_open_lanes` | [`ShardedProducerConfig`] | 10 000 | entity streams open at once (about 1 KiB each) |
//! | `lease_ttl_ms` | [`CoordinatorConfig`] | 10 s | a dead node's shards move after this |
//! | `renew_interval_ms` | [`CoordinatorConfig`] | 2 s | renewals, heartbeats, looks at the table |
//! | `max_handoffs` | [`CoordinatorConfig`] | 4 | shards handed off at once |
//!
//! # Limits
//!
//! - The shard count cannot change while any node or producer of the type runs.
//! - Effects outside the journal (an email from a reply) happen at least once, as anywhere.
//! - An entity's dedup record keeps, per producer incarnation, the messages at or above the
//!   producer's window start: bounded by the producer's `window_size`, at most
//!   `max_producers` producers (persistent config) per entity.
//! - Memory: a host's and a producer's tables give back their capacity when they drain (under
//!   a quarter full, beyond 1 024 entries, a table shrinks to twice what it holds), so a
//!   burst of entities does not pin memory for good.
//!
//! # Trust
//!
//! An envelope's origin names a producer's message; an entity records it as processed. Only
//! the producer's own streams can name its origins: a stream's token is derived from the
//! producer's token and the entity id, the origin carries that token's public id, and a host
//! refuses (a dead letter, [`HostStats::refused_foreign`]) an envelope whose delivery does not
//! hold that very token. Knowing a producer's id and public
//! [`IncarnationId`](crate::IncarnationId) (safe to log) grants nothing.

use actix_delivery_proto::sharding::allocation;
use actix_delivery_proto::sharding::capacity;
mod coordinator;
mod coordinator_options;
mod directory;
use actix_delivery_proto::sharding::entity_id;
mod envelope;
mod host;
use actix_delivery_proto::sharding::host_core;
mod host_options;
mod host_shell;
use actix_delivery_proto::sharding::lanes;
use actix_delivery_proto::sharding::lease;
mod lease_store;
mod leaseholder;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
#[cfg(feature = "nats")]
mod nats_shards;
#[cfg(feature = "postgres")]
mod postgres_leases;
mod producer;
mod producer_options;
mod rooms;
mod router;
mod transport;

pub use self::coordinator::ShardCoordinatorHandle;
pub use self::coordinator_options::{
    CoordinatorConfig, CoordinatorOptions, CoordinatorOptionsBuilder, MAX_NODE_NAME,
};
pub use self::directory::ShardDirectory;
pub use self::entity_id::{EntityId, EntityIdError, ShardId, MAX_ENTITY_ID};
pub use self::envelope::{EntityEnvelope, EntityMessage};
pub use self::host::{EntityHostHandle, HostError};
pub use self::host_core::HostStats;
pub use self::host_options::{
    EntityHostConfig, EntityHostOptions, EntityHostOptionsBuilder, MAX_ENTITY_TYPE, MAX_SHARDS,
};
pub use self::lanes::LaneStats;
pub use self::lease_store::{
    Lease, LeaseError, LeaseFuture, LeaseRecord, LeaseStore, LeaseView, Member, MemoryLeaseStore,
};
pub use self::leaseholder::CoordinatorStats;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use self::nats_shards::NatsShards;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres_leases::PostgresLeaseStore;
pub use self::producer::ShardedProducerHandle;
pub use self::producer_options::{
    ShardedProducerConfig, ShardedProducerOptions, ShardedProducerOptionsBuilder,
    MAX_SHARDED_PRODUCER_ID,
};
pub use self::transport::{LocalFuture, NoTransport, ShardTransport};
