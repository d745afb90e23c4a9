//! A deterministic, seeded simulator of the pure protocol cores.
//!
//! One seeded RNG drives two lossy links (producer → consumer and back), the handler's
//! failures and durations (slow and stuck runs included), the traffic, a forger that speaks
//! for a victim producer, and the durable storage of durable producers and outbox entities
//! ([`durable`]: journals that commit one write at a time after a seeded latency, crashes that
//! lose everything not committed). Virtual time jumps from event to event. The driver checks
//! the per-decision rules as the run goes (named rules, see `driver`); after a run, [`check`]
//! verifies the delivery guarantees; [`report::run_checked`] combines both and explains a
//! failure with the seed, the broken rules, the scenario and the trace tail.

pub mod check;
pub mod driver;
pub mod durable;
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
