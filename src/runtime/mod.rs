//! Actor plumbing that every subsystem's shell uses: timers (`alarm`), draining before a stop
//! (`after_drain`), the stop signal that handles await, where an actor runs (`placement`), the
//! one backoff every reconnection waits by (`backoff`, pure), and the coordinated shutdown of
//! a whole application (`shutdown`, public). No delivery logic lives here.

pub(crate) mod after_drain;
pub(crate) mod alarm;
pub(crate) use actix_delivery_proto::runtime::backoff;
pub(crate) mod error_chain;
pub(crate) mod placement;
pub(crate) mod random;
pub mod shutdown;
pub(crate) mod stop_signal;
