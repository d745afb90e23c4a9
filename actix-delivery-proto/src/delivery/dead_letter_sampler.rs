//! Sampling floods of refused input: a peer that sends undecodable or malformed messages in
//! bulk gets a few of them kept and the rest counted, whatever its pace.

use std::collections::HashMap;

use crate::delivery::dead_letters::{DeadLetterCause, DeadLetterLimits};

/// The most sources (name and cause) a sampler tracks; a dead letter of a source beyond is
/// counted, not kept. Sources are the application's parts, so this is never reached in
/// practice; it bounds the sampler all the same.
pub const MAX_SAMPLED_SOURCES: usize = 1024;

/// A token bucket per source and cause: `sample_burst` dead letters at once, then one per
/// `sample_interval_ms`. Causes that are not a peer's input are always kept.
#[derive(Debug)]
pub struct FloodSampler {
    burst: u32,
    interval_ms: u64,
    buckets: HashMap<(String, DeadLetterCause), Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: u32,
    refilled_at_ms: u64,
}

impl FloodSampler {
    /// A sampler for `limits`' `sample_burst` and `sample_interval_ms`.
    pub fn new(limits: &DeadLetterLimits) -> Self {
        Self {
            burst: limits.sample_burst.max(1),
            interval_ms: limits.sample_interval_ms.max(1),
            buckets: HashMap::new(),
        }
    }

    /// Whether a dead letter of `source` for `cause` at `now_ms` is kept (`false`: count it
    /// as sampled out).
    pub fn admit(&mut self, source: &str, cause: DeadLetterCause, now_ms: u64) -> bool {
        if !cause.is_peer_input() {
            return true;
        }
        let key = (source.to_owned(), cause);
        if !self.buckets.contains_key(&key) && self.buckets.len() >= MAX_SAMPLED_SOURCES {
            return false;
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            refilled_at_ms: now_ms,
        });
        let earned = now_ms.saturating_sub(bucket.refilled_at_ms) / self.interval_ms;
        if earned > 0 {
            bucket.tokens = (u64::from(bucket.tokens) + earned).min(u64::from(self.burst)) as u32;
            bucket.refilled_at_ms += earned * self.interval_ms;
        }
        if bucket.tokens == 0 {
            return false;
        }
        bucket.tokens -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(burst: u32, interval_ms: u64) -> FloodSampler {
        FloodSampler::new(&DeadLetterLimits {
            sample_burst: burst,
            sample_interval_ms: interval_ms,
            ..DeadLetterLimits::default()
        })
    }

    #[test]
    fn a_burst_is_kept_then_one_per_interval_however_patient_the_peer() {
        let mut sampler = sampler(3, 1000);
        let kept = (0..100)
            .filter(|_| sampler.admit("orders", DeadLetterCause::Undecodable, 0))
            .count();
        assert_eq!(kept, 3);
        // A patient peer sending one every 100 ms for 10 s gets one kept a second.
        let kept = (1..=100)
            .filter(|n| sampler.admit("orders", DeadLetterCause::Undecodable, n * 100))
            .count();
        assert_eq!(kept, 10);
    }

    #[test]
    fn the_own_give_ups_are_always_kept_and_causes_are_sampled_apart() {
        let mut sampler = sampler(1, 1000);
        assert!((0..50).all(|_| sampler.admit("pool", DeadLetterCause::GivenUp, 0)));
        assert!(sampler.admit("c", DeadLetterCause::Malformed, 0));
        assert!(!sampler.admit("c", DeadLetterCause::Malformed, 0));
        assert!(sampler.admit("c", DeadLetterCause::Undecodable, 0));
        assert!(sampler.admit("d", DeadLetterCause::Malformed, 0));
    }

    #[test]
    fn sources_beyond_the_bound_are_counted_not_tracked() {
        let mut sampler = sampler(1, 1000);
        for n in 0..MAX_SAMPLED_SOURCES {
            assert!(sampler.admit(&n.to_string(), DeadLetterCause::Malformed, 0));
        }
        assert!(!sampler.admit("one more", DeadLetterCause::Malformed, 0));
        assert_eq!(sampler.buckets.len(), MAX_SAMPLED_SOURCES);
    }
}
