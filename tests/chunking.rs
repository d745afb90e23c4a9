//! Chunked delivery of large messages through the actors, in process, under virtual time:
//! the handler runs once on the whole message, the last chunk's ACK confirms it, and the
//! consumer's bounds hold (a consumer restart, a producer restart, tight bounds, a window
//! smaller than a message's chunk count).

mod common;
#[cfg(feature = "nats")]
mod nats_support;
mod remote;

use std::time::Duration;

use actix_delivery::codec::Codec;
use actix_delivery::remote::{BodySchema, Node, NodeOptions};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerOptionsBuilder, ConsumerRef, DeliveryHandler,
    DeliveryInfo, ProducerHandle, ProducerOptions, ReliableDelivery,
};
use bytes::Bytes;
use common::Log;
use remote::proxy::{Faults, Injected, Proxy};

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

/// A body of `len` bytes (a multiple of 8) that says which it is, and its checksum.
fn blob(seed: u64, len: usize) -> (Bytes, u64) {
    let mut x = seed | 1;
    let mut bytes = vec![0u8; len];
    for word in bytes.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    let sum = checksum(&bytes);
    (Bytes::from(bytes), sum)
}

/// A checksum of whole 8-byte words, position-dependent.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |sum, word| {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        sum.rotate_left(5) ^ word
    }) ^ bytes.len() as u64
}

/// A consumer of blobs that records (length, checksum) of each message handled.
fn blob_consumer(max_message_bytes: u64) -> (ConsumerHandle<Bytes>, Log<(usize, u64)>) {
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: Bytes| {
        log.push((body.len(), checksum(&body)));
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler)
        .max_message_bytes(max_message_bytes)
        .max_reassembly_bytes(2 * max_message_bytes)
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// 64 MiB over TCP through a proxy that corrupts streams (the tags catch it: the connection
/// closes), cuts and stalls connections and delays bytes: the message arrives whole, once,
/// and is confirmed once; the consumer holds nothing afterwards.
#[actix::test]
async fn sixty_four_mib_over_tcp_through_a_lossy_proxy_arrive_whole_once() {
    const LEN: usize = 64 << 20;
    let schema = || BodySchema::<Bytes>::new().codec(Codec::Bincode);
    let server = remote::listening_node().await;
    server.body_schema(schema());
    let (consumer, handled) = blob_consumer(LEN as u64 + 1024);
    server.expose("blobs", &consumer).unwrap();
    let faults = Faults {
        drop_chunk: 0.0007,
        delay: 0.05,
        max_delay: Duration::from_millis(5),
        cut: 0.0007,
        stall: 0.0007,
        stall_for: Duration::from_millis(100),
        ..Faults::default()
    };
    let proxy = Proxy::start(server.local_addr().unwrap(), faults, 7).await;
    let options = remote::secured(NodeOptions::builder())
        .max_output_bytes(16 << 20)
        .build()
        .unwrap();
    let client = Node::start(options).await.unwrap();
    client.body_schema(schema());
    let target = client.consumer_ref::<Bytes>(proxy.addr, "blobs").unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .window_size(8)
            .resend_timeout(Duration::from_millis(200))
            .chunk_size(512 << 10)
            .build()
            .unwrap(),
    );
    let (body, sum) = blob(64, LEN);
    let sent = tokio::time::timeout(Duration::from_secs(120), producer.send(body)).await;
    assert_eq!(sent, Ok(Ok(())), "confirmed within the time limit");
    assert_eq!(handled.snapshot(), [(LEN, sum)], "handled once, whole");
    let injected = &proxy.injected;
    let faults = Injected::get(&injected.dropped_chunks)
        + Injected::get(&injected.cuts)
        + Injected::get(&injected.stalls);
    println!(
        "{injected:?}\nclient {:?}\nserver {:?}",
        client.stats(),
        server.stats()
    );
    assert!(faults > 0, "the proxy injected faults: {injected:?}");
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.assembled, stats.delivered), (1, 1));
    assert_eq!((stats.partial_messages, stats.reassembly_bytes), (0, 0));
    assert_eq!(
        client.stats().bodies_encoded,
        0,
        "chunks go out as their bytes"
    );
    proxy.stop();
}

/// Over NATS, whose server refuses messages over its `max_payload` (1 MiB by default): a
/// producer whose chunks would not fit is refused when built; 64 MiB in chunks that fit
/// arrive whole, once, and are confirmed once.
#[cfg(feature = "nats")]
#[actix::test]
async fn sixty_four_mib_over_nats_arrive_whole_once_in_chunks_that_fit_max_payload() {
    use actix_delivery::nats::NatsOptions;

    const LEN: usize = 64 << 20;
    let subject = nats_support::unique("chunks");
    let schema = || BodySchema::<Bytes>::new().codec(Codec::Bincode);
    let server = nats_support::carrier().await;
    server.body_schema(schema());
    let (consumer, handled) = blob_consumer(LEN as u64 + 1024);
    server.expose(&subject, &consumer).await.unwrap();
    let options = NatsOptions::builder()
        .max_output_bytes(16 << 20)
        .build()
        .unwrap();
    let client = nats_support::carrier_at(&nats_support::url(), options).await;
    client.body_schema(schema());
    let max_payload = client.client().server_info().max_payload;
    let target = || client.consumer_ref::<Bytes>(&subject).unwrap();
    let too_large = ProducerOptions::builder(target())
        .chunk_size(max_payload)
        .build()
        .unwrap_err();
    assert_eq!(too_large.field, "chunk_size", "{too_large}");
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target())
            .window_size(8)
            .resend_timeout(Duration::from_millis(500))
            .chunk_size(max_payload / 2)
            .build()
            .unwrap(),
    );
    let (body, sum) = blob(65, LEN);
    let sent = tokio::time::timeout(Duration::from_secs(120), producer.send(body)).await;
    assert_eq!(sent, Ok(Ok(())), "confirmed within the time limit");
    assert_eq!(handled.snapshot(), [(LEN, sum)], "handled once, whole");
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.assembled, stats.delivered), (1, 1));
    assert_eq!((stats.partial_messages, stats.reassembly_bytes), (0, 0));
    let sent = client.stats();
    assert!(sent.deliveries_out as usize >= LEN / (max_payload / 2), "{sent:?}");
    assert_eq!(sent.deliveries_unsendable, 0, "{sent:?}");
}
