//! The entity host's shell: the state its handles share (the pure [`HostCore`] behind a
//! lock, the journal, the arbiter its entities run on) and its actor, which runs the
//! passivation timer and learns when an instance has stopped.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix::prelude::*;
use actix::WeakAddr;
use tokio::sync::oneshot;

use crate::journal::{Journal, PersistenceId};
use crate::persistence::{
    Answer, Ask, CommandError, EventSourced, Execute, PersistentHandle, PersistentOptions,
};
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::stop_signal::{StopSignal, SubscribeStopped};
use crate::sharding::entity_id::{EntityId, ShardId};
use crate::sharding::host_core::{HostCore, Stopped, ToStop};
use crate::sharding::host_options::EntityHostOptions;

/// A command waiting for a stopping instance of its entity.
pub(super) struct Held<E: EventSourced> {
    pub(super) execute: Execute<E>,
    pub(super) responder: oneshot::Sender<Answer<E>>,
}

impl<E: EventSourced> Held<E> {
    pub(super) fn run_on(self, instance: &PersistentHandle<E>) {
        instance.addr().do_send(Ask {
            execute: self.execute,
            responder: self.responder,
        });
    }
}

pub(super) type Core<E> = HostCore<PersistentHandle<E>, Held<E>>;

/// What the host's handles and its shell share.
pub(super) struct Inner<E: EventSourced> {
    pub(super) core: Mutex<Core<E>>,
    pub(super) journal: Arc<dyn Journal>,
    pub(super) options: EntityHostOptions,
    pub(super) arbiter: ArbiterHandle,
    pub(super) shell: WeakAddr<HostShell<E>>,
}

impl<E: EventSourced> Inner<E> {
    pub(super) fn core(&self) -> MutexGuard<'_, Core<E>> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts instance `generation` of `entity`, and tells the shell when it has stopped.
    pub(super) fn start(&self, entity: &EntityId, generation: u64) -> PersistentHandle<E> {
        let id = format!("{}|{entity}", self.options.entity_type);
        let id = PersistenceId::new(id).expect("type and id lengths were checked");
        let instance = PersistentHandle::start(
            PersistentOptions::new(self.journal.clone(), id)
                .config(self.options.persistent.clone())
                .arbiter(&self.arbiter),
        )
        .expect("the settings were validated when the host was built");
        let stopped = instance.stopped();
        let shell = self.shell.clone();
        let entity = entity.clone();
        self.arbiter.spawn(async move {
            let _ = stopped.await; // how it ended is the instance's to log
            if let Some(shell) = shell.upgrade() {
                shell.do_send(InstanceStopped { entity, generation });
            }
        });
        instance
    }

    /// Asks the instances `to_stop` to stop (gracefully: what they decided is stored first).
    pub(super) fn stop(to_stop: Vec<ToStop<PersistentHandle<E>>>) {
        for ToStop { instance, .. } in to_stop {
            instance.stop();
        }
    }

    /// Starts the entities that waited for room, as far as there is room now, and runs their
    /// commands; passivates what that made due; refuses the commands whose shard left while
    /// they waited. Whether it started any (the passivation timer then needs re-arming).
    pub(super) fn admit_waiting(&self) -> bool {
        let now = alarm::now();
        let mut core = self.core();
        let mut started = false;
        while let Some((instance, waiting)) = core.poll_admitted(now, |e, g| self.start(e, g)) {
            waiting.into_iter().for_each(|held| held.run_on(instance));
            started = true;
        }
        let due: Vec<_> = std::iter::from_fn(|| core.poll_passivation(now)).collect();
        let refused: Vec<_> = core.drain_refused().collect();
        drop(core);
        Self::stop(due);
        for (held, _) in refused {
            let _ = held.responder.send(Err(CommandError::Stopped));
        }
        started
    }

    /// Passivates what is due now.
    fn passivate_due(&self) {
        let now = alarm::now();
        let mut core = self.core();
        let due: Vec<_> = std::iter::from_fn(|| core.poll_passivation(now)).collect();
        drop(core);
        Self::stop(due);
    }
}

/// The host's actor: its passivation timer, and what happens when an instance has stopped.
pub(super) struct HostShell<E: EventSourced> {
    pub(super) inner: Arc<Inner<E>>,
    pub(super) alarm: Alarm,
    /// Waiting for shards to be gone.
    pub(super) gone: Vec<(ShardId, oneshot::Sender<()>)>,
    pub(super) stop: StopSignal,
    #[cfg(feature = "metrics")]
    pub(super) meter: crate::sharding::metrics::EntityHostMeter,
}

impl<E: EventSourced> HostShell<E> {
    /// Passivates what is due and arms the timer for the next deadline.
    fn rearm(&mut self, ctx: &mut Context<Self>) {
        self.inner.passivate_due();
        let deadline = self.inner.core().next_deadline();
        self.alarm.arm(deadline, ctx, |act, ctx| {
            act.alarm.fired();
            act.rearm(ctx);
        });
    }

    /// Tells who waits for a shard that is gone now, and stops the host once it is empty.
    fn settle(&mut self, ctx: &mut Context<Self>) {
        let core = self.inner.core();
        let (gone, waiting) = std::mem::take(&mut self.gone)
            .into_iter()
            .partition(|(shard, _)| core.is_gone(*shard));
        let empty = core.is_empty();
        drop(core);
        self.gone = waiting;
        for (_, waiter) in gone {
            let _ = waiter.send(());
        }
        if self.stop.is_final() && empty {
            ctx.stop();
        }
    }
}

impl<E: EventSourced> Actor for HostShell<E> {
    type Context = Context<Self>;

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn started(&mut self, ctx: &mut Context<Self>) {
        // Commands change the counters without a message to this actor: publish them at a
        // steady pace.
        #[cfg(feature = "metrics")]
        ctx.run_interval(std::time::Duration::from_secs(1), |act, _| {
            act.meter.publish(&act.inner.core().stats());
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        #[cfg(feature = "metrics")]
        self.meter.publish(&self.inner.core().stats());
        self.stop.announce_if_final();
    }
}

/// Instance `generation` of `entity` has stopped.
pub(super) struct InstanceStopped {
    entity: EntityId,
    generation: u64,
}

impl Message for InstanceStopped {
    type Result = ();
}

impl<E: EventSourced> Handler<InstanceStopped> for HostShell<E> {
    type Result = ();

    fn handle(&mut self, stopped: InstanceStopped, ctx: &mut Context<Self>) {
        let now = alarm::now();
        let mut restarted = false;
        let mut core = self.inner.core();
        let inner = &self.inner;
        let outcome = core.handle_stopped(&stopped.entity, stopped.generation, now, |e, g| {
            inner.start(e, g)
        });
        match outcome {
            Stopped::Done => {}
            Stopped::Restarted(instance, waiting) => {
                waiting.into_iter().for_each(|held| held.run_on(instance));
                restarted = true;
            }
            Stopped::Refused(waiting, _) => {
                for held in waiting {
                    let _ = held.responder.send(Err(CommandError::Stopped));
                }
            }
        }
        drop(core);
        // An instance that stopped unasked made room.
        if self.inner.admit_waiting() || restarted {
            self.rearm(ctx);
        }
        self.settle(ctx);
    }
}

/// An instance started: the passivation deadline may be earlier now.
pub(super) struct Rearm;

impl Message for Rearm {
    type Result = ();
}

impl<E: EventSourced> Handler<Rearm> for HostShell<E> {
    type Result = ();

    fn handle(&mut self, _: Rearm, ctx: &mut Context<Self>) {
        self.rearm(ctx);
    }
}

/// Resolves once no instance of the shard runs or stops.
pub(super) struct WaitGone(pub(super) ShardId);

impl Message for WaitGone {
    type Result = oneshot::Receiver<()>;
}

impl<E: EventSourced> Handler<WaitGone> for HostShell<E> {
    type Result = MessageResult<WaitGone>;

    fn handle(&mut self, WaitGone(shard): WaitGone, ctx: &mut Context<Self>) -> Self::Result {
        let (sender, receiver) = oneshot::channel();
        self.gone.push((shard, sender));
        self.settle(ctx);
        MessageResult(receiver)
    }
}

/// Stops every entity, then the host.
pub(super) struct StopHost;

impl Message for StopHost {
    type Result = ();
}

impl<E: EventSourced> Handler<StopHost> for HostShell<E> {
    type Result = ();

    fn handle(&mut self, _: StopHost, ctx: &mut Context<Self>) {
        if !self.stop.make_final() {
            return;
        }
        let due = self.inner.core().unhost_all();
        Inner::stop(due);
        self.inner.admit_waiting(); // refuses the commands that waited for room
        self.settle(ctx);
    }
}

impl<E: EventSourced> Handler<SubscribeStopped> for HostShell<E> {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}
