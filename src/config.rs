//! The settings of both controllers and the rules every settings struct follows (the crate
//! docs, "Configuration"): the core's, with its checks and serde helpers for the shells' own.

pub(crate) use actix_delivery_proto::config::*;
