//! The pure core of work pulling: which worker gets the next job, and where the jobs of a
//! worker that left go. No actor, no timer, no I/O: the shell feeds it jobs, workers and
//! settlements, and sends what [`WorkPool::poll_assign`] hands out.
//!
//! Rules:
//! - a job goes to a worker with demand (fewer jobs held than its capacity), the one holding
//!   the fewest, ties broken at random (seeded);
//! - jobs wait in arrival order; a job whose worker left or failed it waits again **at the
//!   front**, and several such jobs keep their original order (the waiting queue is ordered
//!   by arrival);
//! - a job is confirmed once, by the first worker that confirms it; a worker still holding a
//!   copy of a job confirmed elsewhere keeps its slot until its own settlement arrives, so the
//!   pool's count of what a worker holds is what the worker's stream holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hashbrown::HashMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A worker's key in the pool: unique per registration, so a worker that leaves and comes
/// back under the same name is a new worker, and a late settlement of its old stream is
/// recognised as such.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey(pub u64);

/// A job's key in the pool, in arrival order.
pub type JobKey = u64;

/// A job handed to a worker: send `job` to `worker`'s stream and report its outcome with
/// [`WorkPool::settled`].
#[derive(Debug)]
pub struct Assignment<'a, J> {
    /// The worker.
    pub worker: WorkerKey,
    /// The job's key (its settlement names it).
    pub key: JobKey,
    /// The job.
    pub job: &'a J,
}

/// What a settlement did.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled<J> {
    /// The job is done: confirm it to its sender (it left the pool).
    Confirmed(J),
    /// The job failed at this worker and waits for another one (at the front).
    Rerouted,
    /// Nothing: the job was confirmed before, or is no longer this worker's.
    Ignored,
}

/// One worker's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerStats {
    /// The name it registered under.
    pub name: Arc<str>,
    /// Jobs its stream holds (sent, not yet settled).
    pub in_flight: usize,
    /// Jobs it confirmed.
    pub confirmed: u64,
    /// Jobs taken from it to be routed again because its stream failed one (the jobs of a
    /// worker that left are counted in [`PoolStats::rerouted`]).
    pub rerouted: u64,
}

/// The pool's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Workers present.
    pub workers: usize,
    /// Jobs waiting for a worker with demand.
    pub queued: usize,
    /// Jobs held (waiting or at a worker), not yet confirmed.
    pub jobs: usize,
    /// Jobs handed to a worker (a re-routed job counts again).
    pub assigned: u64,
    /// Jobs confirmed.
    pub confirmed: u64,
    /// Jobs re-routed.
    pub rerouted: u64,
    /// Workers that joined.
    pub joined: u64,
    /// Workers that left (deregistered, stopped, failed).
    pub left: u64,
    /// Per worker, in the order they joined.
    pub per_worker: Vec<WorkerStats>,
}

struct Slot<J> {
    job: J,
    /// The worker that holds it now; `None` while it waits.
    holder: Option<WorkerKey>,
}

struct Worker {
    name: Arc<str>,
    /// When it joined (kept when its stream is renewed): the order of `per_worker`.
    joined: u64,
    capacity: usize,
    /// The jobs its stream holds (sent, not settled), including copies of jobs that were
    /// confirmed by another worker meanwhile.
    holding: BTreeSet<JobKey>,
    confirmed: u64,
    rerouted: u64,
}

impl Worker {
    fn has_demand(&self) -> bool {
        self.holding.len() < self.capacity
    }
}

/// The pool: jobs waiting or held by workers, and the workers.
pub struct WorkPool<J> {
    jobs: HashMap<JobKey, Slot<J>>,
    waiting: BTreeSet<JobKey>,
    workers: BTreeMap<WorkerKey, Worker>,
    next_key: JobKey,
    rng: SmallRng,
    /// Workers tied for the fewest held jobs (reused buffer of `poll_assign`).
    ties: Vec<WorkerKey>,
    assigned: u64,
    confirmed: u64,
    rerouted: u64,
    joined: u64,
    left: u64,
}

impl<J> WorkPool<J> {
    /// An empty pool whose tie-breaks are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            jobs: HashMap::new(),
            waiting: BTreeSet::new(),
            workers: BTreeMap::new(),
            next_key: 1,
            rng: SmallRng::seed_from_u64(seed),
            ties: Vec::new(),
            assigned: 0,
            confirmed: 0,
            rerouted: 0,
            joined: 0,
            left: 0,
        }
    }

    /// Adds a job behind the waiting ones; returns its key.
    pub fn push(&mut self, job: J) -> JobKey {
        let key = self.next_key;
        self.next_key += 1;
        self.jobs.insert(key, Slot { job, holder: None });
        self.waiting.insert(key);
        key
    }

    /// Adds a worker that takes up to `capacity` jobs at once.
    ///
    /// # Panics
    /// If `key` is present already (keys are unique per registration) or `capacity` is 0.
    pub fn add_worker(&mut self, key: WorkerKey, name: impl Into<Arc<str>>, capacity: usize) {
        assert!(capacity > 0, "a worker takes at least one job");
        let worker = Worker {
            name: name.into(),
            joined: self.joined,
            capacity,
            holding: BTreeSet::new(),
            confirmed: 0,
            rerouted: 0,
        };
        assert!(
            self.workers.insert(key, worker).is_none(),
            "worker keys are unique"
        );
        self.joined += 1;
    }

    /// Gives a worker a fresh stream under the key `renewed` (its stream failed a job): the
    /// jobs it held wait again, at the front, in their order, counted as re-routed from it;
    /// its counters stay. Late settlements of the old stream are those of a removed worker.
    /// Returns how many were re-routed (0 for an unknown key).
    ///
    /// # Panics
    /// If `renewed` is present already.
    pub fn renew_worker(&mut self, key: WorkerKey, renewed: WorkerKey) -> usize {
        let Some(mut worker) = self.workers.remove(&key) else {
            return 0;
        };
        let rerouted = self.requeue(key, std::mem::take(&mut worker.holding));
        worker.rerouted += rerouted as u64;
        assert!(
            self.workers.insert(renewed, worker).is_none(),
            "worker keys are unique"
        );
        rerouted
    }

    /// The jobs of `holding` that `key` held wait again.
    fn requeue(&mut self, key: WorkerKey, holding: BTreeSet<JobKey>) -> usize {
        let mut rerouted = 0;
        for job in holding {
            if let Some(slot) = self.jobs.get_mut(&job).filter(|s| s.holder == Some(key)) {
                slot.holder = None;
                self.waiting.insert(job);
                rerouted += 1;
            }
        }
        self.rerouted += rerouted as u64;
        rerouted
    }

    /// Removes a worker; the jobs it held wait again, at the front, in their order. Returns
    /// how many were re-routed (0 for an unknown key).
    pub fn remove_worker(&mut self, key: WorkerKey) -> usize {
        let Some(worker) = self.workers.remove(&key) else {
            return 0;
        };
        self.left += 1;
        self.requeue(key, worker.holding)
    }

    /// The next job for a worker with demand, if a job waits and a worker has demand. The
    /// job is then held by that worker until [`settled`](Self::settled).
    pub fn poll_assign(&mut self) -> Option<Assignment<'_, J>> {
        let &key = self.waiting.first()?;
        let fewest = self
            .workers
            .values()
            .filter(|w| w.has_demand())
            .map(|w| w.holding.len())
            .min()?;
        self.ties.clear();
        self.ties.extend(
            self.workers
                .iter()
                .filter(|(_, w)| w.has_demand() && w.holding.len() == fewest)
                .map(|(&k, _)| k),
        );
        let worker = self.ties[self.rng.random_range(0..self.ties.len())];
        self.waiting.pop_first();
        self.workers
            .get_mut(&worker)
            .expect("a tied worker is present")
            .holding
            .insert(key);
        let slot = self.jobs.get_mut(&key).expect("a waiting job is held");
        slot.holder = Some(worker);
        self.assigned += 1;
        Some(Assignment {
            worker,
            key,
            job: &slot.job,
        })
    }

    /// Reports the outcome of job `key` at `worker`: `ok` when the worker's stream confirmed
    /// it, else it failed there (its stream stopped or gave it up). A confirmation counts
    /// whoever sends it (a worker that was removed, a copy held by a worker the job was
    /// re-routed from); a failure re-routes the job only if `worker` holds it now.
    pub fn settled(&mut self, worker: WorkerKey, key: JobKey, ok: bool) -> Settled<J> {
        let present = self.workers.get_mut(&worker);
        let held = present.map(|w| (w.holding.remove(&key), w));
        if ok {
            let Some(slot) = self.jobs.remove(&key) else {
                return Settled::Ignored;
            };
            self.waiting.remove(&key);
            if let Some((_, worker)) = held {
                worker.confirmed += 1;
            }
            self.confirmed += 1;
            return Settled::Confirmed(slot.job);
        }
        match self.jobs.get_mut(&key) {
            Some(slot) if slot.holder == Some(worker) => {
                slot.holder = None;
                self.waiting.insert(key);
                if let Some((_, worker)) = held {
                    worker.rerouted += 1;
                }
                self.rerouted += 1;
                Settled::Rerouted
            }
            _ => Settled::Ignored,
        }
    }

    /// Drops every job (their senders settled them otherwise), keeping the workers and what
    /// their streams hold until those settle. Returns the jobs.
    pub fn drain_jobs(&mut self) -> impl Iterator<Item = J> + '_ {
        self.waiting.clear();
        std::mem::take(&mut self.jobs)
            .into_values()
            .map(|slot| slot.job)
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let mut per_worker: Vec<_> = self
            .workers
            .values()
            .map(|w| {
                (
                    w.joined,
                    WorkerStats {
                        name: w.name.clone(),
                        in_flight: w.holding.len(),
                        confirmed: w.confirmed,
                        rerouted: w.rerouted,
                    },
                )
            })
            .collect();
        per_worker.sort_by_key(|(joined, _)| *joined);
        PoolStats {
            workers: self.workers.len(),
            queued: self.waiting.len(),
            jobs: self.jobs.len(),
            assigned: self.assigned,
            confirmed: self.confirmed,
            rerouted: self.rerouted,
            joined: self.joined,
            left: self.left,
            per_worker: per_worker.into_iter().map(|(_, s)| s).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: WorkerKey = WorkerKey(1);
    const B: WorkerKey = WorkerKey(2);

    fn assign(pool: &mut WorkPool<&'static str>) -> Option<(WorkerKey, JobKey, &'static str)> {
        pool.poll_assign().map(|a| (a.worker, a.key, *a.job))
    }

    #[test]
    fn jobs_wait_until_a_worker_has_demand_and_never_exceed_its_capacity() {
        let mut pool = WorkPool::new(1);
        let first = pool.push("a");
        pool.push("b");
        assert_eq!(assign(&mut pool), None, "no worker");
        pool.add_worker(A, "a", 1);
        assert_eq!(assign(&mut pool), Some((A, first, "a")));
        assert_eq!(assign(&mut pool), None, "A is full");
        assert_eq!(pool.settled(A, first, true), Settled::Confirmed("a"));
        assert_eq!(assign(&mut pool).map(|a| a.2), Some("b"));
        assert_eq!(pool.stats().queued, 0);
    }

    #[test]
    fn the_worker_holding_the_fewest_jobs_gets_the_next_and_ties_spread() {
        let mut pool = WorkPool::new(7);
        pool.add_worker(A, "a", 8);
        pool.add_worker(B, "b", 8);
        for _ in 0..3 {
            pool.push("x");
        }
        let a = assign(&mut pool).unwrap();
        let b = assign(&mut pool).unwrap();
        assert_ne!(a.0, b.0, "the second job goes to the idle worker");
        // A now confirms its job: it holds fewer, so it gets the third.
        let (held_by_a, _) = if a.0 == A { (a, b) } else { (b, a) };
        pool.settled(A, held_by_a.1, true);
        assert_eq!(assign(&mut pool).unwrap().0, A);

        // Ties: over many rounds both workers get first picks.
        let mut firsts = [0; 2];
        for seed in 0..64 {
            let mut pool = WorkPool::new(seed);
            pool.add_worker(A, "a", 1);
            pool.add_worker(B, "b", 1);
            pool.push("x");
            firsts[(assign(&mut pool).unwrap().0 .0 - 1) as usize] += 1;
        }
        assert!(
            firsts[0] > 10 && firsts[1] > 10,
            "ties are random: {firsts:?}"
        );
    }

    #[test]
    fn a_leaving_workers_jobs_wait_again_at_the_front_in_their_order() {
        let mut pool = WorkPool::new(3);
        pool.add_worker(A, "a", 3);
        let keys: Vec<_> = ["1", "2", "3", "4", "5"]
            .into_iter()
            .map(|j| pool.push(j))
            .collect();
        for _ in 0..3 {
            assert_eq!(assign(&mut pool).unwrap().0, A);
        }
        // 2 confirmed, 1 and 3 are still at A; 4 and 5 wait.
        pool.settled(A, keys[1], true);
        assert_eq!(pool.remove_worker(A), 2);
        assert_eq!(pool.remove_worker(A), 0, "removing twice re-routes nothing");
        pool.add_worker(B, "b", 8);
        let order: Vec<_> = std::iter::from_fn(|| assign(&mut pool).map(|a| a.2)).collect();
        assert_eq!(order, ["1", "3", "4", "5"]);
        let stats = pool.stats();
        assert_eq!((stats.rerouted, stats.joined, stats.left), (2, 2, 1));
    }

    #[test]
    fn a_renewed_worker_keeps_its_counters_and_place_and_its_jobs_wait_again() {
        let mut pool = WorkPool::new(6);
        pool.add_worker(A, "a", 2);
        pool.add_worker(B, "b", 1);
        let keys: Vec<_> = ["1", "2", "3"].into_iter().map(|j| pool.push(j)).collect();
        let held_by_a: Vec<_> = std::iter::from_fn(|| assign(&mut pool))
            .filter(|a| a.0 == A)
            .map(|a| a.1)
            .collect();
        assert_eq!(held_by_a.len(), 2);
        pool.settled(A, held_by_a[0], true);
        assert_eq!(pool.renew_worker(A, WorkerKey(3)), 1);
        let stats = pool.stats();
        assert_eq!(stats.per_worker[0].name.as_ref(), "a", "still first");
        assert_eq!(
            (stats.per_worker[0].confirmed, stats.per_worker[0].rerouted),
            (1, 1)
        );
        assert_eq!((stats.joined, stats.left, stats.queued), (2, 0, 1));
        // The old stream's late failure is ignored, the renewed worker takes the job again.
        assert_eq!(pool.settled(A, held_by_a[1], false), Settled::Ignored);
        assert_eq!(
            assign(&mut pool).map(|a| (a.0, a.1)),
            Some((WorkerKey(3), held_by_a[1]))
        );
        assert!(keys.contains(&held_by_a[1]));
    }

    #[test]
    fn a_failed_job_waits_at_the_front_and_a_late_settlement_changes_nothing() {
        let mut pool = WorkPool::new(5);
        pool.add_worker(A, "a", 1);
        let one = pool.push("1");
        pool.push("2");
        assert_eq!(assign(&mut pool).unwrap().1, one);
        assert_eq!(pool.settled(A, one, false), Settled::Rerouted);
        assert_eq!(
            pool.settled(A, one, false),
            Settled::Ignored,
            "a second failure of a job A no longer holds"
        );
        assert_eq!(assign(&mut pool).unwrap().2, "1", "at the front");
        assert_eq!(pool.stats().per_worker[0].rerouted, 1);
    }

    #[test]
    fn a_job_is_confirmed_once_by_whichever_worker_confirms_first() {
        let mut pool = WorkPool::new(9);
        pool.add_worker(A, "a", 1);
        let job = pool.push("j");
        assign(&mut pool);
        pool.remove_worker(A);
        pool.add_worker(B, "b", 1);
        assert_eq!(assign(&mut pool).unwrap().0, B);
        // A's ACK was in flight: A (removed) confirms first.
        assert_eq!(pool.settled(A, job, true), Settled::Confirmed("j"));
        assert_eq!(pool.settled(B, job, true), Settled::Ignored);
        let stats = pool.stats();
        assert_eq!((stats.confirmed, stats.jobs), (1, 0));
        assert_eq!(stats.per_worker[0].in_flight, 0, "B's slot came back");
    }

    #[test]
    fn a_worker_keeps_the_slot_of_a_copy_confirmed_elsewhere_until_its_own_settlement() {
        let mut pool = WorkPool::new(2);
        pool.add_worker(A, "a", 1);
        let job = pool.push("j");
        pool.push("k");
        assign(&mut pool);
        pool.remove_worker(A);
        pool.add_worker(B, "b", 1);
        assign(&mut pool); // j again, now at B
        pool.add_worker(WorkerKey(3), "a2", 1);
        assert_eq!(pool.settled(A, job, true), Settled::Confirmed("j"));
        // B's stream still holds its copy of j: B has no demand for k.
        let next = assign(&mut pool).unwrap();
        assert_eq!(
            (next.0, next.2),
            (WorkerKey(3), "k"),
            "k goes to the worker with demand"
        );
        assert_eq!(pool.settled(B, job, false), Settled::Ignored);
        assert_eq!(
            pool.stats().per_worker[0].in_flight,
            0,
            "B's slot came back"
        );
    }

    #[test]
    fn draining_drops_the_jobs_but_keeps_the_workers_slots_until_they_settle() {
        let mut pool = WorkPool::new(4);
        pool.add_worker(A, "a", 1);
        let job = pool.push("j");
        pool.push("k");
        assign(&mut pool);
        assert_eq!(pool.drain_jobs().count(), 2);
        let next = pool.push("l");
        assert_eq!(assign(&mut pool), None, "A still holds j's copy");
        assert_eq!(pool.settled(A, job, true), Settled::Ignored);
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(next));
    }
}
