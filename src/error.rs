//! The errors of delivery, of options and of a part's start and end (the core's), with its
//! error chain for the shells' own errors.

pub(crate) use actix_delivery_proto::error::*;
