//! # Configuration
//!
//! Every part is started from options built in code; their numeric settings are plain serde
//! structs that an application loads from its own configuration file.
//!
//! ## The rules
//!
//! - Options are validated when they are built; an invalid value is an
//!   [`OptionsError`](crate::OptionsError) naming the key, what was found and what is expected.
//! - `…Config` is what a settings file holds (serde, unknown keys refused, durations in `…_ms`);
//!   `…Options` is what code builds around it, with what no file holds (references, callbacks,
//!   placement, secrets).
//! - Each options builder takes a loaded config through `.config(loaded)`. A value set on the
//!   builder wins over a loaded one, which wins over the default, whatever order the calls come
//!   in.
//!
//! The configs: [`ProducerConfig`](crate::ProducerConfig),
//! [`ConsumerConfig`](crate::ConsumerConfig),
//! [`PersistentConfig`](crate::persistence::PersistentConfig),
//! [`DurableConfig`](crate::durable::DurableConfig), `journal::SqliteConfig` (feature `sqlite`, on
//! by default), `journal::PostgresConfig` (feature `postgres`),
//! [`NodeConfig`](crate::tcp::NodeConfig), `nats::NatsConfig` (feature `nats`), and those of work
//! pulling, projections and sharding in their modules.
//!
//! ## Producer and consumer settings
//!
//! | producer option | default | consumer option | default |
//! |---|---|---|---|
//! | `window_size` | 16 | `max_producers` | 1024 (or unbounded) |
//! | `resend_timeout` | 500 ms | `producer_idle_ttl` | 300 s (or unbounded: never) |
//! | `producer_id` | `producer-` + 16 random hex digits | `max_out_of_order` | 1024 (or unbounded) |
//! | `max_pending` | 100 000 | `ordered` | false |
//! | `max_attempts` | unbounded | `handler_timeout` | 30 s (or unbounded: never) |
//! | `backoff` | fixed | dead-letter sink | none |
//! | `chunk_size` | none (whole messages) | `max_message_bytes` | 64 MiB |
//! | | | `max_reassembly_bytes` | 256 MiB |
//! | | | `reassembly_grace` | 5 s |
//! | | | `min_reassembly_rate` | 1 MiB/s |
//!
//! Keep `producer_idle_ttl` well above the longest gap between a producer's retransmissions:
//! `resend_timeout`, or with exponential backoff up to `backoff.max`. A window swept while its
//! producer still retransmits costs a duplicate handler run.
//!
//! ## One file for a whole node
//!
//! `examples/node.toml` in the repository configures a whole node, every section, and says what
//! stays in code. An application reads such a file into a struct of its own:
//!
//! ```
//! # use actix_delivery::ProducerConfig;
//! # use actix_delivery::tcp::{NodeConfig, NodeOptions, NodeSecret};
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     #[serde(default)]
//!     producer: ProducerConfig,
//!     #[serde(default)]
//!     node: NodeConfig,
//!     // … one field per section: consumer, durable, sqlite, nats, …
//! }
//!
//! let settings: Settings = toml::from_str(r#"
//!     [producer]
//!     window_size = 64
//!     [node]
//!     listen = "127.0.0.1:7400"
//!     idle_timeout_ms = 5000
//! "#).unwrap();
//! let node = NodeOptions::builder()
//!     .secret(NodeSecret::new([7; 32]).unwrap()) // a secret is code, never data
//!     .config(settings.node)
//!     .build()
//!     .unwrap();
//! assert_eq!(node.config().idle_timeout, std::time::Duration::from_secs(5));
//! assert_eq!(settings.producer.window_size, 64);
//! ```
//!
//! What is not data stays in code, set on the builders only: a node's secret or TLS certificates
//! and keys, its resolver, the PostgreSQL connection string (it holds a password) and TLS, the
//! NATS client (its credentials), a durable producer's journal, stream, producer id, sink, message
//! version and upcaster, and a persistent entity's versions. A producer's `chunk_size` is set on
//! its builder too, though it is a number: it needs `T: Serialize + DeserializeOwned`, which a
//! loaded configuration cannot promise.
