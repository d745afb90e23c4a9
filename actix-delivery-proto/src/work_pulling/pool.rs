//! The pure core of work pulling: which worker gets the next job, where the jobs of a
//! worker that left go, which workers rest after failures and which jobs are given up. No
//! actor, no timer, no I/O: the shell feeds it jobs, workers, settlements and the time, sends
//! what [`WorkPool::poll_assign`] hands out, and calls [`WorkPool::handle_timeout`] at
//! [`WorkPool::next_deadline`].
//!
//! Rules:
//! - a job goes to a worker with demand (fewer jobs held than it takes now), the one holding
//!   the fewest, ties broken at random (seeded);
//! - jobs wait in arrival order; a job whose worker left or failed it waits again **at the
//!   front**, and several such jobs keep their original order (the waiting queue is ordered
//!   by arrival);
//! - a job is confirmed once, by the first worker that confirms it; a worker still holding a
//!   copy of a job confirmed elsewhere keeps its slot until its own settlement arrives, so the
//!   pool's count of what a worker holds is what the worker's stream holds;
//! - **a failing worker gets fewer jobs**: each job that fails at a worker (its stream gave it
//!   up) puts the worker to rest, taking no new job for [`REST_FIRST`], doubling with each
//!   failure since its last confirmation up to [`REST_MAX`]; after the rest it takes one job
//!   at a time until it confirms one, then its whole capacity again. What it holds meanwhile
//!   stays with it;
//! - with [`give_up_after(n)`](WorkPool::give_up_after), a job that failed `n` times, at any
//!   workers, is given up: it leaves the pool and is never assigned again. Jobs of a worker
//!   that left are not failures (they did not fail, their worker went away).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::protocol::keyed_ring::KeyedRing;

/// How long a worker rests after a failure that follows a confirmation (or its start): it
/// takes no new job meanwhile. Each further failure before a confirmation doubles it.
pub const REST_FIRST: Duration = Duration::from_secs(1);
/// The longest rest.
pub const REST_MAX: Duration = Duration::from_secs(60);

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
    /// The job failed for the `attempts`-th time (the pool's `give_up_after`): it left the
    /// pool and is never assigned again; settle it as given up with its sender.
    GivenUp {
        /// The job.
        job: J,
        /// How many times it failed.
        attempts: u32,
    },
    /// Nothing: the job was confirmed before, is no longer this worker's, or was never
    /// assigned (no worker's stream holds it).
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
    /// Jobs that failed at it (its stream gave them up): each went to another worker, or was
    /// given up.
    pub failed: u64,
    /// Its failures since its last confirmation; while not 0 it takes one job at a time
    /// (after a rest).
    pub failing: u32,
    /// Rests it began: spells after a failure in which it took no new job.
    pub rests: u64,
    /// Whether it rests now.
    pub resting: bool,
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
    /// Jobs re-routed: held by a worker that left, or failed at one and not given up.
    pub rerouted: u64,
    /// Failures of jobs at workers (a job failing twice counts twice).
    pub failed: u64,
    /// Jobs given up (`give_up_after`).
    pub given_up: u64,
    /// Rests begun by workers after a failure.
    pub rests: u64,
    /// Workers that joined.
    pub joined: u64,
    /// Workers that left (deregistered, stopped).
    pub left: u64,
    /// ACKs from workers that the pool ignored: of no open worker stream (a forged or
    /// mangled stream id, or a stream that ended), or of no job in flight on it. Counted by
    /// the actor that drives the streams; 0 from [`WorkPool::stats`].
    pub ignored_acks: u64,
    /// Per worker, in the order they joined.
    pub per_worker: Vec<WorkerStats>,
}

struct Slot<J> {
    job: J,
    /// The worker that holds it now; `None` while it waits.
    holder: Option<WorkerKey>,
    /// How many times it failed at a worker.
    failures: u32,
}

struct Worker {
    name: Arc<str>,
    /// When it joined: the order of `per_worker`.
    joined: u64,
    capacity: usize,
    /// The jobs its stream holds (sent, not settled), including copies of jobs that were
    /// confirmed by another worker meanwhile.
    holding: KeyedRing<()>,
    /// Failures since its last confirmation.
    failing: u32,
    /// It takes no new job before this.
    resting_until: Option<Instant>,
    confirmed: u64,
    failed: u64,
    rests: u64,
}

impl Worker {
    /// How many jobs it takes now: none while it rests, one while it is failing, else its
    /// capacity.
    fn demand(&self) -> usize {
        match (self.resting_until, self.failing) {
            (Some(_), _) => 0,
            (None, 0) => self.capacity,
            (None, _) => 1,
        }
    }

    fn has_demand(&self) -> bool {
        self.holding.len() < self.demand()
    }

    /// A job failed at it at `now`: it rests (longer), and returns whether a rest began.
    fn fail(&mut self, now: Instant) -> bool {
        self.failed += 1;
        self.failing = self.failing.saturating_add(1);
        let doubled = REST_FIRST.saturating_mul(1 << (self.failing - 1).min(16));
        let until = now + doubled.min(REST_MAX);
        let began = self.resting_until.is_none();
        self.resting_until = Some(self.resting_until.map_or(until, |u| u.max(until)));
        self.rests += u64::from(began);
        began
    }
}

/// The pool: jobs waiting or held by workers, and the workers.
pub struct WorkPool<J> {
    /// By key: the keys are dense and increasing, and most jobs leave in order.
    jobs: KeyedRing<Slot<J>>,
    /// The jobs waiting again (a worker left or failed them), by key: all below `fresh`, so
    /// they go before the fresh ones, in their original order.
    returned: KeyedRing<()>,
    /// The first job never assigned: every job from it to `next_key` waits, in order.
    fresh: JobKey,
    workers: BTreeMap<WorkerKey, Worker>,
    next_key: JobKey,
    rng: SmallRng,
    /// Workers tied for the fewest held jobs (reused buffer of `poll_assign`).
    ties: Vec<WorkerKey>,
    give_up_after: Option<NonZeroU32>,
    assigned: u64,
    confirmed: u64,
    rerouted: u64,
    failed: u64,
    given_up: u64,
    rests: u64,
    joined: u64,
    left: u64,
}

impl<J> WorkPool<J> {
    /// An empty pool whose tie-breaks are drawn from `seed`; it never gives a job up.
    pub fn new(seed: u64) -> Self {
        Self {
            jobs: KeyedRing::default(),
            returned: KeyedRing::default(),
            fresh: 1,
            workers: BTreeMap::new(),
            next_key: 1,
            rng: SmallRng::seed_from_u64(seed),
            ties: Vec::new(),
            give_up_after: None,
            assigned: 0,
            confirmed: 0,
            rerouted: 0,
            failed: 0,
            given_up: 0,
            rests: 0,
            joined: 0,
            left: 0,
        }
    }

    /// Gives a job up once it failed `failures` times (at any workers).
    pub fn give_up_after(mut self, failures: NonZeroU32) -> Self {
        self.give_up_after = Some(failures);
        self
    }

    /// Adds a job behind the waiting ones; returns its key.
    pub fn push(&mut self, job: J) -> JobKey {
        let key = self.next_key;
        self.next_key += 1;
        let slot = Slot {
            job,
            holder: None,
            failures: 0,
        };
        self.jobs.insert(key, slot);
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
            holding: KeyedRing::default(),
            failing: 0,
            resting_until: None,
            confirmed: 0,
            failed: 0,
            rests: 0,
        };
        assert!(
            self.workers.insert(key, worker).is_none(),
            "worker keys are unique"
        );
        self.joined += 1;
    }

    /// Removes a worker; the jobs it held wait again, at the front, in their order. Returns
    /// how many were re-routed (0 for an unknown key).
    pub fn remove_worker(&mut self, key: WorkerKey) -> usize {
        let Some(worker) = self.workers.remove(&key) else {
            return 0;
        };
        self.left += 1;
        let mut rerouted = 0;
        for job in worker.holding.keys() {
            if let Some(slot) = self.jobs.get_mut(job).filter(|s| s.holder == Some(key)) {
                slot.holder = None;
                self.returned.insert(job, ());
                rerouted += 1;
            }
        }
        self.rerouted += rerouted as u64;
        rerouted
    }

    /// The next job for a worker with demand, if a job waits and a worker has demand. The
    /// job is then held by that worker until [`settled`](Self::settled).
    pub fn poll_assign(&mut self) -> Option<Assignment<'_, J>> {
        let returned = self.returned.front().map(|(key, ())| key);
        let key = match returned {
            Some(key) => key,
            None if self.fresh < self.next_key => self.fresh,
            None => return None,
        };
        self.ties.clear();
        let mut fewest = usize::MAX;
        for (&worker, w) in self.workers.iter().filter(|(_, w)| w.has_demand()) {
            if w.holding.len() < fewest {
                fewest = w.holding.len();
                self.ties.clear();
            }
            if w.holding.len() == fewest {
                self.ties.push(worker);
            }
        }
        let worker = match *self.ties.as_slice() {
            [] => return None,
            [only] => only,
            ref ties => ties[self.rng.random_range(0..ties.len())],
        };
        match returned {
            Some(_) => drop(self.returned.pop_front()),
            None => self.fresh += 1,
        }
        self.workers
            .get_mut(&worker)
            .expect("a tied worker is present")
            .holding
            .insert(key, ());
        let slot = self.jobs.get_mut(key).expect("a waiting job is held");
        slot.holder = Some(worker);
        self.assigned += 1;
        Some(Assignment {
            worker,
            key,
            job: &slot.job,
        })
    }

    /// Reports the outcome of job `key` at `worker`, at `now`: `ok` when the worker's stream
    /// confirmed it, else it failed there (its stream gave it up). A settlement of a job never
    /// assigned is ignored. A confirmation of one assigned counts whoever sends it (a worker
    /// that was removed, a copy held by a worker the job was re-routed from) and ends the
    /// worker's failing; a failure puts a present worker that held the job to rest, and
    /// re-routes the job (or gives it up) only if `worker` holds it now.
    pub fn settled(
        &mut self,
        worker: WorkerKey,
        key: JobKey,
        ok: bool,
        now: Instant,
    ) -> Settled<J> {
        if key >= self.fresh {
            return Settled::Ignored; // never assigned: no worker holds it
        }
        let present = self.workers.get_mut(&worker);
        if ok {
            let confirmed = self.jobs.remove(key);
            if let Some(worker) = present {
                worker.holding.remove(key);
                worker.failing = 0;
                worker.confirmed += u64::from(confirmed.is_some());
            }
            let Some(slot) = confirmed else {
                return Settled::Ignored;
            };
            if slot.holder.is_none() {
                self.returned.remove(key); // a late confirmation of a job that waits again
            }
            self.confirmed += 1;
            return Settled::Confirmed(slot.job);
        }
        if let Some(worker) = present
            && worker.holding.remove(key).is_some()
        {
            self.rests += u64::from(worker.fail(now));
            self.failed += 1;
        }
        let Some(slot) = self.jobs.get_mut(key).filter(|s| s.holder == Some(worker)) else {
            return Settled::Ignored;
        };
        slot.failures += 1;
        if self.give_up_after.is_some_and(|n| slot.failures >= n.get()) {
            let slot = self.jobs.remove(key).expect("looked at it");
            self.given_up += 1;
            return Settled::GivenUp {
                job: slot.job,
                attempts: slot.failures,
            };
        }
        slot.holder = None;
        self.returned.insert(key, ());
        self.rerouted += 1;
        Settled::Rerouted
    }

    /// Ends the rests due by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for worker in self.workers.values_mut() {
            if worker.resting_until.is_some_and(|until| until <= now) {
                worker.resting_until = None;
            }
        }
    }

    /// When the next rest ends ([`handle_timeout`](Self::handle_timeout) is due); `None`: no
    /// worker rests.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.workers.values().filter_map(|w| w.resting_until).min()
    }

    /// Drops every job (their senders settled them otherwise), keeping the workers and what
    /// their streams hold until those settle. Returns the jobs.
    pub fn drain_jobs(&mut self) -> impl Iterator<Item = J> + '_ {
        self.returned.clear();
        self.fresh = self.next_key;
        self.jobs.drain().map(|(_, slot)| slot.job)
    }

    /// Every worker's stream was dropped (a shell that drives the streams itself, at a new
    /// life of its producer): what they held will never settle, and no longer takes their
    /// room.
    pub fn release_streams(&mut self) {
        for worker in self.workers.values_mut() {
            worker.holding.clear();
        }
    }

    /// How many jobs wait for a worker.
    fn queued(&self) -> usize {
        let fresh = usize::try_from(self.next_key - self.fresh).unwrap_or(usize::MAX);
        self.returned.len().saturating_add(fresh)
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
                        failed: w.failed,
                        failing: w.failing,
                        rests: w.rests,
                        resting: w.resting_until.is_some(),
                    },
                )
            })
            .collect();
        per_worker.sort_by_key(|(joined, _)| *joined);
        PoolStats {
            workers: self.workers.len(),
            queued: self.queued(),
            jobs: self.jobs.len(),
            assigned: self.assigned,
            confirmed: self.confirmed,
            rerouted: self.rerouted,
            failed: self.failed,
            given_up: self.given_up,
            rests: self.rests,
            joined: self.joined,
            left: self.left,
            ignored_acks: 0,
            per_worker: per_worker.into_iter().map(|(_, s)| s).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::*;

    const A: WorkerKey = WorkerKey(1);
    const B: WorkerKey = WorkerKey(2);

    /// The tests' start of time.
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);

    /// `ms` milliseconds after the start.
    fn at(ms: u64) -> Instant {
        *START + Duration::from_millis(ms)
    }

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
        assert_eq!(pool.settled(A, first, true, at(0)), Settled::Confirmed("a"));
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
        pool.settled(A, held_by_a.1, true, at(0));
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
        pool.settled(A, keys[1], true, at(0));
        assert_eq!(pool.remove_worker(A), 2);
        assert_eq!(pool.remove_worker(A), 0, "removing twice re-routes nothing");
        pool.add_worker(B, "b", 8);
        let order: Vec<_> = std::iter::from_fn(|| assign(&mut pool).map(|a| a.2)).collect();
        assert_eq!(order, ["1", "3", "4", "5"]);
        let stats = pool.stats();
        assert_eq!((stats.rerouted, stats.joined, stats.left), (2, 2, 1));
    }

    #[test]
    fn a_late_confirmation_of_a_job_waiting_again_takes_it_out_of_the_queue() {
        let mut pool = WorkPool::new(3);
        pool.add_worker(A, "a", 2);
        let one = pool.push("1");
        let two = pool.push("2");
        assign(&mut pool);
        assign(&mut pool);
        assert_eq!(pool.remove_worker(A), 2, "both wait again");
        assert_eq!(pool.settled(A, one, true, at(0)), Settled::Confirmed("1"));
        assert_eq!(pool.stats().queued, 1);
        pool.add_worker(B, "b", 2);
        assert_eq!(assign(&mut pool), Some((B, two, "2")));
        assert_eq!(assign(&mut pool), None, "1 is done: never handed out again");
    }

    #[test]
    fn a_settlement_of_a_job_never_assigned_is_ignored_and_the_job_still_waits() {
        let mut pool = WorkPool::new(4);
        let one = pool.push("1");
        let two = pool.push("2");
        assert_eq!(pool.settled(A, two, true, at(0)), Settled::Ignored);
        assert_eq!(pool.settled(A, one, false, at(0)), Settled::Ignored);
        assert_eq!((pool.stats().queued, pool.stats().confirmed), (2, 0));
        pool.add_worker(A, "a", 2);
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(one));
        assert_eq!(
            assign(&mut pool).map(|a| a.1),
            Some(two),
            "still there, in order"
        );
        assert_eq!(pool.stats().queued, 0);
    }

    #[test]
    fn a_stuck_job_costs_its_slot_not_the_jobs_confirmed_after_it() {
        let mut pool = WorkPool::new(9);
        pool.add_worker(A, "a", 2);
        let stuck = pool.push("stuck");
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(stuck));
        for _ in 0..20_000 {
            let key = pool.push("x");
            assert_eq!(assign(&mut pool).map(|a| a.1), Some(key));
            assert_eq!(pool.settled(A, key, true, at(0)), Settled::Confirmed("x"));
        }
        assert_eq!(pool.stats().jobs, 1);
        assert!(pool.jobs.slot_count() <= 34);
        assert_eq!((pool.queued(), pool.workers[&A].holding.len()), (0, 1));
    }

    #[test]
    fn a_failed_job_waits_at_the_front_and_a_late_settlement_changes_nothing() {
        let mut pool = WorkPool::new(5);
        pool.add_worker(A, "a", 1);
        let one = pool.push("1");
        pool.push("2");
        assert_eq!(assign(&mut pool).unwrap().1, one);
        assert_eq!(pool.settled(A, one, false, at(0)), Settled::Rerouted);
        assert_eq!(
            pool.settled(A, one, false, at(0)),
            Settled::Ignored,
            "a second failure of a job A no longer holds"
        );
        pool.add_worker(B, "b", 1);
        assert_eq!(
            assign(&mut pool).map(|a| (a.0, a.2)),
            Some((B, "1")),
            "at the front, to the worker that does not rest"
        );
        let stats = pool.stats();
        assert_eq!((stats.rerouted, stats.failed), (1, 1));
        assert_eq!(stats.per_worker[0].failed, 1);
    }

    #[test]
    fn a_failing_worker_rests_then_takes_one_job_until_it_confirms_one() {
        let mut pool = WorkPool::new(11);
        pool.add_worker(A, "a", 4);
        let keys: Vec<_> = ["1", "2", "3", "4", "5"]
            .into_iter()
            .map(|j| pool.push(j))
            .collect();
        let held: Vec<_> = std::iter::from_fn(|| assign(&mut pool))
            .map(|a| a.1)
            .collect();
        assert_eq!(held, keys[..4]);
        // Two of its jobs fail a moment apart: one rest, doubled by the second failure.
        assert_eq!(pool.settled(A, keys[0], false, at(0)), Settled::Rerouted);
        assert_eq!(pool.next_deadline(), Some(at(1_000)));
        assert_eq!(pool.settled(A, keys[1], false, at(100)), Settled::Rerouted);
        assert_eq!(pool.next_deadline(), Some(at(2_100)));
        let stats = pool.stats();
        let a = &stats.per_worker[0];
        assert_eq!((a.failed, a.failing, a.rests, a.resting), (2, 2, 1, true));
        assert_eq!((stats.failed, stats.rests, stats.queued), (2, 1, 3));
        // What it holds stays with it; it takes nothing new while it rests, also after one
        // of its jobs is confirmed.
        assert_eq!(
            pool.settled(A, keys[2], true, at(200)),
            Settled::Confirmed("3")
        );
        assert_eq!(assign(&mut pool), None);
        pool.handle_timeout(at(2_099));
        assert_eq!(assign(&mut pool), None, "still resting");
        pool.handle_timeout(at(2_100));
        assert_eq!(pool.next_deadline(), None);
        // The confirmation ended its failing: its whole capacity again (it holds job 4).
        let taken: Vec<_> = std::iter::from_fn(|| assign(&mut pool))
            .map(|a| a.2)
            .collect();
        assert_eq!(taken, ["1", "2", "5"]);

        // Failing again: a rest of one second, then one job at a time.
        for key in [keys[0], keys[1], keys[4]] {
            pool.settled(A, key, true, at(2_500));
        }
        assert_eq!(
            pool.settled(A, keys[3], false, at(3_000)),
            Settled::Rerouted
        );
        assert_eq!(pool.next_deadline(), Some(at(4_000)));
        pool.handle_timeout(at(4_000));
        let next = pool.push("6");
        assert_eq!(
            assign(&mut pool).map(|a| a.2),
            Some("4"),
            "the re-routed job"
        );
        assert_eq!(assign(&mut pool), None, "one at a time while failing");
        pool.settled(A, keys[3], true, at(4_500));
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(next));
        assert_eq!(pool.stats().per_worker[0].failing, 0);
    }

    #[test]
    fn rests_double_with_each_failure_up_to_the_longest() {
        let mut pool = WorkPool::new(12);
        pool.add_worker(A, "a", 1);
        let job = pool.push("j");
        let mut now = at(0);
        let mut rests = Vec::new();
        for _ in 0..9 {
            pool.handle_timeout(now);
            assert_eq!(assign(&mut pool).map(|a| a.1), Some(job));
            pool.settled(A, job, false, now);
            let until = pool.next_deadline().unwrap();
            rests.push((until - now).as_secs());
            now = until;
        }
        assert_eq!(rests, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(pool.stats().per_worker[0].rests, 9);
    }

    #[test]
    fn a_job_that_failed_give_up_after_times_is_given_up_and_never_assigned_again() {
        let mut pool = WorkPool::new(13).give_up_after(NonZeroU32::new(3).unwrap());
        pool.add_worker(A, "a", 1);
        pool.add_worker(B, "b", 1);
        let poison = pool.push("poison");
        let mut now = at(0);
        for failure in 1..=3 {
            pool.handle_timeout(now);
            let (worker, key, _) = assign(&mut pool).unwrap();
            assert_eq!(key, poison);
            let settled = pool.settled(worker, key, false, now);
            if failure < 3 {
                assert_eq!(settled, Settled::Rerouted);
            } else {
                assert_eq!(
                    settled,
                    Settled::GivenUp {
                        job: "poison",
                        attempts: 3
                    }
                );
            }
            now += REST_MAX;
        }
        pool.handle_timeout(now);
        assert_eq!(assign(&mut pool), None, "never again");
        let stats = pool.stats();
        assert_eq!(
            (stats.failed, stats.given_up, stats.rerouted, stats.jobs),
            (3, 1, 2, 0)
        );
        // A job whose worker left did not fail: that counts nothing against it.
        let job = pool.push("j");
        for fresh in 3..6 {
            let (holder, _, _) = assign(&mut pool).unwrap();
            pool.remove_worker(holder);
            pool.add_worker(WorkerKey(fresh), "fresh", 1);
        }
        let (holder, _, _) = assign(&mut pool).unwrap();
        assert_eq!(pool.settled(holder, job, false, now), Settled::Rerouted);
        assert_eq!(pool.stats().given_up, 1);
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
        assert_eq!(pool.settled(A, job, true, at(0)), Settled::Confirmed("j"));
        assert_eq!(pool.settled(B, job, true, at(0)), Settled::Ignored);
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
        assert_eq!(pool.settled(A, job, true, at(0)), Settled::Confirmed("j"));
        // B's stream still holds its copy of j: B has no demand for k.
        let next = assign(&mut pool).unwrap();
        assert_eq!(
            (next.0, next.2),
            (WorkerKey(3), "k"),
            "k goes to the worker with demand"
        );
        assert_eq!(pool.settled(B, job, false, at(0)), Settled::Ignored);
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
        assert_eq!(pool.settled(A, job, true, at(0)), Settled::Ignored);
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(next));
    }

    #[test]
    fn released_streams_give_their_workers_slots_back() {
        let mut pool = WorkPool::new(4);
        pool.add_worker(A, "a", 1);
        pool.push("j");
        assign(&mut pool);
        assert_eq!(pool.drain_jobs().count(), 1);
        let next = pool.push("k");
        assert_eq!(assign(&mut pool), None, "A still holds j's copy");
        pool.release_streams();
        assert_eq!(pool.stats().per_worker[0].in_flight, 0);
        assert_eq!(assign(&mut pool).map(|a| a.1), Some(next));
    }
}
