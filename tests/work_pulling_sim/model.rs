//! A reference model of the pool's rules, fed the same calls as the real `WorkPool`: every
//! answer of the pool is compared with the model's, and the ordering rule (re-routed jobs
//! are assigned before any job that never was) is checked on every assignment.

use std::collections::{BTreeMap, BTreeSet};

use actix_delivery::work_pulling::pool::{JobKey, Settled, WorkPool, WorkerKey};

/// The model's view of the pool.
#[derive(Debug, Default)]
pub struct Model {
    /// Jobs waiting, by key (= arrival order).
    waiting: BTreeSet<JobKey>,
    /// Jobs not confirmed yet, and the worker holding each (`None`: waiting).
    holder: BTreeMap<JobKey, Option<WorkerKey>>,
    /// Per worker: capacity, and the jobs its stream holds (copies of jobs confirmed
    /// elsewhere included, until their own settlement).
    workers: BTreeMap<WorkerKey, (usize, BTreeSet<JobKey>)>,
    /// Jobs waiting again after their worker left or failed them: they must all be assigned
    /// before any job that was never assigned.
    front: BTreeSet<JobKey>,
    /// Every job ever assigned.
    assigned_once: BTreeSet<JobKey>,
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
}

impl CheckedPool {
    /// An empty pool drawing its ties from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            pool: WorkPool::new(seed),
            model: Model::default(),
            broken: Vec::new(),
            front_checks: 0,
            rerouted: 0,
            confirmed_elsewhere: 0,
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
        self.model.workers.insert(key, (capacity, BTreeSet::new()));
    }

    /// Removes a worker; returns the keys the model re-routed.
    pub fn remove_worker(&mut self, key: WorkerKey) -> Vec<JobKey> {
        let n = self.pool.remove_worker(key);
        let mut rerouted = Vec::new();
        if let Some((_, holding)) = self.model.workers.remove(&key) {
            for job in holding {
                if let Some(h) = self.model.holder.get_mut(&job) {
                    if *h == Some(key) {
                        *h = None;
                        self.model.waiting.insert(job);
                        self.model.front.insert(job);
                        rerouted.push(job);
                    }
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
            .filter(|(cap, h)| h.len() < *cap)
            .map(|(_, h)| h.len())
            .min();
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
        if let Some(&first_front) = self.model.front.first() {
            if !self.model.front.contains(&key) {
                self.fail(format!(
                    "job {key} assigned while re-routed job {first_front} still waits (re-routed \
                     jobs go first)"
                ));
            }
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
            Some((cap, holding)) => {
                if holding.len() >= *cap {
                    self.fail(format!(
                        "job {key} assigned to {worker:?} holding {} of {cap}",
                        holding.len()
                    ));
                } else if Some(holding.len()) != fewest {
                    self.fail(format!(
                        "job {key} assigned to {worker:?} holding {}, another holds {fewest:?}",
                        holding.len()
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
        if let Some((_, holding)) = self.model.workers.get_mut(&worker) {
            holding.insert(key);
        }
        Some((worker, key))
    }

    /// A settlement, checked against the model.
    pub fn settled(&mut self, worker: WorkerKey, key: JobKey, ok: bool) -> Settled<u64> {
        let got = self.pool.settled(worker, key, ok);
        if let Some((_, holding)) = self.model.workers.get_mut(&worker) {
            holding.remove(&key);
        }
        let expected = if ok {
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
            match self.model.holder.get_mut(&key) {
                Some(h) if *h == Some(worker) => {
                    *h = None;
                    self.model.waiting.insert(key);
                    self.model.front.insert(key);
                    self.rerouted += 1;
                    Settled::Rerouted
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

    /// Jobs the model says `worker`'s stream holds.
    pub fn holding(&self, worker: WorkerKey) -> usize {
        self.model.workers.get(&worker).map_or(0, |(_, h)| h.len())
    }

    /// Compares the pool's counters with the model.
    pub fn compare_stats(&mut self) {
        let stats = self.pool.stats();
        let model: Vec<usize> = self.model.workers.values().map(|(_, h)| h.len()).collect();
        let pool: Vec<usize> = stats.per_worker.iter().map(|w| w.in_flight).collect();
        if model != pool
            || stats.queued != self.model.waiting.len()
            || stats.jobs != self.model.holder.len()
        {
            self.fail(format!(
                "pool stats (in flight {pool:?}, queued {}, jobs {}) differ from the model \
                 ({model:?}, {}, {})",
                stats.queued,
                stats.jobs,
                self.model.waiting.len(),
                self.model.holder.len()
            ));
        }
    }

    /// Where an unconfirmed job is (for a stuck-job report).
    pub fn whereabouts(&self, job: JobKey) -> String {
        match self.model.holder.get(&job) {
            None => "confirmed".into(),
            Some(None) => "waiting".into(),
            Some(Some(w)) => format!("held by {w:?}"),
        }
    }
}
