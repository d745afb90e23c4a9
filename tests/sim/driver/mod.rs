//! The simulation loop: drives `ProducerCore`s and one `ConsumerCore` through lossy links in
//! virtual time, exactly as the actor shells do (one core call per input, then drain its
//! outputs), and records what happens.
//!
//! Virtual time jumps to the earliest of the next event (an arrival, a handler completion, an
//! offer, a restart) and the cores' deadlines; nothing sleeps. A run ends when every message
//! is settled and nothing is left in flight, or as a STALL (nothing in flight, no handler
//! running, no timer armed, messages still unsettled: a liveness bug), or when no message
//! has been settled for too long (a livelock).
//!
//! The reactions to producer-side and consumer-side events live in the submodules, the
//! forger's in its own.

mod consumer_side;
mod forger;
mod producer_side;

use std::time::{Duration, Instant};

use actix_delivery::protocol::consumer::{ConsumerCore, ConsumerStats, HandlerOutcome};
use actix_delivery::protocol::envelope::{Ack, Header, Incarnation, ProducerId};
use actix_delivery::protocol::producer::{ProducerCore, ProducerStats, Transmission};
use actix_delivery::ProducerConfig;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::events::EventQueue;
use super::link::{Link, LinkCounts};
use super::observe::{BodyRecord, Key, Observations};
use super::scenario::{Scenario, PROGRESS_STEPS, PROGRESS_TIME};
use super::stable_hash::StableMap;
use super::trace::{Trace, TraceEvent};

/// Bodies and confirmation tokens are body ids: the producer's index in the high 32 bits, the
/// message's number within that producer in the low 32. Forged bodies have [`FORGED_BODY`]
/// set.
type Body = u64;

/// The bit that marks a forged body (real bodies stay far below it).
pub const FORGED_BODY: Body = 1 << 63;

/// The reply address of a delivery: the index of the producer that sent it.
type ReplyTo = usize;

/// Something that happens at a point of simulated time.
#[derive(Debug)]
enum Event {
    /// The next message of a producer is offered to it.
    Offer { producer: usize },
    /// A copy of a delivery reaches the consumer.
    Delivery {
        producer: usize,
        transmission: Transmission<Body>,
    },
    /// A copy of an ACK reaches a producer.
    AckArrival { producer: usize, ack: Ack },
    /// Handler run number `run` of consumer life `life`, started when the consumer had seen its
    /// producer's id switch incarnations `switches_at_start` times, ends.
    HandlerEnd {
        life: u32,
        run: u64,
        switches_at_start: u64,
        header: Header,
        body: Body,
        outcome: HandlerOutcome,
    },
    /// A producer restarts with a new incarnation.
    ProducerRestart { producer: usize },
    /// Forgery number `forgery` of the scenario is injected.
    Forge { forgery: usize },
    /// A forged delivery, speaking for producer `victim`, reaches the consumer.
    ForgedDelivery {
        victim: usize,
        header: Header,
        body: Body,
    },
    /// The consumer restarts, losing its state.
    ConsumerRestart,
}

/// A core deadline.
#[derive(Clone, Copy, Debug)]
enum Timer {
    Producer(usize),
    Consumer,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Every message settled, nothing left in flight.
    Quiescent,
    /// Nothing in flight, no handler running, no timer armed, yet messages unsettled.
    Stall(String),
    /// Messages unsettled, yet none settled for [`PROGRESS_STEPS`] steps or
    /// [`PROGRESS_TIME`] of simulated time: a livelock.
    NoProgress(String),
    /// The step cap was hit (a backstop; `NoProgress` normally comes first).
    StepCap(String),
}

/// The result of a run: how it ended, what was observed, and the cores' final counters.
#[derive(Debug)]
pub struct Run {
    /// How the run ended.
    pub end: End,
    /// What the simulator saw.
    pub observations: Observations,
    /// What the producer → consumer link did.
    pub forward: LinkCounts,
    /// What the consumer → producer link did.
    pub backward: LinkCounts,
    /// Final counters of each producer.
    pub producer_stats: Vec<ProducerStats>,
    /// Whether each producer ended idle.
    pub producers_idle: Vec<bool>,
    /// Final counters of the consumer (cumulative over its lives).
    pub consumer_stats: ConsumerStats,
    /// Whether the consumer still had a handler running at the end.
    pub consumer_running: bool,
    /// The event trace.
    pub trace: Trace,
    /// Steps taken.
    pub steps: u64,
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// The longest stretch, in steps and in simulated time, in which no message was settled
    /// while some were unsettled.
    pub longest_quiet: (u64, Duration),
}

/// One producer and the simulator's bookkeeping for it.
#[derive(Debug)]
struct SimProducer {
    core: ProducerCore<Body, Body>,
    id: ProducerId,
    /// The index of its id (producers may share one, see `Scenario::shared_ids`).
    id_index: usize,
    window_size: usize,
    offered: usize,
    total: usize,
    confirmed: usize,
    /// The highest seq its current incarnation transmitted.
    highest_seq: u64,
}

/// The incarnations a producer id's deliveries carried, as the consumer saw them.
#[derive(Debug, Default)]
struct IdSwitches {
    /// The incarnation of the id's latest delivery seen by the consumer.
    seen: Option<Incarnation>,
    /// How often that incarnation changed.
    switches: u64,
}

/// The handler run in progress, as the simulator started it.
#[derive(Clone, Copy, Debug)]
struct RunningRun {
    key: Key,
    /// Its number (runs of all lives are numbered from 1).
    run: u64,
    /// When it started.
    started: Duration,
    /// How long it takes (drawn at the start).
    duration: Duration,
    /// Whether it was drawn slow (see `HandlerFaults::slow`).
    slow: bool,
}

/// The whole simulated world.
struct World<'a> {
    scenario: &'a Scenario,
    /// The one RNG behind every random decision of the run.
    rng: SmallRng,
    /// The real instant that stands for simulated time zero.
    epoch: Instant,
    /// Simulated time since the epoch.
    now: Duration,
    /// Events and timer firings processed so far.
    step: u64,
    queue: EventQueue<Event>,
    forward: Link,
    backward: Link,
    producers: Vec<SimProducer>,
    consumer: ConsumerCore<Body, ReplyTo>,
    /// The consumer's life: 0, then one more per restart.
    life: u32,
    /// The producer owning each incarnation (incarnations are drawn at random, so a map by
    /// incarnation, checked against the id, maps reports by (id, incarnation)).
    owners: StableMap<u128, usize>,
    /// Per producer id index.
    id_switches: Vec<IdSwitches>,
    /// The floor the simulator predicts per incarnation window in this consumer life: the
    /// highest `window_start - 1` of the window's arrivals. Forgotten whenever the consumer
    /// drops windows (a fresh window starts from its first arrival's `window_start`), so the
    /// prediction never exceeds the core's floor.
    floors: StableMap<u128, u64>,
    /// Windows the consumer dropped so far (evicted, swept, replaced).
    windows_dropped: u64,
    /// Whether each forgery of the scenario was triggered.
    forgeries_triggered: Vec<bool>,
    /// Forged bodies made so far.
    forged_bodies: u64,
    /// The message whose handler runs now, as the simulator saw it start.
    running: Option<RunningRun>,
    /// Handler runs started so far.
    runs: u64,
    /// Successful handler runs so far (all lives).
    handled: usize,
    /// Messages settled for good (`Ok`, `GaveUp`, or wrongly).
    settled: usize,
    /// Step and time of the latest settlement (or of the start).
    last_settled: (u64, Duration),
    /// See [`Run::longest_quiet`].
    longest_quiet: (u64, Duration),
    /// The key each body was last transmitted under.
    current_key: StableMap<Body, Key>,
    obs: Observations,
    trace: Trace,
}

/// Runs `scenario` to its end.
pub fn simulate(scenario: &Scenario) -> Run {
    World::new(scenario).run()
}

impl<'a> World<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let mut rng = SmallRng::seed_from_u64(scenario.seed);
        let mut owners = StableMap::default();
        let producers = (0..scenario.producers)
            .map(|index| {
                let id_index = scenario.id_of(index);
                let config = ProducerConfig {
                    producer_id: Some(format!("p{id_index}")),
                    ..scenario.producer.clone()
                };
                let incarnation: u128 = rng.random();
                assert!(
                    owners.insert(incarnation, index).is_none(),
                    "incarnations collide"
                );
                let core = ProducerCore::new(&config, Incarnation::from_u128(incarnation))
                    .with_jitter_seed(rng.random());
                SimProducer {
                    id: core.id().clone(),
                    id_index,
                    core,
                    window_size: config.window_size,
                    offered: 0,
                    total: scenario.messages_of(index),
                    confirmed: 0,
                    highest_seq: 0,
                }
            })
            .collect();
        Self {
            scenario,
            rng,
            epoch: Instant::now(),
            now: Duration::ZERO,
            step: 0,
            queue: EventQueue::new(),
            forward: Link::new(scenario.forward.clone()),
            backward: Link::new(scenario.backward.clone()),
            producers,
            consumer: ConsumerCore::new(&scenario.consumer),
            life: 0,
            owners,
            id_switches: (0..scenario.ids()).map(|_| IdSwitches::default()).collect(),
            floors: StableMap::default(),
            windows_dropped: 0,
            forgeries_triggered: vec![false; scenario.forgeries.len()],
            forged_bodies: 0,
            running: None,
            runs: 0,
            handled: 0,
            settled: 0,
            last_settled: (0, Duration::ZERO),
            longest_quiet: (0, Duration::ZERO),
            current_key: StableMap::default(),
            obs: Observations::default(),
            trace: Trace::new(),
        }
    }

    fn run(mut self) -> Run {
        for producer in 0..self.producers.len() {
            if self.producers[producer].total > 0 {
                self.queue.push(Duration::ZERO, Event::Offer { producer });
            }
        }
        let step_cap = self.scenario.step_cap();
        let end = loop {
            let next_event = self.queue.next_at();
            let next_timer = self.next_timer();
            let event_first = match (next_event, next_timer) {
                (None, _) if self.settled == self.scenario.messages => break End::Quiescent,
                (None, None) => break End::Stall(self.stall_report()),
                (Some(event), Some((timer, _))) => event <= timer,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if self.step >= step_cap {
                break End::StepCap(format!(
                    "step cap of {step_cap} steps hit at t={:?} with {} of {} messages \
                     unsettled (a livelock, or a deadline that does not advance)",
                    self.now,
                    self.scenario.messages - self.settled,
                    self.scenario.messages
                ));
            }
            self.step += 1;
            if event_first {
                let (at, event) = self.queue.pop().expect("peeked above");
                self.now = at;
                self.handle(event);
            } else {
                let (at, timer) = next_timer.expect("checked above");
                self.now = self.now.max(at);
                self.fire(timer);
            }
            if let Some(end) = self.check_progress() {
                break end;
            }
            self.check_windows();
            self.check_waiting();
        };
        Run {
            end,
            forward: self.forward.counts(),
            backward: self.backward.counts(),
            producer_stats: self.producers.iter().map(|p| p.core.stats()).collect(),
            producers_idle: self.producers.iter().map(|p| p.core.is_idle()).collect(),
            consumer_stats: self.consumer.stats(),
            consumer_running: self.consumer.is_running(),
            observations: self.obs,
            trace: self.trace,
            steps: self.step,
            elapsed: self.now,
            longest_quiet: self.longest_quiet,
        }
    }

    /// Notes the quiet stretch since the latest settlement; `NoProgress` once it is too long.
    fn check_progress(&mut self) -> Option<End> {
        if self.settled == self.scenario.messages {
            return None;
        }
        let quiet = (
            self.step - self.last_settled.0,
            self.now - self.last_settled.1,
        );
        self.longest_quiet = (
            self.longest_quiet.0.max(quiet.0),
            self.longest_quiet.1.max(quiet.1),
        );
        (quiet.0 > PROGRESS_STEPS || quiet.1 > PROGRESS_TIME).then(|| {
            End::NoProgress(format!(
                "no message settled for {} steps and {:?} of simulated time (up to t={:?}), \
                 {} of {} still unsettled: a livelock",
                quiet.0,
                quiet.1,
                self.now,
                self.scenario.messages - self.settled,
                self.scenario.messages
            ))
        })
    }

    /// The current simulated time as the cores see it.
    fn instant(&self) -> Instant {
        self.epoch + self.now
    }

    /// A core deadline as simulated time.
    fn since_epoch(&self, deadline: Instant) -> Duration {
        deadline.saturating_duration_since(self.epoch)
    }

    /// The earliest armed core deadline (producers before the consumer on ties).
    fn next_timer(&self) -> Option<(Duration, Timer)> {
        let producers = self.producers.iter().enumerate().filter_map(|(index, p)| {
            let deadline = p.core.next_deadline()?;
            Some((self.since_epoch(deadline), Timer::Producer(index)))
        });
        let consumer = self
            .consumer
            .next_deadline()
            .map(|deadline| (self.since_epoch(deadline), Timer::Consumer));
        producers
            .chain(consumer)
            .min_by_key(|&(at, timer)| (at, matches!(timer, Timer::Consumer)))
    }

    /// Carries out one event.
    fn handle(&mut self, event: Event) {
        match event {
            Event::Offer { producer } => self.offer(producer),
            Event::Delivery {
                producer,
                transmission,
            } => self.deliver(producer, transmission),
            Event::AckArrival { producer, ack } => self.ack_arrives(producer, &ack),
            Event::HandlerEnd {
                life,
                run,
                switches_at_start,
                header,
                body,
                outcome,
            } => self.handler_ends((life, run), switches_at_start, header, body, outcome),
            Event::ProducerRestart { producer } => self.restart_producer(producer),
            Event::Forge { forgery } => self.forge(forgery),
            Event::ForgedDelivery {
                victim,
                header,
                body,
            } => self.forged_arrives(victim, header, body),
            Event::ConsumerRestart => self.restart_consumer(),
        }
    }

    /// Fires one core deadline.
    fn fire(&mut self, timer: Timer) {
        let now = self.instant();
        match timer {
            Timer::Producer(producer) => {
                self.trace
                    .record(self.now, TraceEvent::ProducerTimer { producer });
                self.producers[producer].core.handle_timeout(now);
                self.flush_producer(producer);
            }
            Timer::Consumer => {
                let before = self.consumer.stats().swept;
                let abandoned = self.consumer.handle_timeout(now);
                self.note_dropped_windows();
                let swept = (self.consumer.stats().swept - before) as usize;
                self.trace
                    .record(self.now, TraceEvent::ConsumerTimer { swept });
                if let Some(completion) = abandoned {
                    self.handler_abandoned(completion);
                }
            }
        }
    }

    /// What a STALL left behind: the unsettled messages (the first few of them).
    fn stall_report(&self) -> String {
        let mut unsettled: Vec<(u64, &BodyRecord)> = self
            .obs
            .bodies
            .iter()
            .filter(|(_, record)| record.finals() == 0)
            .map(|(&body, record)| (body, record))
            .collect();
        unsettled.sort_unstable_by_key(|&(body, _)| body);
        let examples: Vec<String> = unsettled
            .iter()
            .take(5)
            .map(|&(body, record)| {
                let key = self.current_key.get(&body);
                format!(
                    "body {body:#x} of p{} (last sent as {key:?}, {} successful handler runs)",
                    record.producer, record.successes
                )
            })
            .collect();
        format!(
            "STALL at t={:?}: nothing in flight on either link, no handler running, no timer \
             armed, but {} of {} messages are unsettled ({} never offered yet); e.g. {}",
            self.now,
            self.scenario.messages - self.settled,
            self.scenario.messages,
            self.scenario.messages - self.obs.bodies.len(),
            examples.join("; ")
        )
    }
}

/// The lowest 16 bits of an incarnation, to tell incarnations apart in a trace.
fn short(incarnation: Incarnation) -> u16 {
    incarnation.as_u128() as u16
}
