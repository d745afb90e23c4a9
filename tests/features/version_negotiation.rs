//! Protocol versions negotiated over TCP: a node set to offer version 3 (`wire_version`, for a
//! rolling upgrade) talks with a node of the default settings at the highest version both
//! speak, and what version 3 cannot carry (chunks) is held back and counted, not sent.

use crate::common;
use crate::remote;

use std::time::Duration;

use actix_delivery::tcp::{NodeHandle, NodeOptions};
use actix_delivery::{ProducerHandle, ProducerOptions, ReliableDelivery};
use common::{confirm_into, Confirmations};
use remote::{localhost, recording_consumer, secured, wait_until, wire};

/// A listening node in the suites' mode offering `wire_version` when it connects.
async fn node_offering(wire_version: u16) -> NodeHandle {
    let options = secured(NodeOptions::builder())
        .listen(localhost())
        .wire_version(wire_version)
        .build()
        .unwrap();
    NodeHandle::start(options).await.unwrap()
}

/// Sends 1..=n from `from` to the consumer "numbers" of `to`; asserts each is handled and
/// confirmed once.
async fn plain_messages_arrive_once(from: &NodeHandle, to: &NodeHandle, n: u64) {
    let (consumer, handled) = recording_consumer::<u64>();
    to.expose("numbers", &consumer).unwrap();
    let target = from
        .consumer_ref::<u64>(to.local_addr().unwrap(), "numbers")
        .unwrap();
    let producer = remote::producer(target, 16, 100);
    let confirmations = Confirmations::<u64>::default();
    for i in 1..=n {
        producer.tell(i, confirm_into(&confirmations, i)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() as u64 == n).await);
    remote::assert_each_confirmed_once(&confirmations, n, "plain messages");
    assert_eq!(handled.distinct() as u64, n);
    assert_eq!(handled.total() as u64, n, "each handled once");
    to.unexpose("numbers");
}

/// A producer on `from` sending in chunks of 1 KiB to the consumer "blobs" of `to`, which
/// records what it handles.
fn chunked_producer(
    from: &NodeHandle,
    to: &NodeHandle,
) -> (ProducerHandle<Vec<u8>>, remote::Handled<Vec<u8>>) {
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    to.expose("blobs", &consumer).unwrap();
    let target = from
        .consumer_ref::<Vec<u8>>(to.local_addr().unwrap(), "blobs")
        .unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .chunk_size(1024)
            .resend_timeout(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    (producer, handled)
}

/// A node offering version 3 connects at version 3 to a node of the default settings (which
/// speaks 3 and 4): plain messages are delivered and confirmed once each. On that connection a
/// chunked message is held back, counted in `chunks_held_for_version` at every retransmission,
/// and never delivered, and the connection stays up. The other way round, the default node
/// offers 4, which the accepting node speaks whatever it offers itself: plain and chunked
/// messages arrive.
#[actix::test]
async fn a_node_offering_version_3_delivers_plain_messages_at_3_and_holds_chunks_back() {
    let (old, new) = (node_offering(3).await, node_offering(4).await);
    plain_messages_arrive_once(&old, &new, 200).await;

    let (producer, handled) = chunked_producer(&old, &new);
    let message = vec![7u8; 3000];
    producer.tell(message.clone(), |_| {}).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || old
            .stats()
            .chunks_held_for_version
            >= 6)
        .await,
        "retransmitted and held again: {:?}",
        old.stats()
    );
    assert_eq!(handled.total(), 0, "nothing of the message arrived");
    let stats = producer.stats().await.unwrap();
    assert_eq!(stats.confirmed, 0);
    let old_stats = old.stats();
    assert_eq!(
        (old_stats.connections_opened, old_stats.decode_failures),
        (1, 0),
        "one connection, at version 3 throughout: {old_stats:?}"
    );
    assert_eq!(new.stats().decode_failures, 0);

    // The default node connects to the node offering 3 at version 4: chunks go through.
    plain_messages_arrive_once(&new, &old, 200).await;
    let (producer, handled) = chunked_producer(&new, &old);
    assert_eq!(producer.send(message.clone()).await, Ok(()));
    assert_eq!(handled.snapshot().get(&message), Some(&1));
    assert_eq!(new.stats().chunks_held_for_version, 0);
}

/// A raw client of protocol 3 (its frames written down independently of the crate, without
/// the chunk field) is answered at version 3 by a node of the default settings, and its
/// deliveries are handled and ACKed.
#[actix::test]
async fn a_client_of_protocol_3_is_answered_at_3_and_its_deliveries_are_acked() {
    let options = remote::fast(NodeOptions::builder().insecure_no_authentication())
        .listen(localhost())
        .build()
        .unwrap();
    let server = NodeHandle::start(options).await.unwrap();
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let mut stream = tokio::net::TcpStream::connect(server.local_addr().unwrap())
        .await
        .unwrap();
    let mut hello = wire::hello(false);
    if let wire::Frame::Hello(hello) = &mut hello {
        hello.version = 3;
    }
    wire::write(&mut stream, &hello).await.unwrap();
    let challenge = wire::read(&mut stream, Duration::from_secs(5)).await;
    assert!(
        matches!(
            challenge,
            Some(wire::Frame::Challenge(wire::Challenge { version: 3, .. }))
        ),
        "{challenge:?}"
    );
    wire::write(
        &mut stream,
        &wire::Frame::Proof(wire::Proof { proof: None }),
    )
    .await
    .unwrap();
    assert_eq!(
        wire::read(&mut stream, Duration::from_secs(5)).await,
        Some(wire::Frame::Accepted)
    );
    wire::write(&mut stream, &wire::deliveries_v3("numbers", [1, 2, 3]))
        .await
        .unwrap();
    let acks = wire::next_acks(&mut stream).await.expect("ACKs");
    assert_eq!(acks.seqs, [1, 2, 3]);
    assert_eq!(handled.distinct(), 3);
    assert_eq!(server.stats().decode_failures, 0);
}

/// A node of an older release that speaks only version 3 closes a connection offering 4
/// without a word (as a release without negotiation refuses any other version): the
/// connecting node's warning says so and names the setting that lets them talk,
/// `wire_version`.
#[actix::test]
async fn a_peer_closing_during_the_handshake_is_warned_about_with_a_hint_at_wire_version() {
    common::logs::keep();
    let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let older = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let hello = wire::read(&mut stream, Duration::from_secs(5)).await;
            assert!(
                matches!(
                    hello,
                    Some(wire::Frame::Hello(wire::Hello { version: 4, .. }))
                ),
                "{hello:?}"
            );
            drop(stream); // not version 3: refused
        }
    });
    let options = remote::fast(NodeOptions::builder().insecure_no_authentication())
        .build()
        .unwrap();
    let client = NodeHandle::start(options).await.unwrap();
    assert_eq!(client.dial(addr).await, None);
    let logged = common::logs::lines_containing(&[
        &format!("{addr} closed the connection during the handshake"),
        "offer of version 4: set this node's wire_version to the version it speaks",
    ]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    older.abort();
}
