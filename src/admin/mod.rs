//! The admin console (feature `admin`): what is stuck and why, and the dead letters to repair,
//! as JSON endpoints and one HTML page in an `actix-web` [`Scope`](actix_web::Scope) that the
//! application mounts on its own server.
//!
//! The application builds a [`Console`], gives it its parts explicitly, each under a name
//! (producers, consumers, work-pulling pools, projections, entity hosts, shard coordinators
//! and shard maps, TCP nodes, NATS carriers, the dead-letter store), and mounts
//! [`Console::scope`] in its `App`. Nothing is collected until a request asks: each
//! registration holds how to ask its part. The routes, the confirmation tokens of the writes
//! and the errors are listed at [`Console::scope`].
//!
//! **Authentication.** The console has none of its own by default: put the scope behind the
//! application's authentication (its middleware, an authenticating proxy), or require a bearer
//! token on every route with [`Console::require_bearer`]. Its replay and delete act on live
//! data: do not expose it unprotected.
//!
//! ```no_run
//! use actix_delivery::admin::Console;
//! use actix_delivery::dead_letters::{DeadLetterLimits, DeadLetters, MemoryDeadLetters};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//! use actix_web::{App, HttpServer};
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let dead_letters = DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default())?);
//!     let consumer = ReliableDelivery::consumer(
//!         ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
//!             println!("{order}");
//!             Ok::<(), std::io::Error>(())
//!         }))
//!         .keep_dead_letters(dead_letters.clone(), "orders")
//!         .build()?,
//!     );
//!     let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
//!
//!     let console = Console::new();
//!     console
//!         .dead_letters(&dead_letters)
//!         .producer("orders", &producer)
//!         .consumer("orders", &consumer)
//!         .require_bearer(&std::env::var("ADMIN_TOKEN")?)?;
//!     HttpServer::new(move || App::new().service(console.scope("/admin")))
//!         .bind(("127.0.0.1", 8080))?
//!         .run()
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! # What it shows for a stuck deployment
//!
//! The overview (`GET /overview`, and the top of the page) lists what needs attention, each
//! line naming the part:
//!
//! - a **durable stream** whose oldest unconfirmed message has waited longer than
//!   [`stuck_after`](Console::stuck_after) (30 s by default): how many are unconfirmed and
//!   for how long (its consumer is gone, refuses them, or never confirms), and its writes **in
//!   doubt** (a journal failure left open whether they committed; the next opening of the
//!   stream settles them);
//! - a **producer or consumer stalled**: messages in flight, or waiting for the handler, and
//!   none settled for that long (a hung handler, a lost consumer);
//! - a **work-pulling pool** with jobs and no worker;
//! - a **projection** stopped by a poison event (its error names the stream, seq and offset),
//!   or behind the journal by that long (with
//!   [`projection_with_lag`](Console::projection_with_lag));
//! - **shards without a live lease** (their owner died and no node took them yet);
//! - a **NATS carrier** that is not connected, and any part that no longer answers;
//! - the **dead letters** kept, by cause; each can be shown (its body decoded to JSON when it
//!   is MessagePack), replayed through its source's route (effectively once: see
//!   [`DeadLetters::replay`](crate::dead_letters::DeadLetters::replay)) or deleted.
//!
//! Below it, each section's table: producers (durable: unconfirmed, the oldest's age, in
//! doubt), consumers (tracked producers, waiting, dead letters by cause), pools, projections
//! (offset, lag in events and seconds, last error, state), entity hosts, coordinators and
//! shard maps (owner, token, time left on each lease, members), nodes (peers, connections,
//! refusals) and carriers.

mod confirm;
mod console;
mod error;
mod guard;
mod page;
mod routes;
mod views;

pub use console::Console;
