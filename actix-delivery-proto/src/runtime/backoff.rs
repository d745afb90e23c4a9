//! The wait between reconnection attempts, of every part that reconnects (the TCP transport,
//! the PostgreSQL journal's writer, projections): doubling from `min` to `max`, each wait
//! randomly shortened by up to half (so that many nodes do not reconnect in lockstep). Pure:
//! the shells pass the seed.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Exponential backoff with jitter.
#[derive(Debug)]
pub struct Reconnect {
    min: Duration,
    max: Duration,
    next: Duration,
    rng: SmallRng,
}

impl Reconnect {
    /// Waits from `min` up to `max` (`min <= max`), jitter drawn from `seed`.
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Self {
            min,
            max,
            next: min,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The next wait: in `[d/2, d]` for the current `d`, which then doubles (up to `max`).
    pub fn next_wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        let half = d / 2;
        half + half.mul_f64(self.rng.random::<f64>())
    }

    /// After a connection succeeded: start again from `min`.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_maximum_with_jitter_and_reset() {
        let (min, max) = (Duration::from_millis(100), Duration::from_millis(1000));
        let mut backoff = Reconnect::new(min, max, 7);
        let mut bound = min;
        for _ in 0..10 {
            let wait = backoff.next_wait();
            assert!(wait >= bound / 2 && wait <= bound, "{wait:?} for {bound:?}");
            bound = (bound * 2).min(max);
        }
        backoff.reset();
        assert!(backoff.next_wait() <= min);
        let waits: Vec<_> = (0..20).map(|_| backoff.next_wait()).collect();
        assert!(waits.windows(2).any(|w| w[0] != w[1]), "jittered");
    }
}
