//! The numeric settings of both controllers ([`ProducerConfig`], [`ConsumerConfig`]) and the
//! rules every settings struct of the crate follows: plain structs with the documented
//! defaults, loadable with serde, durations in milliseconds (`resend_timeout_ms = 500`), a
//! bound that can be lifted as a number or `"unbounded"` ([`Limit`]), every error naming its
//! key. They live in the sans-IO core, whose [`config`](actix_delivery_proto::config) module
//! states the rules in full.
//!
//! # One config tree
//!
//! Every settings struct of the crate follows these rules, so one file can configure a whole
//! node: [`ProducerConfig`], [`ConsumerConfig`],
//! [`PersistentConfig`](crate::persistence::PersistentConfig),
//! [`DurableConfig`](crate::durable::DurableConfig),
//! `SqliteConfig` (feature `sqlite`, on by default), `PostgresConfig` (feature `postgres`),
//! [`NodeConfig`](crate::tcp::NodeConfig) and `NatsConfig` (feature `nats`). Each takes
//! loaded values through its builder's `.config(…)`, and a value set on the builder wins over
//! a loaded one, which wins over the default, whatever order the calls come in (the journal
//! options are the loaded value itself: call their setters on it, after loading); what
//! breaks a rule is refused when the options are built (the journals: when they open),
//! naming the key.
//! `examples/node.toml` in the repository is such a file, with every section; an application
//! reads it into a struct of its own:
//!
//! ```
//! # use actix_delivery::{ConsumerConfig, ProducerConfig};
//! # use actix_delivery::durable::DurableConfig;
//! # use actix_delivery::journal::SqliteConfig;
//! # use actix_delivery::tcp::{NodeConfig, NodeOptions, NodeSecret};
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     #[serde(default)]
//!     producer: ProducerConfig,
//!     #[serde(default)]
//!     consumer: ConsumerConfig,
//!     #[serde(default)]
//!     sqlite: SqliteConfig,
//!     #[serde(default)]
//!     node: NodeConfig,
//!     #[serde(default)]
//!     durable: DurableConfig,
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
//! What is not data stays in code, set on the builders only: a node's secret or TLS
//! certificates and keys, its resolver, the PostgreSQL connection string (it holds a
//! password) and TLS, the NATS client (its credentials), a durable producer's journal, stream,
//! producer id, sink, message version and upcaster, and a persistent entity's versions. A
//! producer's `chunk_size` is set on its builder too, though it is a number: it needs
//! `T: Serialize + DeserializeOwned`, which a loaded configuration cannot promise.

pub use actix_delivery_proto::config::{
    Backoff, ConsumerConfig, Limit, ProducerConfig, MAX_DURATION,
};
// The core's checks and serde helpers, for the shells' own settings.
pub(crate) use actix_delivery_proto::config::*;
