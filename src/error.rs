//! The errors of delivery ([`DeliveryError`], [`TellError`]), of options ([`OptionsError`]),
//! and what the handles say of a part's start and end ([`Failure`], [`StartError`]); each says
//! whether what failed certainly did not happen ([`Happened`]). The journals', transports' and
//! subsystems' errors live in their modules.

pub use actix_delivery_proto::error::{
    DeliveryError, Failure, Happened, OptionsError, StartError, TellError,
};
// The core's error chain, for the shells' errors.
pub(crate) use actix_delivery_proto::error::*;
