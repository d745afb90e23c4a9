//! What the transport benchmarks (`remote_bench`, `nats_bench`) share: the receiving
//! arbiter, a ready consumer, producers, bursts, round trips and their statistics.
#![allow(dead_code)] // each benchmark uses a subset

use std::time::{Duration, Instant};

use actix::Arbiter;
use actix_delivery::{
    Confirmation, ConsumerHandle, ConsumerOptions, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use tokio::sync::oneshot;

/// Room for a whole burst.
const MAX_PENDING: usize = 1 << 24;

/// Runs `f` on the receiving arbiter and returns its result.
pub async fn on<T: Send + 'static, F>(
    arbiter: &Arbiter,
    f: impl FnOnce() -> F + Send + 'static,
) -> T
where
    F: std::future::Future<Output = T> + 'static,
{
    let (tx, rx) = oneshot::channel();
    arbiter.spawn_fn(move || {
        actix::spawn(async move {
            let _ = tx.send(f().await);
        });
    });
    rx.await.expect("the receiving arbiter runs")
}

/// A consumer whose handler is ready at once.
pub fn ready_consumer() -> ConsumerHandle<u64> {
    ready_consumer_of()
}

/// A consumer of `T` whose handler is ready at once.
pub fn ready_consumer_of<T: Send + 'static>() -> ConsumerHandle<T> {
    ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: T| async {
            Ok::<(), std::convert::Infallible>(())
        }))
        .build()
        .expect("valid options"),
    )
}

/// A producer with this window and room for a whole burst.
pub fn producer<T: Clone + Send + 'static>(
    target: actix_delivery::ConsumerRef<T>,
    window: usize,
) -> ProducerHandle<T> {
    ReliableDelivery::producer(
        ProducerOptions::builder(target)
            .window_size(window)
            .max_pending(MAX_PENDING)
            .resend_timeout(Duration::from_secs(5))
            .build()
            .expect("valid options"),
    )
}

/// Tells `n` messages and waits until the last is confirmed.
pub async fn burst(producer: &ProducerHandle<u64>, n: u64) -> Duration {
    burst_of(producer, n, |i| i).await
}

/// Tells `n` messages `make(1..=n)` and waits until the last is confirmed.
pub async fn burst_of<T: Clone + Send + 'static>(
    producer: &ProducerHandle<T>,
    n: u64,
    make: impl Fn(u64) -> T,
) -> Duration {
    let start = Instant::now();
    for i in 1..n {
        producer
            .tell(make(i), Confirmation::none())
            .expect("room for the burst");
    }
    producer.send(make(n)).await.expect("confirmed");
    producer.idle().await;
    start.elapsed()
}

/// One `send().await` at a time, `samples` times (after 100 to warm up); each in µs.
pub async fn reliable_round_trips(producer: &ProducerHandle<u64>, samples: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples as u64 + 100 {
        let start = Instant::now();
        producer.send(i).await.expect("confirmed");
        if i >= 100 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    times
}

/// The `p` quantile of `times`.
pub fn percentile(times: &mut [f64], p: f64) -> f64 {
    times.sort_by(f64::total_cmp);
    times[((times.len() - 1) as f64 * p) as usize]
}

/// The median duration.
pub fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}
