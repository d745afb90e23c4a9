//! The core of event-sourced entities: the behaviour an entity implements, its settings,
//! the recovery and command core, its records of deliveries and its outbox's state.

pub mod behavior;
pub mod config;
pub mod core;
pub mod delivery_record;
pub mod entry;
pub mod error;
pub mod inspect;
pub mod outbox_state;
pub mod type_names;
