//! What one seeded run of the chunking simulator does: its class, its producers and their
//! messages, the consumer's settings, the faults and when they stop.

use std::time::Duration;

use actix_delivery_proto::config::Limit;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The kinds of runs; seed `s` is of class `s % 6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Loss, duplication and reordering both ways, unordered consumer.
    Lossy,
    /// The same with an ordered consumer.
    Ordered,
    /// Lossy links and consumer restarts (its reassembly and dedup lost).
    ConsumerRestarts,
    /// Lossy links and producer restarts mid-message (new incarnations).
    ProducerRestarts,
    /// Several producers against a tight `max_reassembly_bytes`, small `max_out_of_order`,
    /// failing handlers.
    Tight,
    /// Everything at once.
    All,
}

/// Every class, in seed order.
pub const CLASSES: [Class; 6] = [
    Class::Lossy,
    Class::Ordered,
    Class::ConsumerRestarts,
    Class::ProducerRestarts,
    Class::Tight,
    Class::All,
];

/// How the world is wired: as the crate works, or with a planted fault the checks must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// The crate's rules.
    Sound,
    /// A broken consumer: it ACKs a message's last chunk when it buffers it (before the
    /// handler ran on the whole message).
    AckLastOnReceipt,
    /// A broken producer: the chunks a round sends again never leave it.
    NoRounds,
}

/// One producer of the run.
#[derive(Clone, Debug)]
pub struct ProducerSpec {
    pub window: usize,
    pub chunk_size: usize,
    /// When each message is handed to it, and its length in bytes.
    pub messages: Vec<(Duration, usize)>,
    /// When it restarts (a new incarnation; what it held is settled as stopped and handed to
    /// it again).
    pub restarts: Vec<Duration>,
}

/// One run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub class: Class,
    pub wiring: Wiring,
    pub producers: Vec<ProducerSpec>,
    pub ordered: bool,
    pub max_message_bytes: u64,
    pub max_reassembly_bytes: u64,
    pub max_out_of_order: Limit<usize>,
    /// Probabilities per message on each link.
    pub drop: f64,
    pub duplicate: f64,
    pub max_latency: Duration,
    /// Probability that a handler run fails (no ACK).
    pub handler_failure: f64,
    pub consumer_restarts: Vec<Duration>,
    /// From then on: no loss, no failure, no restart.
    pub heal_at: Duration,
}

/// The longest message.
pub const MAX_LEN: usize = 4000;
pub const RESEND_TIMEOUT: Duration = Duration::from_millis(500);

impl Scenario {
    /// The run of `seed`, sound.
    pub fn of_seed(seed: u64) -> Self {
        let class = CLASSES[(seed % CLASSES.len() as u64) as usize];
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xc4a7_1e5e);
        let heal_at = Duration::from_secs(rng.random_range(20..=40));
        let before_heal = |rng: &mut SmallRng| {
            Duration::from_millis(rng.random_range(0..heal_at.as_millis() as u64))
        };
        let restarting = matches!(class, Class::ProducerRestarts | Class::All);
        let producers = (0..rng.random_range(1..=3))
            .map(|_| {
                let messages = (0..rng.random_range(5..=25))
                    .map(|_| {
                        let at = Duration::from_millis(
                            rng.random_range(0..heal_at.as_millis() as u64 * 3 / 4),
                        );
                        (at, rng.random_range(1..=MAX_LEN))
                    })
                    .collect();
                let restarts = if restarting {
                    (0..rng.random_range(1..=3))
                        .map(|_| before_heal(&mut rng))
                        .collect()
                } else {
                    Vec::new()
                };
                ProducerSpec {
                    window: rng.random_range(1..=8),
                    chunk_size: rng.random_range(128..=512),
                    messages,
                    restarts,
                }
            })
            .collect();
        let lossy = !matches!(class, Class::Tight) || rng.random_bool(0.5);
        let tight = matches!(class, Class::Tight | Class::All);
        let consumer_restarts = if matches!(class, Class::ConsumerRestarts | Class::All) {
            (0..rng.random_range(1..=4))
                .map(|_| before_heal(&mut rng))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            seed,
            class,
            wiring: Wiring::Sound,
            producers,
            ordered: matches!(class, Class::Ordered)
                || (class == Class::All && rng.random_bool(0.5)),
            max_message_bytes: MAX_LEN as u64,
            max_reassembly_bytes: if tight {
                rng.random_range(MAX_LEN as u64..=2 * MAX_LEN as u64)
            } else {
                64 * MAX_LEN as u64
            },
            max_out_of_order: if tight {
                Limit::At(rng.random_range(1..=4))
            } else {
                Limit::At(1024)
            },
            drop: if lossy {
                rng.random_range(0.02..0.25)
            } else {
                0.0
            },
            duplicate: if lossy {
                rng.random_range(0.0..0.15)
            } else {
                0.0
            },
            max_latency: Duration::from_millis(rng.random_range(1..=300)),
            handler_failure: if tight {
                rng.random_range(0.05..0.3)
            } else {
                0.02
            },
            consumer_restarts,
            heal_at,
        }
    }

    /// How long after the heal every message must be confirmed.
    pub fn liveness_bound(&self) -> Duration {
        Duration::from_secs(120)
    }

    /// The consumer's `min_reassembly_rate`, as a deployment must set it (below what its
    /// producers achieve): half the slowest producer's pace once healed, a window of chunks
    /// per round trip.
    pub fn min_reassembly_rate(&self) -> u64 {
        let round_trip_ms = 2 * self.max_latency.as_millis() as u64;
        let pace = |p: &ProducerSpec| (p.window * p.chunk_size) as u64 * 1000 / round_trip_ms;
        let slowest = self.producers.iter().map(pace).min().unwrap_or(1);
        (slowest / 2).max(1)
    }
}
