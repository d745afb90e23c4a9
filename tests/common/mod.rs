//! Test support for the actor tests: recorders, a lossy link, a gate for slow handlers.
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::{Ack, DeadLetter, Delivery, DeliveryError, ReplyTo, SingleAck};

/// A shared, cloneable log of values.
#[derive(Debug)]
pub struct Log<T>(Arc<Mutex<Vec<T>>>);

impl<T> Clone for Log<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Default for Log<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Vec::new())))
    }
}

impl<T: Clone> Log<T> {
    pub fn push(&self, value: T) {
        self.0.lock().unwrap().push(value);
    }

    pub fn snapshot(&self) -> Vec<T> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Confirmation results, keyed by the message they belong to.
pub type Confirmations<K> = Log<(K, Result<(), DeliveryError>)>;

/// A confirmation callback that records `(key, result)`.
pub fn confirm_into<K: Clone + Send + 'static>(
    log: &Confirmations<K>,
    key: K,
) -> impl FnOnce(Result<(), DeliveryError>) + Send + 'static + use<K> {
    let log = log.clone();
    move |result| log.push((key, result))
}

/// Lets every actor run until nothing is left to do (virtual time advances by `ms`).
pub async fn settle_for(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Lets every actor run until idle without letting retransmission timers (≥ 1 ms) fire.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Records ACKs sent to it.
pub struct AckProbe(pub Log<Ack>);

impl Actor for AckProbe {
    type Context = Context<Self>;
}

impl Handler<SingleAck> for AckProbe {
    type Result = ();
    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.0.push(ack);
    }
}

/// A `ReplyTo` recording every ACK into the returned log.
pub fn ack_probe() -> (ReplyTo, Log<Ack>) {
    let log = Log::default();
    let addr = AckProbe(log.clone()).start();
    (ReplyTo::from(addr.recipient()), log)
}

/// Records dead letters sent to it.
struct DeadLetters(Log<DeadLetter>);

impl Actor for DeadLetters {
    type Context = Context<Self>;
}

impl Handler<DeadLetter> for DeadLetters {
    type Result = ();
    fn handle(&mut self, letter: DeadLetter, _: &mut Context<Self>) {
        self.0.push(letter);
    }
}

/// A dead-letter sink recording every letter into the returned log.
pub fn dead_letter_log() -> (Recipient<DeadLetter>, Log<DeadLetter>) {
    let log = Log::default();
    let addr = DeadLetters(log.clone()).start();
    (addr.recipient(), log)
}

/// Which deliveries a [`Link`] lets through.
pub type Policy<T> = Box<dyn FnMut(&Delivery<T>) -> bool>;

/// A link between producer and consumer that forwards deliveries its policy lets through and
/// counts both kinds; it also records the header of each delivery it saw.
pub struct Link<T: Send + 'static> {
    target: Recipient<Delivery<T>>,
    policy: Policy<T>,
    pub seen: Log<(String, u128, u64)>,
    pub dropped: Arc<AtomicU64>,
}

impl<T: Send + 'static> Link<T> {
    pub fn new(
        target: Recipient<Delivery<T>>,
        policy: impl FnMut(&Delivery<T>) -> bool + 'static,
    ) -> Self {
        Self {
            target,
            policy: Box::new(policy),
            seen: Log::default(),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<T: Send + 'static> Actor for Link<T> {
    type Context = Context<Self>;
}

impl<T: Send + 'static> Handler<Delivery<T>> for Link<T> {
    type Result = ();
    fn handle(&mut self, delivery: Delivery<T>, _: &mut Context<Self>) {
        self.seen.push((
            delivery.producer_id.to_string(),
            delivery.incarnation.as_u128(),
            delivery.seq,
        ));
        if (self.policy)(&delivery) {
            self.target.do_send(delivery);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A gate that slow handlers wait on until the test opens it.
#[derive(Clone, Default)]
pub struct Gate(Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicBool>);

impl Gate {
    pub async fn pass(&self) {
        while !self.1.load(Ordering::SeqCst) {
            self.0.notified().await;
        }
    }

    pub fn open(&self) {
        self.1.store(true, Ordering::SeqCst);
        self.0.notify_waiters();
    }
}

pub mod blobs;
pub mod dead_letters;
pub mod entities;
pub mod journals;
pub mod logs;

/// A consumer of `T` recording each body its handler runs for.
pub fn recording_consumer<T>() -> (actix_delivery::ConsumerHandle<T>, Log<T>)
where
    T: Clone + Send + 'static,
{
    use actix_delivery::{ConsumerOptions, DeliveryHandler, ReliableDelivery};
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: T| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// A link to `target` that can be cut (deliveries lost); records (seq, body) of what passes.
pub fn cuttable<T: Clone + Send + 'static>(
    target: actix_delivery::ConsumerRef<T>,
) -> (
    actix_delivery::ConsumerRef<T>,
    Arc<std::sync::atomic::AtomicBool>,
    Log<(u64, T)>,
) {
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Log::default();
    let (is_cut, log) = (cut.clone(), seen.clone());
    let link = actix_delivery::ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
        for d in &deliveries {
            log.push((d.seq, d.body.clone()));
        }
        if !is_cut.load(Ordering::SeqCst) {
            target.do_send_all(deliveries.into_iter());
        }
    });
    (link, cut, seen)
}

/// The stream of the durable producers that [`durable_u32`] starts.
pub fn out_stream() -> actix_delivery::journal::PersistenceId {
    actix_delivery::journal::PersistenceId::new("durable-out").unwrap()
}

/// A durable producer of `u32` to `to` on [`out_stream`] of `journal`, resending after 100 ms.
pub fn durable_u32(
    journal: &actix_delivery::journal::MemoryJournal,
    to: actix_delivery::ConsumerRef<u32>,
    window_size: usize,
    max_pending: usize,
) -> actix_delivery::ProducerHandle<u32> {
    use actix_delivery::durable::DurableOptions;
    use actix_delivery::{ProducerOptions, ReliableDelivery};
    let options = ProducerOptions::builder(to)
        .producer_id("durable-producer")
        .window_size(window_size)
        .max_pending(max_pending)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream(), "durable-producer");
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

/// Records the confirmations a durable producer sends to its sink.
pub struct Sink(pub Log<actix_delivery::durable::DurableConfirmation>);

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<actix_delivery::durable::DurableConfirmation> for Sink {
    type Result = ();
    fn handle(
        &mut self,
        confirmation: actix_delivery::durable::DurableConfirmation,
        _: &mut Context<Self>,
    ) {
        self.0.push(confirmation);
    }
}
