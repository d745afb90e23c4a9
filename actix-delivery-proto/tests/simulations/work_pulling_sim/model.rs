//! A reference model of the pool's rules, fed the same calls as the real `WorkPool`: every
//! answer of the pool is compared with the model's, and the ordering rule (re-routed jobs
//! are assigned before any job that never was) is checked on every assignment, as are the
//! rests of failing workers and the give-ups.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::time::Instant;

use actix_delivery_proto::work_pulling::pool::{
    JobKey, Settled, WorkPool, WorkerKey, REST_FIRST, REST_MAX,
};

/// The model's view of one worker.
#[derive(Debug)]
struct ModelWorker {
    capacity: usize,
    /// The jobs its stream holds (copies of jobs confirmed elsewhere included, until their
    /// own settlement).
    holding: BTreeSet<JobKey>,
    /// Failures since its last confirmation.
    failing: u32,
    /// It takes no job before this.
    resting_until: Option<Instant>,
}

impl ModelWorker {
    /// Jobs it may hold now: none while resting, one while failing, else its capacity.
    fn demand(&self) -> usize {
        if self.resting_until.is_some() {
            0
        } else if self.failing > 0 {
            1
        } else {
            self.capacity
        }
    }

    fn has_demand(&self) -> bool {
        self.holding.len() < self.demand()
    }
}

/// The model's view of the pool.
#[derive(Debug, Default)]
pub struct Model {
    /// Jobs waiting, by key (= arrival order).
    waiting: BTreeSet<JobKey>,
    /// Jobs not confirmed yet, and the worker holding each (`None`: waiting).
    holder: BTreeMap<JobKey, Option<WorkerKey>>,
    /// Per worker.
    workers: BTreeMap<WorkerKey, ModelWorker>,
    /// Jobs waiting again after their worker left or failed them: they must all be assigned
    /// before any job that was never assigned.
    front: BTreeSet<JobKey>,
    /// Every job ever assigned.
    assigned_once: BTreeSet<JobKey>,
    /// Failures per job.
    failures: BTreeMap<JobKey, u32>,
    /// A job is given up after this many failures.
    give_up_after: Option<u32>,
    /// Jobs given up.
    given_up: BTreeSet<JobKey>,
    /// Failures at workers, and the rests they began.
    failed: u64,
    rests: u64,
}

/// The pool with its model: every call goes to both and the answers are compared.
pub struct CheckedPool {
    /// The real pool.
    pub pool: WorkPool<u64>,
    /// The model.
    pub model: Model,
    /// Rules broken so far.
    pub broken: Vec<String>,
    /// Assignments of a re-routed job while a later, never assigned job waited: the ordering
    /// rule decided them.
    pub front_checks: u64,
    /// Re-routed jobs (by removal or failure).
    pub rerouted: u64,
    /// Jobs confirmed by one worker while another worker's stream held a copy (which keeps
    /// its slot until its own settlement).
    pub confirmed_elsewhere: u64,
    /// Assignments that a resting or failing worker would have had by its capacity: the
    /// rests and the one-job-at-a-time rule decided them.
    pub rest_checks: u64,
}

impl CheckedPool {
    /// An empty pool drawing its ties from `seed`, giving a job up after `give_up_after`
    /// failures (`None`: never).
    pub fn new(seed: u64, give_up_after: Option<u32>) -> Self {
        let mut pool = WorkPool::new(seed);
        if let Some(failures) = give_up_after {
            pool = pool.give_up_after(NonZeroU32::new(failures).expect("positive"));
        }
        Self {
            pool,
            model: Model {
                give_up_after,
                ..Model::default()
            },
            broken: Vec::new(),
            front_checks: 0,
            rerouted: 0,
            confirmed_elsewhere: 0,
            rest_checks: 0,
        }
    }

    fn fail(&mut self, rule: String) {
        if self.broken.len() < 100 {
            self.broken.push(rule);
        }
    }

    /// Pushes job `job`; its key must be its number.
    pub fn push(&mut self, job: u64) {
        let key = self.pool.push(job);
        if key != job {
            self.fail(format!(
                "job {job} got key {key} (keys are in arrival order from 1)"
            ));
        }
        self.model.waiting.insert(key);
        self.model.holder.insert(key, None);
    }

    /// Adds a worker.
    pub fn add_worker(&mut self, key: WorkerKey, name: &str, capacity: usize) {
        self.pool.add_worker(key, name, capacity);
        let worker = ModelWorker {
            capacity,
            holding: BTreeSet::new(),
            failing: 0,
            resting_until: None,
        };
        self.model.workers.insert(key, worker);
    }

    /// Removes a worker; returns the keys the model re-routed.
    pub fn remove_worker(&mut self, key: WorkerKey) -> Vec<JobKey> {
        let n = self.pool.remove_worker(key);
        let mut rerouted = Vec::new();
        if let Some(worker) = self.model.workers.remove(&key) {
            for job in worker.holding {
                if let Some(h) = self.model.holder.get_mut(&job)
                    && *h == Some(key)
                {
                    *h = None;
                    self.model.waiting.insert(job);
                    self.model.front.insert(job);
                    rerouted.push(job);
                }
            }
        }
        if n != rerouted.len() {
            self.fail(format!(
                "remove_worker({key:?}) re-routed {n} jobs, the model {rerouted:?}"
            ));
        }
        self.rerouted += rerouted.len() as u64;
        rerouted
    }

    /// The next assignment, checked against the model: the first waiting job, to a worker
    /// with demand holding the fewest jobs.
    pub fn poll_assign(&mut self) -> Option<(WorkerKey, JobKey)> {
        let got = self.pool.poll_assign().map(|a| {
            let wrong_body = *a.job != a.key;
            (a.worker, a.key, wrong_body)
        });
        let expected_key = self.model.waiting.first().copied();
        let fewest = self
            .model
            .workers
            .values()
            .filter(|w| w.has_demand())
            .map(|w| w.holding.len())
            .min();
        if expected_key.is_some()
            && self
                .model
                .workers
                .values()
                .any(|w| !w.has_demand() && w.holding.len() < w.capacity)
        {
            self.rest_checks += 1;
        }
        let Some((worker, key, wrong_body)) = got else {
            if expected_key.is_some() && fewest.is_some() {
                self.fail(format!(
                    "poll_assign gave nothing though job {expected_key:?} waits and a worker \
                     has demand"
                ));
            }
            return None;
        };
        if wrong_body {
            self.fail(format!("the assignment of key {key} carries another job"));
        }
        if Some(key) != expected_key {
            self.fail(format!(
                "assigned job {key}, but the first waiting job is {expected_key:?}"
            ));
        }
        if let Some(&first_front) = self.model.front.first()
            && !self.model.front.contains(&key)
        {
            self.fail(format!(
                "job {key} assigned while re-routed job {first_front} still waits (re-routed \
                     jobs go first)"
            ));
        }
        if self.model.front.contains(&key)
            && self
                .model
                .waiting
                .iter()
                .any(|j| *j > key && !self.model.assigned_once.contains(j))
        {
            self.front_checks += 1;
        }
        match self.model.workers.get(&worker) {
            None => self.fail(format!("job {key} assigned to unknown worker {worker:?}")),
            Some(w) => {
                if !w.has_demand() {
                    self.fail(format!(
                        "job {key} assigned to {worker:?} holding {} of {} (failing {}, \
                         resting until {:?})",
                        w.holding.len(),
                        w.demand(),
                        w.failing,
                        w.resting_until
                    ));
                } else if Some(w.holding.len()) != fewest {
                    self.fail(format!(
                        "job {key} assigned to {worker:?} holding {}, another holds {fewest:?}",
                        w.holding.len()
                    ));
                }
            }
        }
        self.model.waiting.remove(&key);
        self.model.front.remove(&key);
        self.model.assigned_once.insert(key);
        if let Some(h) = self.model.holder.get_mut(&key) {
            *h = Some(worker);
        } else {
            self.fail(format!("job {key} assigned but the model does not hold it"));
        }
        if let Some(w) = self.model.workers.get_mut(&worker) {
            w.holding.insert(key);
        }
        Some((worker, key))
    }

    /// A settlement at `now`, checked against the model.
    pub fn settled(
        &mut self,
        worker: WorkerKey,
        key: JobKey,
        ok: bool,
        now: Instant,
    ) -> Settled<u64> {
        let got = self.pool.settled(worker, key, ok, now);
        let held = self
            .model
            .workers
            .get_mut(&worker)
            .map(|w| (w.holding.remove(&key), w));
        let expected = if !self.model.assigned_once.contains(&key) {
            Settled::Ignored // never handed out: no worker's stream holds it, nothing changes
        } else if ok {
            if let Some((_, w)) = held {
                w.failing = 0;
            }
            if let Some(holder) = self.model.holder.remove(&key) {
                if holder.is_some_and(|h| h != worker) {
                    self.confirmed_elsewhere += 1;
                }
                self.model.waiting.remove(&key);
                self.model.front.remove(&key);
                Settled::Confirmed(key)
            } else {
                Settled::Ignored
            }
        } else {
            if let Some((true, w)) = held {
                w.failing += 1;
                let rest = REST_FIRST * 2u32.pow((w.failing - 1).min(16));
                let until = now + rest.min(REST_MAX);
                if w.resting_until.is_none() {
                    self.model.rests += 1;
                }
                w.resting_until = Some(w.resting_until.map_or(until, |u| u.max(until)));
                self.model.failed += 1;
            }
            match self.model.holder.get_mut(&key) {
                Some(h) if *h == Some(worker) => {
                    let failures = self.model.failures.entry(key).or_default();
                    *failures += 1;
                    let attempts = *failures;
                    if self.model.give_up_after.is_some_and(|n| attempts >= n) {
                        self.model.holder.remove(&key);
                        self.model.given_up.insert(key);
                        Settled::GivenUp { job: key, attempts }
                    } else {
                        *h = None;
                        self.model.waiting.insert(key);
                        self.model.front.insert(key);
                        self.rerouted += 1;
                        Settled::Rerouted
                    }
                }
                _ => Settled::Ignored,
            }
        };
        if got != expected {
            self.fail(format!(
                "settled({worker:?}, {key}, ok={ok}) gave {got:?}, the model {expected:?}"
            ));
        }
        got
    }

    /// When the pool needs [`handle_timeout`](Self::handle_timeout), checked against the
    /// model: when the first rest ends.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let got = self.pool.next_deadline();
        let expected = self
            .model
            .workers
            .values()
            .filter_map(|w| w.resting_until)
            .min();
        if got != expected {
            self.fail(format!(
                "next_deadline gave {got:?}, the model {expected:?}"
            ));
        }
        got
    }

    /// Ends the rests due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.pool.handle_timeout(now);
        for worker in self.model.workers.values_mut() {
            if worker.resting_until.is_some_and(|until| until <= now) {
                worker.resting_until = None;
            }
        }
    }

    /// Jobs the model says `worker`'s stream holds.
    pub fn holding(&self, worker: WorkerKey) -> usize {
        self.model
            .workers
            .get(&worker)
            .map_or(0, |w| w.holding.len())
    }

    /// Compares the pool's counters with the model.
    pub fn compare_stats(&mut self) {
        let stats = self.pool.stats();
        let model: Vec<_> = self
            .model
            .workers
            .values()
            .map(|w| (w.holding.len(), w.failing, w.resting_until.is_some()))
            .collect();
        let pool: Vec<_> = stats
            .per_worker
            .iter()
            .map(|w| (w.in_flight, w.failing, w.resting))
            .collect();
        let model_counts = (
            self.model.waiting.len(),
            self.model.holder.len(),
            self.model.failed,
            self.model.given_up.len() as u64,
            self.model.rests,
        );
        let pool_counts = (
            stats.queued,
            stats.jobs,
            stats.failed,
            stats.given_up,
            stats.rests,
        );
        if model != pool || model_counts != pool_counts {
            self.fail(format!(
                "pool stats (per worker in flight, failing, resting: {pool:?}; queued, jobs, \
                 failed, given up, rests: {pool_counts:?}) differ from the model ({model:?}; \
                 {model_counts:?})"
            ));
        }
    }

    /// Where an unconfirmed job is (for a stuck-job report).
    pub fn whereabouts(&self, job: JobKey) -> String {
        if self.model.given_up.contains(&job) {
            return "given up".into();
        }
        match self.model.holder.get(&job) {
            None => "confirmed".into(),
            Some(None) => "waiting".into(),
            Some(Some(w)) => format!("held by {w:?}"),
        }
    }
}
