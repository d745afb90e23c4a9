//! # Across processes over NATS (feature `nats`)
//!
//! A `nats::NatsCarrierHandle` per process carries the same deliveries and ACKs through a NATS
//! server: consumers are found by subject instead of by address, and a queue group lets several
//! processes share a consumer and take over from each other. NATS core delivers at most once;
//! the protocol on top makes it at-least-once, and with a persistent consumer effectively-once.
//!
//! ```toml
//! actix-delivery = { version = "0.1", features = ["nats"] }
//! ```
//!
//! This example needs a NATS server on 127.0.0.1:4222:
//!
//! ```no_run
//! # #[cfg(feature = "nats")]
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(DeliveryHandler::from_fn(
//! #     |_: String| async { Ok::<(), std::io::Error>(()) })).build()?);
//! let carrier = NatsCarrierHandle::connect("nats://127.0.0.1:4222", NatsOptions::default()).await?;
//! // Workers (any number of processes): one member each of the queue group.
//! carrier.expose_in_group("shop.orders", "order-workers", &consumer).await?;
//! // Producers: a ConsumerRef for the subject, for an unchanged producer.
//! let orders = carrier.consumer_ref::<String>("shop.orders")?;
//! let producer = ReliableDelivery::producer(ProducerOptions::builder(orders).build()?);
//! producer.send("espresso".to_string()).await?; // handled and ACKed by one member
//! # Ok(()) }
//! # #[cfg(not(feature = "nats"))] fn main() {}
//! ```
//!
//! `cargo run --features nats --example nats` runs two workers of a queue group as child
//! processes and a producer; one worker is SIGKILLed, the other takes over, and every order is
//! confirmed (`NATS_URL` names the server).
//!
//! - **Credentials and TLS are NATS's own**: connect an `async_nats::Client` with credentials and
//!   TLS and pass it to `NatsCarrierHandle::with_client`; the `nats` module's "Security" says
//!   which server permissions to restrict.
//! - **Queue groups** share a consumer's load, and a member that dies has its unACKed messages
//!   retransmitted to a live one. Each member's duplicate filter sees only its share of a
//!   producer's stream, so a retransmission that reaches another member runs again. For
//!   effectively once across members, give each member a
//!   [persistent consumer](super::effectively_once) of the same entity on a shared PostgreSQL
//!   journal: the journal's record answers the second copy, and its fence decides between two
//!   members writing at once.
//! - **Reconnection is the client's**; while the server is away the carrier drops what does not
//!   fit its bounded output (counted) and the producers retransmit it all.
//! - The `nats` module documents the wire format, what is untrusted and every bound.
//!
//! ## Choosing a transport
//!
//! - **TCP** ([Across processes over TCP](super::over_tcp)): a few nodes that know each other's
//!   addresses, no server to run, the lowest latency, authentication built in.
//! - **NATS**: many nodes, consumers found by subject, load sharing and failover by queue group,
//!   one server (cluster) to run. Persistence stays this library's (journals), not the server's.
//! - **A broker with its own persistence** (JetStream, Kafka, RabbitMQ): when messages must
//!   outlive both sides' journals, be replayed by consumers that join later, or fan out to many
//!   independent readers; the durable producer and persistent consumer then add nothing the
//!   broker does not give.
