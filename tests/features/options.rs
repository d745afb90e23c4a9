//! Builders validate at construction and apply explicit > loaded > default; every settings
//! section loads through serde, and `examples/node.toml` configures a whole node.

use std::time::Duration;

use actix_delivery::codec::Codec;
use actix_delivery::durable::DurableConfig;
use actix_delivery::journal::{SqliteConfig, SqliteJournal, SqliteOptions};
use actix_delivery::persistence::PersistentConfig;
use actix_delivery::tcp::{NodeConfig, NodeOptions, NodeSecret};
use actix_delivery::{
    Backoff, ConsumerConfig, ConsumerOptions, DeliveryHandler, Limit, ProducerConfig,
    ProducerOptions, ReliableDelivery,
};

fn handler() -> DeliveryHandler<u32> {
    DeliveryHandler::from_fn(|_: u32| async { Ok::<(), String>(()) })
}

#[actix::test]
async fn producer_builder_takes_explicit_over_loaded_over_default_in_any_order() {
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler()).build().unwrap());
    let loaded: ProducerConfig =
        serde_json::from_str(r#"{"window_size": 64, "resend_timeout_ms": 250}"#).unwrap();
    let options = ProducerOptions::builder(consumer.recipient())
        .window_size(8) // explicit, set before loading
        .config(loaded)
        .build()
        .unwrap();
    let config = options.config();
    assert_eq!(config.window_size, 8, "explicit wins");
    assert_eq!(
        config.resend_timeout,
        Duration::from_millis(250),
        "loaded wins over default"
    );
    assert_eq!(config.max_pending, 100_000, "default");
}

#[actix::test]
async fn invalid_producer_options_fail_at_build_naming_the_field() {
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler()).build().unwrap());
    let build = |b: actix_delivery::ProducerOptionsBuilder<u32>| b.build().unwrap_err();
    let r = || ProducerOptions::builder(consumer.recipient());
    assert_eq!(build(r().window_size(0)).field, "window_size");
    assert_eq!(
        build(r().resend_timeout(Duration::ZERO)).field,
        "resend_timeout_ms",
        "the settings key"
    );
    assert_eq!(build(r().producer_id("")).field, "producer_id");
    assert_eq!(build(r().producer_id("x".repeat(257))).field, "producer_id");
    assert_eq!(build(r().max_pending(0)).field, "max_pending");
    assert_eq!(build(r().max_attempts(0)).field, "max_attempts");
    let err = build(r().producer_id("x".repeat(257)));
    assert_eq!(
        err.to_string(),
        "invalid option `producer_id`: the producer id is 257 bytes, more than the 256 allowed"
    );
    assert!(r().producer_id("x".repeat(256)).build().is_ok());
    let plain = ProducerConfig {
        window_size: 0,
        ..Default::default()
    };
    assert_eq!(
        ProducerOptions::builder(consumer.recipient())
            .config(plain)
            .build()
            .unwrap_err()
            .field,
        "window_size"
    );
}

#[actix::test]
async fn consumer_builder_validates_and_merges_the_same_way() {
    let loaded: ConsumerConfig =
        serde_json::from_str(r#"{"max_producers": 10, "ordered": true}"#).unwrap();
    let options = ConsumerOptions::builder(handler())
        .config(loaded)
        .max_out_of_order(Limit::Unbounded)
        .build()
        .unwrap();
    let config = options.config();
    assert_eq!(config.max_producers, Limit::At(10));
    assert!(config.ordered);
    assert_eq!(config.max_out_of_order, Limit::Unbounded);
    assert_eq!(
        config.producer_idle_ttl,
        Limit::At(Duration::from_secs(300))
    );

    let err = |b: actix_delivery::ConsumerOptionsBuilder<u32>| b.build().unwrap_err().field;
    assert_eq!(
        err(ConsumerOptions::builder(handler()).max_producers(0)),
        "max_producers"
    );
    assert_eq!(
        err(ConsumerOptions::builder(handler()).producer_idle_ttl(Duration::ZERO)),
        "producer_idle_ttl_ms"
    );
    assert_eq!(
        err(ConsumerOptions::builder(handler()).handler_timeout(Duration::ZERO)),
        "handler_timeout_ms"
    );
    let never = ConsumerOptions::builder(handler())
        .handler_timeout(Limit::Unbounded)
        .build()
        .unwrap();
    assert_eq!(never.config().handler_timeout, Limit::Unbounded);
    assert_eq!(
        err(ConsumerOptions::builder(handler()).max_out_of_order(0)),
        "max_out_of_order"
    );
}

/// The sections of `examples/node.toml`, as an application reads them into the crate's types.
#[derive(Debug, serde::Deserialize)]
struct NodeFile {
    producer: ProducerConfig,
    consumer: ConsumerConfig,
    persistence: PersistentConfig,
    journal: JournalSections,
    node: NodeConfig,
    #[cfg(feature = "nats")]
    nats: actix_delivery::nats::NatsConfig,
    durable: DurableConfig,
}

#[derive(Debug, serde::Deserialize)]
struct JournalSections {
    sqlite: SqliteConfig,
    #[cfg(feature = "postgres")]
    postgres: actix_delivery::journal::PostgresConfig,
}

const NODE_TOML: &str = include_str!("../../examples/node.toml");

#[test]
fn the_example_node_file_loads_into_every_section_with_its_values() {
    let file: NodeFile = toml::from_str(NODE_TOML).unwrap();
    let ms = Duration::from_millis;
    assert_eq!(
        file.producer,
        ProducerConfig {
            window_size: 64,
            resend_timeout: ms(250),
            max_pending: 10_000,
            max_attempts: Limit::Unbounded,
            backoff: Backoff::Exponential {
                multiplier: 2.0,
                max: ms(4000),
                jitter: 0.2
            },
            ..ProducerConfig::default()
        }
    );
    assert_eq!(
        file.consumer,
        ConsumerConfig {
            max_producers: Limit::At(4096),
            producer_idle_ttl: Limit::At(ms(600_000)),
            max_out_of_order: Limit::At(1024),
            ordered: false,
            handler_timeout: Limit::At(ms(10_000)),
            max_message_bytes: 64 << 20,
            max_reassembly_bytes: 256 << 20,
            reassembly_grace: ms(5000),
            min_reassembly_rate: 1 << 20,
        }
    );
    assert_eq!(
        file.persistence,
        PersistentConfig {
            snapshot_every: Some(500),
            delete_events_on_snapshot: true,
            max_pending_commands: 10_000,
            max_pending_bytes: 64 << 20,
            must_follow: true,
            stop_timeout: ms(5000),
            codec: Codec::MessagePack,
            ..PersistentConfig::default()
        }
    );
    assert_eq!(
        file.journal.sqlite,
        SqliteConfig {
            max_batch_events: 5000,
            max_batch_bytes: 8 << 20,
            queue_capacity: 4096,
            readers: 2,
            busy_timeout: ms(2000),
            max_size_bytes: None,
            ..SqliteConfig::default()
        }
    );
    #[cfg(feature = "postgres")]
    assert_eq!(
        file.journal.postgres,
        actix_delivery::journal::PostgresConfig {
            schema: "orders".into(),
            create_tables: true,
            readers: 4,
            commit_timeout: ms(10_000),
            connect_timeout: ms(3000),
            reconnect_min: ms(50),
            reconnect_max: ms(2000),
            ..actix_delivery::journal::PostgresConfig::default()
        }
    );
    assert_eq!(
        file.node,
        NodeConfig {
            listen: Some("127.0.0.1:7400".parse().unwrap()),
            max_frame_length: 1 << 20,
            max_output_bytes: 8 << 20,
            max_connections: 128,
            max_handshakes: 32,
            max_routes: 1024,
            handshake_timeout: ms(3000),
            connect_timeout: ms(3000),
            heartbeat_interval: ms(500),
            idle_timeout: ms(5000),
            reconnect_min: ms(100),
            reconnect_max: ms(5000),
            wire_version: 4,
        }
    );
    #[cfg(feature = "nats")]
    assert_eq!(
        file.nats,
        actix_delivery::nats::NatsConfig {
            max_frame_length: 1 << 20,
            max_output_bytes: 4 << 20,
            max_routes: 2048,
            reply_prefix: "_INBOX.".into(),
            wire_version: 4,
        }
    );
    assert_eq!(
        file.durable,
        DurableConfig {
            snapshot_every: 2000,
            stop_timeout: ms(5000),
            codec: Codec::MessagePack,
            lease: Some(ms(15000)),
        }
    );
    // Every section is valid as it stands.
    file.producer.validate().unwrap();
    file.consumer.validate().unwrap();
    file.persistence.validate().unwrap();
    file.node.validate().unwrap();
    file.durable.validate().unwrap();
    file.journal.sqlite.validate().unwrap();
    #[cfg(feature = "postgres")]
    file.journal.postgres.validate().unwrap();
    #[cfg(feature = "nats")]
    file.nats.validate().unwrap();
}

/// The error of reading `toml` as a `C`.
fn toml_error<C: serde::de::DeserializeOwned + std::fmt::Debug>(toml: &str) -> String {
    toml::from_str::<C>(toml).unwrap_err().to_string()
}

#[test]
fn a_wrong_value_in_each_new_section_names_its_key_what_was_found_and_what_is_expected() {
    let cases = [
        (
            toml_error::<NodeConfig>("idle_timeout_ms = \"soon\""),
            "invalid type: string \"soon\", expected for `idle_timeout_ms` a whole number of \
             milliseconds",
        ),
        (
            toml_error::<NodeConfig>("reconnect_max_ms = -1"),
            "invalid value: integer `-1`, expected for `reconnect_max_ms` a whole number of \
             milliseconds",
        ),
        (
            toml_error::<NodeConfig>("max_connections = \"many\""),
            "max_connections = \"many\"",
        ),
        (
            toml_error::<NodeConfig>("listen = \"nowhere\""),
            "listen = ",
        ),
        (
            toml_error::<NodeConfig>("max_conections = 3"),
            "unknown field `max_conections`",
        ),
        (
            toml_error::<SqliteConfig>("busy_timeout_ms = 1.5"),
            "invalid type: floating point `1.5`, expected for `busy_timeout_ms` a whole number \
             of milliseconds",
        ),
        (
            toml_error::<SqliteConfig>("max_size_bytes = \"huge\""),
            "invalid value: string \"huge\", expected for `max_size_bytes` a whole number from \
             0 to 18446744073709551615 or \"unbounded\"",
        ),
        (toml_error::<SqliteConfig>("readers = -2"), "readers = -2"),
        (
            toml_error::<DurableConfig>("stop_timeout_ms = \"10s\""),
            "invalid type: string \"10s\", expected for `stop_timeout_ms` a whole number of \
             milliseconds",
        ),
        (
            toml_error::<DurableConfig>("codec = \"json\""),
            "codec = \"json\"",
        ),
        (
            toml_error::<NodeFile>(&NODE_TOML.replace(
                "heartbeat_interval_ms = 500",
                "heartbeat_interval_ms = \"often\"",
            )),
            "expected for `heartbeat_interval_ms` a whole number of milliseconds",
        ),
    ];
    for (error, expected) in cases {
        assert!(
            error.contains(expected),
            "{error}\n  does not contain\n{expected}"
        );
    }
}

#[cfg(feature = "postgres")]
#[test]
fn a_wrong_value_in_the_postgres_section_names_its_key() {
    use actix_delivery::journal::PostgresConfig;
    let error = toml_error::<PostgresConfig>("commit_timeout_ms = \"long\"");
    assert!(
        error.contains("expected for `commit_timeout_ms` a whole number of milliseconds"),
        "{error}"
    );
    let error = toml_error::<PostgresConfig>("tls = true");
    assert!(
        error.contains("unknown field `tls`"),
        "TLS is code: {error}"
    );
}

#[cfg(feature = "nats")]
#[test]
fn a_wrong_value_in_the_nats_section_names_its_key_and_the_builder_wins() {
    use actix_delivery::nats::{NatsConfig, NatsOptions};
    let error = toml_error::<NatsConfig>("max_routes = \"all\"");
    assert!(error.contains("max_routes = \"all\""), "{error}");
    let loaded: NatsConfig = toml::from_str("max_routes = 10\nreply_prefix = \"_R.\"").unwrap();
    let options = NatsOptions::builder()
        .max_routes(20) // explicit, set before loading
        .config(loaded)
        .build()
        .unwrap();
    assert_eq!(options.config().max_routes, 20, "explicit wins");
    assert_eq!(
        options.config().reply_prefix,
        "_R.",
        "loaded wins over default"
    );
    let bad: NatsConfig = toml::from_str("max_routes = 0").unwrap();
    let error = NatsOptions::builder().config(bad).build().unwrap_err();
    assert_eq!(error.field, "max_routes");
}

#[test]
fn node_builder_takes_explicit_over_loaded_over_default_and_validates_loaded_values() {
    let secret = || NodeSecret::new([7; 32]).unwrap();
    let loaded: NodeConfig =
        toml::from_str("max_connections = 10\nheartbeat_interval_ms = 200").unwrap();
    let options = NodeOptions::builder()
        .max_connections(20) // explicit, set before loading
        .secret(secret())
        .config(loaded)
        .build()
        .unwrap();
    let config = options.config();
    assert_eq!(config.max_connections, 20, "explicit wins");
    assert_eq!(
        config.heartbeat_interval,
        Duration::from_millis(200),
        "loaded"
    );
    assert_eq!(config.idle_timeout, Duration::from_secs(10), "default");
    let cases = [
        (
            "idle_timeout_ms = 100\nheartbeat_interval_ms = 100",
            "idle_timeout_ms",
        ),
        (
            "reconnect_min_ms = 10\nreconnect_max_ms = 5",
            "reconnect_max_ms",
        ),
        ("handshake_timeout_ms = 0", "handshake_timeout_ms"),
        ("max_handshakes = 0", "max_handshakes"),
        ("max_frame_length = 100", "max_frame_length"),
    ];
    for (toml, field) in cases {
        let loaded: NodeConfig = toml::from_str(toml).unwrap();
        let error = NodeOptions::builder()
            .secret(secret())
            .config(loaded)
            .build()
            .unwrap_err();
        assert_eq!(error.field, field, "{toml}: {error}");
    }
}

#[test]
fn invalid_loaded_journal_settings_are_refused_when_the_options_are_built_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let loaded: SqliteConfig = toml::from_str("readers = 0").unwrap();
    let error = SqliteOptions::builder()
        .config(loaded.clone())
        .build()
        .unwrap_err();
    assert_eq!(error.field, "readers", "{error}");
    assert!(error.reason.contains("must be at least 1"), "{error}");
    let options = SqliteOptions::builder()
        .config(loaded)
        .readers(1) // a builder value wins over the loaded one
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(runtime
        .block_on(SqliteJournal::open_with(dir.path().join("j.db"), options))
        .is_ok());
}
