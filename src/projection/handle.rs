//! What the starter of a projection keeps: its stats, and a way to stop it and to learn how it
//! ended.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::projection::{ProjectionError, ProjectionStats};

/// A running projection. Clones share it; dropping them all leaves it running (until its
/// arbiter stops).
#[derive(Clone, Debug)]
pub struct ProjectionHandle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stats: Arc<Mutex<ProjectionStats>>,
    stop: watch::Sender<bool>,
    finished: watch::Receiver<Option<Result<(), ProjectionError>>>,
}

impl ProjectionHandle {
    pub(crate) fn new(
        stats: Arc<Mutex<ProjectionStats>>,
        stop: watch::Sender<bool>,
        finished: watch::Receiver<Option<Result<(), ProjectionError>>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                stats,
                stop,
                finished,
            }),
        }
    }

    /// The counters so far (updated after every step).
    pub fn stats(&self) -> ProjectionStats {
        *self
            .inner
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the projection: the batch in flight is finished (its transaction commits or
    /// not, as it would have), at least once stores the offset of what was handled, then it
    /// ends; [`stopped`](Self::stopped) resolves after that.
    pub fn stop(&self) {
        self.inner.stop.send_replace(true);
    }

    /// Resolves once the projection has ended: `Ok` after [`stop`](Self::stop),
    /// [`ProjectionError::Poison`] if the poison policy stopped it, [`ProjectionError::Gone`]
    /// if its arbiter stopped first.
    ///
    /// # Errors
    /// Why the projection ended, unless it was stopped.
    pub async fn stopped(&self) -> Result<(), ProjectionError> {
        let mut finished = self.inner.finished.clone();
        let result = match finished.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or(Err(ProjectionError::Gone)),
            Err(_) => Err(ProjectionError::Gone),
        };
        result
    }
}
