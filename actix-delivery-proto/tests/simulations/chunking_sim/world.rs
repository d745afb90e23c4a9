//! The simulated world of one run: its producers (`ChunkedProducer`s), one `ConsumerCore`,
//! the links between them, the handler, virtual time, and the checks made as the run goes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io::Read;
use std::time::{Duration, Instant};

use actix_delivery_proto::config::{ConsumerConfig, Limit, ProducerConfig};
use actix_delivery_proto::error::DeliveryError;
use actix_delivery_proto::protocol::chunk::producer::ChunkedProducer;
use actix_delivery_proto::protocol::chunk::{split, Assembled};
use actix_delivery_proto::protocol::consumer::{ConsumerCore, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::envelope::{Ack, Header, Incarnation};
use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::scenario::{Scenario, Wiring, RESEND_TIMEOUT};

/// What happened in a run, for the per-class fault totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub messages: u64,
    pub chunks_sent: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub runs: u64,
    pub handler_failures: u64,
    pub consumer_restarts: u64,
    pub producer_restarts: u64,
    pub rounds: u64,
    pub chunks_refused: u64,
    pub partials_dropped: u64,
    pub refused: u64,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        let fields = [
            (&mut self.messages, other.messages),
            (&mut self.chunks_sent, other.chunks_sent),
            (&mut self.dropped, other.dropped),
            (&mut self.duplicated, other.duplicated),
            (&mut self.runs, other.runs),
            (&mut self.handler_failures, other.handler_failures),
            (&mut self.consumer_restarts, other.consumer_restarts),
            (&mut self.producer_restarts, other.producer_restarts),
            (&mut self.rounds, other.rounds),
            (&mut self.chunks_refused, other.chunks_refused),
            (&mut self.partials_dropped, other.partials_dropped),
            (&mut self.refused, other.refused),
        ];
        for (mine, theirs) in fields {
            *mine += theirs;
        }
    }
}

#[derive(Debug)]
enum Event {
    Submit {
        producer: usize,
        id: u64,
    },
    ToConsumer {
        producer: usize,
        header: Header,
        bytes: Bytes,
    },
    ToProducer {
        producer: usize,
        ack: Ack,
    },
    ProducerTimer(usize),
    ConsumerTimer,
    HandlerDone {
        life: u64,
        run: u64,
        ok: bool,
    },
    RestartConsumer,
    RestartProducer(usize),
}

struct Producer {
    core: ChunkedProducer<u64>,
    window: usize,
    incarnation: u128,
    lives: u128,
    lens: Vec<usize>,
    /// Ok confirmations per message.
    confirmed: Vec<u32>,
    /// The last seq of each message in each incarnation it was sent in.
    last_of: HashMap<(u128, u64), u64>,
    /// The highest seq transmitted in this incarnation (to recognise a round).
    highest: u64,
}

/// The content of message `id` of producer `p`, `len` bytes (at least 9): who it is, then
/// bytes derived from both.
pub fn content(p: usize, id: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![p as u8];
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend((9..len).map(|i| (i as u64 ^ id.wrapping_mul(31) ^ p as u64) as u8));
    bytes
}

/// Who a message is, from its first bytes.
fn identity(bytes: &[u8]) -> Option<(usize, u64)> {
    let id = u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?);
    Some((usize::from(*bytes.first()?), id))
}

fn read_all(
    mut message: Assembled,
) -> Result<Vec<u8>, actix_delivery_proto::protocol::envelope::DeadLetterReason> {
    let mut out = Vec::new();
    message.read_to_end(&mut out).expect("in memory");
    Ok(out)
}

/// One run.
pub struct World {
    sc: Scenario,
    rng: SmallRng,
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: HashMap<u64, Event>,
    next_event: u64,
    producers: Vec<Producer>,
    consumer: ConsumerCore<Vec<u8>, usize>,
    life: u64,
    run: u64,
    running: Option<u64>,
    /// (producer, incarnation, last seq) of successful runs, in this consumer life and ever.
    succeeded_in_life: HashSet<(usize, u128, u64)>,
    succeeded: HashSet<(usize, u128, u64)>,
    pub counts: Counts,
    pub violations: Vec<String>,
}

impl World {
    pub fn new(sc: &Scenario) -> Self {
        let mut rng = SmallRng::seed_from_u64(sc.seed);
        let config = ConsumerConfig {
            ordered: sc.ordered,
            max_message_bytes: sc.max_message_bytes,
            max_reassembly_bytes: sc.max_reassembly_bytes,
            max_out_of_order: sc.max_out_of_order,
            handler_timeout: Limit::Unbounded,
            min_reassembly_rate: sc.min_reassembly_rate(),
            ..Default::default()
        };
        let producers = sc
            .producers
            .iter()
            .enumerate()
            .map(|(p, spec)| {
                let config = ProducerConfig {
                    producer_id: Some(format!("p{p}")),
                    window_size: spec.window,
                    resend_timeout: RESEND_TIMEOUT,
                    ..Default::default()
                };
                let incarnation = p as u128 * 1000;
                let core =
                    ChunkedProducer::seeded(&config, Incarnation::from_u128(incarnation), || {
                        rng.random()
                    });
                Producer {
                    core,
                    window: spec.window,
                    incarnation,
                    lives: 1,
                    lens: spec.messages.iter().map(|(_, len)| (*len).max(9)).collect(),
                    confirmed: vec![0; spec.messages.len()],
                    last_of: HashMap::new(),
                    highest: 0,
                }
            })
            .collect();
        let mut world = Self {
            sc: sc.clone(),
            rng,
            base: Instant::now(),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            producers,
            consumer: ConsumerCore::new(&config),
            life: 0,
            run: 0,
            running: None,
            succeeded_in_life: HashSet::new(),
            succeeded: HashSet::new(),
            counts: Counts::default(),
            violations: Vec::new(),
        };
        for (p, spec) in sc.producers.iter().enumerate() {
            world.counts.messages += spec.messages.len() as u64;
            for (id, (at, _)) in spec.messages.iter().enumerate() {
                world.at(
                    *at,
                    Event::Submit {
                        producer: p,
                        id: id as u64,
                    },
                );
            }
            for at in &spec.restarts {
                world.at(*at, Event::RestartProducer(p));
            }
        }
        for at in sc.consumer_restarts.clone() {
            world.at(at, Event::RestartConsumer);
        }
        world
    }

    /// Runs until every message is confirmed, or the liveness bound passes.
    pub fn run(&mut self) {
        let deadline = self.sc.heal_at + self.sc.liveness_bound();
        while let Some(Reverse((at, key))) = self.queue.pop() {
            if at > deadline {
                break;
            }
            self.now = at;
            let event = self.events.remove(&key).expect("scheduled");
            self.handle(event);
            if self.all_confirmed() {
                break;
            }
        }
        self.check_end();
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn healed(&self) -> bool {
        self.now >= self.sc.heal_at
    }

    fn at(&mut self, at: Duration, event: Event) {
        let key = self.next_event;
        self.next_event += 1;
        self.events.insert(key, event);
        self.queue.push(Reverse((at, key)));
    }

    /// The arrival delays of one message on a link: none (lost), one, or two (duplicated).
    fn transmit(&mut self) -> Vec<Duration> {
        let lossy = !self.healed();
        if lossy && self.rng.random_bool(self.sc.drop) {
            self.counts.dropped += 1;
            return Vec::new();
        }
        let copies = if lossy && self.rng.random_bool(self.sc.duplicate) {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        let max = self.sc.max_latency.as_millis() as u64;
        (0..copies)
            .map(|_| Duration::from_millis(self.rng.random_range(0..=max)))
            .collect()
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Submit { producer, id } => {
                let p = &mut self.producers[producer];
                let bytes = Bytes::from(content(producer, id, p.lens[id as usize]));
                let chunks = split(&bytes, self.sc.producers[producer].chunk_size);
                if p.core.handle_send(chunks, id).is_err() {
                    self.violations
                        .push(format!("p{producer} refused message {id}"));
                }
                self.flush_producer(producer);
            }
            Event::ToConsumer {
                producer,
                header,
                bytes,
            } => self.deliver(producer, header, bytes),
            Event::ToProducer { producer, ack } => {
                self.producers[producer].core.handle_ack(&ack);
                self.flush_producer(producer);
            }
            Event::ProducerTimer(producer) => {
                let now = self.instant();
                self.producers[producer].core.handle_timeout(now);
                self.flush_producer(producer);
            }
            Event::ConsumerTimer => {
                let now = self.instant();
                if self.consumer.handle_timeout(now).is_some() {
                    self.violations.push("a handler run was abandoned".into());
                }
            }
            Event::HandlerDone { life, run, ok } => self.handler_done(life, run, ok),
            Event::RestartConsumer => {
                self.counts.consumer_restarts += 1;
                self.consumer.clear();
                self.life += 1;
                self.running = None;
                self.succeeded_in_life.clear();
            }
            Event::RestartProducer(producer) => {
                self.counts.producer_restarts += 1;
                let p = &mut self.producers[producer];
                p.incarnation = producer as u128 * 1000 + p.lives;
                p.lives += 1;
                p.highest = 0;
                p.core.restart(Incarnation::from_u128(p.incarnation));
                self.flush_producer(producer);
            }
        }
        self.check_consumer_bounds();
    }

    /// Sends what producer `p` transmits, takes its confirmations, re-arms its timer.
    fn flush_producer(&mut self, p: usize) {
        let now = self.instant();
        while let Some(t) = self.producers[p].core.poll_transmit(now) {
            let chunk = t.header.chunk.expect("a chunked producer sends chunks");
            let producer = &mut self.producers[p];
            if chunk.index_of(t.header.seq) == Some(0) {
                let (_, id) = identity(&t.body).expect("chunk 0 starts with the id");
                producer
                    .last_of
                    .insert((producer.incarnation, id), chunk.last_seq());
            }
            let resent = t.attempt == 1 && t.header.seq <= producer.highest;
            producer.highest = producer.highest.max(t.header.seq);
            if resent && self.sc.wiring == Wiring::NoRounds {
                continue;
            }
            self.counts.chunks_sent += 1;
            for delay in self.transmit() {
                self.at(
                    self.now + delay,
                    Event::ToConsumer {
                        producer: p,
                        header: t.header.clone(),
                        bytes: t.body.clone(),
                    },
                );
            }
        }
        while let Some((id, result)) = self.producers[p].core.poll_settled() {
            self.settled(p, id, result);
        }
        let producer = &self.producers[p];
        let stats = producer.core.stats();
        if stats.in_flight > producer.window {
            self.violations
                .push(format!("p{p} has {} in flight", stats.in_flight));
        }
        self.counts.rounds = self
            .producers
            .iter()
            .map(|p| p.core.stats().chunk_rounds)
            .sum();
        if let Some(deadline) = self.producers[p].core.next_deadline() {
            let at = deadline.saturating_duration_since(self.base).max(self.now);
            self.at(at, Event::ProducerTimer(p));
        }
    }

    fn settled(&mut self, p: usize, id: u64, result: Result<(), DeliveryError>) {
        let producer = &mut self.producers[p];
        match result {
            Ok(()) => {
                let last = producer.last_of.get(&(producer.incarnation, id)).copied();
                let handled = last
                    .is_some_and(|last| self.succeeded.contains(&(p, producer.incarnation, last)));
                if !handled {
                    self.violations.push(format!(
                        "p{p} message {id} confirmed without a successful handler run"
                    ));
                }
                producer.confirmed[id as usize] += 1;
                if producer.confirmed[id as usize] > 1 {
                    self.violations
                        .push(format!("p{p} message {id} confirmed twice"));
                }
            }
            // A restart settled it: its caller hands it over again.
            Err(DeliveryError::ProducerStopped | DeliveryError::StoppedUnconfirmed) => {
                self.at(self.now, Event::Submit { producer: p, id })
            }
            Err(other) => self
                .violations
                .push(format!("p{p} message {id} settled with {other}")),
        }
    }

    fn deliver(&mut self, producer: usize, header: Header, bytes: Bytes) {
        let now = self.instant();
        let chunk = header.chunk.expect("a chunk");
        let last_chunk = header.seq == chunk.last_seq();
        let ack_for = |header: &Header| Ack {
            producer_id: header.producer_id.clone(),
            incarnation: header.incarnation,
            seq: header.seq,
        };
        let planted =
            (self.sc.wiring == Wiring::AckLastOnReceipt && last_chunk).then(|| ack_for(&header));
        let inbound = Inbound {
            header,
            body: bytes,
            reply_to: Some(producer),
        };
        let step = self.consumer.handle_chunk(inbound, read_all, now);
        if let Some((to, ack)) = step.ack {
            self.send_ack(to, ack);
        }
        if let (Some(ack), true) = (planted, step.step.is_hold()) {
            self.send_ack(producer, ack);
        }
        match step.step {
            Step::Run(body) => self.start_run(body),
            Step::DeadLetter(reason, header) => self.violations.push(format!(
                "a dead letter from an honest producer: {reason} (seq {})",
                header.seq
            )),
            Step::Hold | Step::Ack(..) => {}
        }
        self.arm_consumer_timer();
    }

    fn send_ack(&mut self, producer: usize, ack: Ack) {
        for delay in self.transmit() {
            self.at(
                self.now + delay,
                Event::ToProducer {
                    producer,
                    ack: ack.clone(),
                },
            );
        }
    }

    /// The handler starts on `body` (the consumer's running message).
    fn start_run(&mut self, body: Vec<u8>) {
        let header = self.consumer.running().expect("it runs").clone();
        self.counts.runs += 1;
        match identity(&body) {
            Some((p, id))
                if p < self.producers.len()
                    && (id as usize) < self.producers[p].lens.len()
                    && body == content(p, id, self.producers[p].lens[id as usize]) =>
            {
                let name = format!("p{p}");
                let incarnation = header.incarnation.as_u128();
                let last = self.producers[p].last_of.get(&(incarnation, id));
                if header.producer_id.as_str() != name || last != Some(&header.seq) {
                    self.violations.push(format!(
                        "the handler runs p{p} message {id} for {} seq {}",
                        header.producer_id, header.seq
                    ));
                }
                let first = header.chunk.map(|c| c.first_seq);
                let expected =
                    header.seq + 1 - body.len().div_ceil(self.sc.producers[p].chunk_size) as u64;
                if first != Some(expected) {
                    self.violations.push(format!(
                        "p{p} message {id} runs with first seq {first:?}, not {expected}"
                    ));
                }
            }
            _ => self.violations.push(format!(
                "the handler runs on a body that is no whole message ({} bytes, seq {})",
                body.len(),
                header.seq
            )),
        }
        self.run += 1;
        self.running = Some(self.run);
        let ok = self.healed() || !self.rng.random_bool(self.sc.handler_failure);
        let took = Duration::from_millis(self.rng.random_range(0..=200));
        let (life, run) = (self.life, self.run);
        self.at(self.now + took, Event::HandlerDone { life, run, ok });
    }

    fn handler_done(&mut self, life: u64, run: u64, ok: bool) {
        if life != self.life || self.running != Some(run) {
            return; // the consumer restarted meanwhile
        }
        self.running = None;
        let header = self.consumer.running().expect("it runs").clone();
        let producer = usize::from(header.producer_id.as_str().as_bytes()[1] - b'0');
        let key = (producer, header.incarnation.as_u128(), header.seq);
        let outcome = if ok {
            if !self.succeeded_in_life.insert(key) {
                self.violations.push(format!(
                    "{} seq {} handled twice while the consumer lived",
                    header.producer_id, header.seq
                ));
            }
            self.succeeded.insert(key);
            HandlerOutcome::Succeeded
        } else {
            self.counts.handler_failures += 1;
            HandlerOutcome::Failed("planned".into())
        };
        let done = self.consumer.handle_outcome(&outcome, self.instant());
        if let Some((to, ack)) = done.ack {
            self.send_ack(to, ack);
        }
        if let Some(body) = done.next {
            self.start_run(body);
        }
        self.arm_consumer_timer();
    }

    fn arm_consumer_timer(&mut self) {
        if let Some(deadline) = self.consumer.next_deadline() {
            let at = deadline.saturating_duration_since(self.base).max(self.now);
            if at <= self.sc.heal_at + self.sc.liveness_bound() {
                self.at(at, Event::ConsumerTimer);
            }
        }
    }

    fn check_consumer_bounds(&mut self) {
        let stats = self.consumer.stats();
        if stats.reassembly_bytes > self.sc.max_reassembly_bytes {
            self.violations.push(format!(
                "{} bytes held for reassembly, more than {}",
                stats.reassembly_bytes, self.sc.max_reassembly_bytes
            ));
        }
        if stats.partial_messages > stats.tracked_incarnations {
            self.violations.push(format!(
                "{} partial messages for {} producer incarnations",
                stats.partial_messages, stats.tracked_incarnations
            ));
        }
        self.counts.chunks_refused = self.counts.chunks_refused.max(stats.chunks_refused);
        self.counts.partials_dropped = self
            .counts
            .partials_dropped
            .max(stats.partial_messages_dropped);
        self.counts.refused = self.counts.refused.max(stats.refused);
    }

    fn all_confirmed(&self) -> bool {
        self.producers
            .iter()
            .all(|p| p.confirmed.iter().all(|&n| n > 0))
    }

    fn check_end(&mut self) {
        if std::env::var("CHUNK_SIM_DEBUG").is_ok() {
            for (p, producer) in self.producers.iter().enumerate() {
                eprintln!("p{p}: {:?}", producer.core.stats());
                eprintln!("p{p}: {:?}", producer.core);
            }
            eprintln!("consumer: {:?}", self.consumer.stats());
        }
        for (p, producer) in self.producers.iter().enumerate() {
            for (id, &n) in producer.confirmed.iter().enumerate() {
                if n != 1 {
                    self.violations.push(format!(
                        "p{p} message {id} confirmed {n} times by {:?} (heal at {:?})",
                        self.now, self.sc.heal_at
                    ));
                }
            }
        }
    }
}
