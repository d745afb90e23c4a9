//! The scenario matrix: every seed maps to one scenario of a fault class, window size,
//! producer count and ordering, with the fault rates drawn within the class's ranges; and
//! the per-class totals that prove the injected faults were really injected.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use actix_delivery_proto::config::{Backoff, ConsumerConfig, Limit, ProducerConfig};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::scenario::{
    CapRule, CrashMoment, Disruption, Durability, DurableKind, Forgery, HandlerFaults, LinkFaults,
    Scenario, Traffic,
};
use super::tally::Tally;

/// Which faults a scenario injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultClass {
    /// Latency jitter only (reordering), nothing lost, duplicated or failed.
    Clean,
    /// Up to 50 % loss each way; no duplication: dedup is exercised by retransmissions alone.
    Loss,
    /// Up to 30 % duplication each way.
    Duplication,
    /// Up to 20 % handler failures.
    HandlerFailure,
    /// All of the above at once, wide latency (beyond the resend timeout), slow handlers,
    /// sometimes exponential backoff and a small out-of-order bound.
    Chaos,
    /// Heavy loss with `max_attempts` of 2–4: messages are given up.
    GiveUp,
    /// A forger holding a victim's id and incarnation injects 1–3 bursts of 1–20 deliveries
    /// with `seq == window_start` jumping far above the victim's seqs (by up to 2^53), some
    /// replayed; 5–30 % loss and 5–20 % duplication, `max_attempts` 3–6, `max_out_of_order`
    /// 1–8: the victim's messages below a forged floor are given up.
    HostileWindowStart,
    /// 2–4 producers configured with fewer ids (each with its own incarnation), traffic
    /// spread over tens of seconds (older incarnations keep sending long after newer ones
    /// appeared), 5–30 % loss and duplication each way.
    SharedId,
    /// `handler_timeout` of 200 ms, 500 ms or 2 s; 1–3 % of the runs are stuck (an hour),
    /// 1–4 % slow (just under the timeout); nothing lost, duplicated or failed.
    StuckHandler,
    /// Durable producers and outbox lanes (journals committing in 0–1, 0–5 or 0–20 ms) crash
    /// 1–3 times, mid-store, mid-record or at any moment, losing everything not committed, and
    /// restart 0–50 ms later; in a third of the runs the consumer restarts too; 5–30 % loss and
    /// 5–20 % duplication each way, offers spread over time.
    DurableCrash,
}

impl FaultClass {
    const ALL: [FaultClass; 10] = [
        Self::Clean,
        Self::Loss,
        Self::Duplication,
        Self::HandlerFailure,
        Self::Chaos,
        Self::GiveUp,
        Self::HostileWindowStart,
        Self::SharedId,
        Self::StuckHandler,
        Self::DurableCrash,
    ];
}

/// The window sizes of the matrix.
const WINDOWS: [usize; 3] = [1, 16, 64];

/// The scenario of `seed` with `messages` messages. The seed's low digits pick ordering,
/// fault class, window size and producer count (1–4, at least 2 for shared ids), so that
/// consecutive seeds cover every class and every 240 seeds every combination; the rates are
/// drawn from a generator seeded with the seed too.
pub fn scenario(seed: u64, messages: usize) -> (FaultClass, Scenario) {
    let ordered = seed % 2 == 1;
    let class = FaultClass::ALL[(seed / 2 % 10) as usize];
    let window_size = WINDOWS[(seed / 20 % 3) as usize];
    let mut producers = (seed / 60 % 4) as usize + 1;
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6d61_7472_6978);
    let ms = Duration::from_millis;

    let resend_timeout = ms(*[100, 200, 500].choose(&mut rng).expect("non-empty"));
    let max_latency = match class {
        FaultClass::Chaos => [5, 50, 300, 800],
        _ => [5, 50, 300, 300],
    }
    .choose(&mut rng)
    .copied()
    .map(ms)
    .expect("non-empty");
    let mut link = LinkFaults::reliable(ms(rng.random_range(0..=2)), max_latency);
    let mut forward_drop = 0.0;
    let mut backward_drop = 0.0;
    let mut duplicate = (0.0, 0.0);
    let mut producer = ProducerConfig {
        window_size,
        resend_timeout,
        ..ProducerConfig::default()
    };
    let mut consumer = ConsumerConfig {
        ordered,
        max_out_of_order: Limit::At(1024),
        ..ConsumerConfig::default()
    };
    let mut handler = HandlerFaults {
        max_duration: ms(*[0, 1, 5].choose(&mut rng).expect("non-empty")),
        ..HandlerFaults::NONE
    };
    let mut max_gap = ms(*[0, 2, 20].choose(&mut rng).expect("non-empty"));
    let mut shared_ids = None;
    let mut forgeries = Vec::new();
    let mut durable_crashes = false;
    match class {
        FaultClass::Clean => {}
        FaultClass::Loss => {
            forward_drop = rng.random_range(0.05..=0.5);
            backward_drop = rng.random_range(0.05..=0.5);
        }
        FaultClass::Duplication => {
            duplicate = (rng.random_range(0.05..=0.3), rng.random_range(0.05..=0.3));
        }
        FaultClass::HandlerFailure => handler.failure = rng.random_range(0.05..=0.2),
        FaultClass::Chaos => {
            forward_drop = rng.random_range(0.05..=0.5);
            backward_drop = rng.random_range(0.05..=0.5);
            duplicate = (rng.random_range(0.05..=0.3), rng.random_range(0.05..=0.3));
            handler.failure = rng.random_range(0.05..=0.2);
            handler.max_duration = ms(*[0, 5, 20].choose(&mut rng).expect("non-empty"));
            if rng.random_bool(0.5) {
                producer.backoff = Backoff::Exponential {
                    multiplier: 2.0,
                    max: resend_timeout * 4,
                    jitter: 0.5,
                };
            }
            if rng.random_bool(0.5) {
                consumer.max_out_of_order = Limit::At(rng.random_range(1..=4));
            }
        }
        FaultClass::GiveUp => {
            forward_drop = rng.random_range(0.2..=0.5);
            backward_drop = rng.random_range(0.2..=0.5);
            duplicate = (0.05, 0.05);
            handler.failure = rng.random_range(0.0..=0.2);
            producer.max_attempts = Limit::At(rng.random_range(2..=4));
        }
        FaultClass::HostileWindowStart => {
            forward_drop = rng.random_range(0.05..=0.3);
            backward_drop = rng.random_range(0.05..=0.3);
            duplicate = (rng.random_range(0.05..=0.2), rng.random_range(0.05..=0.2));
            handler.max_duration = ms(*[1, 5, 20].choose(&mut rng).expect("non-empty"));
            producer.max_attempts = Limit::At(rng.random_range(3..=6));
            consumer.max_out_of_order = Limit::At(rng.random_range(1..=8));
            let victim = rng.random_range(0..producers);
            let sent = (messages / producers + usize::from(victim < messages % producers)) as u64;
            for _ in 0..rng.random_range(1..=3) {
                if sent == 0 {
                    break;
                }
                forgeries.push(Forgery {
                    victim,
                    after_seq: rng.random_range(1..=(sent * 3 / 4).max(1)),
                    delay: ms(rng.random_range(0..=200)),
                    jump: *Forgery::JUMPS.choose(&mut rng).expect("non-empty"),
                    burst: rng.random_range(1..=20),
                    copies: rng.random_range(1..=2),
                });
            }
        }
        FaultClass::SharedId => {
            forward_drop = rng.random_range(0.05..=0.3);
            backward_drop = rng.random_range(0.05..=0.3);
            duplicate = (rng.random_range(0.05..=0.3), rng.random_range(0.05..=0.3));
            producers = producers.max(2);
            shared_ids = Some(rng.random_range(1..producers));
            max_gap = ms(rng.random_range(500..=1_000));
        }
        FaultClass::StuckHandler => {
            let timeout = ms(*[200, 500, 2_000].choose(&mut rng).expect("non-empty"));
            consumer.handler_timeout = Limit::At(timeout);
            handler.stuck = rng.random_range(0.01..=0.03);
            handler.slow = rng.random_range(0.01..=0.04);
            handler.slow_range = timeout * 9 / 10..=timeout - ms(1);
        }
        FaultClass::DurableCrash => {
            forward_drop = rng.random_range(0.05..=0.3);
            backward_drop = rng.random_range(0.05..=0.3);
            duplicate = (rng.random_range(0.05..=0.2), rng.random_range(0.05..=0.2));
            max_gap = max_gap.max(ms(2));
            durable_crashes = true;
        }
    }
    link.drop = forward_drop;
    link.duplicate = duplicate.0;
    let forward = link.clone();
    link.drop = backward_drop;
    link.duplicate = duplicate.1;
    let backward = link;
    let scenario = Scenario {
        producers,
        shared_ids,
        producer,
        consumer,
        forward,
        backward,
        handler,
        traffic: Traffic {
            max_gap,
            ..Traffic::BURST
        },
        forgeries,
        ..Scenario::baseline(seed, messages)
    };
    let mut scenario = scenario;
    if durable_crashes {
        make_durable(&mut scenario, &mut rng, CapRule::LowestNotDurablySettled);
        add_durable_crashes(&mut scenario, &mut rng, 1..=3);
        if rng.random_bool(1.0 / 3.0) {
            scenario.disruptions.push(Disruption::ConsumerRestart {
                after_handled: rng.random_range(10..=messages / 2),
                delay: ms(rng.random_range(0..=20)),
            });
        }
    }
    (class, scenario)
}

/// Makes every producer durable: a durable producer or a lane of outbox entity 0 or 1 (lanes
/// sharing an id go to different entities: one entity's lanes share its incarnation), with
/// journals committing within 0–1, 0–5 or 0–20 ms, `window_start` capped by `cap`.
pub fn make_durable(scenario: &mut Scenario, rng: &mut SmallRng, cap: CapRule) {
    let mut kinds = Vec::with_capacity(scenario.producers);
    for producer in 0..scenario.producers {
        let kind = if rng.random_bool(0.5) {
            DurableKind::Producer
        } else {
            let entity = rng.random_range(0..2);
            let clash = (0..producer).any(|other| {
                scenario.id_of(other) == scenario.id_of(producer)
                    && kinds[other] == DurableKind::Outbox { entity }
            });
            if clash {
                DurableKind::Producer
            } else {
                DurableKind::Outbox { entity }
            }
        };
        kinds.push(kind);
    }
    let max = Duration::from_millis(*[1, 5, 20].choose(rng).expect("non-empty"));
    scenario.durable = Some(Durability {
        kinds,
        commit_latency: Duration::ZERO..=max,
        cap,
    });
}

/// Adds `crashes` durable crashes of random producers at random moments: each triggered by
/// an offer within the first three quarters of its producer's messages (`Anytime`: 0–200 ms
/// later), the producer down for 0–50 ms.
pub fn add_durable_crashes(
    scenario: &mut Scenario,
    rng: &mut SmallRng,
    crashes: std::ops::RangeInclusive<usize>,
) {
    let ms = Duration::from_millis;
    for _ in 0..rng.random_range(crashes) {
        let producer = rng.random_range(0..scenario.producers);
        let count = scenario.messages_of(producer);
        if count == 0 {
            continue;
        }
        scenario.disruptions.push(Disruption::DurableCrash {
            producer,
            after_offered: rng.random_range(1..=(count * 3 / 4).max(1)),
            moment: *CrashMoment::ALL.choose(rng).expect("non-empty"),
            delay: ms(rng.random_range(0..=200)),
            down: ms(rng.random_range(0..=50)),
        });
    }
}

/// Counts per fault class.
#[derive(Debug, Default)]
pub struct ClassTotals(BTreeMap<FaultClass, Tally>);

impl ClassTotals {
    /// Adds one run of `class`.
    pub fn add(&mut self, class: FaultClass, tally: &Tally) {
        self.0.entry(class).or_default().add(tally);
    }

    /// The sum over all classes.
    pub fn total(&self) -> Tally {
        let mut total = Tally::default();
        for tally in self.0.values() {
            total.add(tally);
        }
        total
    }

    /// Every class ran, and injected exactly the faults it configures: nothing where it
    /// configures nothing, something (and the consequences: retransmissions, re-ACKed
    /// duplicates, give-ups, stale deliveries, shared-id messages, timeouts) where it
    /// configures it.
    ///
    /// # Panics
    /// Naming the class and the count that is wrong.
    pub fn assert_faults_injected(&self) {
        for class in FaultClass::ALL {
            let t = self
                .0
                .get(&class)
                .unwrap_or_else(|| panic!("no run of class {class:?}"));
            let drops = t.forward.dropped.min(t.backward.dropped);
            let dups = t.forward.duplicated.min(t.backward.duplicated);
            let any_drop = t.forward.dropped + t.backward.dropped;
            let any_dup = t.forward.duplicated + t.backward.duplicated;
            let fails = t.handler_failures;
            let ok = match class {
                FaultClass::Clean => any_drop == 0 && any_dup == 0 && fails == 0,
                FaultClass::Loss => {
                    drops > 0
                        && any_dup == 0
                        && fails == 0
                        && t.retransmissions > 0
                        && t.re_acks > 0
                }
                FaultClass::Duplication => dups > 0 && any_drop == 0 && fails == 0 && t.re_acks > 0,
                FaultClass::HandlerFailure => fails > 0 && any_drop == 0 && any_dup == 0,
                FaultClass::Chaos => {
                    drops > 0 && dups > 0 && fails > 0 && t.re_acks > 0 && t.holds > 0
                }
                FaultClass::GiveUp => drops > 0 && t.given_up > 0,
                FaultClass::HostileWindowStart => {
                    drops > 0
                        && dups > 0
                        && fails == 0
                        && t.forged > t.forgeries
                        && t.forged_runs > 0
                        && t.predicted_stale > 0
                        && t.stale >= t.predicted_stale
                        && t.victims_given_up > 0
                }
                FaultClass::SharedId => {
                    drops > 0 && dups > 0 && fails == 0 && t.re_acks > 0 && t.shared_id_messages > 0
                }
                FaultClass::StuckHandler => {
                    any_drop == 0
                        && any_dup == 0
                        && fails == 0
                        && t.handler_timeouts > 0
                        && t.abandoned_runs == t.handler_timeouts
                        && t.slow_completed > 0
                }
                FaultClass::DurableCrash => {
                    drops > 0
                        && dups > 0
                        && fails == 0
                        && t.durable_crashes >= t.runs
                        && t.crashes_mid_store > 0
                        && t.crashes_mid_record > 0
                        && t.never_stored > 0
                        && t.unrecorded > 0
                        && t.resumed > 0
                        && t.resend_duplicates > 0
                        && t.sink > 0
                        && t.consumer_restarts > 0
                }
            };
            assert!(ok, "class {class:?} did not inject what it configures: {t}");
            let only = |what: &str, count: u64, classes: &[FaultClass]| {
                assert_eq!(
                    count > 0,
                    classes.contains(&class),
                    "only {classes:?} may have {what}: {class:?}: {t}"
                );
            };
            use FaultClass::{DurableCrash, GiveUp, HostileWindowStart, SharedId, StuckHandler};
            only(
                "messages given up",
                t.given_up,
                &[GiveUp, HostileWindowStart],
            );
            only("forgeries", t.forgeries + t.forged, &[HostileWindowStart]);
            only(
                "victims given up",
                t.victims_given_up,
                &[HostileWindowStart],
            );
            only("shared-id messages", t.shared_id_messages, &[SharedId]);
            only(
                "handler timeouts or slow runs",
                t.handler_timeouts + t.slow_completed,
                &[StuckHandler],
            );
            only(
                "durable crashes or resumed messages",
                t.durable_crashes + t.resumed + t.never_stored,
                &[DurableCrash],
            );
        }
    }
}

impl fmt::Display for ClassTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (class, tally) in &self.0 {
            writeln!(f, "  {class:?}: {tally}")?;
        }
        Ok(())
    }
}
