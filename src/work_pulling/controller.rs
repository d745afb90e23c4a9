//! The pool actor: takes the jobs of its producer, routes them by the pure [`WorkPool`] over
//! one reliable stream per worker, ACKs a job to its producer once a worker confirmed it, and
//! settles it as given up with its producer (and hands it to the dead-letter sink) when the
//! pool gave it up. The worker streams are [`ProducerCore`]s the pool drives itself (no actor
//! per worker: a job crosses no mailbox between the pool and its worker's consumer), as the
//! sharded producer's router drives its entity streams.
//!
//! The worker streams of one producer life share a token derived from the producer's
//! ([`sub_stream_token`]); a job's stable id ([`Job::info`]) names the producer's id and that
//! token's public id, so that a worker can check that the id is the sending stream's own
//! ([`check_origin`](crate::protocol::origin::check_origin)). Each stream has an id of its
//! own, `<producer id>/<stream number>` (a random number, so that no worker can name
//! another's stream), opened when its worker gets its first job of a producer life.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use actix::prelude::*;
use futures_util::FutureExt;
use hashbrown::HashMap;

use crate::config::ProducerConfig;
use crate::delivery::dead_letter_handle::GiveUpKeeper;
use crate::delivery::message::{
    Acks, ConsumerRef, Deliveries, Delivery, GiveUp, ReplyTo, SingleAck,
};
use crate::delivery::producer::ProducerHandle;
use crate::error::DeliveryError;
use crate::protocol::envelope::{Ack, DeliveryInfo, Incarnation, IncarnationId};
use crate::protocol::intake::{Intake, Taken};
use crate::protocol::origin::{sub_stream_token, SubStreamIds};
use crate::protocol::producer::ProducerCore;
use crate::runtime::after_drain::after_each_drain;
use crate::runtime::alarm::{now, Alarm};
use crate::runtime::random::random_u64;
use crate::work_pulling::pool::{JobKey, PoolStats, Settled, WorkPool, WorkerKey};
use crate::work_pulling::registry::WorkersChanged;
use crate::work_pulling::{GivenUpJob, Job, WorkPullingOptions, WorkerRegistry};

/// The purpose the worker streams' token is derived for ([`sub_stream_token`]).
pub(crate) const JOBS_TOKEN_PURPOSE: &str = "work-pulling jobs";

/// One worker: its name, where it takes jobs, and the number of the reliable stream to it
/// (opened with its first job of the producer's life).
struct Worker<T: Send + 'static> {
    name: Arc<str>,
    target: ConsumerRef<Job<T>>,
    stream: Option<u64>,
}

/// A worker's reliable stream, driven by the pool: a producer core whose messages settle as
/// the pool's job keys. Its id is one of the pool's [`SubStreamIds`].
struct Stream<T: Clone + Send + 'static> {
    worker: WorkerKey,
    core: ProducerCore<Job<T>, JobKey>,
    /// Touched since the last flush (it has something to transmit or settle).
    dirty: bool,
    /// Its worker left: until then it only takes the ACKs on their way (each confirms its
    /// job, which the pool handed to another worker meanwhile), and sends nothing.
    leaving_until: Option<Instant>,
    /// The stream's meters, under the pool's label (the streams of a pool add up).
    #[cfg(feature = "metrics")]
    meter: crate::delivery::metrics::ProducerMeters,
}

#[cfg(feature = "metrics")]
impl<T: Clone + Send + 'static> Drop for Stream<T> {
    fn drop(&mut self) {
        // What it did since the last publish counts (its gauges are taken back after this).
        self.meter.publish(&self.core.stats());
    }
}

/// The outcome of a job at a worker, from the worker stream's settlement.
struct JobSettled {
    worker: WorkerKey,
    key: JobKey,
    result: Result<(), DeliveryError>,
}

/// Asks the pool for its counters.
pub(crate) struct GetPoolStats;

impl Message for GetPoolStats {
    type Result = PoolStats;
}

/// The pool between a work-pulling producer and its workers. It is its producer's consumer
/// (in process): it takes each job, hands it to a worker with demand over that worker's own
/// reliable stream, and ACKs it to the producer when the worker's stream confirmed it, so the
/// producer's confirmation means "a worker handled it". Started by
/// [`ReliableDelivery::work_pulling_producer`](crate::ReliableDelivery::work_pulling_producer).
pub(crate) struct WorkPullingController<T: Clone + Send + 'static> {
    /// The jobs (their ACKs are made when they settle: every job held is of the producer's
    /// current life, whose token `tokens` holds).
    pool: WorkPool<Job<T>>,
    /// The producer's jobs held by the pool, by seq (a retransmission of a held job changes
    /// nothing, one of a job confirmed already is ACKed again).
    intake: Intake,
    /// The worker streams' settlements of one flush (a buffer, reused).
    taken: Vec<JobSettled>,
    workers: HashMap<WorkerKey, Worker<T>>,
    /// The open worker streams, by number.
    streams: HashMap<u64, Stream<T>>,
    /// The streams touched since the last flush, by number.
    dirty: Vec<u64>,
    /// The worker streams' ids.
    stream_ids: SubStreamIds,
    /// Where the workers send the streams' ACKs: this pool.
    own_reply_to: Option<ReplyTo>,
    /// ACKs ignored: of no open stream, or of no job in flight on it.
    ignored_acks: u64,
    by_name: HashMap<Arc<str>, WorkerKey>,
    next_worker: u64,
    /// The producer's current token, the worker streams' token derived from it, and that
    /// token's public id (which every job's id names: hashed once per life, not per job).
    tokens: Option<(Incarnation, Incarnation, IncarnationId)>,
    /// The label of the worker streams' metrics: the pool's.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    label: String,
    worker_config: ProducerConfig,
    registry: WorkerRegistry<T>,
    /// ACKs to send to `reply_to` after this mailbox drain.
    acks: Vec<Ack>,
    /// Where the producer wants its ACKs (its deliveries say).
    reply_to: Option<ReplyTo>,
    /// The producer, told which jobs were given up.
    producer: Recipient<GiveUp>,
    /// The given-up jobs of the producer's current life at or above its last `window_start`,
    /// by seq: a copy of one (a durable producer that restarted before it recorded the give
    /// up sends it again) is answered given up again.
    given_up: BTreeMap<u64, DeliveryError>,
    dead_letters: Option<Recipient<GivenUpJob<T>>>,
    kept: Option<GiveUpKeeper<T>>,
    /// Wakes the pool when a worker's rest ends or a stream's retransmission is due.
    alarm: Alarm,
    /// Paces the streams' meters' publishing.
    #[cfg(feature = "metrics")]
    publish_pace: crate::telemetry::metrics::PublishPace,
    /// Resolves when the producer stopped: the pool stops then.
    producer_stopped: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>,
}

impl<T: Clone + Send + 'static> WorkPullingController<T> {
    /// The pool of `producer`, with the workers, worker settings and give-up rules of
    /// `options`.
    pub(crate) fn new(
        producer: &ProducerHandle<T>,
        options: WorkPullingOptions<T>,
        label: String,
    ) -> Self {
        let mut pool = WorkPool::new(crate::runtime::random::random_u64());
        if let Some(failures) = options.give_up_after {
            pool = pool.give_up_after(failures);
        }
        Self {
            pool,
            intake: Intake::default(),
            taken: Vec::new(),
            workers: HashMap::new(),
            streams: HashMap::new(),
            dirty: Vec::new(),
            stream_ids: SubStreamIds::new(producer.producer_id()),
            own_reply_to: None,
            ignored_acks: 0,
            by_name: HashMap::new(),
            next_worker: 0,
            tokens: None,
            label,
            worker_config: options.worker,
            registry: options.registry,
            acks: Vec::new(),
            reply_to: None,
            producer: producer.addr().clone().recipient(),
            given_up: BTreeMap::new(),
            dead_letters: options.dead_letters,
            kept: options.kept,
            alarm: Alarm::default(),
            #[cfg(feature = "metrics")]
            publish_pace: Default::default(),
            // How the producer ended is its handles' to tell: the pool only follows it.
            producer_stopped: Some(Box::pin(FutureExt::map(producer.stopped(), drop))),
        }
    }

    /// The pool's consumer ref, for its producer.
    pub(crate) fn consumer_ref(addr: &Addr<Self>) -> ConsumerRef<T> {
        ConsumerRef::batching(addr.clone().recipient(), addr.clone().recipient())
    }

    /// Takes a job from the producer (a copy of a held one changes nothing).
    fn take(&mut self, delivery: Delivery<T>) {
        let Delivery {
            producer_id,
            incarnation,
            seq,
            window_start,
            trace_context,
            body,
            reply_to,
        } = delivery;
        self.reply_to = reply_to.or(self.reply_to.take());
        let taken = self.intake.take(incarnation, seq, window_start);
        // Below its window start the producer never sends a seq again.
        while let Some(entry) = self.given_up.first_entry() {
            if *entry.key() >= window_start {
                break;
            }
            entry.remove();
        }
        let jobs_token = match taken {
            Taken::New { restarted, .. } => {
                if restarted {
                    // A new life of the producer: it settled the previous life's jobs itself.
                    self.pool.drain_jobs().for_each(drop);
                    self.given_up.clear();
                }
                self.jobs_token(incarnation)
            }
            Taken::Copy => return,
            Taken::AckAgain => {
                let ack = Ack {
                    producer_id,
                    incarnation,
                    seq,
                };
                match self.given_up.get(&seq) {
                    Some(error) => self.producer.do_send(GiveUp {
                        ack,
                        error: error.clone(),
                    }),
                    None => self.acks.push(ack),
                }
                return;
            }
        };
        let info = DeliveryInfo {
            producer_id,
            incarnation: jobs_token,
            seq,
            window_start,
            trace_context,
            first_seq: None,
        };
        self.pool.push(Job { info, body });
        self.intake.hold(seq);
    }

    /// The producer's current token: the life of every job the pool holds.
    fn life(&self) -> Incarnation {
        self.tokens.expect("a job was taken: the token is known").0
    }

    /// The public id of the worker streams' token for the producer's `token`: the same for
    /// every job of its life. A new life's token closes the streams of the previous one (their
    /// jobs are the previous life's, which the producer settled itself).
    fn jobs_token(&mut self, token: Incarnation) -> IncarnationId {
        match self.tokens {
            Some((parent, _, id)) if parent == token => id,
            _ => {
                for worker in self.workers.values_mut() {
                    worker.stream = None;
                }
                self.streams.clear();
                self.dirty.clear();
                self.pool.release_streams(); // what they held never settles now
                let derived = sub_stream_token(token, JOBS_TOKEN_PURPOSE, b"");
                let id = derived.id();
                self.tokens = Some((token, derived, id));
                id
            }
        }
    }

    fn join(&mut self, name: Arc<str>, target: ConsumerRef<Job<T>>) {
        if let Some(previous) = self.by_name.get(&name).copied() {
            self.leave(previous);
        }
        let key = self.next_key();
        self.pool
            .add_worker(key, name.clone(), self.worker_config.window_size);
        self.by_name.insert(name.clone(), key);
        let worker = Worker {
            name,
            target,
            stream: None,
        };
        self.workers.insert(key, worker);
    }

    fn next_key(&mut self) -> WorkerKey {
        self.next_worker += 1;
        WorkerKey(self.next_worker)
    }

    /// Opens a reliable stream for worker `key`, under the worker streams' `token`; its
    /// number.
    fn open_stream(&mut self, key: WorkerKey, token: Incarnation) -> u64 {
        // Random: a worker cannot name another worker's stream (their ACKs would confirm its
        // jobs), and the ids of two lives never meet.
        let number = std::iter::repeat_with(random_u64)
            .find(|n| !self.streams.contains_key(n))
            .expect("an endless supply");
        let config = ProducerConfig {
            producer_id: Some(self.stream_ids.id(number)),
            ..self.worker_config.clone()
        };
        let stream = Stream {
            worker: key,
            core: ProducerCore::seeded(&config, token, random_u64),
            dirty: false,
            leaving_until: None,
            #[cfg(feature = "metrics")]
            meter: crate::delivery::metrics::ProducerMeters::new(&self.label, false),
        };
        self.streams.insert(number, stream);
        number
    }

    /// Removes a worker: its unconfirmed jobs wait for the others, and its stream takes the
    /// ACKs on their way for one `resend_timeout`, then ends.
    fn leave(&mut self, key: WorkerKey) {
        let Some(worker) = self.workers.remove(&key) else {
            return;
        };
        if self.by_name.get(&worker.name) == Some(&key) {
            self.by_name.remove(&worker.name);
        }
        self.pool.remove_worker(key);
        if let Some(stream) = worker.stream.and_then(|n| self.streams.get_mut(&n)) {
            stream.leaving_until = Some(now() + self.worker_config.resend_timeout);
        }
    }

    /// An ACK from a worker for one of the streams (one of a stream that ended is ignored).
    /// The stream it reaches is touched either way (its stats count what it ignores).
    fn handle_ack(&mut self, ack: &Ack) {
        let number = self.stream_ids.number(&ack.producer_id);
        let Some((number, stream)) = number.and_then(|n| Some((n, self.streams.get_mut(&n)?)))
        else {
            self.ignored_acks += 1;
            return;
        };
        self.ignored_acks += u64::from(!stream.core.handle_ack(ack));
        if !std::mem::replace(&mut stream.dirty, true) {
            self.dirty.push(number);
        }
    }

    /// Takes a worker stream's settlement of a job at `now`. A job its stream gave up failed
    /// at the worker (the pool re-routes it or gives it up, and rests the worker).
    fn settle(&mut self, settled: JobSettled, now: Instant) {
        let JobSettled {
            worker,
            key,
            result,
        } = settled;
        // A stream's core settles a job confirmed or given up after `max_attempts`: nothing
        // stops a stream (it ends with its worker or the pool), and the pool gives a worker at
        // most its window, so its core never refuses a job.
        let outcome = result.map_err(|error| match error {
            DeliveryError::GaveUp { attempts } => attempts,
            error => unreachable!("a worker stream settles no `{error}`"),
        });
        match (
            self.pool.settled(worker, key, outcome.is_ok(), now),
            outcome,
        ) {
            (Settled::Confirmed(job), _) => {
                let ack = Ack {
                    incarnation: self.life(),
                    seq: job.info.seq,
                    producer_id: job.info.producer_id,
                };
                self.intake.confirm(ack.incarnation, ack.seq);
                self.acks.push(ack);
            }
            (Settled::GivenUp { job, attempts }, Err(transmissions)) => {
                // A job is given up when it failed at the worker that held it: present.
                let name = &self.workers.get(&worker).expect("the job's worker").name;
                let last_error =
                    format!("worker `{name}` did not confirm it in {transmissions} transmissions");
                self.give_up(job, attempts, last_error);
            }
            _ => {}
        }
    }

    /// Settles a job the pool gave up with its producer, and hands it to the dead-letter
    /// sink.
    fn give_up(&mut self, job: Job<T>, attempts: u32, last_error: String) {
        log::warn!(
            "work pulling: job {} given up after {attempts} failures; the last: {last_error}",
            job.info.seq
        );
        let ack = Ack {
            producer_id: job.info.producer_id.clone(),
            incarnation: self.life(),
            seq: job.info.seq,
        };
        let error = DeliveryError::HandlingFailed {
            attempts,
            last_error: last_error.clone(),
        };
        if self.intake.confirm(ack.incarnation, ack.seq) {
            self.given_up.insert(ack.seq, error.clone());
        }
        self.producer.do_send(GiveUp { ack, error });
        let given_up = GivenUpJob {
            job,
            attempts,
            last_error,
        };
        if let Some(kept) = &self.kept {
            let job = &given_up.job;
            let error = given_up.last_error.clone();
            kept.record(job.info.clone(), &job.body, given_up.attempts, error);
        }
        if let Some(sink) = &self.dead_letters {
            sink.do_send(given_up);
        }
    }

    /// Settles what the streams settled, hands waiting jobs to workers with demand,
    /// transmits, sends the ACKs of confirmed jobs and arms the timer: after each mailbox
    /// drain and timer.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        let at = now();
        self.settle_dirty(at);
        self.assign();
        // The streams touched (ACKed, timed out, given jobs) changed their stats; nothing
        // else the pool exports changes.
        #[cfg(feature = "metrics")]
        if !self.dirty.is_empty() {
            self.publish_pace.changed();
        }
        self.transmit(at);
        self.send_acks();
        #[cfg(feature = "metrics")]
        if self.publish_pace.due(at) {
            self.publish();
        }
        let next = self
            .streams
            .values()
            .filter_map(|stream| stream.leaving_until.or(stream.core.next_deadline()))
            .chain(self.pool.next_deadline());
        // A publish the pace owes comes with the next flush at the latest.
        #[cfg(feature = "metrics")]
        let next = next.chain(self.publish_pace.owed());
        let next = next.min();
        self.alarm.arm(next, ctx, |act, ctx| {
            act.alarm.fired();
            act.handle_timeouts(now());
            act.flush(ctx);
        });
    }

    /// Sends the ACKs of confirmed jobs to their producer, in one batch.
    fn send_acks(&mut self) {
        if let Some(reply_to) = &self.reply_to
            && !self.acks.is_empty()
        {
            reply_to.do_send_all(self.acks.drain(..));
        }
    }

    /// Takes what the touched streams settled to the pool.
    fn settle_dirty(&mut self, now: Instant) {
        let mut taken = std::mem::take(&mut self.taken);
        for number in &self.dirty {
            let Some(stream) = self.streams.get_mut(number) else {
                continue;
            };
            taken.extend(std::iter::from_fn(|| {
                let (key, result) = stream.core.poll_settled()?;
                Some(JobSettled {
                    worker: stream.worker,
                    key,
                    result,
                })
            }));
            // An idle stream keeps its queues' memory, which its window bounds (the pool gives
            // a worker at most its window; the in-flight ring holds at most twice that and
            // 33): giving it back cost allocations at every burst.
            if stream.leaving_until.is_some() && stream.core.is_idle() {
                self.streams.remove(number); // nothing more on its way
            }
        }
        for settled in taken.drain(..) {
            self.settle(settled, now);
        }
        self.taken = taken;
    }

    /// Hands waiting jobs to workers with demand, over their streams (opened with a
    /// worker's first job of the producer's life).
    fn assign(&mut self) {
        while let Some(assignment) = self.pool.poll_assign() {
            let (worker, key) = (assignment.worker, assignment.key);
            let job = assignment.job.clone();
            let number = match self.workers[&worker].stream {
                Some(number) => number,
                None => {
                    let token = self.tokens.expect("a job was taken: the token is known").1;
                    let number = self.open_stream(worker, token);
                    let worker = self.workers.get_mut(&worker).expect("assigned a job");
                    worker.stream = Some(number);
                    number
                }
            };
            let stream = self.streams.get_mut(&number).expect("its worker's, open");
            // The pool gives a worker at most its stream's window: the stream never refuses.
            let _ = stream.core.handle_send(job, key);
            if !std::mem::replace(&mut stream.dirty, true) {
                self.dirty.push(number);
            }
        }
    }

    /// Sends what the touched streams transmit, a batch per worker.
    fn transmit(&mut self, now: Instant) {
        let Some(reply_to) = &self.own_reply_to else {
            self.dirty.clear();
            return;
        };
        for number in self.dirty.drain(..) {
            let Some(stream) = self.streams.get_mut(&number) else {
                continue; // ended since
            };
            stream.dirty = false;
            // A leaving stream's worker is gone: it sends nothing.
            let Some(worker) = self.workers.get(&stream.worker) else {
                continue;
            };
            let core = &mut stream.core;
            let deliveries = std::iter::from_fn(|| core.poll_transmit(now))
                .map(|transmission| Delivery::from_transmission(transmission, reply_to.clone()));
            worker.target.do_send_all(deliveries);
        }
    }

    /// Lets the streams whose retransmission is due retransmit, ends those of workers that
    /// left whose grace is over, and lets the rested workers work.
    fn handle_timeouts(&mut self, now: Instant) {
        self.streams
            .retain(|_, stream| stream.leaving_until.is_none_or(|until| until > now));
        for (number, stream) in &mut self.streams {
            if stream.leaving_until.is_none()
                && stream.core.next_deadline().is_some_and(|at| at <= now)
            {
                stream.core.handle_timeout(now);
                if !std::mem::replace(&mut stream.dirty, true) {
                    self.dirty.push(*number);
                }
            }
        }
        self.pool.handle_timeout(now);
    }

    /// Publishes the streams' counters to the metrics.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        for stream in self.streams.values_mut() {
            stream.meter.publish(&stream.core.stats());
        }
    }
}

// The pool is never structurally pinned: a job type that is not `Unpin` is fine.
impl<T: Clone + Send + 'static> Unpin for WorkPullingController<T> {}

impl<T: Clone + Send + 'static> Actor for WorkPullingController<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        self.own_reply_to = Some(ReplyTo::batching(
            addr.clone().recipient(),
            addr.recipient(),
        ));
        for (name, worker) in self.registry.watch(ctx.address().recipient()) {
            self.join(name, worker);
        }
        if let Some(stopped) = self.producer_stopped.take() {
            ctx.spawn(stopped.into_actor(self).map(|_, _, ctx| ctx.stop()));
        }
        after_each_drain(ctx, |act, ctx, _| {
            act.flush(ctx);
            Poll::Pending
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // The streams end with the pool; the producer settles its jobs itself.
        #[cfg(feature = "metrics")]
        self.publish();
        self.own_reply_to = None;
    }
}

impl<T: Clone + Send + 'static> Handler<Delivery<T>> for WorkPullingController<T> {
    type Result = ();

    fn handle(&mut self, delivery: Delivery<T>, _: &mut Context<Self>) {
        self.take(delivery);
    }
}

impl<T: Clone + Send + 'static> Handler<Deliveries<T>> for WorkPullingController<T> {
    type Result = ();

    fn handle(&mut self, deliveries: Deliveries<T>, _: &mut Context<Self>) {
        deliveries.0.into_iter().for_each(|d| self.take(d));
    }
}

impl<T: Clone + Send + 'static> Handler<SingleAck> for WorkPullingController<T> {
    type Result = ();

    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.handle_ack(&ack);
    }
}

impl<T: Clone + Send + 'static> Handler<Acks> for WorkPullingController<T> {
    type Result = ();

    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        for ack in &acks {
            self.handle_ack(ack);
        }
    }
}

impl<T: Clone + Send + 'static> Handler<WorkersChanged<T>> for WorkPullingController<T> {
    type Result = ();

    fn handle(&mut self, change: WorkersChanged<T>, _: &mut Context<Self>) {
        match change {
            WorkersChanged::Joined { name, worker } => self.join(name, worker),
            WorkersChanged::Left { name } => {
                if let Some(key) = self.by_name.get(&name).copied() {
                    self.leave(key);
                }
            }
        }
    }
}

impl<T: Clone + Send + 'static> Handler<GetPoolStats> for WorkPullingController<T> {
    type Result = MessageResult<GetPoolStats>;

    fn handle(&mut self, _: GetPoolStats, _: &mut Context<Self>) -> Self::Result {
        let mut stats = self.pool.stats();
        stats.ignored_acks = self.ignored_acks;
        MessageResult(stats)
    }
}
