//! What a worker receives: a job's body with its stable id.

use serde::{Deserialize, Serialize};

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
