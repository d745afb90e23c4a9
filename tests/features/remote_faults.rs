//! Connection faults between two nodes: a seeded proxy on 127.0.0.1 drops chunks (corrupting
//! the stream: the tags catch it), delays, cuts, half-closes, stalls and refuses connections.
//! Nothing is lost, every confirmation fires exactly once, the (live) consumer runs each
//! message exactly once, memory stays bounded, and every kind of fault really happened.
//!
//! Replay a seed with `FAULT_SEED=5 cargo test --test features remote_faults:: -- --nocapture`.

use crate::common;
use crate::remote;

use std::time::Duration;

use actix_delivery::tcp::{NodeHandle, NodeOptions};
use common::{confirm_into, Confirmations};
use remote::proxy::{Faults, Injected, Proxy};
use remote::{listening_node, recording_consumer, wait_until};

const N: u64 = 1500;
const WINDOW: usize = 64;
const OUTPUT_LIMIT: usize = 2 << 20;

fn faults() -> Faults {
    Faults {
        drop_chunk: 0.03,
        delay: 0.1,
        max_delay: Duration::from_millis(20),
        cut: 0.02,
        half_close: 0.02,
        stall: 0.02,
        stall_for: Duration::from_millis(300), // beyond the 200 ms idle timeout
        refuse: 0.25,
        record: false,
    }
}

async fn run(seed: u64) -> [u64; 6] {
    let server = listening_node().await;
    let (consumer, handled) = recording_consumer::<u64>();
    server.expose("numbers", &consumer).unwrap();
    let proxy = Proxy::start(server.local_addr().unwrap(), faults(), seed).await;
    let options = remote::secured(NodeOptions::builder())
        .max_output_bytes(OUTPUT_LIMIT)
        .heartbeat_interval(Duration::from_millis(30))
        .idle_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let client = NodeHandle::start(options).await.unwrap();
    let producer = remote::producer(
        client.consumer_ref::<u64>(proxy.addr, "numbers").unwrap(),
        WINDOW,
        50,
    );
    let confirmations = Confirmations::<u64>::default();
    let mut max_in_flight = 0;
    let mut max_cached = 0;
    for n in 1..=N {
        producer.tell(n, confirm_into(&confirmations, n)).unwrap();
        if n % 10 == 0 {
            // Pace the sends, so that there are many frames for faults to land on.
            tokio::time::sleep(Duration::from_millis(2)).await;
            max_in_flight = max_in_flight.max(producer.stats().await.unwrap().in_flight);
            max_cached = max_cached.max(client.stats().cached_bodies);
        }
    }
    let done = wait_until(Duration::from_secs(60), || confirmations.len() as u64 == N).await;
    let (stats, server_stats) = (client.stats(), server.stats());
    let injected = &proxy.injected;
    println!(
        "seed {seed}: {:?}\nclient {stats:?}\nserver {server_stats:?}",
        injected
    );
    assert!(
        done,
        "seed {seed}: {} of {N} confirmed",
        confirmations.len()
    );

    // Every confirmation exactly once, all Ok.
    remote::assert_each_confirmed_once(&confirmations, N, &format!("seed {seed}"));
    // The consumer lived throughout: each message handled exactly once, none lost.
    let seen = handled.snapshot();
    assert_eq!(seen.len() as u64, N, "seed {seed}");
    assert!(
        seen.values().all(|&c| c == 1),
        "seed {seed}: a message handled twice"
    );

    // Bounded memory, whatever the faults.
    assert!(max_in_flight <= WINDOW);
    assert!(
        max_cached as usize <= WINDOW,
        "seed {seed}: {max_cached} bodies cached"
    );
    assert!(stats.output_high_water as usize <= OUTPUT_LIMIT);
    assert!(server_stats.output_high_water as usize <= 4 << 20);
    assert_eq!(stats.routes, 1);
    // A body is encoded once per message, whatever the retransmissions.
    assert_eq!(stats.bodies_encoded, N, "seed {seed}");
    proxy.stop();
    [
        Injected::get(&injected.dropped_chunks),
        Injected::get(&injected.cuts),
        Injected::get(&injected.half_closes),
        Injected::get(&injected.stalls),
        Injected::get(&injected.refused),
        stats.decode_failures + server_stats.decode_failures,
    ]
}

#[actix::test]
async fn nothing_is_lost_and_every_confirmation_fires_once_through_a_faulty_proxy() {
    let seeds: Vec<u64> = match std::env::var("FAULT_SEED") {
        Ok(seed) => vec![seed.parse().unwrap()],
        Err(_) => vec![1, 2],
    };
    let mut total = [0u64; 6];
    for seed in seeds {
        for (sum, n) in total.iter_mut().zip(run(seed).await) {
            *sum += n;
        }
    }
    let [dropped, cuts, half_closes, stalls, refused, decode_failures] = total;
    println!(
        "injected: {dropped} dropped chunks, {cuts} cuts, {half_closes} half-closes, \
         {stalls} stalls, {refused} refused; {decode_failures} frames failed their tag"
    );
    assert!(dropped > 0 && cuts > 0 && half_closes > 0 && stalls > 0 && refused > 0);
    assert!(
        decode_failures > 0,
        "a dropped chunk must have broken a frame"
    );
}
