//! What a work-pulling producer hands its dead-letter sink: a job it gave up.

use actix::Message;
use serde::{Deserialize, Serialize};

use crate::codec::{Codec, Manifest};
use crate::delivery::dead_letters::{delivery_key, DeadLetterCause, NewDeadLetter, SourceKind};
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

impl<T> GivenUpJob<T> {
    /// The dead letter kept of it for the pool `source`: the body as `encode` (MessagePack)
    /// writes it (if it encodes; else no body, and the error says why), the job's stable id
    /// as key and origin.
    pub(crate) fn to_dead_letter(
        &self,
        source: &str,
        encode: fn(&T) -> Result<Vec<u8>, String>,
    ) -> NewDeadLetter {
        let encoded = encode(&self.job.body);
        let mut error = self.last_error.clone();
        if let Err(unencodable) = &encoded {
            error = format!("{error}; the body was not kept: {unencodable}");
        }
        let body = encoded.ok();
        NewDeadLetter {
            kind: SourceKind::WorkPulling,
            source: source.to_owned(),
            cause: DeadLetterCause::GivenUp,
            key: delivery_key(&self.job.info),
            origin: Some(self.job.info.clone()),
            manifest: Manifest::new(Codec::MessagePack, std::any::type_name::<T>(), 1),
            body_len: body.as_ref().map_or(0, |body| body.len() as u64),
            body,
            attempts: self.attempts,
            error,
        }
    }
}
