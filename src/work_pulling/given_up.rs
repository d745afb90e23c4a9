//! What a work-pulling producer hands its dead-letter sink: a job it gave up.

use actix::Message;
use serde::{Deserialize, Serialize};

use crate::work_pulling::Job;

/// A job the pool gave up after it failed
/// [`give_up_after`](crate::work_pulling::WorkPullingOptionsBuilder::give_up_after) times,
/// sent to the sink of
/// [`dead_letters`](crate::work_pulling::WorkPullingOptionsBuilder::dead_letters). Its sender's
/// confirmation reports [`DeliveryError::HandlingFailed`](crate::DeliveryError::HandlingFailed),
/// and no worker gets it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GivenUpJob<T> {
    /// The job: its body and its stable id ([`Job::info`]).
    pub job: Job<T>,
    /// How many times it failed.
    pub attempts: u32,
    /// The last failure: the worker it failed at and why (its stream got no confirmation; a
    /// handler's own error stays with its worker).
    pub last_error: String,
}

impl<T: Send + 'static> Message for GivenUpJob<T> {
    type Result = ();
}
