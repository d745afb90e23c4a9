//! Reliable delivery over a real NATS server (feature `nats`): `ACTIX_DELIVERY_NATS_URL`,
//! by default 127.0.0.1:4222. The server-restart test starts a server of its own
//! (`ACTIX_DELIVERY_NATS_SERVER`, by default `nats-server` on the PATH).

use crate::common;
use crate::nats_support;
use crate::remote;

use std::time::Duration;

use actix_delivery::nats::{NatsCarrierHandle, NatsError, NatsOptions, SubjectError};
use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
use bytes::Bytes;
use common::{confirm_into, Confirmations};
use futures_util::StreamExt;
use nats_support::{carrier, carrier_at, unique};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use remote::{assert_each_confirmed_once, recording_consumer, wait_until};

#[actix::test]
async fn n_messages_are_confirmed_and_each_body_is_encoded_once() {
    const N: u64 = 5000;
    let subject = unique("numbers");
    let (server, client) = (carrier().await, carrier().await);
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose(&subject, &consumer).await.unwrap();
    let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 64, 300);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(20), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "one subject");
    assert_eq!(handled.distinct() as u64, N);
    let (sent, received) = (client.stats(), server.stats());
    assert_eq!(sent.bodies_encoded, N, "each body encoded once: {sent:?}");
    assert_eq!(sent.acks_in, N);
    assert!(
        sent.frames_out < N / 4,
        "deliveries travel in batches: {sent:?}"
    );
    assert_eq!(received.deliveries_in, N);
    assert_eq!(received.decode_failures, 0);
    assert_eq!(sent.cached_bodies, 0, "every body forgotten once ACKed");
}

#[actix::test]
async fn acks_reach_the_right_producer_among_several_on_one_carrier() {
    const N: u64 = 500;
    let (numbers, words) = (unique("numbers"), unique("words"));
    let (server, client) = (carrier().await, carrier().await);
    let (number_consumer, handled) = recording_consumer::<(u32, u64)>();
    let (word_consumer, words_handled) = recording_consumer::<String>();
    server.expose(&numbers, &number_consumer).await.unwrap();
    server.expose(&words, &word_consumer).await.unwrap();
    let confirmations = Confirmations::<(u32, u64)>::default();
    let mut producers = Vec::new();
    for p in 0..3u32 {
        let target = client.consumer_ref::<(u32, u64)>(&numbers).unwrap();
        let producer = remote::producer(target, 16 << p, 200);
        for n in 1..=N {
            producer
                .tell((p, n), confirm_into(&confirmations, (p, n)))
                .unwrap();
        }
        producers.push(producer);
    }
    let word_producer = remote::producer(client.consumer_ref::<String>(&words).unwrap(), 32, 200);
    let word_confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        word_producer
            .tell(format!("word {n}"), confirm_into(&word_confirmations, n))
            .unwrap();
    }
    let all = 3 * N as usize;
    assert!(
        wait_until(Duration::from_secs(20), || confirmations.len() == all
            && word_confirmations.len() as u64 == N)
        .await
    );
    assert_each_confirmed_once(&word_confirmations, N, "words");
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    assert_eq!(handled.distinct(), all);
    assert_eq!(words_handled.distinct() as u64, N);
    assert_eq!(client.stats().unroutable_acks, 0);
}

/// The byte a NATS message of this protocol (4) starts with: not 4, which a message of
/// protocol 1 (its frame first) starts with.
const VERSION: u8 = 7;

/// Publishes `payload` as a message of this protocol (after its version) on `subject`,
/// asking for replies on `reply` (if any).
async fn publish(raw: &async_nats::Client, subject: &str, reply: Option<&str>, payload: Vec<u8>) {
    let mut message = vec![VERSION];
    message.extend(payload);
    publish_unversioned(raw, subject, reply, message).await;
}

/// Publishes `payload` as it is, as a carrier of protocol 1 did (the frame first).
async fn publish_unversioned(
    raw: &async_nats::Client,
    subject: &str,
    reply: Option<&str>,
    payload: Vec<u8>,
) {
    let subject = subject.to_string();
    match reply {
        Some(reply) => raw
            .publish_with_reply(subject, reply.to_string(), Bytes::from(payload))
            .await
            .unwrap(),
        None => raw.publish(subject, Bytes::from(payload)).await.unwrap(),
    }
}

/// A `Deliveries` frame by hand (the crate's bincode format: varints, strings with a length
/// prefix): one delivery of `body` from producer `p`, incarnation 1, seq 1.
fn deliveries_frame(consumer: &str, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![4, consumer.len() as u8];
    frame.extend_from_slice(consumer.as_bytes());
    // Producer id "p", incarnation (0, 1); one item: seq 1, window start 1, no trace context
    // (since version 3), not a chunk (since version 4).
    frame.extend_from_slice(&[1, b'p', 0, 1]);
    frame.extend_from_slice(&[1, 1, 1, 0, 0, body.len() as u8]);
    frame.extend_from_slice(body);
    frame
}

#[actix::test]
async fn garbage_is_refused_and_counted_and_the_consumer_goes_on() {
    let subject = unique("garbage");
    let (server, client) = (carrier().await, carrier().await);
    let (sink, dead) = common::dead_letter_log();
    let (consumer, handled) = {
        let handled = remote::Handled::<u64>(Default::default());
        let record_handled = handled.clone();
        let consumer = ReliableDelivery::consumer(
            ConsumerOptions::builder(DeliveryHandler::from_fn(move |n: u64| {
                record_handled.record(n);
                async { Ok::<(), String>(()) }
            }))
            .dead_letters(sink)
            .build()
            .unwrap(),
        );
        (consumer, handled)
    };
    server.expose(&subject, &consumer).await.unwrap();
    let raw = nats_support::client(&nats_support::url()).await;
    let replies = raw.new_inbox();
    let mut answers = nats_support::subscribed(&raw, &replies).await;
    // Not frames at all (no kind of this protocol starts with 7 or more), seeded.
    let mut rng = SmallRng::seed_from_u64(7);
    let mut refused = 0;
    for _ in 0..500 {
        let mut bytes: Vec<u8> = (0..rng.random_range(1..300))
            .map(|_| rng.random())
            .collect();
        bytes[0] = rng.random_range(7..=255);
        publish(&raw, &subject, Some(&replies), bytes).await;
        refused += 1;
    }
    // Frames of the wrong kind for a consumer's subject, empty, truncated, trailing bytes,
    // an identifier over 256 bytes.
    let good = deliveries_frame(&subject, &[2, 1, 7]);
    let mut trailing = good.clone();
    trailing.push(0);
    let mut long_id = vec![4, 251, 0x2c, 0x01]; // a 300-byte consumer name
    long_id.extend(std::iter::repeat_n(b'x', 300));
    long_id.extend_from_slice(&good[2 + subject.len()..]);
    for bytes in [
        vec![],
        vec![6],                   // Ping
        vec![3],                   // Accepted
        vec![5, 1, b'p', 0, 1, 0], // Acks
        good[..good.len() - 1].to_vec(),
        trailing,
        long_id,
    ] {
        publish(&raw, &subject, Some(&replies), bytes).await;
        refused += 1;
    }
    // A well-formed delivery without a reply subject: nowhere to ACK it.
    publish(&raw, &subject, None, good.clone()).await;
    // A well-formed delivery whose body is not a u64: a dead letter, no ACK.
    publish(
        &raw,
        &subject,
        Some(&replies),
        deliveries_frame(&subject, &[255]),
    )
    .await;
    raw.flush().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let stats = server.stats();
            stats.decode_failures == refused
                && stats.deliveries_without_reply == 1
                && stats.undecodable_bodies == 1
        })
        .await,
        "{:?}",
        server.stats()
    );
    assert!(wait_until(Duration::from_secs(5), || dead.len() == 1).await);
    assert_eq!(handled.total(), 0, "nothing of it reached the handler");
    // The well-formed delivery with a reply subject is handled and ACKed.
    publish(&raw, &subject, Some(&replies), good).await;
    let ack = tokio::time::timeout(Duration::from_secs(5), answers.next())
        .await
        .expect("an ACK")
        .unwrap();
    // Protocol 4, Acks: p, (0, 1), [1].
    assert_eq!(ack.payload.as_ref(), &[VERSION, 5, 1, b'p', 0, 1, 1, 1]);
    assert_eq!(handled.total(), 1);
    assert_eq!(server.stats().version_refusals, 0);

    // The same delivery as a carrier of protocol 1 sent it (the frame first, no version):
    // refused as another protocol's, counted, never handled.
    let before = server.stats().decode_failures;
    publish_unversioned(
        &raw,
        &subject,
        Some(&replies),
        deliveries_frame(&subject, &[2, 1, 8]),
    )
    .await;
    raw.flush().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let stats = server.stats();
            stats.version_refusals == 1 && stats.decode_failures == before + 1
        })
        .await,
        "{:?}",
        server.stats()
    );
    assert_eq!(handled.total(), 1, "nothing of it reached the handler");

    // A delivery as a carrier of protocol 2 sent it (its item has no trace context byte and
    // no chunk byte): refused as another protocol's, counted, never handled. (Protocol 3 is
    // read: see `a_protocol_3_delivery_is_read_and_acked`.)
    let mut old = vec![2];
    old.extend(deliveries_frame(&subject, &[2, 1, 8]));
    old.remove(old.len() - 5); // the item without its chunk byte
    old.remove(old.len() - 5); // nor its trace context byte
    publish_unversioned(&raw, &subject, Some(&replies), old).await;
    raw.flush().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let stats = server.stats();
            stats.version_refusals == 2 && stats.decode_failures == before + 2
        })
        .await,
        "{:?}",
        server.stats()
    );
    assert_eq!(handled.total(), 1, "nothing of it reached the handler");

    // Garbage on a producer's ACK inbox (learned from a delivery's reply subject).
    let mut spy = nats_support::subscribed(&raw, &subject).await;
    let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 16, 100);
    let confirmations = Confirmations::<u64>::default();
    producer
        .tell(100, confirm_into(&confirmations, 100))
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), spy.next())
        .await
        .unwrap()
        .unwrap();
    let inbox = seen.reply.expect("deliveries name the inbox").to_string();
    for bytes in [vec![4], vec![5, 1, b'p'], vec![200; 40]] {
        publish(&raw, &inbox, None, bytes).await;
    }
    // A well-formed ACK for an incarnation nobody has: unroutable.
    publish(&raw, &inbox, None, vec![5, 1, b'p', 0, 1, 1, 1]).await;
    for n in 101..=200 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 101).await);
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    assert!(
        wait_until(Duration::from_secs(5), || {
            let stats = client.stats();
            stats.decode_failures == 3 && stats.unroutable_acks == 1
        })
        .await,
        "{:?}",
        client.stats()
    );
    assert_eq!(handled.total(), 1 + 101);
}

/// A delivery as a carrier of protocol 3 publishes it (first byte 3; its item has no chunk
/// byte), written by hand: read, handled and ACKed at version 3, whatever this carrier writes
/// (4): a carrier of an older release reads no other version.
#[actix::test]
async fn a_protocol_3_delivery_is_read_and_acked() {
    let subject = unique("protocol-3");
    let server = carrier().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose(&subject, &consumer).await.unwrap();
    let raw = nats_support::client(&nats_support::url()).await;
    let replies = raw.new_inbox();
    let mut answers = nats_support::subscribed(&raw, &replies).await;
    let mut message = vec![3];
    message.extend(deliveries_frame(&subject, &[2, 1, 8]));
    message.remove(message.len() - 5); // the item without its chunk byte
    publish_unversioned(&raw, &subject, Some(&replies), message).await;
    let ack = tokio::time::timeout(Duration::from_secs(5), answers.next())
        .await
        .expect("an ACK")
        .unwrap();
    assert_eq!(ack.payload.as_ref(), &[3, 5, 1, b'p', 0, 1, 1, 1]);
    assert_eq!(handled.snapshot().get(&8), Some(&1));
    let stats = server.stats();
    assert_eq!((stats.version_refusals, stats.decode_failures), (0, 0));
}

/// Two carriers, one writing protocol 3 (`wire_version(3)`), the other the default 4: each
/// reads what the other writes, so plain messages are delivered and confirmed once both ways,
/// each carrier's messages starting with its version's byte, and every ACK starting with the
/// byte of the deliveries it answers: the carrier writing 3 stands for one of an older
/// release, which reads no other version, so an ACK at 4 would leave its messages handled and
/// never confirmed. A chunked message is delivered from the carrier writing 4; from the one
/// writing 3 it is held back (counted at every retransmission) and never published.
#[actix::test]
async fn carriers_writing_versions_3_and_4_deliver_to_each_other() {
    let old = carrier_at(
        &nats_support::url(),
        NatsOptions::builder().wire_version(3).build().unwrap(),
    )
    .await;
    let new = carrier().await;
    let raw = nats_support::client(&nats_support::url()).await;
    for (from, to, byte) in [(&old, &new, 3u8), (&new, &old, VERSION)] {
        const N: u64 = 200;
        let subject = unique("mixed");
        let mut spy = nats_support::subscribed(&raw, &subject).await;
        let (consumer, handled) = recording_consumer::<u64>();
        to.expose(&subject, &consumer).await.unwrap();
        let producer = remote::producer(from.consumer_ref::<u64>(&subject).unwrap(), 16, 100);
        let confirmations = Confirmations::<u64>::default();
        producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), spy.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.payload[0], byte, "the version byte the sender writes");
        // The ACKs of what follows, spied on the reply subject the batches name.
        let reply = seen.reply.expect("deliveries name the inbox").to_string();
        let mut acks = nats_support::subscribed(&raw, &reply).await;
        for n in 2..=N {
            producer.tell(n, confirm_into(&confirmations, n)).unwrap();
        }
        assert!(wait_until(Duration::from_secs(10), || confirmations.len() as u64 == N).await);
        assert_each_confirmed_once(&confirmations, N, "plain messages");
        assert_eq!((handled.distinct() as u64, handled.total() as u64), (N, N));
        let mut ack_bytes = Vec::new();
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(300), acks.next()).await
        {
            // The sender's probes come back on the same subject: only ACK frames count.
            let frame = message.payload.get(1..).map(actix_delivery::codec::decode);
            if let Some(Ok(remote::wire::Frame::Acks(_))) = frame {
                ack_bytes.push(message.payload[0]);
            }
        }
        assert!(!ack_bytes.is_empty(), "ACKs seen on {reply}");
        assert!(
            ack_bytes.iter().all(|&b| b == byte),
            "each ACK at the version of the deliveries it answers ({byte}): {ack_bytes:?}"
        );
    }

    let chunked = |from: &NatsCarrierHandle, subject: &str| {
        let target = from.consumer_ref::<Vec<u8>>(subject).unwrap();
        ReliableDelivery::producer(
            ProducerOptions::builder(target)
                .chunk_size(1024)
                .resend_timeout(Duration::from_millis(50))
                .build()
                .unwrap(),
        )
    };
    let message = vec![7u8; 3000];
    let subject = unique("chunks-from-4");
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    old.expose(&subject, &consumer).await.unwrap();
    assert_eq!(chunked(&new, &subject).send(message.clone()).await, Ok(()));
    assert_eq!(handled.snapshot().get(&message), Some(&1));

    let subject = unique("chunks-from-3");
    let mut spy = nats_support::subscribed(&raw, &subject).await;
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    new.expose(&subject, &consumer).await.unwrap();
    let producer = chunked(&old, &subject);
    producer.tell(message, |_| {}).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || old
            .stats()
            .chunks_held_for_version
            >= 6)
        .await,
        "retransmitted and held again: {:?}",
        old.stats()
    );
    assert_eq!(handled.total(), 0);
    assert_eq!(producer.stats().await.unwrap().confirmed, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), spy.next())
            .await
            .is_err(),
        "nothing published on the subject"
    );
    assert_eq!(new.stats().chunks_held_for_version, 0);
}

#[actix::test]
async fn a_subject_nobody_listens_on_costs_bounded_memory_until_a_consumer_comes() {
    const N: u64 = 2000;
    const WINDOW: usize = 16;
    let subject = unique("nobody");
    let options = NatsOptions::builder()
        .max_frame_length(8 << 10)
        .max_output_bytes(64 << 10)
        .build()
        .unwrap();
    let client = carrier_at(&nats_support::url(), options).await;
    let producer = remote::producer(
        client.consumer_ref::<Vec<u8>>(&subject).unwrap(),
        WINDOW,
        20,
    );
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        let body = n.to_le_bytes().repeat(8);
        producer
            .tell(body, confirm_into(&confirmations, n))
            .unwrap();
    }
    // Retransmitting into the void for a while: the window's bodies, one route, no more.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stats = client.stats();
    assert!(
        stats.deliveries_out > 10 * WINDOW as u64,
        "retransmitted: {stats:?}"
    );
    assert_eq!(stats.routes, 1);
    assert!(stats.cached_bodies <= WINDOW as u64, "{stats:?}");
    assert!(stats.output_high_water <= 64 << 10, "{stats:?}");
    assert_eq!(stats.bodies_encoded, WINDOW as u64, "{stats:?}");
    assert!(
        stats.no_responders > 0,
        "the server said nobody listens: {stats:?}"
    );
    assert_eq!(
        stats.decode_failures, 0,
        "its notices are not garbage: {stats:?}"
    );
    assert_eq!(
        stats.forged_no_responders, 0,
        "the server's notices answer the batches: {stats:?}"
    );
    assert_eq!(confirmations.len(), 0);
    // A consumer appears: everything arrives.
    let server = carrier().await;
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    server.expose(&subject, &consumer).await.unwrap();
    assert!(wait_until(Duration::from_secs(30), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "after the consumer came");
    assert_eq!(handled.distinct() as u64, N);
}

/// Two carriers each exposing a recording consumer in the queue group "workers" on
/// `subject`, and a third to send from.
async fn group_of_two(
    subject: &str,
) -> (
    [NatsCarrierHandle; 3],
    [actix_delivery::ConsumerHandle<u64>; 2],
    [remote::Handled<u64>; 2],
) {
    let (first, second, client) = (carrier().await, carrier().await, carrier().await);
    let (a, handled_a) = recording_consumer::<u64>();
    let (b, handled_b) = recording_consumer::<u64>();
    first.expose_in_group(subject, "workers", &a).await.unwrap();
    second
        .expose_in_group(subject, "workers", &b)
        .await
        .unwrap();
    ([first, second, client], [a, b], [handled_a, handled_b])
}

#[actix::test]
async fn a_queue_group_shares_the_load_and_takes_over_from_a_member_that_leaves() {
    const N: u64 = 3000;
    let subject = unique("group");
    let ([first, _second, client], [_a, _b], [handled_a, handled_b]) = group_of_two(&subject).await;
    let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 16, 100);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N / 2 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || confirmations.len() as u64
            == N / 2)
        .await
    );
    assert!(
        handled_a.distinct() > 0 && handled_b.distinct() > 0,
        "both members took batches: {} and {}",
        handled_a.distinct(),
        handled_b.distinct()
    );
    // The first member leaves mid-stream; the second takes everything from then on.
    for n in N / 2 + 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(first.unexpose(&subject));
    let before = handled_a.total();
    assert!(wait_until(Duration::from_secs(30), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "queue group");
    let mut all = handled_a.snapshot();
    for (n, count) in handled_b.snapshot() {
        *all.entry(n).or_default() += count;
    }
    assert!(
        (1..=N).all(|n| all.contains_key(&n)),
        "every message handled"
    );
    assert!(
        handled_a.total() <= before + 16 * 8,
        "the first member left"
    );
}

/// A connection that cannot be made says why, down to the socket's error.
#[actix::test]
async fn a_refused_connection_says_why() {
    // Port 1 on loopback: nothing listens there.
    let error = NatsCarrierHandle::connect("nats://127.0.0.1:1", NatsOptions::default())
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(error, NatsError::Connect(_)), "{error:?}");
    let error = error.to_string();
    assert!(
        error.starts_with("cannot connect to NATS: ")
            && error.contains("Connection refused (os error 111)"),
        "{error}"
    );
}

#[actix::test]
async fn invalid_subjects_and_groups_are_refused_with_the_reason() {
    let carrier = carrier().await;
    let (consumer, _) = recording_consumer::<u64>();
    for (subject, why) in [
        ("", SubjectError::Empty),
        ("a b", SubjectError::Whitespace),
        ("a..b", SubjectError::EmptyToken),
        ("orders.*", SubjectError::Wildcard),
        ("orders.>", SubjectError::Wildcard),
    ] {
        let refused = carrier.expose(subject, &consumer).await.unwrap_err();
        assert!(
            matches!(&refused, NatsError::InvalidSubject { why: w, .. } if *w == why),
            "{subject:?}: {refused}"
        );
        let refused = carrier.consumer_ref::<u64>(subject).err().unwrap();
        assert!(matches!(refused, NatsError::InvalidSubject { .. }));
    }
    let long = "x".repeat(257);
    assert!(matches!(
        carrier.consumer_ref::<u64>(&long).err().unwrap(),
        NatsError::InvalidSubject {
            why: SubjectError::TooLong(257),
            ..
        }
    ));
    let subject = unique("taken");
    let err = carrier
        .expose_in_group(&subject, "bad group", &consumer)
        .await
        .unwrap_err();
    assert!(matches!(err, NatsError::InvalidGroup { .. }), "{err}");
    carrier.expose(&subject, &consumer).await.unwrap();
    let err = carrier.expose(&subject, &consumer).await.unwrap_err();
    assert!(matches!(err, NatsError::Taken(_)), "{err}");
    assert!(carrier.unexpose(&subject));
    assert!(!carrier.unexpose(&subject));
    let unreachable =
        NatsCarrierHandle::connect("nats://127.0.0.1:1", NatsOptions::default()).await;
    assert!(matches!(unreachable, Err(NatsError::Connect(_))));
}

/// A NATS server of the test's own on a free port of 127.0.0.1.
struct OwnServer {
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnServer {
    fn start() -> Self {
        let port = remote::reusable_addr().port();
        let mut server = Self { port, child: None };
        server.restart();
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server and waits until it accepts connections.
    fn restart(&mut self) {
        let binary =
            std::env::var("ACTIX_DELIVERY_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let child = std::process::Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start {binary:?} ({err}): install nats-server or set \
                     ACTIX_DELIVERY_NATS_SERVER"
                )
            });
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the server.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[actix::test]
async fn the_server_killed_and_restarted_mid_stream_loses_nothing() {
    const N: u64 = 4000;
    let mut server = OwnServer::start();
    let subject = unique("restart");
    let options = NatsOptions::default;
    let (receiving, sending) = (
        carrier_at(&server.url(), options()).await,
        carrier_at(&server.url(), options()).await,
    );
    let (consumer, handled) = recording_consumer::<u64>();
    receiving.expose(&subject, &consumer).await.unwrap();
    let producer = remote::producer(sending.consumer_ref::<u64>(&subject).unwrap(), 64, 100);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    for restart in 1..=3u64 {
        assert!(
            wait_until(Duration::from_secs(20), || confirmations.len() as u64
                >= restart * N / 5)
            .await
        );
        server.kill();
        let at_kill = confirmations.len();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            confirmations.len() <= at_kill + 64,
            "nothing confirmed while the server is away"
        );
        server.restart();
    }
    assert!(wait_until(Duration::from_secs(60), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "server restarts");
    assert_eq!(handled.distinct() as u64, N);
    assert!(
        sending.stats().deliveries_out > N,
        "some deliveries were retransmitted after the restarts: {:?}",
        sending.stats()
    );
}

#[actix::test]
async fn a_reply_subject_outside_the_reply_prefix_is_refused() {
    let subject = unique("reflect");
    let server = carrier().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose(&subject, &consumer).await.unwrap();
    let raw = nats_support::client(&nats_support::url()).await;
    // A subject only the consumer's process may publish to, say.
    let victim = unique("billing.commands");
    let mut spy = nats_support::subscribed(&raw, &victim).await;
    publish(
        &raw,
        &subject,
        Some(&victim),
        deliveries_frame(&subject, &[2, 1, 7]),
    )
    .await;
    raw.flush().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || server
            .stats()
            .foreign_reply_subjects
            == 1)
        .await
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), spy.next())
            .await
            .is_err(),
        "the consumer published nothing to the named subject"
    );
    assert_eq!(handled.total(), 0);
    // A custom prefix: the carrier's own deliveries must be under it, or they are refused.
    let strict = carrier_at(
        &nats_support::url(),
        NatsOptions::builder()
            .reply_prefix("_MY_INBOX.")
            .build()
            .unwrap(),
    )
    .await;
    let other = unique("strict");
    strict.expose(&other, &consumer).await.unwrap();
    let producer = remote::producer(server.consumer_ref::<u64>(&other).unwrap(), 16, 50);
    producer.tell(1, |_| ()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || strict
            .stats()
            .foreign_reply_subjects
            > 0)
        .await
    );
}

#[actix::test]
async fn carriers_with_different_frame_limits_understand_each_other() {
    const N: u64 = 64;
    let subject = unique("limits");
    let small = NatsOptions::builder()
        .max_frame_length(4096)
        .max_output_bytes(1 << 20)
        .build()
        .unwrap();
    let (server, client) = (
        carrier_at(&nats_support::url(), small).await,
        carrier().await,
    );
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    server.expose(&subject, &consumer).await.unwrap();
    let producer = remote::producer(client.consumer_ref::<Vec<u8>>(&subject).unwrap(), 64, 100);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer
            .tell(vec![n as u8; 1000], confirm_into(&confirmations, n))
            .unwrap();
    }
    // The sender's batches (up to 1 MiB) are larger than the receiver's own limit (4 KiB).
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "different limits");
    assert_eq!(handled.distinct() as u64, N);
    assert_eq!(server.stats().decode_failures, 0);
}

#[actix::test]
async fn a_member_whose_consumer_stopped_leaves_the_queue_group() {
    const N: u64 = 400;
    let subject = unique("stopped-member");
    let ([first, _second, client], [a, _b], [handled_a, handled_b]) = group_of_two(&subject).await;
    a.stop();
    a.stopped().await;
    let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 16, 100);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() as u64 == N).await);
    assert_each_confirmed_once(&confirmations, N, "a stopped member");
    assert_eq!(handled_a.total(), 0);
    assert_eq!(handled_b.distinct() as u64, N);
    // It took at most the first batches before it noticed, then it left the group.
    let taken = first.stats().frames_in;
    assert!(
        taken <= 4,
        "the stopped member kept taking batches: {taken}"
    );
    // Its subject is free again.
    let (c, _) = recording_consumer::<u64>();
    first
        .expose_in_group(&subject, "workers", &c)
        .await
        .unwrap();
}

#[actix::test]
async fn a_stopped_carrier_refuses_to_expose_and_sends_nothing() {
    let subject = unique("stopped");
    let carrier = carrier().await;
    let producer = remote::producer(carrier.consumer_ref::<u64>(&subject).unwrap(), 16, 50);
    carrier.stop();
    let (consumer, _) = recording_consumer::<u64>();
    let refused = carrier.expose(&subject, &consumer).await;
    assert!(matches!(refused, Err(NatsError::Stopped)), "{refused:?}");
    for n in 1..=16 {
        producer.tell(n, |_| ()).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(5), || carrier
            .stats()
            .deliveries_unsendable
            >= 16)
        .await
    );
    assert_eq!(carrier.stats().deliveries_out, 0);
}

/// The resident set of this process, in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[actix::test]
async fn while_the_server_is_away_memory_stays_within_max_output_bytes() {
    let mut server = OwnServer::start();
    let options = NatsOptions::builder()
        .max_frame_length(128 << 10)
        .max_output_bytes(1 << 20)
        .build()
        .unwrap();
    let carrier = carrier_at(&server.url(), options).await;
    let subject = unique("away");
    let mut producers = Vec::new();
    for p in 0..16u8 {
        let producer = remote::producer(carrier.consumer_ref::<Vec<u8>>(&subject).unwrap(), 16, 20);
        for _ in 0..16 {
            producer.tell(vec![p; 4000], |_| ()).unwrap();
        }
        producers.push(producer);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_bytes();
    let sent_before = carrier.stats().frames_out;
    server.kill();
    // 16 producers retransmit 64 KiB every 20 ms into a client that cannot write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown = rss_bytes().saturating_sub(before);
    let stats = carrier.stats();
    assert!(
        stats.deliveries_dropped_full > 0,
        "the queue filled: {stats:?}"
    );
    assert!(stats.output_high_water <= 1 << 20, "{stats:?}");
    // Without the bound the client's buffer took 2 048 batches of 64 KiB (125 MiB).
    assert!(
        grown < 24 << 20,
        "max_output_bytes is 1 MiB, yet the process grew by {} MiB ({} messages queued \
         while the server was away)",
        grown >> 20,
        stats.frames_out - sent_before
    );
}

#[actix::test]
async fn a_consumer_that_does_not_take_its_batches_makes_the_carrier_drop_not_buffer() {
    const PRODUCERS: u64 = 40;
    let subject = unique("busy");
    let (server, client) = (carrier().await, carrier().await);
    // The consumer's own thread is blocked for a while by its first message, so its mailbox
    // takes nothing; the carrier's task (on this thread) keeps reading.
    let arbiter = actix::Arbiter::new();
    let handled = remote::Handled::<u64>(Default::default());
    let record = handled.clone();
    let blocked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = ReliableDelivery::consumer_in(&arbiter.handle(), move || {
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |n: u64| {
            if !blocked.swap(true, std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
            }
            record.record(n);
            async { Ok::<(), String>(()) }
        }))
        .build()
        .unwrap()
    });
    server.expose(&subject, &consumer).await.unwrap();
    let confirmations = Confirmations::<u64>::default();
    let mut producers = Vec::new();
    for p in 1..=PRODUCERS {
        let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 16, 100);
        producer.tell(p, confirm_into(&confirmations, p)).unwrap();
        producers.push(producer);
    }
    assert!(
        wait_until(Duration::from_secs(20), || confirmations.len() as u64
            == PRODUCERS)
        .await
    );
    assert_each_confirmed_once(&confirmations, PRODUCERS, "a busy consumer");
    let stats = server.stats();
    assert!(
        stats.deliveries_dropped_busy > 0,
        "one batch per producer arrived while the consumer was blocked: {stats:?}"
    );
    assert_eq!(handled.distinct() as u64, PRODUCERS);
    arbiter.stop();
}

/// A consumer on a thread of its own whose handler blocks that thread at its first message
/// until the returned sender sends (or is dropped), with a dead-letter log.
fn blockable_consumer() -> (
    actix::Arbiter,
    actix_delivery::ConsumerHandle<u64>,
    std::sync::mpsc::Sender<()>,
    common::Log<actix_delivery::DeadLetter>,
) {
    let arbiter = actix::Arbiter::new();
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    let blocked = std::sync::Arc::new(std::sync::Mutex::new(Some(blocked)));
    let (sink, dead) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer_in(&arbiter.handle(), move || {
        let blocked = blocked.clone();
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |_: u64| {
            if let Some(blocked) = blocked.lock().unwrap().take() {
                let _ = blocked.recv();
            }
            async { Ok::<(), String>(()) }
        }))
        .dead_letters(sink.clone())
        .build()
        .unwrap()
    });
    (arbiter, consumer, unblock, dead)
}

/// A `Deliveries` frame of `n` deliveries (seqs 1..=n) from producer `p`, each with a body
/// that is not a u64 (255 starts no bincode varint).
fn undecodable_frame(consumer: &str, n: u8) -> Vec<u8> {
    let mut frame = vec![4, consumer.len() as u8];
    frame.extend_from_slice(consumer.as_bytes());
    frame.extend_from_slice(&[1, b'p', 0, 1, n]);
    for seq in 1..=n {
        // Seq, window start 1, no trace context, not a chunk, a body of one byte.
        frame.extend_from_slice(&[seq, 1, 0, 0, 1, 255]);
    }
    frame
}

#[actix::test]
async fn undecodable_bodies_for_a_blocked_consumer_count_against_the_batch_bound() {
    const BATCHES: u64 = 100;
    const PER_BATCH: u8 = 100;
    let subject = unique("undecodable-flood");
    let server = carrier().await;
    let (arbiter, consumer, unblock, dead) = blockable_consumer();
    server.expose(&subject, &consumer).await.unwrap();
    let raw = nats_support::client(&nats_support::url()).await;
    let replies = raw.new_inbox();
    // The first delivery blocks the consumer's thread: its mailbox takes nothing more.
    publish(
        &raw,
        &subject,
        Some(&replies),
        deliveries_frame(&subject, &[2, 1, 7]),
    )
    .await;
    for _ in 0..BATCHES {
        let frame = undecodable_frame(&subject, PER_BATCH);
        publish(&raw, &subject, Some(&replies), frame).await;
    }
    raw.flush().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || server.stats().frames_in
            == 1 + BATCHES)
        .await,
        "{:?}",
        server.stats()
    );
    let stats = server.stats();
    let all = BATCHES * u64::from(PER_BATCH);
    assert_eq!(
        stats.undecodable_bodies + stats.deliveries_dropped_busy,
        all,
        "every body counted: {stats:?}"
    );
    // The blocking batch and at most 15 of dead letters wait for the consumer.
    assert!(
        stats.undecodable_bodies <= 15 * u64::from(PER_BATCH),
        "dead letters beyond the bound were handed over: {stats:?}"
    );
    drop(unblock);
    assert!(
        wait_until(Duration::from_secs(10), || dead.len() as u64
            == stats.undecodable_bodies)
        .await,
        "{} dead letters for {stats:?}",
        dead.len()
    );
    arbiter.stop();
}

/// A spy on `subject` (so that the server sees a listener) and what the first batch a carrier
/// publishes there tells: its reply subject, producer id, incarnation and first seq.
async fn spied_batch(spy: &mut async_nats::Subscriber) -> (String, remote::wire::Deliveries) {
    let seen = tokio::time::timeout(Duration::from_secs(5), spy.next())
        .await
        .expect("a batch")
        .unwrap();
    let reply = seen.reply.expect("deliveries name the inbox").to_string();
    assert_eq!(seen.payload[0], VERSION);
    match actix_delivery::codec::decode(&seen.payload[1..]).unwrap() {
        remote::wire::Frame::Deliveries(batch) => (reply, batch),
        other => panic!("{other:?}"),
    }
}

#[actix::test]
async fn an_ack_flood_at_a_busy_producer_is_bounded_and_counted() {
    const FRAMES: u64 = 40;
    const PER_FRAME: u64 = 1000;
    // What may wait for a producer: 8 full frames of ACKs (1024 each).
    const BOUND: u64 = 8 * 1024;
    let subject = unique("ack-flood");
    let client = carrier().await;
    let raw = nats_support::client(&nats_support::url()).await;
    let mut spy = nats_support::subscribed(&raw, &subject).await;
    // The producer on a thread of its own, which the test then blocks.
    let arbiter = actix::Arbiter::new();
    let producer = ReliableDelivery::producer(
        actix_delivery::ProducerOptions::builder(client.consumer_ref::<u64>(&subject).unwrap())
            .window_size(16)
            .arbiter(&arbiter.handle())
            .build()
            .unwrap(),
    );
    let confirmations = Confirmations::<u64>::default();
    producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
    let (inbox, batch) = spied_batch(&mut spy).await;
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    let (is_blocked, blocking) = tokio::sync::oneshot::channel::<()>();
    arbiter.spawn_fn(move || {
        let _ = is_blocked.send(());
        let _ = blocked.recv();
    });
    blocking.await.unwrap();
    // ACKs for the producer's live incarnation, the one seq it sent and more.
    for _ in 0..FRAMES {
        let acks = remote::wire::Frame::Acks(remote::wire::Acks {
            producer_id: batch.producer_id.clone(),
            incarnation: batch.incarnation,
            seqs: (1..=PER_FRAME).collect(),
        });
        let mut payload = vec![VERSION];
        payload.extend(actix_delivery::codec::encode(&acks).unwrap());
        raw.publish(inbox.clone(), payload.into()).await.unwrap();
    }
    raw.flush().await.unwrap();
    let counted = || {
        let stats = client.stats();
        stats.acks_in + stats.acks_dropped_busy
    };
    assert!(
        wait_until(Duration::from_secs(10), || counted() == FRAMES * PER_FRAME).await,
        "every ACK counted: {:?}",
        client.stats()
    );
    let stats = client.stats();
    assert!(
        stats.acks_in <= BOUND && stats.acks_dropped_busy > 0,
        "ACKs beyond the bound were handed to the busy producer: {stats:?}"
    );
    drop(unblock);
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 1).await);
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    arbiter.stop();
}

#[actix::test]
async fn a_no_responders_status_counts_only_as_the_answer_to_a_batch_the_carrier_published() {
    let (listened, nobody) = (unique("listened"), unique("nobody-notice"));
    let client = carrier().await;
    let raw = nats_support::client(&nats_support::url()).await;
    let mut spy = nats_support::subscribed(&raw, &listened).await;
    // One batch each (no retransmission within the test): to a subject the spy listens on,
    // and to one nobody listens on (the server's notice answers it).
    let to_listened = remote::producer(client.consumer_ref::<u64>(&listened).unwrap(), 16, 60_000);
    let to_nobody = remote::producer(client.consumer_ref::<u64>(&nobody).unwrap(), 16, 60_000);
    to_listened.tell(1, |_| ()).unwrap();
    to_nobody.tell(1, |_| ()).unwrap();
    let (reply, _) = spied_batch(&mut spy).await;
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().no_responders == 1).await,
        "the server's notice: {:?}",
        client.stats()
    );
    // Another client's statuses, once everything the carrier published has passed the
    // server: on the inbox's other subjects, and on the reply subject it learned, for a batch
    // the server delivered to it.
    nats_support::round_trip(client.client()).await;
    let (inbox, _) = reply.rsplit_once('.').unwrap();
    let url = nats_support::url();
    nats_support::publish_status_503(&url, &format!("{inbox}.0123456789abcdef"), 3).await;
    nats_support::publish_status_503(&url, &format!("{inbox}.x"), 2).await;
    nats_support::publish_status_503(&url, &reply, 3).await;
    let counted = || {
        let stats = client.stats();
        stats.no_responders + stats.forged_no_responders
    };
    assert!(
        wait_until(Duration::from_secs(5), || counted() == 1 + 8).await,
        "{:?}",
        client.stats()
    );
    let stats = client.stats();
    assert_eq!(
        (stats.no_responders, stats.forged_no_responders),
        (1, 8),
        "{stats:?}"
    );
    assert_eq!(stats.decode_failures, 0, "{stats:?}");
}

#[actix::test]
async fn no_responders_statuses_for_batches_that_were_delivered_are_counted_as_forged() {
    const N: u64 = 20;
    let subject = unique("delivered");
    let (server, client) = (carrier().await, carrier().await);
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose(&subject, &consumer).await.unwrap();
    let raw = nats_support::client(&nats_support::url()).await;
    let mut spy = nats_support::subscribed(&raw, &subject).await;
    // Window 1: one batch per message, each delivered and ACKed.
    let producer = remote::producer(client.consumer_ref::<u64>(&subject).unwrap(), 1, 60_000);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() as u64 == N).await);
    assert_eq!(
        (u64::from(handled.total()), client.stats().deliveries_out),
        (N, N)
    );
    // Everything the carrier published has passed the server; then a listener of the subject,
    // which learned the reply subject, claims that each batch went unanswered.
    let (reply, _) = spied_batch(&mut spy).await;
    nats_support::round_trip(client.client()).await;
    nats_support::publish_status_503(&nats_support::url(), &reply, N as usize).await;
    let counted = || {
        let stats = client.stats();
        stats.no_responders + stats.forged_no_responders
    };
    assert!(
        wait_until(Duration::from_secs(5), || counted() == N).await,
        "{:?}",
        client.stats()
    );
    let stats = client.stats();
    assert_eq!(
        (stats.no_responders, stats.forged_no_responders),
        (0, N),
        "every batch was answered by its consumer: {stats:?}"
    );
}

/// An entity whose every order is delivered to two destinations: two outbox lanes, two
/// producer ids under the entity's one incarnation.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct TwoLanes;

impl actix_delivery::persistence::EventSourced for TwoLanes {
    type Command = u64;
    type Event = u64;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, order: &u64) -> Result<actix_delivery::persistence::Decision<Self>, String> {
        Ok(actix_delivery::persistence::Decision::persist([*order], ())
            .deliver("a", order)
            .deliver("b", order))
    }

    fn apply(&mut self, _: &u64) {}
}

#[actix::test]
async fn two_outbox_lanes_sharing_an_incarnation_each_get_their_own_acks() {
    use actix_delivery::journal::{MemoryJournal, PersistenceId};
    use actix_delivery::persistence::{Outbox, PersistentHandle, PersistentOptions};
    const N: u64 = 100;
    let (subject_a, subject_b) = (unique("lane-a"), unique("lane-b"));
    let (server, client) = (carrier().await, carrier().await);
    let (a, handled_a) = recording_consumer::<u64>();
    let (b, handled_b) = recording_consumer::<u64>();
    server.expose(&subject_a, &a).await.unwrap();
    server.expose(&subject_b, &b).await.unwrap();
    let lane = || actix_delivery::ProducerConfig {
        window_size: 16,
        resend_timeout: Duration::from_millis(200),
        ..actix_delivery::ProducerConfig::default()
    };
    let outbox = Outbox::new()
        .destination("a", client.consumer_ref::<u64>(&subject_a).unwrap(), lane())
        .unwrap()
        .destination("b", client.consumer_ref::<u64>(&subject_b).unwrap(), lane())
        .unwrap();
    let entity = PersistentHandle::<TwoLanes>::start(
        PersistentOptions::new(
            std::sync::Arc::new(MemoryJournal::new()),
            PersistenceId::new("two-lanes").unwrap(),
        )
        .outbox(outbox)
        .supervised(),
    )
    .unwrap();
    for order in 1..=N {
        entity.ask(order).await.unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || client.stats().acks_in == 2 * N).await,
        "{:?}",
        client.stats()
    );
    assert_eq!(handled_a.distinct() as u64, N);
    assert_eq!(handled_b.distinct() as u64, N);
    let stats = client.stats();
    assert_eq!(
        (stats.unroutable_acks, stats.routes, stats.bodies_encoded),
        (0, 2, 2 * N),
        "a route per lane, each body encoded once: {stats:?}"
    );
}

/// A rolling deploy over NATS: an old carrier with `OrderV1`, a new one with `OrderV2` (a
/// field added with `#[serde(default)]`), no schema declared; each sends to the other's
/// subject: every message is confirmed, none is a dead letter, each side reads the other's
/// bodies as its own type. Then a breaking change (`Order`, schema version 2) on a third
/// carrier: version 1 bodies go through its upcaster; without one (a fourth) each is a dead
/// letter naming codec and versions; its version 2 bodies are dead letters at the old one.
#[actix::test]
async fn old_and_new_carriers_read_each_others_bodies_and_breaking_changes_need_an_upcaster() {
    use actix_delivery::tcp::BodySchema;
    use actix_delivery::DeadLetterReason;
    use remote::evolution::{
        assert_dead_letters, assert_read_both_ways, consumer, send, upcast, v1, v2, Exchanged,
        Order, OrderV1, OrderV2,
    };
    const N: u64 = 200;
    let (old, new) = (carrier().await, carrier().await);
    let (old_subject, new_subject) = (unique("orders-old"), unique("orders-new"));
    let (old_consumer, old_handled, old_dead) = consumer::<OrderV1>();
    let (new_consumer, new_handled, new_dead) = consumer::<OrderV2>();
    old.expose(&old_subject, &old_consumer).await.unwrap();
    new.expose(&new_subject, &new_consumer).await.unwrap();
    let to_new = remote::producer(old.consumer_ref::<OrderV1>(&new_subject).unwrap(), 64, 200);
    let to_old = remote::producer(new.consumer_ref::<OrderV2>(&old_subject).unwrap(), 64, 200);
    let (from_old, from_new) = (send(&to_new, N, v1), send(&to_old, N, v2));
    let exchanged = Exchanged {
        from_old: &from_old,
        from_new: &from_new,
        old: (&old_handled, &old_dead),
        new: (&new_handled, &new_dead),
    };
    assert_read_both_ways(N, exchanged).await;
    assert_eq!(
        old.stats().undecodable_bodies + new.stats().undecodable_bodies,
        0
    );

    let (upcasting, without) = (carrier().await, carrier().await);
    upcasting.body_schema(BodySchema::<Order>::new().version(2).upcast(upcast));
    without.body_schema(BodySchema::<Order>::new().version(2));
    let (read_subject, refused_subject) = (unique("orders-read"), unique("orders-refused"));
    let (read, read_handled, read_dead) = consumer::<Order>();
    let (refused, refused_handled, refused_dead) = consumer::<Order>();
    upcasting.expose(&read_subject, &read).await.unwrap();
    without.expose(&refused_subject, &refused).await.unwrap();
    let to_upcasting =
        remote::producer(old.consumer_ref::<OrderV1>(&read_subject).unwrap(), 16, 100);
    let confirmed = send(&to_upcasting, 50, v1);
    assert!(wait_until(Duration::from_secs(20), || confirmed.len() == 50).await);
    assert_each_confirmed_once(&confirmed, 50, "upcast");
    let expected: std::collections::HashMap<Order, u32> = (1..=50)
        .map(|id| {
            (
                Order {
                    id,
                    total_cents: id * 200,
                },
                1,
            )
        })
        .collect();
    assert_eq!(read_handled.snapshot(), expected);
    assert_eq!(read_dead.len(), 0);

    let to_without = remote::producer(
        old.consumer_ref::<OrderV1>(&refused_subject).unwrap(),
        16,
        100,
    );
    let unconfirmed = send(&to_without, 20, v1);
    let older = DeadLetterReason::IncompatibleBody {
        codec: 2,
        version: 1,
        current: 2,
    };
    assert_dead_letters(&refused_dead, 20, older).await;
    assert!(without.stats().undecodable_bodies >= 20);
    assert_eq!((refused_handled.total(), unconfirmed.len()), (0, 0));

    let back = remote::producer(
        upcasting.consumer_ref::<Order>(&old_subject).unwrap(),
        16,
        100,
    );
    let unconfirmed = send(&back, 5, |id| Order { id, total_cents: 1 });
    let newer = DeadLetterReason::IncompatibleBody {
        codec: 2,
        version: 2,
        current: 1,
    };
    assert_dead_letters(&old_dead, 5, newer).await;
    assert_eq!(old_handled.total(), N as u32, "nothing more handled");
    assert_eq!(unconfirmed.len(), 0);
}
