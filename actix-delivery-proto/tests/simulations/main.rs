//! The seeded simulators of the pure cores, in virtual time (no actors, no sockets, no
//! clock): the delivery protocol's producers and consumers through faulty links
//! (`simulator`), the work-pulling pool's wiring (`work_pulling`), and chunked messages
//! (`chunking_sim`). A failure names its seed; each module's docs say how to replay one.

// Each simulation reads the clock once, for the base of its virtual time.
#![allow(clippy::disallowed_methods)]

/// The delivery simulator's world (its modules name each other from the crate root).
mod sim;

mod chunking_sim;
mod simulator;
mod work_pulling;
