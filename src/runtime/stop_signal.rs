//! A controller's life as its handles see it: whether it opened (its stream open, its state
//! recovered), and once it stopped for good, why. "Stopped for good" is set when a controller
//! is stopped on purpose or fails in a way no restart mends (a supervised one then stays inert
//! instead of serving again); a controller dropped without it (no `Supervisor`) is stopped for
//! good too, with the failure that ended it.

use std::future::Future;

use actix::{MailboxError, Message};
use tokio::sync::watch;

use crate::error::{Failure, StartError};

/// What a controller announces to its handles.
#[derive(Clone, Debug, Default)]
pub(crate) struct Life {
    /// It opened (at least once).
    opened: bool,
    /// It stopped for good: `Ok` without a failure (on request, its handles dropped, its
    /// arbiter stopped), or the failure that ended it.
    stopped: Option<Result<(), Failure>>,
}

/// A controller's record of its life, and the channel that announces it.
#[derive(Debug)]
pub(crate) struct StopSignal {
    is_final: bool,
    /// The first failure of the current life (forgotten by a supervised restart, unless it
    /// was for good).
    failure: Option<Failure>,
    announce: watch::Sender<Life>,
}

impl Default for StopSignal {
    fn default() -> Self {
        Self {
            is_final: false,
            failure: None,
            announce: watch::channel(Life::default()).0,
        }
    }
}

impl StopSignal {
    /// Records a stop for good; false if it was recorded before.
    pub(crate) fn make_final(&mut self) -> bool {
        !std::mem::replace(&mut self.is_final, true)
    }

    /// Whether the controller was stopped for good.
    pub(crate) fn is_final(&self) -> bool {
        self.is_final
    }

    /// Records why the controller stops (the first reason of a life counts).
    pub(crate) fn fail(&mut self, failure: Failure) {
        self.failure.get_or_insert(failure);
    }

    /// A supervised restart: the failure of the life that ended is mended by the next one.
    pub(crate) fn restarting(&mut self) {
        if !self.is_final {
            self.failure = None;
        }
    }

    /// Tells the handles that the controller opened.
    pub(crate) fn opened(&self) {
        self.announce
            .send_if_modified(|life| !std::mem::replace(&mut life.opened, true));
    }

    /// Tells the waiting handles, once the controller has settled everything, that it
    /// stopped for good, and why.
    pub(crate) fn announce_if_final(&self) {
        if self.is_final {
            self.announce_stopped();
        }
    }

    fn announce_stopped(&self) {
        let result = self.failure.clone().map_or(Ok(()), Err);
        self.announce.send_if_modified(|life| {
            life.stopped.is_none() && {
                life.stopped = Some(result);
                true
            }
        });
    }

    /// A receiver of the controller's life.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Life> {
        self.announce.subscribe()
    }
}

impl Drop for StopSignal {
    /// The controller is gone: stopped for good, whatever it announced.
    fn drop(&mut self) {
        self.announce_stopped();
    }
}

/// Asks a controller for its life's announcements.
pub(crate) struct SubscribeStopped;

impl Message for SubscribeStopped {
    type Result = watch::Receiver<Life>;
}

/// Resolves once the controller of `life` has opened (`Ok`, at once if it did before), or
/// has stopped for good without having opened (why).
pub(crate) async fn wait_opened(mut life: watch::Receiver<Life>) -> Result<(), StartError> {
    let seen = life
        .wait_for(|life| life.opened || life.stopped.is_some())
        .await
        .map(|life| life.clone())
        .unwrap_or_default();
    match seen.stopped {
        _ if seen.opened => Ok(()),
        Some(Err(failure)) => Err(StartError::Failed(failure)),
        Some(Ok(())) | None => Err(StartError::Stopped),
    }
}

/// Resolves once the controller of `life` has stopped for good: `Ok` without a failure, or
/// the failure that ended it.
pub(crate) async fn wait_for_stop(mut life: watch::Receiver<Life>) -> Result<(), Failure> {
    match life.wait_for(|life| life.stopped.is_some()).await {
        Ok(life) => life.stopped.clone().unwrap_or(Ok(())),
        // Unreachable: the signal announces its stop when it is dropped.
        Err(_) => Ok(()),
    }
}

/// Resolves once the controller behind `subscription` has stopped for good or is gone.
pub(crate) async fn wait_stopped(
    subscription: impl Future<Output = Result<watch::Receiver<Life>, MailboxError>>,
) {
    // A closed mailbox: the controller is gone.
    if let Ok(life) = subscription.await {
        let _ = wait_for_stop(life).await;
    }
}
