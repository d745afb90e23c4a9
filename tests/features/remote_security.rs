//! Authentication and untrusted input, over real TCP on 127.0.0.1: peers without the secret,
//! replayed handshakes, garbage and malformed frames; with the `tls` feature, certificates of
//! a wrong CA, expired or for another name, peers of another mode, and identities not
//! authorized for a consumer. Each test checks that nothing reached a consumer that should
//! not have, and that the node went on serving honest peers.

use crate::common;
use crate::remote;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
use actix_delivery::{
    ConsumerOptions, DeadLetter, DeadLetterReason, DeliveryHandler, Incarnation, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use common::{confirm_into, Confirmations, Log};
use remote::proxy::{Faults, Proxy};
use remote::wire::{self, Frame, Item};
use remote::{fast, localhost, recording_consumer, secret_listening_node, wait_until, Handled};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A secure server exposing a recording `u64` consumer as "numbers".
async fn server() -> (NodeHandle, Handled<u64>) {
    let node = secret_listening_node().await;
    let (consumer, handled) = recording_consumer::<u64>();
    node.expose("numbers", &consumer).unwrap();
    (node, handled)
}

async fn insecure_server() -> (NodeHandle, Handled<u64>, Log<DeadLetter>) {
    let options = fast(NodeOptions::builder().insecure_no_authentication())
        .listen(localhost())
        .build()
        .unwrap();
    let node = NodeHandle::start(options).await.unwrap();
    let handled = Handled::<u64>(Default::default());
    let record = handled.clone();
    let (sink, dead) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |n: u64| {
            record.record(n);
            async { Ok::<(), String>(()) }
        }))
        .dead_letters(sink)
        .build()
        .unwrap(),
    );
    node.expose("numbers", &consumer).unwrap();
    (node, handled, dead)
}

/// A producer on `node` sending 1..=n to "numbers" at `addr`, retransmitting every 50 ms.
fn produce(
    node: &NodeHandle,
    addr: SocketAddr,
    n: u64,
) -> (ProducerHandle<u64>, Confirmations<u64>) {
    let target = node.consumer_ref::<u64>(addr, "numbers").unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .resend_timeout(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    let confirmations = Confirmations::default();
    for i in 1..=n {
        producer.tell(i, confirm_into(&confirmations, i)).unwrap();
    }
    (producer, confirmations)
}

async fn client_with(options: NodeOptions) -> NodeHandle {
    NodeHandle::start(options).await.unwrap()
}

/// A node with the test secret that does not listen.
async fn secret_sending_node() -> NodeHandle {
    client_with(
        fast(NodeOptions::builder().secret(remote::secret()))
            .build()
            .unwrap(),
    )
    .await
}

#[actix::test]
async fn a_wrong_secret_or_no_secret_is_refused_and_nothing_is_handled() {
    let (server, handled) = server().await;
    let addr = server.local_addr().unwrap();
    let wrong = client_with(
        fast(NodeOptions::builder().secret(NodeSecret::new([9u8; 32]).unwrap()))
            .build()
            .unwrap(),
    )
    .await;
    let none = client_with(
        fast(NodeOptions::builder().insecure_no_authentication())
            .build()
            .unwrap(),
    )
    .await;
    let (p1, c1) = produce(&wrong, addr, 10);
    let (p2, c2) = produce(&none, addr, 10);
    assert!(
        wait_until(Duration::from_secs(5), || server.stats().handshake_failures
            >= 4)
        .await,
        "{:?}",
        server.stats()
    );
    assert_eq!(handled.total(), 0, "no delivery reached the consumer");
    assert_eq!(server.stats().connections_accepted, 0);
    assert_eq!(server.stats().deliveries_in, 0);
    assert!(
        wrong.stats().handshake_failures > 0,
        "the client refused the server too"
    );
    assert_eq!(wrong.stats().connections_opened, 0);
    assert_eq!((c1.len(), c2.len()), (0, 0), "nothing confirmed");
    assert!(p1.stats().await.unwrap().retransmitted > 0);
    assert!(p2.stats().await.unwrap().retransmitted > 0);

    // A secure client refuses an insecure server as well.
    let (insecure, handled, _) = insecure_server().await;
    let (_p3, c3) = produce(&wrong, insecure.local_addr().unwrap(), 5);
    assert!(
        wait_until(Duration::from_secs(5), || insecure
            .stats()
            .handshake_failures
            >= 2)
        .await
    );
    assert_eq!((handled.total(), c3.len()), (0, 0));

    // The server still serves an honest client.
    let honest = secret_sending_node().await;
    let (_p4, c4) = produce(&honest, addr, 10);
    assert!(wait_until(Duration::from_secs(5), || c4.len() == 10).await);
}

#[actix::test]
async fn replayed_handshakes_are_refused_both_ways() {
    let (server, handled) = server().await;
    let proxy = Proxy::start(
        server.local_addr().unwrap(),
        Faults {
            record: true,
            ..Faults::default()
        },
        1,
    )
    .await;
    // A genuine exchange through the recording proxy.
    let client = secret_sending_node().await;
    let (producer, confirmations) = produce(&client, proxy.addr, 20);
    assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 20).await);
    producer.stop();
    let recorded = proxy.recorded.lock().unwrap()[0].clone();
    assert!(recorded.to_server.len() > 100 && recorded.to_client.len() > 100);
    assert_eq!(handled.total(), 20);
    let before = server.stats();

    // 1. Everything the client sent, replayed to the server: its proof was made for another
    //    server nonce, so the server refuses it and none of the deliveries behind it counts.
    let mut replay = TcpStream::connect(server.local_addr().unwrap())
        .await
        .unwrap();
    replay.write_all(&recorded.to_server).await.unwrap();
    assert!(wire::closed_by_peer(&mut replay, Duration::from_secs(5)).await);
    assert!(
        wait_until(Duration::from_secs(2), || {
            server.stats().handshake_failures == before.handshake_failures + 1
        })
        .await
    );
    assert_eq!(server.stats().deliveries_in, before.deliveries_in);
    assert_eq!(server.stats().connections_accepted, 1);

    // 2. Everything the server sent, replayed to a client that connects to a fake server:
    //    the challenge's proof covers another client nonce.
    let fake = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let to_client = recorded.to_client.clone();
    actix::spawn(async move {
        while let Ok((mut stream, _)) = fake.accept().await {
            let _ = stream.write_all(&to_client).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let victim = secret_sending_node().await;
    let (_p, fooled) = produce(&victim, fake_addr, 5);
    assert!(
        wait_until(Duration::from_secs(5), || victim.stats().handshake_failures
            >= 2)
        .await
    );
    assert_eq!(victim.stats().connections_opened, 0);
    assert_eq!(fooled.len(), 0, "no forged ACK confirmed anything");
    assert_eq!(handled.total(), 20, "nothing was handled twice or anew");
}

#[actix::test]
async fn garbage_and_oversize_length_prefixes_before_the_handshake_are_refused() {
    let (server, handled) = server().await;
    let addr = server.local_addr().unwrap();
    let attempts: [&[u8]; 4] = [
        &u32::MAX.to_be_bytes(), // claims 4 GiB: refused before anything is reserved
        &257u32.to_be_bytes(),   // over the 256-byte handshake limit
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0, 0, 0, 3, 0, 1, 2], // a Hello cut short
    ];
    for bytes in attempts {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        assert!(wire::closed_by_peer(&mut stream, Duration::from_secs(5)).await);
    }
    // A silent connection is closed after the handshake timeout.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(wire::closed_by_peer(&mut silent, Duration::from_secs(5)).await);
    assert!(
        wait_until(Duration::from_secs(2), || server.stats().handshake_failures
            == 5)
        .await
    );
    assert_eq!(handled.total(), 0);
    let honest = secret_sending_node().await;
    let (_p, confirmations) = produce(&honest, addr, 3);
    assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 3).await);
}

#[actix::test]
async fn a_frame_that_does_not_decode_closes_only_its_connection() {
    let (server, handled, _) = insecure_server().await;
    let addr = server.local_addr().unwrap();
    let mut bad = wire::insecure_client(addr).await;
    let mut good = wire::insecure_client(addr).await;
    let oversize_id = Frame::Deliveries(wire::Deliveries {
        consumer: "numbers".into(),
        producer_id: "x".repeat(257),
        incarnation: Incarnation::from_u128(1),
        items: vec![Item {
            seq: 1,
            window_start: 1,
            trace_context: None,
            chunk: None,
            body: wire::body(&1u64),
        }],
    });
    let garbage: Vec<u8> = [&[0u8, 0, 0, 5][..], &[9, 9, 9, 9, 9]].concat();
    for (i, attempt) in [
        wire::frame_bytes(&oversize_id),
        garbage,
        wire::frame_bytes(&Frame::Proof(wire::Proof { proof: None })), // out of turn
        (2u32 << 20).to_be_bytes().to_vec(),                           // over max_frame_length
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            bad = wire::insecure_client(addr).await;
        }
        bad.write_all(&attempt).await.unwrap();
        assert!(
            wire::closed_by_peer(&mut bad, Duration::from_secs(5)).await,
            "attempt {i}"
        );
    }
    assert!(
        wait_until(Duration::from_secs(2), || server.stats().decode_failures
            == 4)
        .await
    );
    assert_eq!(handled.total(), 0);
    // The other connection was never disturbed.
    wire::write(&mut good, &wire::deliveries("numbers", [1, 2]))
        .await
        .unwrap();
    let acks = wire::next_acks(&mut good)
        .await
        .expect("ACKs on the good connection");
    assert_eq!(acks.producer_id, "p");
    assert_eq!(acks.seqs, [1, 2]);
    assert_eq!(handled.total(), 2);
}

#[actix::test]
async fn bad_fields_become_dead_letters_and_unknown_names_are_dropped() {
    let (server, handled, dead) = insecure_server().await;
    let mut peer = wire::insecure_client(server.local_addr().unwrap()).await;
    let malformed = Frame::Deliveries(wire::Deliveries {
        consumer: "numbers".into(),
        producer_id: String::new(),
        incarnation: Incarnation::from_u128(3),
        items: vec![Item {
            seq: 1,
            window_start: 1,
            trace_context: None,
            chunk: None,
            body: wire::body(&1u64),
        }],
    });
    let mut seq_zero = wire::deliveries("numbers", [0]);
    if let Frame::Deliveries(batch) = &mut seq_zero {
        batch.items[0].window_start = 0;
    }
    let mut window_past_seq = wire::deliveries("numbers", [5]);
    if let Frame::Deliveries(batch) = &mut window_past_seq {
        batch.items[0].window_start = 6;
    }
    for frame in [&malformed, &seq_zero, &window_past_seq] {
        wire::write(&mut peer, frame).await.unwrap();
    }
    wire::write(&mut peer, &wire::deliveries("nobody", [1, 2, 3]))
        .await
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || dead.len() == 3).await);
    let reasons: Vec<DeadLetterReason> = dead.snapshot().iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        [
            DeadLetterReason::EmptyProducerId,
            DeadLetterReason::SeqOutOfRange(0),
            DeadLetterReason::WindowStartOutOfRange {
                window_start: 6,
                seq: 5
            },
        ]
    );
    assert!(
        wait_until(Duration::from_secs(2), || server.stats().unknown_consumer
            == 3)
        .await
    );
    assert_eq!(
        server.stats().decode_failures,
        0,
        "none of this closes the connection"
    );
    wire::write(&mut peer, &wire::deliveries("numbers", [1]))
        .await
        .unwrap();
    assert_eq!(wire::next_acks(&mut peer).await.unwrap().seqs, [1]);
    assert_eq!(handled.total(), 1);
}

#[actix::test]
async fn a_peer_that_stops_reading_cannot_grow_the_senders_memory() {
    const WINDOW: usize = 256;
    const LIMIT: usize = 64 * 1024;
    let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = client_with(
        NodeOptions::builder()
            .insecure_no_authentication()
            .max_frame_length(16 * 1024)
            .max_output_bytes(LIMIT)
            .build()
            .unwrap(),
    )
    .await;
    let target = node.consumer_ref::<Vec<u8>>(addr, "sink").unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .window_size(WINDOW)
            .resend_timeout(Duration::from_millis(10))
            .build()
            .unwrap(),
    );
    for i in 0..5_000u32 {
        producer.tell(vec![i as u8; 1024], |_| {}).unwrap();
    }
    // The peer completes the handshake, then reads nothing: socket buffers fill, then the
    // node's output, then deliveries are dropped.
    let _stalled = wire::insecure_server_once(&listener).await;
    assert!(
        wait_until(Duration::from_secs(10), || node
            .stats()
            .deliveries_dropped_full
            > 1000)
        .await,
        "{:?}",
        node.stats()
    );
    let stats = node.stats();
    assert!(stats.output_high_water as usize <= LIMIT, "{stats:?}");

    assert!(stats.cached_bodies as usize <= WINDOW, "{stats:?}");
    assert_eq!(stats.routes, 1);
    let producer_stats = producer.stats().await.unwrap();
    assert!(producer_stats.in_flight <= WINDOW);
    assert_eq!(producer_stats.confirmed, 0);
    assert_eq!(
        stats.bodies_encoded, WINDOW as u64,
        "retransmissions reuse the bytes"
    );
}

/// An on-path attacker without the secret rewrites the frame limit the client announces in
/// its `Hello` (to the smallest valid value): the proofs bind it, so the handshake fails and
/// nothing is delivered, instead of a session with a limit neither side chose.
#[actix::test]
async fn an_altered_frame_limit_in_the_handshake_is_detected() {
    let (server, handled) = server().await;
    let upstream = server.local_addr().unwrap();
    let relay = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let rewritten = Arc::new(AtomicU64::new(0));
    let count = rewritten.clone();
    actix::spawn(async move {
        while let Ok((mut client, _)) = relay.accept().await {
            let count = count.clone();
            actix::spawn(async move {
                let Some(Frame::Hello(mut hello)) =
                    wire::read(&mut client, Duration::from_secs(5)).await
                else {
                    return;
                };
                hello.max_frame_length = 4096;
                count.fetch_add(1, Ordering::Relaxed);
                let mut server = TcpStream::connect(upstream).await.unwrap();
                if wire::write(&mut server, &Frame::Hello(hello)).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let client = secret_sending_node().await;
    let (_producer, confirmations) = produce(&client, relay_addr, 5);
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().handshake_failures
            >= 2)
        .await,
        "{:?}",
        client.stats()
    );
    assert!(
        rewritten.load(Ordering::Relaxed) >= 2,
        "the relay altered Hellos"
    );
    assert_eq!(client.stats().connections_opened, 0);
    assert_eq!(server.stats().connections_accepted, 0);
    assert_eq!((handled.total(), confirmations.len()), (0, 0));
    // Unaltered, the same client and server connect.
    let (_p, direct) = produce(&client, upstream, 5);
    assert!(wait_until(Duration::from_secs(5), || direct.len() == 5).await);
}

/// A body that does not decode as the exposed consumer's type is that delivery's fault, not
/// the connection's: it becomes a dead letter (counted), the good deliveries of the same
/// batch are handled and ACKed, and the connection stays open.
#[actix::test]
async fn an_undecodable_body_is_a_dead_letter_and_the_rest_of_its_batch_is_delivered() {
    let (server, handled, dead) = insecure_server().await;
    let mut peer = wire::insecure_client(server.local_addr().unwrap()).await;
    let mut batch = wire::deliveries("numbers", [1, 2, 3]);
    if let Frame::Deliveries(deliveries) = &mut batch {
        deliveries.items[1].body = vec![0xff, 0xff]; // not the encoding of a u64
    }
    wire::write(&mut peer, &batch).await.unwrap();
    let acks = wire::next_acks(&mut peer)
        .await
        .expect("ACKs on the same connection");
    assert_eq!(acks.seqs, [1, 3]);
    assert_eq!(handled.snapshot(), [(1, 1), (3, 1)].into());
    assert!(wait_until(Duration::from_secs(5), || dead.len() == 1).await);
    let letter = &dead.snapshot()[0];
    assert_eq!(letter.reason, DeadLetterReason::UndecodableBody);
    assert_eq!((letter.producer_id.as_str(), letter.seq), ("p", 2));
    let stats = server.stats();
    assert_eq!(stats.decode_failures, 0, "the connection was not closed");
    assert_eq!((stats.undecodable_bodies, stats.deliveries_in), (1, 2));

    // The connection goes on.
    wire::write(&mut peer, &wire::deliveries("numbers", [4]))
        .await
        .unwrap();
    assert_eq!(wire::next_acks(&mut peer).await.unwrap().seqs, [4]);
}

/// Blocks `arbiter`'s thread (as a handler that computes for long would) until the returned
/// sender is dropped.
async fn block(arbiter: &actix::Arbiter) -> std::sync::mpsc::Sender<()> {
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    let (entered, in_effect) = tokio::sync::oneshot::channel();
    arbiter.spawn(async move {
        let _ = entered.send(());
        let _ = blocked.recv();
    });
    in_effect.await.unwrap();
    release
}

/// Frames of deliveries whose bodies do not decode as the consumer's type count against the
/// receive bound like any other: while the consumer's thread is blocked, the node reads at
/// most 8 frames of them (TCP slows the sender) instead of turning all into dead letters in
/// the consumer's mailbox; once it runs again, every one is a counted dead letter.
#[actix::test]
async fn undecodable_bodies_count_against_the_receive_bound_of_a_busy_consumer() {
    const FRAMES: u64 = 200;
    const PER_FRAME: u64 = 100;
    let options = fast(NodeOptions::builder().insecure_no_authentication())
        .listen(localhost())
        .build()
        .unwrap();
    let server = NodeHandle::start(options).await.unwrap();
    let arbiter = actix::Arbiter::new();
    let (sink, dead) = common::dead_letter_log();
    let consumer = ReliableDelivery::consumer_in(&arbiter.handle(), move || {
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            Ok::<(), String>(())
        }))
        .dead_letters(sink)
        .build()
        .unwrap()
    });
    server.expose("numbers", &consumer).unwrap();
    let release = block(&arbiter).await;
    let mut peer = wire::insecure_client(server.local_addr().unwrap()).await;
    let mut bytes = Vec::new();
    for frame in 0..FRAMES {
        bytes.extend(wire::frame_bytes(&Frame::Deliveries(wire::Deliveries {
            consumer: "numbers".into(),
            producer_id: "p".into(),
            incarnation: Incarnation::from_u128(7),
            items: (1..=PER_FRAME)
                .map(|i| Item {
                    seq: frame * PER_FRAME + i,
                    window_start: 1,
                    trace_context: None,
                    chunk: None,
                    body: vec![0xff, 0xff], // not the encoding of a u64
                })
                .collect(),
        })));
    }
    let writer = actix::spawn(async move {
        peer.write_all(&bytes).await.unwrap();
        peer
    });
    assert!(wait_until(Duration::from_secs(5), || server.stats().frames_in >= 8).await);
    assert!(
        !wait_until(Duration::from_millis(500), || server.stats().frames_in > 8).await,
        "the node read on while the consumer took nothing: {:?}",
        server.stats()
    );
    assert_eq!(server.stats().undecodable_bodies, 8 * PER_FRAME);
    drop(release);
    assert!(
        wait_until(Duration::from_secs(20), || dead.len() as u64
            == FRAMES * PER_FRAME)
        .await,
        "{} dead letters: {:?}",
        dead.len(),
        server.stats()
    );
    let _peer = writer.await.unwrap();
    let stats = server.stats();
    assert_eq!(stats.undecodable_bodies, FRAMES * PER_FRAME, "{stats:?}");
    assert_eq!((stats.frames_in, stats.deliveries_in), (FRAMES, 0));
    assert_eq!(stats.decode_failures, 0, "the connection stayed open");
    assert!(dead
        .snapshot()
        .iter()
        .all(|letter| letter.reason == DeadLetterReason::UndecodableBody));
    arbiter.stop();
}

/// A peer floods ACK frames at a producer whose thread is busy: the node hands at most 8 192
/// ACKs to it before it takes them, drops and counts the rest, and admits ACKs again once the
/// producer took those, so its mailbox never grows with the flood.
#[actix::test]
async fn an_ack_flood_at_a_busy_producer_is_bounded_and_counted() {
    const FRAMES: u64 = 100;
    const PER_FRAME: u64 = 1024;
    let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = client_with(
        NodeOptions::builder()
            .insecure_no_authentication()
            .build()
            .unwrap(),
    )
    .await;
    let arbiter = actix::Arbiter::new();
    let target = node.consumer_ref::<u64>(addr, "numbers").unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .resend_timeout(Duration::from_millis(50))
            .arbiter(&arbiter.handle())
            .build()
            .unwrap(),
    );
    let confirmations = Confirmations::<u64>::default();
    producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
    let mut peer = wire::insecure_server_once(&listener).await;
    let batch = loop {
        match wire::read(&mut peer, Duration::from_secs(5)).await {
            Some(Frame::Deliveries(batch)) => break batch,
            Some(Frame::Ping) => {}
            other => panic!("{other:?}"),
        }
    };
    let release = block(&arbiter).await;
    let flood = wire::frame_bytes(&Frame::Acks(wire::Acks {
        producer_id: batch.producer_id.clone(),
        incarnation: batch.incarnation,
        seqs: (1..=PER_FRAME).collect(),
    }));
    let bytes: Vec<u8> = (0..FRAMES).flat_map(|_| flood.iter().copied()).collect();
    peer.write_all(&bytes).await.unwrap();
    let total = FRAMES * PER_FRAME;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let stats = node.stats();
            stats.acks_in + stats.acks_dropped_busy == total
        })
        .await,
        "{:?}",
        node.stats()
    );
    let stats = node.stats();
    assert_eq!(stats.acks_in, 8 * PER_FRAME, "{stats:?}");
    assert_eq!(stats.acks_dropped_busy, total - 8 * PER_FRAME);
    drop(release);
    // The producer takes what it was handed (seq 1's ACK among it), then ACKs are admitted
    // again.
    assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 1).await);
    let one = wire::frame_bytes(&Frame::Acks(wire::Acks {
        producer_id: batch.producer_id,
        incarnation: batch.incarnation,
        seqs: vec![1],
    }));
    assert!(
        wait_until(Duration::from_secs(5), || {
            let admitted = node.stats().acks_in > 8 * PER_FRAME;
            if !admitted {
                let _ = peer.try_write(&one);
            }
            admitted
        })
        .await,
        "{:?}",
        node.stats()
    );
    arbiter.stop();
}

/// Bare TCP connections that never send a byte, at about 1 000 a second and held open, do not
/// keep an honest node out: in-handshake connections have a budget of their own
/// (`max_handshakes`) that evicts the oldest, apart from `max_connections`. The handshake
/// timeout is long here, so that without eviction the flood would hold every place for the
/// whole test.
#[actix::test]
async fn a_connection_flood_without_the_secret_does_not_lock_out_an_honest_node() {
    const FLOOD_MAX: u64 = 20_000;
    let options = NodeOptions::builder()
        .secret(remote::secret())
        .listen(localhost())
        .handshake_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let server = NodeHandle::start(options).await.unwrap();
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let addr = server.local_addr().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, opened) = (stop.clone(), opened.clone());
        actix::spawn(async move {
            // Each connection is held until the node closes it (at most 60 s).
            let mut held = tokio::task::JoinSet::new();
            while !stop.load(Ordering::Relaxed) && opened.load(Ordering::Relaxed) < FLOOD_MAX {
                if let Ok(mut stream) = TcpStream::connect(addr).await {
                    opened.fetch_add(1, Ordering::Relaxed);
                    held.spawn(async move {
                        let mut byte = [0u8; 1];
                        let read = tokio::io::AsyncReadExt::read(&mut stream, &mut byte);
                        let _ = tokio::time::timeout(Duration::from_secs(60), read).await;
                    });
                }
                while held.try_join_next().is_some() {}
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // More connections than max_connections (256) have come.
    assert!(
        wait_until(Duration::from_secs(20), || opened.load(Ordering::Relaxed)
            > 300)
        .await
    );
    let client = secret_sending_node().await;
    let (_producer, confirmations) = produce(&client, addr, 5);
    let delivered = wait_until(Duration::from_secs(20), || confirmations.len() == 5).await;
    let flooding = opened.load(Ordering::Relaxed) < FLOOD_MAX;
    stop.store(true, Ordering::Relaxed);
    flood.await.unwrap();
    let stats = server.stats();
    assert!(delivered, "the honest node was locked out: {stats:?}");
    assert!(flooding, "the flood was still going");
    assert_eq!(handled.distinct(), 5);
    assert!(
        stats.handshakes_evicted > 0,
        "the flood filled the budget: {stats:?}"
    );
    assert!(stats.connections_accepted >= 1);
    assert_eq!(stats.connections_refused, 0, "{stats:?}");
}

/// While the writer waits for a peer that stopped reading, one frame at a time keeps coming
/// until the output is full: `output_high_water` says so then, not what the writer last took.
#[actix::test]
async fn output_high_water_is_true_while_a_socket_write_blocks() {
    const LIMIT: usize = 64 * 1024;
    const MAX_FRAME: usize = 16 * 1024;
    let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = client_with(
        NodeOptions::builder()
            .insecure_no_authentication()
            .max_frame_length(MAX_FRAME)
            .max_output_bytes(LIMIT)
            // The stalled peer sends nothing, not even heartbeats: on a loaded machine the
            // kernel's socket buffers take longer to fill than the default 10 s, and the idle
            // close would end the connection before its output is full.
            .idle_timeout(Duration::from_secs(600))
            .build()
            .unwrap(),
    )
    .await;
    let remote = node.consumer_ref::<Vec<u8>>(addr, "sink").unwrap();
    let reply_to = actix_delivery::ReplyTo::from_fn(|_| {});
    let delivery = |seq: u64| {
        actix_delivery::Delivery::new(
            "p",
            Incarnation::from_u128(1),
            seq,
            vec![7; 4096],
            reply_to.clone(),
        )
        .with_window_start(seq) // nothing kept for retransmission
    };
    remote.do_send_all(std::iter::once(delivery(1))); // makes the connection
    let _stalled = wire::insecure_server_once(&listener).await; // and reads nothing

    // Until the node has taken the handshake's answer, deliveries wait for the connection,
    // bounded by the same limit: a drop there would say nothing of a blocked write.
    let opened = || node.stats().connections_opened == 1;
    assert!(wait_until(Duration::from_secs(10), opened).await);
    let mut seq = 1;
    while node.stats().deliveries_dropped_full == 0 && seq < 20_000 {
        seq += 1;
        remote.do_send_all(std::iter::once(delivery(seq)));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats = node.stats();
    // One connection throughout: the drop was the full output's, not a reconnection's.
    assert_eq!(
        (stats.connections_opened, stats.idle_timeouts),
        (1, 0),
        "{stats:?}"
    );
    assert!(stats.deliveries_dropped_full > 0, "{stats:?}");
    // A frame of about 4 KiB did not fit: more than the limit less one frame is held.
    assert!(
        stats.output_high_water as usize > LIMIT - MAX_FRAME,
        "{stats:?}"
    );
    assert!(stats.output_high_water as usize <= LIMIT, "{stats:?}");
}

/// A peer whose protocol versions all lie below this release's (protocol 1, whose bodies carry
/// no codec and version, or 2, whose deliveries carry no trace context) is refused in the
/// handshake by the side that sees its version, both as server and as client, counted in
/// `version_refusals`; nothing it sends reaches a consumer. A server that answers above the
/// version the client offered is refused alike. (Protocol 3 is answered at 3: see
/// `version_negotiation`.)
#[actix::test]
async fn a_peer_of_a_version_this_release_does_not_speak_is_refused_and_counted() {
    let (server, handled, _) = insecure_server().await;
    for (refused, version) in [(1, 1), (2, 2)] {
        let mut old = TcpStream::connect(server.local_addr().unwrap())
            .await
            .unwrap();
        let mut hello = wire::hello(false);
        if let Frame::Hello(hello) = &mut hello {
            hello.version = version;
        }
        wire::write(&mut old, &hello).await.unwrap();
        wire::write(&mut old, &wire::deliveries("numbers", [1]))
            .await
            .unwrap();
        assert!(wire::closed_by_peer(&mut old, Duration::from_secs(5)).await);
        assert!(
            wait_until(Duration::from_secs(5), || server.stats().version_refusals
                == refused)
            .await
        );
        assert_eq!(server.stats().handshake_failures, refused);
    }

    // As a client: the server answers with a Challenge of version 2, then of version 5
    // (above the 4 offered).
    for version in [2, 5] {
        let listener = tokio::net::TcpListener::bind(localhost()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let old_server = actix::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let Some(Frame::Hello(hello)) = wire::read(&mut stream, Duration::from_secs(5)).await
            else {
                panic!("no hello");
            };
            assert_eq!(hello.version, wire::VERSION, "the default offer");
            let challenge = wire::Challenge {
                version,
                node_id: [5; 16],
                nonce: [6; 32],
                max_frame_length: 1 << 20,
                proof: None,
            };
            wire::write(&mut stream, &Frame::Challenge(challenge))
                .await
                .unwrap();
            wire::closed_by_peer(&mut stream, Duration::from_secs(5)).await
        });
        let client = client_with(
            fast(NodeOptions::builder().insecure_no_authentication())
                .build()
                .unwrap(),
        )
        .await;
        let (_p, confirmations) = produce(&client, addr, 1);
        assert!(
            old_server.await.unwrap(),
            "the client closed the connection"
        );
        assert!(
            wait_until(Duration::from_secs(5), || client.stats().version_refusals
                >= 1)
            .await,
            "version {version}"
        );
        assert_eq!(client.stats().connections_opened, 0);
        assert_eq!((handled.total(), confirmations.len()), (0, 0));
    }
}

/// TLS: certificates made here, for each test (no key is committed).
#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use actix_delivery::tcp::{NameError, NodeTls, PeerAddr};
    use remote::tls::Ca;

    async fn tls_node(tls: NodeTls, listen: bool) -> NodeHandle {
        let builder = fast(NodeOptions::builder().tls(tls));
        let builder = if listen {
            builder.listen(localhost())
        } else {
            builder
        };
        client_with(builder.build().unwrap()).await
    }

    /// A mutual-TLS server of `ca` (certificate for node.test and 127.0.0.1) exposing a
    /// recording "numbers", to `identities` only if given.
    async fn tls_server(ca: &Ca, identities: Option<&[&str]>) -> (NodeHandle, Handled<u64>) {
        let node = tls_node(ca.mutual(&["node.test", "127.0.0.1"]), true).await;
        let (consumer, handled) = recording_consumer::<u64>();
        match identities {
            Some(ids) => node.expose_to("numbers", &consumer, ids.iter().copied()),
            None => node.expose("numbers", &consumer),
        }
        .unwrap();
        (node, handled)
    }

    /// `bad` sends 10 messages to `server`: none is handled or confirmed, both sides count
    /// the failure in `tls_failures` (the side that found it at least: `refusers`), and an
    /// `honest` client is served meanwhile.
    async fn refused(
        server: &NodeHandle,
        handled: &Handled<u64>,
        bad: &NodeHandle,
        honest: &NodeHandle,
    ) {
        let addr = server.local_addr().unwrap();
        let (producer, confirmations) = produce(bad, addr, 10);
        let failures = || bad.stats().tls_failures + server.stats().tls_failures;
        assert!(
            wait_until(Duration::from_secs(5), || failures() >= 4).await,
            "client {:?}\nserver {:?}",
            bad.stats(),
            server.stats()
        );
        let (_honest, served) = produce(honest, addr, 10);
        assert!(wait_until(Duration::from_secs(5), || served.len() == 10).await);
        assert_eq!(handled.snapshot().len(), 10, "only the honest messages");
        assert_eq!(confirmations.len(), 0);
        assert!(producer.stats().await.unwrap().retransmitted > 0);
        assert_eq!(bad.stats().connections_opened, 0);
        assert_eq!(
            server.stats().connections_accepted,
            1,
            "the honest one only"
        );
    }

    #[actix::test]
    async fn a_certificate_of_another_ca_is_refused_both_ways() {
        let (ca, other) = (Ca::new("ours"), Ca::new("theirs"));
        let (server, handled) = tls_server(&ca, None).await;
        let honest = tls_node(ca.mutual(&["client.test"]), false).await;
        // The client trusts another CA: it refuses the server.
        let stranger = tls_node(other.mutual(&["client.test"]), false).await;
        refused(&server, &handled, &stranger, &honest).await;
        assert!(stranger.stats().tls_failures > 0);
        // The client trusts our CA but presents a certificate of another: the server refuses.
        let forged = ca.trusted_by_node_with(other.issue(&["client.test"]));
        let forger = tls_node(forged, false).await;
        let before = server.stats().tls_failures;
        let (_p, c) = produce(&forger, server.local_addr().unwrap(), 5);
        assert!(
            wait_until(Duration::from_secs(5), || server.stats().tls_failures
                >= before + 2)
            .await
        );
        assert_eq!((c.len(), forger.stats().connections_opened), (0, 0));
        assert_eq!(handled.snapshot().len(), 10);
    }

    #[actix::test]
    async fn an_expired_certificate_is_refused() {
        let ca = Ca::new("ours");
        let expired =
            ca.trusted_by_node_with(ca.issue_with(&["node.test", "127.0.0.1"], |params| {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }));
        let server = tls_node(expired, true).await;
        let (consumer, handled) = recording_consumer::<u64>();
        server.expose("numbers", &consumer).unwrap();
        let client = tls_node(ca.mutual(&["client.test"]), false).await;
        let (_p, c) = produce(&client, server.local_addr().unwrap(), 5);
        assert!(wait_until(Duration::from_secs(5), || client.stats().tls_failures >= 2).await);
        assert_eq!((handled.total(), c.len()), (0, 0));
        assert_eq!(client.stats().connections_opened, 0);
        // An expired client certificate is refused by a valid server the same way.
        let (valid, valid_handled) = tls_server(&ca, None).await;
        let old = ca.trusted_by_node_with(ca.issue_with(&["client.test"], |params| {
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }));
        let old = tls_node(old, false).await;
        let honest = tls_node(ca.mutual(&["client.test"]), false).await;
        refused(&valid, &valid_handled, &old, &honest).await;
    }

    #[actix::test]
    async fn a_certificate_for_another_name_is_refused() {
        let ca = Ca::new("ours");
        // The server's certificate names node.test only, not the address connected to.
        let server = tls_node(ca.mutual(&["node.test"]), true).await;
        let (consumer, handled) = recording_consumer::<u64>();
        server.expose("numbers", &consumer).unwrap();
        let port = server.local_addr().unwrap().port();
        let client = client_with(
            fast(NodeOptions::builder().tls(ca.mutual(&["client.test"])))
                .resolver(|_, port| Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]))
                .build()
                .unwrap(),
        )
        .await;
        let by_address = produce(&client, server.local_addr().unwrap(), 5);
        let wrong: PeerAddr = format!("other.test:{port}").parse().unwrap();
        let by_wrong_name = client.consumer_ref::<u64>(wrong, "numbers").unwrap();
        let wrong_producer = remote::producer(by_wrong_name, 8, 50);
        wrong_producer.tell(99, |_| {}).unwrap();
        assert!(wait_until(Duration::from_secs(5), || client.stats().tls_failures >= 4).await);
        assert_eq!((handled.total(), by_address.1.len()), (0, 0));
        assert_eq!(client.stats().connections_opened, 0);
        // The right name is reached, over the same resolver.
        let right: PeerAddr = format!("node.test:{port}").parse().unwrap();
        let target = client.consumer_ref::<u64>(right, "numbers").unwrap();
        let producer = remote::producer(target, 8, 50);
        let confirmations = Confirmations::<u64>::default();
        for n in 1..=10 {
            producer.tell(n, confirm_into(&confirmations, n)).unwrap();
        }
        assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 10).await);
        assert_eq!(handled.snapshot().len(), 10);
    }

    #[actix::test]
    async fn nodes_of_other_modes_refuse_a_tls_node_with_a_counted_reason() {
        let ca = Ca::new("ours");
        let (server, handled) = tls_server(&ca, None).await;
        let honest = tls_node(ca.mutual(&["client.test"]), false).await;
        let _ = &handled;
        // A node with the secret speaks no TLS: the TLS node refuses it.
        let plain = secret_sending_node().await;
        let (_p, c) = produce(&plain, server.local_addr().unwrap(), 5);
        assert!(
            wait_until(Duration::from_secs(5), || server.stats().tls_failures >= 2
                && plain.stats().handshake_failures >= 2)
            .await
        );
        assert_eq!(c.len(), 0);
        // A TLS node speaking to a node with the secret: that node refuses it.
        let (secret_server, secret_handled) = super::server().await;
        let (_p, c) = produce(&honest, secret_server.local_addr().unwrap(), 5);
        assert!(
            wait_until(Duration::from_secs(5), || secret_server
                .stats()
                .tls_failures
                >= 2
                && honest.stats().tls_failures >= 2)
            .await
        );
        assert_eq!((c.len(), secret_handled.total()), (0, 0));
        // A TLS client without a certificate is refused by a mutual TLS server.
        let anonymous = NodeTls::builder(&ca.pem).unwrap().build().unwrap();
        let anonymous = tls_node(anonymous, false).await;
        let before = server.stats().tls_failures;
        let (_p, c) = produce(&anonymous, server.local_addr().unwrap(), 5);
        assert!(
            wait_until(Duration::from_secs(5), || server.stats().tls_failures
                >= before + 2)
            .await
        );
        assert_eq!(c.len(), 0);
    }

    #[actix::test]
    async fn an_identity_not_authorized_for_a_consumer_delivers_nothing_and_is_disconnected() {
        let ca = Ca::new("ours");
        let (server, handled) = tls_server(&ca, Some(&["producer-a.test"])).await;
        let addr = server.local_addr().unwrap();
        // A member of the cluster (a valid certificate of the CA), not authorized here.
        let intruder = tls_node(ca.mutual(&["producer-b.test"]), false).await;
        let (producer, confirmations) = produce(&intruder, addr, 10);
        assert!(
            wait_until(Duration::from_secs(5), || server
                .stats()
                .unauthorized_deliveries
                >= 20
                && intruder.stats().connections_opened >= 2)
            .await,
            "{:?}",
            server.stats()
        );
        assert_eq!((handled.total(), confirmations.len()), (0, 0));
        assert_eq!(server.stats().deliveries_in, 0);
        assert!(producer.stats().await.unwrap().retransmitted > 0);
        // The authorized identity (names compare without regard to ASCII case) is served.
        let honest = tls_node(ca.mutual(&["Producer-A.test"]), false).await;
        let (_honest, served) = produce(&honest, addr, 10);
        assert!(wait_until(Duration::from_secs(5), || served.len() == 10).await);
        assert_eq!(server.stats().deliveries_in, 10);
        assert!(handled.snapshot().values().all(|&n| n == 1));
        assert_eq!((handled.total(), confirmations.len()), (10, 0));
        // Only a node with mutual TLS knows identities.
        let (consumer, _) = recording_consumer::<u64>();
        let secret_node = secret_listening_node().await;
        assert_eq!(
            secret_node.expose_to("n", &consumer, ["producer-a.test"]),
            Err(NameError::NoIdentities)
        );
        let one_way = NodeTls::builder(&ca.pem).unwrap().build().unwrap();
        assert_eq!(
            tls_node(one_way, false)
                .await
                .expose_to("n", &consumer, ["producer-a.test"]),
            Err(NameError::NoIdentities)
        );
    }

    /// A client whose resolver sends every name to the listener on 127.0.0.1, as a member
    /// that can steer name resolution would.
    async fn client_resolving_everything_to_localhost(tls: NodeTls) -> NodeHandle {
        client_with(
            fast(NodeOptions::builder().tls(tls))
                .resolver(|_, port| Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]))
                .build()
                .unwrap(),
        )
        .await
    }

    #[actix::test]
    async fn a_host_that_is_not_a_dns_name_is_refused_and_never_checked_as_its_ip() {
        let ca = Ca::new("ours");
        // As the demo certificates do, the listener's certificate names its IP too.
        let server = tls_node(ca.mutual(&["node.test", "127.0.0.1"]), true).await;
        let (consumer, handled) = recording_consumer::<u64>();
        server.expose("numbers", &consumer).unwrap();
        let port = server.local_addr().unwrap().port();
        let client = client_resolving_everything_to_localhost(ca.mutual(&["client.test"])).await;
        let long_label = format!("{}.test", "a".repeat(64));
        for (host, why) in [
            ("orders.0", "the last label is a number"),
            ("orders.7100", "the last label is a number"),
            ("0x1f", "the last label is a number"),
            ("orders-.test", "a label starts or ends with '-'"),
            ("orders..test", "an empty label"),
            (long_label.as_str(), "more than 63 characters"),
        ] {
            let input = format!("{host}:{port}");
            match input.parse::<PeerAddr>() {
                Err(refused) => assert!(refused.to_string().contains(why), "{input}: {refused}"),
                Ok(addr) => {
                    let target = client.consumer_ref::<u64>(addr, "numbers").unwrap();
                    let producer = remote::producer(target, 8, 50);
                    producer.tell(1, |_| {}).unwrap();
                    wait_until(Duration::from_secs(5), || handled.total() > 0).await;
                    panic!(
                        "{input} was taken as a name; {} message(s) delivered to a certificate \
                         that names 127.0.0.1, the IP it resolved to",
                        handled.total()
                    );
                }
            }
            let refused = PeerAddr::name(host, port).unwrap_err();
            assert!(refused.to_string().contains(why), "{host}: {refused}");
        }
        // A DNS name the certificate carries is reached, over the same resolver.
        let name: PeerAddr = format!("node.test:{port}").parse().unwrap();
        let target = client.consumer_ref::<u64>(name, "numbers").unwrap();
        let producer = remote::producer(target, 8, 50);
        let confirmations = Confirmations::<u64>::default();
        for n in 1..=10 {
            producer.tell(n, confirm_into(&confirmations, n)).unwrap();
        }
        assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 10).await);
        assert_eq!(handled.total(), 10);
    }

    /// rustls configurations for a node with a certificate of `ca` for node.test and
    /// 127.0.0.1: its server side checking client certificates with `verifier`, its client
    /// side presenting none.
    fn configs(
        ca: &Ca,
        verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    ) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = ca.issue(&["node.test", "127.0.0.1"]);
        let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(ca))
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    fn roots(ca: &Ca) -> Arc<rustls::RootCertStore> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        Arc::new(roots)
    }

    #[actix::test]
    async fn a_node_from_configs_knows_identities_only_if_its_server_checks_client_certificates() {
        let ca = Ca::new("ours");
        let (consumer, handled) = recording_consumer::<u64>();
        let no_client_auth = rustls::server::WebPkiClientVerifier::no_client_auth();
        let (server, client) = configs(&ca, no_client_auth);
        let one_way = tls_node(NodeTls::from_configs(Some(server), client).unwrap(), true).await;
        assert_eq!(
            one_way.expose_to("numbers", &consumer, ["client.test"]),
            Err(NameError::NoIdentities)
        );
        // A server side that checks client certificates: peers have identities, and an
        // authorized one delivers.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&ca), provider)
                .build()
                .unwrap();
        let (server, client) = configs(&ca, verifier);
        let mutual = tls_node(NodeTls::from_configs(Some(server), client).unwrap(), true).await;
        mutual
            .expose_to("numbers", &consumer, ["client.test"])
            .unwrap();
        let sender = tls_node(ca.mutual(&["client.test"]), false).await;
        let (_producer, confirmations) = produce(&sender, mutual.local_addr().unwrap(), 5);
        assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 5).await);
        assert_eq!(handled.total(), 5);
    }

    #[actix::test]
    async fn a_mutual_tls_node_delivers_to_a_one_way_listener_and_a_mutual_listener_refuses_a_one_way_node(
    ) {
        let ca = Ca::new("ours");
        // A one-way listener asks for no certificate: a mutual-TLS node delivers to it (its
        // certificate is not asked for, so it has no identity there).
        let (cert, key) = ca.issue(&["node.test", "127.0.0.1"]);
        let one_way = NodeTls::builder(&ca.pem)
            .unwrap()
            .certificate(cert, key)
            .unwrap()
            .build()
            .unwrap();
        let one_way_server = tls_node(one_way, true).await;
        let (consumer, handled) = recording_consumer::<u64>();
        one_way_server.expose("numbers", &consumer).unwrap();
        let mutual_client = tls_node(ca.mutual(&["client.test"]), false).await;
        let (_producer, confirmations) =
            produce(&mutual_client, one_way_server.local_addr().unwrap(), 10);
        assert!(wait_until(Duration::from_secs(5), || confirmations.len() == 10).await);
        assert_eq!(handled.total(), 10);
        assert_eq!(mutual_client.stats().tls_failures, 0);
        // A mutual listener refuses a one-way node, even one with a certificate of the CA:
        // it presents none when it connects.
        let (mutual_server, mutual_handled) = tls_server(&ca, None).await;
        let (cert, key) = ca.issue(&["client.test"]);
        let one_way = NodeTls::builder(&ca.pem)
            .unwrap()
            .certificate(cert, key)
            .unwrap()
            .build()
            .unwrap();
        let one_way_client = tls_node(one_way, false).await;
        let (_producer, refused) = produce(&one_way_client, mutual_server.local_addr().unwrap(), 5);
        assert!(
            wait_until(Duration::from_secs(5), || mutual_server
                .stats()
                .tls_failures
                >= 2)
            .await,
            "{:?}",
            mutual_server.stats()
        );
        assert_eq!((refused.len(), mutual_handled.total()), (0, 0));
        assert_eq!(one_way_client.stats().connections_opened, 0);
    }
}
