//! The producer actor and the handle applications use to send through it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use actix::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::after_drain::after_each_drain;
use crate::alarm::{now, Alarm};
use crate::confirmation::Confirmation;
use crate::durable::{Durable, DurableOptions, Stored};
use crate::error::{DeliveryError, OptionsError, TellError};
use crate::inbox::{Inbox, Refusal};
use crate::message::{Acks, ConsumerRef, Delivery, GetProducerStats, ReplyTo, StopProducer, Tell};
use crate::options::{ProducerOptions, TraceHook};
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::protocol::producer::{ProducerCore, ProducerStats};
use crate::stop_signal::{StopSignal, SubscribeStopped};

/// The sending side of reliable delivery: numbers messages, keeps at most `window_size` of them
/// in flight to the consumer, queues the rest (up to `max_pending`), retransmits each until
/// it is ACKed, and settles each message's [`Confirmation`] exactly once.
///
/// Usually started through [`ReliableDelivery::producer`](crate::ReliableDelivery::producer),
/// which returns a [`ProducerHandle`]. Started directly, feed it [`Tell`] messages and stop it
/// with [`StopProducer`] (it holds its own reply address, so it does not stop by itself when
/// other addresses are dropped).
///
/// Every start and every restart (under a `Supervisor`) draws a fresh 128-bit incarnation from
/// the OS CSPRNG and numbers messages from 1 again; messages not yet confirmed when it stops or
/// restarts are settled with [`DeliveryError::ProducerStopped`]. [`StopProducer`] stops it for
/// good, supervised or not: a supervised producer then stays as an inert actor that refuses
/// every message (Actix restarts supervised actors while an address exists).
pub struct ProducerController<T: Clone + Send + 'static> {
    pub(crate) core: ProducerCore<T, Confirmation>,
    consumer: ConsumerRef<T>,
    reply_to: Option<ReplyTo>,
    alarm: Alarm,
    /// The core has output to send, settle or schedule (flushed after the mailbox drain).
    pub(crate) dirty: bool,
    /// Where handles leave messages; shared with them.
    pub(crate) inbox: Arc<Inbox<T>>,
    /// Buffer swapped with the inbox's queue and the core's (kept for its capacity).
    taken: VecDeque<(T, Confirmation)>,
    /// Settled confirmations of one flush, fired after their room was given back.
    pub(crate) settling: Vec<(Confirmation, Result<(), DeliveryError>)>,
    stop_when_idle: bool,
    /// Waiting for the producer to hold nothing unsettled ([`ProducerHandle::idle`]).
    idle_waiters: Vec<oneshot::Sender<()>>,
    pub(crate) stop: StopSignal,
    /// The journal of a durable producer.
    pub(crate) durable: Option<Durable<T>>,
    /// Sets the trace context of messages told through handles.
    trace_context: Option<TraceHook>,
}

impl<T: Clone + Send + 'static> ProducerController<T> {
    /// A producer with validated options; start it like any actor.
    pub fn new(options: ProducerOptions<T>) -> Self {
        let (consumer, config, trace_context) = options.into_parts();
        let room = config.window_size.saturating_add(config.max_pending);
        Self {
            core: ProducerCore::new(&config, Incarnation::random()),
            consumer,
            reply_to: None,
            alarm: Alarm::default(),
            dirty: false,
            inbox: Arc::new(Inbox::new(room)),
            taken: VecDeque::new(),
            settling: Vec::new(),
            stop_when_idle: false,
            idle_waiters: Vec::new(),
            stop: StopSignal::default(),
            durable: None,
            trace_context,
        }
    }

    /// A durable producer: it stores every message in `durable`'s journal stream before it
    /// sends it, and resumes the stream's life when started (see [`crate::durable`]).
    ///
    /// # Errors
    /// [`OptionsError`] for `producer_id` if the options do not fix one: the stream belongs to
    /// one producer id, across restarts.
    pub fn durable(
        options: ProducerOptions<T>,
        durable: DurableOptions<T>,
    ) -> Result<Self, OptionsError>
    where
        T: Serialize + DeserializeOwned,
    {
        let config = options.config().clone();
        if config.producer_id.is_none() {
            return Err(OptionsError::new(
                "producer_id",
                "a durable producer needs a fixed producer_id: its stream belongs to one id",
            ));
        }
        if durable.stop_timeout.is_zero() {
            return Err(OptionsError::new(
                "stop_timeout",
                "must be positive (got 0)",
            ));
        }
        if durable.message_version == 0 {
            return Err(OptionsError::new(
                "message_version",
                "versions start at 1 (got 0)",
            ));
        }
        let mut producer = Self::new(options);
        producer.durable = Some(Durable::new(config, durable));
        Ok(producer)
    }

    /// This producer's id.
    pub fn producer_id(&self) -> &ProducerId {
        self.core.id()
    }

    /// Sends what the core asks for, settles what it settled, and re-arms the timer.
    pub(crate) fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.durable.is_some() {
            // Settlements first, so that their record starts in this flush.
            self.settle_polled();
            self.flush_durable(ctx);
        }
        if let Some(reply_to) = &self.reply_to {
            let (now, core) = (now(), &mut self.core);
            let deliveries =
                std::iter::from_fn(|| core.poll_transmit_with(now, Confirmation::trace_context))
                    .map(|transmission| {
                        Delivery::from_transmission(transmission, reply_to.clone())
                    });
            self.consumer.do_send_all(deliveries);
        }
        self.settle_polled();
        if self.core.is_idle() && self.durable.as_ref().is_none_or(Durable::is_idle) {
            if self.stop_when_idle {
                ctx.stop();
                return;
            }
            if !self.idle_waiters.is_empty() && self.inbox.is_empty() {
                self.idle_waiters.drain(..).for_each(|waiter| {
                    let _ = waiter.send(());
                });
            }
        }
        self.alarm.arm(self.core.next_deadline(), ctx, |act, ctx| {
            act.alarm.fired();
            act.core.handle_timeout(now());
            act.flush(ctx);
        });
    }

    /// Confirms what the core settled, giving back the room those messages held first (in
    /// bulk), so that a confirmation callback can tell a follow-up message.
    pub(crate) fn settle_polled(&mut self) {
        let core = &mut self.core;
        if let Some(durable) = &mut self.durable {
            self.settling
                .extend(std::iter::from_fn(|| core.poll_settled()));
            durable.hold_back(&mut self.settling);
            return self.fire_settling();
        }
        // The hot path: straight from the core's queue, room counted before the callbacks.
        let room = core.settled().filter(|c| c.holds_room()).count();
        self.inbox.release(room);
        while let Some((confirmation, result)) = core.poll_settled() {
            confirmation.settle(result);
        }
    }

    pub(crate) fn fire_settling(&mut self) {
        let room = self.settling.iter().filter(|(c, _)| c.holds_room()).count();
        self.inbox.release(room);
        for (confirmation, result) in self.settling.drain(..) {
            confirmation.settle(result);
        }
    }

    /// Stops taking messages and settles everything unconfirmed (including what still waits
    /// in the inbox) with `ProducerStopped`.
    fn settle_all(&mut self) {
        let stopped = self
            .inbox
            .close()
            .into_iter()
            .map(|(_, confirmation)| (confirmation, Err(DeliveryError::ProducerStopped)));
        self.settling.extend(stopped);
        self.fire_settling();
        self.core.stop();
        self.settle_polled();
    }

    /// Hands what handles left in the inbox to the core. Room was reserved for each message
    /// (handles and direct `Tell`s share it), so the core has space.
    fn take_inbox(&mut self) {
        self.inbox.take(&mut self.taken);
        match &mut self.durable {
            Some(durable) => durable.accept(&mut self.taken),
            None => self.core.handle_send_all(&mut self.taken),
        }
        self.dirty = true;
    }
}

// The controller is never structurally pinned: a body type that is not `Unpin` is fine.
impl<T: Clone + Send + 'static> Unpin for ProducerController<T> {}

impl<T: Clone + Send + 'static> Actor for ProducerController<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.stop.is_final() {
            return; // inert: stopped for good under a Supervisor
        }
        let addr = ctx.address();
        self.reply_to = Some(ReplyTo::batching(
            addr.clone().recipient(),
            addr.recipient(),
        ));
        // Whatever a drain produced goes out after it: one batch of deliveries per flush.
        after_each_drain(ctx, |act, ctx, _| {
            if std::mem::take(&mut act.dirty) {
                act.flush(ctx);
            }
            Poll::Pending
        });
        self.open_log(ctx);
        self.arm_stop_deadline(ctx); // restarted while stopping: the stop goes on
        self.flush(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.close_log();
        self.settle_all();
        // Everything is settled: idle waiters are answered by dropping their senders.
        self.idle_waiters.clear();
        // Drop the self-reference so the actor can be freed.
        self.reply_to = None;
        self.stop.announce_if_final();
    }
}

impl<T: Clone + Send + 'static> Drop for ProducerController<T> {
    fn drop(&mut self) {
        // Gone for good (a restart keeps the actor): refuse whoever still waits for room.
        self.inbox.shut();
        self.abandon_in_doubt();
    }
}

impl<T: Clone + Send + 'static> Supervised for ProducerController<T> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.close_log();
        self.settle_all();
        self.alarm = Alarm::default();
        if self.stop.is_final() {
            self.inbox.shut();
            self.abandon_in_doubt();
            return;
        }
        self.stop_when_idle = false;
        self.core.restart(Incarnation::random());
        if !self.is_stopping() {
            self.inbox.reopen();
        }
    }
}

/// Sent by a handle when the inbox went from empty to not empty.
#[derive(Message)]
#[rtype(result = "()")]
struct TakeInbox;

impl<T: Clone + Send + 'static> Handler<TakeInbox> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, _: TakeInbox, _: &mut Context<Self>) {
        self.take_inbox();
    }
}

impl<T: Clone + Send + 'static> Handler<Tell<T>> for ProducerController<T> {
    type Result = Result<(), TellError<T>>;

    fn handle(&mut self, Tell { body, confirm }: Tell<T>, _: &mut Context<Self>) -> Self::Result {
        if self.stop.is_final() || self.is_stopping() {
            confirm.settle(Err(DeliveryError::ProducerStopped));
            return Err(TellError::Stopped(body));
        }
        // Direct tells take room like handles do, so `send` can wait for it in every case.
        match self.inbox.try_reserve() {
            Ok(()) => {
                self.dirty = true;
                let confirm = confirm.holding_room();
                if let Some(durable) = &mut self.durable {
                    durable.accept(&mut VecDeque::from([(body, confirm)]));
                    return Ok(());
                }
                self.core
                    .handle_send(body, confirm)
                    .map_err(TellError::QueueFull)
            }
            Err(Refusal::Full) => {
                confirm.settle(Err(DeliveryError::QueueFull));
                Err(TellError::QueueFull(body))
            }
            Err(Refusal::Closed) => {
                confirm.settle(Err(DeliveryError::ProducerStopped));
                Err(TellError::Stopped(body))
            }
        }
    }
}

impl<T: Clone + Send + 'static> Handler<Ack> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, ack: Ack, _: &mut Context<Self>) {
        if self.core.handle_ack(&ack) {
            self.dirty = true;
        }
    }
}

impl<T: Clone + Send + 'static> Handler<Acks> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        let mut any = false;
        for ack in &acks {
            any |= self.core.handle_ack(ack);
        }
        if any {
            self.dirty = true;
        }
    }
}

impl<T: Clone + Send + 'static> Handler<StopProducer> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, _: StopProducer, ctx: &mut Context<Self>) {
        match self.durable {
            // Graceful: the writes in flight finish first, then it stops for good.
            Some(_) => self.stop_durable(ctx),
            None if self.stop.make_final() => ctx.stop(),
            None => {}
        }
    }
}

impl<T: Clone + Send + 'static> Handler<SubscribeStopped> for ProducerController<T> {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}

/// Asks to be told when the producer holds nothing unsettled.
#[derive(Message)]
#[rtype(result = "()")]
struct WhenIdle(oneshot::Sender<()>);

impl<T: Clone + Send + 'static> Handler<WhenIdle> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, WhenIdle(waiter): WhenIdle, _: &mut Context<Self>) {
        if !self.inbox.is_empty() {
            self.take_inbox();
        }
        self.idle_waiters.push(waiter);
        self.dirty = true; // the flush after this drain answers it if idle
    }
}

impl<T: Clone + Send + 'static> Handler<GetProducerStats> for ProducerController<T> {
    type Result = MessageResult<GetProducerStats>;

    fn handle(&mut self, _: GetProducerStats, _: &mut Context<Self>) -> Self::Result {
        let mut stats = self.core.stats();
        if let Some(durable) = &self.durable {
            (stats.stored, stats.resumed, stats.resumed_confirmed) = durable.counts;
            stats.next_message_id = durable.next_message_id();
        }
        MessageResult(stats)
    }
}

/// Sent when the last [`ProducerHandle`] is dropped: stop once everything is settled.
#[derive(Message)]
#[rtype(result = "()")]
struct HandlesDropped;

impl<T: Clone + Send + 'static> Handler<HandlesDropped> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, _: HandlesDropped, _: &mut Context<Self>) {
        self.stop_when_idle = true;
        self.dirty = true;
    }
}

/// The application's side of a producer: `tell`, `send().await`, `stop()`. Cheap to clone.
///
/// When the last clone is dropped, the producer finishes delivering what it holds and then
/// stops; [`stop`](Self::stop) stops it at once. With the default unbounded `max_attempts`, a
/// producer whose consumer is gone for good never finishes: stop it, or bound `max_attempts`.
pub struct ProducerHandle<T: Clone + Send + 'static> {
    shared: Arc<Shared<T>>,
}

struct Shared<T: Clone + Send + 'static> {
    addr: Addr<ProducerController<T>>,
    inbox: Arc<Inbox<T>>,
    producer_id: ProducerId,
    durable: bool,
    trace_context: Option<TraceHook>,
}

impl<T: Clone + Send + 'static> Drop for Shared<T> {
    fn drop(&mut self) {
        self.addr.do_send(HandlesDropped);
    }
}

impl<T: Clone + Send + 'static> Clone for ProducerHandle<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Clone + Send + 'static> ProducerHandle<T> {
    /// Starts `producer` on the current arbiter and returns its handle.
    pub fn start(producer: ProducerController<T>) -> Self {
        let inbox = producer.inbox.clone();
        let producer_id = producer.producer_id().clone();
        let durable = producer.durable.is_some();
        let trace_context = producer.trace_context.clone();
        let addr = producer.start();
        Self::from_parts(addr, inbox, producer_id, durable, trace_context)
    }

    /// Starts `producer` under an Actix `Supervisor` on the current arbiter: if it stops for a
    /// reason other than [`stop`](Self::stop), it restarts with a new incarnation (its
    /// unconfirmed messages are settled with [`DeliveryError::ProducerStopped`]).
    pub fn start_supervised(producer: ProducerController<T>) -> Self {
        let inbox = producer.inbox.clone();
        let producer_id = producer.producer_id().clone();
        let durable = producer.durable.is_some();
        let trace_context = producer.trace_context.clone();
        let addr = Supervisor::start(move |_| producer);
        Self::from_parts(addr, inbox, producer_id, durable, trace_context)
    }

    /// Starts a producer on another arbiter (thread) and returns its handle.
    pub fn start_in_arbiter(arbiter: &ArbiterHandle, producer: ProducerController<T>) -> Self {
        let inbox = producer.inbox.clone();
        let producer_id = producer.producer_id().clone();
        let durable = producer.durable.is_some();
        let trace_context = producer.trace_context.clone();
        let addr = ProducerController::start_in_arbiter(arbiter, move |_| producer);
        Self::from_parts(addr, inbox, producer_id, durable, trace_context)
    }

    fn from_parts(
        addr: Addr<ProducerController<T>>,
        inbox: Arc<Inbox<T>>,
        producer_id: ProducerId,
        durable: bool,
        trace_context: Option<TraceHook>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                addr,
                inbox,
                producer_id,
                durable,
                trace_context,
            }),
        }
    }

    /// `confirm` for a message sent now: in the trace context the hook reads, if any.
    fn traced(&self, confirm: Confirmation) -> Confirmation {
        match self
            .shared
            .trace_context
            .as_ref()
            .and_then(TraceHook::current)
        {
            Some(context) => confirm.with_trace_context(context),
            None => confirm,
        }
    }

    /// Queues a message that has room reserved, waking the producer if needed.
    fn hand_over(&self, body: T, confirm: Confirmation) -> Result<(), (T, Confirmation)> {
        if self.shared.inbox.push(body, confirm)? {
            self.shared.addr.do_send(TakeInbox);
        }
        Ok(())
    }

    /// Hands a message to the producer without waiting. `confirm` fires exactly once with the
    /// outcome: a closure `|result: Result<(), DeliveryError>| …`, or [`Confirmation::none()`].
    ///
    /// # Errors
    /// [`TellError::QueueFull`] when `max_pending` messages already wait for the window, and
    /// [`TellError::Stopped`] when the producer has stopped; both hand the body back, and
    /// `confirm` fires with the matching [`DeliveryError`].
    pub fn tell(&self, body: T, confirm: impl Into<Confirmation>) -> Result<(), TellError<T>> {
        let confirm = self.traced(confirm.into());
        let refused = match self.shared.inbox.try_reserve() {
            Ok(()) => match self.hand_over(body, confirm) {
                Ok(()) => return Ok(()),
                Err((body, confirm)) => (Refusal::Closed, body, confirm),
            },
            Err(refusal) => (refusal, body, confirm),
        };
        match refused {
            (Refusal::Full, body, confirm) => {
                confirm.settle(Err(DeliveryError::QueueFull));
                Err(TellError::QueueFull(body))
            }
            (Refusal::Closed, body, confirm) => {
                confirm.settle(Err(DeliveryError::ProducerStopped));
                Err(TellError::Stopped(body))
            }
        }
    }

    /// Sends a message and resolves when it is confirmed.
    ///
    /// The message is queued when `send` is called, if there is room: `let f = p.send(x);
    /// p.tell(y, …)` sends `x` first, whether or not `f` was polled yet. When the pending queue
    /// is full, the returned future waits for room (backpressure) and queues the message when
    /// it gets it; dropping the future before then drops the message.
    ///
    /// # Errors
    /// The [`DeliveryError`] that settled the message: the producer stopped, or gave the
    /// message up after `max_attempts` transmissions.
    pub fn send(&self, body: T) -> impl Future<Output = Result<(), DeliveryError>> + 'static {
        let (confirm, outcome) = Confirmation::channel();
        let confirm = self.traced(confirm);
        let waits_for_room = match self.shared.inbox.try_reserve() {
            // A refused hand-over drops `confirm`, which settles `outcome` as stopped.
            Ok(()) => {
                let _ = self.hand_over(body, confirm);
                None
            }
            Err(Refusal::Full) => Some((self.clone(), body, confirm)),
            Err(Refusal::Closed) => None,
        };
        async move {
            if let Some((handle, body, confirm)) = waits_for_room {
                if handle.shared.inbox.reserve().await.is_ok() {
                    let _ = handle.hand_over(body, confirm);
                }
            }
            outcome.await.unwrap_or(Err(DeliveryError::ProducerStopped))
        }
    }

    /// Hands a message to a durable producer and resolves once it is stored: from then on the
    /// producer owns it, across crashes. [`Stored::confirmed`] then waits for the consumer's
    /// confirmation. Waits for room like [`send`](Self::send).
    ///
    /// # Errors
    /// [`DeliveryError::NotDurable`] for a producer without a journal; the producer stopped
    /// or its journal failed before the message was stored.
    pub fn store(&self, body: T) -> impl Future<Output = Result<Stored, DeliveryError>> + 'static {
        let handle = self.clone();
        let (confirm, id, confirmed) = Confirmation::channel_with_stored();
        let confirm = self.traced(confirm);
        async move {
            if !handle.shared.durable {
                return Err(DeliveryError::NotDurable);
            }
            if handle.shared.inbox.reserve().await.is_err()
                || handle.hand_over(body, confirm).is_err()
            {
                return Err(DeliveryError::ProducerStopped);
            }
            match id.await {
                Ok(id) => Ok(Stored::new(id, confirmed)),
                // Never stored: its confirmation says why.
                Err(_) => Err(match confirmed.await {
                    Ok(Err(error)) => error,
                    _ => DeliveryError::ProducerStopped,
                }),
            }
        }
    }

    /// Stops the producer now, for good (supervised or not); every unconfirmed message is
    /// settled with [`DeliveryError::ProducerStopped`]. Await [`stopped`](Self::stopped) to
    /// know when that happened. A durable producer stops gracefully: it first finishes the
    /// journal writes in flight and records the confirmations it received (at most
    /// [`DurableOptions::stop_timeout`](crate::durable::DurableOptions::stop_timeout); see
    /// [`crate::durable`]).
    pub fn stop(&self) {
        self.shared.addr.do_send(StopProducer);
    }

    /// Resolves once the producer has stopped for good (after [`stop`](Self::stop)) and every
    /// message it held is settled.
    pub fn stopped(&self) -> impl Future<Output = ()> + 'static {
        crate::stop_signal::wait_stopped(self.shared.addr.send(SubscribeStopped))
    }

    /// Resolves once the producer holds nothing unsettled: every message handed to it so far
    /// is confirmed or failed (or it stopped). With continuous traffic this waits for a lull.
    pub fn idle(&self) -> impl Future<Output = ()> + 'static {
        let (waiter, idle) = oneshot::channel();
        self.shared.addr.do_send(WhenIdle(waiter));
        async move {
            let _ = idle.await; // dropped unanswered: the producer stopped, all is settled
        }
    }

    /// The producer's counters.
    ///
    /// # Errors
    /// [`MailboxError`] if the producer has stopped.
    pub async fn stats(&self) -> Result<ProducerStats, MailboxError> {
        self.shared.addr.send(GetProducerStats).await
    }

    /// The producer's id (what consumers key their dedup state by).
    pub fn producer_id(&self) -> &ProducerId {
        &self.shared.producer_id
    }

    /// The producer actor's address.
    pub fn addr(&self) -> &Addr<ProducerController<T>> {
        &self.shared.addr
    }
}

impl<T: Clone + Send + 'static> std::fmt::Debug for ProducerHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerHandle")
            .field("producer_id", &self.shared.producer_id)
            .finish_non_exhaustive()
    }
}
