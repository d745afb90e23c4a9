//! The OS randomness the shells draw from, and the random constructors of core values.
//!
//! The sans-IO core reads no OS randomness (its constructors take seeds or a source of draws,
//! so that simulations replay); these are the shells' ways to make the same values from the OS
//! CSPRNG.

use crate::config::ProducerConfig;
use crate::protocol::chunk::producer::ChunkedProducer;
use crate::protocol::envelope::{Incarnation, ProducerId};
use crate::protocol::producer::ProducerCore;

/// A 64-bit value from the OS CSPRNG.
///
/// # Panics
/// If the operating system cannot provide randomness (a broken platform; continuing with
/// guessable tokens would silently weaken ACK validation).
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().expect("the OS random number generator failed")
}

/// `N` bytes from the OS CSPRNG.
///
/// # Panics
/// As [`random_u64`].
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS random number generator failed");
    bytes
}

impl ProducerId {
    /// A fresh id of the form `producer-` followed by 16 hex digits from the OS CSPRNG.
    pub fn random() -> Self {
        Self::from(format!("producer-{:016x}", random_u64()))
    }
}

impl Incarnation {
    /// A fresh token from the OS CSPRNG.
    ///
    /// # Panics
    /// If the operating system cannot provide randomness (a broken platform; continuing with a
    /// guessable token would silently weaken ACK validation).
    pub fn random() -> Self {
        Self::from_u128(u128::from_le_bytes(random_bytes()))
    }
}

impl<T: Clone, C> ProducerCore<T, C> {
    /// A producer with the given (validated) settings and incarnation. The id is
    /// `config.producer_id`, or a random one; the retransmission jitter is seeded from the OS
    /// CSPRNG (see [`seeded`](Self::seeded)).
    pub fn new(config: &ProducerConfig, incarnation: Incarnation) -> Self {
        Self::seeded(config, incarnation, random_u64)
    }
}

impl<C> ChunkedProducer<C> {
    /// A producer with the given (validated) settings and incarnation (see
    /// [`ProducerCore::new`]).
    pub fn new(config: &ProducerConfig, incarnation: Incarnation) -> Self {
        Self::seeded(config, incarnation, random_u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_and_incarnations_differ_and_have_the_documented_shape() {
        let id = ProducerId::random();
        assert!(id.as_str().starts_with("producer-"));
        assert_eq!(id.len(), "producer-".len() + 16);
        assert_ne!(ProducerId::random(), id);
        assert_ne!(Incarnation::random(), Incarnation::random());
    }
}
