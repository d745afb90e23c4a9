//! Reliable delivery between two nodes in one process, over real TCP on 127.0.0.1.

use crate::common;
use crate::remote;

use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::tcp::{NodeHandle, NodeOptions};
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};
use common::{confirm_into, Confirmations};
use remote::{listening_node, recording_consumer, sending_node, wait_until};

#[actix::test]
async fn n_messages_are_confirmed_and_none_is_lost() {
    const N: u64 = 3000;
    let server = listening_node().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let remote = client
        .consumer_ref::<u64>(server.local_addr().unwrap(), "numbers")
        .unwrap();
    let producer = remote::producer(remote, 64, 300);
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(20), || confirmations.len() as u64 == N).await);
    remote::assert_each_confirmed_once(&confirmations, N, "one connection");
    assert_eq!(handled.distinct() as u64, N);
    let stats = client.stats();
    assert_eq!(stats.bodies_encoded, N, "each body encoded once: {stats:?}");
    assert_eq!(stats.connections_opened, 1);
    assert_eq!(server.stats().connections_accepted, 1);
    assert_eq!(
        server.peer_id(client.local_addr().unwrap_or(server.local_addr().unwrap())),
        None
    );
    assert_eq!(
        client.peer_id(server.local_addr().unwrap()),
        Some(server.id())
    );
}

#[actix::test]
async fn acks_reach_the_right_producer_among_several() {
    const N: u64 = 500;
    let server = listening_node().await;
    let (numbers, handled) = recording_consumer::<(u32, u64)>();
    let (words, words_handled) = recording_consumer::<String>();
    server.expose("numbers", &numbers).unwrap();
    server.expose("words", &words).unwrap();
    let client = sending_node().await;
    let addr = server.local_addr().unwrap();
    // Four producers share one connection: three to "numbers", one to "words".
    let mut producers = Vec::new();
    let confirmations = Confirmations::<(u32, u64)>::default();
    for p in 0..3u32 {
        let producer = remote::producer(
            client.consumer_ref::<(u32, u64)>(addr, "numbers").unwrap(),
            16 << p,
            200,
        );
        for n in 1..=N {
            producer
                .tell((p, n), confirm_into(&confirmations, (p, n)))
                .unwrap();
        }
        producers.push(producer);
    }
    let words = client.consumer_ref::<String>(addr, "words").unwrap();
    let words_producer =
        ReliableDelivery::producer(ProducerOptions::builder(words).build().unwrap());
    let word_confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        words_producer
            .tell(format!("word {n}"), confirm_into(&word_confirmations, n))
            .unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(20), || {
            confirmations.len() as u64 == 3 * N && word_confirmations.len() as u64 == N
        })
        .await
    );
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    assert_eq!(handled.distinct() as u64, 3 * N);
    assert_eq!(words_handled.distinct() as u64, N);
    for producer in &producers {
        let stats = producer.stats().await.unwrap();
        assert_eq!(stats.confirmed, N);
        assert_eq!(
            stats.ignored_acks, 0,
            "no ACK of another producer reached it"
        );
    }
    let stats = client.stats();
    assert_eq!(stats.connections_opened, 1, "one connection per address");
    assert_eq!(stats.unroutable_acks, 0);
    assert_eq!(stats.routes, 4);
}

#[actix::test]
async fn deliveries_for_an_unknown_name_are_counted_and_never_confirmed() {
    let server = listening_node().await;
    let client = sending_node().await;
    let target = client
        .consumer_ref::<u64>(server.local_addr().unwrap(), "nobody")
        .unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .resend_timeout(Duration::from_millis(30))
            .max_attempts(5)
            .build()
            .unwrap(),
    );
    let outcome = producer.send(1).await;
    assert_eq!(outcome, Err(DeliveryError::GaveUp { attempts: 5 }));
    assert!(server.stats().unknown_consumer >= 3, "{:?}", server.stats());
    assert_eq!(server.stats().decode_failures, 0);
}

#[actix::test]
async fn a_gone_node_costs_bounded_memory_and_delivery_resumes_when_it_returns() {
    const N: u64 = 2000;
    const WINDOW: usize = 32;
    let addr = remote::reusable_addr();
    let options = remote::secured(NodeOptions::builder())
        .listen(addr)
        .build()
        .unwrap();
    let first = NodeHandle::start(options.clone()).await.unwrap();
    // The first life handles the first 300 messages only (the rest get no ACK), so the node
    // leaves with messages unconfirmed however fast the build.
    const FIRST_LIFE: u64 = 300;
    let handled_first = remote::Handled::<u64>::default();
    let record = handled_first.clone();
    let handler = DeliveryHandler::from_fn(move |n: u64| {
        let handled = n <= FIRST_LIFE;
        if handled {
            record.record(n);
        }
        async move { handled.then_some(()).ok_or("the first life handles 300") }
    });
    let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
    first.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let producer = remote::producer(
        client.consumer_ref::<u64>(addr, "numbers").unwrap(),
        WINDOW,
        50,
    );
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), || confirmations.len() as u64
            == FIRST_LIFE)
        .await
    );
    let first_id = client.peer_id(addr).expect("connected");
    assert_eq!(first_id, first.id());
    first.stop();
    consumer.stop();
    // Gone: the producer retransmits into nothing, with bounded memory.
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().connect_failures
            >= 3)
        .await
    );
    let before = client.stats();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gone = client.stats();
    assert!(gone.deliveries_dropped_disconnected > before.deliveries_dropped_disconnected);
    assert!(gone.cached_bodies as usize <= WINDOW, "{gone:?}");
    let stats = producer.stats().await.unwrap();
    assert!(stats.in_flight <= WINDOW);
    assert!(stats.retransmitted > 0);
    assert_eq!(
        confirmations.len() as u64,
        FIRST_LIFE,
        "nothing confirmed while gone"
    );
    assert_eq!(client.peer_id(addr), None);

    // It returns (a new process would be the same: a new node on the same address).
    let second = NodeHandle::start(options).await.unwrap();
    let (consumer, handled_second) = recording_consumer::<u64>();
    second.expose("numbers", &consumer).unwrap();
    assert!(wait_until(Duration::from_secs(20), || confirmations.len() as u64 == N).await);
    remote::assert_each_confirmed_once(&confirmations, N, "across the node's return");
    // Every message handled by one of the two lives (at least once overall).
    let first_seen = handled_first.snapshot();
    let second_seen = handled_second.snapshot();
    assert!((1..=N).all(|n| first_seen.contains_key(&n) || second_seen.contains_key(&n)));
    let second_id = client.peer_id(addr).expect("connected again");
    assert_eq!(second_id, second.id());
    assert_ne!(second_id, first_id, "a restarted node is a new node");
    assert!(client.stats().connections_opened >= 2);
}

/// A connection that cannot be made is warned about with its cause, once a minute at most
/// (before, it was a debug line without the cause).
#[actix::test]
async fn a_connection_that_cannot_be_made_is_logged_with_its_cause() {
    common::logs::keep();
    let client = sending_node().await;
    // An address nobody listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let producer = remote::producer(client.consumer_ref::<u64>(addr, "numbers").unwrap(), 8, 20);
    producer.tell(1, |_| {}).unwrap();
    let refused = format!("cannot connect to {addr} ({addr}: Connection refused (os error 111))");
    assert!(
        wait_until(Duration::from_secs(10), || client.stats().connect_failures
            >= 3)
        .await,
        "{:?}",
        client.stats()
    );
    let logged = common::logs::lines_containing(&[&refused]);
    assert_eq!(logged.len(), 1, "three failures, one warning: {logged:?}");
}

#[actix::test]
async fn a_node_that_never_returns_lets_the_producer_give_up_with_bounded_memory() {
    let client = sending_node().await;
    // An address nobody listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(client.consumer_ref::<u64>(addr, "numbers").unwrap())
            .window_size(8)
            .resend_timeout(Duration::from_millis(20))
            .max_attempts(4)
            .build()
            .unwrap(),
    );
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=40 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 40).await);
    assert!(confirmations
        .snapshot()
        .iter()
        .all(|(_, r)| *r == Err(DeliveryError::GaveUp { attempts: 4 })));
    let stats = client.stats();
    assert!(stats.connect_failures > 0);
    // Bodies are encoded to wait for a connection being made, and kept (bounded by the
    // window) for the retransmissions.
    assert!(stats.cached_bodies <= 8, "{stats:?}");
    assert!(stats.deliveries_waited > 0, "{stats:?}");
    // Every transmission was dropped: while backing off, or when the attempt it waited for
    // failed.
    assert_eq!(stats.deliveries_dropped_disconnected, 160);
}

/// A durable producer keeps its stored incarnation when it restarts in the same process (a
/// journal failure under its supervisor, or a new producer on the stream), but its reply
/// address is new: the ACKs of its new life must reach it, not the old life's address.
#[actix::test]
async fn a_durable_producer_restarted_in_the_same_process_gets_its_acks() {
    let server = listening_node().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let addr = server.local_addr().unwrap();
    let journal = MemoryJournal::new();
    let start = || {
        let target = client.consumer_ref::<u64>(addr, "numbers").unwrap();
        let options = ProducerOptions::builder(target)
            .producer_id("durable")
            .resend_timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let stream = PersistenceId::new("numbers-out").unwrap();
        let durable = DurableOptions::new(Arc::new(journal.clone()), stream, "durable");
        ReliableDelivery::durable_producer(options, durable).unwrap()
    };
    let send = async |producer: &ProducerHandle<u64>, n: u64| {
        tokio::time::timeout(Duration::from_secs(10), producer.send(n))
            .await
            .unwrap_or_else(|_| panic!("message {n} not confirmed within 10 s"))
    };
    let first = start();
    for n in 1..=5 {
        send(&first, n).await.unwrap();
    }
    // The next append (the store of 6) fails: the supervisor restarts the producer.
    journal.faults().fail_nth_append(1);
    assert!(
        matches!(send(&first, 6).await, Err(DeliveryError::Storage(_))),
        "the injected failure hit the store of 6"
    );
    for n in 7..=10 {
        send(&first, n).await.unwrap();
    }
    // A new producer on the same stream: a new actor under the same incarnation.
    first.stop();
    first.stopped().await.unwrap();
    let second = start();
    for n in 11..=15 {
        send(&second, n).await.unwrap();
    }
    let seen = handled.snapshot();
    assert!((1..=15).filter(|&n| n != 6).all(|n| seen.contains_key(&n)));
    assert!(!seen.contains_key(&6), "6 was never stored, never sent");
    let stats = client.stats();
    assert_eq!(stats.routes, 1, "one incarnation, one route: {stats:?}");
    assert_eq!(stats.unroutable_acks, 0);
}

/// Like an actor whose last `Addr` is dropped, a node whose last handle is dropped stops: its
/// listener and connections close. A reference it handed out (`consumer_ref`) counts as a
/// handle, so a producer never sends into a node that stopped under it.
#[actix::test]
async fn a_node_stops_when_its_last_handle_and_reference_are_dropped() {
    let server = listening_node().await;
    let addr = server.local_addr().unwrap();
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let producer = remote::producer(client.consumer_ref::<u64>(addr, "numbers").unwrap(), 8, 50);
    producer.send(1).await.unwrap();
    // A clone is a handle: the node runs on.
    let server_clone = server.clone();
    drop(server);
    producer.send(2).await.unwrap();
    // The last handle: the listener closes, and so does the connection.
    drop(server_clone);
    let refused = || std::net::TcpStream::connect(addr).is_err();
    assert!(
        wait_until(Duration::from_secs(5), refused).await,
        "the listener still accepts"
    );
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().connections_open
            == 0)
        .await,
        "{:?}",
        client.stats()
    );
    assert_eq!(handled.distinct(), 2);

    // The sending side: the reference keeps the node running after its handle is dropped.
    let server = listening_node().await;
    let addr = server.local_addr().unwrap();
    server.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let producer = remote::producer(client.consumer_ref::<u64>(addr, "numbers").unwrap(), 8, 50);
    drop(client);
    producer.send(3).await.unwrap();
    assert_eq!(server.stats().connections_open, 1);
    // The producer, once done, stops and drops the reference: the node stops.
    drop(producer);
    assert!(
        wait_until(Duration::from_secs(5), || server.stats().connections_open
            == 0)
        .await,
        "{:?}",
        server.stats()
    );
}

/// Two producers that share an incarnation under ids of their own (as the lanes of one outbox
/// to one node do) have routes of their own: every ACK reaches its producer, and each body is
/// encoded once even when it is sent again before its ACK.
#[actix::test]
async fn producers_sharing_an_incarnation_under_other_ids_get_every_ack() {
    const N: u64 = 100;
    let server = listening_node().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let addr = server.local_addr().unwrap();
    let client = sending_node().await;
    let remote = client.consumer_ref::<u64>(addr, "numbers").unwrap();
    let acks = common::Log::<(String, u64)>::default();
    let record = acks.clone();
    let reply_to = actix_delivery::ReplyTo::from_fn(move |batch| {
        for ack in batch {
            record.push((ack.producer_id.to_string(), ack.seq));
        }
    });
    let incarnation = actix_delivery::Incarnation::from_u128(42);
    let delivery = |lane: &str, seq: u64| {
        actix_delivery::Delivery::new(lane, incarnation, seq, seq, reply_to.clone())
    };
    // The first deliveries to an address only make the connection.
    assert!(
        wait_until(Duration::from_secs(5), || {
            remote.do_send_all(std::iter::once(delivery("warm-up", 1)));
            client.peer_id(addr).is_some()
        })
        .await
    );
    let before = client.stats();
    for seq in 1..=N {
        // Interleaved, each sent twice (a retransmission before its ACK).
        let lanes = [delivery("lane a", seq), delivery("lane b", seq)];
        let again = [delivery("lane a", seq), delivery("lane b", seq)];
        remote.do_send_all(lanes.into_iter().chain(again));
    }
    let lane_acks = || {
        let mut seen = std::collections::HashSet::new();
        for (lane, seq) in acks.snapshot() {
            if lane != "warm-up" {
                seen.insert((lane, seq));
            }
        }
        seen
    };
    assert!(
        wait_until(Duration::from_secs(10), || lane_acks().len() as u64
            == 2 * N)
        .await,
        "{} of {} ACKs arrived: {:?}",
        lane_acks().len(),
        2 * N,
        client.stats()
    );
    for lane in ["lane a", "lane b"] {
        for seq in 1..=N {
            assert!(
                lane_acks().contains(&(lane.to_string(), seq)),
                "{lane} {seq}"
            );
        }
    }
    let stats = client.stats();
    assert_eq!(stats.unroutable_acks, 0, "{stats:?}");
    assert_eq!(
        stats.bodies_encoded - before.bodies_encoded,
        2 * N,
        "each body encoded once: {stats:?}"
    );
    assert_eq!(handled.distinct() as u64, N, "bodies 1..=N");
    assert_eq!(stats.routes, 3, "warm-up, lane a, lane b");
}

/// A rolling deploy with an additive change: the old node has `OrderV1`, the new one `OrderV2`
/// (a field added with `#[serde(default)]`), both in the default codec without any schema
/// declared. Each sends to the other: every message is confirmed, none is a dead letter, and
/// each side reads the other's bodies as its own type (the new field defaulted on the new
/// side, ignored on the old).
#[actix::test]
async fn old_and_new_nodes_read_each_others_bodies_after_an_added_field() {
    use remote::evolution::{
        assert_read_both_ways, consumer, send, v1, v2, Exchanged, OrderV1, OrderV2,
    };
    const N: u64 = 200;
    let (old, new) = (listening_node().await, listening_node().await);
    let (old_consumer, old_handled, old_dead) = consumer::<OrderV1>();
    let (new_consumer, new_handled, new_dead) = consumer::<OrderV2>();
    old.expose("orders", &old_consumer).unwrap();
    new.expose("orders", &new_consumer).unwrap();
    let (old_addr, new_addr) = (old.local_addr().unwrap(), new.local_addr().unwrap());
    let to_new = remote::producer(
        old.consumer_ref::<OrderV1>(new_addr, "orders").unwrap(),
        64,
        200,
    );
    let to_old = remote::producer(
        new.consumer_ref::<OrderV2>(old_addr, "orders").unwrap(),
        64,
        200,
    );
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
}

/// A breaking change (`Order`, schema version 2: a field renamed and converted) meets bodies
/// of version 1 from an old node: with an upcaster they are delivered, converted; without one
/// each is a dead letter naming codec and versions (no ACK: the producer retransmits, and each
/// copy is a dead letter again, as for any undecodable body); and version 2 bodies sent back
/// to the old node are dead letters there (newer than its version 1).
#[actix::test]
async fn a_breaking_change_is_read_through_its_upcaster_or_is_a_dead_letter_naming_the_version() {
    use actix_delivery::tcp::BodySchema;
    use actix_delivery::DeadLetterReason;
    use remote::evolution::{assert_dead_letters, consumer, send, upcast, v1, Order, OrderV1};
    const N: u64 = 50;
    let old = listening_node().await;
    let (upcasting, without) = (listening_node().await, listening_node().await);
    upcasting.body_schema(BodySchema::<Order>::new().version(2).upcast(upcast));
    without.body_schema(BodySchema::<Order>::new().version(2));
    let (read, read_handled, read_dead) = consumer::<Order>();
    let (refused, refused_handled, refused_dead) = consumer::<Order>();
    upcasting.expose("orders", &read).unwrap();
    without.expose("orders", &refused).unwrap();
    let (old_consumer, old_handled, old_dead) = consumer::<OrderV1>();
    old.expose("orders", &old_consumer).unwrap();

    let to_upcasting = remote::producer(
        old.consumer_ref::<OrderV1>(upcasting.local_addr().unwrap(), "orders")
            .unwrap(),
        16,
        100,
    );
    let confirmed = send(&to_upcasting, N, v1);
    assert!(wait_until(Duration::from_secs(20), || confirmed.len() as u64 == N).await);
    remote::assert_each_confirmed_once(&confirmed, N, "upcast");
    let expected: std::collections::HashMap<Order, u32> = (1..=N)
        .map(|id| {
            let order = Order {
                id,
                total_cents: id * 200,
            };
            (order, 1)
        })
        .collect();
    assert_eq!(read_handled.snapshot(), expected);
    assert_eq!(read_dead.len(), 0);

    let to_without = remote::producer(
        old.consumer_ref::<OrderV1>(without.local_addr().unwrap(), "orders")
            .unwrap(),
        16,
        100,
    );
    let unconfirmed = send(&to_without, N, v1);
    let older = DeadLetterReason::IncompatibleBody {
        codec: 2,
        version: 1,
        current: 2,
    };
    assert_dead_letters(&refused_dead, N as usize, older).await;
    assert_eq!(
        older.to_string(),
        "the body was written as version 1 in msgpack, and no upcaster read it as the \
         consumer's version 2"
    );
    assert!(without.stats().undecodable_bodies >= N);
    assert_eq!((refused_handled.total(), unconfirmed.len()), (0, 0));

    let back = remote::producer(
        upcasting
            .consumer_ref::<Order>(old.local_addr().unwrap(), "orders")
            .unwrap(),
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
    assert_eq!((old_handled.total(), unconfirmed.len()), (0, 0));
}

/// The first messages to a node find no connection yet: they wait for the one being made and
/// go out on it, with no round of retransmission (the resend timeout here is far beyond the
/// test's patience); `NodeHandle::dial` makes the connection before any message.
#[actix::test]
async fn the_first_messages_wait_for_the_connection_being_made() {
    let server = listening_node().await;
    let addr = server.local_addr().unwrap();
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let client = sending_node().await;
    let producer = remote::producer(
        client.consumer_ref::<u64>(addr, "numbers").unwrap(),
        64,
        60_000,
    );
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=20 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 20).await);
    remote::assert_each_confirmed_once(&confirmations, 20, "first messages");
    assert_eq!(producer.stats().await.unwrap().retransmitted, 0);
    let stats = client.stats();
    assert!(stats.deliveries_waited > 0, "{stats:?}");
    assert_eq!(stats.deliveries_dropped_disconnected, 0, "{stats:?}");
    assert_eq!(handled.distinct(), 20);

    // Warming: connected before the first message; nobody at an address: None.
    let warm = sending_node().await;
    assert_eq!(warm.dial(addr).await, Some(server.id()));
    assert_eq!(warm.peer_id(addr), Some(server.id()));
    assert_eq!(
        warm.dial(addr).await,
        Some(server.id()),
        "connected already"
    );
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert_eq!(warm.dial(nobody).await, None);
    assert_eq!(warm.stats().connections_opened, 1);
}

/// Deliveries wait for a connection being made only up to `max_output_bytes`, and no longer
/// than the attempt: a peer that accepts TCP and never answers the handshake costs the
/// sender that bound, counted, and what waited is dropped (counted) when the attempt fails.
#[actix::test]
async fn deliveries_waiting_for_a_connection_are_bounded_and_dropped_when_it_fails() {
    const LIMIT: usize = 8192;
    // Accepts TCP connections (the backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let client = NodeHandle::start(
        remote::secured(NodeOptions::builder())
            .max_frame_length(4096)
            .max_output_bytes(LIMIT)
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let producer = remote::producer(
        client.consumer_ref::<Vec<u8>>(addr, "numbers").unwrap(),
        1000,
        60_000,
    );
    for _ in 0..1000 {
        producer.tell(vec![7u8; 100], |_| {}).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().handshake_failures
            >= 1
            && client.stats().deliveries_dropped_disconnected > 0)
        .await,
        "{:?}",
        client.stats()
    );
    let stats = client.stats();
    assert!(stats.deliveries_waited > 0, "{stats:?}");
    assert!(
        stats.deliveries_waited as usize * 100 <= LIMIT,
        "waited within the bound: {stats:?}"
    );
    assert_eq!(
        stats.deliveries_waited + stats.deliveries_dropped_full,
        1000
    );
    assert_eq!(
        stats.deliveries_dropped_disconnected, stats.deliveries_waited,
        "what waited was dropped with the attempt"
    );
    drop(silent);
}

/// A consumer reached by name is reached at the name's new address after its node moved
/// (another port, as a pod that restarted elsewhere), without restarting the producer; a
/// name that does not resolve is counted and retried with the backoff.
#[actix::test]
async fn a_name_is_resolved_again_on_every_reconnection() {
    let current: Arc<std::sync::Mutex<Option<std::net::SocketAddr>>> = Arc::default();
    let lookup = current.clone();
    let client = NodeHandle::start(
        remote::secured(NodeOptions::builder())
            .resolver(move |host, port| {
                assert_eq!((host, port), ("node.test", 7100));
                let addr = *lookup.lock().unwrap();
                addr.map(|a| vec![a]).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such host")
                })
            })
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let name: actix_delivery::tcp::PeerAddr = "node.test:7100".parse().unwrap();
    let producer = remote::producer(
        client.consumer_ref::<u64>(name.clone(), "numbers").unwrap(),
        8,
        50,
    );
    let confirmations = Confirmations::<u64>::default();
    producer.tell(1, confirm_into(&confirmations, 1)).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || client.stats().resolve_failures
            >= 2)
        .await
    );
    assert_eq!(confirmations.len(), 0);

    let first = listening_node().await;
    let (consumer, first_handled) = recording_consumer::<u64>();
    first.expose("numbers", &consumer).unwrap();
    *current.lock().unwrap() = first.local_addr();
    for n in 2..=50 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 50).await);
    assert_eq!(client.peer_id(name.clone()), Some(first.id()));
    first.stop();

    // The name moves: a new node elsewhere.
    let second = listening_node().await;
    let (consumer, second_handled) = recording_consumer::<u64>();
    second.expose("numbers", &consumer).unwrap();
    *current.lock().unwrap() = second.local_addr();
    for n in 51..=100 {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || confirmations.len() == 100).await);
    remote::assert_each_confirmed_once(&confirmations, 100, "across the move");
    assert_eq!(client.peer_id(name), Some(second.id()));
    assert!(second_handled.distinct() >= 50);
    assert!((1..=50).all(|n| first_handled.snapshot().contains_key(&n)));
}
