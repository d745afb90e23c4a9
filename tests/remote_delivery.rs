//! Reliable delivery between two nodes in one process, over real TCP on 127.0.0.1.

mod common;
mod remote;

use std::time::Duration;

use actix_delivery::{ProducerOptions, ReliableDelivery};
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
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(remote)
            .window_size(64)
            .resend_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let confirmations = Confirmations::<u64>::default();
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(20), || confirmations.len() as u64 == N).await);
    let mut confirmed = confirmations.snapshot();
    confirmed.sort_by_key(|(n, _)| *n);
    assert!(confirmed.iter().all(|(_, r)| r.is_ok()));
    assert_eq!(
        confirmed.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        (1..=N).collect::<Vec<_>>(),
        "every message confirmed exactly once"
    );
    assert_eq!(handled.distinct() as u64, N);
    let stats = client.stats();
    let sent = producer.stats().await.unwrap();
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
    println!("{stats:?}\n{sent:?}");
}
