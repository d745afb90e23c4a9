//! The consumer actor and its handle.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

use actix::prelude::*;
use bytes::Bytes;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::codec::Manifest;
use crate::delivery::dead_letter::DeadLetter;
use crate::delivery::dead_letter_handle::DeadLetters;
use crate::delivery::dead_letters::{delivery_key, DeadLetterCause, NewDeadLetter, SourceKind};
use crate::delivery::handler::{DeliveryHandler, Outcome};
use crate::delivery::message::{
    ChunkDeliveries, ChunkDelivery, ConsumerRef, Deliveries, Delivery, GetConsumerStats,
    GetOutOfOrder, ReplyTo, StopConsumer, Undecodable,
};
use crate::delivery::options::{ConsumerOptions, ConsumerParts};
use crate::protocol::consumer::{Completion, ConsumerCore, ConsumerStats, HandlerOutcome, Step};
use crate::protocol::envelope::{Ack, DeadLetterReason, DeliveryInfo, Header, ProducerId};
use crate::runtime::after_drain::after_each_drain;
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::shutdown::{once_stopped, GracefulStop, StopFuture};
use crate::runtime::stop_signal::{StopSignal, SubscribeStopped};

/// The receiving side of reliable delivery: admits each [`Delivery`], suppresses duplicates
/// per producer, runs the handler for each new message (one at a time), and ACKs a message only
/// when its handler returned `Ok`.
///
/// The handler runs beside the mailbox, not blocking it: timers, stats queries and duplicate
/// re-ACKs keep flowing while a slow handler runs. A handler that returns an error or panics
/// gets no ACK (the producer retransmits) and leaves the consumer running.
///
/// Usually started through [`ReliableDelivery::consumer`](crate::ReliableDelivery::consumer).
/// Stopping (or restarting under a `Supervisor`) drops all dedup state. [`StopConsumer`] stops
/// it for good, supervised or not: a supervised consumer stays as an inert actor that drops
/// every delivery (Actix restarts supervised actors while an address exists) until its last
/// address is dropped.
pub struct ConsumerController<T: Send + 'static> {
    core: ConsumerCore<T, ReplyTo>,
    handler: DeliveryHandler<T>,
    dead_letters: Option<Recipient<DeadLetter>>,
    /// Where refused deliveries are kept, as whose.
    kept: Option<(DeadLetters, SourceKind, String)>,
    alarm: Alarm,
    /// ACKs produced during the current mailbox drain, sent (batched per producer) after it.
    acks: Vec<(ReplyTo, Ack)>,
    /// The running handler's future did not finish on its first poll; it is polled after
    /// each drain until it does.
    handler_pending: bool,
    /// The after-drain future is spawned (it ends when no address is left; a `WeakAddr` can
    /// still deliver afterwards, and then it is spawned again).
    after_drain_spawned: bool,
    /// Stopped for good ([`StopConsumer`]); a supervised restart leaves it inert.
    stop: StopSignal,
    /// Outcomes of messages a pipelined handler handed off, to await.
    handed_off: Vec<(u64, Outcome)>,
    /// The awaited ones, polled after each drain: only those woken are polled again, so
    /// thousands awaited at once cost nothing per message (one future spawned on the
    /// context each would have every wake-up poll them all).
    outcomes: FuturesUnordered<Awaited>,
    /// How to abandon an awaited one (the core gave it up: `handler_timeout`).
    awaiting: HashMap<u64, AbortHandle>,
    #[cfg(feature = "metrics")]
    meter: crate::delivery::metrics::ConsumerMeter,
    /// Paces the meter's publishing.
    #[cfg(feature = "metrics")]
    publish_pace: crate::telemetry::metrics::PublishPace,
    /// When the last delivery came: the time the pace is checked at after a drain (the
    /// clock is not read again for it).
    #[cfg(feature = "metrics")]
    last_delivery: Instant,
    /// Paces the handler run time's samples.
    #[cfg(feature = "metrics")]
    handler_pace: crate::telemetry::metrics::Pace,
}

/// A handed-off outcome being awaited: the message's id, and its outcome (`None`:
/// abandoned).
type Awaited = Pin<Box<dyn Future<Output = (u64, Option<HandlerOutcome>)>>>;

/// ACK buffer capacity kept between drains (a burst may grow it; it shrinks back to this).
const ACK_BUFFER_KEPT: usize = 1024;

impl<T: Send + 'static> ConsumerController<T> {
    /// A consumer with validated options; start it like any actor.
    pub fn new(options: ConsumerOptions<T>) -> Self {
        #[cfg(feature = "metrics")]
        let meter = crate::delivery::metrics::ConsumerMeter::new(
            options
                .name()
                .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
        );
        let ConsumerParts {
            mut handler,
            config,
            dead_letters,
            kept,
        } = options.into_parts();
        // Ordered mode awaits every handler: a later message must not be confirmed before an
        // earlier one whose outcome is still open.
        handler.allow_pipelining(!config.ordered);
        Self {
            core: ConsumerCore::new(&config),
            handler,
            dead_letters,
            kept,
            alarm: Alarm::default(),
            acks: Vec::new(),
            handler_pending: false,
            after_drain_spawned: false,
            stop: StopSignal::default(),
            handed_off: Vec::new(),
            outcomes: FuturesUnordered::new(),
            awaiting: HashMap::new(),
            #[cfg(feature = "metrics")]
            meter,
            #[cfg(feature = "metrics")]
            publish_pace: Default::default(),
            #[cfg(feature = "metrics")]
            last_delivery: alarm::now(),
            #[cfg(feature = "metrics")]
            handler_pace: Default::default(),
        }
    }

    /// Publishes the counters to the metrics.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        self.meter.publish(&self.core.stats());
    }

    /// Publishes the counters to the metrics after an event at `now`, paced (a publish the
    /// pace owes comes with the timer).
    #[cfg(feature = "metrics")]
    fn publish_paced(&mut self, ctx: &mut Context<Self>, now: Instant) {
        if self.publish_pace.due(now) {
            self.publish();
        } else if self.publish_pace.owed().is_some() {
            self.arm_timer(ctx);
        }
    }

    /// Makes sure the after-drain future runs (see [`after_drain`](Self::after_drain)).
    fn ensure_after_drain(&mut self, ctx: &mut Context<Self>) {
        if !std::mem::replace(&mut self.after_drain_spawned, true) {
            after_each_drain(ctx, Self::after_drain);
        }
    }

    /// Admission, dedup and the decision for one delivery, carried out.
    fn receive(&mut self, delivery: Delivery<T>, now: Instant) {
        #[cfg(feature = "metrics")]
        {
            self.last_delivery = now;
            self.publish_pace.changed();
        }
        let step = self.core.handle_delivery(delivery.into_inbound(), now);
        self.carry_out_step(step, now);
    }

    /// Admission, dedup and reassembly for one chunk of a large message, carried out: its ACK
    /// queued, its message run if the chunk completed it.
    fn receive_chunk(&mut self, chunk: ChunkDelivery<T>, now: Instant) {
        #[cfg(feature = "metrics")]
        {
            self.last_delivery = now;
            self.publish_pace.changed();
        }
        let (inbound, decode) = chunk.into_inbound();
        let step = self.core.handle_chunk(
            inbound,
            |message| {
                decode(message).map_err(|unread| {
                    log::debug!("a reassembled message does not decode: {}", unread.why);
                    unread.reason
                })
            },
            now,
        );
        if let Some(ack) = step.ack {
            self.acks.push(ack);
        }
        self.carry_out_step(step.step, now);
    }

    /// Carries out what the core decided for one delivery.
    fn carry_out_step(&mut self, step: Step<T, ReplyTo>, now: Instant) {
        match step {
            Step::Run(body) => self.run(body, now),
            Step::Ack(reply_to, ack) => self.acks.push((reply_to, ack)),
            Step::Hold => {}
            Step::DeadLetter(reason, header) => self.dead_letter(reason, header, None),
        }
    }

    /// Sends the buffered ACKs: one message per run of ACKs to the same producer (batched where
    /// its reply address accepts batches).
    fn flush_acks(&mut self) {
        let mut acks = self.acks.drain(..);
        while let Some((first, _)) = acks.as_slice().first() {
            // The run is measured on the slice first, so that the iterator handed over is a
            // plain `take` (no comparison or chaining per ACK; one address clone per run).
            let reply_to = first.clone();
            let run = acks
                .as_slice()
                .iter()
                .take_while(|(next, _)| next.same_as(&reply_to))
                .count();
            reply_to.do_send_all(acks.by_ref().take(run).map(|(_, ack)| ack));
        }
        drop(acks);
        self.acks.shrink_to(ACK_BUFFER_KEPT);
    }

    /// Starts the handler for a message. A handler that finishes at once is settled right
    /// here (no task, no allocation); one that is still running is polled again after the
    /// drain (see [`after_drain`](Self::after_drain)).
    fn run(&mut self, body: T, now: Instant) {
        // The first poll uses a no-op waker: if the future is not ready, `after_drain` polls
        // it again with the actor's waker before anything could have woken it.
        let mut cx = TaskContext::from_waker(Waker::noop());
        let poll = self.start(body, &mut cx);
        self.handler_pending = self.settle(poll, Some(now), &mut cx).is_pending();
    }

    /// After each mailbox drain: drives a pending handler (and those queued behind it), then
    /// sends the drain's ACKs. Once no address is left and no handler runs, nothing more can
    /// happen: it ends, so the actor can stop.
    fn after_drain(&mut self, ctx: &mut Context<Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.handler_pending {
            let poll = self.handler.resume(cx);
            self.handler_pending = self.settle(poll, None, cx).is_pending();
        }
        self.await_handed_off();
        self.poll_outcomes(ctx, cx);
        self.flush_acks();
        #[cfg(feature = "metrics")]
        self.publish_paced(ctx, self.last_delivery);
        if ctx.connected() || self.handler_pending || !self.outcomes.is_empty() {
            Poll::Pending
        } else {
            self.after_drain_spawned = false;
            Poll::Ready(())
        }
    }

    /// Starts the handler for the message the core just made the running one.
    fn start(&mut self, body: T, cx: &mut TaskContext<'_>) -> Poll<HandlerOutcome> {
        let info = self
            .core
            .running()
            .expect("the core made this message the running one");
        self.handler.start(info, body, cx)
    }

    /// Acts on handler outcomes for as long as handlers finish; `Pending` while one runs.
    /// `now` is the time of the current event, if already read (the clock is read at most once).
    fn settle(
        &mut self,
        mut poll: Poll<HandlerOutcome>,
        mut now: Option<Instant>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<()> {
        while let Poll::Ready(outcome) = poll {
            let now = *now.get_or_insert_with(alarm::now);
            #[cfg(feature = "metrics")]
            self.publish_pace.changed();
            #[cfg(feature = "metrics")]
            if let (true, Some(started)) =
                (self.handler_pace.is_due(now), self.core.running_since())
            {
                let ended = alarm::now();
                self.handler_pace.done(ended);
                let ran = ended.saturating_duration_since(started);
                crate::telemetry::metrics::record_seconds(&self.meter.handler_seconds, ran);
            }
            let completion = self.core.handle_outcome(&outcome, now);
            if let HandlerOutcome::Refused(_) = outcome {
                self.send_refused();
            }
            let Some(body) = self.carry_out(completion) else {
                return Poll::Ready(());
            };
            poll = self.start(body, cx);
        }
        Poll::Pending
    }

    /// Queues a completion's ACK and a handed-off outcome; returns the body of the message to
    /// run next.
    #[inline]
    fn carry_out(&mut self, completion: Completion<T, ReplyTo>) -> Option<T> {
        if let Some(ack) = completion.ack {
            self.acks.push(ack);
        }
        if let Some(id) = completion.deferred {
            match self.handler.take_handed_off() {
                Some(outcome) => self.handed_off.push((id, outcome)),
                None => debug_assert!(false, "a deferred run without its outcome"),
            }
        }
        completion.next
    }

    /// Awaits the outcomes pipelined handlers handed off (polled after the drain, by
    /// [`poll_outcomes`](Self::poll_outcomes)).
    fn await_handed_off(&mut self) {
        for (id, outcome) in self.handed_off.drain(..) {
            let (abort, registration) = AbortHandle::new_pair();
            let awaited = Abortable::new(outcome, registration);
            self.outcomes
                .push(Box::pin(async move { (id, awaited.await.ok()) }));
            self.awaiting.insert(id, abort);
        }
    }

    /// Acts on the handed-off outcomes that resolved: each ACKs its message when it resolved
    /// `Ok` (the ACKs go out with the drain's).
    fn poll_outcomes(&mut self, ctx: &mut Context<Self>, cx: &mut TaskContext<'_>) {
        let mut resolved = false;
        while let Poll::Ready(Some((id, outcome))) = self.outcomes.poll_next_unpin(cx) {
            let Some(outcome) = outcome else {
                continue; // abandoned
            };
            self.awaiting.remove(&id);
            #[cfg(feature = "metrics")]
            self.publish_pace.changed();
            if let Some(ack) = self.core.handle_deferred(id, &outcome, alarm::now()) {
                self.acks.push(ack);
            }
            if let HandlerOutcome::Refused(_) = outcome {
                self.send_refused();
            }
            resolved = true;
        }
        if resolved {
            self.arm_timer(ctx);
        }
    }

    /// Hands the messages the handler refused to the dead-letter sink.
    fn send_refused(&mut self) {
        while let Some((reason, header)) = self.core.poll_refused() {
            self.dead_letter(reason, header, None);
        }
    }

    /// Reports a refused delivery (`body`: its bytes as received, when a transport could not
    /// decode them).
    fn dead_letter(&self, reason: DeadLetterReason, header: Header, body: Option<Bytes>) {
        if let Some((kept, kind, source)) = &self.kept {
            kept.record_with(source, refused_cause(reason), || {
                let max_body_bytes = kept.store().limits().max_body_bytes;
                refused(*kind, source, reason, &header, body, max_body_bytes)
            });
        }
        if let Some(sink) = &self.dead_letters {
            sink.do_send(DeadLetter {
                reason,
                producer_id: header.producer_id,
                incarnation: header.incarnation.id(),
                seq: header.seq,
            });
        }
    }

    /// Arms the timer for the idle sweep, the partial messages' lifetimes, the running
    /// handler's `handler_timeout` and a publish the metrics' pace owes.
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let deadline = self.core.next_deadline();
        #[cfg(feature = "metrics")]
        let deadline = deadline.into_iter().chain(self.publish_pace.owed()).min();
        self.alarm.arm(deadline, ctx, |act, ctx| {
            act.alarm.fired();
            let now = alarm::now();
            if let Some(completion) = act.core.handle_timeout(now) {
                // The run was abandoned: drop its future and run the next message. Re-arming
                // below adds a timer for that run's deadline, which makes Actix poll the
                // context's futures again, `after_drain` among them: it drives a next handler
                // that was not ready at once.
                act.handler.abandon();
                act.handler_pending = false;
                if let Some(body) = act.carry_out(completion) {
                    act.run(body, now);
                }
            }
            while let Some(id) = act.core.poll_expired() {
                if let Some(abort) = act.awaiting.remove(&id) {
                    abort.abort();
                }
            }
            act.await_handed_off();
            #[cfg(feature = "metrics")]
            {
                act.publish_pace.changed(); // a sweep, an expiry or a timeout may have counted
                if act.publish_pace.due(now) {
                    act.publish();
                }
            }
            act.arm_timer(ctx);
        });
    }
}

// The controller is never structurally pinned: a body type that is not `Unpin` is fine.
impl<T: Send + 'static> Unpin for ConsumerController<T> {}

impl<T: Send + 'static> Actor for ConsumerController<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.after_drain_spawned = false; // a restart dropped it
        if !self.stop.is_final() {
            self.ensure_after_drain(ctx);
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Handlers that succeeded in the last drain still get their ACKs.
        self.flush_acks();
        #[cfg(feature = "metrics")]
        self.publish();
        self.core.clear();
        self.handler.abandon();
        self.handed_off.clear();
        self.outcomes.clear();
        self.awaiting.clear();
        #[cfg(feature = "metrics")]
        self.publish(); // the cleared state: no producers tracked, nothing waiting
        self.stop.announce_if_final();
    }
}

impl<T: Send + 'static> Supervised for ConsumerController<T> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.flush_acks();
        self.core.clear();
        self.handler.abandon();
        self.handed_off.clear();
        self.outcomes.clear();
        self.awaiting.clear();
        self.handler_pending = false;
        self.alarm = Alarm::default();
    }
}

impl<T: Send + 'static> Handler<Delivery<T>> for ConsumerController<T> {
    type Result = ();

    fn handle(&mut self, delivery: Delivery<T>, ctx: &mut Context<Self>) {
        if self.stop.is_final() {
            return;
        }
        self.ensure_after_drain(ctx);
        self.receive(delivery, alarm::now());
        self.await_handed_off();
        self.arm_timer(ctx);
    }
}

impl<T: Send + 'static> Handler<Deliveries<T>> for ConsumerController<T> {
    type Result = ();

    fn handle(&mut self, Deliveries(deliveries): Deliveries<T>, ctx: &mut Context<Self>) {
        if self.stop.is_final() {
            return;
        }
        self.ensure_after_drain(ctx);
        let now = alarm::now();
        for delivery in deliveries {
            self.receive(delivery, now);
        }
        self.await_handed_off();
        self.arm_timer(ctx);
    }
}

impl<T: Send + 'static> Handler<ChunkDeliveries<T>> for ConsumerController<T> {
    type Result = ();

    fn handle(&mut self, ChunkDeliveries(chunks): ChunkDeliveries<T>, ctx: &mut Context<Self>) {
        if self.stop.is_final() {
            return;
        }
        self.ensure_after_drain(ctx);
        let now = alarm::now();
        for chunk in chunks {
            self.receive_chunk(chunk, now);
        }
        self.await_handed_off();
        self.arm_timer(ctx);
    }
}

impl<T: Send + 'static> Handler<Undecodable> for ConsumerController<T> {
    type Result = ();

    fn handle(&mut self, Undecodable(headers): Undecodable, _: &mut Context<Self>) {
        if self.stop.is_final() {
            return;
        }
        let now = alarm::now();
        #[cfg(feature = "metrics")]
        self.publish_pace.changed();
        for (header, reason, body) in headers {
            match self.core.handle_unreadable(header, reason, now) {
                Step::DeadLetter(reason, header) => self.dead_letter(reason, header, Some(body)),
                step => self.carry_out_step(step, now),
            }
        }
    }
}

impl<T: Send + 'static> Handler<GetConsumerStats> for ConsumerController<T> {
    type Result = MessageResult<GetConsumerStats>;

    fn handle(&mut self, _: GetConsumerStats, _: &mut Context<Self>) -> Self::Result {
        #[cfg(feature = "metrics")]
        self.publish(); // the metrics agree with the stats handed out
        MessageResult(self.core.stats())
    }
}

impl<T: Send + 'static> Handler<GetOutOfOrder> for ConsumerController<T> {
    type Result = Option<usize>;

    fn handle(&mut self, query: GetOutOfOrder, _: &mut Context<Self>) -> Option<usize> {
        self.core.out_of_order_for(query.0.as_str())
    }
}

impl<T: Send + 'static> Handler<StopConsumer> for ConsumerController<T> {
    type Result = ();

    fn handle(&mut self, _: StopConsumer, ctx: &mut Context<Self>) {
        if self.stop.make_final() {
            ctx.stop();
        }
    }
}

impl<T: Send + 'static> Handler<SubscribeStopped> for ConsumerController<T> {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}

/// The application's side of a consumer: the address producers send to, and observability.
pub struct ConsumerHandle<T: Send + 'static> {
    addr: Addr<ConsumerController<T>>,
}

impl<T: Send + 'static> Clone for ConsumerHandle<T> {
    fn clone(&self) -> Self {
        Self {
            addr: self.addr.clone(),
        }
    }
}

impl<T: Send + 'static> ConsumerHandle<T> {
    /// A handle for a consumer started elsewhere.
    pub fn new(addr: Addr<ConsumerController<T>>) -> Self {
        Self { addr }
    }

    /// Where producers send deliveries (the consumer's "ref"), accepting batches. `&handle`
    /// converts into it too: `ProducerOptions::builder(&consumer)`.
    pub fn consumer_ref(&self) -> ConsumerRef<T> {
        ConsumerRef::from(self.addr.clone())
    }

    /// The consumer as a plain `Recipient<Delivery<T>>`, for links, proxies and foreign
    /// senders (one actor message per delivery; producers should use
    /// [`consumer_ref`](Self::consumer_ref)).
    pub fn recipient(&self) -> Recipient<Delivery<T>> {
        self.addr.clone().recipient()
    }

    /// The consumer actor's address.
    pub fn addr(&self) -> &Addr<ConsumerController<T>> {
        &self.addr
    }

    /// The consumer's counters.
    ///
    /// # Errors
    /// [`MailboxError`] if the consumer has stopped.
    pub async fn stats(&self) -> Result<ConsumerStats, MailboxError> {
        self.addr.send(GetConsumerStats).await
    }

    /// How many producers the consumer keeps dedup state for (at most `max_producers`).
    ///
    /// # Errors
    /// [`MailboxError`] if the consumer has stopped.
    pub async fn tracked_producers(&self) -> Result<usize, MailboxError> {
        Ok(self.stats().await?.tracked_producers)
    }

    /// How many seqs of producer `id` were handled out of order and are held above its
    /// contiguous mark (`None` if the producer is not tracked).
    ///
    /// # Errors
    /// [`MailboxError`] if the consumer has stopped.
    pub async fn out_of_order_for(
        &self,
        id: impl Into<ProducerId>,
    ) -> Result<Option<usize>, MailboxError> {
        self.addr.send(GetOutOfOrder(id.into())).await
    }

    /// Stops the consumer for good (supervised or not); its dedup state is dropped.
    pub fn stop(&self) {
        self.addr.do_send(StopConsumer);
    }

    /// Resolves once the consumer has stopped for good (after [`stop`](Self::stop)): its last
    /// ACKs are sent and its state is dropped.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + 'static + use<T> {
        crate::runtime::stop_signal::wait_stopped(self.addr.send(SubscribeStopped))
    }
}

impl<T: Send + 'static> From<Addr<ConsumerController<T>>> for ConsumerRef<T> {
    fn from(addr: Addr<ConsumerController<T>>) -> Self {
        let single = addr.clone().recipient();
        ConsumerRef::of_consumer(single, addr.clone().recipient(), addr.recipient())
    }
}

impl<T: Send + 'static> From<&ConsumerHandle<T>> for ConsumerRef<T> {
    fn from(handle: &ConsumerHandle<T>) -> Self {
        handle.consumer_ref()
    }
}

impl<T: Send + 'static> std::fmt::Debug for ConsumerHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerHandle").finish_non_exhaustive()
    }
}

/// Starts a consumer on the current arbiter: what [`ReliableDelivery::consumer`] does, and how
/// the subsystems below the facade start theirs.
///
/// [`ReliableDelivery::consumer`]: crate::ReliableDelivery::consumer
pub(crate) fn start_consumer<T: Send + 'static>(options: ConsumerOptions<T>) -> ConsumerHandle<T> {
    ConsumerHandle::new(ConsumerController::new(options).start())
}

impl<T: Send + 'static> GracefulStop for ConsumerHandle<T> {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped(self.stopped())
    }
}

/// The cause a refusal is kept under.
fn refused_cause(reason: DeadLetterReason) -> DeadLetterCause {
    match reason {
        DeadLetterReason::UndecodableBody => DeadLetterCause::Undecodable,
        DeadLetterReason::IncompatibleBody { .. } => DeadLetterCause::IncompatibleVersion,
        _ => DeadLetterCause::Malformed,
    }
}

/// The dead letter kept of a delivery the part `kind` named `source` refused for `reason`; its
/// body copied only if the store keeps a body of its length.
fn refused(
    kind: SourceKind,
    source: &str,
    reason: DeadLetterReason,
    header: &Header,
    body: Option<Bytes>,
    max_body_bytes: u64,
) -> NewDeadLetter {
    let info = DeliveryInfo::from(header);
    NewDeadLetter {
        kind,
        source: source.to_owned(),
        cause: refused_cause(reason),
        key: delivery_key(&info),
        origin: Some(info),
        // The body as received: its own framing says how it was written.
        manifest: Manifest::raw(),
        body_len: body.as_ref().map_or(0, |body| body.len() as u64),
        body: body
            .filter(|body| body.len() as u64 <= max_body_bytes)
            .map(|body| body.to_vec()),
        attempts: 1,
        error: reason.to_string(),
    }
}
