//! Reliable, flow-controlled delivery between Actix actors: every message handled at least
//! once, retransmitted on loss, deduplicated, with backpressure and a confirmation per message;
//! effectively once with persistent entities and durable producers, across processes over TCP or
//! NATS.
//!
//! A [`ProducerController`] sends messages to a [`ConsumerController`]; the consumer runs your
//! handler for each new message and acknowledges (ACKs) it only when the handler returned `Ok`;
//! the producer retransmits until it gets the ACK and then tells you.
//!
//! ```text
//!  your code                ProducerController                 ConsumerController         your handler
//!  tell(body, confirm) ──▶  queue (≤ max_pending)
//!  send(body).await         window (≤ window_size in flight)
//!                           seq, incarnation ── Delivery ──▶   admission → dedup ──new──▶ handler(body)
//!                           retransmit every                         │ duplicate: re-ACK    │ Ok(())
//!                           resend_timeout                           ▼                      ▼
//!  confirm(Ok(())) ◀─────── ACK valid? ◀───────── Ack ──────────  record seq ◀──────────────┘
//! ```
//!
//! # Quick start
//!
//! ```
//! use actix_delivery::{ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
//!         println!("processing {order}");
//!         Ok::<(), std::io::Error>(()) // an Err here means "not done": no ACK, retried later
//!     }))
//!     .build()?,
//! );
//! let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
//!
//! // Fire and get called back exactly once ...
//! producer.tell("espresso".to_string(), |result: Result<(), DeliveryError>| {
//!     println!("confirmed: {result:?}");
//! })?;
//! // ... or await the confirmation (and wait for room when the queue is full).
//! producer.send("latte".to_string()).await?;
//! # Ok(()) }
//! ```
//!
//! Every message is handled by a successful handler run at least once or its confirmation says
//! why not; duplicates are suppressed while the consumer lives; each confirmation fires once;
//! memory is bounded whatever a peer sends. The full statement, and the limits to read before
//! relying on it, is [Guarantees and limits](guide::guarantees).
//!
//! # The guide
//!
//! The [`guide`] explains how to use each part, with compiled examples:
//! [getting started](guide::tutorial), [guarantees](guide::guarantees),
//! [configuration](guide::configuration), [effectively once](guide::effectively_once),
//! [durable producers](guide::durable_producers), [journals](guide::journals),
//! [changing your types](guide::schema_evolution), [TCP](guide::over_tcp),
//! [NATS](guide::over_nats), [large messages](guide::large_messages),
//! [work pulling](guide::work_pulling), [projections](guide::projections),
//! [sharding](guide::sharding), [production](guide::production), [testing](guide::testing),
//! [how it works](guide::how_it_works).
//!
//! # The crate
//!
//! | path | what |
//! |---|---|
//! | the root | in-process delivery: [`ReliableDelivery`] starts every kind of producer and consumer; options, handles, messages, errors |
//! | [`journal`] | durable, fenced streams of events: SQLite, PostgreSQL, memory |
//! | [`persistence`] | event-sourced entities and the effectively-once consumer; the outbox |
//! | [`durable`] | producers that store each message before sending it |
//! | [`tcp`] | delivery between processes over TCP: nodes, security modes, wire format |
//! | `nats` | delivery through a NATS server (feature `nats`) |
//! | [`work_pulling`] | one producer, a changing pool of workers |
//! | [`projection`] | read models fed from the journal by tag |
//! | [`sharding`] | entities hosted on demand, shards owned through leases |
//! | [`codec`] | the codecs, manifests and upcasters of everything stored or sent |
//! | [`shutdown`] | stopping a whole application in order, within one deadline, on SIGTERM |
//! | [`dead_letters`] | what parts gave up or refused, kept, listed and replayed effectively once |
//! | `admin` | the operations console mounted in the application's actix-web server (feature `admin`) |
//! | `telemetry` | the names of every metric and span (features `metrics`, `tracing`) |
//!
//! The rules themselves are pure state machines in the `actix-delivery-proto` crate, which this
//! crate's actors drive ([How it works](guide::how_it_works)).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | on | `journal::SqliteJournal` and `projection::SqliteReadModel`: SQLite compiled in (`rusqlite`, bundled), no server |
//! | `postgres` | off | `journal::PostgresJournal`, `projection::PostgresReadModel`, `sharding::PostgresLeaseStore`: one database shared by the nodes |
//! | `nats` | off | the `nats` module: delivery through a NATS server |
//! | `tls` | off | TLS 1.3 on the TCP transport (`tcp::NodeTls`), and with `postgres` to PostgreSQL |
//! | `metrics` | off | every stats counter and the latency histograms through the `metrics` facade (`telemetry::metrics`) |
//! | `tracing` | off | `tracing` spans (`telemetry::spans`) |
//! | `admin` | off | `admin::Console`: JSON endpoints and one HTML page in an actix-web `Scope` the application mounts: stuck durable streams, consumers, pools, projections, the shard map, nodes and carriers; dead letters replayed and deleted with a confirmation token |
//!
//! An application whose nodes share PostgreSQL compiles no SQLite with
//! `actix-delivery = { version = "0.1", default-features = false, features = ["postgres"] }`;
//! [`journal::MemoryJournal`] and every in-process and TCP part need no feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod codec;
mod config;
mod delivery;
pub mod dead_letters {
    //! Dead letters that are kept: what a part gave up or refused, with its body, where it came
    //! from and why, in a bounded store that an operator lists, replays and deletes entries of.
    //!
    //! - **What is kept.** A [`NewDeadLetter`]: the body as stored bytes with its
    //!   [`Manifest`](crate::codec::Manifest), the source (a [`SourceKind`] and the name the part
    //!   was given), a stable key, the message's delivery id where it had one, the
    //!   [`DeadLetterCause`], the attempts and the last error. A second letter of the same source
    //!   and key updates the first entry.
    //! - **Bounds.** [`DeadLetterLimits`]: entries and bytes, the longest body kept, and the
    //!   sampling of floods: of what a peer sent (undecodable, incompatible, malformed) a source
    //!   keeps a burst, then one per interval, and counts the rest. Beyond the bounds, the
    //!   oldest entries a peer's input caused are dropped first (counted), then the oldest: a
    //!   peer's flood replaces its own entries, and takes of the give-ups of this process's
    //!   parts at most the room of one entry without its body (see [`DeadLetterStore`]).
    //! - **Stores.** [`MemoryDeadLetters`]; `SqliteDeadLetters` and `PostgresDeadLetters` keep
    //!   them in their journal's database, in a table of their own (adding it raises no schema
    //!   version). Every [`DeadLetterStore`] is held to the same rules by one conformance suite.
    //! - **The handle.** [`DeadLetters`] wraps a store: parts [`record`](DeadLetters::record)
    //!   into it, the application lists, gets, deletes and [`replay`](DeadLetters::replay)s.
    //! - **Replay, effectively once.** A route per source ([`DeadLetters::on_replay`]) sends the
    //!   decoded body to its destination under the entry's stable replay id ([`Replay::info`]).
    //!   The entry is removed once the route resolved. A replay repeated after a crash between
    //!   the two is recognised by an effectively-once destination: nothing is applied twice.
    //!
    //! ```
    //! use actix_delivery::dead_letters::{
    //!     DeadLetterCause, DeadLetterFilter, DeadLetterLimits, DeadLetters, MemoryDeadLetters,
    //!     NewDeadLetter, Replayed, SourceKind,
    //! };
    //! use actix_delivery::codec::{Codec, Manifest};
    //!
    //! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    //! let dead_letters = DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default())?);
    //! let body = Codec::MessagePack.encode(&42u32, 1024)?;
    //! dead_letters
    //!     .keep(NewDeadLetter {
    //!         kind: SourceKind::WorkPulling,
    //!         source: "jobs".into(),
    //!         cause: DeadLetterCause::GivenUp,
    //!         key: "job-7".into(),
    //!         origin: None,
    //!         manifest: Manifest::new(Codec::MessagePack, "u32", 1),
    //!         body_len: body.len() as u64,
    //!         body: Some(body),
    //!         attempts: 3,
    //!         error: "no worker confirmed it".into(),
    //!     })
    //!     .await?;
    //! dead_letters.on_replay("jobs", |replay: actix_delivery::dead_letters::Replay<u32>| async move {
    //!     assert_eq!(replay.body, 42);
    //!     Ok(Replayed::Applied)
    //! });
    //! let page = dead_letters.list(DeadLetterFilter::default()).await?;
    //! assert_eq!(dead_letters.replay(page.entries[0].id).await?, Replayed::Applied);
    //! assert_eq!(dead_letters.counts().await?.entries, 0);
    //! # Ok(()) }
    //! ```

    pub use actix_delivery_proto::delivery::dead_letters::*;

    pub use crate::delivery::dead_letter_handle::{
        DeadLetterStats, DeadLetters, Replay, ReplayFuture, Replayed, RouteError, MAX_RECORDING,
    };
    pub use crate::delivery::dead_letter_store::{
        DeadLetterError, DeadLetterFuture, DeadLetterStore, MemoryDeadLetters,
    };
}
pub mod durable;
mod error;
mod facade;
pub mod guide;
pub mod journal;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
pub mod persistence;
pub mod projection;
pub(crate) use actix_delivery_proto::protocol;
mod runtime;
pub mod sharding;
pub use runtime::shutdown;
pub mod tcp;
#[cfg(any(feature = "metrics", feature = "tracing"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "metrics", feature = "tracing"))))]
pub mod telemetry;
pub mod work_pulling;

pub use actix_delivery_proto::config::{
    Backoff, ConsumerConfig, Limit, ProducerConfig, MAX_DURATION,
};
pub use actix_delivery_proto::error::{
    DeliveryError, Failure, Happened, OptionsError, StartError, TellError,
};
pub use delivery::confirmation::Confirmation;
pub use delivery::consumer::{ConsumerController, ConsumerHandle};
pub use delivery::dead_letter::DeadLetter;
pub use delivery::handler::DeliveryHandler;
pub use delivery::message::{
    Acks, ChunkDeliveries, ChunkDelivery, ConsumerRef, Deliveries, Delivery, GetConsumerStats,
    GetOutOfOrder, GetProducerStats, ReplyTo, SingleAck, StopConsumer, StopProducer, Tell,
};
pub use delivery::options::{
    ConsumerOptions, ConsumerOptionsBuilder, ProducerOptions, ProducerOptionsBuilder,
    MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};
pub use delivery::producer::{ProducerController, ProducerHandle};
pub use facade::ReliableDelivery;
pub use protocol::chunk::ChunkHeader;
pub use protocol::consumer::ConsumerStats;
pub use protocol::envelope::{
    Ack, DeadLetterReason, DeliveryInfo, Header, Incarnation, IncarnationId, ProducerId,
    MAX_ID_BYTES, MAX_SEQ,
};
pub use protocol::producer::ProducerStats;
pub use protocol::trace_context::TraceContext;

// The README's examples are compiled (and run) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
