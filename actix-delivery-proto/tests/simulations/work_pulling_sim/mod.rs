//! The work-pulling simulator: [`scenario`] draws a run from its seed, [`world`] simulates
//! it, [`model`] checks the pool against a reference model as it goes, [`check`] judges the
//! run and reports a failure, [`tally`] counts the faults.

pub mod check;
pub mod model;
pub mod scenario;
pub mod tally;
pub mod world;
