//! The user's handler, as the consumer runs it: created, polled in place, one run at a time.

use std::fmt::Display;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use actix::{Message, Recipient};

use crate::protocol::consumer::HandlerOutcome;
use crate::protocol::envelope::{
    DeadLetterReason, DeliveryInfo, Header, Incarnation, IncarnationId,
};

/// What a consumer runs for each new message: a closure returning a future of
/// `Result<(), E>`, or an existing actor's `Recipient`.
///
/// `Ok(())` means "handled": the consumer records the seq and ACKs it. An error (or a panic)
/// means "not handled": no ACK, and the producer retransmits later. A handler that swallows its
/// own failure and returns `Ok(())` gets its message ACKed and never retried; see the crate
/// docs. The error need only be `Display` (a `String` will do), so the consumer's warning
/// about failed runs writes it by its `Display` alone: return one that says why (an error
/// whose cause is only in its `source()`, such as tokio-postgres's "db error", says nothing
/// more there).
///
/// The consumer runs one handler at a time and polls it in a slot allocated once, so a handler
/// whose future is ready at once costs no allocation and no task switch.
pub struct DeliveryHandler<T> {
    slot: Box<dyn Slot<T>>,
    /// The consumer's name in handler spans.
    #[cfg(feature = "tracing")]
    name: std::sync::Arc<str>,
    /// The span of the run in progress (or of the outcome future handed off last).
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
}

impl<T: 'static> DeliveryHandler<T> {
    /// A handler that receives the message body.
    ///
    /// ```
    /// # use actix_delivery::DeliveryHandler;
    /// let handler = DeliveryHandler::from_fn(|order: String| async move {
    ///     if order.is_empty() {
    ///         return Err("empty order"); // not ACKed: the producer retransmits
    ///     }
    ///     Ok(())
    /// });
    /// # drop(handler);
    /// ```
    pub fn from_fn<F, Fut, E>(mut handler: F) -> Self
    where
        F: FnMut(T) -> Fut + 'static,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: Display + 'static,
    {
        Self::from_slot(move |_: &Header, body| handler(body))
    }

    /// A handler that also receives the message's [`DeliveryInfo`] (producer id, the public id
    /// of its incarnation, seq, window start): what an effectively-once handler stores with
    /// its business state to recognise a re-run.
    pub fn from_fn_with_info<F, Fut, E>(mut handler: F) -> Self
    where
        F: FnMut(DeliveryInfo, T) -> Fut + 'static,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: Display + 'static,
    {
        let mut info = info_of();
        Self::from_slot(move |header: &Header, body| handler(info(header), body))
    }

    fn from_slot<F, Fut, E>(handler: F) -> Self
    where
        F: FnMut(&Header, T) -> Fut + 'static,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: Display + 'static,
    {
        Self::of_slot(Box::new(FnSlot {
            handler,
            running: Box::pin(None),
        }))
    }

    fn of_slot(slot: Box<dyn Slot<T>>) -> Self {
        Self {
            slot,
            #[cfg(feature = "tracing")]
            name: crate::telemetry::spans::DEFAULT_CONSUMER.into(),
            #[cfg(feature = "tracing")]
            span: None,
        }
    }

    /// Names the consumer in handler spans.
    #[cfg(feature = "tracing")]
    pub(crate) fn set_name(&mut self, name: &str) {
        self.name = name.into();
    }

    /// A **pipelined** handler: `handler` is called for one message at a time, in order, and
    /// returns the future of the message's outcome; the next message's call does not wait for
    /// that future. Each message is ACKed when its future resolves `Ok` (in whatever order
    /// they resolve); until then a retransmission of it is held, it counts against
    /// `max_out_of_order`, and `handler_timeout` bounds how long it may take.
    ///
    /// For handlers that hand each message on in order and then wait for a slow
    /// acknowledgement of their own, such as a journal commit: the synchronous part must do the
    /// handing on (e.g. `addr.send(…)` enqueues at once), the future only wait. Throughput is
    /// then no longer bounded by one wait per message. In `ordered` mode the consumer awaits
    /// each future before the next call, so a failed message is never overtaken.
    pub fn pipelined<F, Fut, E>(mut handler: F) -> Self
    where
        F: FnMut(DeliveryInfo, T) -> Fut + 'static,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: Display + 'static,
    {
        let mut info = info_of();
        Self::of_slot(Box::new(PipelinedSlot {
            handler: move |header: &Header, body| handler(info(header), body),
            running: None,
            handed_off: None,
            pipelining: true,
            _future: std::marker::PhantomData,
        }))
    }

    /// Forwards each new message to an existing actor and treats its `Result` reply as the
    /// outcome, so an existing actor becomes a reliable consumer without changes: `Ok` (with
    /// any value, which is dropped) is "handled", `Err` is "not handled" (no ACK, the message
    /// is retransmitted). If the actor is gone (mailbox error), the message is not ACKed.
    ///
    /// ```
    /// # use actix::prelude::*;
    /// # use actix_delivery::DeliveryHandler;
    /// #[derive(Message)]
    /// #[rtype(result = "Result<u64, String>")] // the reserved stock, ignored by the handler
    /// struct Reserve(u32);
    ///
    /// struct Inventory;
    /// impl Actor for Inventory {
    ///     type Context = Context<Self>;
    /// }
    /// impl Handler<Reserve> for Inventory {
    ///     type Result = Result<u64, String>;
    ///     fn handle(&mut self, Reserve(n): Reserve, _: &mut Context<Self>) -> Self::Result {
    ///         Ok(u64::from(n))
    ///     }
    /// }
    ///
    /// # #[actix::main] async fn main() {
    /// let handler = DeliveryHandler::forward_to(Inventory.start().recipient());
    /// # let _: DeliveryHandler<Reserve> = handler;
    /// # }
    /// ```
    pub fn forward_to<R, E>(recipient: Recipient<T>) -> Self
    where
        T: Message<Result = Result<R, E>> + Send,
        R: Send + 'static,
        E: Display + Send + 'static,
    {
        Self::from_fn(move |body: T| {
            let reply = recipient.send(body);
            async move {
                match reply.await {
                    Ok(result) => result.map(drop).map_err(|error| error.to_string()),
                    Err(mailbox) => Err(format!("the target actor did not answer: {mailbox}")),
                }
            }
        })
    }

    /// Starts the handler for a message and polls it once.
    pub(crate) fn start(
        &mut self,
        info: &Header,
        body: T,
        cx: &mut Context<'_>,
    ) -> Poll<HandlerOutcome> {
        #[cfg(feature = "tracing")]
        {
            let span = crate::telemetry::spans::handler(&self.name, info);
            let poll = span.in_scope(|| self.slot.start(info, body, cx));
            // Kept while the run goes on, or for the outcome future handed off.
            self.span = (poll.is_pending()
                || matches!(poll, Poll::Ready(HandlerOutcome::Deferred)))
            .then_some(span);
            poll
        }
        #[cfg(not(feature = "tracing"))]
        self.slot.start(info, body, cx)
    }

    /// Polls the running handler.
    pub(crate) fn resume(&mut self, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        #[cfg(feature = "tracing")]
        if let Some(span) = &self.span {
            let poll = span.in_scope(|| self.slot.resume(cx));
            if poll.is_ready() {
                self.span = None;
            }
            return poll;
        }
        self.slot.resume(cx)
    }

    /// This handler behind a check of each message's body against the delivery carrying it
    /// (a rule admission cannot check: the body's type is the handler's business). A message
    /// the check refuses is a dead letter ([`HandlerOutcome::Refused`]): the handler is not
    /// called, no ACK is sent.
    pub(crate) fn admitting(
        self,
        check: impl FnMut(&Header, &T) -> Result<(), DeadLetterReason> + 'static,
    ) -> Self {
        let Self {
            slot,
            #[cfg(feature = "tracing")]
            name,
            #[cfg(feature = "tracing")]
            span,
        } = self;
        Self {
            slot: Box::new(AdmittingSlot { check, inner: slot }),
            #[cfg(feature = "tracing")]
            name,
            #[cfg(feature = "tracing")]
            span,
        }
    }

    /// Drops a running handler's future (the consumer stopped or restarted).
    pub(crate) fn abandon(&mut self) {
        #[cfg(feature = "tracing")]
        {
            self.span = None;
        }
        self.slot.abandon();
    }

    /// The outcome future of the message a pipelined handler just handed off (after a
    /// [`HandlerOutcome::Deferred`]).
    pub(crate) fn take_handed_off(&mut self) -> Option<Outcome> {
        let outcome = self.slot.take_handed_off();
        #[cfg(feature = "tracing")]
        if let Some(span) = self.span.take() {
            use tracing::Instrument;
            return outcome.map(|outcome| -> Outcome { Box::pin(outcome.instrument(span)) });
        }
        outcome
    }

    /// Whether pipelined handlers may hand messages off (`false`: await each, for ordered
    /// mode).
    pub(crate) fn allow_pipelining(&mut self, allowed: bool) {
        self.slot.allow_pipelining(allowed);
    }
}

/// The future of a handed-off message's outcome.
pub(crate) type Outcome = Pin<Box<dyn Future<Output = HandlerOutcome>>>;

/// Turns headers into the public [`DeliveryInfo`]. The incarnation's public id is a digest:
/// computed once per run of messages from one incarnation.
fn info_of() -> impl FnMut(&Header) -> DeliveryInfo {
    let mut last: Option<(Incarnation, IncarnationId)> = None;
    move |header: &Header| {
        let incarnation = match last {
            Some((token, id)) if token == header.incarnation => id,
            _ => last.insert((header.incarnation, header.incarnation.id())).1,
        };
        DeliveryInfo {
            producer_id: header.producer_id.clone(),
            incarnation,
            seq: header.seq,
            window_start: header.window_start,
            trace_context: header.trace_context.clone(),
            first_seq: header.chunk.map(|chunk| chunk.first_seq),
        }
    }
}

impl<T> std::fmt::Debug for DeliveryHandler<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeliveryHandler")
    }
}

trait Slot<T> {
    fn start(&mut self, info: &Header, body: T, cx: &mut Context<'_>) -> Poll<HandlerOutcome>;
    fn resume(&mut self, cx: &mut Context<'_>) -> Poll<HandlerOutcome>;
    fn abandon(&mut self);
    fn take_handed_off(&mut self) -> Option<Outcome> {
        None
    }
    fn allow_pipelining(&mut self, _allowed: bool) {}
}

/// A closure handler and the one future it has running, pinned in a box allocated once.
struct FnSlot<F, Fut> {
    handler: F,
    running: Pin<Box<Option<Fut>>>,
}

impl<T, F, Fut, E> Slot<T> for FnSlot<F, Fut>
where
    F: FnMut(&Header, T) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    fn start(&mut self, info: &Header, body: T, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        match catch_unwind(AssertUnwindSafe(|| (self.handler)(info, body))) {
            Ok(future) => self.running.set(Some(future)),
            Err(panic) => return Poll::Ready(HandlerOutcome::Panicked(panic_message(&*panic))),
        }
        self.resume(cx)
    }

    fn resume(&mut self, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        let Some(future) = self.running.as_mut().as_pin_mut() else {
            debug_assert!(false, "resumed a handler that is not running");
            return Poll::Pending;
        };
        let outcome = std::task::ready!(poll_guarded(future, cx));
        self.abandon();
        Poll::Ready(outcome)
    }

    fn abandon(&mut self) {
        if catch_unwind(AssertUnwindSafe(|| self.running.set(None))).is_err() {
            log::error!("dropping a handler future panicked");
        }
    }
}

/// A pipelined handler: the call hands the message off; its future is the outcome.
struct PipelinedSlot<F, Fut> {
    handler: F,
    /// Awaited in place when pipelining is not allowed (ordered mode).
    running: Option<Outcome>,
    handed_off: Option<Outcome>,
    pipelining: bool,
    _future: std::marker::PhantomData<fn() -> Fut>,
}

impl<T, F, Fut, E> Slot<T> for PipelinedSlot<F, Fut>
where
    F: FnMut(&Header, T) -> Fut,
    Fut: Future<Output = Result<(), E>> + 'static,
    E: Display + 'static,
{
    fn start(&mut self, info: &Header, body: T, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        let future = match catch_unwind(AssertUnwindSafe(|| (self.handler)(info, body))) {
            Ok(future) => future,
            Err(panic) => return Poll::Ready(HandlerOutcome::Panicked(panic_message(&*panic))),
        };
        let outcome: Outcome = Box::pin(Guarded(Box::pin(future)));
        if self.pipelining {
            self.handed_off = Some(outcome);
            return Poll::Ready(HandlerOutcome::Deferred);
        }
        self.running = Some(outcome);
        self.resume(cx)
    }

    fn resume(&mut self, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        let Some(future) = &mut self.running else {
            debug_assert!(false, "resumed a handler that is not running");
            return Poll::Pending;
        };
        let outcome = std::task::ready!(future.as_mut().poll(cx));
        self.abandon();
        Poll::Ready(outcome)
    }

    fn abandon(&mut self) {
        if catch_unwind(AssertUnwindSafe(|| self.running = None)).is_err() {
            log::error!("dropping a handler future panicked");
        }
    }

    fn take_handed_off(&mut self) -> Option<Outcome> {
        self.handed_off.take()
    }

    fn allow_pipelining(&mut self, allowed: bool) {
        self.pipelining = allowed;
    }
}

/// A handler behind a check of each message (see [`DeliveryHandler::admitting`]).
struct AdmittingSlot<T, F> {
    check: F,
    inner: Box<dyn Slot<T>>,
}

impl<T, F> Slot<T> for AdmittingSlot<T, F>
where
    F: FnMut(&Header, &T) -> Result<(), DeadLetterReason>,
{
    fn start(&mut self, info: &Header, body: T, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        match catch_unwind(AssertUnwindSafe(|| (self.check)(info, &body))) {
            Ok(Ok(())) => self.inner.start(info, body, cx),
            Ok(Err(reason)) => Poll::Ready(HandlerOutcome::Refused(reason)),
            Err(panic) => Poll::Ready(HandlerOutcome::Panicked(panic_message(&*panic))),
        }
    }

    fn resume(&mut self, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        self.inner.resume(cx)
    }

    fn abandon(&mut self) {
        self.inner.abandon();
    }

    fn take_handed_off(&mut self) -> Option<Outcome> {
        self.inner.take_handed_off()
    }

    fn allow_pipelining(&mut self, allowed: bool) {
        self.inner.allow_pipelining(allowed);
    }
}

/// A handler future whose polls (and whose error's `Display`) cannot panic out.
struct Guarded<F>(Pin<Box<F>>);

impl<F, E> Future for Guarded<F>
where
    F: Future<Output = Result<(), E>>,
    E: Display,
{
    type Output = HandlerOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HandlerOutcome> {
        poll_guarded(self.0.as_mut(), cx)
    }
}

/// Polls a handler future, turning its result (or a panic of the poll, or of formatting the
/// error) into an outcome.
fn poll_guarded<F, E>(future: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<HandlerOutcome>
where
    F: Future<Output = Result<(), E>>,
    E: Display,
{
    let polled = catch_unwind(AssertUnwindSafe(|| match future.poll(cx) {
        Poll::Pending => None,
        Poll::Ready(Ok(())) => Some(HandlerOutcome::Succeeded),
        Poll::Ready(Err(error)) => Some(HandlerOutcome::Failed(error.to_string())),
    }));
    match polled {
        Ok(None) => Poll::Pending,
        Ok(Some(outcome)) => Poll::Ready(outcome),
        Err(panic) => Poll::Ready(HandlerOutcome::Panicked(panic_message(&*panic))),
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}
