//! A hash that is the same in every process: for the determinism check's trace digest, and
//! for the simulator's own maps (so that even their iteration order is reproducible).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`StableHasher`].
pub type StableMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

/// A 64-bit FNV-1a-style hasher that mixes whole integers at once: stable across processes
/// (unlike the randomly keyed `DefaultHasher`), which is what a determinism check needs, and
/// cheap in debug builds.
#[derive(Clone, Copy, Debug)]
pub struct StableHasher(u64);

impl StableHasher {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// A hasher that continues from the digest `state`.
    pub fn resume(state: u64) -> Self {
        Self(state)
    }

    fn mix(&mut self, word: u64) {
        self.0 = (self.0 ^ word).wrapping_mul(Self::PRIME);
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.mix(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_u128(&mut self, n: u128) {
        self.mix(n as u64);
        self.mix((n >> 64) as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn write_isize(&mut self, n: isize) {
        self.mix(n as u64);
    }
}
