//! A lossy network link: per message it decides whether the message is lost, whether it is
//! duplicated, and how long each copy takes (copies overtake each other when latencies vary).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;

use super::scenario::LinkFaults;

/// What a link did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkCounts {
    /// Messages offered to the link.
    pub messages: u64,
    /// Messages lost.
    pub dropped: u64,
    /// Messages delivered twice.
    pub duplicated: u64,
}

impl LinkCounts {
    /// The sum of two counts.
    pub fn add(&mut self, other: &LinkCounts) {
        self.messages += other.messages;
        self.dropped += other.dropped;
        self.duplicated += other.duplicated;
    }
}

/// One direction of the network.
#[derive(Debug)]
pub struct Link {
    faults: LinkFaults,
    counts: LinkCounts,
}

impl Link {
    /// A link with the given faults.
    pub fn new(faults: LinkFaults) -> Self {
        Self {
            faults,
            counts: LinkCounts::default(),
        }
    }

    /// The fate of one message: the delay of each copy that arrives (none, one or two).
    pub fn transmit(&mut self, rng: &mut SmallRng) -> [Option<Duration>; 2] {
        self.counts.messages += 1;
        if rng.random_bool(self.faults.drop) {
            self.counts.dropped += 1;
            return [None, None];
        }
        let first = Some(self.latency(rng));
        if rng.random_bool(self.faults.duplicate) {
            self.counts.duplicated += 1;
            return [first, Some(self.latency(rng))];
        }
        [first, None]
    }

    /// What the link did so far.
    pub fn counts(&self) -> LinkCounts {
        self.counts
    }

    fn latency(&self, rng: &mut SmallRng) -> Duration {
        rng.random_range(self.faults.min_latency..=self.faults.max_latency)
    }
}
