//! Reliable delivery over NATS against plain `async-nats` publishing of the same bodies (one
//! message each, and in the reliable path's batches) and against JetStream, in one run,
//! printed as the markdown `benches/README.md` quotes. Needs a NATS server with JetStream
//! (`ACTIX_DELIVERY_NATS_URL`, by default `nats://127.0.0.1:4222`; `nats-server -js`).
//!
//! ```text
//! cargo run --release --features nats --example nats_bench               # 200 000 messages, median of 5
//! cargo run --release --features nats --example nats_bench -- 500000 3   # messages per run, runs
//! ```
//!
//! The receiving side (its own client, carrier and consumer, or the plain subscriber) runs on
//! an arbiter (thread) of its own, the sending side on the main one. Bodies are `u64` (9
//! bytes encoded at most).
//!
//! - **plain publish**: one client publishes every body, encoded once, as its own message;
//!   a subscriber on another client receives and decodes each. No ACKs, no retransmission,
//!   nothing kept (and nothing recovered: NATS core drops what a slow subscriber cannot take).
//! - **plain publish, batches**: the same, with 1 024 bodies per message, the most the
//!   reliable path puts in one (a `Vec<u64>`: the bodies without the reliable frame's seq,
//!   window start and length per body). The most this server and client carry: the limit.
//! - **JetStream**: what users pick for reliable NATS: a file stream on the subject, every
//!   body published as its own message with its PubAck awaited, at most 256 PubAcks
//!   outstanding (the reliable path's largest window), and a pull consumer on the receiving
//!   side acking each message; timed until every PubAck came and every message was consumed
//!   and acked. Its stream is made before the clock starts and deleted after each run.
//! - **reliable over NATS**: `tell` N messages to a producer whose consumer is exposed on a
//!   subject by the other side's carrier, timed until all N are confirmed (ACKed back
//!   through the server).
//!
//! Latency: p50/p99 of one message at a time: a plain NATS request/reply against a reliable
//! `send().await` at window 1 (delivery out, ACK back, confirmation).

use std::time::{Duration, Instant};

use actix::{Arbiter, System};
use actix_delivery::codec;
use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::oneshot;

const WINDOWS: [usize; 3] = [16, 64, 256];
/// Bodies per message of the batched plain publish: the reliable path's most per message.
const BATCH: usize = 1024;
/// PubAcks outstanding at once when publishing to JetStream.
const JETSTREAM_WINDOW: usize = 256;
const LATENCY_SAMPLES: usize = 2000;

#[path = "support/transport_bench.rs"]
mod transport_bench;
use transport_bench::{
    burst, median, on, percentile, producer, ready_consumer, reliable_round_trips,
};

fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(200_000, |a| a.parse().expect("messages"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("runs"));
    System::new().block_on(async move { report(n, runs).await });
}

fn url() -> String {
    std::env::var("ACTIX_DELIVERY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A client whose subscriptions can buffer a whole run (plain NATS drops beyond).
async fn client() -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 21)
        .connect(url())
        .await
        .expect("a NATS server (ACTIX_DELIVERY_NATS_URL)")
}

/// Subscribes and waits until the server has the subscription (`flush` only writes to the
/// socket): a probe to an inbox of the client's own comes back.
async fn subscribed(client: &async_nats::Client, subject: String) -> async_nats::Subscriber {
    let subscriber = client.subscribe(subject).await.expect("subscribe");
    let probe = client.new_inbox();
    let mut echo = client.subscribe(probe.clone()).await.expect("subscribe");
    client.publish(probe, Bytes::new()).await.expect("publish");
    echo.next().await.expect("the probe comes back");
    subscriber
}

/// Plain publishing: `n` encoded bodies, one message each, until the subscriber has all.
async fn plain_publish(arbiter: &Arbiter, publisher: &async_nats::Client, n: u64) -> Duration {
    let subject = format!("actix-delivery-bench.plain.{}", std::process::id());
    let (done_tx, done_rx) = oneshot::channel();
    let listening = subject.clone();
    let ready = on(arbiter, move || async move {
        let subscriber = client().await;
        let mut messages = subscribed(&subscriber, listening).await;
        actix::spawn(async move {
            let mut sum = 0u64;
            for _ in 0..n {
                let message = messages.next().await.expect("a message");
                sum = sum.wrapping_add(codec::decode::<u64>(&message.payload).expect("a u64"));
            }
            let _ = done_tx.send(sum);
            drop(subscriber);
        });
    });
    ready.await;
    // Encoded before the clock starts, as the reliable path's first encoding is not free
    // either but its retransmissions are: this favours the plain publish slightly.
    let bodies: Vec<Bytes> = (1..=n)
        .map(|i| Bytes::from(codec::encode(&i).expect("encodes")))
        .collect();
    let start = Instant::now();
    for body in bodies {
        publisher
            .publish(subject.clone(), body)
            .await
            .expect("publish");
    }
    publisher.flush().await.expect("flush");
    let sum = done_rx.await.expect("the subscriber finishes");
    let elapsed = start.elapsed();
    assert_eq!(sum, n * (n + 1) / 2, "plain NATS lost messages");
    elapsed
}

/// Plain publishing of batches: `n` bodies, [`BATCH`] to a message (a `Vec<u64>`, encoded
/// before the clock starts), until the subscriber has decoded them all.
async fn plain_batches(arbiter: &Arbiter, publisher: &async_nats::Client, n: u64) -> Duration {
    let subject = format!("actix-delivery-bench.batches.{}", std::process::id());
    let (done_tx, done_rx) = oneshot::channel();
    let listening = subject.clone();
    on(arbiter, move || async move {
        let subscriber = client().await;
        let mut messages = subscribed(&subscriber, listening).await;
        actix::spawn(async move {
            let (mut sum, mut seen) = (0u64, 0u64);
            while seen < n {
                let message = messages.next().await.expect("a message");
                let bodies: Vec<u64> = codec::decode(&message.payload).expect("u64s");
                seen += bodies.len() as u64;
                sum = bodies.iter().fold(sum, |sum, &b| sum.wrapping_add(b));
            }
            let _ = done_tx.send(sum);
            drop(subscriber);
        });
    })
    .await;
    let all: Vec<u64> = (1..=n).collect();
    let batches: Vec<Bytes> = all
        .chunks(BATCH)
        .map(|chunk| Bytes::from(codec::encode(&chunk.to_vec()).expect("encodes")))
        .collect();
    let start = Instant::now();
    for batch in batches {
        publisher
            .publish(subject.clone(), batch)
            .await
            .expect("publish");
    }
    publisher.flush().await.expect("flush");
    let sum = done_rx.await.expect("the subscriber finishes");
    let elapsed = start.elapsed();
    assert_eq!(sum, n * (n + 1) / 2, "plain NATS lost messages");
    elapsed
}

/// JetStream: `n` bodies published to a file stream, each awaiting its PubAck with at most
/// [`JETSTREAM_WINDOW`] outstanding, consumed by a pull consumer on the receiving arbiter
/// that acks each; until both are done. `run` names the stream.
async fn jetstream(
    arbiter: &Arbiter,
    publisher: &async_nats::Client,
    n: u64,
    run: usize,
) -> Duration {
    use async_nats::jetstream::{self, consumer, stream};
    let pid = std::process::id();
    let (name, subject) = (
        format!("ACTIX_DELIVERY_BENCH_{pid}_{run}"),
        format!("actix-delivery-bench.jetstream.{pid}.{run}"),
    );
    let js = jetstream::new(publisher.clone());
    let _ = js.delete_stream(&name).await; // a leftover of an interrupted run
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("a JetStream stream (is the server started with -js?)");
    let (done_tx, done_rx) = oneshot::channel();
    let stream_name = name.clone();
    on(arbiter, move || async move {
        let receiver = client().await;
        let js = jetstream::new(receiver.clone());
        let pull = js
            .get_stream(&stream_name)
            .await
            .expect("the stream")
            .create_consumer(consumer::pull::Config {
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .expect("a pull consumer");
        let mut messages = pull.messages().await.expect("pulling");
        actix::spawn(async move {
            let mut sum = 0u64;
            for _ in 0..n {
                let message = messages.next().await.expect("a message").expect("pulled");
                sum = sum.wrapping_add(codec::decode::<u64>(&message.payload).expect("a u64"));
                message.ack().await.expect("acked");
            }
            let _ = done_tx.send(sum);
            drop(receiver);
        });
    })
    .await;
    let bodies: Vec<Bytes> = (1..=n)
        .map(|i| Bytes::from(codec::encode(&i).expect("encodes")))
        .collect();
    let start = Instant::now();
    let mut outstanding = std::collections::VecDeque::with_capacity(JETSTREAM_WINDOW);
    for body in bodies {
        if outstanding.len() == JETSTREAM_WINDOW {
            let acked: async_nats::jetstream::context::PublishAckFuture =
                outstanding.pop_front().expect("outstanding");
            acked.await.expect("a PubAck");
        }
        outstanding.push_back(js.publish(subject.clone(), body).await.expect("publish"));
    }
    for acked in outstanding {
        acked.await.expect("a PubAck");
    }
    let sum = done_rx.await.expect("the consumer finishes");
    let elapsed = start.elapsed();
    assert_eq!(sum, n * (n + 1) / 2, "JetStream lost messages");
    js.delete_stream(&name).await.expect("deleted");
    elapsed
}

/// One NATS request, one reply, `samples` times; the round trips in µs.
async fn plain_round_trips(
    arbiter: &Arbiter,
    requester: &async_nats::Client,
    samples: usize,
) -> Vec<f64> {
    let subject = format!("actix-delivery-bench.rtt.{}", std::process::id());
    let serving = subject.clone();
    on(arbiter, move || async move {
        let server = client().await;
        let mut requests = subscribed(&server, serving).await;
        actix::spawn(async move {
            while let Some(request) = requests.next().await {
                let n: u64 = codec::decode(&request.payload).expect("a u64");
                let reply = Bytes::from(codec::encode(&n).expect("encodes"));
                if let Some(to) = request.reply {
                    let _ = server.publish(to, reply).await;
                }
            }
        });
    })
    .await;
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples as u64 + 100 {
        let start = Instant::now();
        let body = Bytes::from(codec::encode(&i).expect("encodes"));
        let reply = requester
            .request(subject.clone(), body)
            .await
            .expect("a reply");
        assert_eq!(codec::decode::<u64>(&reply.payload).expect("a u64"), i);
        if i >= 100 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    times
}

async fn report(n: u64, runs: usize) {
    let arbiter = Arbiter::new();
    let subject = format!("actix-delivery-bench.numbers.{}", std::process::id());
    let exposed = subject.clone();
    let _server = on(&arbiter, move || async move {
        let carrier = NatsCarrierHandle::with_client(client().await, NatsOptions::default())
            .await
            .expect("a carrier");
        let consumer = ready_consumer();
        carrier
            .expose(&exposed, &consumer)
            .await
            .expect("subscribe");
        (carrier, consumer)
    })
    .await;
    let sending = NatsCarrierHandle::with_client(client().await, NatsOptions::default())
        .await
        .expect("a carrier");
    let plain = client().await;
    let reliable: Vec<_> = WINDOWS
        .iter()
        .map(|&w| {
            (
                w,
                producer(sending.consumer_ref::<u64>(&subject).expect("a subject"), w),
            )
        })
        .collect();
    // Warm up: fill caches and allocators.
    for (_, p) in &reliable {
        burst(p, 10_000).await;
    }
    plain_publish(&arbiter, &plain, 10_000).await;
    plain_batches(&arbiter, &plain, 10_000).await;
    jetstream(&arbiter, &plain, 10_000, 0).await;

    let (mut plain_times, mut batch_times, mut jetstream_times) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut reliable_times: Vec<Vec<Duration>> = vec![Vec::new(); WINDOWS.len()];
    for run in 1..=runs {
        plain_times.push(plain_publish(&arbiter, &plain, n).await);
        batch_times.push(plain_batches(&arbiter, &plain, n).await);
        jetstream_times.push(jetstream(&arbiter, &plain, n, run).await);
        for (i, (_, p)) in reliable.iter().enumerate() {
            reliable_times[i].push(burst(p, n).await);
        }
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let plain_rate = rate(median(plain_times));
    let batch_rate = rate(median(batch_times));
    let jetstream_rate = rate(median(jetstream_times));
    println!(
        "{n} messages per run, median of {runs} runs; `u64` bodies; receiving side on its own \
         arbiter (thread); one local nats-server\n"
    );
    println!("| case | messages/s | vs plain publish | vs plain batches | vs JetStream |");
    println!("|---|---:|---:|---:|---:|");
    let row = |case: &str, r: f64| {
        println!(
            "| {case} | {r:.0} | {:.0} % | {:.1} % | {:.1}× |",
            100.0 * r / plain_rate,
            100.0 * r / batch_rate,
            r / jetstream_rate
        );
    };
    row(
        "plain `async-nats` publish, one message per body (no protocol)",
        plain_rate,
    );
    row(
        &format!("plain `async-nats` publish, {BATCH} bodies per message (the limit)"),
        batch_rate,
    );
    row(
        &format!(
            "JetStream: file stream, PubAcks ({JETSTREAM_WINDOW} outstanding), pull consumer \
             acking each"
        ),
        jetstream_rate,
    );
    for (i, w) in WINDOWS.iter().enumerate() {
        row(
            &format!("reliable over NATS, window {w} (confirmed)"),
            rate(median(reliable_times[i].clone())),
        );
    }

    let mut plain_rtt = plain_round_trips(&arbiter, &plain, LATENCY_SAMPLES).await;
    let window_one = producer(sending.consumer_ref::<u64>(&subject).expect("a subject"), 1);
    let mut reliable_rtt = reliable_round_trips(&window_one, LATENCY_SAMPLES).await;
    let (p50, p99) = (
        percentile(&mut plain_rtt, 0.5),
        percentile(&mut plain_rtt, 0.99),
    );
    let (r50, r99) = (
        percentile(&mut reliable_rtt, 0.5),
        percentile(&mut reliable_rtt, 0.99),
    );
    println!("\n| latency, one at a time | p50 µs | p99 µs | p50 vs plain |");
    println!("|---|---:|---:|---:|");
    println!("| plain NATS request/reply | {p50:.1} | {p99:.1} | 1.0× |");
    println!(
        "| reliable `send` → confirmation over NATS, window 1 | {r50:.1} | {r99:.1} | {:.1}× |",
        r50 / p50
    );
    let stats = sending.stats();
    println!(
        "\nsending carrier: {} messages out, {} in, {} deliveries, {} bodies encoded, {} dropped",
        stats.frames_out,
        stats.frames_in,
        stats.deliveries_out,
        stats.bodies_encoded,
        stats.deliveries_dropped_full
    );
    System::current().stop();
}
