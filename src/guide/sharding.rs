//! # Sharding: many entities, hosted on demand, spread over nodes
//!
//! An application with 100 000 accounts or orders does not start each entity by hand. An
//! [`EntityHostHandle`](crate::sharding::EntityHostHandle) runs the persistent entities of one type
//! over a journal: an entity starts on its first command and recovers, is found by its
//! [`EntityId`](crate::sharding::EntityId), and is passivated (stopped gracefully) when idle or as
//! the least recently used one beyond a limit. A sharded producer sends to entities by id, over one
//! reliable stream per entity, effectively once. Across processes, entities map to a fixed number
//! of shards; each shard has one owner at a time through leases in PostgreSQL, and deliveries
//! reach the owner over NATS or TCP. The [`sharding`](crate::sharding) module has a one-node
//! example, every rule and every setting; this chapter adds the multi-node set-up.
//!
//! On several nodes, each process starts a coordinator instead of a bare host. This example needs
//! the features `postgres` and `nats`, a PostgreSQL server and a NATS server:
//!
//! ```no_run
//! # #[cfg(all(feature = "postgres", feature = "nats"))]
//! # mod account {
//! # use actix_delivery::persistence::{Decision, EventSourced};
//! # #[derive(Default, serde::Serialize, serde::Deserialize)] pub struct Account { balance: u64 }
//! # #[derive(serde::Serialize, serde::Deserialize)] pub struct Deposited(u64);
//! # impl EventSourced for Account {
//! #     type Command = u64; type Event = Deposited; type Reply = u64; type Rejection = String;
//! #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> {
//! #         Ok(Decision::persist([Deposited(*n)], self.balance + n)) }
//! #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
//! # }
//! # }
//! # #[cfg(all(feature = "postgres", feature = "nats"))]
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use account::Account;
//! # let url = "host=127.0.0.1 user=postgres dbname=test";
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use actix_delivery::journal::PostgresJournal;
//! use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
//! use actix_delivery::sharding::{
//!     CoordinatorOptions, EntityHostOptions, NatsShards, PostgresLeaseStore, ShardCoordinatorHandle,
//!     ShardedProducerOptions,
//! };
//! use actix_delivery::ReliableDelivery;
//!
//! let carrier = NatsCarrierHandle::connect("nats://127.0.0.1:4222", NatsOptions::default()).await?;
//! let _node = ShardCoordinatorHandle::<Account>::start(
//!     Arc::new(PostgresJournal::connect(url).await?), // the shared journal
//!     EntityHostOptions::builder("account").build()?,
//!     Arc::new(PostgresLeaseStore::connect(url, "sharding", Duration::from_secs(2)).await?),
//!     CoordinatorOptions::builder("node-a").build()?,
//!     |host| NatsShards::new(&carrier, "accounts", host.consumer(|amount: u64| amount)).unwrap(),
//! )?;
//! // Senders, anywhere:
//! let deposits = ReliableDelivery::sharded_producer(
//!     ShardedProducerOptions::per_shard(NatsShards::<u64>::destination(&carrier, "accounts")?)
//!         .build()?,
//! );
//! deposits.send("alice".parse()?, 50).await?; // confirmed once alice's event is stored
//! # Ok(()) }
//! # #[cfg(not(all(feature = "postgres", feature = "nats")))] fn main() {}
//! ```
//!
//! The [`sharding`](crate::sharding) module states how leases, handoffs and failover work. What
//! to know when running it:
//!
//! - `PostgresLeaseStore` keeps two tables of its own (`shard_lease`, `shard_member`) in the
//!   schema it is given, created on first connect.
//! - A SIGKILLed node's shards move when its leases expire: about `lease_ttl` (10 s) plus one
//!   `renew_interval` (2 s) after the kill. What was in flight to it is retransmitted to the new
//!   owner, whose entities answer what they had already stored.
//! - The shard count (`shards`, 64) is fixed per type: every node and producer must agree, and it
//!   cannot change while any of them runs.
//! - `ShardCoordinatorHandle::stop` hands every shard off before the node leaves; use it for
//!   planned restarts.
//! - `EntityHostHandle::stats`, `ShardCoordinatorHandle::stats` and
//!   `ShardedProducerHandle::lane_stats` report what each part holds and did; all are exported
//!   with the `metrics` feature.
//!
//! `cargo run --features postgres,nats --example sharding` runs three node processes, SIGKILLs
//! one while deposits flow, and checks from the journal that every deposit was applied once, in
//! order.
