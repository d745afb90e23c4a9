//! Workloads shared by the criterion benches (`actix-delivery-benches/benches/delivery.rs`) and the report
//! (`examples/bench_report.rs`, which includes this file with `#[path]`), so that both measure
//! exactly the same thing.
//!
//! Every function here must run inside a running Actix `System` (e.g. inside
//! `SystemRunner::block_on`). Bodies are `u64`.
//!
//! - [`PlainRig`]: the baseline, a plain actor that counts `Count` messages.
//! - [`ReliableRig`]: a `ProducerHandle` → `ProducerController` → `ConsumerController` →
//!   handler → ACK → confirmation pipeline.
//! - [`Site`]: where the receiving actor lives: on the caller's arbiter, or on an arbiter
//!   (thread) of its own.

// Each includer uses a different subset of this module.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_delivery::{
    Confirmation, ConsumerHandle, ConsumerOptions, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};
use futures_util::stream::{FuturesUnordered, StreamExt};

/// The window sizes every end-to-end case is measured at.
pub const WINDOWS: [usize; 4] = [1, 16, 64, 256];

/// How many `send().await` futures the pipelined baselines keep in flight.
pub const PIPELINE_DEPTH: usize = 16;

/// `max_pending` of the benchmark producers: a burst of `tell`s never hits `QueueFull`
/// (criterion may ask for a few hundred thousand messages in one sample).
pub const MAX_PENDING: usize = 1 << 26;

/// Where the receiving side runs, relative to the code that sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Sender, producer and consumer (or the plain counter) share one arbiter (thread).
    SameArbiter,
    /// The consumer (or the plain counter) runs on an arbiter (thread) of its own; the sender
    /// and the producer share the caller's arbiter. Deliveries and ACKs cross threads.
    TwoArbiters,
}

impl Placement {
    /// Both placements, in report order.
    pub const ALL: [Placement; 2] = [Placement::SameArbiter, Placement::TwoArbiters];

    /// A short name for benchmark ids.
    pub fn id(self) -> &'static str {
        match self {
            Placement::SameArbiter => "same_arbiter",
            Placement::TwoArbiters => "two_arbiters",
        }
    }

    /// A human-readable name for the report.
    pub fn label(self) -> &'static str {
        match self {
            Placement::SameArbiter => "same arbiter",
            Placement::TwoArbiters => "two arbiters",
        }
    }
}

/// What the consumer's handler does with each message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerKind {
    /// `async { Ok(()) }`: ready on its first poll.
    Ready,
    /// Returns `Pending` once after waking itself, then `Ok(())` (like one
    /// `tokio::task::yield_now().await`). Note how the consumer polls: a handler started on
    /// arrival is first polled with a no-op waker and polled again by the consumer's driver
    /// future in the same pass (no trip through the executor, but a spawned driver); a handler
    /// started by the driver (a message that waited behind another) wakes the consumer's task,
    /// which costs one trip through the executor.
    YieldOnce,
    /// Returns `Pending` twice, waking itself each time, then `Ok(())`: at least one trip
    /// through the executor per message, however it was started.
    YieldTwice,
}

impl HandlerKind {
    /// A short name for benchmark ids.
    pub fn id(self) -> &'static str {
        match self {
            HandlerKind::Ready => "ready",
            HandlerKind::YieldOnce => "yield_once",
            HandlerKind::YieldTwice => "yield_twice",
        }
    }

    /// A human-readable name for the report.
    pub fn label(self) -> &'static str {
        match self {
            HandlerKind::Ready => "ready handler",
            HandlerKind::YieldOnce => "handler yields once",
            HandlerKind::YieldTwice => "handler yields twice",
        }
    }

    fn pending_polls(self) -> u8 {
        match self {
            HandlerKind::Ready => 0,
            HandlerKind::YieldOnce => 1,
            HandlerKind::YieldTwice => 2,
        }
    }
}

/// A future that returns `Pending` a given number of times, waking itself each time.
#[derive(Debug)]
pub struct Yield(u8);

impl Future for Yield {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Consumer options with the given handler and otherwise default settings.
pub fn consumer_options(kind: HandlerKind) -> ConsumerOptions<u64> {
    let pending_polls = kind.pending_polls();
    let handler = if pending_polls == 0 {
        DeliveryHandler::from_fn(|_: u64| async { Ok::<(), Infallible>(()) })
    } else {
        DeliveryHandler::from_fn(move |_: u64| async move {
            Yield(pending_polls).await;
            Ok::<(), Infallible>(())
        })
    };
    ConsumerOptions::builder(handler)
        .build()
        .expect("default consumer options are valid")
}

/// The plain-actor baseline: counts what it receives.
#[derive(Debug, Default)]
pub struct Counter(u64);

impl Actor for Counter {
    type Context = Context<Self>;
}

/// One message to count.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Count;

/// Asks a [`Counter`] how many messages it counted.
#[derive(Debug, Message)]
#[rtype(result = "u64")]
pub struct Total;

impl Handler<Count> for Counter {
    type Result = ();

    fn handle(&mut self, _: Count, _: &mut Context<Self>) {
        self.0 += 1;
    }
}

impl Handler<Total> for Counter {
    type Result = u64;

    fn handle(&mut self, _: Total, _: &mut Context<Self>) -> u64 {
        self.0
    }
}

/// Where receiving actors are started: the current arbiter, or a dedicated one.
#[derive(Debug)]
pub struct Site {
    placement: Placement,
    arbiter: Option<Arbiter>,
}

impl Site {
    /// Starts the dedicated arbiter if the placement needs one.
    pub fn new(placement: Placement) -> Self {
        let arbiter = (placement == Placement::TwoArbiters).then(Arbiter::new);
        Self { placement, arbiter }
    }

    /// The placement this site implements.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// A plain counter actor.
    pub fn start_counter(&self) -> Addr<Counter> {
        match &self.arbiter {
            None => Counter::default().start(),
            Some(arbiter) => Counter::start_in_arbiter(&arbiter.handle(), |_| Counter::default()),
        }
    }

    /// A reliable consumer with default settings and the given handler.
    pub fn start_consumer(&self, kind: HandlerKind) -> ConsumerHandle<u64> {
        match &self.arbiter {
            None => ReliableDelivery::consumer(consumer_options(kind)),
            Some(arbiter) => {
                ReliableDelivery::consumer_in(&arbiter.handle(), move || consumer_options(kind))
            }
        }
    }

    /// Stops the dedicated arbiter (if any) and waits for its thread.
    pub fn stop(self) {
        if let Some(arbiter) = self.arbiter {
            arbiter.stop();
            let _ = arbiter.join();
        }
    }
}

/// The baseline: plain Actix messaging to a [`Counter`].
#[derive(Debug)]
pub struct PlainRig {
    counter: Addr<Counter>,
    expected: u64,
}

impl PlainRig {
    /// A counter on `site`.
    pub fn new(site: &Site) -> Self {
        Self {
            counter: site.start_counter(),
            expected: 0,
        }
    }

    /// `n` × `do_send(Count)`, then a `send(Total).await` round trip that proves all `n` were
    /// counted. Returns the time from the first `do_send` to the `Total` reply.
    pub async fn do_send_burst(&mut self, n: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            self.counter.do_send(Count);
        }
        let total = self.counter.send(Total).await.expect("the counter runs");
        let elapsed = start.elapsed();
        self.expected += n;
        assert_eq!(total, self.expected, "the counter saw every message");
        elapsed
    }

    /// `n` sequential `send(Count).await` round trips.
    pub async fn send_sequential(&mut self, n: u64) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            self.counter.send(Count).await.expect("the counter runs");
        }
        let elapsed = start.elapsed();
        self.expected += n;
        elapsed
    }

    /// `n` `send(Count)` round trips with `depth` of them in flight at any time.
    pub async fn send_pipelined(&mut self, n: u64, depth: usize) -> Duration {
        let counter = &self.counter;
        let start = Instant::now();
        closed_loop(
            n,
            depth,
            |_| counter.send(Count),
            |r| r.expect("the counter runs"),
        )
        .await;
        let elapsed = start.elapsed();
        self.expected += n;
        elapsed
    }

    /// The duration of each of `n` sequential `send(Count).await` round trips.
    pub async fn send_latencies(&mut self, n: usize) -> Vec<Duration> {
        let mut latencies = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            self.counter.send(Count).await.expect("the counter runs");
            latencies.push(start.elapsed());
        }
        self.expected += n as u64;
        latencies
    }
}

/// How the producer addresses the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `ProducerOptions::builder(&consumer)`: the consumer's `ConsumerRef`, which takes
    /// batches of deliveries (the recommended way).
    ConsumerRef,
    /// `ProducerOptions::builder(consumer.recipient())`: a plain `Recipient<Delivery<T>>`,
    /// one actor message per delivery (what a proxy or a foreign sender gets).
    Recipient,
}

/// The reliable pipeline: handle → producer → consumer → handler → ACK → confirmation.
pub struct ReliableRig {
    producer: ProducerHandle<u64>,
    consumer: ConsumerHandle<u64>,
    expected: u64,
}

impl ReliableRig {
    /// A consumer on `site` with the given handler, and a producer with `window` on the
    /// current arbiter, sending through the consumer's `ConsumerRef`. Other settings are the
    /// defaults, except `max_pending` ([`MAX_PENDING`]).
    pub fn new(site: &Site, window: usize, kind: HandlerKind) -> Self {
        Self::with_route(site, window, kind, Route::ConsumerRef)
    }

    /// [`new`](Self::new), with the producer addressing the consumer through `route`.
    pub fn with_route(site: &Site, window: usize, kind: HandlerKind, route: Route) -> Self {
        let consumer = site.start_consumer(kind);
        let target = match route {
            Route::ConsumerRef => ProducerOptions::builder(&consumer),
            Route::Recipient => ProducerOptions::builder(consumer.recipient()),
        };
        let producer = ReliableDelivery::producer(
            target
                .window_size(window)
                .max_pending(MAX_PENDING)
                .build()
                .expect("valid producer options"),
        );
        Self {
            producer,
            consumer,
            expected: 0,
        }
    }

    /// `n - 1` × `tell(_, Confirmation::none())` and one `send(_).await`, then a stats round
    /// trip that proves all `n` were confirmed. Returns the time from the first `tell` until
    /// every message is confirmed.
    pub async fn tell_burst(&mut self, n: u64) -> Duration {
        assert!(n > 0);
        let start = Instant::now();
        for body in 1..n {
            if self.producer.tell(body, Confirmation::none()).is_err() {
                panic!("tell refused (max_pending too small or producer stopped)");
            }
        }
        self.producer.send(n).await.expect("confirmed");
        self.expected += n;
        // With a handler that always succeeds, the last confirmation comes last; make sure.
        while self
            .producer
            .stats()
            .await
            .expect("producer runs")
            .confirmed
            < self.expected
        {
            actix::clock::sleep(Duration::from_micros(50)).await;
        }
        start.elapsed()
    }

    /// Per message, the time from its `send` call to its confirmation, for `n` messages with
    /// `depth` `send` futures in flight at any time (a closed loop).
    pub async fn send_latencies(&mut self, n: usize, depth: usize) -> Vec<Duration> {
        let producer = &self.producer;
        let mut latencies = Vec::with_capacity(n);
        closed_loop(
            n as u64,
            depth,
            |body| {
                let start = Instant::now();
                let confirmed = producer.send(body);
                async move { confirmed.await.map(|()| start.elapsed()) }
            },
            |r| latencies.push(r.expect("confirmed")),
        )
        .await;
        self.expected += n as u64;
        latencies
    }

    /// Retransmissions by the producer so far (0 unless a message waited longer than
    /// `resend_timeout`, 500 ms, for its ACK).
    pub async fn retransmissions(&self) -> u64 {
        let stats = self.producer.stats().await.expect("producer runs");
        stats.retransmitted
    }

    /// Checks that the consumer ran the handler once per message and saw no duplicates.
    pub async fn check_consumer(&self) {
        let stats = self.consumer.stats().await.expect("consumer runs");
        assert_eq!(
            stats.delivered, self.expected,
            "one handler run per message"
        );
    }
}

/// Runs `n` futures made by `make(i)` (for `i` in `1..=n`) with `depth` of them in flight at
/// any time, passing each output to `done`.
pub async fn closed_loop<F, T>(
    n: u64,
    depth: usize,
    mut make: impl FnMut(u64) -> F,
    mut done: impl FnMut(T),
) where
    F: Future<Output = T>,
{
    let mut in_flight = FuturesUnordered::new();
    let mut next = 1;
    while next <= n && in_flight.len() < depth {
        in_flight.push(make(next));
        next += 1;
    }
    while let Some(output) = in_flight.next().await {
        done(output);
        if next <= n {
            in_flight.push(make(next));
            next += 1;
        }
    }
}
