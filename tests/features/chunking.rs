//! Chunked delivery of large messages through the actors, in process, under virtual time:
//! the handler runs once on the whole message, the last chunk's ACK confirms it, and the
//! consumer's bounds hold (a consumer restart, a producer restart, tight bounds, a window
//! smaller than a message's chunk count); over TCP through a lossy proxy and over NATS. A
//! durable producer killed with SIGKILL mid-message is in `tests/processes/chunking_crash.rs`,
//! the seeded simulator of chunking in the pure cores in the core crate
//! (`actix-delivery-proto/tests/simulations`).

use crate::common;
#[cfg(feature = "nats")]
use crate::nats_support;
use crate::remote;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::codec::Codec;
use actix_delivery::durable::{DurableOptions, MessageId};
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{PersistentHandle, PersistentOptions};
use actix_delivery::tcp::{BodySchema, NodeHandle, NodeOptions};
use actix_delivery::{
    Ack, ChunkDeliveries, ChunkDelivery, ConsumerHandle, ConsumerOptions, ConsumerOptionsBuilder,
    ConsumerRef, DeadLetterReason, Delivery, DeliveryError, DeliveryHandler, DeliveryInfo, Failure,
    OptionsError, ProducerHandle, ProducerOptions, ReliableDelivery, ReplyTo, MIN_CHUNK_SIZE,
};
use bytes::Bytes;
use common::blobs::{blob, blob_consumer, durable_sink, Reported};
use common::entities::{ledger_id, Ledger, Op};
use common::{confirm_into, settle_for, Confirmations, Log};
use remote::proxy::{Faults, Injected, Proxy};

/// What a [`Link`] does with a chunk: forwards it (to the consumer of the moment), or drops it.
type ChunkPolicy = Box<dyn FnMut(&ChunkDelivery<Vec<u8>>) -> bool + Send>;

/// What a [`Link`] does with an ACK on its way back: lets it through, or drops it.
type AckPolicy = Arc<Mutex<Box<dyn FnMut(&Ack) -> bool + Send>>>;

/// A link from producers to a consumer the test can switch (a restart that lost everything),
/// with policies for chunks and for their ACKs.
#[derive(Clone)]
struct Link {
    to: Arc<Mutex<ConsumerHandle<Vec<u8>>>>,
    chunks: Arc<Mutex<ChunkPolicy>>,
    acks: AckPolicy,
}

impl Link {
    fn new(to: &ConsumerHandle<Vec<u8>>) -> Self {
        Self {
            to: Arc::new(Mutex::new(to.clone())),
            chunks: Arc::new(Mutex::new(Box::new(|_| true))),
            acks: Arc::new(Mutex::new(Box::new(|_| true))),
        }
    }

    fn switch_to(&self, to: &ConsumerHandle<Vec<u8>>) {
        *self.to.lock().unwrap() = to.clone();
    }

    fn chunks(&self, policy: impl FnMut(&ChunkDelivery<Vec<u8>>) -> bool + Send + 'static) {
        *self.chunks.lock().unwrap() = Box::new(policy);
    }

    fn acks(&self, policy: impl FnMut(&Ack) -> bool + Send + 'static) {
        *self.acks.lock().unwrap() = Box::new(policy);
    }

    fn consumer_ref(&self) -> ConsumerRef<Vec<u8>> {
        let link = self.clone();
        ConsumerRef::from_fn(|_| unreachable!("a chunked producer sends chunks")).with_chunks(
            move |chunks| {
                let kept: Vec<ChunkDelivery<Vec<u8>>> = chunks
                    .into_iter()
                    .filter(|chunk| (link.chunks.lock().unwrap())(chunk))
                    .map(|mut chunk| {
                        let (to, acks) = (chunk.reply_to.take().unwrap(), link.acks.clone());
                        chunk.reply_to = Some(ReplyTo::from_fn(move |batch| {
                            let kept = batch.into_iter().filter(|ack| (acks.lock().unwrap())(ack));
                            to.do_send_all(kept);
                        }));
                        chunk
                    })
                    .collect();
                link.to
                    .lock()
                    .unwrap()
                    .addr()
                    .do_send(ChunkDeliveries(kept));
            },
        )
    }
}

/// A message of `len` bytes whose content says which it is.
fn message(id: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ id).collect()
}

/// The messages a consumer handled, with their delivery info.
type Handled = Log<(Vec<u8>, DeliveryInfo)>;

/// A consumer that records each message (its first byte's id, length, delivery info).
fn consumer(
    configure: impl FnOnce(ConsumerOptionsBuilder<Vec<u8>>) -> ConsumerOptionsBuilder<Vec<u8>>,
) -> (ConsumerHandle<Vec<u8>>, Handled) {
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
    let client = NodeHandle::start(options).await.unwrap();
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
    assert!(
        sent.deliveries_out as usize >= LEN / (max_payload / 2),
        "{sent:?}"
    );
    assert_eq!(sent.deliveries_unsendable, 0, "{sent:?}");
}

/// The hard case: the consumer loses a message's chunks after ACKing them (a restart; here a
/// fresh consumer behind the same link). The producer's last chunk goes unconfirmed, so it
/// sends the whole message again (a round), and the message runs once, whole, at the new
/// consumer; never on a part.
#[actix::test]
async fn a_consumer_that_lost_acked_chunks_gets_the_whole_message_again_and_runs_it_once() {
    tokio::time::pause();
    let (first, first_runs) = consumer(|b| b);
    let link = Link::new(&first);
    let producer = producer(link.consumer_ref(), 4, 1024);
    let body = message(3, 10_000);
    // The first consumer gets every chunk but the last: it ACKs and buffers them.
    link.chunks(|chunk| chunk.seq < chunk.chunk.first_seq + u64::from(chunk.chunk.chunks) - 1);
    let confirmations = Confirmations::<u8>::default();
    producer
        .tell(body.clone(), confirm_into(&confirmations, 3))
        .unwrap();
    settle_for(100).await;
    assert_eq!(first.stats().await.unwrap().partial_messages, 1);
    // It is gone with what it held; a fresh consumer takes its place.
    let (second, second_runs) = consumer(|b| b);
    link.switch_to(&second);
    link.chunks(|_| true);
    first.stop();
    settle_for(3_000).await;
    assert!(first_runs.snapshot().is_empty());
    let runs = second_runs.snapshot();
    assert_eq!(runs.len(), 1, "once, whole");
    assert_eq!(runs[0].0, body);
    assert_eq!(confirmations.snapshot(), [(3, Ok(()))]);
    let stats = producer.stats().await.unwrap();
    assert!(stats.chunk_rounds >= 1, "{stats:?}");
}

/// A producer that stops mid-message (its message settled as stopped) and a new producer of
/// the same id (a new incarnation): the consumer drops the partial message of the earlier
/// life, never runs it, holds nothing of it afterwards, and runs the new life's messages.
#[actix::test]
async fn a_producer_restart_mid_message_drops_its_partial_message_never_runs_a_part() {
    tokio::time::pause();
    let (consumer, runs) = consumer(|b| b);
    let link = Link::new(&consumer);
    let options = |to| {
        ProducerOptions::builder(to)
            .producer_id("restarting")
            .chunk_size(1024)
            .build()
            .unwrap()
    };
    let earlier = ReliableDelivery::producer(options(link.consumer_ref()));
    link.chunks(|chunk| chunk.seq < chunk.chunk.first_seq + 3);
    let lost = earlier.send(message(1, 10_000));
    settle_for(100).await;
    assert!(consumer.stats().await.unwrap().reassembly_bytes > 0);
    earlier.stop();
    assert_eq!(
        lost.await,
        Err(DeliveryError::StoppedUnconfirmed),
        "partly sent"
    );
    link.chunks(|_| true);
    let later = ReliableDelivery::producer(options(link.consumer_ref()));
    later.send(message(2, 5_000)).await.unwrap();
    let runs = runs.snapshot();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, message(2, 5_000));
    let stats = consumer.stats().await.unwrap();
    assert_eq!(stats.partial_messages_dropped, 1, "{stats:?}");
    assert_eq!((stats.partial_messages, stats.reassembly_bytes), (0, 0));
}

/// Several chunked messages through an ordered consumer, and an unordered one, with the
/// link reversing each batch of chunks: each runs once, whole, and the ordered consumer runs
/// them in the producer's order.
#[actix::test]
async fn ordered_and_unordered_consumers_run_each_chunked_message_once_whole() {
    tokio::time::pause();
    for ordered in [true, false] {
        let (consumer, runs) = consumer(|b| b.ordered(ordered));
        let target = consumer.clone();
        let reversing = ConsumerRef::from_fn(|_| unreachable!()).with_chunks(move |mut chunks| {
            chunks.reverse();
            target.addr().do_send(ChunkDeliveries(chunks));
        });
        let producer = producer(reversing, 6, 1024);
        let bodies: Vec<Vec<u8>> = (0..5u8)
            .map(|id| message(id, 2_000 + 1_500 * id as usize))
            .collect();
        let sends: Vec<_> = bodies.iter().map(|b| producer.send(b.clone())).collect();
        for send in sends {
            send.await.unwrap();
        }
        let ran: Vec<Vec<u8>> = runs.snapshot().into_iter().map(|(body, _)| body).collect();
        assert_eq!(ran.len(), bodies.len(), "ordered: {ordered}");
        if ordered {
            assert_eq!(ran, bodies, "in the producer's order");
        } else {
            let mut sorted = ran.clone();
            sorted.sort();
            let mut expected = bodies.clone();
            expected.sort();
            assert_eq!(sorted, expected);
        }
    }
}

/// `chunk_size` is refused when the producer is built, naming the field and why: below
/// `MIN_CHUNK_SIZE`, for a reference that takes no chunks, beyond what a node's frames carry,
/// and for a durable producer beyond what one journal entry holds.
#[actix::test]
async fn a_chunk_size_that_cannot_work_is_refused_when_the_producer_is_built() {
    let (consumer, _) = consumer(|b| b);
    let refused = |options: Result<ProducerOptions<Vec<u8>>, OptionsError>, why: &str| {
        let error = options.unwrap_err();
        assert_eq!(error.field, "chunk_size", "{error}");
        assert!(error.to_string().contains(why), "{error}");
    };
    let below = MIN_CHUNK_SIZE - 1;
    refused(
        ProducerOptions::builder(&consumer)
            .chunk_size(below)
            .build(),
        "must be at least",
    );
    let single: Recipient<Delivery<Vec<u8>>> = consumer.addr().clone().recipient();
    refused(
        ProducerOptions::builder(single).chunk_size(4096).build(),
        "takes no chunks",
    );
    let no_chunks = ConsumerRef::<Vec<u8>>::from_fn(|_| {});
    refused(
        ProducerOptions::builder(no_chunks).chunk_size(4096).build(),
        "takes no chunks",
    );
    let node = remote::sending_node().await; // frames of at most 1 MiB (the default)
    let far = node
        .consumer_ref::<Vec<u8>>(
            "127.0.0.1:9".parse::<std::net::SocketAddr>().unwrap(),
            "far",
        )
        .unwrap();
    refused(
        ProducerOptions::builder(far.clone())
            .chunk_size(1 << 20)
            .build(),
        "do not fit the transport's frames",
    );
    assert!(ProducerOptions::builder(far)
        .chunk_size(512 << 10)
        .build()
        .is_ok());
    // Beyond anything a chunk is carried in: refused, not a panic at the first send (nor an
    // abort of the process).
    for size in [usize::MAX, 1 << 44, (16 << 20) + 1] {
        refused(
            ProducerOptions::builder(&consumer).chunk_size(size).build(),
            "must be at most",
        );
    }
    let durable = DurableOptions::new(
        Arc::new(MemoryJournal::new()),
        PersistenceId::new("too-large").unwrap(),
        "too-large",
    );
    let options = ProducerOptions::builder(&consumer)
        .chunk_size(16 << 20)
        .build()
        .unwrap();
    let error = ReliableDelivery::durable_producer(options, durable).unwrap_err();
    assert_eq!(error.field, "chunk_size", "{error}");
    assert!(error.to_string().contains("one journal entry"), "{error}");
    node.stop();
}

/// A message whose encoding fails is settled `Unencodable` (nothing of it sent), and the
/// producer goes on with the next one.
#[actix::test]
async fn a_message_that_does_not_encode_is_settled_unencodable_and_the_next_one_goes_through() {
    tokio::time::pause();
    /// A body whose zero does not encode.
    #[derive(Clone, Debug, PartialEq, serde::Deserialize)]
    struct Body(u8);
    impl serde::Serialize for Body {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                0 => Err(serde::ser::Error::custom("zero does not encode")),
                n => s.serialize_newtype_struct("Body", &n),
            }
        }
    }
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: Body| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .chunk_size(1024)
            .build()
            .unwrap(),
    );
    let refused = producer.send(Body(0)).await;
    assert!(
        matches!(&refused, Err(DeliveryError::Unencodable(why)) if why.contains("zero")),
        "{refused:?}"
    );
    producer.send(Body(7)).await.unwrap();
    assert_eq!(handled.snapshot(), [Body(7)]);
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.dead_letters), (1, 0));
}

/// A message longer than `max_message_bytes` is a dead letter (counted, reported, no ACK) and
/// never runs; with `max_attempts` its producer gives it up.
#[actix::test]
async fn a_message_over_max_message_bytes_is_a_dead_letter_and_its_producer_gives_it_up() {
    tokio::time::pause();
    let (sink, dead) = common::dead_letter_log();
    let (consumer, runs) = consumer(|b| b.max_message_bytes(8 << 10).dead_letters(sink));
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .chunk_size(1024)
            .max_attempts(3)
            .build()
            .unwrap(),
    );
    let refused = producer.send(message(1, 20_000)).await;
    assert!(
        matches!(refused, Err(DeliveryError::GaveUp { .. })),
        "{refused:?}"
    );
    producer.send(message(2, 4_000)).await.unwrap();
    assert_eq!(runs.len(), 1, "only the message that fits");
    let reasons: Vec<DeadLetterReason> = dead.snapshot().iter().map(|d| d.reason).collect();
    assert!(!reasons.is_empty());
    assert!(reasons.iter().all(|r| *r
        == DeadLetterReason::MessageTooLarge {
            len: 20_005,
            max: 8 << 10
        }));
    let stats = consumer.stats().await.unwrap();
    assert_eq!(stats.dead_letters, reasons.len() as u64);
    assert_eq!(stats.reassembly_bytes, 0);
}

/// Three producers of messages that each take most of `max_reassembly_bytes`, to a handler
/// that takes 20 ms (a reassembled message holds its bytes while it waits for it): the bound
/// holds at every moment, chunks beyond it are refused (and counted), and every message still
/// runs once, whole (each in its turn).
#[actix::test]
async fn reassembly_stays_within_max_reassembly_bytes_and_every_message_still_runs() {
    tokio::time::pause();
    const BOUND: u64 = 12 << 10;
    let runs = Log::default();
    let log = runs.clone();
    let handler = DeliveryHandler::from_fn(move |body: Vec<u8>| {
        log.push(body);
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<(), String>(())
        }
    });
    let options = ConsumerOptions::builder(handler)
        .max_message_bytes(BOUND)
        .max_reassembly_bytes(BOUND)
        .max_out_of_order(1)
        .build()
        .unwrap();
    let consumer = ReliableDelivery::consumer(options);
    let producers: Vec<_> = (0..3).map(|_| producer(&consumer, 4, 1024)).collect();
    let mut sends = Vec::new();
    for round in 0..3u8 {
        for (p, producer) in producers.iter().enumerate() {
            sends.push(producer.send(message(round * 3 + p as u8, 10_000)));
        }
    }
    let mut highest = 0;
    let mut all = futures_util::future::join_all(sends);
    loop {
        tokio::select! {
            results = &mut all => {
                assert!(results.iter().all(Result::is_ok), "{results:?}");
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(5)) => {
                highest = highest.max(consumer.stats().await.unwrap().reassembly_bytes);
            }
        }
    }
    assert_eq!(runs.len(), 9, "every message once");
    assert!(highest > 0 && highest <= BOUND, "{highest}");
    let stats = consumer.stats().await.unwrap();
    assert!(
        stats.chunks_refused > 0,
        "the bound refused chunks: {stats:?}"
    );
    assert_eq!(stats.assembled, 9);
}

/// A patient sender through the actors (issue 32): 32 forged producer ids each start a
/// message of 128 KiB with a first chunk of 126 KiB, together filling `max_reassembly_bytes`
/// (4 MiB), and add a one-byte chunk to each every 300 ms, never finishing one. An honest
/// 100 KiB message (within its share) is confirmed at once; an honest 1 MiB message waits
/// only until the attackers' messages, seen before it, reach their lifetime (5.125 s from
/// their first chunk, swept by the consumer's timer) and its next retransmission; the bound
/// holds throughout, and every partial message dropped is counted.
#[actix::test]
async fn a_patient_sender_keeps_no_honest_chunked_message_out_for_longer_than_the_documented_bound()
{
    tokio::time::pause();
    const BOUND: u64 = 4 << 20;
    let (consumer, runs) = consumer(|b| b.max_message_bytes(1 << 20).max_reassembly_bytes(BOUND));
    // A real chunk, to forge the attackers' from.
    let template = Arc::new(Mutex::new(None));
    let capture = template.clone();
    let capturing = ConsumerRef::from_fn(|_| {}).with_chunks(move |chunks| {
        capture.lock().unwrap().get_or_insert(chunks[0].clone());
    });
    let capturer = producer(capturing, 1, 1024);
    capturer.tell(vec![1], |_| {}).unwrap();
    settle_for(1).await;
    let template: ChunkDelivery<Vec<u8>> = template.lock().unwrap().clone().unwrap();
    let forged = move |attacker: usize, index: u32, len: usize| {
        let mut chunk = template.clone();
        chunk.producer_id = format!("attacker-{attacker}").as_str().into();
        chunk.seq = 1 + u64::from(index);
        chunk.window_start = 1;
        chunk.chunk = actix_delivery_proto::protocol::chunk::ChunkHeader {
            first_seq: 1,
            chunks: 1024,
            message_len: 128 << 10,
        };
        chunk.bytes = Bytes::from(vec![0xa; len]);
        chunk.reply_to = Some(ReplyTo::from_fn(|_| {}));
        chunk
    };
    let fill = (0..32)
        .map(|attacker| forged(attacker, 0, 126 << 10))
        .collect();
    consumer.addr().do_send(ChunkDeliveries(fill));
    let trickle = consumer.addr().clone();
    let start = tokio::time::Instant::now();
    actix::spawn(async move {
        let tick = Duration::from_millis(300);
        let mut every = tokio::time::interval_at(start + tick, tick);
        for index in 1.. {
            every.tick().await;
            let chunks = (0..32).map(|attacker| forged(attacker, index, 1)).collect();
            trickle.do_send(ChunkDeliveries(chunks));
        }
    });
    tokio::time::sleep_until(start + Duration::from_secs(1)).await;
    assert_eq!(
        consumer.stats().await.unwrap().reassembly_bytes,
        BOUND,
        "filled"
    );
    let honest = producer(&consumer, 16, 16 << 10);
    let within = |send| {
        let consumer = consumer.clone();
        async move {
            let sent = tokio::time::Instant::now();
            let confirmed = tokio::time::timeout(Duration::from_secs(60), send).await;
            let stats = consumer.stats().await.unwrap();
            assert!(confirmed.is_ok(), "not confirmed in a minute: {stats:?}");
            sent.elapsed()
        }
    };
    let waited = within(honest.send(message(1, 100 << 10))).await;
    assert_eq!(waited, Duration::ZERO, "within its share: at once");
    // Encoded (a header and a length first) just below 1 MiB.
    let waited = within(honest.send(message(2, (1 << 20) - 64))).await;
    let lifetime = Duration::from_millis(5125); // 5 s, and 128 KiB at 1 MiB/s
    let bound = lifetime - Duration::from_secs(1) + Duration::from_millis(500);
    assert!(
        waited > lifetime - Duration::from_secs(1) - Duration::from_millis(1) && waited <= bound,
        "waited {waited:?}, bound {bound:?}"
    );
    assert_eq!(runs.len(), 2);
    let stats = consumer.stats().await.unwrap();
    assert!(stats.reassembly_bytes <= BOUND, "{stats:?}");
    // One attacker gave way to the 100 KiB message, all 32 reached their lifetime, and the
    // youngest 8 of those the trickle started again gave way to the 1 MiB message.
    assert_eq!(stats.partial_messages_dropped, 1 + 32 + 8, "{stats:?}");
    assert_eq!(
        stats.chunks_refused,
        9 * 16,
        "the 1 MiB message's window, 9 times"
    );
}

/// The effectively-once consumer: the processed mark is the message's. The ACK of a message's
/// last chunk is lost after the entity committed it, and the consumer restarts: the round
/// that follows is answered "already processed" from the entity's journal, the message is
/// confirmed, and its events are stored once.
#[actix::test]
async fn an_effectively_once_consumer_stores_a_chunked_messages_events_once_across_a_restart() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(journal.clone(), ledger_id()))
            .unwrap();
    let effectively_once = |ledger: &PersistentHandle<Ledger>| {
        let handler = ledger.delivery_handler(|body: Vec<u8>| Op::Apply(u64::from(body[0])));
        ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
    };
    let first = effectively_once(&ledger);
    let link = Link::new(&first);
    let producer = producer(link.consumer_ref(), 4, 1024);
    producer.send(message(7, 6_000)).await.unwrap();
    // Message 9 (seqs 7 to 12): its last chunk's ACK is lost once, after the entity
    // committed it; its consumer restarts before the round comes.
    let lost = Arc::new(Mutex::new(false));
    let once = lost.clone();
    link.acks(move |ack| {
        let mut lost = once.lock().unwrap();
        let drop = ack.seq == 12 && !*lost;
        *lost |= drop;
        !drop
    });
    let confirmations = Confirmations::<u8>::default();
    producer
        .tell(message(9, 6_000), confirm_into(&confirmations, 9))
        .unwrap();
    settle_for(100).await;
    assert!(*lost.lock().unwrap(), "the last chunk's ACK was lost");
    let second = effectively_once(&ledger);
    link.switch_to(&second);
    first.stop();
    settle_for(3_000).await;
    assert_eq!(confirmations.snapshot(), [(9, Ok(()))]);
    let ledger_stats = ledger.stats().await.unwrap();
    assert_eq!(ledger_stats.duplicates, 1, "{ledger_stats:?}");
    let total = ledger.ask(Op::Total).await.unwrap();
    assert_eq!(total, 2, "each message's event stored once");
}

/// A durable producer with `chunk_size`: a message is stored chunk by chunk before any of it
/// is sent, `store()` resolves once all are (its id is its last chunk's seq), and after a
/// restart the stored, unconfirmed message is sent again whole, its confirmation going to the
/// sink.
#[actix::test]
async fn a_durable_producer_resends_a_message_stored_whole_after_a_restart() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let (sink, confirmed) = durable_sink();
    let durable = || {
        DurableOptions::new(journal.clone(), PersistenceId::new("big").unwrap(), "big")
            .codec(Codec::Bincode) // its size below: a length and the bytes
            .confirmations(sink.clone())
    };
    let options = |to| {
        ProducerOptions::builder(to)
            .chunk_size(1024)
            .build()
            .unwrap()
    };
    let nowhere = ConsumerRef::from_fn(|_| {}).with_chunks(|_| {});
    let first = ReliableDelivery::durable_producer(options(nowhere), durable()).unwrap();
    let body = message(5, 10_000);
    let stored = first.store(body.clone()).await.unwrap();
    let chunks = 10_005u64.div_ceil(1024);
    assert_eq!(
        stored.id,
        MessageId(chunks),
        "its id is its last chunk's seq"
    );
    first.stop();
    first.stopped().await.unwrap();
    let (consumer, runs) = consumer(|b| b);
    let second =
        ReliableDelivery::durable_producer(options((&consumer).into()), durable()).unwrap();
    second.idle().await;
    let runs = runs.snapshot();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, body);
    assert_eq!(runs[0].1.seqs(), 1..=chunks);
    let stats = second.stats().await.unwrap();
    assert_eq!((stats.resumed, stats.resumed_confirmed), (1, 1));
    settle_for(10).await;
    assert_eq!(confirmed.snapshot(), [(MessageId(chunks), Ok(()))]);
}

/// The journal fails while a message's chunks are being stored, after some of them were
/// committed: the producer restarts, its opening finds the message partly stored and drops
/// it (never sent: no handler runs on a part), its caller hears "not stored", and the next
/// message goes through.
#[actix::test]
async fn a_message_partly_stored_when_the_journal_failed_is_dropped_never_half_delivered() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let (consumer, runs) = blob_consumer(32 << 20);
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(&consumer)
            .chunk_size(1 << 20)
            .build()
            .unwrap(),
        DurableOptions::new(journal.clone(), PersistenceId::new("big").unwrap(), "big"),
    )
    .unwrap();
    producer.idle().await; // open
                           // 17 MiB in chunks of 1 MiB: two journal entries; the second one fails.
    journal.faults().fail_nth_append(2);
    let lost = producer.store(blob(1, 17 << 20).0).await;
    assert!(
        matches!(&lost, Err(DeliveryError::Storage(why)) if why.contains("only some")),
        "{lost:?}"
    );
    let (next, sum) = blob(2, 3 << 20);
    producer.send(next).await.unwrap();
    assert_eq!(
        runs.snapshot(),
        [(3 << 20, sum)],
        "the partly stored message never ran"
    );
    let stats = producer.stats().await.unwrap();
    assert_eq!(stats.partially_stored, 1, "{stats:?}");
    let c = consumer.stats().await.unwrap();
    assert_eq!(
        (c.assembled, c.partial_messages, c.reassembly_bytes),
        (1, 0, 0)
    );
}

/// A durable stream that holds unsettled whole messages is not opened by a producer with
/// `chunk_size`, nor one that holds unsettled chunked messages by a producer without: the
/// producer stops for good and a store hears why; the stream's message waits for a producer
/// configured as the stream was written, which sends it.
#[actix::test]
async fn a_durable_producer_refuses_a_stream_holding_unsettled_messages_of_the_other_kind() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let durable = |stream: &str| {
        DurableOptions::new(journal.clone(), PersistenceId::new(stream).unwrap(), stream)
    };
    let options = |chunks: bool, to: ConsumerRef<Vec<u8>>| {
        let builder = ProducerOptions::builder(to);
        let builder = if chunks {
            builder.chunk_size(1024)
        } else {
            builder
        };
        builder.build().unwrap()
    };
    let nowhere = || ConsumerRef::from_fn(|_| {}).with_chunks(|_| {});
    for (stream, written_in_chunks) in [("whole", false), ("chunked", true)] {
        let first = ReliableDelivery::durable_producer(
            options(written_in_chunks, nowhere()),
            durable(stream),
        )
        .unwrap();
        first.store(message(1, 3000)).await.unwrap();
        first.stop();
        first.stopped().await.unwrap();
        let other = ReliableDelivery::durable_producer(
            options(!written_in_chunks, nowhere()),
            durable(stream),
        )
        .unwrap();
        let refused = other.store(message(2, 10)).await;
        assert!(
            matches!(&refused, Err(DeliveryError::Storage(why)) if why.contains("holds unsettled")),
            "{stream}: {refused:?}"
        );
        let stopped = other.stopped().await;
        assert!(
            matches!(&stopped, Err(Failure::Error(why)) if why.contains("holds unsettled")),
            "{stream}: {stopped:?}"
        );
        let (consumer, runs) = consumer(|b| b);
        let same = ReliableDelivery::durable_producer(
            options(written_in_chunks, (&consumer).into()),
            durable(stream),
        )
        .unwrap();
        same.idle().await;
        let runs = runs.snapshot();
        assert_eq!(runs.len(), 1, "{stream}");
        assert_eq!(runs[0].0, message(1, 3000), "{stream}");
        assert_eq!(runs[0].1.first_seq.is_some(), written_in_chunks, "{stream}");
    }
}

/// A report as the first release of an application sent it, in chunks.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct ReportV1 {
    id: u64,
    text: String,
}

/// The same report after a field was added with a default (no new version).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct ReportV2 {
    id: u64,
    text: String,
    #[serde(default)]
    pages: Option<u32>,
}

/// Version 2 of the report, a breaking change: its text became lines.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct ReportV3 {
    id: u64,
    lines: Vec<String>,
}

/// Reads version 1 reports as version 2 (`ReportV3`).
fn report_upcast(
    old: actix_delivery::codec::Written<'_>,
) -> Result<ReportV3, actix_delivery::codec::UpcastError> {
    let v1: ReportV1 = old.decode()?;
    Ok(ReportV3 {
        id: v1.id,
        lines: v1.text.lines().map(str::to_owned).collect(),
    })
}

/// Report `id` of version 1: 2 729 bytes of text in lines, three chunks of 1 KiB.
fn report(id: u64) -> ReportV1 {
    let line = format!("report {id:03} ").repeat(7);
    ReportV1 {
        id,
        text: vec![line; 35].join("\n"),
    }
}

/// A consumer of `T` that records what it handled, and a durable producer of `T` to it with
/// chunks of 1 KiB and at most three attempts per message, on `stream` of `journal`.
fn report_pipeline<T>(
    journal: &Arc<MemoryJournal>,
    stream: &str,
    durable: impl FnOnce(DurableOptions<T>) -> DurableOptions<T>,
) -> (ProducerHandle<T>, Log<T>, Reported)
where
    T: Clone + Send + Unpin + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: T| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    let (sink, reported) = durable_sink();
    let options = ProducerOptions::builder(&consumer)
        .chunk_size(1024)
        .max_attempts(3)
        .build()
        .unwrap();
    let stream = PersistenceId::new(stream).unwrap();
    let durable = durable(DurableOptions::new(
        journal.clone(),
        stream.clone(),
        stream.as_str(),
    ));
    let producer =
        ReliableDelivery::durable_producer(options, durable.confirmations(sink)).unwrap();
    (producer, handled, reported)
}

/// Waits until `producer` has nothing left to send, for at most a minute of virtual time.
async fn idle_within_a_minute<T: Clone + Send + 'static>(producer: &ProducerHandle<T>) {
    let idle = tokio::time::timeout(Duration::from_secs(60), producer.idle()).await;
    assert!(
        idle.is_ok(),
        "still sending after a minute: {:?}",
        producer.stats().await
    );
}

/// Stores reports 1 and 2 of version 1 on `stream` (written as `durable` says), unsent.
async fn store_reports(
    journal: &Arc<MemoryJournal>,
    stream: &str,
    durable: impl FnOnce(DurableOptions<ReportV1>) -> DurableOptions<ReportV1>,
) {
    let nowhere = ConsumerRef::from_fn(|_| {}).with_chunks(|_| {});
    let options = ProducerOptions::builder(nowhere)
        .chunk_size(1024)
        .build()
        .unwrap();
    let stream = PersistenceId::new(stream).unwrap();
    let durable = durable(DurableOptions::new(
        journal.clone(),
        stream.clone(),
        stream.as_str(),
    ));
    let first = ReliableDelivery::durable_producer(options, durable).unwrap();
    for id in 1..=2 {
        let stored = first.store(report(id)).await.unwrap();
        assert_eq!(stored.id, MessageId(3 * id), "three chunks each");
    }
    first.stop();
    first.stopped().await.unwrap();
}

/// The name the reports were stored under. In an application a changed type keeps its name;
/// here each version is a type of its own, so the later ones declare it as their former name.
fn v1_name() -> &'static str {
    std::any::type_name::<ReportV1>()
}

/// A durable producer's stored chunked messages after a change of their type: with a field
/// added (a default, no new version) they are read as the new type; after a breaking change
/// with a new version they go through the upcaster; either way they arrive and are
/// confirmed, never given up because the new code sends them as the old one stored them.
#[actix::test]
async fn a_durable_producers_chunked_messages_arrive_after_their_type_changed() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    store_reports(&journal, "added", |d| d).await;
    let (producer, handled, reported) =
        report_pipeline::<ReportV2>(&journal, "added", |d| d.accept_type_name(v1_name()));
    idle_within_a_minute(&producer).await;
    let expected: Vec<ReportV2> = (1..=2)
        .map(|id| ReportV2 {
            id,
            text: report(id).text,
            pages: None,
        })
        .collect();
    assert_eq!(handled.snapshot(), expected, "read as the new type");
    settle_for(10).await;
    assert_eq!(
        reported.snapshot(),
        [(MessageId(3), Ok(())), (MessageId(6), Ok(()))]
    );
    store_reports(&journal, "upcast", |d| d).await;
    let (producer, handled, reported) = report_pipeline::<ReportV3>(&journal, "upcast", |d| {
        d.message_version(2)
            .upcast(report_upcast)
            .accept_type_name(v1_name())
    });
    idle_within_a_minute(&producer).await;
    let upcast: Vec<ReportV3> = (1..=2)
        .map(|id| ReportV3 {
            id,
            lines: report(id).text.lines().map(str::to_owned).collect(),
        })
        .collect();
    assert_eq!(handled.snapshot(), upcast, "through the upcaster");
    let newer = ReportV3 {
        id: 3,
        lines: vec!["written at version 2".into()],
    };
    producer.send(newer.clone()).await.unwrap();
    assert_eq!(handled.snapshot()[2], newer);
    settle_for(10).await;
    assert_eq!(
        reported.snapshot(),
        [(MessageId(3), Ok(())), (MessageId(6), Ok(()))]
    );
}

/// A durable producer that cannot read its stored chunked messages (bincode, and the type
/// changed without a new version) stops for good before it sends anything, saying which
/// stream, message and versions; the messages stay stored, and the type rolled back sends
/// them.
#[actix::test]
async fn a_durable_producer_that_cannot_read_its_stored_chunked_messages_stops_and_keeps_them() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let bincode = |d: DurableOptions<ReportV1>| d.codec(Codec::Bincode);
    store_reports(&journal, "bincode", bincode).await;
    let (producer, handled, _) = report_pipeline::<ReportV2>(&journal, "bincode", |d| {
        d.codec(Codec::Bincode).accept_type_name(v1_name())
    });
    let refused = producer
        .store(ReportV2 {
            id: 3,
            text: "new".into(),
            pages: Some(1),
        })
        .await;
    let Err(DeliveryError::Storage(why)) = &refused else {
        panic!("{refused:?}");
    };
    for part in ["stream `bincode`", "stored message 3", "version 1"] {
        assert!(why.contains(part), "{part}: {why}");
    }
    assert!(producer.stopped().await.is_err(), "stopped for good");
    assert!(handled.snapshot().is_empty(), "nothing sent");
    let rolled_back = |d: DurableOptions<ReportV1>| {
        bincode(d).accept_type_name(std::any::type_name::<ReportV2>())
    };
    let (producer, handled, reported) =
        report_pipeline::<ReportV1>(&journal, "bincode", rolled_back);
    idle_within_a_minute(&producer).await;
    assert_eq!(handled.snapshot(), [report(1), report(2)], "rolled back");
    settle_for(10).await;
    assert_eq!(
        reported.snapshot(),
        [(MessageId(3), Ok(())), (MessageId(6), Ok(()))]
    );
}

/// A durable producer's chunked message that is given up by a round (its last chunk never
/// confirmed: the consumer cannot decode it; `max_attempts` 2) is recorded and reported like
/// any give-up: its `send` hears `GaveUp`, a resumed one's sink does, and the producer goes
/// idle, nothing left unsettled.
#[actix::test]
async fn a_durable_chunked_message_given_up_by_a_round_is_recorded_and_reported() {
    tokio::time::pause();
    let journal = Arc::new(MemoryJournal::new());
    let (consumer, runs) = consumer(|b| b);
    let target = consumer.clone();
    // The first chunk's header byte spoiled: the whole message does not decode.
    let spoiling = ConsumerRef::from_fn(|_| {}).with_chunks(move |mut chunks| {
        for chunk in &mut chunks {
            let chunk: &mut ChunkDelivery<Vec<u8>> = chunk;
            if chunk.seq == chunk.chunk.first_seq {
                let mut bytes = chunk.bytes.to_vec();
                bytes[0] = 99;
                chunk.bytes = Bytes::from(bytes);
            }
        }
        target.addr().do_send(ChunkDeliveries(chunks));
    });
    let durable = |stream: &str| {
        DurableOptions::new(journal.clone(), PersistenceId::new(stream).unwrap(), stream)
    };
    let options = |to: ConsumerRef<Vec<u8>>| {
        ProducerOptions::builder(to)
            .chunk_size(1024)
            .max_attempts(2)
            .build()
            .unwrap()
    };
    let producer =
        ReliableDelivery::durable_producer(options(spoiling.clone()), durable("sent")).unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(60), producer.send(message(1, 5000))).await;
    assert_eq!(sent, Ok(Err(DeliveryError::GaveUp { attempts: 2 })));
    idle_within_a_minute(&producer).await;
    assert_eq!(producer.stats().await.unwrap().unconfirmed, 0);
    let nowhere = ConsumerRef::from_fn(|_| {}).with_chunks(|_| {});
    let first = ReliableDelivery::durable_producer(options(nowhere), durable("resumed")).unwrap();
    first.store(message(2, 5000)).await.unwrap();
    first.stop();
    first.stopped().await.unwrap();
    let (sink, reported) = durable_sink();
    let resumed = ReliableDelivery::durable_producer(
        options(spoiling),
        durable("resumed").confirmations(sink),
    )
    .unwrap();
    idle_within_a_minute(&resumed).await;
    assert_eq!(resumed.stats().await.unwrap().unconfirmed, 0);
    settle_for(10).await;
    assert_eq!(
        reported.snapshot(),
        [(MessageId(8), Err(DeliveryError::GaveUp { attempts: 2 }))] // 8 chunks
    );
    assert!(runs.snapshot().is_empty());
    assert_eq!(
        consumer.stats().await.unwrap().dead_letters,
        4,
        "two sendings each"
    );
}
