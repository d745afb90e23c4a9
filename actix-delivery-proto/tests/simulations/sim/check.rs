//! The invariants of a run, checked once it has ended (the rules that must hold at every
//! event are checked by the driver as it goes, and reported here under their names). Which
//! ones apply depends on what the scenario can legitimately cost: without restarts, evictions
//! or sweeps every message's handler succeeds exactly once (a durable crash keeps the
//! incarnation: no restart in this sense); with them, a message may run twice but is never
//! lost; below a forged `window_start` a message can only be given up; a durable message whose
//! store a crash lost was never stored, and is never sent.

use std::collections::{HashMap, HashSet};

use super::driver::{End, Run, FORGED_BODY};
use super::observe::{Key, KeyRecord};
use super::scenario::{Disruption, Scenario, INCARNATIONS_KEPT_PER_ID};

/// Every rule `run` breaks, in a deterministic order (empty: the run is correct).
pub fn check(scenario: &Scenario, run: &Run) -> Vec<String> {
    let mut broken = Broken::default();
    if run.end != End::Quiescent {
        broken.add("end", format!("{:?}", run.end));
    }
    for (rule, violation) in &run.observations.violations {
        broken.add(rule, violation.clone());
    }
    if run.observations.more_violations > 0 {
        broken.add(
            "during the run",
            format!(
                "... and {} more rule breaks",
                run.observations.more_violations
            ),
        );
    }
    disruptions_happened(scenario, run, &mut broken);
    settlements(scenario, run, &mut broken);
    durable_settlements(scenario, run, &mut broken);
    confirmed_means_handled(run, &mut broken);
    stale_keys_never_run(scenario, run, &mut broken);
    forged_messages(scenario, run, &mut broken);
    handler_timeouts(scenario, run, &mut broken);
    handler_successes(scenario, run, &mut broken);
    consumer_restarts(run, &mut broken);
    if scenario.consumer.ordered {
        order(scenario, run, &mut broken);
    }
    final_state(scenario, run, &mut broken);
    broken.into_lines()
}

/// The broken rules of a run: a few examples of each, and how many more there are.
#[derive(Debug, Default)]
struct Broken {
    lines: Vec<String>,
    /// Per rule, in order of first appearance: how many times it broke.
    counts: Vec<(&'static str, usize)>,
}

impl Broken {
    /// Examples kept per rule.
    const EXAMPLES: usize = 3;

    fn add(&mut self, rule: &'static str, message: String) {
        let count = match self.counts.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, count)) => count,
            None => {
                self.counts.push((rule, 0));
                &mut self.counts.last_mut().expect("just pushed").1
            }
        };
        *count += 1;
        if *count <= Self::EXAMPLES {
            self.lines.push(format!("[{rule}] {message}"));
        }
    }

    fn into_lines(mut self) -> Vec<String> {
        for (rule, count) in self.counts {
            if count > Self::EXAMPLES {
                let more = count - Self::EXAMPLES;
                self.lines
                    .push(format!("[{rule}] ... and {more} more like these"));
            }
        }
        self.lines
    }
}

/// Keys in a deterministic order.
fn sorted_keys(run: &Run) -> Vec<(&Key, &KeyRecord)> {
    let mut keys: Vec<_> = run.observations.keys.iter().collect();
    keys.sort_unstable_by_key(|&(key, _)| *key);
    keys
}

/// Every configured restart and forgery really happened (so tests cannot pass vacuously).
fn disruptions_happened(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    if run.observations.forgeries != scenario.forgeries.len() {
        broken.add(
            "forgeries happened",
            format!(
                "configured {} forgeries, {} happened",
                scenario.forgeries.len(),
                run.observations.forgeries
            ),
        );
    }
    let (producer, consumer, durable) =
        scenario
            .disruptions
            .iter()
            .fold((0, 0, 0), |(p, c, d), disruption| match disruption {
                Disruption::ProducerRestart { .. } => (p + 1, c, d),
                Disruption::ConsumerRestart { .. } => (p, c + 1, d),
                Disruption::DurableCrash { .. } => (p, c, d + 1),
            });
    let happened = (
        run.observations.producer_restarts,
        run.observations.consumer_restarts.len(),
        run.observations.durable_crashes,
    );
    if happened != (producer, consumer, durable) {
        broken.add(
            "restarts happened",
            format!(
                "configured {producer} producer restarts, {consumer} consumer restarts and \
                 {durable} durable crashes, but (producer, consumer, durable) = {happened:?} \
                 happened"
            ),
        );
    }
}

/// Every message is settled exactly once for good: `Ok`, or `GaveUp` when attempts are
/// bounded; stopped (`ProducerStopped`, `StoppedUnconfirmed`) only through a producer restart
/// (and then re-sent).
fn settlements(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    let bodies = &run.observations.bodies;
    if bodies.len() != scenario.messages {
        broken.add(
            "all offered",
            format!(
                "{} of {} messages were offered",
                bodies.len(),
                scenario.messages
            ),
        );
    }
    let mut sorted: Vec<_> = bodies.iter().collect();
    sorted.sort_unstable_by_key(|&(body, _)| *body);
    for (body, record) in sorted {
        let gave_up_allowed = !scenario.attempts_are_unbounded();
        let stopped_allowed = scenario.restarts_producers();
        if record.finals() != 1
            || record.other != 0
            || (record.gave_up > 0 && !gave_up_allowed)
            || (record.stopped > 0 && !stopped_allowed)
        {
            broken.add(
                "settled exactly once",
                format!("body {body:#x} settled wrongly: {record:?}"),
            );
        }
        if scenario.attempts_are_unbounded() && record.successes == 0 && record.never_stored == 0 {
            broken.add(
                "no loss",
                format!("body {body:#x} was never handled (lost): {record:?}"),
            );
        }
    }
    // A core counts what it settled; a durable producer's settlement may be lost with a
    // crash before its record (then its next life settles the message again).
    let stats = &run.producer_stats;
    let confirmed: u64 = stats.iter().map(|s| s.confirmed).sum();
    let given_up: u64 = stats.iter().map(|s| s.given_up).sum();
    let acked: u64 = bodies.values().map(|r| u64::from(r.acked)).sum();
    let gave_up: u64 = bodies.values().map(|r| u64::from(r.gave_up)).sum();
    if (confirmed, given_up) != (acked, gave_up) {
        broken.add(
            "producer counters",
            format!(
                "producer stats say {confirmed} confirmed and {given_up} given up, \
                 the simulator saw {acked} and {gave_up}"
            ),
        );
    }
}

/// The durable guarantees, per message of a durable producer or outbox lane:
///
/// - **stored is confirmed exactly once**: a message whose store committed is confirmed `Ok`
///   exactly once across its producer's lives (to its callback or, resumed after a restart, to
///   the sink), its handler having succeeded (see `confirmed means handled`): none lost;
/// - **never stored is never sent**: a message whose store a crash lost (its sender got an
///   error) is never confirmed, transmitted or handled;
/// - **confirmed where it was stored, else to the sink**: the callback hears of a message
///   only in the life that stored it, the sink only in a later one (and only of a resumed
///   message);
/// - **durable storage ends idle**: every unit ends up, with nothing waiting to be stored,
///   recorded or committed and nothing unsettled in its journal.
///
/// That each message key of a durable producer succeeds exactly once while the consumer
/// lives is `exactly once` (`handler_successes`): a durable crash keeps the incarnation.
fn durable_settlements(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    if scenario.durable.is_none() {
        return;
    }
    let mut bodies: Vec<_> = run.observations.bodies.iter().collect();
    bodies.sort_unstable_by_key(|&(body, _)| *body);
    for (body, record) in bodies {
        match record.stored {
            Some((seq, stored_life)) => {
                let confirmed = record.ok + record.sink;
                if confirmed != 1 || record.never_stored != 0 || record.successes == 0 {
                    broken.add(
                        "stored is confirmed exactly once",
                        format!(
                            "body {body:#x}, stored as seq {seq}, was confirmed {confirmed} \
                             times: {record:?}"
                        ),
                    );
                }
                let life = record.confirmed_life;
                let right = if record.sink > 0 {
                    life.is_some_and(|life| life > stored_life) && record.resumed > 0
                } else {
                    life.is_none_or(|life| life == stored_life)
                };
                if !right {
                    broken.add(
                        "confirmed where it was stored, else to the sink",
                        format!(
                            "body {body:#x} stored in life {stored_life}, confirmed in life \
                             {life:?}: {record:?}"
                        ),
                    );
                }
            }
            None => {
                if record.never_stored != 1
                    || record.ok + record.sink + record.acked + record.transmissions > 0
                    || record.successes > 0
                {
                    broken.add(
                        "never stored is never sent",
                        format!("body {body:#x} was never stored: {record:?}"),
                    );
                }
            }
        }
    }
    for (index, unit) in run.units.iter().enumerate() {
        if !unit.up || !unit.idle || unit.journaled_unsettled != 0 {
            broken.add(
                "durable storage ends idle",
                format!("unit {index} ended {unit:?}"),
            );
        }
    }
}

/// A message confirmed `Ok` had its handler succeed, under that very key and before the
/// confirmation: nothing the producer confirmed is lost, and no message (in particular none
/// of a new incarnation) is absorbed as a duplicate of another.
fn confirmed_means_handled(run: &Run, broken: &mut Broken) {
    for (key, record) in sorted_keys(run) {
        if let Some(confirmed) = record.confirmed_at
            && !record.successes.iter().any(|s| s.step < confirmed)
        {
            broken.add(
                "confirmed means handled",
                format!(
                    "{key:?} (body {:#x}) confirmed in step {confirmed} but its handler \
                         never succeeded before",
                    record.body
                ),
            );
        }
    }
}

/// A message key all of whose copies reached the consumer at or below their window's floor
/// (a forged `window_start`, or a delayed copy after its producer settled it) never ran and
/// was never confirmed: such a message can only be given up (or, across a producer restart,
/// re-sent under a new key). Each such arrival is held and counted at once (rule **stale is
/// held**); this rule adds what follows for the message, and that the consumer counted at
/// least as many stale deliveries as the simulator predicted.
fn stale_keys_never_run(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    const RULE: &str = "stale keys are given up";
    for (key, record) in sorted_keys(run) {
        if record.arrivals > 0 && record.stale_arrivals == record.arrivals {
            let gave_up = scenario.restarts_producers()
                || run
                    .observations
                    .bodies
                    .get(&record.body)
                    .is_some_and(|body| body.gave_up > 0);
            if record.runs > 0 || record.confirmed_at.is_some() || !gave_up {
                broken.add(
                    RULE,
                    format!(
                        "{key:?} (body {:#x}): all {} copies arrived stale, yet it ran {} \
                         times, confirmed {:?}, given up: {gave_up}",
                        record.body, record.arrivals, record.runs, record.confirmed_at
                    ),
                );
            }
        }
    }
    let (stale, predicted) = (run.consumer_stats.stale, run.observations.predicted_stale);
    if stale < predicted {
        broken.add(
            RULE,
            format!("the consumer counted {stale} stale deliveries, {predicted} arrived stale"),
        );
    }
}

/// Forged deliveries are never real messages: no forged body is settled by a producer, and
/// while the consumer keeps its windows each forged (incarnation, seq) succeeds at most once,
/// and runs at most once unless a run of it failed or timed out.
fn forged_messages(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    const RULE: &str = "forged messages run at most once";
    let obs = &run.observations;
    if obs.bodies.keys().any(|body| body & FORGED_BODY != 0) {
        broken.add(RULE, "a producer settled a forged body".into());
    }
    if !scenario.dedup_is_kept() {
        return;
    }
    let mut forged: Vec<_> = obs.forged.iter().collect();
    forged.sort_unstable_by_key(|&(key, _)| *key);
    for (key, record) in forged {
        let may_rerun = scenario.handler.failure > 0.0 || obs.timed_out.contains(key);
        let successes = record.successes.len();
        if successes > 1 || (record.runs > 1 && !may_rerun) {
            broken.add(
                RULE,
                format!(
                    "forged {key:?} (body {:#x}) ran {} times, succeeded {successes} times",
                    record.body, record.runs
                ),
            );
        }
    }
}

/// `stats.handler_timeouts` is exactly the number of runs whose drawn duration exceeds
/// `handler_timeout` and that were still the current run at their deadline (not cut short by
/// a consumer restart before it fired), and the simulator saw each of them abandoned.
fn handler_timeouts(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    let obs = &run.observations;
    let predicted = obs.overdue_runs - obs.overdue_cut_by_restart;
    let counted = run.consumer_stats.handler_timeouts;
    let seen = obs.timed_out.len() as u64;
    if (counted, seen) != (predicted, predicted) {
        broken.add(
            "handler timeouts",
            format!(
                "{predicted} runs outlasted handler_timeout {:?} as the current run, the \
                 consumer counted {counted} timeouts and abandoned {seen} runs",
                scenario.consumer.handler_timeout
            ),
        );
    }
}

/// How often handlers may succeed per message.
///
/// - Dedup kept for the whole run: exactly once per key and per body (at most once when
///   messages may be given up).
/// - A window kept for every producer incarnation (producer restarts, but no more lives than
///   an id keeps windows for, no consumer restart, nothing evicted or swept): at most once
///   per key. A body may succeed under two keys: a restarted producer re-sends a message
///   whose ACK it did not get under a new incarnation.
/// - Otherwise, unless windows are evicted or swept: within one consumer life, a key succeeds
///   again only in a run that started after the consumer saw its producer switch incarnations
///   since the key's first copy arrived in that life. Such a switch (a restart, or a stale
///   copy of another incarnation still in transit) replaces the producer's dedup window, and
///   the fresh window admits the key again while an earlier admission may still be queued.
fn handler_successes(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    if scenario.dedup_is_kept() {
        let exact = scenario.attempts_are_unbounded();
        for (key, record) in sorted_keys(run) {
            let n = record.successes.len();
            if n > 1 || (exact && n != 1) {
                broken.add(
                    "exactly once",
                    format!(
                        "{key:?} (body {:#x}): handler succeeded {n} times, expected {}",
                        record.body,
                        if exact {
                            "exactly once"
                        } else {
                            "at most once"
                        }
                    ),
                );
            }
        }
        let mut bodies: Vec<_> = run.observations.bodies.iter().collect();
        bodies.sort_unstable_by_key(|&(body, _)| *body);
        for (body, record) in bodies {
            if record.successes > 1 {
                broken.add(
                    "exactly once per body",
                    format!(
                        "body {body:#x}: handler succeeded {} times",
                        record.successes
                    ),
                );
            }
        }
        return;
    }
    if scenario.incarnation_windows_suffice() {
        for (key, record) in sorted_keys(run) {
            let n = record.successes.len();
            if n > 1 {
                broken.add(
                    "at most once per key",
                    format!(
                        "{key:?} (body {:#x}): handler succeeded {n} times although the \
                         consumer kept a window for every incarnation",
                        record.body
                    ),
                );
            }
        }
        return;
    }
    if scenario.windows_can_vanish() {
        return;
    }
    for (key, record) in sorted_keys(run) {
        for pair in record.successes.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            if earlier.life != later.life {
                continue;
            }
            let first_arrival = record
                .first_arrivals
                .iter()
                .find(|&&(life, _)| life == later.life)
                .map(|&(_, switches)| switches);
            if first_arrival.is_none_or(|switches| later.switches_at_start <= switches) {
                broken.add(
                    "no duplicate without a window reset",
                    format!(
                        "{key:?}: handler succeeded twice in consumer life {} (steps {} and {}) \
                         without a window reset since its first copy arrived",
                        later.life, earlier.step, later.step
                    ),
                );
            }
        }
    }
}

/// After a consumer restart the handler runs again only for messages that, at the restart,
/// were not yet confirmed to their producer OR still had a copy on the producer → consumer
/// link. Nothing else can reach the new consumer: a confirmed message is never retransmitted,
/// and the old consumer's waiting queue and running handler die with it. (Both clauses are
/// needed: an unconfirmed message is retransmitted, and a delayed or duplicated copy of a
/// confirmed one may arrive at a consumer that has no window for its producer yet — the
/// simulator counts both kinds of re-runs, see `Tally`.)
fn consumer_restarts(run: &Run, broken: &mut Broken) {
    let restarts = &run.observations.consumer_restarts;
    if restarts.is_empty() {
        return;
    }
    let in_transit: Vec<HashSet<Key>> = restarts
        .iter()
        .map(|r| r.in_transit.iter().copied().collect())
        .collect();
    for (key, record) in sorted_keys(run) {
        let Some(confirmed) = record.confirmed_at else {
            continue;
        };
        for (restart, transit) in restarts.iter().zip(&in_transit) {
            if confirmed >= restart.step || transit.contains(key) {
                continue;
            }
            if let Some(late) = record.successes.iter().find(|s| s.step > restart.step) {
                broken.add(
                    "re-run only if unconfirmed or in transit",
                    format!(
                        "{key:?}: handler ran again (step {}) after the consumer restart in step \
                         {}, though the message was confirmed (step {confirmed}) and had no copy \
                         in transit then",
                        late.step, restart.step
                    ),
                );
            }
        }
    }
}

/// Ordered mode: per producer incarnation, messages first succeed in strictly increasing seq
/// order.
///
/// - While no window can be lost (no eviction, sweep or incarnation switch), this holds
///   within each consumer life: even a restarted consumer's re-runs come in order.
/// - Otherwise a late copy may reach a fresh window after its successors ran. For a message
///   handled before, that is a re-run (any order); for one its producer abandoned (given up,
///   or stopped by a restart) it may even be its first run. So only the first successes of
///   messages confirmed `Ok` are compared, over the whole run.
fn order(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    let per_life = !scenario.windows_can_vanish() && !scenario.restarts_producers();
    let mut successes: Vec<(u64, u32, Key)> = run
        .observations
        .keys
        .iter()
        .filter(|(_, record)| per_life || record.confirmed_at.is_some())
        .flat_map(|(key, record)| record.successes.iter().map(|s| (s.step, s.life, *key)))
        .collect();
    successes.sort_unstable();
    let mut seen: HashSet<(u32, Key)> = HashSet::new();
    let mut last: HashMap<(u32, usize, u128), u64> = HashMap::new();
    for (step, life, key) in successes {
        let life = if per_life { life } else { 0 };
        if !seen.insert((life, key)) {
            continue;
        }
        let stream = (life, key.producer, key.incarnation);
        if let Some(&previous) = last.get(&stream)
            && key.seq <= previous
        {
            broken.add(
                "ordered",
                format!(
                    "{key:?} first succeeded{} in step {step}, after seq \
                         {previous} of the same producer incarnation",
                    if per_life {
                        format!(" in consumer life {life}")
                    } else {
                        String::new()
                    }
                ),
            );
        }
        last.insert(stream, key.seq);
    }
}

/// Both sides end idle and their counters agree with what the simulator saw.
fn final_state(scenario: &Scenario, run: &Run, broken: &mut Broken) {
    for (index, idle) in run.producers_idle.iter().enumerate() {
        if !idle {
            broken.add(
                "producers end idle",
                format!("p{index} did not end idle: {:?}", run.producer_stats[index]),
            );
        }
    }
    let stats = &run.consumer_stats;
    let obs = &run.observations;
    let successes: u64 = obs
        .keys
        .values()
        .map(|r| r.successes.len() as u64)
        .sum::<u64>()
        + obs
            .forged
            .values()
            .map(|r| r.successes.len() as u64)
            .sum::<u64>();
    let expected = [
        (
            "handler running at the end",
            u64::from(run.consumer_running),
            0,
        ),
        ("waiting at the end", stats.waiting as u64, 0),
        ("dead letters", stats.dead_letters, 0),
        ("delivered", stats.delivered, successes),
        (
            "handler failures and panics",
            stats.handler_failures + stats.handler_panics,
            obs.handler_failures,
        ),
        ("duplicates re-ACKed", stats.duplicates, obs.re_acks),
        (
            "refused sends",
            run.producer_stats.iter().map(|s| s.refused).sum::<u64>(),
            0,
        ),
    ];
    for (what, actual, want) in expected {
        if actual != want {
            broken.add(
                "consumer counters",
                format!("consumer/producer counter `{what}` is {actual}, expected {want}"),
            );
        }
    }
    let room_for_all = scenario
        .consumer
        .max_producers
        .get()
        .is_none_or(|max| max >= scenario.producers);
    if room_for_all && stats.evictions != 0 {
        broken.add(
            "consumer counters",
            format!(
                "{} evictions with room for all {} producers",
                stats.evictions, scenario.producers
            ),
        );
    }
    let incarnations = scenario.most_incarnations_per_id();
    if incarnations <= INCARNATIONS_KEPT_PER_ID && stats.replaced_incarnations != 0 {
        broken.add(
            "consumer counters",
            format!(
                "{} incarnation windows replaced, though no id has more than {incarnations} \
                 incarnations",
                stats.replaced_incarnations
            ),
        );
    }
    // Unless live producers share an id, nothing looks shared: a restart's stragglers
    // alternate with the new incarnation only for a moment (far below the 10 s grace).
    if scenario.shared_ids.is_none() && stats.shared_id_messages != 0 {
        broken.add(
            "consumer counters",
            format!(
                "{} messages counted as from a shared id, though no live producers share one",
                stats.shared_id_messages
            ),
        );
    }
}
