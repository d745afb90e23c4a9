//! The work-pulling pool: which worker gets which job.

pub mod pool;
