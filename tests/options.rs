//! Builders validate at construction and apply explicit > loaded > default.

mod common;

use std::time::Duration;

use actix_delivery::{
    ConsumerConfig, ConsumerOptions, DeliveryHandler, Limit, ProducerConfig, ProducerOptions,
    ReliableDelivery,
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
        ProducerOptions::new(consumer.recipient(), plain)
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
