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
//! forger's and the durable storage's (durable producers, outbox lanes, their crashes) in
//! their own.

mod consumer_side;
mod durable_side;
mod forger;
mod producer_side;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use actix_delivery_proto::config::ProducerConfig;
use actix_delivery_proto::protocol::consumer::{ConsumerCore, ConsumerStats, HandlerOutcome};
use actix_delivery_proto::protocol::envelope::{Ack, Header, Incarnation, ProducerId};
use actix_delivery_proto::protocol::producer::{ProducerCore, ProducerStats, Transmission};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::durable::Unit;
use super::events::EventQueue;
use super::link::{Link, LinkCounts};
use super::observe::{BodyRecord, Key, Observations};
use super::scenario::{DurableKind, Scenario, PROGRESS_STEPS, PROGRESS_TIME};
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
    /// A copy of a delivery reaches the consumer (`resent`: by a later life of its durable
    /// storage than the one that stored it).
    Delivery {
        producer: usize,
        transmission: Transmission<Body>,
        resent: bool,
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
    /// The oldest write in flight of durable unit `unit` commits (ignored if the unit crashed
    /// since life `life`).
    Commit { unit: usize, life: u32 },
    /// Durable crash `disruption` (an index into the scenario's disruptions) strikes `unit`:
    /// if `life` is given, only if the unit is still in that life (else it waits for its
    /// moment again).
    Crash {
        unit: usize,
        disruption: usize,
        life: Option<u32>,
    },
    /// A crashed durable unit restarts.
    Restart { unit: usize },
}

/// A core deadline.
#[derive(Clone, Copy, Debug)]
enum Timer {
    Producer(usize),
    /// A durable unit's shell timer.
    Unit(usize),
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
    /// Final counters of each producer (summed over the lives of a durable one).
    pub producer_stats: Vec<ProducerStats>,
    /// How each durable unit ended.
    pub units: Vec<UnitEnd>,
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

/// How a durable unit ended.
#[derive(Clone, Copy, Debug)]
pub struct UnitEnd {
    /// It was not crashed.
    pub up: bool,
    /// Nothing waited to be stored, recorded or committed.
    pub idle: bool,
    /// Stored messages its journal still holds unsettled.
    pub journaled_unsettled: usize,
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
    /// Durable: its unit and lane.
    unit: Option<(usize, usize)>,
    /// Counters of its earlier (crashed) lives.
    retired: ProducerStats,
    /// Durable: the seqs this life must transmit first, in order (its resumed messages)…
    expect_resumed: VecDeque<u64>,
    /// …and the seq of the first new message after them (consecutive from there).
    expect_next: u64,
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
    /// The producer owning each (incarnation, id index): incarnations are drawn at random, but
    /// an outbox entity's lanes (distinct ids) share one.
    owners: StableMap<(u128, usize), usize>,
    /// Durable storage: one unit per durable producer or outbox entity.
    units: Vec<Unit>,
    /// Per unit: the settlements its latest crash lost before their record, (lane, seq, body),
    /// to be resumed by its restart.
    unrecorded: Vec<Vec<(usize, u64, Body)>>,
    /// Per producer id index.
    id_switches: Vec<IdSwitches>,
    /// The floor the simulator predicts per incarnation window, by (producer, incarnation), in
    /// this consumer life: the highest `window_start - 1` of the window's arrivals. Forgotten
    /// whenever the consumer drops windows (a fresh window starts from its first arrival's
    /// `window_start`), so the prediction never exceeds the core's floor.
    floors: StableMap<(usize, u128), u64>,
    /// Windows the consumer dropped so far (evicted, swept, replaced).
    windows_dropped: u64,
    /// Per disruption of the scenario: struck at quiescence, its trigger unreached (see
    /// `strike_unreached_disruptions`).
    struck: Vec<bool>,
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
        // The incarnation of each outbox entity: its lanes share it.
        let mut entities = BTreeMap::new();
        let mut producers: Vec<SimProducer> = (0..scenario.producers)
            .map(|index| {
                let id_index = scenario.id_of(index);
                let config = ProducerConfig {
                    producer_id: Some(format!("p{id_index}")),
                    ..scenario.producer.clone()
                };
                let incarnation: u128 = rng.random();
                let shared = match scenario.durable_kind(index) {
                    Some(DurableKind::Outbox { entity }) => entities.get(&entity).copied(),
                    _ => None,
                };
                let incarnation = shared.unwrap_or(incarnation);
                assert!(
                    owners.insert((incarnation, id_index), index).is_none(),
                    "incarnations collide"
                );
                let incarnation = Incarnation::from_u128(incarnation);
                let jitter: u64 = rng.random();
                let core = match scenario.durable_kind(index) {
                    None => ProducerCore::seeded(&config, incarnation, || jitter),
                    Some(kind) => {
                        if let DurableKind::Outbox { entity } = kind {
                            entities.insert(entity, incarnation.as_u128());
                        }
                        // A new stream: the shell resumes it with nothing stored.
                        ProducerCore::resume(&config, incarnation, 1, [], || jitter)
                    }
                };
                SimProducer {
                    id: core.id().clone(),
                    id_index,
                    core,
                    window_size: config.window_size,
                    offered: 0,
                    total: scenario.messages_of(index),
                    confirmed: 0,
                    highest_seq: 0,
                    unit: None,
                    retired: ProducerStats::default(),
                    expect_resumed: VecDeque::new(),
                    expect_next: 1,
                }
            })
            .collect();
        let units = Self::units(scenario, &mut producers);
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
            unrecorded: vec![Vec::new(); units.len()],
            units,
            id_switches: (0..scenario.ids()).map(|_| IdSwitches::default()).collect(),
            floors: StableMap::default(),
            windows_dropped: 0,
            struck: vec![false; scenario.disruptions.len()],
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
                (None, _) if self.settled == self.scenario.messages => {
                    if self.strike_unreached_disruptions() {
                        continue;
                    }
                    break End::Quiescent;
                }
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
            producer_stats: self
                .producers
                .iter()
                .map(|p| durable_side::summed(&p.retired, &p.core.stats()))
                .collect(),
            producers_idle: self.producers.iter().map(|p| p.core.is_idle()).collect(),
            units: self
                .units
                .iter()
                .map(|unit| UnitEnd {
                    up: unit.down_until.is_none(),
                    idle: unit.is_idle(),
                    journaled_unsettled: unit.journaled_unsettled(),
                })
                .collect(),
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
            if p.unit.is_some() {
                return None; // its unit's shell timer
            }
            let deadline = p.core.next_deadline()?;
            Some((self.since_epoch(deadline), Timer::Producer(index)))
        });
        let units = self
            .units
            .iter()
            .enumerate()
            .filter_map(|(index, unit)| Some((unit.alarm?, Timer::Unit(index))));
        let consumer = self
            .consumer
            .next_deadline()
            .map(|deadline| (self.since_epoch(deadline), Timer::Consumer));
        producers
            .chain(units)
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
                resent,
            } => self.deliver(producer, transmission, resent),
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
            Event::Commit { unit, life } => self.commit(unit, life),
            Event::Crash {
                unit,
                disruption,
                life,
            } => self.crash_event(unit, disruption, life),
            Event::Restart { unit } => self.restart_unit(unit),
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
            Timer::Unit(unit) => self.unit_timer(unit),
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
