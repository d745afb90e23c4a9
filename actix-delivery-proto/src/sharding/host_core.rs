//! The pure core of an entity host: which entities run, which one a command goes to, when an
//! entity is passivated, and where commands wait while an entity stops. No actor, no timer,
//! no I/O: the shell starts and stops the instances this core names and reports when they
//! have stopped.
//!
//! Rules:
//! - a command for an entity that does not run starts an instance (activation); every command
//!   makes its entity the most recently used, and is *in flight* until the shell reports it
//!   answered;
//! - an entity idle for `idle_timeout` (no command routed to it, none in flight) is
//!   passivated: its instance is asked to stop (gracefully: what it decided is stored first);
//! - at most `max_active` instances run: a command that would start one more passivates the
//!   least recently used instance with no command in flight, or, when every running instance
//!   has one, **waits for room** (counted; in order, and the later commands for its entity
//!   behind it), until an instance has answered its commands; instances being passivated
//!   finish their journal writes beside the running ones (they take no commands);
//! - while an instance stops, commands for its entity wait here, in order; once it has
//!   stopped, a new instance starts (as room allows) and gets them first; commands waiting
//!   for a stopping instance or for room are at most `max_held` over all entities (beyond,
//!   they are refused);
//! - commands for entities of shards this host does not host are refused; when a shard leaves,
//!   its instances stop whether busy or not (their commands in flight finish first), and the
//!   shard is gone from the host once all of them have stopped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hashbrown::{DefaultHashBuilder, HashMap, HashSet};
use hashlink::LinkedHashMap;
use serde::{Deserialize, Serialize};

use crate::sharding::capacity;
use crate::sharding::entity_id::{EntityId, ShardId};

/// The settings the core decides by (validated by the host's options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// Passivate an entity after this long without a command; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// At most this many running instances.
    pub max_active: usize,
    /// At most this many commands wait for stopping instances or for room, over all
    /// entities.
    pub max_held: usize,
    /// The type's shard count.
    pub shards: u32,
}

/// Why a command was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its entity's shard is not hosted here.
    NotHosted(ShardId),
    /// `max_held` commands wait for stopping instances or for room already.
    Full {
        /// How many wait.
        held: usize,
    },
}

/// Where a command goes.
#[derive(Debug)]
pub enum Routing<'a, A, W> {
    /// To this running instance (`started`: it was started for this command).
    Run {
        /// The instance.
        instance: &'a A,
        /// The command, handed back.
        waiting: W,
        /// Whether the instance was started for it.
        started: bool,
    },
    /// It waits until the entity's stopping instance has stopped, or for room to start one
    /// ([`poll_admitted`](HostCore::poll_admitted) hands it out then).
    Held,
    /// Refused, handed back.
    Refused(W, Refusal),
}

/// Why an instance is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passivation {
    /// Idle for `idle_timeout`.
    Idle,
    /// The least recently used beyond `max_active`.
    OverLimit,
    /// Its shard left the host (or the host stops).
    ShardLeft,
}

/// An instance to stop: stop it and report [`HostCore::handle_stopped`] once it has.
#[derive(Debug)]
pub struct ToStop<A> {
    /// The entity.
    pub entity: EntityId,
    /// Its instance.
    pub instance: A,
    /// The instance's generation (name it in `handle_stopped`).
    pub generation: u64,
    /// Why.
    pub why: Passivation,
}

/// What a stopped instance leads to.
#[derive(Debug)]
pub enum Stopped<'a, A, W> {
    /// Nothing waits.
    Done,
    /// A new instance started for the commands that waited: run them on it, in this order.
    Restarted(&'a A, Vec<W>),
    /// The commands that waited belong to a shard that left: refuse them.
    Refused(Vec<W>, ShardId),
}

/// Counters and gauges of an entity host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HostStats {
    /// Running instances now.
    pub active: u64,
    /// Instances asked to stop that have not stopped yet.
    pub stopping: u64,
    /// Commands waiting for a stopping instance, or for room to start one, now.
    pub held: u64,
    /// The most instances that ran at once (never above `max_active_entities`).
    pub peak_active: u64,
    /// Instances started (each recovers its entity from the journal).
    pub activations: u64,
    /// Instances passivated because they were idle for `idle_timeout`.
    pub passivated_idle: u64,
    /// Instances passivated, the least recently used without a command in flight, to make
    /// room for another at `max_active_entities`.
    pub passivated_over_limit: u64,
    /// Instances stopped because their shard left the host.
    pub stopped_shard_left: u64,
    /// Instances that stopped without being asked (a journal failure stops an entity; the
    /// next command starts it again).
    pub stopped_unasked: u64,
    /// Commands routed to an instance.
    pub routed: u64,
    /// Commands that waited for a stopping instance.
    pub waited: u64,
    /// Commands that waited for room: their entity was to start at `max_active_entities`
    /// while every running instance had a command in flight.
    pub waited_for_room: u64,
    /// Commands refused because `max_held_commands` waited already.
    pub refused_full: u64,
    /// Commands refused because their shard is not hosted here.
    pub refused_not_hosted: u64,
    /// Commands whose delivery the entity had processed before (a redelivery: after a
    /// failover, the producer sends again what the old owner did not confirm).
    pub already_processed: u64,
    /// Delivered envelopes refused because their origin was out of range.
    pub refused_malformed: u64,
    /// Delivered envelopes refused because their origin was not their sender's own (see
    /// [`check_origin`](crate::protocol::origin::check_origin)): dead letters, nothing run.
    pub refused_foreign: u64,
    /// Delivered envelopes refused because their producer routes by another shard count
    /// (a misconfiguration: see `DeadLetterReason::ShardCountMismatch`).
    pub refused_shard_count: u64,
}

struct Running<A> {
    instance: A,
    generation: u64,
    last_used: Instant,
}

struct Stopping<W> {
    generation: u64,
    waiting: VecDeque<W>,
}

/// The host's state machine. `A` is a running instance (the shell's handle of it), `W` a
/// command waiting for one.
pub struct HostCore<A, W> {
    limits: HostLimits,
    /// Running instances, least recently used first.
    running: LinkedHashMap<EntityId, Running<A>, DefaultHashBuilder>,
    /// Running instances without a command in flight, least recently used first: the ones
    /// passivated for room.
    idle: LinkedHashMap<EntityId, (), DefaultHashBuilder>,
    stopping: HashMap<EntityId, Stopping<W>>,
    /// Entities waiting for room to start, in order, with their commands.
    awaiting_room: LinkedHashMap<EntityId, VecDeque<W>, DefaultHashBuilder>,
    /// Passivations decided when a command made room, for [`poll_passivation`](Self::poll_passivation).
    due: VecDeque<ToStop<A>>,
    /// Commands refused when their shard left while they waited for room.
    refused: Vec<(W, ShardId)>,
    /// Shards hosted; `None`: all.
    hosted: Option<HashSet<ShardId>>,
    /// Commands routed or held and not answered yet, per entity.
    in_flight: HashMap<EntityId, u32>,
    /// Running and stopping instances per shard.
    per_shard: HashMap<ShardId, usize>,
    next_generation: u64,
    held: usize,
    stats: HostStats,
}

impl<A, W> HostCore<A, W> {
    /// A host of every shard, running nothing yet.
    pub fn new(limits: HostLimits) -> Self {
        Self {
            limits,
            running: LinkedHashMap::default(),
            idle: LinkedHashMap::default(),
            stopping: HashMap::new(),
            awaiting_room: LinkedHashMap::default(),
            due: VecDeque::new(),
            refused: Vec::new(),
            hosted: None,
            in_flight: HashMap::new(),
            per_shard: HashMap::new(),
            next_generation: 0,
            held: 0,
            stats: HostStats::default(),
        }
    }

    /// Hosts only the shards named by [`host`](Self::host) from now on (none yet).
    pub fn with_no_shards(mut self) -> Self {
        self.hosted = Some(HashSet::new());
        self
    }

    /// Routes a command for `entity`; `start` makes a new instance (of the given generation)
    /// when none runs. A command that runs or is held is in flight until
    /// [`handle_answered`](Self::handle_answered).
    pub fn route(
        &mut self,
        entity: &EntityId,
        waiting: W,
        now: Instant,
        start: impl FnOnce(&EntityId, u64) -> A,
    ) -> Routing<'_, A, W> {
        let shard = entity.shard(self.limits.shards);
        if !self.is_hosted(shard) {
            self.stats.refused_not_hosted += 1;
            return Routing::Refused(waiting, Refusal::NotHosted(shard));
        }
        let stopping = self.stopping.contains_key(entity);
        let awaiting = self.awaiting_room.contains_key(entity);
        let must_wait =
            stopping || awaiting || (!self.running.contains_key(entity) && !self.make_room(true));
        if must_wait {
            if self.held >= self.limits.max_held {
                self.stats.refused_full += 1;
                let held = self.held;
                return Routing::Refused(waiting, Refusal::Full { held });
            }
            if let Some(stopping) = self.stopping.get_mut(entity) {
                stopping.waiting.push_back(waiting);
                self.stats.waited += 1;
            } else {
                if let Some(queue) = self.awaiting_room.get_mut(entity) {
                    queue.push_back(waiting);
                } else {
                    self.awaiting_room
                        .insert(entity.clone(), VecDeque::from([waiting]));
                }
                self.stats.waited_for_room += 1;
            }
            self.held += 1;
            *self.in_flight.entry(entity.clone()).or_default() += 1;
            return Routing::Held;
        }
        self.stats.routed += 1;
        *self.in_flight.entry(entity.clone()).or_default() += 1;
        self.idle.remove(entity);
        let started = !self.running.contains_key(entity);
        if started {
            self.start(entity.clone(), shard, now, start);
        }
        let running = self
            .running
            .to_back(entity)
            .expect("running: found or started above");
        running.last_used = now;
        Routing::Run {
            instance: &running.instance,
            waiting,
            started,
        }
    }

    fn start(
        &mut self,
        entity: EntityId,
        shard: ShardId,
        now: Instant,
        start: impl FnOnce(&EntityId, u64) -> A,
    ) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let instance = start(&entity, generation);
        self.stats.activations += 1;
        *self.per_shard.entry(shard).or_default() += 1;
        let running = Running {
            instance,
            generation,
            last_used: now,
        };
        self.running.insert(entity, running);
        self.stats.peak_active = self.stats.peak_active.max(self.running.len() as u64);
    }

    /// Whether one more instance may run now: below `max_active`, or after passivating the
    /// least recently used idle one (queued in `due`). `first_come`: only if no entity waits
    /// for room already (they come first).
    fn make_room(&mut self, first_come: bool) -> bool {
        if first_come && !self.awaiting_room.is_empty() {
            return false;
        }
        if self.running.len() < self.limits.max_active {
            return true;
        }
        let Some((victim, ())) = self.idle.pop_front() else {
            return false;
        };
        self.stats.passivated_over_limit += 1;
        let stop = self.passivate(&victim, Passivation::OverLimit);
        self.due.push_back(stop);
        true
    }

    /// The first entity that waited for room, started now that there is room (an idle
    /// instance passivated for it if need be), with its commands to run on it in order.
    /// Call until `None` after commands were answered and instances stopped.
    pub fn poll_admitted(
        &mut self,
        now: Instant,
        start: impl FnOnce(&EntityId, u64) -> A,
    ) -> Option<(&A, Vec<W>)> {
        self.awaiting_room.front()?;
        if !self.make_room(false) {
            return None;
        }
        let (entity, waiting) = self.awaiting_room.pop_front().expect("looked at above");
        self.held -= waiting.len();
        self.stats.routed += waiting.len() as u64;
        let shard = entity.shard(self.limits.shards);
        self.start(entity.clone(), shard, now, start);
        let running = self.running.get(&entity).expect("started above");
        Some((&running.instance, waiting.into()))
    }

    /// Whether commands wait for room (see [`poll_admitted`](Self::poll_admitted)).
    pub fn is_awaiting_room(&self) -> bool {
        !self.awaiting_room.is_empty()
    }

    /// Commands refused because their shard left while they waited for room.
    pub fn drain_refused(&mut self) -> impl Iterator<Item = (W, ShardId)> + '_ {
        self.refused.drain(..)
    }

    /// A command [`route`](Self::route) ran or held for `entity` was answered (or its caller
    /// gave up waiting).
    pub fn handle_answered(&mut self, entity: &EntityId) {
        if let Some(count) = self.in_flight.get_mut(entity) {
            *count -= 1;
            if *count == 0 {
                self.in_flight.remove(entity);
                capacity::shrink_map(&mut self.in_flight);
                if self.running.contains_key(entity) {
                    self.idle.insert(entity.clone(), ());
                }
            }
        }
    }

    /// A command was answered "already processed".
    pub fn note_already_processed(&mut self) {
        self.stats.already_processed += 1;
    }

    /// A delivered envelope was refused as malformed.
    pub fn note_malformed(&mut self) {
        self.stats.refused_malformed += 1;
    }

    /// A delivered envelope was refused: its origin was not its sender's own.
    pub fn note_foreign(&mut self) {
        self.stats.refused_foreign += 1;
    }

    /// A delivered envelope was refused: its sender routes by another shard count.
    pub fn note_shard_count_mismatch(&mut self) {
        self.stats.refused_shard_count += 1;
    }

    /// The type's shard count.
    pub fn shards(&self) -> u32 {
        self.limits.shards
    }

    fn is_busy(&self, entity: &EntityId) -> bool {
        self.in_flight.contains_key(entity)
    }

    /// The next instance to passivate now, if any: one passivated to make room, else one
    /// idle for `idle_timeout` (a busy idle one counts as used now). Call until `None`.
    pub fn poll_passivation(&mut self, now: Instant) -> Option<ToStop<A>> {
        if let Some(stop) = self.due.pop_front() {
            return Some(stop);
        }
        let idle_timeout = self.limits.idle_timeout?;
        loop {
            let (entity, running) = self.running.front()?;
            if running.last_used + idle_timeout > now {
                return None;
            }
            let entity = entity.clone();
            if self.is_busy(&entity) {
                // In use: it counts as used now.
                if let Some(running) = self.running.to_back(&entity) {
                    running.last_used = now;
                }
                continue;
            }
            self.stats.passivated_idle += 1;
            return Some(self.passivate(&entity, Passivation::Idle));
        }
    }

    fn passivate(&mut self, entity: &EntityId, why: Passivation) -> ToStop<A> {
        let (entity, running) = self.running.remove_entry(entity).expect("a running entity");
        self.idle.remove(&entity);
        capacity::shrink_linked(&mut self.running);
        capacity::shrink_linked(&mut self.idle);
        let stopping = Stopping {
            generation: running.generation,
            waiting: VecDeque::new(),
        };
        self.stopping.insert(entity.clone(), stopping);
        ToStop {
            entity,
            instance: running.instance,
            generation: running.generation,
            why,
        }
    }

    /// When to poll for passivations next: the least recently used entity's idle deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.limits
            .idle_timeout
            .and_then(|timeout| Some(self.running.front()?.1.last_used + timeout))
    }

    /// Instance `generation` of `entity` has stopped; `start` makes a new one if commands
    /// wait for it.
    pub fn handle_stopped(
        &mut self,
        entity: &EntityId,
        generation: u64,
        now: Instant,
        start: impl FnOnce(&EntityId, u64) -> A,
    ) -> Stopped<'_, A, W> {
        let shard = entity.shard(self.limits.shards);
        if self
            .running
            .get(entity)
            .is_some_and(|r| r.generation == generation)
        {
            // Not asked to stop: it failed. The next command starts it again.
            self.running.remove(entity);
            self.idle.remove(entity);
            self.stats.stopped_unasked += 1;
            self.forget(shard);
            return Stopped::Done;
        }
        if self
            .stopping
            .get(entity)
            .is_none_or(|s| s.generation != generation)
        {
            return Stopped::Done; // a stale report
        }
        let stopping = self.stopping.remove(entity).expect("checked above");
        capacity::shrink_map(&mut self.stopping);
        self.forget(shard);
        if stopping.waiting.is_empty() {
            return Stopped::Done;
        }
        if !self.is_hosted(shard) {
            self.held -= stopping.waiting.len();
            let waiting: Vec<W> = stopping.waiting.into();
            self.stats.refused_not_hosted += waiting.len() as u64;
            return Stopped::Refused(waiting, shard);
        }
        if !self.make_room(true) {
            // No room: its commands wait for room (still held), after those that wait already.
            self.awaiting_room.insert(entity.clone(), stopping.waiting);
            return Stopped::Done;
        }
        self.held -= stopping.waiting.len();
        let waiting: Vec<W> = stopping.waiting.into();
        self.stats.routed += waiting.len() as u64;
        self.start(entity.clone(), shard, now, start);
        let running = self.running.get(entity).expect("started above");
        Stopped::Restarted(&running.instance, waiting)
    }

    fn forget(&mut self, shard: ShardId) {
        if let Some(count) = self.per_shard.get_mut(&shard) {
            *count -= 1;
            if *count == 0 {
                self.per_shard.remove(&shard);
            }
        }
    }

    /// Hosts `shard` from now on.
    pub fn host(&mut self, shard: ShardId) {
        if let Some(hosted) = &mut self.hosted {
            hosted.insert(shard);
        }
    }

    /// Stops hosting `shard`: its commands are refused from now on, and its running instances
    /// are to be stopped (returned). It is gone once [`is_gone`](Self::is_gone).
    pub fn unhost(&mut self, shard: ShardId) -> Vec<ToStop<A>> {
        let shards = self.limits.shards;
        let hosted = self
            .hosted
            .get_or_insert_with(|| (0..shards).map(ShardId).collect());
        hosted.remove(&shard);
        self.stop_where(|entity| entity.shard(shards) == shard)
    }

    /// Stops hosting any shard: every running instance is to be stopped (returned).
    pub fn unhost_all(&mut self) -> Vec<ToStop<A>> {
        self.hosted = Some(HashSet::new());
        self.stop_where(|_| true)
    }

    fn stop_where(&mut self, matches: impl Fn(&EntityId) -> bool) -> Vec<ToStop<A>> {
        let left: Vec<EntityId> = self
            .awaiting_room
            .keys()
            .filter(|entity| matches(entity))
            .cloned()
            .collect();
        for entity in left {
            let waiting = self.awaiting_room.remove(&entity).unwrap_or_default();
            let shard = entity.shard(self.limits.shards);
            self.held -= waiting.len();
            self.stats.refused_not_hosted += waiting.len() as u64;
            self.refused.extend(waiting.into_iter().map(|w| (w, shard)));
        }
        let entities: Vec<EntityId> = self
            .running
            .keys()
            .filter(|entity| matches(entity))
            .cloned()
            .collect();
        self.stats.stopped_shard_left += entities.len() as u64;
        entities
            .iter()
            .map(|entity| self.passivate(entity, Passivation::ShardLeft))
            .collect()
    }

    /// Whether `shard` is hosted here.
    pub fn is_hosted(&self, shard: ShardId) -> bool {
        self.hosted.as_ref().is_none_or(|h| h.contains(&shard))
    }

    /// Whether no instance of `shard` runs or stops here.
    pub fn is_gone(&self, shard: ShardId) -> bool {
        !self.per_shard.contains_key(&shard)
    }

    /// Whether no instance runs or stops here.
    pub fn is_empty(&self) -> bool {
        self.per_shard.is_empty()
    }

    /// The counters and gauges.
    pub fn stats(&self) -> HostStats {
        HostStats {
            active: self.running.len() as u64,
            stopping: self.stopping.len() as u64,
            held: self.held as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance: its entity and generation.
    #[derive(Debug, Clone)]
    struct Instance {
        entity: String,
        generation: u64,
    }

    type Core = HostCore<Instance, u32>;

    fn limits() -> HostLimits {
        HostLimits {
            idle_timeout: Some(Duration::from_secs(10)),
            max_active: 100,
            max_held: 100,
            shards: 8,
        }
    }

    fn id(n: u32) -> EntityId {
        EntityId::new(format!("e{n}")).unwrap()
    }

    fn start(entity: &EntityId, generation: u64) -> Instance {
        Instance {
            entity: entity.to_string(),
            generation,
        }
    }

    /// Routes command `w` to entity `n`: `Some((generation, started))` if it runs now.
    fn route(core: &mut Core, n: u32, w: u32, now: Instant) -> Option<(u64, bool)> {
        match core.route(&id(n), w, now, start) {
            Routing::Run {
                instance,
                waiting,
                started,
            } => {
                assert_eq!((waiting, instance.entity.as_str()), (w, id(n).as_str()));
                Some((instance.generation, started))
            }
            Routing::Held => None,
            Routing::Refused(_, refusal) => panic!("refused: {refusal:?}"),
        }
    }

    /// Routes command `w` to entity `n` and answers it at once.
    fn answered(core: &mut Core, n: u32, w: u32, now: Instant) -> Option<(u64, bool)> {
        let routed = route(core, n, w, now);
        core.handle_answered(&id(n));
        routed
    }

    #[test]
    fn the_first_command_starts_an_instance_and_later_ones_reuse_it() {
        let now = Instant::now();
        let mut core = Core::new(limits());
        assert_eq!(answered(&mut core, 1, 1, now), Some((1, true)));
        assert_eq!(answered(&mut core, 1, 2, now), Some((1, false)));
        assert_eq!(answered(&mut core, 2, 3, now), Some((2, true)));
        let stats = core.stats();
        assert_eq!((stats.active, stats.activations, stats.routed), (2, 2, 3));
    }

    #[test]
    fn an_idle_entity_is_passivated_after_the_timeout_and_a_busy_one_counts_as_used() {
        let t0 = Instant::now();
        let mut core = Core::new(limits());
        route(&mut core, 1, 1, t0); // in flight until answered
        answered(&mut core, 2, 2, t0 + Duration::from_secs(5));
        assert_eq!(
            core.next_deadline(),
            Some(t0 + Duration::from_secs(10)),
            "e1's idle deadline"
        );
        assert!(core.poll_passivation(t0 + Duration::from_secs(9)).is_none());
        let later = t0 + Duration::from_secs(10);
        assert!(
            core.poll_passivation(later).is_none(),
            "e1 busy: used now; e2 not idle yet"
        );
        core.handle_answered(&id(1));
        let stop = core
            .poll_passivation(later + Duration::from_secs(10))
            .unwrap();
        assert_eq!((stop.entity, stop.why), (id(2), Passivation::Idle));
        let stop = core
            .poll_passivation(later + Duration::from_secs(10))
            .unwrap();
        assert_eq!(stop.entity, id(1), "idle since it was answered");
        let stats = core.stats();
        assert_eq!(
            (stats.active, stats.stopping, stats.passivated_idle),
            (0, 2, 2)
        );
    }

    #[test]
    fn at_the_limit_a_new_entity_passivates_the_least_recently_used_idle_one() {
        let now = Instant::now();
        let mut core = Core::new(HostLimits {
            max_active: 2,
            ..limits()
        });
        answered(&mut core, 1, 1, now);
        answered(&mut core, 2, 2, now);
        answered(&mut core, 1, 3, now); // e1 is now the most recent
        answered(&mut core, 3, 4, now);
        let stop = core.poll_passivation(now).unwrap();
        assert_eq!(
            (stop.entity, stop.why),
            (id(2), Passivation::OverLimit),
            "e2 is the least recently used"
        );
        assert!(core.poll_passivation(now).is_none());
        let stats = core.stats();
        assert_eq!(
            (stats.active, stats.peak_active),
            (2, 2),
            "never above the limit"
        );
    }

    #[test]
    fn at_the_limit_with_every_instance_busy_a_new_entity_waits_for_room_in_order() {
        let now = Instant::now();
        let mut core = Core::new(HostLimits {
            max_active: 2,
            max_held: 3,
            ..limits()
        });
        route(&mut core, 1, 1, now); // busy
        route(&mut core, 2, 2, now); // busy
        assert_eq!(route(&mut core, 3, 3, now), None, "no room: waits");
        assert_eq!(route(&mut core, 4, 4, now), None, "behind e3");
        assert_eq!(route(&mut core, 3, 5, now), None, "behind e3's first");
        assert!(matches!(
            core.route(&id(5), 6, now, start),
            Routing::Refused(6, Refusal::Full { held: 3 })
        ));
        assert_eq!(route(&mut core, 1, 7, now), Some((1, false)), "e1 runs");
        assert!(core.poll_admitted(now, start).is_none(), "all still busy");
        let stats = core.stats();
        assert_eq!((stats.active, stats.held, stats.waited_for_room), (2, 3, 3));
        // e2 answers: it is idle now, passivated for e3, whose commands run in order.
        core.handle_answered(&id(2));
        let (instance, waiting) = core.poll_admitted(now, start).unwrap();
        assert_eq!((instance.entity.as_str(), waiting), ("e3", vec![3, 5]));
        assert!(core.poll_admitted(now, start).is_none(), "e1 and e3 busy");
        let stop = core.poll_passivation(now).unwrap();
        assert_eq!((stop.entity, stop.why), (id(2), Passivation::OverLimit));
        core.handle_answered(&id(1));
        core.handle_answered(&id(1));
        let (instance, waiting) = core.poll_admitted(now, start).unwrap();
        assert_eq!((instance.entity.as_str(), waiting), ("e4", vec![4]));
        let stats = core.stats();
        assert_eq!(
            (
                stats.active,
                stats.peak_active,
                stats.held,
                stats.passivated_over_limit
            ),
            (2, 2, 0, 2)
        );
    }

    #[test]
    fn commands_waiting_for_room_are_refused_when_their_shard_leaves() {
        let now = Instant::now();
        let mut core = Core::new(HostLimits {
            max_active: 1,
            ..limits()
        });
        route(&mut core, 1, 1, now);
        assert_eq!(route(&mut core, 2, 2, now), None);
        let shard = id(2).shard(8);
        core.unhost(shard);
        let refused: Vec<_> = core.drain_refused().collect();
        assert_eq!(refused, [(2, shard)]);
        assert_eq!(core.stats().held, 0);
        assert!(!core.is_awaiting_room());
    }

    #[test]
    fn commands_wait_in_order_while_an_instance_stops_and_go_to_the_next_one() {
        let now = Instant::now();
        let mut core = Core::new(HostLimits {
            max_held: 2,
            ..limits()
        });
        answered(&mut core, 1, 1, now);
        let later = now + Duration::from_secs(10);
        let stop = core.poll_passivation(later).unwrap();
        assert_eq!(route(&mut core, 1, 2, later), None, "held");
        assert_eq!(route(&mut core, 1, 3, later), None, "held");
        assert!(matches!(
            core.route(&id(1), 4, later, start),
            Routing::Refused(4, Refusal::Full { held: 2 })
        ));
        assert_eq!(core.stats().held, 2);
        // A stale report of another generation changes nothing.
        assert!(matches!(
            core.handle_stopped(&id(1), 99, later, start),
            Stopped::Done
        ));
        match core.handle_stopped(&id(1), stop.generation, later, start) {
            Stopped::Restarted(instance, waiting) => {
                assert_eq!(waiting, [2, 3]);
                assert_eq!(instance.generation, 2);
            }
            other => panic!("{other:?}"),
        }
        let stats = core.stats();
        assert_eq!(
            (stats.held, stats.activations, stats.refused_full),
            (0, 2, 1)
        );
        let idle = later + Duration::from_secs(60);
        assert!(
            core.poll_passivation(idle).is_none(),
            "the released commands are in flight"
        );
        core.handle_answered(&id(1));
        core.handle_answered(&id(1));
        let idle = idle + Duration::from_secs(10);
        assert!(core.poll_passivation(idle).is_some(), "idle since then");
    }

    #[test]
    fn an_instance_that_stops_unasked_is_started_again_by_the_next_command() {
        let now = Instant::now();
        let mut core = Core::new(limits());
        let (generation, _) = answered(&mut core, 1, 1, now).unwrap();
        assert!(matches!(
            core.handle_stopped(&id(1), generation, now, start),
            Stopped::Done
        ));
        assert_eq!(core.stats().stopped_unasked, 1);
        assert_eq!(answered(&mut core, 1, 2, now), Some((2, true)));
    }

    #[test]
    fn a_shard_that_leaves_refuses_commands_stops_its_instances_and_is_gone_once_they_stopped() {
        let now = Instant::now();
        let mut core = Core::new(limits()).with_no_shards();
        let e = id(1);
        let shard = e.shard(8);
        assert!(matches!(
            core.route(&e, 1, now, start),
            Routing::Refused(1, Refusal::NotHosted(s)) if s == shard
        ));
        core.host(shard);
        route(&mut core, 1, 2, now); // busy: stopped all the same
        assert!(!core.is_gone(shard));
        let stops = core.unhost(shard);
        assert_eq!(stops.len(), 1);
        assert_eq!(stops[0].why, Passivation::ShardLeft);
        assert!(matches!(
            core.route(&e, 3, now, start),
            Routing::Refused(3, Refusal::NotHosted(_))
        ));
        assert!(!core.is_gone(shard), "its instance is still stopping");
        assert!(matches!(
            core.handle_stopped(&e, stops[0].generation, now, start),
            Stopped::Done
        ));
        assert!(core.is_gone(shard) && core.is_empty());
        assert_eq!(core.stats().refused_not_hosted, 2);
    }

    #[test]
    fn commands_held_for_a_shard_that_left_meanwhile_are_refused_not_restarted() {
        let now = Instant::now();
        let mut core = Core::new(limits());
        let e = id(1);
        answered(&mut core, 1, 1, now);
        let stop = core
            .poll_passivation(now + Duration::from_secs(10))
            .unwrap();
        assert_eq!(route(&mut core, 1, 2, now), None);
        assert!(core.unhost(e.shard(8)).is_empty(), "nothing runs");
        match core.handle_stopped(&e, stop.generation, now, start) {
            Stopped::Refused(waiting, shard) => {
                assert_eq!((waiting, shard), (vec![2], e.shard(8)));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(core.stats().activations, 1);
        assert!(core.is_empty());
    }

    #[test]
    fn tables_that_drained_give_their_memory_back() {
        let now = Instant::now();
        let mut core = Core::new(HostLimits {
            max_active: 1 << 20,
            ..limits()
        });
        for n in 0..100_000 {
            answered(&mut core, n, n, now);
        }
        let high = core.running.capacity();
        let later = now + Duration::from_secs(10);
        let stops: Vec<_> = std::iter::from_fn(|| core.poll_passivation(later)).collect();
        assert_eq!(stops.len(), 100_000);
        for stop in stops {
            core.handle_stopped(&stop.entity, stop.generation, later, start);
        }
        assert!(core.is_empty());
        for capacity in [
            core.running.capacity(),
            core.idle.capacity(),
            core.stopping.capacity(),
            core.in_flight.capacity(),
        ] {
            assert!(capacity <= 2 * capacity::KEPT, "{capacity} of {high}");
        }
    }
}
