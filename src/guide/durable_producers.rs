//! # Durable producers and the outbox
//!
//! A producer in memory loses its unconfirmed messages when its process dies. A **durable
//! producer** stores each message in a [journal](super::journals) before its first transmission
//! (a burst of tells is one append), records settlements in batches behind the ACKs, and compacts
//! settled messages away, so its stream holds about the unconfirmed messages. A restarted durable
//! producer keeps its incarnation, continues its seq, and resends every unconfirmed message under
//! its original seq: a consumer recognises what it already handled, a
//! [persistent consumer](super::effectively_once) even after its own crash.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use actix_delivery::durable::DurableOptions;
//! use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: u64| async move {
//!         println!("shipping order {order}");
//!         Ok::<(), std::io::Error>(())
//!     }))
//!     .build()?,
//! );
//! // SqliteJournal::open("orders.journal") in production:
//! let journal = Arc::new(MemoryJournal::new());
//! let producer = ReliableDelivery::durable_producer(
//!     ProducerOptions::builder(&consumer).build()?,
//!     // the stream, and the producer id it belongs to across restarts
//!     DurableOptions::new(journal, PersistenceId::new("orders-out")?, "orders"),
//! )?;
//! producer.opened().await?; // the stream is open (or why it is not)
//! // Err(DeliveryError::Timeout): certainly not stored
//! let stored = producer.store_timeout(4711, Duration::from_millis(100)).await?;
//! stored.confirmed().await?; // the consumer's ACK is recorded
//! # Ok(()) }
//! ```
//!
//! - [`store(body).await`](crate::ProducerHandle::store) resolves once the producer owns the
//!   message (across crashes); [`Stored::confirmed`](crate::durable::Stored::confirmed) once the
//!   consumer's ACK is recorded. Confirmations of messages resent after a restart go to an
//!   optional sink with their [`MessageId`](crate::durable::MessageId).
//! - **The newest opener owns the stream.** A producer whose stream another start took over is
//!   refused at its next write and stops for good, its `stopped()` saying
//!   [`Failure::TakenOver`](crate::Failure::TakenOver): a restarted process cannot tell a dead
//!   predecessor from a paused one. To refuse a second instance instead, give every producer of
//!   the stream a [lease](crate::durable::DurableOptions::lease).
//! - **A store of unknown outcome** (a storage error) is settled after the restart by what the
//!   journal holds: no message is reported "not stored" and sent anyway.
//!
//! `cargo run --example durable_producer` stores orders, stops the producer with some of them
//! unconfirmed, and shows the next start sending them again and reporting them to its sink. The
//! [`durable`](crate::durable) module has every rule.
//!
//! ## Stopping is graceful
//!
//! `stop()` of a durable producer finishes the store, settlement record or opening in flight and
//! records the ACKs it received before it stops; `stopped().await` resolves after that. Every
//! message's outcome reaches exactly one party: its callback / `store()` /
//! `Stored::confirmed()`, or the sink after the next start, on every path that ends a life
//! (`stop()`, a journal failure, a supervised restart). The wait is bounded by
//! [`DurableOptions::stop_timeout`](crate::durable::DurableOptions::stop_timeout) (10 s); what the
//! journal has not answered by then is settled
//! [`DeliveryError::InDoubt`](crate::DeliveryError::InDoubt) ("may be stored; the next start
//! settles it", and the sink then reports it). A supervisor restarts a durable producer after a
//! journal failure unless its options say
//! [`stop_on_journal_failure()`](crate::durable::DurableOptions::stop_on_journal_failure).
//!
//! ## A start that fails says so
//!
//! Starting a durable producer, a persistent entity or a projection returns at once; opening its
//! stream follows. `opened().await` resolves once it is open (the producer's stream read, the
//! entity recovered, the projection's offset loaded and found to fit), or with why it never will
//! be ([`StartError::Failed`](crate::StartError::Failed)): the stream belongs to another producer
//! id, holds another application's types, is corrupt or of a newer schema, another producer took
//! it over, or (a projection) the stored offset does not fit. A journal that cannot be reached is
//! not a reason: the part opens again after a growing delay and `opened()` waits on (bound it with
//! a timeout). `stopped().await` says why a part stopped for good: `Ok(())` when it was asked to
//! (or left by its handles), otherwise the [`Failure`](crate::Failure). The example service of
//! [Running in production](super::production) serves only once both its streams are open.
//!
//! ## The outbox
//!
//! An outbox lets a persistent entity's decision deliver messages
//! (`Decision::persist(events, reply).deliver("shipping", &msg)`): the record of the delivery is in
//! the same journal entry as the events, so a delivery exists if and only if its events do; it is
//! sent after the commit and sent again after a recovery until confirmed.
//! [`PersistentConfig::must_follow`](crate::persistence::PersistentConfig::must_follow) on the
//! receiver keeps each sender's order across crashes of either side. `cargo run --example outbox`
//! shows an order service and a shipping entity that survive `kill -9`; the
//! [`Outbox`](crate::persistence::Outbox) type documents the rules.
