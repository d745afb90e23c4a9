//! What one run simulates, drawn from its seed: the jobs and when they arrive, the workers
//! (capacity, bounded or unbounded retransmission), the links, the handlers' failures and
//! stalls, the churn, when the pool gives a job up, and when everything heals.

use std::time::Duration;

use actix_delivery_proto::config::Backoff;
use actix_delivery_proto::work_pulling::pool::REST_MAX;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A fault class: which faults a run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Graceful joins and leaves only, over perfect links (latencies vary: reordering).
    Churn,
    /// Loss, duplication and reordering both ways, failing handlers, some churn.
    Lossy,
    /// Workers crash (consumer state and runs lost, in-flight messages dropped) and restart;
    /// the pool hears of it only after a detection delay.
    Crashes,
    /// Handlers stall for seconds to a minute, some beyond `handler_timeout`.
    Stalls,
    /// Bounded `max_attempts` on most worker streams over lossy links: streams give jobs up,
    /// the pool re-routes them and rests their workers; in half the runs it gives a job up
    /// after 2–5 failures.
    GiveUps,
    /// Everything at once.
    All,
}

/// Every class, in the order of the matrix.
pub const CLASSES: [Class; 6] = [
    Class::Churn,
    Class::Lossy,
    Class::Crashes,
    Class::Stalls,
    Class::GiveUps,
    Class::All,
];

/// The faults of one direction of every pool ↔ worker link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFaults {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message arrives twice.
    pub duplicate: f64,
    /// Shortest latency.
    pub min_latency: Duration,
    /// Longest latency (copies overtake each other when latencies vary).
    pub max_latency: Duration,
}

impl LinkFaults {
    /// What the links become once they heal: nothing lost, small varying latency.
    pub const HEALED: LinkFaults = LinkFaults {
        loss: 0.0,
        duplicate: 0.0,
        min_latency: Duration::from_millis(1),
        max_latency: Duration::from_millis(10),
    };
}

/// How handler runs go before the heal (after it every run succeeds in normal time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandlerFaults {
    /// Probability that a run fails before its effect (nothing recorded).
    pub fail_before: f64,
    /// Probability that a run fails after its effect was recorded (an error after commit).
    pub fail_after: f64,
    /// Probability that a run stalls.
    pub stall: f64,
    /// How long a stalled run takes.
    pub stall_min: Duration,
    /// How long a stalled run takes at most.
    pub stall_max: Duration,
}

/// One worker (a name; each registration under it is a new worker of the pool).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSpec {
    /// Its name (`w0`, `w1`, ...); its streams' id is `pool/<name>`.
    pub name: String,
    /// Its capacity: its stream's window.
    pub capacity: usize,
    /// Its stream's `max_attempts` (`None`: unbounded). Worker 0 is always unbounded.
    pub max_attempts: Option<u32>,
    /// Shortest normal handler run.
    pub run_min: Duration,
    /// Longest normal handler run.
    pub run_max: Duration,
    /// Registered at the start.
    pub initially: bool,
}

/// How often each kind of churn is picked (relative weights).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Churn {
    /// Mean pause between churn events (0: no churn).
    pub mean_gap: Duration,
    /// A worker that is not in the pool registers (again).
    pub join: u32,
    /// A worker deregisters gracefully.
    pub leave: u32,
    /// A worker crashes.
    pub crash: u32,
}

/// What a handler run records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// A shared journal: a run records the job's stable id atomically with its effect, and a
    /// run for a recorded id is a no-op success (as `PersistentHandle::job_handler`).
    Dedup,
    /// Planted fault: every successful run applies its effect again.
    NoDedup,
}

/// How the pool is wired to the worker streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// As the actor shell (`src/work_pulling/controller.rs`).
    Shell,
    /// Planted fault: a leaving worker is not removed from the pool and the settlements of
    /// its stopped stream are dropped (instead of re-routing its jobs).
    DropLeaving,
}

/// One run.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The seed everything is drawn from.
    pub seed: u64,
    /// The fault class.
    pub class: Class,
    /// When each job arrives (job `n` is the `n`-th entry, from 1), ascending.
    pub pushes: Vec<Duration>,
    /// The workers.
    pub workers: Vec<WorkerSpec>,
    /// The links before the heal.
    pub link: LinkFaults,
    /// The handlers before the heal.
    pub handler: HandlerFaults,
    /// The consumers' `handler_timeout` (`None`: unbounded).
    pub handler_timeout: Option<Duration>,
    /// The worker streams' `resend_timeout`.
    pub resend_timeout: Duration,
    /// The worker streams' backoff.
    pub backoff: Backoff,
    /// The churn before the heal.
    pub churn: Churn,
    /// A crash is noticed (the worker deregistered) this long after it, at the earliest.
    pub detect_min: Duration,
    /// ... and at the latest.
    pub detect_max: Duration,
    /// A crashed worker restarts after this long (if it does before the heal).
    pub restart_max: Duration,
    /// The pool gives a job up after this many failures (`None`: never).
    pub give_up_after: Option<u32>,
    /// Churn ends, links and handlers heal, every worker is restarted and registered.
    pub heal_at: Duration,
    /// The store of the effects.
    pub store: Store,
    /// The wiring.
    pub wiring: Wiring,
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

impl Scenario {
    /// The scenario of `seed` in `class`, with `jobs` jobs.
    pub fn generate(seed: u64, class: Class, jobs: usize) -> Scenario {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x005e_ed0f_3011);
        let lossy = matches!(class, Class::Lossy | Class::GiveUps | Class::All);
        let some_loss = matches!(class, Class::Crashes | Class::Stalls);
        let link = if lossy {
            LinkFaults {
                loss: rng.random_range(0.05..0.35),
                duplicate: rng.random_range(0.02..0.25),
                min_latency: ms(1),
                max_latency: ms(rng.random_range(50..600)),
            }
        } else if some_loss {
            LinkFaults {
                loss: rng.random_range(0.0..0.05),
                duplicate: rng.random_range(0.0..0.05),
                min_latency: ms(1),
                max_latency: ms(rng.random_range(20..200)),
            }
        } else {
            LinkFaults {
                loss: 0.0,
                duplicate: 0.0,
                min_latency: ms(1),
                max_latency: ms(rng.random_range(20..300)),
            }
        };
        let failing = !matches!(class, Class::Churn);
        let stalling = matches!(class, Class::Stalls | Class::All | Class::GiveUps);
        let handler = HandlerFaults {
            fail_before: if failing {
                rng.random_range(0.0..0.12)
            } else {
                0.0
            },
            fail_after: if failing {
                rng.random_range(0.0..0.08)
            } else {
                0.0
            },
            stall: if stalling {
                rng.random_range(0.01..0.05)
            } else {
                0.0
            },
            stall_min: ms(3_000),
            stall_max: ms(rng.random_range(10_000..60_000)),
        };
        let handler_timeout = match rng.random_range(0..3) {
            0 => None,
            1 => Some(ms(10_000)),
            _ => Some(ms(30_000)),
        };
        let bounded = matches!(class, Class::GiveUps | Class::All);
        let names = rng.random_range(2..=6);
        let workers = (0..names)
            .map(|i| {
                let run_min = ms(rng.random_range(2..30));
                WorkerSpec {
                    name: format!("w{i}"),
                    capacity: rng.random_range(1..=8),
                    max_attempts: (bounded && i > 0 && rng.random_bool(0.8))
                        .then(|| rng.random_range(2..=5)),
                    run_min,
                    run_max: run_min + ms(rng.random_range(10..250)),
                    initially: i == 0 || rng.random_bool(0.7),
                }
            })
            .collect();
        let resend_timeout = ms(rng.random_range(200..=800));
        let backoff = if rng.random_bool(0.3) {
            Backoff::Exponential {
                multiplier: 2.0,
                max: ms(4_000),
                jitter: 0.2,
            }
        } else {
            Backoff::Fixed
        };
        let churn = match class {
            Class::Churn => Churn {
                mean_gap: ms(rng.random_range(400..2_000)),
                join: 5,
                leave: 5,
                crash: 0,
            },
            Class::Lossy | Class::Stalls => Churn {
                mean_gap: ms(rng.random_range(2_000..6_000)),
                join: 3,
                leave: 2,
                crash: 0,
            },
            Class::Crashes => Churn {
                mean_gap: ms(rng.random_range(500..2_500)),
                join: 4,
                leave: 1,
                crash: 5,
            },
            Class::GiveUps => Churn {
                mean_gap: ms(rng.random_range(2_000..6_000)),
                join: 3,
                leave: 1,
                crash: 1,
            },
            Class::All => Churn {
                mean_gap: ms(rng.random_range(500..2_500)),
                join: 4,
                leave: 3,
                crash: 3,
            },
        };
        // Jobs arrive in bursts over the first 5–25 s.
        let push_until = ms(rng.random_range(5_000..25_000));
        let mut pushes = Vec::with_capacity(jobs);
        while pushes.len() < jobs {
            let at = ms(rng.random_range(0..=push_until.as_millis() as u64));
            let burst = rng.random_range(1..=40).min(jobs - pushes.len());
            pushes.extend(std::iter::repeat_n(at, burst));
        }
        pushes.sort();
        let heal_at = push_until + ms(rng.random_range(5_000..20_000));
        let give_up_after = (bounded && rng.random_bool(0.5)).then(|| rng.random_range(2..=5));
        Scenario {
            seed,
            class,
            pushes,
            workers,
            link,
            handler,
            handler_timeout,
            resend_timeout,
            backoff,
            churn,
            detect_min: ms(300),
            detect_max: ms(rng.random_range(1_000..6_000)),
            restart_max: ms(8_000),
            give_up_after,
            heal_at,
            store: Store::Dedup,
            wiring: Wiring::Shell,
        }
    }

    /// The scenario of matrix seed `seed`: its class from `seed % 6`, 100–300 jobs.
    pub fn of_seed(seed: u64) -> Scenario {
        let class = CLASSES[(seed % CLASSES.len() as u64) as usize];
        let jobs = 100 + (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % 201;
        Scenario::generate(seed, class, jobs)
    }

    /// How many jobs.
    pub fn jobs(&self) -> usize {
        self.pushes.len()
    }

    /// After the heal every job must be settled within this long: a stall running at the
    /// heal ends, a crash is detected, a worker's rest ends, then one worker alone handles
    /// every job in its longest normal time, with a minute of retransmission margin.
    pub fn liveness_bound(&self) -> Duration {
        let run_max = self
            .workers
            .iter()
            .map(|w| w.run_max)
            .max()
            .unwrap_or_default();
        self.handler.stall_max
            + self.detect_max
            + REST_MAX
            + run_max * u32::try_from(self.jobs()).expect("few jobs")
            + ms(60_000)
    }
}
