//! What the starter of a projection keeps: its stats, and a way to stop it and to learn how it
//! ended.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::error::StartError;
use crate::projection::{ProjectionError, ProjectionStats};
use crate::runtime::shutdown::{once_stopped_or, GracefulStop, StopFuture};

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
    /// Turns true once the stored offset is loaded and fits the projection.
    opened: watch::Receiver<bool>,
    finished: watch::Receiver<Option<Result<(), ProjectionError>>>,
}

impl ProjectionHandle {
    pub(crate) fn new(
        stats: Arc<Mutex<ProjectionStats>>,
        stop: watch::Sender<bool>,
        opened: watch::Receiver<bool>,
        finished: watch::Receiver<Option<Result<(), ProjectionError>>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                stats,
                stop,
                opened,
                finished,
            }),
        }
    }

    /// Resolves once the projection has loaded its stored offset and found that it fits (at
    /// once if it did before), or has ended without getting there. Await it before relying on
    /// the read model: a projection that cannot start says why here, not only in the log.
    /// An offset store or journal that cannot be reached is not a reason: the projection
    /// tries again after a growing delay, and this waits on (bound it with
    /// `tokio::time::timeout`).
    ///
    /// # Errors
    /// [`StartError::Failed`] with the [`ProjectionError`] that ended it first
    /// ([`ProjectionError::Refused`]: its stored offsets do not fit; [`ProjectionError::Journal`],
    /// [`ProjectionError::Gone`]); [`StartError::Stopped`] if it was stopped first.
    pub async fn opened(&self) -> Result<(), StartError<ProjectionError>> {
        let mut opened = self.inner.opened.clone();
        let mut finished = self.inner.finished.clone();
        tokio::select! {
            biased;
            Ok(_) = opened.wait_for(|&opened| opened) => return Ok(()),
            _ = finished.wait_for(Option::is_some) => {}
        }
        if *opened.borrow() {
            return Ok(());
        }
        match self.stopped().await {
            Ok(()) => Err(StartError::Stopped),
            Err(error) => Err(StartError::Failed(error)),
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

        match finished.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or(Err(ProjectionError::Gone)),
            Err(_) => Err(ProjectionError::Gone),
        }
    }
}

impl GracefulStop for ProjectionHandle {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        let handle = self.clone();
        once_stopped_or(async move { handle.stopped().await })
    }
}
