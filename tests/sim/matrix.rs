//! The scenario matrix: every seed maps to one scenario of a fault class, window size,
//! producer count and ordering, with the fault rates drawn within the class's ranges; and
//! the per-class totals that prove the injected faults were really injected.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use actix_delivery::{Backoff, ConsumerConfig, Limit, ProducerConfig};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::scenario::{HandlerFaults, LinkFaults, Scenario, Traffic};
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
}

impl FaultClass {
    const ALL: [FaultClass; 6] = [
        Self::Clean,
        Self::Loss,
        Self::Duplication,
        Self::HandlerFailure,
        Self::Chaos,
        Self::GiveUp,
    ];
}

/// The window sizes of the matrix.
const WINDOWS: [usize; 3] = [1, 16, 64];

/// The scenario of `seed` with `messages` messages. The seed's low digits pick ordering,
/// window size, producer count (1–4) and fault class, so that consecutive seeds cover every
/// combination; the rates are drawn from a generator seeded with the seed too.
pub fn scenario(seed: u64, messages: usize) -> (FaultClass, Scenario) {
    let ordered = seed % 2 == 1;
    let window_size = WINDOWS[(seed / 2 % 3) as usize];
    let producers = (seed / 6 % 4) as usize + 1;
    let class = FaultClass::ALL[(seed / 24 % 6) as usize];
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
    let mut failure = 0.0;
    let mut producer = ProducerConfig {
        window_size,
        resend_timeout,
        ..ProducerConfig::default()
    };
    let mut max_out_of_order = Limit::At(1024);
    let mut handler_max = ms(*[0, 1, 5].choose(&mut rng).expect("non-empty"));
    match class {
        FaultClass::Clean => {}
        FaultClass::Loss => {
            forward_drop = rng.random_range(0.05..=0.5);
            backward_drop = rng.random_range(0.05..=0.5);
        }
        FaultClass::Duplication => {
            duplicate = (rng.random_range(0.05..=0.3), rng.random_range(0.05..=0.3));
        }
        FaultClass::HandlerFailure => failure = rng.random_range(0.05..=0.2),
        FaultClass::Chaos => {
            forward_drop = rng.random_range(0.05..=0.5);
            backward_drop = rng.random_range(0.05..=0.5);
            duplicate = (rng.random_range(0.05..=0.3), rng.random_range(0.05..=0.3));
            failure = rng.random_range(0.05..=0.2);
            handler_max = ms(*[0, 5, 20].choose(&mut rng).expect("non-empty"));
            if rng.random_bool(0.5) {
                producer.backoff = Backoff::Exponential {
                    multiplier: 2.0,
                    max: resend_timeout * 4,
                    jitter: 0.5,
                };
            }
            if rng.random_bool(0.5) {
                max_out_of_order = Limit::At(rng.random_range(1..=4));
            }
        }
        FaultClass::GiveUp => {
            forward_drop = rng.random_range(0.2..=0.5);
            backward_drop = rng.random_range(0.2..=0.5);
            duplicate = (0.05, 0.05);
            failure = rng.random_range(0.0..=0.2);
            producer.max_attempts = Limit::At(rng.random_range(2..=4));
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
        producer,
        consumer: ConsumerConfig {
            ordered,
            max_out_of_order,
            ..ConsumerConfig::default()
        },
        forward,
        backward,
        handler: HandlerFaults {
            failure,
            max_duration: handler_max,
            ..HandlerFaults::NONE
        },
        traffic: Traffic {
            max_gap: ms(*[0, 2, 20].choose(&mut rng).expect("non-empty")),
            ..Traffic::BURST
        },
        ..Scenario::baseline(seed, messages)
    };
    (class, scenario)
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
    /// duplicates, give-ups) where it configures it.
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
            };
            assert!(ok, "class {class:?} did not inject what it configures: {t}");
            assert_eq!(
                t.given_up > 0,
                class == FaultClass::GiveUp,
                "only class GiveUp may give messages up: {class:?}: {t}"
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
