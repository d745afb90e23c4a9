//! A deterministic, seeded simulator of work pulling, built only from the crate's pure cores:
//! the pool ([`WorkPool`](actix_delivery_proto::work_pulling::pool::WorkPool)), one
//! `ProducerCore` per worker registration and a `ConsumerCore` at each worker, in virtual
//! time (an `Instant` base plus `Duration` offsets; no actix, no tokio, no real time).
//!
//! # What it models
//!
//! The wiring of the actor shell (`src/work_pulling/controller.rs`): jobs are pushed into the
//! pool directly (the shell's upstream producer is in process and lossless), job `n` under
//! key `n`; `poll_assign` hands a job to a worker's stream (`handle_send` with the token
//! (worker, job)); a settled token goes back to the pool through a mailbox
//! (`pool.settled(worker, key, ok, now)`): a job its stream gave up failed there (the pool
//! re-routes it or gives it up, and rests the worker; `next_deadline` / `handle_timeout` end
//! the rests); a worker that leaves is removed (`remove_worker`, then its stream stops;
//! `stop()` settles the rest as stopped, fed back too). Each registration is a new
//! `WorkerKey` and a stream with a fresh seeded incarnation, id `pool/<name>`, window = the
//! worker's capacity. Links in both directions lose, duplicate and delay (so reorder)
//! messages. Handlers take virtual time,
//! fail before or after their effect (no ACK: retransmission), and stall for seconds to a
//! minute (some beyond `handler_timeout`). Churn: workers join, leave gracefully
//! (deregistration), crash (consumer state and runs lost, messages in flight to and from them
//! dropped; the registry deregisters them only after a detection delay) and restart under
//! the same name (a new worker of the pool); streams with a bounded `max_attempts` give jobs
//! up, and in half of those runs the pool gives a job up after 2–5 failures. Handlers apply their effect to a shared
//! store that records the job's stable id atomically with the effect; a run for a recorded
//! id is a no-op success (as `PersistentHandle::job_handler`). Raw runs are counted too.
//! After `heal_at`, churn ends, links lose nothing, handlers succeed in normal time, and every
//! worker is (re)started and registered.
//!
//! Six classes: churn only, lossy links, crashes, stalls, give-ups, all together; 100 seeds
//! each, 100–300 jobs per run.
//!
//! # Invariants
//!
//! As the run goes: every answer of the pool equals a reference model's (`model.rs`): the
//! first waiting job goes to a worker with demand holding the fewest jobs (a resting worker
//! has none, a failing one room for one job), re-routed jobs (of a leaving worker, or
//! failed) are assigned before any job never assigned, settlements confirm, re-route, give
//! up (exactly at the `give_up_after`-th failure) or are ignored as the rules say, and rests
//! begin and end as they say; the stopped settlements of a stopped stream change
//! nothing; a worker's stream never holds more than its capacity, and the pool's count of it
//! equals what the stream holds once settlements are delivered; a job is settled to the
//! caller (confirmed or given up) at most once, only if pushed, and confirmed only with its
//! effect recorded; no effect is applied twice. After the run: every job settled exactly
//! once, a confirmed one handled at least once, its effect applied exactly once, and the
//! last settlement within
//! [`liveness_bound`](sim::scenario::Scenario::liveness_bound) of the heal
//! (liveness). Per class, the faults of the class were injected (counters > 0), so nothing
//! passes vacuously. Two planted faults (a store that does not deduplicate, a wiring that
//! drops a leaving worker's settlements instead of re-routing) are caught.
//!
//! # Replay
//!
//! A failure prints the seed, the broken rules, the scenario, the counters and the trace
//! tail. Replay one seed with its whole trace: `SIM_SEED=17 SIM_TRACE_TAIL=100000 cargo test
//! -p actix-delivery-proto --test simulations work_pulling:: -- --nocapture`.

#[path = "work_pulling_sim/mod.rs"]
mod sim;

use sim::check::{is_replay, run, run_checked, selected};
use sim::scenario::{Class, Scenario, Store, Wiring, CLASSES};
use sim::tally::ClassTotals;

/// Seeds per class.
const SEEDS_PER_CLASS: u64 = 100;

/// Runs the matrix seeds of `classes` (seed `s` is of class `s % 6`) and checks the fault
/// totals.
fn run_classes(classes: &[Class]) {
    let mut totals = ClassTotals::default();
    let mut failures = Vec::new();
    let seeds = 0..SEEDS_PER_CLASS * CLASSES.len() as u64;
    for seed in seeds.filter(|&s| selected(s)) {
        let sc = Scenario::of_seed(seed);
        if !classes.contains(&sc.class) {
            continue;
        }
        match run_checked(&sc) {
            Ok(tally) => totals.add(sc.class, &tally),
            Err(report) => failures.push((seed, report)),
        }
    }
    if let Some((_, first)) = failures.first() {
        let seeds: Vec<u64> = failures.iter().map(|(s, _)| *s).collect();
        panic!(
            "{} seed(s) failed: {seeds:?}; the first:\n{first}",
            seeds.len()
        );
    }
    if is_replay() {
        return;
    }
    println!("per fault class:\n{totals}");
    assert_eq!(
        totals.total().runs,
        SEEDS_PER_CLASS * classes.len() as u64,
        "every seed ran"
    );
    totals.assert_faults_injected();
}

#[test]
fn jobs_are_confirmed_once_with_one_effect_under_churn_loss_and_crashes() {
    run_classes(&[Class::Churn, Class::Lossy, Class::Crashes]);
}

#[test]
fn each_job_is_settled_once_with_at_most_one_effect_under_stalls_give_ups_and_everything() {
    run_classes(&[Class::Stalls, Class::GiveUps, Class::All]);
}

#[test]
fn a_seed_replays_identically() {
    for seed in [5, 11] {
        let sc = Scenario::of_seed(seed);
        let (a, _) = run(&sc, true);
        let (b, _) = run(&sc, true);
        assert_eq!(a.tally, b.tally, "seed {seed}");
        assert_eq!(a.digest, b.digest, "seed {seed}: the traces differ");
        assert_eq!(a.ended_at, b.ended_at);
    }
}

#[test]
fn the_checker_catches_a_store_that_does_not_deduplicate() {
    let mut caught = 0;
    for seed in (0..60).filter(|s| s % 6 == 2 || s % 6 == 5) {
        let sc = Scenario {
            store: Store::NoDedup,
            ..Scenario::of_seed(seed)
        };
        let (_, broken) = run(&sc, false);
        if broken.iter().any(|rule| rule.contains("effect applied")) {
            caught += 1;
        }
    }
    assert!(
        caught >= 10,
        "a doubled effect was caught in only {caught} of 20 runs"
    );
}

#[test]
fn the_checker_catches_a_wiring_that_drops_a_leaving_workers_jobs() {
    let mut caught = 0;
    for seed in (0..60).filter(|s| s % 6 == 0) {
        let sc = Scenario {
            wiring: Wiring::DropLeaving,
            ..Scenario::of_seed(seed)
        };
        let (_, broken) = run(&sc, false);
        if broken.iter().any(|rule| rule.starts_with("liveness")) {
            caught += 1;
        }
    }
    assert!(
        caught >= 8,
        "stuck jobs were caught in only {caught} of 10 runs"
    );
}
