//! Reliable delivery over TCP on loopback against what the same connection does without a
//! protocol, and against the in-process figure, all in one run; printed as the markdown
//! `benches/README.md` quotes.
//!
//! ```text
//! cargo run --release --example remote_bench                 # 200 000 messages, median of 5
//! cargo run --release --example remote_bench -- 500000 7     # messages per run, runs
//! REMOTE_BENCH_ONLY=256 cargo run --release --example remote_bench -- 1000000 1  # one case, to profile
//! ```
//!
//! The receiving side (consumer node and consumer, or the plain reader) runs on an arbiter
//! (thread) of its own, the sending side on the main one, so both sides of each case have a
//! core each. Bodies are `u64` (9 bytes encoded at most) unless the row says otherwise.
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
//! at window 1 (delivery out, ACK back, confirmation). First send: p50/p99 of the first
//! `send().await` of a new node to a node that is up (connection, handshake, delivery, ACK).
//!
//! The reliable cases run in each mode of the transport, in the same run: the shared secret
//! (frame tags) and, built with `--features tls`, mutual TLS 1.3 (certificates made at start).

use std::time::{Duration, Instant};

use actix::{Arbiter, System};
use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeOptionsBuilder, NodeSecret};
use actix_delivery::{codec, ProducerOptions, ReliableDelivery};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

const WINDOWS: [usize; 3] = [16, 64, 256];
const LATENCY_SAMPLES: usize = 2000;
const FIRST_SENDS: usize = 50;

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

/// A mode of the transport: its name and its options.
struct Mode {
    name: &'static str,
    options: fn() -> NodeOptionsBuilder,
}

fn hmac() -> NodeOptionsBuilder {
    NodeOptions::builder()
        .secret(NodeSecret::new(b"benchmark secret, 32 bytes long!").expect("a secret"))
}

/// Mutual TLS with certificates made once per run (for 127.0.0.1).
#[cfg(feature = "tls")]
fn tls() -> NodeOptionsBuilder {
    use std::sync::OnceLock;
    static PKI: OnceLock<(String, String, String)> = OnceLock::new();
    let (ca, cert, key) = PKI.get_or_init(|| {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).expect("the CA").pem();
        let issuer = Issuer::new(params, ca_key);
        let key = KeyPair::generate().expect("a key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("a certificate");
        (ca, cert.pem(), key.serialize_pem())
    });
    let tls = actix_delivery::tcp::NodeTls::builder(ca)
        .and_then(|b| b.certificate(cert, key))
        .and_then(|b| b.mutual().build())
        .expect("TLS settings");
    NodeOptions::builder().tls(tls)
}

fn modes() -> Vec<Mode> {
    let secret = Mode {
        name: "secret (HMAC tags)",
        options: hmac,
    };
    #[cfg(feature = "tls")]
    return vec![
        secret,
        Mode {
            name: "mutual TLS 1.3",
            options: tls,
        },
    ];
    #[cfg(not(feature = "tls"))]
    vec![secret]
}

/// What one mode measured.
struct Measured {
    rates: Vec<f64>,
    latency: (f64, f64),
    first_send: (f64, f64),
}

async fn report(n: u64, runs: usize) {
    let arbiter = Arbiter::new();
    let local = on(&arbiter, || async { ready_consumer() }).await;
    let in_process = producer(local.consumer_ref(), 256);
    burst(&in_process, 10_000).await;
    plain_send(&arbiter, 10_000).await;
    let only = std::env::var("REMOTE_BENCH_ONLY").ok();
    let mut measured = Vec::new();
    let mut plain = Vec::new();
    let mut local_times = Vec::new();
    for mode in modes() {
        measured.push(measure(&arbiter, &mode, n, runs, only.as_deref()).await);
        if only.is_some() {
            continue;
        }
        for _ in 0..runs {
            plain.push(plain_send(&arbiter, n).await);
            local_times.push(burst(&in_process, n).await);
        }
    }
    if only.is_some() {
        System::current().stop();
        return;
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let plain_rate = rate(median(plain));
    println!(
        "{n} messages per run, median of {runs} runs (per mode); `u64` bodies; receiving \
         side on its own arbiter (thread)\n"
    );
    println!("| case | messages/s | vs plain framed send |");
    println!("|---|---:|---:|");
    println!("| plain framed send over TCP (one-way, no protocol) | {plain_rate:.0} | 100 % |");
    let modes = modes();
    for (mode, m) in modes.iter().zip(&measured) {
        for (w, r) in WINDOWS.iter().zip(&m.rates) {
            println!(
                "| reliable over TCP, {}, window {w} (confirmed) | {r:.0} | {:.0} % |",
                mode.name,
                100.0 * r / plain_rate
            );
        }
    }
    let r = rate(median(local_times));
    println!(
        "| reliable in-process, window 256, consumer on another arbiter | {r:.0} | {:.0} % |",
        100.0 * r / plain_rate
    );
    let mut plain_rtt = plain_round_trips(&arbiter, LATENCY_SAMPLES).await;
    let (p50, p99) = (
        percentile(&mut plain_rtt, 0.5),
        percentile(&mut plain_rtt, 0.99),
    );
    println!("\n| latency, one at a time | p50 µs | p99 µs | p50 vs plain |");
    println!("|---|---:|---:|---:|");
    println!("| plain request/response over TCP | {p50:.1} | {p99:.1} | 1.0× |");
    for (mode, m) in modes.iter().zip(&measured) {
        let (r50, r99) = m.latency;
        println!(
            "| reliable `send` → confirmation over TCP, {}, window 1 | {r50:.1} | {r99:.1} | \
             {:.1}× |",
            mode.name,
            r50 / p50
        );
    }
    println!("\n| first `send` of a new node → confirmation | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    for (mode, m) in modes.iter().zip(&measured) {
        let (f50, f99) = m.first_send;
        println!("| {} | {f50:.2} | {f99:.2} |", mode.name);
    }
    if let [hmac, tls] = &measured[..] {
        println!(
            "\nTLS vs secret: window 256 throughput {:.0} %, window 1 latency p50 {:.2}×",
            100.0 * tls.rates[2] / hmac.rates[2],
            tls.latency.0 / hmac.latency.0
        );
    }
    System::current().stop();
}

/// The reliable cases in one mode.
async fn measure(
    arbiter: &Arbiter,
    mode: &Mode,
    n: u64,
    runs: usize,
    only: Option<&str>,
) -> Measured {
    let options = mode.options;
    let (server_addr, _server) = on(arbiter, move || async move {
        let options = options()
            .listen("127.0.0.1:0".parse().expect("an address"))
            .build()
            .expect("valid options");
        let node = NodeHandle::start(options).await.expect("bind");
        let consumer = ready_consumer();
        node.expose("numbers", &consumer).expect("a name");
        (node.local_addr().expect("listens"), (node, consumer))
    })
    .await;
    let client = NodeHandle::start(options().build().expect("valid"))
        .await
        .expect("a node");
    client.dial(server_addr).await.expect("connected");
    let remote: Vec<_> = WINDOWS
        .iter()
        .map(|&w| {
            let target = client
                .consumer_ref::<u64>(server_addr, "numbers")
                .expect("a name");
            (w, producer(target, w))
        })
        .collect();
    // Warm up: fill caches and allocators.
    for (_, p) in &remote {
        burst(p, 10_000).await;
    }
    if let Some(window) = only {
        // For profiling: one reliable case alone.
        let (_, p) = remote
            .iter()
            .find(|(w, _)| w.to_string() == window)
            .expect("REMOTE_BENCH_ONLY names a window: 16, 64 or 256");
        let time = burst(p, n).await;
        let stats = client.stats();
        println!(
            "{}, window {window}: {:.0} messages/s; {:.1} deliveries per frame",
            mode.name,
            n as f64 / time.as_secs_f64(),
            stats.deliveries_out as f64 / stats.frames_out as f64
        );
    }
    let mut reliable: Vec<Vec<Duration>> = vec![Vec::new(); WINDOWS.len()];
    for _ in 0..if only.is_some() { 0 } else { runs } {
        for (i, (_, p)) in remote.iter().enumerate() {
            reliable[i].push(burst(p, n).await);
        }
    }
    let rates = reliable
        .into_iter()
        .map(|times| {
            if times.is_empty() {
                0.0
            } else {
                n as f64 / median(times).as_secs_f64()
            }
        })
        .collect();
    let window_one = producer(
        client
            .consumer_ref::<u64>(server_addr, "numbers")
            .expect("a name"),
        1,
    );
    let mut rtt = reliable_round_trips(&window_one, LATENCY_SAMPLES).await;
    let latency = (percentile(&mut rtt, 0.5), percentile(&mut rtt, 0.99));
    // The first send of a new node: connection, handshake(s), delivery and ACK.
    let mut first = Vec::with_capacity(FIRST_SENDS);
    for _ in 0..FIRST_SENDS {
        let fresh = NodeHandle::start(options().build().expect("valid"))
            .await
            .expect("a node");
        let target = fresh
            .consumer_ref::<u64>(server_addr, "numbers")
            .expect("a name");
        let p =
            ReliableDelivery::producer(ProducerOptions::builder(target).build().expect("valid"));
        let start = Instant::now();
        p.send(1).await.expect("confirmed");
        first.push(start.elapsed().as_secs_f64() * 1e3);
        fresh.stop();
    }
    let first_send = (percentile(&mut first, 0.5), percentile(&mut first, 0.99));
    let stats = client.stats();
    println!(
        "{} client node: {} frames out, {} in, {} deliveries, {} bodies encoded, {} dropped",
        mode.name,
        stats.frames_out,
        stats.frames_in,
        stats.deliveries_out,
        stats.bodies_encoded,
        stats.deliveries_dropped_full + stats.deliveries_dropped_disconnected
    );
    Measured {
        rates,
        latency,
        first_send,
    }
}
