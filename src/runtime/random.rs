//! The OS randomness the shells draw from, and the random values they make of it.
//!
//! The sans-IO core reads no OS randomness (its constructors take seeds or a source of draws,
//! so that simulations replay); these are the shells' ways to make the same values from the OS
//! CSPRNG.

use actix_delivery_proto::protocol::envelope::Incarnation;

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

/// A fresh incarnation token from the OS CSPRNG.
///
/// # Panics
/// As [`random_u64`].
pub(crate) fn random_incarnation() -> Incarnation {
    Incarnation::from_u128(u128::from_le_bytes(random_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_incarnations_differ() {
        assert_ne!(random_incarnation(), random_incarnation());
    }
}
