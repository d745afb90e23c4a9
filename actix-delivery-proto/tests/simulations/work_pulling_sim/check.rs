//! Running a scenario and judging it: the rules checked as the run went (the pool against
//! its model, capacities, confirmations, effects), then the end-of-run guarantees. A failure
//! names the seed, the broken rules, the scenario, the jobs left and the trace tail.

use std::fmt::Write;

use super::scenario::{Scenario, Store};
use super::tally::Tally;
use super::world::{Outcome, World};

/// Whether `seed` is to be run: all seeds, unless `SIM_SEED` names one.
pub fn selected(seed: u64) -> bool {
    seed_filter().is_none_or(|only| only == seed)
}

/// Whether `SIM_SEED` restricts the runs (aggregate assertions are then skipped).
pub fn is_replay() -> bool {
    seed_filter().is_some()
}

fn seed_filter() -> Option<u64> {
    std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok())
}

fn trace_tail() -> usize {
    std::env::var("SIM_TRACE_TAIL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(80)
}

/// Runs `sc`; returns the outcome and every broken rule.
pub fn run(sc: &Scenario, with_digest: bool) -> (Outcome, Vec<String>) {
    let outcome = World::new(sc, trace_tail(), with_digest).run();
    let mut broken = outcome.broken.clone();
    let jobs = sc.jobs();
    for job in 1..=jobs {
        let (confirmed, given_up) = (outcome.confirmed[job], outcome.given_up[job]);
        if confirmed + given_up != 1 && outcome.stuck.iter().all(|(j, _)| *j != job as u64) {
            broken.push(format!(
                "job {job} confirmed {confirmed} and given up {given_up} times (one of them, \
                 once)"
            ));
        }
        if confirmed > 0 && outcome.runs[job] == 0 {
            broken.push(format!("job {job} confirmed but its handler never ran"));
        }
        if confirmed > 0 && outcome.ok_runs[job] == 0 {
            broken.push(format!(
                "job {job} confirmed but never handled successfully"
            ));
        }
        let effects = outcome.effects[job];
        if confirmed > 0 && effects == 0 {
            broken.push(format!("job {job} confirmed without effect"));
        }
        if effects > 1 && sc.store == Store::Dedup {
            broken.push(format!(
                "job {job}: {effects} effects with the deduplicating store (exactly once)"
            ));
        } else if effects > 1 {
            broken.push(format!(
                "job {job}: effect applied {effects} times (exactly once)"
            ));
        }
    }
    let bound = sc.heal_at + sc.liveness_bound();
    match outcome.done_at {
        Some(done) if done <= bound => {}
        Some(done) => broken.push(format!(
            "liveness: the last job settled at {} ms, after the bound {} ms",
            done.as_millis(),
            bound.as_millis()
        )),
        None => {
            let some: Vec<_> = outcome.stuck.iter().take(12).collect();
            broken.push(format!(
                "liveness: {} job(s) never settled by {} ms (heal at {} ms, bound {} ms), \
                 e.g. {some:?}",
                outcome.stuck.len(),
                outcome.ended_at.as_millis(),
                sc.heal_at.as_millis(),
                bound.as_millis()
            ));
        }
    }
    (outcome, broken)
}

/// Runs `sc` and checks it: `Ok` with its counters, or the failure report.
pub fn run_checked(sc: &Scenario) -> Result<Tally, String> {
    let (outcome, broken) = run(sc, false);
    if broken.is_empty() {
        Ok(outcome.tally)
    } else {
        Err(report(sc, &outcome, &broken))
    }
}

/// The failure report of a run.
pub fn report(sc: &Scenario, outcome: &Outcome, broken: &[String]) -> String {
    let mut out = format!(
        "work-pulling simulation of seed {} ({:?}) broke {} rule(s):\n",
        sc.seed,
        sc.class,
        broken.len()
    );
    for rule in broken.iter().take(20) {
        let _ = writeln!(out, "  - {rule}");
    }
    if broken.len() > 20 {
        let _ = writeln!(out, "  - ... {} more", broken.len() - 20);
    }
    let _ = writeln!(out, "scenario: {sc:?}");
    let _ = writeln!(out, "counters: {:?}", outcome.tally);
    let _ = writeln!(out, "trace tail ({} lines):", outcome.trace.len());
    for line in &outcome.trace {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "replay: SIM_SEED={} SIM_TRACE_TAIL=100000 cargo test -p actix-delivery-proto \
         --test simulations work_pulling:: -- --nocapture",
        sc.seed
    );
    out
}
