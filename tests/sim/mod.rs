//! A deterministic, seeded simulator of the pure protocol cores.
//!
//! One seeded RNG drives two lossy links (producer → consumer and back), the handler's
//! failures and durations, and the traffic. Virtual time jumps from event to event. After a
//! run, [`check`] verifies the delivery guarantees; [`report::run_checked`] combines both and
//! explains a failure with the seed, the scenario and the trace tail.

pub mod check;
pub mod driver;
pub mod events;
pub mod link;
pub mod matrix;
pub mod observe;
pub mod report;
pub mod scenario;
pub mod stable_hash;
pub mod strategy;
pub mod tally;
pub mod trace;
