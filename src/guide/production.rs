//! # Running in production
//!
//! `examples/actix_web.rs` in the repository is an order service run the way production services
//! are (`cargo run --example actix_web --features metrics`); this chapter walks through what it
//! does and the telemetry it relies on.
//!
//! ## An actix-web service
//!
//! - `POST /orders` stores the order through a [durable producer](super::durable_producers)
//!   (`store_timeout`) and answers `202 Accepted` once it is stored. An error answers by
//!   [`DeliveryError::happened()`](crate::DeliveryError::happened): an order certainly not stored
//!   (no room within a second, the journal failed, the producer stopping) gets `503` with
//!   `Retry-After` (backpressure reaches HTTP: the client may retry), one in doubt `500` (stored or
//!   not, the next start settles it: a blind retry could store it twice). A persistent ledger
//!   behind an effectively-once consumer applies every stored order exactly once.
//! - `/health` (both handles answer), `/ready` (not draining, the producer's stream open, the
//!   ledger recovered, the journal answers a read), `/stats` (the handles' counters as JSON),
//!   `/metrics` (Prometheus text).
//! - SIGTERM drains: `/ready` turns 503 and new orders are refused, the HTTP server finishes the
//!   requests it has, `idle()` waits (with a deadline) until the ledger confirmed what is stored,
//!   then producer and ledger `stop()` gracefully and the process exits 0.
//!
//! ## Stopping gracefully
//!
//! A [`Shutdown`](crate::shutdown::Shutdown) stops the parts of an application in order within
//! one deadline, on SIGTERM or SIGINT or when asked: each part is registered in its
//! [`Phase`](crate::shutdown::Phase) (readiness off, new work refused, work in flight drained,
//! then producers, consumers and entities, projections, the cluster's coordinators, nodes and
//! carriers, journals), the tasks of a phase run at once, and the run returns a report of what
//! became of each. The example registers its HTTP server's stop, its drain, its producer and
//! its ledger; in short:
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_delivery::shutdown::{Phase, Shutdown};
//! # use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let shutdown = Shutdown::new(Duration::from_secs(25))?; // under the orchestrator's grace period
//! let signalled = shutdown.on_signals()?; // first, so that a signal during the start counts
//! # let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(
//! #     DeliveryHandler::from_fn(|_: String| async { Ok::<(), std::io::Error>(()) })).build()?);
//! let orders = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
//! let ready = shutdown.watch(); // `is_shutting_down()` from any thread: readiness, intake
//! let idle = orders.clone();
//! shutdown.add_task(Phase::Drain, "orders confirmed", move || async move {
//!     tokio::time::timeout(Duration::from_secs(10), idle.idle())
//!         .await
//!         .map_err(|_| "drain deadline passed".to_owned())
//! });
//! shutdown.add(Phase::Producers, "orders", &orders);
//! shutdown.add(Phase::Entities, "ledger consumer", &consumer);
//! # let _ = ready;
//! let report = signalled.await; // at SIGTERM: every phase run, or cut by the deadline
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! A phase starts once every task of the one before ended; a task that fails or panics is
//! reported with its reason and the run goes on; the deadline times out the tasks of the phase
//! it cuts, and the tasks of the phases after it are begun (their parts asked to stop) without
//! waiting: what they had not finished ends with the process (a durable producer's unconfirmed
//! messages stay in its journal). Every handle of this crate that stops gracefully implements
//! [`GracefulStop`](crate::shutdown::GracefulStop): producers of each kind, consumers,
//! entities, projections, entity hosts, shard coordinators, nodes and carriers. A journal
//! closes when its last handle is dropped.
//!
//! ## Metrics (feature `metrics`)
//!
//! Every counter of every stats struct (producer, consumer, durable producer, persistent entity,
//! journals, node, NATS carrier, projection, entity host, shard coordinator, sharded producer)
//! goes through the [`metrics`](https://docs.rs/metrics/0.24) facade to whatever recorder the
//! application installed, named `actix_delivery_<part>_<counter>_total`, with gauges (in flight,
//! queued, unconfirmed, open connections) and histograms (send → confirm, handler run, journal
//! commit time and size, frames and bytes per socket write). Install the recorder before starting
//! the parts it measures. Labels are only names the application chose (a consumer's `name`,
//! `metrics_label` on the other builders, a producer's id, an entity's type), never peer-supplied
//! ids. Producers and consumers publish at most every 10 ms, and the two per-message histograms
//! take at most one sample every 10 ms each, so their cost stays flat under load.
//! `telemetry::metrics` lists every name, type, label and meaning. Without the feature, none
//! of it is compiled in. A scrape of the example after 200 orders:
//!
//! ```text
//! actix_delivery_producer_stored_total{producer="orders-api"} 201
//! actix_delivery_producer_confirmed_total{producer="orders-api"} 201
//! actix_delivery_consumer_delivered_total{consumer="ledger"} 201
//! actix_delivery_persistent_events_total{entity="actix_web::Ledger"} 201
//! actix_delivery_sqlite_transactions_total{journal="default"} 324
//! actix_delivery_producer_confirm_seconds{producer="orders-api",quantile="0.5"} 0.005170943962275159
//! actix_delivery_consumer_handler_seconds{consumer="ledger",quantile="0.5"} 0.000007635515952695077
//! actix_delivery_sqlite_commit_seconds{journal="default",quantile="0.5"} 0.0006186938289938524
//! ```
//!
//! ## Tracing (feature `tracing`)
//!
//! The crate opens `tracing` spans for handler runs (with the consumer's name, producer id and seq
//! as fields), journal commits, recoveries, TCP connections and handshakes, and NATS
//! subscriptions; `telemetry::spans` lists their names and fields. The crate's `log` records stay
//! `log` records either way.
//!
//! ## Trace contexts
//!
//! A message can carry the trace it was sent in, so that a trace follows it from `send` to its
//! handler, also on another node. This needs no feature. Give the producer a hook,
//! [`ProducerOptionsBuilder::trace_context`](crate::ProducerOptionsBuilder::trace_context), that
//! reads the current context (say, from OpenTelemetry) as a
//! [`TraceContext`](crate::TraceContext) (the W3C `traceparent`); it is called at `tell`, `send`
//! and `store` time, and the handler reads the context from
//! [`DeliveryInfo::trace_context`](crate::DeliveryInfo::trace_context) (with the `tracing` feature
//! it is also the handler span's `traceparent` field):
//!
//! ```
//! use actix_delivery::{
//!     ConsumerOptions, DeliveryHandler, DeliveryInfo, ProducerOptions, ReliableDelivery, TraceContext,
//! };
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn_with_info(
//!         |info: DeliveryInfo, order: u64| async move {
//!             let parent = info.trace_context.map(|context| context.to_traceparent());
//!             println!("order {order}, sent in {parent:?}");
//!             Ok::<(), std::io::Error>(())
//!         },
//!     ))
//!     .build()?,
//! );
//! let producer = ReliableDelivery::producer(
//!     ProducerOptions::builder(&consumer)
//!         .trace_context(|| {
//!             TraceContext::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
//!         })
//!         .build()?,
//! );
//! producer.send(7).await?;
//! # Ok(()) }
//! ```
//!
//! A message without a context costs one byte on the wire and allocates nothing; a context is 25
//! bytes more. Contexts are not stored: a message a durable producer sends again after a restart
//! has none.
