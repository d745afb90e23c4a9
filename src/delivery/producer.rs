//! The producer actor and the handle applications use to send through it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::{oneshot, watch};

use crate::delivery::confirmation::Confirmation;
use crate::delivery::dead_letter_handle::GiveUpKeeper;
use crate::delivery::inbox::{Inbox, Refusal};
use crate::delivery::message::{
    Acks, ConsumerRef, GetProducerStats, GiveUp, ReplyTo, SingleAck, StopProducer, Tell,
};
use crate::delivery::options::{ProducerOptions, ProducerParts, TraceHook};
use crate::delivery::producer_core::Core;
use crate::delivery::storage::{Producer, ProducerStorage, Settlement, Work};
use crate::delivery::stored::Stored;
use crate::error::{DeliveryError, Failure, StartError, TellError};
use crate::protocol::envelope::{DeliveryInfo, ProducerId};
use crate::protocol::producer::ProducerStats;
use crate::runtime::after_drain::after_each_drain;
use crate::runtime::alarm::{now, Alarm};
use crate::runtime::placement::Placement;
use crate::runtime::random::random_incarnation;
use crate::runtime::shutdown::{once_stopped_or, GracefulStop, StopFuture};
use crate::runtime::stop_signal::{wait_for_stop, wait_opened, Life, StopSignal, SubscribeStopped};

/// The sending side of reliable delivery: numbers messages, keeps at most `window_size` of them
/// in flight to the consumer, queues the rest (up to `max_pending`), retransmits each until
/// it is ACKed, and settles each message's [`Confirmation`] exactly once.
///
/// Started through [`ReliableDelivery::producer`](crate::ReliableDelivery::producer) (or
/// `durable_producer`), which returns a [`ProducerHandle`]; its [`addr`](ProducerHandle::addr)
/// also takes [`Tell`] and [`StopProducer`] messages (it holds its own reply address, so it
/// does not stop by itself when other addresses are dropped).
///
/// Every start, and every restart of a durable one (under its `Supervisor`, after a journal
/// failure), draws a fresh 128-bit incarnation from the OS CSPRNG and numbers messages from 1
/// again; messages not yet confirmed when it stops or restarts are settled with
/// [`DeliveryError::StoppedUnconfirmed`] if it had sent them (or, a durable one, stored them),
/// with [`DeliveryError::ProducerStopped`] if not. [`StopProducer`] stops it for good: a
/// supervised one then stays as an inert actor that refuses every message (Actix restarts
/// supervised actors while an address exists).
pub struct ProducerController<T: Clone + Send + 'static> {
    core: Core<T>,
    /// Where given-up messages are kept, if anywhere.
    kept: Option<GiveUpKeeper<T>>,
    consumer: ConsumerRef<T>,
    reply_to: Option<ReplyTo>,
    alarm: Alarm,
    /// The core has output to send, settle or schedule (flushed after the mailbox drain).
    dirty: bool,
    /// Where handles leave messages; shared with them.
    inbox: Arc<Inbox<T>>,
    /// Buffer swapped with the inbox's queue and the core's (kept for its capacity).
    taken: VecDeque<(T, Confirmation)>,
    /// Settled confirmations of one flush, fired after their room was given back.
    settling: Vec<Settlement>,
    stop_when_idle: bool,
    /// Waiting for the producer to hold nothing unsettled ([`ProducerHandle::idle`]).
    idle_waiters: Vec<oneshot::Sender<()>>,
    stop: StopSignal,
    /// Where a durable producer keeps its messages before it sends them (its journal).
    storage: Option<Box<dyn ProducerStorage<T>>>,
    #[cfg(feature = "metrics")]
    meter: crate::delivery::metrics::ProducerMeters,
    /// Paces the meters' publishing.
    #[cfg(feature = "metrics")]
    publish_pace: crate::telemetry::metrics::PublishPace,
    /// Sets the trace context of messages told through handles.
    trace_context: Option<TraceHook>,
}

impl<T: Clone + Send + 'static> ProducerController<T> {
    /// A producer with validated options.
    pub(crate) fn new(options: ProducerOptions<T>) -> Self {
        #[cfg(feature = "metrics")]
        let meter = crate::delivery::metrics::ProducerMeters::new(
            Self::metrics_label(&options),
            options.chunk_size().is_some(),
        );
        let ProducerParts {
            consumer,
            config,
            trace_context,
            chunking,
            kept,
        } = options.into_parts();
        let room = config.window_size.saturating_add(config.max_pending);
        let mut core = Core::new(&config, random_incarnation(), chunking);
        if kept.is_some() {
            core.keep_given_up();
        }
        Self {
            core,
            kept,
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
            storage: None,
            #[cfg(feature = "metrics")]
            meter,
            #[cfg(feature = "metrics")]
            publish_pace: Default::default(),
            trace_context,
        }
    }

    /// A producer that keeps the messages handed to it in `storage` before it sends them (a
    /// durable producer: see [`crate::durable`]), with validated options.
    pub(crate) fn stored_in(
        options: ProducerOptions<T>,
        storage: Box<dyn ProducerStorage<T>>,
    ) -> Self {
        #[cfg(feature = "metrics")]
        let label = Self::metrics_label(&options).to_owned();
        let mut producer = Self::new(options);
        producer.storage = Some(storage);
        #[cfg(feature = "metrics")]
        producer.meter.durable(&label);
        producer
    }

    /// The label of the producer's metrics: the application's, else its fixed id.
    #[cfg(feature = "metrics")]
    fn metrics_label(options: &ProducerOptions<T>) -> &str {
        options
            .metrics_label()
            .or(options.config().producer_id.as_deref())
            .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL)
    }

    /// This producer's id.
    pub fn producer_id(&self) -> &ProducerId {
        self.core.id()
    }

    /// Sends what the core asks for, settles what it settled, and re-arms the timer.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.storage.is_some() {
            // Settlements first, so that their record starts in this flush.
            self.settle_polled();
            self.call_storage(ctx, |storage, producer| storage.flush(producer));
        }
        let at = now();
        if let Some(reply_to) = &self.reply_to {
            self.core.transmit(at, &self.consumer, reply_to);
        }
        self.settle_polled();
        if self.storage.is_some() {
            // A chunked message given up while transmitting (a round beyond `max_attempts`)
            // is recorded now: nothing else may come to flush again.
            self.call_storage(ctx, |storage, producer| storage.record(producer));
        }
        #[cfg(feature = "metrics")]
        {
            // A flush follows an event or the timer: either may have changed the stats.
            self.publish_pace.changed();
            self.meter.seen(at);
            if self.publish_pace.due(at) {
                self.publish();
            }
        }
        if self.core.is_idle() && self.storage.as_ref().is_none_or(|s| s.is_idle()) {
            if self.stop_when_idle {
                ctx.stop();
                return;
            }
            if !self.idle_waiters.is_empty() && self.inbox.is_empty() {
                #[cfg(feature = "metrics")]
                self.publish(); // the metrics agree with the stats once `idle()` answers
                self.idle_waiters.drain(..).for_each(|waiter| {
                    let _ = waiter.send(());
                });
            }
        }
        let deadline = self.core.next_deadline();
        // A publish the pace owes comes with the next flush at the latest.
        #[cfg(feature = "metrics")]
        let deadline = deadline.into_iter().chain(self.publish_pace.owed()).min();
        self.alarm.arm(deadline, ctx, |act, ctx| {
            act.alarm.fired();
            act.core.handle_timeout(now());
            act.keep_given_up();
            act.flush(ctx);
        });
    }

    /// Publishes the counters to the metrics.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        let stats = self.stats();
        self.meter.publish(&stats);
    }

    /// Keeps the messages the core gave up in the dead-letter store, if the producer has one.
    fn keep_given_up(&mut self) {
        let Some(kept) = &self.kept else {
            return;
        };
        let (incarnation, given_up) = self.core.take_given_up();
        for message in given_up {
            let origin = DeliveryInfo {
                producer_id: self.core.id().clone(),
                incarnation: incarnation.id(),
                seq: message.seq,
                window_start: message.seq,
                trace_context: None,
                first_seq: None,
            };
            let error = format!("not confirmed after {} transmissions", message.attempts);
            kept.record(origin, &message.body, message.attempts, error);
        }
    }

    /// Confirms what the core settled, giving back the room those messages held first (in
    /// bulk), so that a confirmation callback can tell a follow-up message.
    fn settle_polled(&mut self) {
        let core = &mut self.core;
        if let Some(storage) = &mut self.storage {
            self.settling
                .extend(std::iter::from_fn(|| core.poll_settled()));
            storage.hold_back(&mut self.settling);
            return self.fire_settling();
        }
        // The hot path: straight from the core's queue, room counted before the callbacks.
        let room = core.settled_room();
        self.inbox.release(room);
        while let Some((confirmation, result)) = core.poll_settled() {
            #[cfg(feature = "metrics")]
            self.meter.settled(&confirmation, &result);
            confirmation.settle(result);
        }
    }

    /// Fires what was settled, giving back the room those messages held first.
    fn fire_settling(&mut self) {
        let room = self.settling.iter().filter(|(c, _)| c.holds_room()).count();
        self.inbox.release(room);
        for (confirmation, result) in self.settling.drain(..) {
            #[cfg(feature = "metrics")]
            self.meter.settled(&confirmation, &result);
            confirmation.settle(result);
        }
    }

    /// The counters, with the storage's.
    fn stats(&self) -> ProducerStats {
        let mut stats = self.core.stats();
        stats.timed_out = self.inbox.timed_out();
        if let Some(storage) = &self.storage {
            storage.add_stats(&mut stats);
        }
        stats
    }

    /// Stops taking messages and settles everything unconfirmed, including what still waits
    /// in the inbox (`ProducerStopped`, or `StoppedUnconfirmed` for what was sent).
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
        // The latency histogram samples the first message of a batch taken, when it wants one.
        #[cfg(feature = "metrics")]
        if let Some((_, first)) = self.taken.iter_mut().next()
            && self.meter.wants_sample()
        {
            first.taken_at(now());
        }
        match &mut self.storage {
            Some(storage) => storage.accept(&mut self.taken),
            None => self.core.handle_send_all(&mut self.taken),
        }
        self.dirty = true;
    }

    /// Calls the storage with the producer it drives, then does what the call asked for:
    /// schedules its work, fires what it settled, stops the actor or flushes. Never inlined:
    /// it would swell the hot path of a producer without storage (`flush`), which never runs it.
    #[inline(never)]
    fn call_storage(
        &mut self,
        ctx: &mut Context<Self>,
        call: impl FnOnce(&mut dyn ProducerStorage<T>, &mut Producer<'_, T>),
    ) {
        let Some(storage) = self.storage.as_deref_mut() else {
            return;
        };
        let mut producer = Producer::new(
            &mut self.core,
            &mut self.settling,
            &self.inbox,
            &mut self.stop,
        );
        call(storage, &mut producer);
        let requests = producer.into_requests();
        for work in requests.work {
            match work {
                Work::Answer(answer) => {
                    ctx.spawn(answer.into_actor(self).map(|then, act, ctx| {
                        act.call_storage(ctx, then);
                    }));
                }
                Work::Later(delay, then) => {
                    ctx.run_later(delay, |act, ctx| act.call_storage(ctx, then));
                }
                Work::Every(interval, mut each) => {
                    ctx.run_interval(interval, move |act, ctx| {
                        act.call_storage(ctx, &mut each);
                    });
                }
            }
        }
        self.fire_settling();
        if requests.stop {
            ctx.stop();
        }
        if requests.flush {
            self.dirty = true;
            self.flush(ctx);
        }
    }

    /// `stop()` of a producer with storage, graceful: what is not stored yet never will be
    /// (settled `ProducerStopped`), the settlements the consumer confirmed are recorded, and
    /// the writes in flight are answered; then the actor stops for good, at the latest at the
    /// storage's stop deadline (what is unanswered then is settled as in doubt). A failure of
    /// the storage meanwhile restarts it under its `Supervisor` (the opening settles the
    /// unanswered writes by what the storage holds), and the stop goes on.
    fn stop_storing(&mut self, ctx: &mut Context<Self>) {
        let Some(storage) = &mut self.storage else {
            return;
        };
        if !storage.stop(&mut self.settling) {
            return; // stopping already
        }
        let waiting = self.inbox.close().into_iter();
        let waiting = waiting.map(|(_, confirm)| (confirm, Err(DeliveryError::ProducerStopped)));
        self.settling.extend(waiting);
        // Confirmed in this mailbox drain: recorded before the stop.
        self.settle_polled();
        // Stored and unconfirmed: the next start of the stream sends them.
        self.core.stop();
        self.settle_polled();
        self.arm_stop_deadline(ctx);
        self.dirty = true;
    }

    /// Stopping: a restarted producer goes on stopping, with the same deadline.
    fn is_stopping(&self) -> bool {
        self.storage
            .as_ref()
            .is_some_and(|s| s.stop_deadline().is_some())
    }

    /// Stops for good at the storage's stop deadline, answered or not.
    fn arm_stop_deadline(&mut self, ctx: &mut Context<Self>) {
        let Some(deadline) = self.storage.as_ref().and_then(|s| s.stop_deadline()) else {
            return;
        };
        let left = deadline.saturating_duration_since(now());
        ctx.run_later(left, move |act, ctx| {
            if act.storage.as_ref().is_some_and(|s| s.is_writing()) {
                log::warn!(
                    "durable producer `{}`: its journal did not answer before the stop timeout; \
                     what it did not answer is settled as in doubt",
                    act.core.id()
                );
            }
            act.stop.make_final();
            ctx.stop();
        });
    }

    /// Closes the storage (the producer stops or restarts): the settlements the core made
    /// since the last flush wait for their record too.
    fn close_storage(&mut self) {
        if self.storage.is_none() {
            return;
        }
        self.settle_polled();
        if let Some(storage) = &mut self.storage {
            storage.close(&mut self.settling);
        }
    }

    /// Settles the storage's writes of unknown outcome: the producer is gone for good.
    fn abandon_in_doubt(&mut self) {
        if let Some(storage) = &mut self.storage {
            let abandoned = storage.abandon();
            self.settling.extend(abandoned);
            self.fire_settling();
        }
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
        match self.storage {
            None => self.stop.opened(), // nothing to open
            Some(_) => self.call_storage(ctx, |storage, producer| storage.open(producer)),
        }
        self.arm_stop_deadline(ctx); // restarted while stopping: the stop goes on
        self.flush(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.close_storage();
        self.settle_all();
        #[cfg(feature = "metrics")]
        self.publish();
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
        self.close_storage();
        self.settle_all();
        self.alarm = Alarm::default();
        self.stop.restarting();
        if self.stop.is_final() {
            self.inbox.shut();
            self.abandon_in_doubt();
            return;
        }
        self.stop_when_idle = false;
        self.core.restart(random_incarnation());
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
                #[allow(unused_mut)] // without `metrics`
                let mut confirm = confirm.holding_room();
                #[cfg(feature = "metrics")]
                if self.meter.wants_sample() {
                    confirm.taken_at(now());
                }
                if let Some(storage) = &mut self.storage {
                    storage.accept(&mut VecDeque::from([(body, confirm)]));
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

impl<T: Clone + Send + 'static> Handler<SingleAck> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
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

impl<T: Clone + Send + 'static> Handler<GiveUp> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, GiveUp { ack, error }: GiveUp, _: &mut Context<Self>) {
        if self.core.handle_given_up(&ack, error) {
            self.dirty = true;
        }
    }
}

impl<T: Clone + Send + 'static> Handler<StopProducer> for ProducerController<T> {
    type Result = ();

    fn handle(&mut self, _: StopProducer, ctx: &mut Context<Self>) {
        match self.storage {
            // Graceful: the writes in flight finish first, then it stops for good.
            Some(_) => self.stop_storing(ctx),
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
        #[cfg(feature = "metrics")]
        self.publish(); // the metrics agree with the stats handed out
        MessageResult(self.stats())
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
///
/// ```
/// use actix_delivery::{ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery};
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = ReliableDelivery::consumer(
///     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: u32| async move {
///         println!("handling order {order}");
///         Ok::<(), std::io::Error>(())
///     }))
///     .build()?,
/// );
/// let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
///
/// // `tell`: hand over without waiting; the closure gets the outcome once.
/// producer.tell(1, |outcome: Result<(), DeliveryError>| println!("order 1: {outcome:?}"))?;
/// // `send`: wait (for room, then) for the consumer's confirmation.
/// producer.send(2).await?;
/// // `idle`: everything handed over so far is settled.
/// producer.idle().await;
/// assert_eq!(producer.stats().await?.confirmed, 2);
/// // `stop`: for good; `stopped` says when it has.
/// producer.stop();
/// producer.stopped().await?;
/// assert!(matches!(producer.send(3).await, Err(DeliveryError::ProducerStopped)));
/// # Ok(()) }
/// ```
pub struct ProducerHandle<T: Clone + Send + 'static> {
    shared: Arc<Shared<T>>,
}

struct Shared<T: Clone + Send + 'static> {
    addr: Addr<ProducerController<T>>,
    life: watch::Receiver<Life>,
    inbox: Arc<Inbox<T>>,
    producer_id: ProducerId,
    durable: bool,
    trace_context: Option<TraceHook>,
}

impl<T: Clone + Send + 'static> Shared<T> {
    /// What the handles of `producer` share, once it runs at the address given.
    fn of(
        producer: &ProducerController<T>,
    ) -> impl FnOnce(Addr<ProducerController<T>>) -> ProducerHandle<T> + use<T> {
        let life = producer.stop.subscribe();
        let inbox = producer.inbox.clone();
        let producer_id = producer.producer_id().clone();
        let durable = producer.storage.is_some();
        let trace_context = producer.trace_context.clone();
        move |addr| ProducerHandle {
            shared: Arc::new(Shared {
                addr,
                life,
                inbox,
                producer_id,
                durable,
                trace_context,
            }),
        }
    }
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
    /// Starts `producer` where `placement` says and returns its handle.
    pub(crate) fn start(producer: ProducerController<T>, placement: &Placement) -> Self {
        let shared = Shared::of(&producer);
        shared(placement.start(move || producer))
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
    /// # Waiting for room
    ///
    /// A producer holds at most `window_size + max_pending` messages (in flight or queued);
    /// a message takes room when it is handed over and gives it back when it is settled. The
    /// four ways of handing a message over differ only in what they do when there is none:
    ///
    /// | call | no room |
    /// |---|---|
    /// | `tell` | refused at once: [`TellError::QueueFull`] (the body back) |
    /// | [`send`](Self::send), [`store`](Self::store) | wait for room, without limit |
    /// | [`send_timeout`](Self::send_timeout), [`store_timeout`](Self::store_timeout) | wait for room until the deadline, then [`DeliveryError::Timeout`] |
    ///
    /// A refused or timed-out message was never handed to the producer: it is certainly not
    /// sent, not stored, and never will be. A deadline bounds only the wait for room; once
    /// the message has room it is handed over, and the call goes on to wait for its outcome
    /// like the call without a deadline (so a message being stored at the deadline is never
    /// reported "not stored").
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
    /// it gets it; dropping the future before then drops the message. To bound that wait, use
    /// [`send_timeout`](Self::send_timeout) (see [`tell`](Self::tell) for the forms).
    ///
    /// # Errors
    /// The [`DeliveryError`] that settled the message: the producer stopped, gave the
    /// message up after `max_attempts` transmissions, or its work-pulling pool gave it up;
    /// [`DeliveryError::happened`] says whether it was sent (or stored) before.
    pub fn send(
        &self,
        body: T,
    ) -> impl Future<Output = Result<(), DeliveryError>> + 'static + use<T> {
        self.send_within(body, None)
    }

    /// As [`send`](Self::send), waiting for room at most `timeout` (counted from this call):
    /// with no room by then, the message is dropped, never sent, and the future resolves with
    /// [`DeliveryError::Timeout`]. A message that got room in time is queued and the future
    /// resolves with its confirmation, however long that takes (wrap the call in
    /// `tokio::time::timeout` to stop waiting for it: the message is still delivered).
    ///
    /// ```
    /// # use actix_delivery::{DeliveryError, ProducerHandle};
    /// # use std::time::Duration;
    /// # async fn _demo(producer: ProducerHandle<String>) {
    /// match producer.send_timeout("order-7".into(), Duration::from_millis(50)).await {
    ///     Ok(()) => println!("confirmed"),
    ///     Err(DeliveryError::Timeout) => println!("busy: not sent, try again later"),
    ///     Err(error) => println!("not confirmed: {error}"),
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`DeliveryError::Timeout`] when no room came in time; otherwise as [`send`](Self::send).
    pub fn send_timeout(
        &self,
        body: T,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), DeliveryError>> + 'static + use<T> {
        self.send_within(body, Some(timeout))
    }

    fn send_within(
        &self,
        body: T,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<(), DeliveryError>> + 'static + use<T> {
        let (confirm, outcome) = Confirmation::channel();
        let confirm = self.traced(confirm);
        let waits_for_room = match self.shared.inbox.try_reserve() {
            // A refused hand-over drops `confirm`, which settles `outcome` as stopped.
            Ok(()) => {
                let _ = self.hand_over(body, confirm);
                None
            }
            Err(Refusal::Full) => Some((self.clone(), body, confirm, deadline_after(timeout))),
            Err(Refusal::Closed) => None,
        };
        async move {
            if let Some((handle, body, confirm, deadline)) = waits_for_room {
                match handle.reserve_until(deadline).await {
                    Room::Reserved => {
                        let _ = handle.hand_over(body, confirm);
                    }
                    Room::TimedOut => return Err(DeliveryError::Timeout),
                    Room::Closed => {}
                }
            }
            outcome.await.unwrap_or(Err(DeliveryError::ProducerStopped))
        }
    }

    /// Hands a message to a durable producer and resolves once it is stored: from then on the
    /// producer owns it, across crashes. [`Stored::confirmed`] then waits for the consumer's
    /// confirmation. Waits for room like [`send`](Self::send); to bound that wait, use
    /// [`store_timeout`](Self::store_timeout).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use actix_delivery::durable::DurableOptions;
    /// use actix_delivery::journal::{MemoryJournal, PersistenceId};
    /// use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
    ///
    /// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(
    /// #     DeliveryHandler::from_fn(|_: String| async { Ok::<(), std::io::Error>(()) })).build()?);
    /// let journal = Arc::new(MemoryJournal::new()); // SqliteJournal or PostgresJournal in production
    /// let producer = ReliableDelivery::durable_producer(
    ///     ProducerOptions::builder(&consumer).build()?,
    ///     DurableOptions::new(journal, PersistenceId::new("orders")?, "order-service"),
    /// )?;
    /// let stored = producer.store("order-7".to_string()).await?; // in the journal now
    /// println!("stored as {:?}", stored.id);
    /// stored.confirmed().await?; // the consumer confirmed it, and that is recorded
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`DeliveryError::NotDurable`] for a producer without a journal; the producer stopped
    /// or its journal failed before the message was stored; or [`DeliveryError::InDoubt`]:
    /// the producer ended before its journal answered. Never an error of
    /// [`Happened::FailedAfter`](crate::Happened::FailedAfter): once stored, it resolves `Ok`.
    pub fn store(
        &self,
        body: T,
    ) -> impl Future<Output = Result<Stored, DeliveryError>> + 'static + use<T> {
        self.store_within(body, None)
    }

    /// As [`store`](Self::store), waiting for room at most `timeout` (counted from this
    /// call): with no room by then, the message is dropped, certainly not stored, and the
    /// future resolves with [`DeliveryError::Timeout`]. A message that got room in time is
    /// handed to the producer and the future resolves with the store's outcome, after the
    /// deadline if the journal takes that long: a message whose store is in flight is never
    /// reported "not stored". The deadline does not bound the journal: a store waits for it as
    /// long as it takes to answer (PostgreSQL's `commit_timeout`; SQLite has none, a stuck
    /// disk is waited for). A caller that must answer by a deadline wraps the call in
    /// `tokio::time::timeout` and, if that fires, knows only that the outcome is unknown (the
    /// message may be stored: do not report it refused). This is how backpressure reaches a
    /// caller that cannot wait, such as an HTTP handler answering 503:
    ///
    /// ```
    /// # use actix_delivery::{Happened, ProducerHandle};
    /// # use std::time::Duration;
    /// # async fn _demo(producer: ProducerHandle<String>) -> u16 {
    /// match producer.store_timeout("order-7".into(), Duration::from_millis(100)).await {
    ///     Ok(_stored) => 202, // the producer owns it, across crashes
    ///     Err(error) => match error.happened() {
    ///         // Full, stopped, or the journal failed: not stored, the client may retry.
    ///         Happened::CertainlyNot => 503,
    ///         // May be stored: a retry could store it twice.
    ///         Happened::InDoubt | Happened::FailedAfter => 500,
    ///     },
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`DeliveryError::Timeout`] when no room came in time; otherwise as
    /// [`store`](Self::store).
    pub fn store_timeout(
        &self,
        body: T,
        timeout: Duration,
    ) -> impl Future<Output = Result<Stored, DeliveryError>> + 'static + use<T> {
        self.store_within(body, Some(timeout))
    }

    fn store_within(
        &self,
        body: T,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Stored, DeliveryError>> + 'static + use<T> {
        let handle = self.clone();
        let deadline = deadline_after(timeout);
        // The context is the caller's, read before the future starts.
        let (confirm, id, confirmed) = Confirmation::channel_with_stored();
        let confirm = self.traced(confirm);
        async move {
            if !handle.shared.durable {
                return Err(DeliveryError::NotDurable);
            }
            match handle.reserve_until(deadline).await {
                Room::Reserved => {}
                Room::TimedOut => return Err(DeliveryError::Timeout),
                Room::Closed => return Err(DeliveryError::ProducerStopped),
            }
            if handle.hand_over(body, confirm).is_err() {
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

    /// Takes one permit of room, waiting for it until `deadline` (`None`: without limit).
    async fn reserve_until(&self, deadline: Option<tokio::time::Instant>) -> Room {
        let reserved = match deadline {
            None => self.shared.inbox.reserve().await,
            Some(deadline) => {
                match tokio::time::timeout_at(deadline, self.shared.inbox.reserve()).await {
                    Ok(reserved) => reserved,
                    Err(_) => {
                        self.shared.inbox.count_timeout();
                        return Room::TimedOut;
                    }
                }
            }
        };
        match reserved {
            Ok(()) => Room::Reserved,
            Err(_) => Room::Closed,
        }
    }

    /// Stops the producer now, for good (supervised or not); every unconfirmed message is
    /// settled: with [`DeliveryError::StoppedUnconfirmed`] if it was sent (by a durable
    /// producer: stored, and the next start of the stream sends it again), with
    /// [`DeliveryError::ProducerStopped`] if not. Await [`stopped`](Self::stopped) to
    /// know when that happened. A durable producer stops gracefully: it first finishes the
    /// journal writes in flight and records the confirmations it received (at most
    /// [`DurableOptions::stop_timeout`](crate::durable::DurableOptions::stop_timeout); see
    /// [`crate::durable`]).
    pub fn stop(&self) {
        self.shared.addr.do_send(StopProducer);
    }

    /// Resolves once the producer has opened: at once for a producer without a journal; for
    /// a durable one once its stream is open (its stored messages read, ready to store), at
    /// once if it was before. Await it before serving: a producer that cannot open its
    /// stream says why here, not only in the log.
    ///
    /// A journal that cannot be reached is not a reason: the durable producer (under its
    /// `Supervisor`) opens again after a growing delay, logging each failure, and this waits
    /// on (bound it with `tokio::time::timeout`); one told to
    /// [`stop_on_journal_failure`](crate::durable::DurableOptions::stop_on_journal_failure)
    /// stops instead, and this says why.
    ///
    /// # Errors
    /// [`StartError::Failed`] with why the producer stopped for good before its stream
    /// opened: the stream belongs to another producer id ([`Failure::Error`]), holds
    /// messages of another type, is corrupt or of a newer schema, another producer opened it
    /// meanwhile ([`Failure::TakenOver`]), or another one is alive on it
    /// ([`Failure::InUse`], with a [`lease`](crate::durable::DurableOptions::lease)).
    /// [`StartError::Stopped`] if it was stopped before it opened.
    pub fn opened(&self) -> impl Future<Output = Result<(), StartError>> + 'static + use<T> {
        wait_opened(self.shared.life.clone())
    }

    /// Resolves once the producer has stopped for good and every message it held is
    /// settled: after [`stop`](Self::stop), or after a failure that no restart mends.
    ///
    /// # Errors
    /// The [`Failure`] that stopped it, when it was not asked to stop: a durable producer
    /// whose stream another producer took over ([`Failure::TakenOver`]), or whose stream
    /// turned out corrupt, foreign or of a newer schema; a producer without a `Supervisor`
    /// whose journal failed.
    pub fn stopped(&self) -> impl Future<Output = Result<(), Failure>> + 'static + use<T> {
        wait_for_stop(self.shared.life.clone())
    }

    /// Resolves once the producer holds nothing unsettled: every message handed to it so far
    /// is confirmed or failed (or it stopped). With continuous traffic this waits for a lull.
    pub fn idle(&self) -> impl Future<Output = ()> + 'static + use<T> {
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

/// What waiting for room came to.
enum Room {
    Reserved,
    TimedOut,
    Closed,
}

/// The deadline `timeout` from now; `None` (no deadline) for none, or one too far to count.
fn deadline_after(timeout: Option<Duration>) -> Option<tokio::time::Instant> {
    timeout.and_then(|timeout| tokio::time::Instant::now().checked_add(timeout))
}

impl<T: Clone + Send + 'static> std::fmt::Debug for ProducerHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerHandle")
            .field("producer_id", &self.shared.producer_id)
            .finish_non_exhaustive()
    }
}

/// Starts a producer where its options place it: what [`ReliableDelivery::producer`] does, and
/// how the subsystems below the facade start theirs.
///
/// [`ReliableDelivery::producer`]: crate::ReliableDelivery::producer
pub(crate) fn start_producer<T: Clone + Send + 'static>(
    options: ProducerOptions<T>,
) -> ProducerHandle<T> {
    let placement = options.placement().clone();
    ProducerHandle::start(ProducerController::new(options), &placement)
}

impl<T: Clone + Send + 'static> GracefulStop for ProducerHandle<T> {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped_or(self.stopped())
    }
}
