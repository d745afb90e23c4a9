//! The intake of an in-process consumer that holds what its producer delivers until something
//! downstream confirms it (a work-pulling pool, a sharded producer's router): which delivery
//! is new, which is a copy of one it holds, and which it confirmed already and only needs its
//! ACK again (a retransmission that crossed the ACK).
//!
//! Rules:
//! - deliveries of another incarnation than the one held mean the producer started a new
//!   life: it settled the previous life's messages itself, so they are forgotten;
//! - a copy of a held delivery changes nothing (its ACK follows its confirmation);
//! - a delivery confirmed at or above the producer's last `window_start` is ACKed again; below
//!   it, the producer has settled it and never sends it again, so it is forgotten.

use crate::protocol::ascending_set::AscendingSet;
use crate::protocol::envelope::{Incarnation, IncarnationId};
use crate::protocol::keyed_ring::KeyedRing;

/// What [`Intake::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// A new delivery: hold it ([`Intake::hold`]). `incarnation` is the public id of its
    /// producer's incarnation; `restarted`: the held deliveries of an earlier incarnation were
    /// forgotten.
    New {
        /// The public id of the delivery's incarnation.
        incarnation: IncarnationId,
        /// Whether the producer started a new life with it.
        restarted: bool,
    },
    /// A copy of a delivery held now: nothing to do.
    Copy,
    /// A delivery confirmed before: ACK it again.
    AckAgain,
}

/// The deliveries of one producer stream held by an in-process consumer, keyed by seq.
#[derive(Debug)]
pub struct Intake<K> {
    incarnation: Option<(Incarnation, IncarnationId)>,
    held: KeyedRing<K>,
    /// Seqs confirmed at or above the producer's last `window_start`.
    confirmed: AscendingSet,
}

impl<K> Default for Intake<K> {
    fn default() -> Self {
        Self {
            incarnation: None,
            held: KeyedRing::default(),
            confirmed: AscendingSet::default(),
        }
    }
}

impl<K: Copy> Intake<K> {
    /// Looks at a delivery of `incarnation`, `seq` and `window_start`.
    pub fn take(&mut self, incarnation: Incarnation, seq: u64, window_start: u64) -> Taken {
        let (id, restarted) = match self.incarnation {
            Some((token, id)) if token == incarnation => (id, false),
            _ => {
                self.held.clear();
                self.confirmed.clear();
                let id = incarnation.id();
                let restarted = self.incarnation.is_some();
                self.incarnation = Some((incarnation, id));
                (id, restarted)
            }
        };
        while self
            .confirmed
            .first()
            .is_some_and(|settled| settled < window_start)
        {
            self.confirmed.pop_first();
        }
        if self.confirmed.contains(seq) {
            return Taken::AckAgain;
        }
        if self.held.get(seq).is_some() {
            return Taken::Copy;
        }
        Taken::New {
            incarnation: id,
            restarted,
        }
    }

    /// Holds the new delivery `seq` (see [`take`](Self::take)) under `key` (a `seq` held
    /// already is held under `key` from now on).
    pub fn hold(&mut self, seq: u64, key: K) {
        match self.held.get_mut(seq) {
            Some(held) => *held = key,
            None => self.held.insert(seq, key),
        }
    }

    /// Delivery `seq` of `incarnation` was confirmed downstream: it is no longer held, and a
    /// copy of it is ACKed again. Returns whether it is of the current incarnation (an ACK
    /// for an earlier one's still goes out: its producer ignores it).
    pub fn confirm(&mut self, incarnation: Incarnation, seq: u64) -> bool {
        if self
            .incarnation
            .is_none_or(|(token, _)| token != incarnation)
        {
            return false;
        }
        self.held.remove(seq);
        self.confirmed.insert(seq);
        true
    }

    /// How many deliveries are held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_held_delivery_is_nothing_and_a_confirmed_one_is_acked_again() {
        let mut intake = Intake::<u32>::default();
        let life = Incarnation::from_u128(1);
        assert!(matches!(
            intake.take(life, 1, 1),
            Taken::New {
                restarted: false,
                ..
            }
        ));
        intake.hold(1, 10);
        assert_eq!(intake.take(life, 1, 1), Taken::Copy);
        assert!(intake.confirm(life, 1));
        assert_eq!(intake.held(), 0);
        assert_eq!(intake.take(life, 1, 1), Taken::AckAgain, "crossed its ACK");
        // The producer's window moved past 1: it never sends 1 again; 2 is new.
        assert!(matches!(intake.take(life, 2, 2), Taken::New { .. }));
        assert!(
            matches!(intake.take(life, 1, 2), Taken::New { .. }),
            "1 is forgotten below the window start"
        );
    }

    #[test]
    fn holding_a_held_seq_again_rekeys_it() {
        let mut intake = Intake::<u32>::default();
        let life = Incarnation::from_u128(1);
        intake.take(life, 5, 1);
        intake.hold(5, 10);
        intake.hold(5, 11);
        assert_eq!((intake.held(), intake.held.get(5)), (1, Some(&11)));
    }

    #[test]
    fn a_new_incarnation_forgets_the_previous_life_and_its_late_confirmations() {
        let mut intake = Intake::<u32>::default();
        let (old, new) = (Incarnation::from_u128(1), Incarnation::from_u128(2));
        intake.take(old, 1, 1);
        intake.hold(1, 10);
        let taken = intake.take(new, 1, 1);
        assert_eq!(
            taken,
            Taken::New {
                incarnation: new.id(),
                restarted: true
            }
        );
        assert_eq!(intake.held(), 0);
        assert!(!intake.confirm(old, 1), "the old life's");
        intake.hold(1, 11);
        assert_eq!(intake.take(new, 1, 1), Taken::Copy);
    }
}
