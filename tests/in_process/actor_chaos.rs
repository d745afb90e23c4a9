//! The real ProducerController and ConsumerController connected through a seeded flaky link
//! that drops, duplicates and delays (so reorders) deliveries and ACKs, with a handler that
//! fails at random, under virtual time. The same invariants as the core simulator hold: the
//! Actix shells add no behaviour of their own.

use crate::common;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::{
    Ack, Acks, ConsumerOptions, ConsumerRef, Deliveries, Delivery, DeliveryError, DeliveryHandler,
    ProducerHandle, ProducerOptions, ReliableDelivery, ReplyTo, SingleAck,
};
use common::{settle_for, Log};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One scenario: fault rates and topology.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    seed: u64,
    producers: u32,
    messages: u32,
    window: usize,
    loss: f64,
    duplication: f64,
    max_delay_ms: u64,
    handler_failure: f64,
    ordered: bool,
}

/// The seeded source of every random decision, and counts of what it injected.
struct Chaos {
    rng: SmallRng,
    scenario: Scenario,
    dropped: u64,
    duplicated: u64,
    failed: u64,
}

impl Chaos {
    /// How many copies of a message to deliver (0 = dropped), each with its delay.
    fn copies(&mut self) -> Vec<Duration> {
        if self.rng.random::<f64>() < self.scenario.loss {
            self.dropped += 1;
            return Vec::new();
        }
        let copies = if self.rng.random::<f64>() < self.scenario.duplication {
            self.duplicated += 1;
            2
        } else {
            1
        };
        (0..copies)
            .map(|_| Duration::from_millis(self.rng.random_range(0..=self.scenario.max_delay_ms)))
            .collect()
    }
}

type SharedChaos = Rc<RefCell<Chaos>>;

/// Sits between one producer and the consumer, in both directions.
struct FlakyLink {
    consumer: Recipient<Delivery<u32>>,
    producer: Option<ReplyTo>,
    chaos: SharedChaos,
}

impl Actor for FlakyLink {
    type Context = Context<Self>;
}

impl FlakyLink {
    fn forward_delivery(&mut self, mut delivery: Delivery<u32>, ctx: &mut Context<Self>) {
        if let Some(reply_to) = delivery.reply_to.take() {
            self.producer.get_or_insert(reply_to);
        }
        let addr = ctx.address();
        let own_reply = ReplyTo::batching(addr.clone().recipient(), addr.recipient());
        for delay in self.chaos.borrow_mut().copies() {
            let copy = Delivery {
                producer_id: delivery.producer_id.clone(),
                incarnation: delivery.incarnation,
                seq: delivery.seq,
                window_start: delivery.window_start,
                body: delivery.body,
                reply_to: Some(own_reply.clone()),
                trace_context: None,
            };
            let consumer = self.consumer.clone();
            ctx.run_later(delay, move |_, _| consumer.do_send(copy));
        }
    }

    fn forward_ack(&mut self, ack: Ack, ctx: &mut Context<Self>) {
        let Some(producer) = self.producer.clone() else {
            return;
        };
        for delay in self.chaos.borrow_mut().copies() {
            let (producer, ack) = (producer.clone(), ack.clone());
            ctx.run_later(delay, move |_, _| producer.do_send(ack));
        }
    }
}

impl Handler<Delivery<u32>> for FlakyLink {
    type Result = ();
    fn handle(&mut self, delivery: Delivery<u32>, ctx: &mut Context<Self>) {
        self.forward_delivery(delivery, ctx);
    }
}

impl Handler<Deliveries<u32>> for FlakyLink {
    type Result = ();
    fn handle(&mut self, Deliveries(batch): Deliveries<u32>, ctx: &mut Context<Self>) {
        batch
            .into_iter()
            .for_each(|d| self.forward_delivery(d, ctx));
    }
}

impl Handler<SingleAck> for FlakyLink {
    type Result = ();
    fn handle(&mut self, SingleAck(ack): SingleAck, ctx: &mut Context<Self>) {
        self.forward_ack(ack, ctx);
    }
}

impl Handler<Acks> for FlakyLink {
    type Result = ();
    fn handle(&mut self, Acks(acks): Acks, ctx: &mut Context<Self>) {
        acks.into_iter().for_each(|a| self.forward_ack(a, ctx));
    }
}

/// What a run produced: the handler's successful calls in order and every confirmation.
#[derive(Debug, PartialEq)]
struct Trace {
    handled: Vec<u32>,
    confirmations: Vec<(u32, Result<(), DeliveryError>)>,
    dropped: u64,
    duplicated: u64,
    failed: u64,
}

/// Message ids encode their producer: `producer * 1_000_000 + index`.
fn id(producer: u32, index: u32) -> u32 {
    producer * 1_000_000 + index
}

async fn run(scenario: Scenario) -> Trace {
    let chaos = Rc::new(RefCell::new(Chaos {
        rng: SmallRng::seed_from_u64(scenario.seed),
        scenario,
        dropped: 0,
        duplicated: 0,
        failed: 0,
    }));
    let handled = Log::default();
    let (log, handler_chaos) = (handled.clone(), chaos.clone());
    let handler = DeliveryHandler::from_fn(move |body: u32| {
        let mut chaos = handler_chaos.borrow_mut();
        let fail = chaos.rng.random::<f64>() < chaos.scenario.handler_failure;
        if fail {
            chaos.failed += 1;
        } else {
            log.push(body);
        }
        async move {
            if fail {
                Err("injected failure")
            } else {
                Ok(())
            }
        }
    });
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(handler)
            .ordered(scenario.ordered)
            .build()
            .unwrap(),
    );
    let confirmations = Log::default();
    let mut producers: Vec<ProducerHandle<u32>> = Vec::new();
    for p in 0..scenario.producers {
        let link = FlakyLink {
            consumer: consumer.recipient(),
            producer: None,
            chaos: chaos.clone(),
        }
        .start();
        let target = ConsumerRef::batching(link.clone().recipient(), link.recipient());
        let producer = ReliableDelivery::producer(
            ProducerOptions::builder(target)
                .producer_id(format!("producer-{p}"))
                .window_size(scenario.window)
                .resend_timeout(Duration::from_millis(200))
                .build()
                .unwrap(),
        );
        for i in 0..scenario.messages {
            let log = confirmations.clone();
            let body = id(p, i);
            producer.tell(body, move |r| log.push((body, r))).unwrap();
        }
        producers.push(producer);
    }
    let total = (scenario.producers * scenario.messages) as usize;
    for _ in 0..6_000 {
        if confirmations.len() >= total {
            break;
        }
        settle_for(50).await;
        for producer in &producers {
            let in_flight = producer.stats().await.unwrap().in_flight;
            assert!(
                in_flight <= scenario.window,
                "{scenario:?}: {in_flight} in flight"
            );
        }
    }
    let chaos = chaos.borrow();
    Trace {
        handled: handled.snapshot(),
        confirmations: confirmations.snapshot(),
        dropped: chaos.dropped,
        duplicated: chaos.duplicated,
        failed: chaos.failed,
    }
}

fn check(scenario: &Scenario, trace: &Trace) {
    let expected: Vec<u32> = (0..scenario.producers)
        .flat_map(|p| (0..scenario.messages).map(move |i| id(p, i)))
        .collect();
    let mut confirmed: Vec<u32> = trace
        .confirmations
        .iter()
        .map(|(body, result)| {
            assert_eq!(
                *result,
                Ok(()),
                "{scenario:?}: message {body} not confirmed Ok"
            );
            *body
        })
        .collect();
    confirmed.sort_unstable();
    assert_eq!(
        confirmed, expected,
        "{scenario:?}: every message confirmed exactly once"
    );
    let mut successes: HashMap<u32, u32> = HashMap::new();
    for body in &trace.handled {
        *successes.entry(*body).or_default() += 1;
    }
    for body in &expected {
        assert_eq!(
            successes.get(body).copied().unwrap_or(0),
            1,
            "{scenario:?}: handler must succeed exactly once for message {body}"
        );
    }
    if scenario.ordered {
        let mut last: BTreeMap<u32, u32> = BTreeMap::new();
        for body in &trace.handled {
            let (producer, index) = (body / 1_000_000, body % 1_000_000);
            if let Some(previous) = last.insert(producer, index) {
                assert!(
                    previous < index,
                    "{scenario:?}: {previous} then {index} for {producer}"
                );
            }
        }
    }
}

fn scenario(seed: u64) -> Scenario {
    let windows = [1, 16, 64];
    Scenario {
        seed,
        producers: 1 + (seed % 3) as u32,
        messages: 100,
        window: windows[(seed % 3) as usize],
        loss: [0.0, 0.1, 0.3][(seed / 3 % 3) as usize],
        duplication: [0.0, 0.1, 0.3][(seed / 9 % 3) as usize],
        max_delay_ms: [0, 20, 300][(seed % 3) as usize],
        handler_failure: [0.0, 0.05, 0.2][(seed / 2 % 3) as usize],
        ordered: seed % 2 == 1,
    }
}

#[actix::test]
async fn real_actors_over_a_flaky_link_deliver_everything_exactly_once_per_consumer_life() {
    tokio::time::pause();
    let (mut dropped, mut duplicated, mut failed) = (0, 0, 0);
    for seed in 0..27 {
        let scenario = scenario(seed);
        let trace = run(scenario).await;
        check(&scenario, &trace);
        dropped += trace.dropped;
        duplicated += trace.duplicated;
        failed += trace.failed;
    }
    // The fault injector really injected faults.
    assert!(
        dropped > 100 && duplicated > 100 && failed > 50,
        "{dropped} {duplicated} {failed}"
    );
}

#[actix::test]
async fn the_same_seed_gives_the_same_trace() {
    tokio::time::pause();
    let scenario = Scenario {
        seed: 7,
        producers: 2,
        messages: 60,
        window: 16,
        loss: 0.2,
        duplication: 0.2,
        max_delay_ms: 50,
        handler_failure: 0.1,
        ordered: false,
    };
    let first = run(scenario).await;
    check(&scenario, &first);
    assert!(first.dropped > 0 && first.duplicated > 0 && first.failed > 0);
    assert_eq!(run(scenario).await, first);
}
