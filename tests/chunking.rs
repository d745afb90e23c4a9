//! Chunked delivery of large messages through the actors, in process, under virtual time:
//! the handler runs once on the whole message, the last chunk's ACK confirms it, and the
//! consumer's bounds hold (a consumer restart, a producer restart, tight bounds, a window
//! smaller than a message's chunk count).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::{
    ChunkDelivery, ConsumerHandle, ConsumerOptions, ConsumerOptionsBuilder, ConsumerRef,
    DeliveryError, DeliveryHandler, DeliveryInfo, Limit, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};
use common::{settle_for, Log};

/// A message of `len` bytes whose content says which it is.
fn message(id: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ id).collect()
}

/// A consumer that records each message (its first byte's id, length, delivery info).
fn consumer(
    configure: impl FnOnce(ConsumerOptionsBuilder<Vec<u8>>) -> ConsumerOptionsBuilder<Vec<u8>>,
) -> (ConsumerHandle<Vec<u8>>, Log<(Vec<u8>, DeliveryInfo)>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn_with_info(move |info, body: Vec<u8>| {
        log.push((body, info));
        async { Ok::<(), String>(()) }
    });
    let options = configure(ConsumerOptions::builder(handler))
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), handled)
}

fn producer(
    to: impl Into<ConsumerRef<Vec<u8>>>,
    window: usize,
    chunk_size: usize,
) -> ProducerHandle<Vec<u8>> {
    let options = ProducerOptions::builder(to)
        .window_size(window)
        .chunk_size(chunk_size)
        .build()
        .unwrap();
    ReliableDelivery::producer(options)
}

#[actix::test]
async fn a_large_message_runs_the_handler_once_whole_through_a_window_smaller_than_its_chunks() {
    tokio::time::pause();
    let (consumer, handled) = consumer(|b| b);
    let producer = producer(&consumer, 2, 1024);
    let body = message(1, 20_000);
    producer.send(body.clone()).await.unwrap();
    let runs = handled.snapshot();
    assert_eq!(runs.len(), 1, "one run for the whole message");
    assert_eq!(runs[0].0, body);
    let info = &runs[0].1;
    // The header (codec and version: 2 bytes), the length (3 bytes), the bytes.
    let chunks = 20_005usize.div_ceil(1024) as u64;
    assert_eq!(
        info.seqs().count() as u64,
        chunks,
        "its seqs are its chunks'"
    );
    let stats = producer.stats().await.unwrap();
    assert_eq!(
        (stats.confirmed, stats.sent, stats.in_flight),
        (1, chunks, 0)
    );
    let c = consumer.stats().await.unwrap();
    assert_eq!((c.assembled, c.delivered, c.reassembly_bytes), (1, 1, 0));
    assert_eq!(
        consumer
            .out_of_order_for(producer.producer_id().clone())
            .await
            .unwrap(),
        Some(0),
        "the message's whole range is marked"
    );
}
