//! Where a part's actor runs, and whether an Actix `Supervisor` restarts it: what
//! `ProducerOptionsBuilder::arbiter`, `PersistentOptions::{arbiter, supervised}` and
//! `DurableOptions::stop_on_journal_failure` set.

use actix::{Actor, Addr, ArbiterHandle, Context, Supervised, Supervisor};

/// Where an actor runs and whether it is supervised.
#[derive(Clone, Debug, Default)]
pub(crate) struct Placement {
    /// Another arbiter (thread); `None`: the arbiter that starts it.
    pub(crate) arbiter: Option<ArbiterHandle>,
    /// Under an Actix `Supervisor`: restarted when it stops for a reason other than a stop
    /// for good.
    pub(crate) supervised: bool,
}

impl Placement {
    /// Starts the actor `make` makes (on the arbiter it runs on) where this placement says,
    /// supervised if it says so.
    pub(crate) fn start<A>(&self, make: impl FnOnce() -> A + Send + 'static) -> Addr<A>
    where
        A: Actor<Context = Context<A>> + Supervised,
    {
        match (&self.arbiter, self.supervised) {
            (None, false) => make().start(),
            (None, true) => Supervisor::start(move |_| make()),
            (Some(arbiter), false) => A::start_in_arbiter(arbiter, move |_| make()),
            (Some(arbiter), true) => Supervisor::start_in_arbiter(arbiter, move |_| make()),
        }
    }
}
