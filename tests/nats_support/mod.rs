//! Support for the NATS tests: the server's address, unique subjects, carriers.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};

/// The server the tests use: `ACTIX_DELIVERY_NATS_URL`, by default the one on 127.0.0.1.
pub fn url() -> String {
    std::env::var("ACTIX_DELIVERY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A subject no other test (or run) uses.
pub fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("actix-delivery-test.{what}.{}-{nanos}", std::process::id())
}

/// A client that reconnects at once (the tests restart servers).
pub async fn client(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(20))
        .connect(url)
        .await
        .unwrap_or_else(|err| panic!("connect to NATS at {url}: {err} (is the server running?)"))
}

/// A carrier on the test server.
pub async fn carrier() -> NatsCarrierHandle {
    carrier_at(&url(), NatsOptions::default()).await
}

pub async fn carrier_at(url: &str, options: NatsOptions) -> NatsCarrierHandle {
    NatsCarrierHandle::with_client(client(url).await, options)
        .await
        .unwrap()
}

/// Publishes, as a plain client (no server), `count` messages with the status line
/// `NATS/1.0 503` and no payload to `subject`: what the server's "no responders" notice looks
/// like on the wire. (The NATS clients set no status line on what they publish, so this
/// speaks the protocol itself.)
pub async fn publish_status_503(url: &str, subject: &str, count: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("nats://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut out = String::from("CONNECT {\"verbose\":false,\"headers\":true}\r\n");
    for _ in 0..count {
        out.push_str(&format!("HPUB {subject} 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"));
    }
    out.push_str("PING\r\n");
    stream.write_all(out.as_bytes()).await.unwrap();
    // INFO first, then PONG once the server processed everything before the PING.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(6).any(|w| w == b"PONG\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("the server answers PING")
            .unwrap();
        assert!(
            n > 0,
            "the server closed: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
}

/// Subscribes `raw` to `subject` and waits until the server has the subscription.
pub async fn subscribed(raw: &async_nats::Client, subject: &str) -> async_nats::Subscriber {
    let subscriber = raw.subscribe(subject.to_string()).await.unwrap();
    round_trip(raw).await;
    subscriber
}

/// Waits until the server has processed everything `raw` sent before (`flush` only writes to
/// the socket): a probe published after it comes back.
pub async fn round_trip(raw: &async_nats::Client) {
    use futures_util::StreamExt;
    let probe = raw.new_inbox();
    let mut echo = raw.subscribe(probe.clone()).await.unwrap();
    raw.publish(probe, bytes::Bytes::new()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), echo.next())
        .await
        .expect("the server echoes the probe");
}
