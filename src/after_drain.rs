//! Coalescing output per mailbox drain. Actix handles every queued message first and polls the
//! actor's spawned futures afterwards, so a future spawned once at start runs right after each
//! drain: the place to send, in one batch per peer, everything the drain produced.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use actix::{Actor, ActorFuture, AsyncContext, Context};

/// Spawns a future that calls `flush` each time the actor's context is polled, i.e. after each
/// mailbox drain (and after the actor's other futures that were polled before it). The future
/// ends when `flush` returns `Ready`.
pub(crate) fn flush_after_each_drain<A>(
    ctx: &mut Context<A>,
    flush: fn(&mut A, &mut Context<A>) -> Poll<()>,
) where
    A: Actor<Context = Context<A>>,
{
    ctx.spawn(Flusher(flush));
}

struct Flusher<A: Actor>(fn(&mut A, &mut A::Context) -> Poll<()>);

impl<A: Actor> ActorFuture<A> for Flusher<A> {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut A,
        ctx: &mut A::Context,
        _: &mut TaskContext<'_>,
    ) -> Poll<()> {
        (self.0)(act, ctx)
    }
}
