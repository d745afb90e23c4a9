//! Reliable delivery over TCP on loopback against what the same connection does without a
//! protocol, and against the in-process figure, all in one run; printed as the markdown the
//! README quotes.
//!
//! ```text
//! cargo run --release --example remote_bench                 # 200 000 messages, median of 5
//! cargo run --release --example remote_bench -- 500000 7     # messages per run, runs
//! REMOTE_BENCH_ONLY=256 cargo run --release --example remote_bench -- 1000000 1  # one case, to profile
//! ```
//!
//! The receiving side (consumer node and consumer, or the plain reader) runs on an arbiter
//! (thread) of its own, the sending side on the main one, so both sides of each case have a
//! core each. Bodies are `u64` in the default wire codec (MessagePack: 1 to 9 bytes, after
//! the 2-byte codec and version header) unless the row says otherwise. The codec rows send
//! the same three-field struct at window 256 in bincode and in MessagePack with named fields,
//! and time encoding and decoding it alone.
//!
//! - **plain framed send**: one task writes every body, encoded once, as its own frame through
//!   `tokio-util`'s `LengthDelimitedCodec` (buffered, flushed when the input is exhausted);
//!   the other reads and decodes each frame. No ACKs, no retransmission, nothing kept.
//! - **reliable over TCP**: `tell` N messages to a producer whose consumer is remote, timed
//!   until all N are confirmed (ACKed back over the same connection).
//! - **in-process**: the same producer and consumer, the consumer on the other arbiter, no
//!   network.
//!
//! Latency: p50/p99 of one message at a time: a plain request/response over one connection
//! (write a frame, the other side answers with a frame) against a reliable `send().await`
//! at window 1 (delivery out, ACK back, confirmation).

use std::time::{Duration, Instant};

use actix::{Arbiter, System};
use actix_delivery::codec::Codec;
use actix_delivery::remote::{BodySchema, Node, NodeOptions, NodeSecret};
use actix_delivery::{codec, ProducerOptions, ReliableDelivery};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

const WINDOWS: [usize; 3] = [16, 64, 256];
const LATENCY_SAMPLES: usize = 2000;

#[path = "support/transport_bench.rs"]
mod transport_bench;
use transport_bench::{
    burst, burst_of, median, on, percentile, producer, ready_consumer, ready_consumer_of,
    reliable_round_trips,
};

/// The body of the codec rows: the same fields, one type per codec (a node declares a
/// [`BodySchema`] per type).
macro_rules! order {
    ($name:ident) => {
        #[derive(Clone, serde::Serialize, serde::Deserialize)]
        struct $name {
            id: u64,
            total_cents: u64,
            currency: Option<String>,
        }

        impl $name {
            fn new(id: u64) -> Self {
                Self {
                    id,
                    total_cents: id * 3,
                    currency: Some("EUR".to_owned()),
                }
            }
        }
    };
}
order!(BincodeOrder);
order!(MsgpackOrder);

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(200_000, |a| a.parse().expect("messages"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("runs"));
    System::new().block_on(async move { report(n, runs).await });
}

/// The plain one-way framed send: `n` encoded bodies, one frame each.
async fn plain_send(arbiter: &Arbiter, n: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (done_tx, done_rx) = oneshot::channel();
    arbiter.spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        let mut frames = FramedRead::new(stream, LengthDelimitedCodec::new());
        let mut sum = 0u64;
        for _ in 0..n {
            let frame = frames.next().await.expect("a frame").expect("valid");
            sum = sum.wrapping_add(codec::decode::<u64>(&frame).expect("a u64"));
        }
        let _ = done_tx.send(sum);
    });
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut frames = FramedWrite::new(stream, LengthDelimitedCodec::new());
    // Encoded before the clock starts, as the reliable path's first encoding is not free
    // either but its retransmissions are: this favours the plain send slightly.
    let bodies: Vec<Bytes> = (1..=n)
        .map(|i| Bytes::from(codec::encode(&i).expect("encodes")))
        .collect();
    let start = Instant::now();
    for body in bodies {
        frames.feed(body).await.expect("write");
    }
    SinkExt::<Bytes>::flush(&mut frames).await.expect("flush");
    let sum = done_rx.await.expect("the reader finishes");
    let elapsed = start.elapsed();
    assert_eq!(sum, n * (n + 1) / 2);
    elapsed
}

/// One frame out, one frame back, `samples` times; the round trips in µs.
async fn plain_round_trips(arbiter: &Arbiter, samples: usize) -> Vec<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    arbiter.spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        let mut framed = tokio_util::codec::Framed::new(stream, LengthDelimitedCodec::new());
        while let Some(Ok(frame)) = framed.next().await {
            let n: u64 = codec::decode(&frame).expect("a u64");
            let reply = Bytes::from(codec::encode(&n).expect("encodes"));
            if framed.send(reply).await.is_err() {
                break;
            }
        }
    });
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut framed = tokio_util::codec::Framed::new(stream, LengthDelimitedCodec::new());
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples as u64 + 100 {
        let start = Instant::now();
        framed
            .send(Bytes::from(codec::encode(&i).expect("encodes")))
            .await
            .expect("send");
        let reply = framed.next().await.expect("a reply").expect("valid");
        assert_eq!(codec::decode::<u64>(&reply).expect("a u64"), i);
        if i >= 100 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    times
}

async fn report(n: u64, runs: usize) {
    let arbiter = Arbiter::new();
    let secret = NodeSecret::new(b"benchmark secret, 32 bytes long!").expect("a secret");
    let server_secret = secret.clone();
    let (server_addr, _server) = on(&arbiter, move || async move {
        let options = NodeOptions::builder()
            .secret(server_secret)
            .listen("127.0.0.1:0".parse().expect("an address"))
            .build()
            .expect("valid options");
        let node = Node::start(options).await.expect("bind");
        let consumer = ready_consumer();
        node.expose("numbers", &consumer).expect("a name");
        node.body_schema(BodySchema::<BincodeOrder>::new().codec(Codec::Bincode));
        let bincode = ready_consumer_of::<BincodeOrder>();
        let msgpack = ready_consumer_of::<MsgpackOrder>();
        node.expose("bincode-orders", &bincode).expect("a name");
        node.expose("msgpack-orders", &msgpack).expect("a name");
        (
            node.local_addr().expect("listens"),
            (node, consumer, bincode, msgpack),
        )
    })
    .await;
    let client = Node::start(
        NodeOptions::builder()
            .secret(secret)
            .build()
            .expect("valid"),
    )
    .await
    .expect("a node");
    let local = on(&arbiter, || async { ready_consumer() }).await;

    let remote: Vec<_> = WINDOWS
        .iter()
        .map(|&w| {
            let target = client
                .consumer_ref::<u64>(server_addr, "numbers")
                .expect("a name");
            (w, producer(target, w))
        })
        .collect();
    let in_process = producer(local.consumer_ref(), 256);
    client.body_schema(BodySchema::<BincodeOrder>::new().codec(Codec::Bincode));
    let bincode_orders = producer(
        client
            .consumer_ref::<BincodeOrder>(server_addr, "bincode-orders")
            .expect("a name"),
        256,
    );
    let msgpack_orders = producer(
        client
            .consumer_ref::<MsgpackOrder>(server_addr, "msgpack-orders")
            .expect("a name"),
        256,
    );
    // Connect (the first deliveries to a new address wait for the connection: one resend).
    let connect = ReliableDelivery::producer(
        ProducerOptions::builder(
            client
                .consumer_ref::<u64>(server_addr, "numbers")
                .expect("a name"),
        )
        .resend_timeout(Duration::from_millis(20))
        .build()
        .expect("valid options"),
    );
    connect.send(0).await.expect("connected");
    // Warm up: fill caches and allocators.
    for (_, p) in &remote {
        burst(p, 10_000).await;
    }
    burst(&in_process, 10_000).await;
    burst_of(&bincode_orders, 10_000, BincodeOrder::new).await;
    burst_of(&msgpack_orders, 10_000, MsgpackOrder::new).await;
    plain_send(&arbiter, 10_000).await;

    if let Ok(window) = std::env::var("REMOTE_BENCH_ONLY") {
        // For profiling: one reliable case alone.
        let (_, p) = remote
            .iter()
            .find(|(w, _)| w.to_string() == window)
            .expect("REMOTE_BENCH_ONLY names a window: 16, 64 or 256");
        let times: Vec<Duration> =
            futures_util::future::join_all((0..1).map(|_| burst(p, n))).await;
        let stats = client.stats();
        println!(
            "window {window}: {:.0} messages/s; {:.1} deliveries per frame",
            n as f64 / times[0].as_secs_f64(),
            stats.deliveries_out as f64 / stats.frames_out as f64
        );
        System::current().stop();
        return;
    }
    let mut plain = Vec::new();
    let mut reliable: Vec<Vec<Duration>> = vec![Vec::new(); WINDOWS.len()];
    let mut local_times = Vec::new();
    let (mut bincode_times, mut msgpack_times) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        plain.push(plain_send(&arbiter, n).await);
        for (i, (_, p)) in remote.iter().enumerate() {
            reliable[i].push(burst(p, n).await);
        }
        local_times.push(burst(&in_process, n).await);
        bincode_times.push(burst_of(&bincode_orders, n, BincodeOrder::new).await);
        msgpack_times.push(burst_of(&msgpack_orders, n, MsgpackOrder::new).await);
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let plain_rate = rate(median(plain));
    println!(
        "{n} messages per run, median of {runs} runs; `u64` bodies; receiving side on its own \
         arbiter (thread)\n"
    );
    println!("| case | messages/s | vs plain framed send |");
    println!("|---|---:|---:|");
    println!("| plain framed send over TCP (one-way, no protocol) | {plain_rate:.0} | 100 % |");
    for (i, w) in WINDOWS.iter().enumerate() {
        let r = rate(median(reliable[i].clone()));
        println!(
            "| reliable over TCP, window {w} (confirmed) | {r:.0} | {:.0} % |",
            100.0 * r / plain_rate
        );
    }
    let r = rate(median(local_times));
    println!(
        "| reliable in-process, window 256, consumer on another arbiter | {r:.0} | {:.0} % |",
        100.0 * r / plain_rate
    );

    let bincode_rate = rate(median(bincode_times));
    let msgpack_rate = rate(median(msgpack_times));
    let (bincode_ns, bincode_len) = codec_cost(Codec::Bincode, n);
    let (msgpack_ns, msgpack_len) = codec_cost(Codec::MessagePack, n);
    println!(
        "\n| body codec, window 256, body `{{ id, total_cents, currency: Some(\"EUR\") }}` | \
         messages/s | vs bincode | body bytes | encode + decode ns |"
    );
    println!("|---|---:|---:|---:|---:|");
    println!("| bincode | {bincode_rate:.0} | 100 % | {bincode_len} | {bincode_ns:.0} |");
    println!(
        "| MessagePack, named fields (the default) | {msgpack_rate:.0} | {:.0} % | \
         {msgpack_len} | {msgpack_ns:.0} |",
        100.0 * msgpack_rate / bincode_rate
    );

    let mut plain_rtt = plain_round_trips(&arbiter, LATENCY_SAMPLES).await;
    let window_one = producer(
        client
            .consumer_ref::<u64>(server_addr, "numbers")
            .expect("a name"),
        1,
    );
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
    println!("| plain request/response over TCP | {p50:.1} | {p99:.1} | 1.0× |");
    println!(
        "| reliable `send` → confirmation over TCP, window 1 | {r50:.1} | {r99:.1} | {:.1}× |",
        r50 / p50
    );
    let stats = client.stats();
    println!(
        "\nclient node: {} frames out, {} in, {} deliveries, {} bodies encoded, {} dropped",
        stats.frames_out,
        stats.frames_in,
        stats.deliveries_out,
        stats.bodies_encoded,
        stats.deliveries_dropped_full + stats.deliveries_dropped_disconnected
    );
    System::current().stop();
}

/// Encoding and decoding one order body in `codec`, `n` times: ns per body (median of 5) and
/// its length in bytes (without the 2-byte header).
fn codec_cost(codec: Codec, n: u64) -> (f64, usize) {
    let limit = codec::MAX_ENCODED_BYTES;
    let mut times = Vec::new();
    let mut len = 0;
    for _ in 0..5 {
        let start = Instant::now();
        for i in 1..=n {
            let bytes = codec.encode(&MsgpackOrder::new(i), limit).expect("encodes");
            len = bytes.len();
            let order: MsgpackOrder = codec.decode(&bytes, limit).expect("decodes");
            assert_eq!(order.id, i);
        }
        times.push(start.elapsed());
    }
    (median(times).as_secs_f64() * 1e9 / n as f64, len)
}
