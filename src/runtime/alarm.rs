//! One `run_later` per actor, armed for the core's earliest deadline.

use std::time::Instant;

use actix::{Actor, AsyncContext, Context, SpawnHandle};

/// The current time on Actix's clock (Tokio's, so that `tokio::time::pause()` makes tests run
/// in virtual time), as the `std::time::Instant` the protocol core works with.
pub(crate) fn now() -> Instant {
    actix::clock::Instant::now().into_std()
}

/// A single timer per actor. Arming for an earlier deadline replaces the armed timer; a later
/// one leaves it (the core tolerates an early wake-up and reports its next deadline again).
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    armed: Option<(Instant, SpawnHandle)>,
}

impl Alarm {
    /// Makes sure `fire` runs no later than `deadline`.
    pub(crate) fn arm<A>(
        &mut self,
        deadline: Option<Instant>,
        ctx: &mut Context<A>,
        fire: fn(&mut A, &mut Context<A>),
    ) where
        A: Actor<Context = Context<A>>,
    {
        let Some(deadline) = deadline else { return };
        if self.armed.is_some_and(|(at, _)| at <= deadline) {
            return;
        }
        if let Some((_, handle)) = self.armed.take() {
            ctx.cancel_future(handle);
        }
        let delay = deadline.saturating_duration_since(now());
        self.armed = Some((deadline, ctx.run_later(delay, fire)));
    }

    /// To be called first thing in `fire`: the timer is spent.
    pub(crate) fn fired(&mut self) {
        self.armed = None;
    }
}
