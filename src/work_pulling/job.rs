//! What a worker receives: a job's body with its stable id.

use serde::{Deserialize, Serialize};

use crate::delivery::handler::DeliveryHandler;
use crate::persistence::{CommandError, EventSourced, PersistentHandle};
use crate::protocol::envelope::DeliveryInfo;

/// A job as a worker's handler sees it: the body, and the job's stable identity.
///
/// `info` is the job's id: the work-pulling producer's id, the public id of the token its
/// worker streams carry (derived from the producer's incarnation, see
/// [`protocol::origin`](crate::protocol::origin)) and the job's seq at the producer. It stays
/// the same however often the job is re-routed and to whichever worker, and, for a durable
/// work-pulling producer, across the producer's restarts: a persistent worker records it as
/// the processed mark ([`PersistentHandle::job_handler`]), so a job done once is recognised
/// under any worker's stream, and refuses a job whose id is not the carrying stream's own. (The worker stream's own delivery info, which
/// [`DeliveryHandler::from_fn_with_info`](crate::DeliveryHandler::from_fn_with_info) shows,
/// changes with every re-routing.)
///
/// [`PersistentHandle::job_handler`]: crate::persistence::PersistentHandle::job_handler
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job<T> {
    /// The job's stable id (and, in `trace_context`, the trace it was sent in).
    pub info: DeliveryInfo,
    /// The job.
    pub body: T,
}

impl<T> Job<T> {
    /// The body, dropping the id.
    pub fn into_body(self) -> T {
        self.body
    }
}

// Beside the job, not the entity: persistence sits below work pulling.
impl<E: EventSourced> PersistentHandle<E> {
    /// The handler of an effectively-once **worker** of a work-pulling producer: as
    /// [`delivery_handler`](Self::delivery_handler), but the processed mark is the job's
    /// stable id ([`Job::info`](crate::work_pulling::Job)), not the worker stream's delivery.
    /// A job re-routed from a worker that died after committing it is answered "already
    /// processed" by any worker on this entity's journal stream, so its events are stored
    /// once. A job below a processed job's `window_start` that this entity did not process
    /// was confirmed by a worker elsewhere (the producer's window only passes confirmed
    /// jobs): it is refused as stale (counted) and ACKed, which frees its worker's slot and
    /// confirms nothing. Leave `must_follow` off: a worker sees only some of the jobs.
    ///
    /// A job whose id is not the sending worker stream's own (its token does not have the
    /// id's public incarnation id, see [`check_origin`](crate::protocol::origin::check_origin))
    /// is a dead letter of the consumer ([`DeadLetterReason::ForeignOrigin`]): never run nor
    /// ACKed, and no window of the entity's record moves.
    ///
    /// [`DeadLetterReason::ForeignOrigin`]: crate::DeadLetterReason::ForeignOrigin
    pub fn job_handler<T: 'static>(
        &self,
        mut to_command: impl FnMut(T) -> E::Command + 'static,
    ) -> DeliveryHandler<Job<T>> {
        let entity = self.clone();
        let handler = DeliveryHandler::pipelined(move |_, job: Job<T>| {
            // A job is one message of its producer: its mark covers its seq alone, whatever
            // range a sender wrote into the id (which would mark seqs no job processed).
            let info = DeliveryInfo {
                first_seq: None,
                ..job.info
            };
            let answer = entity.ask_delivered(info, to_command(job.body));
            async move {
                match answer.await {
                    Ok(_) | Err(CommandError::Stale) => Ok(()),
                    Err(error) => Err(error),
                }
            }
        });
        handler.admitting(|carrier, job: &Job<T>| {
            crate::protocol::origin::check_origin(carrier, &job.info)
        })
    }
}
