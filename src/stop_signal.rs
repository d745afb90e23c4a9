//! "Stopped for good": set when a controller is stopped on purpose (a supervised one then stays
//! inert instead of serving again), and announced to handles awaiting it.

use std::future::Future;

use actix::{MailboxError, Message};
use tokio::sync::watch;

/// A controller's record of being stopped for good, and the channel that announces it.
#[derive(Debug)]
pub(crate) struct StopSignal {
    is_final: bool,
    announce: watch::Sender<bool>,
}

impl Default for StopSignal {
    fn default() -> Self {
        Self {
            is_final: false,
            announce: watch::channel(false).0,
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

    /// Tells the waiting handles, once the controller has settled everything.
    pub(crate) fn announce_if_final(&self) {
        if self.is_final {
            self.announce.send_replace(true);
        }
    }

    /// A receiver that turns `true` when the stop is announced (or closes when the controller
    /// is dropped).
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.announce.subscribe()
    }
}

/// Asks a controller for its stop announcement.
pub(crate) struct SubscribeStopped;

impl Message for SubscribeStopped {
    type Result = watch::Receiver<bool>;
}

/// Resolves once the controller behind `subscription` has stopped for good or is gone.
pub(crate) async fn wait_stopped(
    subscription: impl Future<Output = Result<watch::Receiver<bool>, MailboxError>>,
) {
    let Ok(mut stopped) = subscription.await else {
        return; // the mailbox is closed: the controller is gone
    };
    // An error means the controller was dropped: gone as well.
    let _ = stopped.wait_for(|&stopped| stopped).await;
}
