//! # The guide
//!
//! Chapters that explain how to use actix-delivery, each with compiled examples. The API reference
//! (the modules and types) states every rule and bound; the chapters say how the parts fit and
//! link to it. Read the first three in order; the others as you need them.
//!
//! 1. [Getting started](tutorial): a producer and a consumer, handlers, backpressure, errors,
//!    stopping.
//! 2. [Guarantees and limits](guarantees): what is promised, under which conditions, and what is
//!    not; trust.
//! 3. [Configuration](configuration): options, defaults, one settings file for a whole node.
//! 4. [Effectively once](effectively_once): persistent entities and the effectively-once consumer.
//! 5. [Durable producers and the outbox](durable_producers): nothing lost when the sender crashes;
//!    graceful stops; starts that fail.
//! 6. [Journals](journals): SQLite, PostgreSQL, backups.
//! 7. [Changing your types](schema_evolution): codecs, upcasters, rolling deploys, migrations.
//! 8. [Across processes over TCP](over_tcp): nodes, addresses, the three security modes.
//! 9. [Across processes over NATS](over_nats): subjects, queue groups, choosing a transport.
//! 10. [Large messages](large_messages): chunks.
//! 11. [Work pulling](work_pulling): one producer, a changing pool of workers.
//! 12. [Projections](projections): read models fed from the journal.
//! 13. [Sharding](sharding): many entities, on demand, over nodes.
//! 14. [Running in production](production): an actix-web service, metrics, tracing, trace
//!     contexts.
//! 15. [Testing](testing): virtual time, a journal that fails on demand, counters, crashes.
//! 16. [Upgrading without downtime](upgrades): rolling a deployment from one release to the
//!     next; the wire and storage formats.
//! 17. [Operating it](operations): dead letters kept and replayed, the inspector, the
//!     console.
//! 18. [How it works](how_it_works): the protocol, batching, the sans-IO core.
//!
//! What the library costs is measured in `benches/README.md` in the repository; what its tests
//! prove, in `tests/README.md`.

pub mod configuration;
pub mod durable_producers;
pub mod effectively_once;
pub mod guarantees;
pub mod how_it_works;
pub mod journals;
pub mod large_messages;
pub mod operations;
pub mod over_nats;
pub mod over_tcp;
pub mod production;
pub mod projections;
pub mod schema_evolution;
pub mod sharding;
pub mod testing;
pub mod tutorial;
pub mod upgrades;
pub mod work_pulling;
