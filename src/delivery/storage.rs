//! The storage seam of the producer: where a producer keeps the messages handed to it before
//! it sends them, and records their settlements. The producer actor
//! ([`ProducerController`](crate::ProducerController)) calls its storage at each step of its
//! life; the storage answers through [`Producer`], the producer as it lets a storage drive it.
//! A durable producer's journal ([`crate::durable`]) is the one storage; a producer without one
//! sends what it is handed at once.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::delivery::confirmation::Confirmation;
use crate::delivery::inbox::Inbox;
use crate::delivery::producer_core::Core;
use crate::error::{DeliveryError, Failure};
use crate::protocol::envelope::ProducerId;
use crate::protocol::producer::ProducerStats;
use crate::runtime::stop_signal::StopSignal;

/// A message's confirmation with its outcome, ready to fire.
pub(crate) type Settlement = (Confirmation, Result<(), DeliveryError>);

/// Where a producer keeps its messages before it sends them, and records their settlements.
///
/// Messages handed to the producer go to the storage ([`accept`](Self::accept)), which hands
/// them to the producer's core once it stored them; settlements of stored messages wait for
/// their record ([`hold_back`](Self::hold_back)). The storage's writes run beside the actor:
/// it starts them through [`Producer::spawn`], and their answers come back to it with the
/// producer.
pub(crate) trait ProducerStorage<T>: Any + Send {
    /// Takes messages handed to the producer: they are stored before anything else.
    fn accept(&mut self, messages: &mut VecDeque<(T, Confirmation)>);

    /// Keeps back the settlements that must be recorded before they fire; the others stay in
    /// `settling`, to fire at once.
    fn hold_back(&mut self, settling: &mut Vec<Settlement>);

    /// The producer started (or restarted): open the storage; the producer sends nothing
    /// before the storage hands it messages, and announces itself opened only when the
    /// storage says so ([`Producer::opened`]).
    fn open(&mut self, producer: &mut Producer<'_, T>);

    /// Stores what was handed over and records what was settled; a stopping storage stops the
    /// producer for good once every write is answered.
    fn flush(&mut self, producer: &mut Producer<'_, T>);

    /// Records what was settled.
    fn record(&mut self, producer: &mut Producer<'_, T>);

    /// `stop()` was called: starts no new store from now on, and settles what is not stored
    /// into `settling`. False if it was stopping already.
    fn stop(&mut self, settling: &mut Vec<Settlement>) -> bool;

    /// When a stop must end, answered or not (`None`: not stopping). A restarted producer
    /// goes on stopping with the same deadline.
    fn stop_deadline(&self) -> Option<Instant>;

    /// The producer stops or restarts: settles what is not stored into `settling`, forgets
    /// what is in memory, and keeps the writes that were unanswered for the next opening,
    /// which settles them by what the storage holds.
    fn close(&mut self, settling: &mut Vec<Settlement>);

    /// The producer is gone for good: the writes of unknown outcome, settled as such.
    fn abandon(&mut self) -> Vec<Settlement>;

    /// Whether it is open and nothing waits to be stored or recorded.
    fn is_idle(&self) -> bool;

    /// Whether a write it started is unanswered, or waits to be started.
    fn is_writing(&self) -> bool;

    /// Adds its counters to the producer's.
    fn add_stats(&self, stats: &mut ProducerStats);
}

/// What a storage does with an answer, once it comes: given the storage and the producer.
pub(crate) type Then<T> = Box<dyn FnOnce(&mut dyn ProducerStorage<T>, &mut Producer<'_, T>)>;

/// What a storage does at each tick of an interval.
pub(crate) type Every<T> = Box<dyn FnMut(&mut dyn ProducerStorage<T>, &mut Producer<'_, T>)>;

/// Work a storage asked for, which the producer schedules on its actor once the storage's
/// call returned.
pub(crate) enum Work<T> {
    /// Wait for a future beside the actor, then hand its answer to the storage.
    Answer(Pin<Box<dyn Future<Output = Then<T>>>>),
    /// Call the storage after a delay.
    Later(Duration, Then<T>),
    /// Call the storage at every interval, for the actor's life.
    Every(Duration, Every<T>),
}

/// The producer as its storage drives it: its core, its settlements, its room and its life.
/// What the storage settles fires once its call returns (the room first); the work it asks
/// for is scheduled then, and a stop or a flush it asks for happens last.
pub(crate) struct Producer<'a, T> {
    core: &'a mut Core<T>,
    settling: &'a mut Vec<Settlement>,
    inbox: &'a Inbox<T>,
    stop: &'a mut StopSignal,
    requests: Requests<T>,
}

/// What a storage asked the producer to do after its call.
pub(crate) struct Requests<T> {
    /// Work to schedule, in the order asked.
    pub(crate) work: Vec<Work<T>>,
    /// Stop the actor.
    pub(crate) stop: bool,
    /// Flush: the core has output (a store or a record was answered).
    pub(crate) flush: bool,
}

impl<'a, T: Clone + 'static> Producer<'a, T> {
    /// The producer's parts, lent to its storage for one call.
    pub(crate) fn new(
        core: &'a mut Core<T>,
        settling: &'a mut Vec<Settlement>,
        inbox: &'a Inbox<T>,
        stop: &'a mut StopSignal,
    ) -> Self {
        Self {
            core,
            settling,
            inbox,
            stop,
            requests: Requests {
                work: Vec::new(),
                stop: false,
                flush: false,
            },
        }
    }

    /// What the storage asked for during the call.
    pub(crate) fn into_requests(self) -> Requests<T> {
        self.requests
    }

    /// The producer's core: it sends what the storage stored, and starts each life as the
    /// storage says.
    pub(crate) fn core(&mut self) -> &mut Core<T> {
        self.core
    }

    /// The producer's id.
    pub(crate) fn id(&self) -> &ProducerId {
        self.core.id()
    }

    /// Settles messages (they fire once the call returns).
    pub(crate) fn settle(&mut self, settlements: impl IntoIterator<Item = Settlement>) {
        self.settling.extend(settlements);
    }

    /// Takes up to `permits` of room for messages the storage resends: how many it took.
    pub(crate) fn take_room(&self, permits: usize) -> usize {
        self.inbox.take_room(permits)
    }

    /// Tells the handles that the producer opened.
    pub(crate) fn opened(&self) {
        self.stop.opened();
    }

    /// Makes the producer's next stop final: no supervisor restarts it.
    pub(crate) fn make_final(&mut self) {
        self.stop.make_final();
    }

    /// Stops the producer for good.
    pub(crate) fn stop_for_good(&mut self) {
        self.stop.make_final();
        self.requests.stop = true;
    }

    /// Stops the producer because of `failure`: a supervisor restarts it unless the stop was
    /// made final; its handles' `stopped()` says why if it stays stopped.
    pub(crate) fn fail(&mut self, failure: Failure) {
        self.stop.fail(failure);
        self.requests.stop = true;
    }

    /// Flushes the producer once the call returns.
    pub(crate) fn flush(&mut self) {
        self.requests.flush = true;
    }

    /// Runs `work` beside the actor and hands its answer to the storage `S` with the
    /// producer, once it comes.
    pub(crate) fn spawn<S, A>(
        &mut self,
        work: impl Future<Output = A> + 'static,
        then: impl FnOnce(&mut S, A, &mut Producer<'_, T>) + 'static,
    ) where
        S: ProducerStorage<T>,
        A: 'static,
    {
        let answered = async move {
            let answer = work.await;
            to_storage::<T, S>(move |storage, producer| then(storage, answer, producer))
        };
        self.requests.work.push(Work::Answer(Box::pin(answered)));
    }

    /// Calls `then` with the storage `S` and the producer after `delay`.
    pub(crate) fn run_later<S: ProducerStorage<T>>(
        &mut self,
        delay: Duration,
        then: impl FnOnce(&mut S, &mut Producer<'_, T>) + 'static,
    ) {
        let then = to_storage::<T, S>(then);
        self.requests.work.push(Work::Later(delay, then));
    }

    /// Calls `each` with the storage `S` and the producer every `interval`, for the actor's
    /// life.
    pub(crate) fn run_interval<S: ProducerStorage<T>>(
        &mut self,
        interval: Duration,
        mut each: impl FnMut(&mut S, &mut Producer<'_, T>) + 'static,
    ) {
        let each: Every<T> = Box::new(move |storage, producer| {
            if let Some(storage) = as_own::<T, S>(storage) {
                each(storage, producer);
            }
        });
        self.requests.work.push(Work::Every(interval, each));
    }
}

/// `then` as a call of the producer's storage, which is an `S` (the storage that asked).
fn to_storage<T: Clone + 'static, S: ProducerStorage<T>>(
    then: impl FnOnce(&mut S, &mut Producer<'_, T>) + 'static,
) -> Then<T> {
    Box::new(move |storage, producer| {
        if let Some(storage) = as_own::<T, S>(storage) {
            then(storage, producer);
        }
    })
}

/// The producer's storage as the type that scheduled work on it (a producer has one storage
/// for its life, so it always is).
fn as_own<T: 'static, S: ProducerStorage<T>>(
    storage: &mut dyn ProducerStorage<T>,
) -> Option<&mut S> {
    (storage as &mut dyn Any).downcast_mut::<S>()
}
