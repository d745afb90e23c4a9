//! Large messages in chunks, measured in one run and printed as the markdown that
//! `benches/README.md` quotes:
//!
//! - **Throughput**: 16 MiB messages over TCP on loopback, sent in chunks by a reliable
//!   producer and reassembled by the consumer on the other node, against a plain framed send
//!   of the same messages on one connection (each encoded as one 16 MiB frame, written, read
//!   and decoded by the reader, all on the clock; no ACKs, no retransmission, nothing kept),
//!   in MB/s (10^6 bytes). The reliable sends run in two modes of the transport, each against
//!   a plain send that authenticates as much: without authentication, and with the shared
//!   secret (an HMAC-SHA-256 tag on every frame; the plain send then tags and checks its
//!   frames too).
//! - **Peak memory** of one 256 MiB message, producer plus consumer in one process: the most
//!   heap allocated at once, from the caller's value to the confirmation, less what was
//!   allocated before, as a multiple of the message (a reallocation counts both sizes).
//!
//! ```text
//! cargo run --release --example chunk_bench              # 16 messages of 16 MiB, median of 5
//! cargo run --release --example chunk_bench -- 32 3      # messages per run, runs
//! ```
//!
//! Bodies are `bytes::Bytes` (serialized as bytes), written in bincode on both sides
//! (`BodySchema::codec(Codec::Bincode)`), so that the encoding is a copy. The receiving node
//! runs on an arbiter (thread) of its own, the sending side on the main one.

use std::time::{Duration, Instant};

use actix::{Arbiter, System};
use actix_delivery::codec::{self, Codec};
use actix_delivery::tcp::{BodySchema, NodeHandle, NodeOptions, NodeOptionsBuilder, NodeSecret};
use actix_delivery::{
    Confirmation, ConsumerHandle, ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
#[path = "support/report_header.rs"]
mod report_header;
#[path = "support/transport_bench.rs"]
mod transport_bench;
use transport_bench::{median, on};

/// The messages of the throughput runs.
const MESSAGE: usize = 16 << 20;
/// The message of the memory run.
const LARGE: usize = 256 << 20;
/// The chunk sizes measured, and the frame limit of the nodes (a chunk fits a frame).
const CHUNKS: [usize; 3] = [256 << 10, 1 << 20, 4 << 20];
const MAX_FRAME: usize = 8 << 20;
const WINDOW: usize = 16;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(16, |a| a.parse().expect("messages"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("runs"));
    System::new().block_on(async move { report(n, runs).await });
}

fn schema() -> BodySchema<Bytes> {
    BodySchema::new().codec(Codec::Bincode)
}

const SECRET: &[u8; 32] = b"benchmark secret, 32 bytes long!";

/// A mode of the transport: its name and its options.
#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    options: fn() -> NodeOptionsBuilder,
    /// Whether frames carry an HMAC-SHA-256 tag (the plain send then tags its frames too).
    tagged: bool,
}

const MODES: [Mode; 2] = [
    Mode {
        name: "no authentication",
        options: || NodeOptions::builder().insecure_no_authentication(),
        tagged: false,
    },
    Mode {
        name: "secret (HMAC tags)",
        options: || NodeOptions::builder().secret(NodeSecret::new(SECRET).expect("a secret")),
        tagged: true,
    },
];

/// The mode's options for chunks of up to `MAX_FRAME`, with room for a window of them.
fn node_options(mode: Mode) -> NodeOptionsBuilder {
    (mode.options)()
        .max_frame_length(MAX_FRAME)
        .max_output_bytes((4 * WINDOW * MAX_FRAME).min(1 << 30))
}

/// A message of `len` bytes (their content does not matter to the transport).
fn message(len: usize, fill: u8) -> Bytes {
    Bytes::from(vec![fill; len])
}

/// A consumer of messages up to `max` bytes whose handler is ready at once (it drops them).
fn consumer(max: usize) -> ConsumerHandle<Bytes> {
    ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: Bytes| async {
            Ok::<(), std::convert::Infallible>(())
        }))
        .max_message_bytes(max as u64 + 1024)
        .max_reassembly_bytes(4 * (max as u64 + 1024))
        .build()
        .expect("valid options"),
    )
}

fn producer(target: ConsumerRef<Bytes>, chunk_size: usize) -> ProducerHandle<Bytes> {
    ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .window_size(WINDOW)
            .resend_timeout(Duration::from_secs(5))
            .chunk_size(chunk_size)
            .build()
            .expect("valid options"),
    )
}

/// Tells the messages and waits until the last is confirmed.
async fn burst(producer: &ProducerHandle<Bytes>, messages: &[Bytes]) -> Duration {
    let start = Instant::now();
    let (last, rest) = messages.split_last().expect("messages");
    for message in rest {
        producer
            .tell(message.clone(), Confirmation::none())
            .expect("room");
    }
    producer.send(last.clone()).await.expect("confirmed");
    producer.idle().await;
    start.elapsed()
}

/// The HMAC-SHA-256 of `frame` under the benchmark's secret.
fn tag(frame: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).expect("any key length");
    mac.update(frame);
    mac.finalize().into_bytes().into()
}

/// The plain one-way framed send: each message encoded as one frame (`tagged`: followed by
/// its HMAC-SHA-256 tag, which the reader checks), written, read and decoded by the other
/// side.
async fn plain_send(arbiter: &Arbiter, messages: &[Bytes], tagged: bool) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (done_tx, done_rx) = oneshot::channel();
    let n = messages.len();
    let codec = || {
        LengthDelimitedCodec::builder()
            .max_frame_length(MESSAGE + 1024)
            .new_codec()
    };
    arbiter.spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        let mut frames = FramedRead::new(stream, codec());
        let mut bytes = 0;
        for _ in 0..n {
            let mut frame = frames.next().await.expect("a frame").expect("valid");
            if tagged {
                let sent = frame.split_off(frame.len() - 32);
                assert_eq!(tag(&frame), sent[..], "the tag is right");
            }
            bytes += codec::decode_with_limit::<Bytes>(&frame, u64::MAX)
                .expect("a message")
                .len();
        }
        let _ = done_tx.send(bytes);
    });
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut frames = FramedWrite::new(stream, codec());
    let start = Instant::now();
    for message in messages {
        let mut frame = codec::encode_with_limit(message, u64::MAX).expect("encodes");
        if tagged {
            let tag = tag(&frame);
            frame.extend_from_slice(&tag);
        }
        frames.send(Bytes::from(frame)).await.expect("write");
    }
    let bytes = done_rx.await.expect("the reader finishes");
    let elapsed = start.elapsed();
    assert_eq!(bytes, n * MESSAGE);
    elapsed
}

/// Two nodes in `mode`, the receiving one on `arbiter` with a consumer of messages up to
/// `max` bytes exposed as "blobs"; returns the sending node, connected, and the address.
async fn nodes(
    arbiter: &Arbiter,
    mode: Mode,
    max: usize,
) -> (
    NodeHandle,
    std::net::SocketAddr,
    (NodeHandle, ConsumerHandle<Bytes>),
) {
    let (addr, server) = on(arbiter, move || async move {
        let options = node_options(mode)
            .listen("127.0.0.1:0".parse().expect("an address"))
            .build()
            .expect("valid options");
        let node = NodeHandle::start(options).await.expect("bind");
        node.body_schema(schema());
        let consumer = consumer(max);
        node.expose("blobs", &consumer).expect("a name");
        (node.local_addr().expect("listens"), (node, consumer))
    })
    .await;
    let options = node_options(mode).build().expect("valid");
    let client = NodeHandle::start(options).await.expect("a node");
    client.body_schema(schema());
    client.dial(addr).await.expect("connected");
    (client, addr, server)
}

/// The reliable chunked sends over TCP in `mode`, one producer per chunk size.
struct Chunked {
    _nodes: (NodeHandle, (NodeHandle, ConsumerHandle<Bytes>)),
    producers: Vec<ProducerHandle<Bytes>>,
}

async fn chunked(arbiter: &Arbiter, mode: Mode) -> Chunked {
    let (client, addr, server) = nodes(arbiter, mode, MESSAGE).await;
    let producers = CHUNKS
        .iter()
        .map(|&size| {
            let target = client.consumer_ref::<Bytes>(addr, "blobs").expect("a name");
            producer(target, size)
        })
        .collect();
    Chunked {
        _nodes: (client, server),
        producers,
    }
}

/// The peak heap, as a multiple of `LARGE`, of one `LARGE` message sent through `target`
/// and confirmed.
async fn peak(target: ConsumerRef<Bytes>) -> f64 {
    let producer = producer(target, 1 << 20);
    producer.send(message(1 << 20, 1)).await.expect("warm up");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = counting_alloc::live_bytes();
    counting_alloc::reset_peak();
    let body = message(LARGE, 7);
    producer.send(body).await.expect("confirmed");
    let peak = counting_alloc::peak_bytes().saturating_sub(baseline);
    producer.stop();
    peak as f64 / LARGE as f64
}

async fn report(n: usize, runs: usize) {
    report_header::print("Large messages in chunks (chunk_bench)");
    let arbiter = Arbiter::new();
    let messages: Vec<Bytes> = (0..n).map(|i| message(MESSAGE, i as u8)).collect();
    let mut modes = Vec::new();
    for mode in MODES {
        modes.push(chunked(&arbiter, mode).await);
    }
    // Warm up: caches, allocators, connections.
    for mode in MODES {
        plain_send(&arbiter, &messages[..2], mode.tagged).await;
    }
    for producer in modes.iter().flat_map(|m| &m.producers) {
        burst(producer, &messages[..2]).await;
    }
    // Interleaved, so that a change of the machine's load touches every case alike.
    let mut plain = vec![Vec::new(); MODES.len()];
    let mut reliable = vec![vec![Vec::new(); CHUNKS.len()]; MODES.len()];
    for _ in 0..runs {
        for (m, mode) in modes.iter().enumerate() {
            plain[m].push(plain_send(&arbiter, &messages, MODES[m].tagged).await);
            for (c, producer) in mode.producers.iter().enumerate() {
                reliable[m][c].push(burst(producer, &messages).await);
            }
        }
    }
    drop(modes);
    let mb_s = |d: Duration| (n * MESSAGE) as f64 / 1e6 / d.as_secs_f64();
    println!(
        "\n{n} messages of 16 MiB per run, median of {runs} runs; `Bytes` bodies in bincode; \
         window {WINDOW} chunks; receiving node on its own arbiter (thread)\n"
    );
    println!("| case | MB/s | vs the plain send, same authentication | vs the plain send |");
    println!("|---|---:|---:|---:|");
    let rates: Vec<f64> = plain.into_iter().map(|times| mb_s(median(times))).collect();
    let untagged = rates[0]; // MODES[0] authenticates nothing
    for ((mode, plain_rate), times) in MODES.iter().zip(rates).zip(reliable) {
        let tags = if mode.tagged {
            ", an HMAC-SHA-256 tag per frame"
        } else {
            ""
        };
        println!(
            "| plain framed send over TCP (one 16 MiB frame per message{tags}) | \
             {plain_rate:.0} | 100 % | {:.0} % |",
            100.0 * plain_rate / untagged
        );
        for (size, times) in CHUNKS.iter().zip(times) {
            let rate = mb_s(median(times));
            println!(
                "| reliable in chunks of {} KiB, {} (reassembled, confirmed) | {rate:.0} | \
                 {:.0} % | {:.0} % |",
                size >> 10,
                mode.name,
                100.0 * rate / plain_rate,
                100.0 * rate / untagged
            );
        }
    }

    let local = on(&arbiter, || async { consumer(LARGE) }).await;
    let in_process = peak(local.consumer_ref()).await;
    let mut rows = vec![("in process".to_string(), in_process)];
    for mode in MODES {
        let (client, addr, _server) = nodes(&arbiter, mode, LARGE).await;
        let target = client.consumer_ref::<Bytes>(addr, "blobs").expect("a name");
        let name = format!(
            "over TCP loopback, {}, both nodes in one process",
            mode.name
        );
        rows.push((name, peak(target).await));
    }
    println!(
        "\n| one 256 MiB message, chunks of 1 MiB, window {WINDOW} | peak heap, producer + \
         consumer | × message |"
    );
    println!("|---|---:|---:|");
    for (case, ratio) in rows {
        let mib = ratio * LARGE as f64 / (1 << 20) as f64;
        println!("| {case} | {mib:.0} MiB | {ratio:.3}× |");
    }
    System::current().stop();
}
