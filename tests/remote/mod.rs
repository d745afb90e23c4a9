//! Support for the TCP tests: nodes on 127.0.0.1, recording consumers, waiting with a deadline.
//!
//! The suites of `remote_delivery`, `remote_faults` and `remote_crash` run in the mode of
//! [`secured`]: over mutual TLS when built with the `tls` feature (the all-features pass),
//! with the shared secret otherwise.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeOptionsBuilder, NodeSecret};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};

pub const SECRET: &[u8] = b"test secret: 32 bytes, not real!";

pub fn secret() -> NodeSecret {
    NodeSecret::new(SECRET).unwrap()
}

/// Options for test nodes: short timeouts so that faults are detected in milliseconds.
pub fn fast(builder: NodeOptionsBuilder) -> NodeOptionsBuilder {
    builder
        .heartbeat_interval(Duration::from_millis(50))
        .idle_timeout(Duration::from_millis(500))
        .handshake_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100))
}

/// An address of 127.0.0.1 with a port that nothing listens on now, below the ephemeral range
/// (32768 and up on Linux): the OS never hands it to an outgoing connection, so a test can
/// listen on it again and again (a node that restarts on the same address).
pub fn reusable_addr() -> SocketAddr {
    let mut seed = u64::from(std::process::id()) << 20
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    for _ in 0..1000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let port = 20_000 + (seed >> 33) % 12_000;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port between 20000 and 32000");
}

pub fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// [`fast`] options in the suites' mode: mutual TLS with the shared test PKI when built with
/// the `tls` feature, the test secret otherwise.
pub fn secured(builder: NodeOptionsBuilder) -> NodeOptionsBuilder {
    #[cfg(feature = "tls")]
    let builder = builder.tls(tls::shared_tls());
    #[cfg(not(feature = "tls"))]
    let builder = builder.secret(secret());
    fast(builder)
}

/// What a child process needs to run in the suites' mode (the shared test PKI under TLS).
pub fn child_env() -> Vec<(&'static str, String)> {
    #[cfg(feature = "tls")]
    return tls::child_env();
    #[cfg(not(feature = "tls"))]
    Vec::new()
}

/// A node in the suites' mode listening on an ephemeral port of 127.0.0.1.
pub async fn listening_node() -> NodeHandle {
    let options = secured(NodeOptions::builder())
        .listen(localhost())
        .build()
        .unwrap();
    NodeHandle::start(options).await.unwrap()
}

/// A node in the suites' mode that does not listen.
pub async fn sending_node() -> NodeHandle {
    let options = secured(NodeOptions::builder()).build().unwrap();
    NodeHandle::start(options).await.unwrap()
}

/// A node with the test secret listening on an ephemeral port of 127.0.0.1 (for the tests of
/// the secret's handshake and frame tags).
pub async fn secret_listening_node() -> NodeHandle {
    let options = fast(NodeOptions::builder().secret(secret()))
        .listen(localhost())
        .build()
        .unwrap();
    NodeHandle::start(options).await.unwrap()
}

/// A producer sending to `target` with this window, retransmitting every `resend_ms`.
pub fn producer<T: Clone + Send + 'static>(
    target: ConsumerRef<T>,
    window: usize,
    resend_ms: u64,
) -> ProducerHandle<T> {
    ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .window_size(window)
            .resend_timeout(Duration::from_millis(resend_ms))
            .build()
            .unwrap(),
    )
}

/// Asserts that messages 1..=n were each confirmed exactly once, all `Ok`; `context` names
/// the run (a seed) in the failure.
pub fn assert_each_confirmed_once(
    confirmations: &crate::common::Confirmations<u64>,
    n: u64,
    context: &str,
) {
    let mut per_message: HashMap<u64, u32> = HashMap::new();
    for (message, result) in confirmations.snapshot() {
        assert_eq!(result, Ok(()), "{context}: message {message}");
        *per_message.entry(message).or_default() += 1;
    }
    let wrong: Vec<_> = (1..=n)
        .filter(|m| per_message.get(m) != Some(&1))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "{context}: not confirmed exactly once: {wrong:?}"
    );
    assert_eq!(
        per_message.len() as u64,
        n,
        "{context}: confirmations of unknown messages"
    );
}

/// How often each body was handled.
#[derive(Clone, Default)]
pub struct Handled<T>(pub Arc<Mutex<HashMap<T, u32>>>);

impl<T: std::hash::Hash + Eq + Clone> Handled<T> {
    pub fn record(&self, body: T) {
        *self.0.lock().unwrap().entry(body).or_default() += 1;
    }

    pub fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }

    pub fn snapshot(&self) -> HashMap<T, u32> {
        self.0.lock().unwrap().clone()
    }
}

/// A consumer that records every body it handles.
pub fn recording_consumer<T>() -> (ConsumerHandle<T>, Handled<T>)
where
    T: std::hash::Hash + Eq + Clone + Send + 'static,
{
    let handled = Handled::<T>(Arc::default());
    let record = handled.clone();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |body: T| {
            record.record(body);
            async { Ok::<(), String>(()) }
        }))
        .build()
        .unwrap(),
    );
    (consumer, handled)
}

/// Waits (really: these tests use real sockets) until `done` holds, at most `timeout`.
pub async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done()
}

pub mod evolution;
pub mod proxy;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wire;
