//! Work that belongs after a mailbox drain. Actix handles every queued message first and polls
//! the actor's spawned futures afterwards, so a future spawned once at start runs right after
//! each drain, with the actor's waker: the place to send, in one batch per peer, everything the
//! drain produced, and to drive a handler future further.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use actix::{Actor, ActorFuture, AsyncContext, Context};

/// What runs after each drain; `Ready` ends it.
pub(crate) type AfterDrain<A> = fn(&mut A, &mut Context<A>, &mut TaskContext<'_>) -> Poll<()>;

/// Spawns a future that calls `work` each time the actor's context is polled, i.e. after each
/// mailbox drain (and after the actor's other futures that were polled before it).
pub(crate) fn after_each_drain<A>(ctx: &mut Context<A>, work: AfterDrain<A>)
where
    A: Actor<Context = Context<A>>,
{
    ctx.spawn(EachDrain(work));
}

struct EachDrain<A: Actor<Context = Context<A>>>(AfterDrain<A>);

impl<A: Actor<Context = Context<A>>> ActorFuture<A> for EachDrain<A> {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut A,
        ctx: &mut Context<A>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<()> {
        (self.0)(act, ctx, cx)
    }
}
