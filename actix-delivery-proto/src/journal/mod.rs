//! The journal's data types: persistence ids, journal ids, tags and slices, stored events
//! and snapshots, tag queries and offsets, and the journal's errors.

pub mod by_tag;
pub mod error;
pub mod event;
pub mod id;
pub mod journal_id;
pub mod tag;
