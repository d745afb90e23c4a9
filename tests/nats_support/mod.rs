//! Support for the NATS tests: the server's address, unique subjects, carriers.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use actix_delivery::nats::{NatsCarrier, NatsOptions};

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
pub async fn carrier() -> NatsCarrier {
    carrier_at(&url(), NatsOptions::default()).await
}

pub async fn carrier_at(url: &str, options: NatsOptions) -> NatsCarrier {
    NatsCarrier::with_client(client(url).await, options)
        .await
        .unwrap()
}
