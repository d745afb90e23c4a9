//! The entity of the persistence benchmarks (`#[path]`-included): a counter whose events carry
//! a 100-byte note, so entries are of a realistic size.

use actix_delivery::persistence::{Decision, EventSourced};
use serde::{Deserialize, Serialize};

/// Adds its command to the count (0 reads it: no event).
#[derive(Default, Serialize, Deserialize)]
pub struct Counter {
    pub count: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Counted {
    by: u64,
    note: String,
}

impl EventSourced for Counter {
    type Command = u64;
    type Event = Counted;
    type Reply = u64;
    type Rejection = String;

    fn decide(&self, &by: &u64) -> Result<Decision<Self>, String> {
        if by == 0 {
            return Ok(Decision::reply(self.count));
        }
        let note = "x".repeat(100);
        Ok(Decision::persist([Counted { by, note }], self.count + by))
    }

    fn apply(&mut self, event: &Counted) {
        self.count += event.by;
    }
}
