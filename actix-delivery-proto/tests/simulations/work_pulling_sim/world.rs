//! The simulated world: the pool and its wiring (as `src/work_pulling/controller.rs`), one
//! `ProducerCore` per worker registration, the workers' `ConsumerCore`s and handlers, the
//! lossy links between them, the registry with its crash detection, the churn and the shared
//! effect store. One seeded RNG, virtual time jumping from event to event.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use actix_delivery_proto::config::{ConsumerConfig, Limit, ProducerConfig};
use actix_delivery_proto::error::DeliveryError;
use actix_delivery_proto::protocol::consumer::{
    Completion, ConsumerCore, HandlerOutcome, Inbound, Step,
};
use actix_delivery_proto::protocol::envelope::{Ack, Header, Incarnation};
use actix_delivery_proto::protocol::producer::{ProducerCore, Transmission};
use actix_delivery_proto::work_pulling::pool::{JobKey, Settled, WorkerKey};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::model::CheckedPool;
use super::scenario::{LinkFaults, Scenario, Store, Wiring};
use super::tally::Tally;

/// A confirmation token of a worker stream: the worker and the job's key, as the shell's.
type Token = (WorkerKey, JobKey);

/// One traced event (its fields are read through `Debug`, in failure reports).
#[derive(Clone, Debug)]
#[allow(dead_code)]
pub enum Trace {
    /// A job arrived.
    Push(u64),
    /// A worker registered (`reg`) and joined the pool as `key`.
    Join {
        name: String,
        key: WorkerKey,
        reg: u64,
    },
    /// A worker left the pool; the jobs it re-routed.
    Leave {
        key: WorkerKey,
        why: &'static str,
        rerouted: Vec<JobKey>,
    },
    /// A worker crashed.
    Crash { name: String },
    /// A crashed worker restarted.
    Restart { name: String },
    /// The crash of a worker was detected: it is deregistered.
    Detect { name: String, reg: u64 },
    /// The pool assigned a job.
    Assign { job: JobKey, worker: WorkerKey },
    /// A stream put a delivery on the wire (`copies` arrive: 0 lost, 2 duplicated).
    Send {
        stream: WorkerKey,
        seq: u64,
        job: u64,
        attempt: u32,
        copies: usize,
    },
    /// A delivery reached a worker's consumer, and what the consumer made of it.
    Deliver {
        name: String,
        stream: WorkerKey,
        seq: u64,
        job: u64,
        step: &'static str,
    },
    /// A handler run started.
    Run {
        name: String,
        job: u64,
        plan: Plan,
        ms: u64,
    },
    /// A handler run ended.
    RunEnd {
        name: String,
        job: u64,
        plan: Plan,
        effect: bool,
    },
    /// A handler run was abandoned (`handler_timeout`).
    Abandoned { name: String },
    /// An ACK went out (`copies` arrive).
    AckSent {
        name: String,
        stream: WorkerKey,
        seq: u64,
        copies: usize,
    },
    /// An ACK reached a stream (`acted`: it confirmed something there).
    AckArrived {
        stream: WorkerKey,
        seq: u64,
        acted: bool,
    },
    /// A settlement reached the pool, and what the pool did.
    Settle {
        worker: WorkerKey,
        job: JobKey,
        result: Result<(), DeliveryError>,
        settled: &'static str,
    },
    /// A removed worker's stream stopped.
    Stopped { stream: WorkerKey },
    /// Churn ended and everything healed.
    Heal,
}

/// A traced event and when.
#[derive(Clone, Debug)]
pub struct TraceLine {
    /// Virtual time, ms.
    pub at_ms: u64,
    /// The event.
    pub event: Trace,
}

impl fmt::Display for TraceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>8} ms  {:?}", self.at_ms, self.event)
    }
}

/// How a handler run goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Records the effect, succeeds.
    Ok,
    /// Fails before the effect.
    FailBefore,
    /// Records the effect, then fails (no ACK).
    FailAfter,
}

enum Ev {
    Push(u64),
    Deliver {
        proc: usize,
        life: u64,
        stream: WorkerKey,
        index: u64,
        header: Header,
        job: u64,
    },
    Ack {
        proc: usize,
        life: u64,
        stream: WorkerKey,
        index: u64,
        ack: Ack,
    },
    HandlerDone {
        proc: usize,
        life: u64,
        run: u64,
    },
    Settle {
        worker: WorkerKey,
        key: JobKey,
        result: Result<(), DeliveryError>,
    },
    StreamStop(WorkerKey),
    Churn,
    Detect {
        proc: usize,
        reg: u64,
    },
    Restart(usize),
    Heal,
}

struct Scheduled {
    at: Duration,
    order: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// The pool's side of a worker registration: its reliable stream.
struct Stream {
    proc: usize,
    core: ProducerCore<u64, Token>,
    capacity: usize,
}

/// Per stream, both directions of its link: how many messages were sent, the latest
/// arrived (for reorder counting).
#[derive(Default)]
struct LinkState {
    sent: [u64; 2],
    latest: [Option<u64>; 2],
}

struct RunState {
    id: u64,
    job: u64,
    plan: Plan,
}

/// A worker process.
struct Proc {
    alive: bool,
    /// Incremented at each crash: messages of an earlier life are dropped.
    life: u64,
    consumer: ConsumerCore<u64, WorkerKey>,
    running: Option<RunState>,
}

/// What a run left behind, for the checks.
pub struct Outcome {
    /// Per job (index = job id, 0 unused): confirmations to the caller.
    pub confirmed: Vec<u32>,
    /// Per job: give-ups reported to the caller.
    pub given_up: Vec<u32>,
    /// Per job: effects applied.
    pub effects: Vec<u32>,
    /// Per job: handler runs that succeeded.
    pub ok_runs: Vec<u32>,
    /// Per job: handler runs that reached their end.
    pub runs: Vec<u32>,
    /// When the last job was settled (all of them were), from the start.
    pub done_at: Option<Duration>,
    /// When the run ended.
    pub ended_at: Duration,
    /// Rules broken as the run went.
    pub broken: Vec<String>,
    /// The counters.
    pub tally: Tally,
    /// The trace tail.
    pub trace: VecDeque<TraceLine>,
    /// Where each unsettled job is.
    pub stuck: Vec<(u64, String)>,
    /// A digest of the whole trace (determinism check).
    pub digest: u64,
}

/// After the last confirmation, the run goes on this long (late copies, late effects).
const LINGER: Duration = Duration::from_secs(30);

/// The simulation of one scenario.
pub struct World<'a> {
    sc: &'a Scenario,
    rng: SmallRng,
    base: Instant,
    now: Duration,
    queue: BinaryHeap<Scheduled>,
    order: u64,
    pool: CheckedPool,
    streams: BTreeMap<WorkerKey, Stream>,
    stopping: BTreeMap<WorkerKey, Stream>,
    /// The planted wiring's removed-but-kept workers.
    ghosts: BTreeSet<WorkerKey>,
    links: BTreeMap<WorkerKey, LinkState>,
    by_name: BTreeMap<usize, WorkerKey>,
    next_worker: u64,
    procs: Vec<Proc>,
    registry: BTreeMap<usize, u64>,
    next_reg: u64,
    next_run: u64,
    pending_settlements: BTreeMap<WorkerKey, usize>,
    healed: bool,
    consumer_config: ConsumerConfig,
    store: BTreeSet<u64>,
    effects: Vec<u32>,
    ok_runs: Vec<u32>,
    runs: Vec<u32>,
    confirmed: Vec<u32>,
    given_up: Vec<u32>,
    /// Jobs confirmed or given up.
    settled_count: usize,
    done_at: Option<Duration>,
    broken: Vec<String>,
    tally: Tally,
    trace: VecDeque<TraceLine>,
    trace_cap: usize,
    with_digest: bool,
    digest: u64,
}

impl<'a> World<'a> {
    /// A world for `sc`, keeping the last `trace_cap` trace lines (and, `with_digest`, a
    /// digest of the whole trace).
    pub fn new(sc: &'a Scenario, trace_cap: usize, with_digest: bool) -> Self {
        let mut rng = SmallRng::seed_from_u64(sc.seed);
        let pool = CheckedPool::new(rng.random(), sc.give_up_after);
        let consumer_config = ConsumerConfig {
            handler_timeout: sc.handler_timeout.map_or(Limit::Unbounded, Limit::At),
            ..ConsumerConfig::default()
        };
        let procs = sc
            .workers
            .iter()
            .map(|_| Proc {
                alive: true,
                life: 0,
                consumer: ConsumerCore::new(&consumer_config),
                running: None,
            })
            .collect();
        let jobs = sc.jobs();
        Self {
            sc,
            rng,
            base: Instant::now(),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            order: 0,
            pool,
            streams: BTreeMap::new(),
            stopping: BTreeMap::new(),
            ghosts: BTreeSet::new(),
            links: BTreeMap::new(),
            by_name: BTreeMap::new(),
            next_worker: 1,
            procs,
            registry: BTreeMap::new(),
            next_reg: 1,
            next_run: 1,
            pending_settlements: BTreeMap::new(),
            healed: false,
            consumer_config,
            store: BTreeSet::new(),
            effects: vec![0; jobs + 1],
            ok_runs: vec![0; jobs + 1],
            runs: vec![0; jobs + 1],
            confirmed: vec![0; jobs + 1],
            given_up: vec![0; jobs + 1],
            settled_count: 0,
            done_at: None,
            broken: Vec::new(),
            tally: Tally {
                runs: 1,
                jobs: jobs as u64,
                ..Tally::default()
            },
            trace: VecDeque::new(),
            trace_cap: trace_cap.max(1),
            with_digest,
            digest: 0xcbf2_9ce4_8422_2325,
        }
    }

    fn at(&self) -> Instant {
        self.base + self.now
    }

    fn schedule(&mut self, after: Duration, ev: Ev) {
        self.order += 1;
        self.queue.push(Scheduled {
            at: self.now + after,
            order: self.order,
            ev,
        });
    }

    fn trace(&mut self, event: Trace) {
        let line = TraceLine {
            at_ms: self.now.as_millis() as u64,
            event,
        };
        if self.with_digest {
            // FNV-1a over the rendered line (only for the determinism check: formatting
            // every line costs).
            for byte in format!("{line}").bytes() {
                self.digest = (self.digest ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
        if self.trace.len() == self.trace_cap {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    fn fail(&mut self, rule: String) {
        if self.broken.len() < 100 {
            let at = self.now.as_millis();
            self.broken.push(format!("at {at} ms: {rule}"));
        }
    }

    fn name(&self, proc: usize) -> String {
        self.sc.workers[proc].name.clone()
    }

    fn link_faults(&self) -> LinkFaults {
        if self.healed {
            LinkFaults::HEALED
        } else {
            self.sc.link
        }
    }

    fn ms(&mut self, min: Duration, max: Duration) -> Duration {
        Duration::from_micros(
            self.rng
                .random_range(min.as_micros() as u64..=max.as_micros() as u64),
        )
    }

    /// Runs the scenario to its end.
    pub fn run(mut self) -> Outcome {
        for (i, &at) in self.sc.pushes.iter().enumerate() {
            self.schedule(at, Ev::Push(i as u64 + 1));
        }
        for proc in 0..self.sc.workers.len() {
            if self.sc.workers[proc].initially {
                self.register(proc);
            }
        }
        if self.sc.churn.mean_gap > Duration::ZERO {
            let gap = self.churn_gap();
            self.schedule(gap, Ev::Churn);
        }
        let heal = self.sc.heal_at;
        self.schedule(heal, Ev::Heal);
        let limit = self.sc.heal_at + self.sc.liveness_bound() + LINGER;
        let mut steps: u64 = 0;
        let mut same_time = 0u32;
        loop {
            let next_event = self.queue.peek().map(|s| s.at);
            let next_timer = self.next_timer();
            let next = match (next_event, next_timer) {
                (None, None) => break,
                (Some(e), None) => e,
                (None, Some(t)) => t,
                (Some(e), Some(t)) => e.min(t),
            };
            if next > limit {
                break;
            }
            if let Some(done) = self.done_at
                && next > done + LINGER
            {
                break;
            }
            if next > self.now {
                same_time = 0;
                self.now = next;
            } else {
                same_time += 1;
                if same_time > 200_000 {
                    self.fail("no progress: the same instant forever".into());
                    break;
                }
            }
            if next_timer.is_some_and(|t| next_event.is_none_or(|e| t <= e)) {
                self.fire_timers();
            } else {
                let ev = self.queue.pop().expect("peeked").ev;
                self.handle(ev);
            }
            self.pump();
            steps += 1;
            self.check_capacity(steps.is_multiple_of(64));
            if self.done_at.is_none() && self.settled_count == self.sc.jobs() {
                self.done_at = Some(self.now);
            }
        }
        self.pool.compare_stats();
        self.finish()
    }

    fn churn_gap(&mut self) -> Duration {
        let mean = self.sc.churn.mean_gap;
        self.ms(mean / 4, mean * 7 / 4)
    }

    fn next_timer(&mut self) -> Option<Duration> {
        let pool = self.pool.next_deadline();
        let streams = self
            .streams
            .values()
            .chain(self.stopping.values())
            .filter_map(|s| s.core.next_deadline());
        let consumers = self
            .procs
            .iter()
            .filter(|p| p.alive)
            .filter_map(|p| p.consumer.next_deadline());
        streams
            .chain(consumers)
            .chain(pool)
            .min()
            .map(|t| t.saturating_duration_since(self.base))
    }

    fn fire_timers(&mut self) {
        let now = self.at();
        if self.pool.next_deadline().is_some_and(|d| d <= now) {
            self.pool.handle_timeout(now);
        }
        for stream in self.streams.values_mut().chain(self.stopping.values_mut()) {
            if stream.core.next_deadline().is_some_and(|d| d <= now) {
                stream.core.handle_timeout(now);
            }
        }
        for proc in 0..self.procs.len() {
            let p = &mut self.procs[proc];
            if !p.alive || p.consumer.next_deadline().is_none_or(|d| d > now) {
                continue;
            }
            if let Some(completion) = p.consumer.handle_timeout(now) {
                p.running = None;
                self.tally.handler_timeouts += 1;
                let name = self.name(proc);
                self.trace(Trace::Abandoned { name });
                self.complete(proc, completion);
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Push(job) => {
                self.trace(Trace::Push(job));
                self.pool.push(job);
            }
            Ev::Deliver {
                proc,
                life,
                stream,
                index,
                header,
                job,
            } => self.deliver(proc, life, stream, index, header, job),
            Ev::Ack {
                proc,
                life,
                stream,
                index,
                ack,
            } => self.ack_arrived(proc, life, stream, index, ack),
            Ev::HandlerDone { proc, life, run } => self.handler_done(proc, life, run),
            Ev::Settle {
                worker,
                key,
                result,
            } => self.settle(worker, key, result),
            Ev::StreamStop(key) => {
                if let Some(mut stream) = self.stopping.remove(&key) {
                    stream.core.stop();
                    self.trace(Trace::Stopped { stream: key });
                    self.drain_settled(&mut stream);
                }
            }
            Ev::Churn => self.churn(),
            Ev::Detect { proc, reg } => {
                if self.registry.get(&proc) == Some(&reg) {
                    self.tally.detections += 1;
                    let name = self.name(proc);
                    self.trace(Trace::Detect { name, reg });
                    self.deregister(proc, "crash detected");
                }
            }
            Ev::Restart(proc) => self.restart(proc),
            Ev::Heal => {
                self.healed = true;
                self.trace(Trace::Heal);
                for proc in 0..self.procs.len() {
                    if !self.procs[proc].alive {
                        self.restart(proc);
                    } else if !self.by_name.contains_key(&proc) {
                        self.register(proc);
                    }
                }
            }
        }
    }

    // ---- the registry and the worker processes ----

    fn register(&mut self, proc: usize) {
        let reg = self.next_reg;
        self.next_reg += 1;
        self.registry.insert(proc, reg);
        self.join(proc, reg);
    }

    fn deregister(&mut self, proc: usize, why: &'static str) {
        self.registry.remove(&proc);
        if let Some(key) = self.by_name.get(&proc).copied() {
            if why == "deregistered" {
                self.tally.leaves += 1;
            }
            self.leave(key, why);
        }
    }

    fn crash(&mut self, proc: usize) {
        let config = self.consumer_config.clone();
        let p = &mut self.procs[proc];
        p.alive = false;
        p.life += 1;
        p.consumer = ConsumerCore::new(&config);
        p.running = None;
        self.tally.crashes += 1;
        let name = self.name(proc);
        self.trace(Trace::Crash { name });
        if let Some(&reg) = self.registry.get(&proc) {
            let delay = self.ms(self.sc.detect_min, self.sc.detect_max);
            self.schedule(delay, Ev::Detect { proc, reg });
        }
        if self.rng.random_bool(0.7) {
            let delay = self.ms(Duration::from_millis(100), self.sc.restart_max);
            self.schedule(delay, Ev::Restart(proc));
        }
    }

    fn restart(&mut self, proc: usize) {
        if self.procs[proc].alive {
            return;
        }
        self.procs[proc].alive = true;
        let name = self.name(proc);
        self.trace(Trace::Restart { name });
        // A new registration under the same name (the pool leaves the old one first if it
        // did not notice the crash yet).
        self.register(proc);
    }

    fn churn(&mut self) {
        if self.healed {
            return;
        }
        let churn = self.sc.churn;
        let pick = self
            .rng
            .random_range(0..churn.join + churn.leave + churn.crash);
        let n = self.procs.len();
        let start = self.rng.random_range(0..n);
        let candidates = (0..n).map(|i| (start + i) % n);
        if pick < churn.join {
            // A worker not in the pool registers (a crashed one restarts).
            let found = candidates
                .clone()
                .find(|&p| !self.by_name.contains_key(&p) || !self.procs[p].alive);
            if let Some(proc) = found {
                if self.procs[proc].alive {
                    self.register(proc);
                } else {
                    self.restart(proc);
                }
            }
        } else {
            let found = candidates
                .clone()
                .find(|&p| self.procs[p].alive && self.by_name.contains_key(&p));
            if let Some(proc) = found {
                if pick < churn.join + churn.leave {
                    self.deregister(proc, "deregistered");
                } else {
                    self.crash(proc);
                }
            }
        }
        let gap = self.churn_gap();
        self.schedule(gap, Ev::Churn);
    }

    // ---- the pool's wiring, as in the shell ----

    fn join(&mut self, proc: usize, reg: u64) {
        if let Some(previous) = self.by_name.get(&proc).copied() {
            // The worker registered again before its old registration left (a restart
            // before its crash was detected): the shell removes the old one first.
            self.tally.replaced += 1;
            self.leave(previous, "replaced");
        }
        let spec = &self.sc.workers[proc];
        let config = ProducerConfig {
            producer_id: Some(format!("pool/{}", spec.name)),
            window_size: spec.capacity,
            resend_timeout: self.sc.resend_timeout,
            backoff: self.sc.backoff,
            max_attempts: spec.max_attempts.map_or(Limit::Unbounded, Limit::At),
            ..ProducerConfig::default()
        };
        config.validate().expect("valid worker stream settings");
        let incarnation = Incarnation::from_u128(self.rng.random());
        let core = ProducerCore::seeded(&config, incarnation, || self.rng.random());
        let key = WorkerKey(self.next_worker);
        self.next_worker += 1;
        let (name, capacity) = (spec.name.clone(), spec.capacity);
        self.pool.add_worker(key, &name, capacity);
        self.by_name.insert(proc, key);
        self.streams.insert(
            key,
            Stream {
                proc,
                core,
                capacity,
            },
        );
        self.links.insert(key, LinkState::default());
        self.tally.joins += 1;
        self.trace(Trace::Join { name, key, reg });
    }

    fn leave(&mut self, key: WorkerKey, why: &'static str) {
        let Some(stream) = self.streams.remove(&key) else {
            return;
        };
        if self.by_name.get(&stream.proc) == Some(&key) {
            self.by_name.remove(&stream.proc);
        }
        let rerouted = match self.sc.wiring {
            Wiring::Shell => self.pool.remove_worker(key),
            Wiring::DropLeaving => {
                self.ghosts.insert(key);
                Vec::new()
            }
        };
        self.trace(Trace::Leave { key, why, rerouted });
        // `stream.stop()` is a message to the stream's actor: ACKs already in its mailbox (or
        // arriving before it gets to the stop) may still confirm jobs first.
        self.stopping.insert(key, stream);
        let delay = self.ms(Duration::ZERO, Duration::from_millis(30));
        self.schedule(delay, Ev::StreamStop(key));
    }

    fn settle(&mut self, worker: WorkerKey, key: JobKey, result: Result<(), DeliveryError>) {
        if let Some(n) = self.pending_settlements.get_mut(&worker) {
            *n -= 1;
        }
        let stopped = matches!(
            result,
            Err(DeliveryError::ProducerStopped | DeliveryError::StoppedUnconfirmed)
        );
        if stopped && self.sc.wiring == Wiring::DropLeaving {
            return; // the planted fault
        }
        let present = self.streams.contains_key(&worker);
        let now = self.at();
        let settled = self.pool.settled(worker, key, result.is_ok(), now);
        self.trace(Trace::Settle {
            worker,
            job: key,
            result: result.clone(),
            settled: match settled {
                Settled::Confirmed(_) => "confirmed",
                Settled::Rerouted => "rerouted",
                Settled::GivenUp { .. } => "given up",
                Settled::Ignored => "ignored",
            },
        });
        if stopped {
            self.tally.stopped_settlements += 1;
            if present || settled != Settled::Ignored {
                self.fail(format!(
                    "{worker:?} (in the pool: {present}) settled job {key} as stopped: \
                     {settled:?}, expected Ignored"
                ));
            }
        }
        if present && matches!(result, Err(DeliveryError::GaveUp { .. })) {
            self.tally.give_ups += 1;
        }
        match settled {
            Settled::Confirmed(job) => self.confirmed(worker, key, job, present),
            Settled::GivenUp { job, attempts } => self.given_up(key, job, attempts),
            Settled::Rerouted | Settled::Ignored => {}
        }
    }

    fn given_up(&mut self, key: JobKey, job: u64, attempts: u32) {
        if job != key {
            self.fail(format!("giving key {key} up gave job {job} up"));
        }
        if Some(attempts) != self.sc.give_up_after {
            let after = self.sc.give_up_after;
            self.fail(format!(
                "job {job} given up after {attempts} failures, not {after:?}"
            ));
        }
        let Some(count) = self.given_up.get_mut(job as usize).filter(|_| job > 0) else {
            self.fail(format!("job {job} given up, but no such job was pushed"));
            return;
        };
        *count += 1;
        if *count > 1 || self.confirmed[job as usize] > 0 {
            self.fail(format!("job {job} given up after it was settled"));
            return;
        }
        self.settled_count += 1;
        self.tally.jobs_given_up += 1;
    }

    fn confirmed(&mut self, worker: WorkerKey, key: JobKey, job: u64, present: bool) {
        if job != key {
            self.fail(format!("settling key {key} confirmed job {job}"));
        }
        let Some(count) = self.confirmed.get_mut(job as usize).filter(|_| job > 0) else {
            self.fail(format!("job {job} confirmed, but no such job was pushed"));
            return;
        };
        *count += 1;
        let count = *count;
        if count > 1 || self.given_up[job as usize] > 0 {
            self.fail(format!(
                "job {job} confirmed to the caller after it was settled"
            ));
            return;
        }
        self.settled_count += 1;
        if !self.store.contains(&job) {
            self.fail(format!(
                "job {job} confirmed by {worker:?} with no effect recorded"
            ));
        }
        if !present {
            self.tally.late_confirmations += 1;
        }
    }

    /// What the shell does after each mailbox drain: hands waiting jobs to workers with
    /// demand; then the streams put their deliveries on the wire and their settlements go
    /// to the pool's mailbox.
    fn pump(&mut self) {
        let now = self.at();
        while let Some((worker, key)) = self.pool.poll_assign() {
            self.trace(Trace::Assign { job: key, worker });
            match self.streams.get_mut(&worker) {
                Some(stream) => {
                    if stream.core.handle_send(key, (worker, key)).is_err() {
                        self.fail(format!("{worker:?}'s stream refused job {key}"));
                    }
                }
                None if self.ghosts.contains(&worker) => {} // the planted wiring: lost
                None => self.fail(format!("job {key} assigned to {worker:?}, not a worker")),
            }
        }
        let keys: Vec<WorkerKey> = self
            .streams
            .keys()
            .chain(self.stopping.keys())
            .copied()
            .collect();
        for key in keys {
            let mut stream = match self.streams.remove(&key) {
                Some(s) => s,
                None => self.stopping.remove(&key).expect("listed"),
            };
            let present = self.by_name.get(&stream.proc) == Some(&key);
            while let Some(t) = stream.core.poll_transmit(now) {
                self.send_delivery(key, stream.proc, t);
            }
            self.drain_settled(&mut stream);
            if present {
                self.streams.insert(key, stream);
            } else {
                self.stopping.insert(key, stream);
            }
        }
    }

    fn drain_settled(&mut self, stream: &mut Stream) {
        while let Some(((worker, key), result)) = stream.core.poll_settled() {
            *self.pending_settlements.entry(worker).or_default() += 1;
            let delay = self.ms(Duration::ZERO, Duration::from_millis(2));
            self.schedule(
                delay,
                Ev::Settle {
                    worker,
                    key,
                    result,
                },
            );
        }
    }

    fn check_capacity(&mut self, with_stats: bool) {
        let mut broken = Vec::new();
        for (key, stream) in self.streams.iter().chain(self.stopping.iter()) {
            let stats = stream.core.stats();
            let held = stats.in_flight + stats.queued;
            if held > stream.capacity {
                broken.push(format!(
                    "{key:?}'s stream holds {held} jobs, its capacity is {}",
                    stream.capacity
                ));
            }
            let pool = self.pool.holding(*key);
            if self.streams.contains_key(key)
                && self.pending_settlements.get(key).copied().unwrap_or(0) == 0
                && pool != held
            {
                broken.push(format!(
                    "the pool counts {pool} jobs at {key:?}, its stream holds {held}"
                ));
            }
        }
        for rule in broken {
            self.fail(rule);
        }
        if with_stats {
            self.pool.compare_stats();
        }
    }

    // ---- the links ----

    fn copies(&mut self, key: WorkerKey, direction: usize) -> (u64, Vec<Duration>) {
        let faults = self.link_faults();
        let link = self.links.entry(key).or_default();
        let index = link.sent[direction];
        link.sent[direction] += 1;
        if self.rng.random_bool(faults.loss) {
            self.tally.losses += 1;
            return (index, Vec::new());
        }
        let n = if self.rng.random_bool(faults.duplicate) {
            self.tally.duplicates += 1;
            2
        } else {
            1
        };
        let delays = (0..n)
            .map(|_| self.ms(faults.min_latency, faults.max_latency))
            .collect();
        (index, delays)
    }

    fn arrived(&mut self, key: WorkerKey, direction: usize, index: u64) {
        let link = self.links.entry(key).or_default();
        match link.latest[direction] {
            Some(latest) if index < latest => self.tally.reorders += 1,
            _ => link.latest[direction] = Some(index),
        }
    }

    fn send_delivery(&mut self, stream: WorkerKey, proc: usize, t: Transmission<u64>) {
        if t.attempt > 1 {
            self.tally.retransmissions += 1;
        }
        let (seq, job, attempt) = (t.header.seq, t.body, t.attempt);
        let p = &self.procs[proc];
        let (alive, life) = (p.alive, p.life);
        if !alive {
            self.tally.crash_drops += 1;
            self.trace(Trace::Send {
                stream,
                seq,
                job,
                attempt,
                copies: 0,
            });
            return;
        }
        let (index, delays) = self.copies(stream, 0);
        self.trace(Trace::Send {
            stream,
            seq,
            job,
            attempt,
            copies: delays.len(),
        });
        for delay in delays {
            let header = t.header.clone();
            self.schedule(
                delay,
                Ev::Deliver {
                    proc,
                    life,
                    stream,
                    index,
                    header,
                    job,
                },
            );
        }
    }

    fn send_ack(&mut self, proc: usize, stream: WorkerKey, ack: Ack) {
        let life = self.procs[proc].life;
        let (index, delays) = self.copies(stream, 1);
        let name = self.name(proc);
        self.trace(Trace::AckSent {
            name,
            stream,
            seq: ack.seq,
            copies: delays.len(),
        });
        for delay in delays {
            let ack = ack.clone();
            self.schedule(
                delay,
                Ev::Ack {
                    proc,
                    life,
                    stream,
                    index,
                    ack,
                },
            );
        }
    }

    fn deliver(
        &mut self,
        proc: usize,
        life: u64,
        stream: WorkerKey,
        index: u64,
        header: Header,
        job: u64,
    ) {
        let p = &self.procs[proc];
        if !p.alive || p.life != life {
            self.tally.crash_drops += 1;
            return;
        }
        self.arrived(stream, 0, index);
        let seq = header.seq;
        let inbound = Inbound {
            header,
            body: job,
            reply_to: Some(stream),
        };
        let now = self.at();
        let step = self.procs[proc].consumer.handle_delivery(inbound, now);
        let label = match &step {
            Step::Run(_) => "run",
            Step::Ack(..) => "re-ack",
            Step::Hold => "hold",
            Step::DeadLetter(..) => "dead letter",
        };
        let name = self.name(proc);
        self.trace(Trace::Deliver {
            name,
            stream,
            seq,
            job,
            step: label,
        });
        match step {
            Step::Run(job) => self.start_run(proc, job),
            Step::Ack(to, ack) => self.send_ack(proc, to, ack),
            Step::Hold => {}
            Step::DeadLetter(reason, header) => {
                self.fail(format!(
                    "a delivery became a dead letter: {reason:?} {header:?}"
                ));
            }
        }
    }

    fn ack_arrived(&mut self, proc: usize, life: u64, stream: WorkerKey, index: u64, ack: Ack) {
        let p = &self.procs[proc];
        if p.life != life {
            // Its sender crashed while it was in flight.
            self.tally.crash_drops += 1;
            return;
        }
        self.arrived(stream, 1, index);
        let seq = ack.seq;
        let acted = match self
            .streams
            .get_mut(&stream)
            .or_else(|| self.stopping.get_mut(&stream))
        {
            Some(s) => s.core.handle_ack(&ack),
            None => false, // the stream stopped: nobody reads its ACKs
        };
        self.trace(Trace::AckArrived { stream, seq, acted });
    }

    // ---- the handlers and the effect store ----

    fn start_run(&mut self, proc: usize, job: u64) {
        let spec = &self.sc.workers[proc];
        let (run_min, run_max) = (spec.run_min, spec.run_max);
        let h = self.sc.handler;
        let (plan, duration) = if self.healed {
            (Plan::Ok, self.ms(run_min, run_max))
        } else {
            let stall = self.rng.random_bool(h.stall);
            let duration = if stall {
                self.tally.stalls += 1;
                self.ms(h.stall_min, h.stall_max)
            } else {
                self.ms(run_min, run_max)
            };
            let roll: f64 = self.rng.random();
            let plan = if roll < h.fail_before {
                Plan::FailBefore
            } else if roll < h.fail_before + h.fail_after {
                Plan::FailAfter
            } else {
                Plan::Ok
            };
            (plan, duration)
        };
        let id = self.next_run;
        self.next_run += 1;
        let p = &mut self.procs[proc];
        p.running = Some(RunState { id, job, plan });
        let life = p.life;
        let name = self.name(proc);
        self.trace(Trace::Run {
            name,
            job,
            plan,
            ms: duration.as_millis() as u64,
        });
        self.schedule(
            duration,
            Ev::HandlerDone {
                proc,
                life,
                run: id,
            },
        );
    }

    fn handler_done(&mut self, proc: usize, life: u64, run: u64) {
        let p = &mut self.procs[proc];
        if !p.alive || p.life != life || p.running.as_ref().is_none_or(|r| r.id != run) {
            return; // the crash or the handler timeout ended it (its future was dropped)
        }
        let RunState { job, plan, .. } = p.running.take().expect("checked");
        self.tally.handler_runs += 1;
        self.runs[job as usize] += 1;
        let effect = match plan {
            Plan::Ok | Plan::FailAfter => self.commit(job),
            Plan::FailBefore => false,
        };
        let name = self.name(proc);
        self.trace(Trace::RunEnd {
            name,
            job,
            plan,
            effect,
        });
        let outcome = match plan {
            Plan::Ok => {
                self.ok_runs[job as usize] += 1;
                HandlerOutcome::Succeeded
            }
            Plan::FailBefore | Plan::FailAfter => {
                self.tally.handler_failures += 1;
                HandlerOutcome::Failed("planned".into())
            }
        };
        let now = self.at();
        let completion = self.procs[proc].consumer.handle_outcome(&outcome, now);
        self.complete(proc, completion);
    }

    /// Records the job's effect in the shared store, atomically with its id; returns whether
    /// an effect was applied.
    fn commit(&mut self, job: u64) -> bool {
        let fresh = self.store.insert(job);
        if !fresh && self.sc.store == Store::Dedup {
            self.tally.dedup_hits += 1;
            return false;
        }
        self.effects[job as usize] += 1;
        if self.effects[job as usize] > 1 {
            let n = self.effects[job as usize];
            self.fail(format!("job {job}'s effect applied {n} times"));
        }
        true
    }

    fn complete(&mut self, proc: usize, completion: Completion<u64, WorkerKey>) {
        if let Some((to, ack)) = completion.ack {
            self.send_ack(proc, to, ack);
        }
        if let Some(job) = completion.next {
            self.start_run(proc, job);
        }
    }

    fn finish(mut self) -> Outcome {
        self.tally.repeated_runs = self
            .runs
            .iter()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum();
        self.tally.reroutes = self.pool.rerouted;
        self.tally.front_checks = self.pool.front_checks;
        self.tally.confirmed_elsewhere = self.pool.confirmed_elsewhere;
        self.tally.rest_checks = self.pool.rest_checks;
        self.tally.rests = self.pool.pool.stats().rests;
        if let Some(done) = self.done_at {
            self.tally.heal_to_done_ms = done.saturating_sub(self.sc.heal_at).as_millis() as u64;
        }
        let mut broken = std::mem::take(&mut self.pool.broken);
        broken.append(&mut self.broken);
        let stuck = (1..=self.sc.jobs() as u64)
            .filter(|&j| self.confirmed[j as usize] + self.given_up[j as usize] == 0)
            .map(|j| (j, self.pool.whereabouts(j)))
            .collect();
        Outcome {
            confirmed: self.confirmed,
            given_up: self.given_up,
            effects: self.effects,
            ok_runs: self.ok_runs,
            runs: self.runs,
            done_at: self.done_at,
            ended_at: self.now,
            broken,
            tally: self.tally,
            trace: self.trace,
            stuck,
            digest: self.digest,
        }
    }
}
