//! Fault counters of a run, and their totals per class.

use std::collections::BTreeMap;
use std::fmt;

use super::scenario::Class;

macro_rules! tally {
    ($($(#[doc = $doc:literal])* $field:ident),* $(,)?) => {
        /// What a run did: the faults it injected and what the pool did about them.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct Tally {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl Tally {
            /// Adds `other` to `self`.
            pub fn add(&mut self, other: &Tally) {
                $(self.$field += other.$field;)*
            }

            /// Every counter with its name.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }
    };
}

tally! {
    /// Runs.
    runs,
    /// Jobs.
    jobs,
    /// Messages lost by a link (deliveries and ACKs).
    losses,
    /// Messages a link delivered twice.
    duplicates,
    /// Messages that arrived after one sent later on the same link.
    reorders,
    /// Messages dropped because their worker crashed (in flight, or sent to a dead worker).
    crash_drops,
    /// Workers added to the pool.
    joins,
    /// Graceful deregistrations of a worker in the pool.
    leaves,
    /// Crashes.
    crashes,
    /// Crashed workers deregistered after the detection delay.
    detections,
    /// Handler runs that stalled.
    stalls,
    /// Handler runs that failed (before or after their effect).
    handler_failures,
    /// Handler runs abandoned after `handler_timeout`.
    handler_timeouts,
    /// Worker streams that gave a job up while their worker was in the pool (the job failed
    /// there).
    give_ups,
    /// Rests begun by failing workers.
    rests,
    /// Assignments made while a worker that was resting or failing had room by its capacity.
    rest_checks,
    /// Jobs the pool gave up (`give_up_after`).
    jobs_given_up,
    /// Jobs re-routed by the pool.
    reroutes,
    /// Assignments decided by the ordering rule (a re-routed job before a later one).
    front_checks,
    /// Retransmissions of the worker streams.
    retransmissions,
    /// Jobs confirmed by a worker already removed from the pool.
    late_confirmations,
    /// Jobs confirmed by one worker while another held a copy.
    confirmed_elsewhere,
    /// Stopped settlements of stopped streams fed back to the pool.
    stopped_settlements,
    /// Handler runs of an already recorded job (no-op successes).
    dedup_hits,
    /// Handler runs that reached their end.
    handler_runs,
    /// Handler runs beyond the first per job (at least once: a job can run again).
    repeated_runs,
    /// Registrations that replaced a worker still in the pool (a restart before the crash
    /// was detected).
    replaced,
    /// Longest time from the heal to the last confirmation, in ms (a maximum when summed
    /// over runs is meaningless; [`ClassTotals`] keeps the maximum).
    heal_to_done_ms,
}

/// Totals per class.
#[derive(Debug, Default)]
pub struct ClassTotals {
    /// Per class.
    pub classes: BTreeMap<Class, Tally>,
}

impl ClassTotals {
    /// Adds one run of `class`.
    pub fn add(&mut self, class: Class, tally: &Tally) {
        let total = self.classes.entry(class).or_default();
        let longest = total.heal_to_done_ms.max(tally.heal_to_done_ms);
        total.add(tally);
        total.heal_to_done_ms = longest;
    }

    /// The sum over classes.
    pub fn total(&self) -> Tally {
        let mut sum = Tally::default();
        for tally in self.classes.values() {
            let longest = sum.heal_to_done_ms.max(tally.heal_to_done_ms);
            sum.add(tally);
            sum.heal_to_done_ms = longest;
        }
        sum
    }

    /// Panics unless each class injected the faults it is about.
    pub fn assert_faults_injected(&self) {
        for (class, t) in &self.classes {
            let mut wanted = vec![
                ("joins", t.joins),
                ("reroutes", t.reroutes),
                ("reorders", t.reorders),
            ];
            match class {
                Class::Churn => {
                    wanted.extend([("leaves", t.leaves), ("front_checks", t.front_checks)])
                }
                Class::Lossy => wanted.extend([
                    ("losses", t.losses),
                    ("duplicates", t.duplicates),
                    ("retransmissions", t.retransmissions),
                    ("handler_failures", t.handler_failures),
                    ("dedup_hits", t.dedup_hits),
                ]),
                Class::Crashes => wanted.extend([
                    ("crashes", t.crashes),
                    ("detections", t.detections),
                    ("crash_drops", t.crash_drops),
                    ("replaced", t.replaced),
                    ("repeated_runs", t.repeated_runs),
                    ("dedup_hits", t.dedup_hits),
                ]),
                Class::Stalls => wanted.extend([
                    ("stalls", t.stalls),
                    ("handler_timeouts", t.handler_timeouts),
                ]),
                Class::GiveUps => wanted.extend([
                    ("give_ups", t.give_ups),
                    ("losses", t.losses),
                    ("rests", t.rests),
                    ("rest_checks", t.rest_checks),
                    ("jobs_given_up", t.jobs_given_up),
                ]),
                Class::All => wanted.extend(
                    t.fields()
                        .into_iter()
                        .filter(|(name, _)| *name != "heal_to_done_ms"),
                ),
            }
            let missing: Vec<_> = wanted.iter().filter(|(_, n)| *n == 0).collect();
            assert!(
                missing.is_empty(),
                "class {class:?} never injected {missing:?}:\n{self}"
            );
        }
    }
}

impl fmt::Display for ClassTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let classes: Vec<_> = self.classes.iter().collect();
        write!(f, "{:<20}", "")?;
        for (class, _) in &classes {
            write!(f, "{:>10}", format!("{class:?}"))?;
        }
        writeln!(f, "{:>10}", "total")?;
        let total = self.total();
        for (i, (name, sum)) in total.fields().into_iter().enumerate() {
            write!(f, "{name:<20}")?;
            for (_, tally) in &classes {
                write!(f, "{:>10}", tally.fields()[i].1)?;
            }
            writeln!(f, "{sum:>10}")?;
        }
        Ok(())
    }
}
