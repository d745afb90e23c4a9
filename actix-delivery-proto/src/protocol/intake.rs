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
//!   it, the producer has settled it and never sends it again, so it is forgotten, and so is
//!   one held there (the producer gave it up: a confirmation of it still gets its ACK, which
//!   the producer ignores).

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

/// What the intake knows of one seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Held,
    Confirmed,
}

/// The deliveries of one producer stream held by an in-process consumer, keyed by seq.
#[derive(Debug, Default)]
pub struct Intake {
    incarnation: Option<(Incarnation, IncarnationId)>,
    /// By seq, at or above the producer's last `window_start`: the deliveries held and those
    /// confirmed. A confirmation changes its seq in place, in whatever order they come.
    seqs: KeyedRing<State>,
    /// How many of `seqs` are held.
    held: usize,
}

impl Intake {
    /// Looks at a delivery of `incarnation`, `seq` and `window_start`.
    pub fn take(&mut self, incarnation: Incarnation, seq: u64, window_start: u64) -> Taken {
        let (id, restarted) = match self.incarnation {
            Some((token, id)) if token == incarnation => (id, false),
            _ => {
                self.seqs.clear();
                self.held = 0;
                let id = incarnation.id();
                let restarted = self.incarnation.is_some();
                self.incarnation = Some((incarnation, id));
                (id, restarted)
            }
        };
        while let Some((first, state)) = self.seqs.front()
            && first < window_start
        {
            self.held -= usize::from(*state == State::Held);
            self.seqs.pop_front();
        }
        match self.seqs.get(seq) {
            Some(State::Confirmed) => Taken::AckAgain,
            Some(State::Held) => Taken::Copy,
            None => Taken::New {
                incarnation: id,
                restarted,
            },
        }
    }

    /// Holds the new delivery `seq` (see [`take`](Self::take)).
    pub fn hold(&mut self, seq: u64) {
        if self.seqs.insert(seq, State::Held) != Some(State::Held) {
            self.held += 1;
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
        match self.seqs.get_mut(seq) {
            Some(state) => {
                self.held -= usize::from(*state == State::Held);
                *state = State::Confirmed;
            }
            None => {
                self.seqs.insert(seq, State::Confirmed);
            }
        }
        true
    }

    /// How many deliveries are held.
    pub fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_held_delivery_is_nothing_and_a_confirmed_one_is_acked_again() {
        let mut intake = Intake::default();
        let life = Incarnation::from_u128(1);
        assert!(matches!(
            intake.take(life, 1, 1),
            Taken::New {
                restarted: false,
                ..
            }
        ));
        intake.hold(1);
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
    fn confirmations_in_any_order_count_and_below_the_window_start_everything_is_forgotten() {
        let mut intake = Intake::default();
        let life = Incarnation::from_u128(1);
        for seq in 1..=4 {
            assert!(matches!(intake.take(life, seq, 1), Taken::New { .. }));
            intake.hold(seq);
        }
        assert!(intake.confirm(life, 3) && intake.confirm(life, 2));
        assert_eq!(intake.held(), 2);
        assert_eq!(intake.take(life, 3, 1), Taken::AckAgain);
        assert_eq!(intake.take(life, 1, 1), Taken::Copy);
        // The producer gave 1 up and settled 2 and 3: its window starts at 4.
        assert_eq!(intake.take(life, 4, 4), Taken::Copy);
        assert_eq!(intake.held(), 1, "1 is forgotten with the confirmed ones");
        assert!(
            intake.confirm(life, 1),
            "a late confirmation still gets its ACK"
        );
        assert!(matches!(intake.take(life, 5, 4), Taken::New { .. }));
        assert!(
            matches!(intake.take(life, 1, 4), Taken::New { .. }),
            "and is forgotten"
        );
        assert_eq!(intake.held(), 1);
    }

    #[test]
    fn holding_a_held_seq_again_holds_it_once() {
        let mut intake = Intake::default();
        let life = Incarnation::from_u128(1);
        intake.take(life, 5, 1);
        intake.hold(5);
        intake.hold(5);
        assert_eq!(intake.held(), 1);
        assert_eq!(intake.seqs.get(5), Some(&State::Held));
    }

    #[test]
    fn a_new_incarnation_forgets_the_previous_life_and_its_late_confirmations() {
        let mut intake = Intake::default();
        let (old, new) = (Incarnation::from_u128(1), Incarnation::from_u128(2));
        intake.take(old, 1, 1);
        intake.hold(1);
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
        intake.hold(1);
        assert_eq!(intake.take(new, 1, 1), Taken::Copy);
    }
}
