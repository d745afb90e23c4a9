//! Workers in other processes: they announce themselves, and a [`WorkerDiscovery`] keeps them
//! in a registry while they do.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::delivery::confirmation::Confirmation;
use crate::delivery::handler::DeliveryHandler;
use crate::delivery::message::ConsumerRef;
use crate::delivery::options::ProducerOptions;
use crate::delivery::producer::start_producer;
use crate::delivery::producer::ProducerHandle;
use crate::error::OptionsError;
use crate::runtime::alarm::now;
use crate::work_pulling::{Job, WorkerRegistry};

/// A worker saying where it takes jobs: sent every few seconds by its [`AnnouncerHandle`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Announcement {
    /// Its name in the registry (unique among the workers).
    pub name: String,
    /// Its node's address for TCP (`127.0.0.1:7001`, `host:port`), `None` over NATS.
    pub node: Option<String>,
    /// The consumer name it is exposed under on its node (TCP), or its subject (NATS).
    pub consumer: String,
}

/// The most workers one discovery keeps registered; further names are refused (counted)
/// until one expires, so a flood of announcements cannot grow the pools without bound.
pub const MAX_ANNOUNCED_WORKERS: usize = 1024;

/// Turns an announcement into the reference jobs are sent through (`None`: refused, e.g. an
/// address that does not parse).
type Resolve<T> = Box<dyn Fn(&Announcement) -> Option<ConsumerRef<Job<T>>>>;

/// Registers the workers that announce themselves, and deregisters one when no announcement of it
/// came for `timeout` (its jobs are then re-routed). Expose its
/// [`handler`](WorkerDiscoveryHandle::handler) as a consumer where the workers'
/// [`AnnouncerHandle`]s send: on a TCP [`NodeHandle`](crate::tcp::NodeHandle) or a NATS subject.
///
/// ```no_run
/// # use actix_delivery::tcp::NodeHandle;
/// # use actix_delivery::work_pulling::{Job, WorkerDiscovery, WorkerRegistry};
/// # use actix_delivery::{ConsumerOptions, ReliableDelivery};
/// # use std::time::Duration;
/// # fn _demo(node: NodeHandle, registry: WorkerRegistry<String>) -> Result<(), Box<dyn std::error::Error>> {
/// let resolver = node.clone();
/// let discovery = WorkerDiscovery::start(&registry, Duration::from_secs(3), move |a| {
///     resolver.consumer_ref::<Job<String>>(a.node.as_deref()?.parse::<std::net::SocketAddr>().ok()?, &a.consumer).ok()
/// })?;
/// let announcements = ReliableDelivery::consumer(ConsumerOptions::builder(discovery.handler()).build()?);
/// node.expose("workers", &announcements)?;
/// # Ok(()) }
/// ```
pub struct WorkerDiscovery<T: Send + 'static> {
    registry: WorkerRegistry<T>,
    timeout: Duration,
    resolve: Resolve<T>,
    /// The announcements in force: each with its registration's id and when it was last
    /// heard.
    heard: HashMap<String, Heard>,
    stats: DiscoveryStats,
}

/// What a discovery did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryStats {
    /// Announcements received.
    pub announcements: u64,
    /// Workers registered (a worker that came back counts again).
    pub registered: u64,
    /// Workers deregistered because they went silent for the timeout.
    pub expired: u64,
    /// Announcements refused: unresolvable; a name announced with another address while
    /// its registration is fresh (a second worker under one name: the first keeps it until
    /// it goes silent); a name registered by someone else; or beyond
    /// [`MAX_ANNOUNCED_WORKERS`].
    pub refused: u64,
}

/// The application's side of a [`WorkerDiscovery`].
#[derive(Clone)]
pub struct WorkerDiscoveryHandle<T: Send + 'static> {
    addr: Addr<WorkerDiscovery<T>>,
}

/// An announcement in force.
struct Heard {
    announcement: Announcement,
    registration: u64,
    seen: std::time::Instant,
}

/// An announcement received.
struct Announced(Announcement);

impl Message for Announced {
    type Result = ();
}

struct GetDiscoveryStats;

impl Message for GetDiscoveryStats {
    type Result = DiscoveryStats;
}

impl<T: Send + 'static> WorkerDiscovery<T> {
    /// Starts a discovery on the current arbiter that registers announced workers in
    /// `registry` through `resolve`, and deregisters them after `timeout` of silence.
    ///
    /// # Errors
    /// [`OptionsError`] if `timeout` is zero.
    pub fn start(
        registry: &WorkerRegistry<T>,
        timeout: Duration,
        resolve: impl Fn(&Announcement) -> Option<ConsumerRef<Job<T>>> + 'static,
    ) -> Result<WorkerDiscoveryHandle<T>, OptionsError> {
        if timeout.is_zero() {
            return Err(OptionsError::new("timeout", "must be positive"));
        }
        let discovery = Self {
            registry: registry.clone(),
            timeout,
            resolve: Box::new(resolve),
            heard: HashMap::new(),
            stats: DiscoveryStats::default(),
        };
        Ok(WorkerDiscoveryHandle {
            addr: discovery.start(),
        })
    }

    fn hear(&mut self, announcement: Announcement) {
        self.stats.announcements += 1;
        let now = now();
        if let Some(heard) = self.heard.get_mut(&announcement.name) {
            if heard.announcement != announcement {
                // Another address under a name in force: a second worker, or the first one
                // restarted elsewhere; either way the name is its until it goes silent.
                self.stats.refused += 1;
                return;
            }
            if self.registry.holds(&announcement.name, heard.registration) {
                heard.seen = now;
                return;
            }
            // Deregistered behind the discovery's back: registered again below.
            self.heard.remove(&announcement.name);
        }
        if self.heard.len() >= MAX_ANNOUNCED_WORKERS {
            self.stats.refused += 1;
            return;
        }
        let registered = (self.resolve)(&announcement)
            .map(|worker| self.registry.register_with_id(&announcement.name, worker));
        match registered {
            Some(Ok(registration)) => {
                self.stats.registered += 1;
                let name = announcement.name.clone();
                let heard = Heard {
                    announcement,
                    registration,
                    seen: now,
                };
                self.heard.insert(name, heard);
            }
            Some(Err(_)) | None => self.stats.refused += 1,
        }
    }

    fn expire(&mut self) {
        let (now, timeout) = (now(), self.timeout);
        let registry = &self.registry;
        let mut expired = 0;
        self.heard.retain(|name, heard| {
            let alive = now.duration_since(heard.seen) < timeout;
            if !alive {
                registry.remove(name, Some(heard.registration));
                expired += 1;
            }
            alive
        });
        self.stats.expired += expired;
    }
}

impl<T: Send + 'static> Actor for WorkerDiscovery<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = (self.timeout / 4).max(Duration::from_millis(1));
        ctx.run_interval(every, |act, _| act.expire());
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for (name, heard) in &self.heard {
            self.registry.remove(name, Some(heard.registration));
        }
    }
}

impl<T: Send + 'static> Handler<Announced> for WorkerDiscovery<T> {
    type Result = ();

    fn handle(&mut self, Announced(announcement): Announced, _: &mut Context<Self>) {
        self.hear(announcement);
    }
}

impl<T: Send + 'static> Handler<GetDiscoveryStats> for WorkerDiscovery<T> {
    type Result = MessageResult<GetDiscoveryStats>;

    fn handle(&mut self, _: GetDiscoveryStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats)
    }
}

impl<T: Send + 'static> WorkerDiscoveryHandle<T> {
    /// The handler of the consumer the announcements are sent to.
    pub fn handler(&self) -> DeliveryHandler<Announcement> {
        let addr = self.addr.clone();
        DeliveryHandler::from_fn(move |announcement: Announcement| {
            let heard = addr.send(Announced(announcement));
            async move { heard.await.map_err(|_| "the discovery has stopped") }
        })
    }

    /// The discovery's counters.
    ///
    /// # Errors
    /// [`MailboxError`] if it has stopped.
    pub async fn stats(&self) -> Result<DiscoveryStats, MailboxError> {
        self.addr.send(GetDiscoveryStats).await
    }

    /// Stops the discovery; the workers it registered are deregistered.
    pub fn stop(&self) {
        self.addr.do_send(StopDiscovery);
    }
}

struct StopDiscovery;

impl Message for StopDiscovery {
    type Result = ();
}

impl<T: Send + 'static> Handler<StopDiscovery> for WorkerDiscovery<T> {
    type Result = ();

    fn handle(&mut self, _: StopDiscovery, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// A worker's side: tells its [`Announcement`] to a discovery every `interval` (use a third of
/// the discovery's timeout or less), over an ordinary producer. Dropping it (or
/// [`stop`](Self::stop)) ends the announcements; the discovery deregisters the worker after
/// its timeout.
pub struct AnnouncerHandle {
    producer: ProducerHandle<Announcement>,
    task: tokio::task::JoinHandle<()>,
}

impl AnnouncerHandle {
    /// Starts announcing `announcement` to `discovery` every `interval`, on the current
    /// arbiter.
    ///
    /// # Errors
    /// [`OptionsError`] if `interval` is zero.
    pub fn start(
        discovery: impl Into<ConsumerRef<Announcement>>,
        announcement: Announcement,
        interval: Duration,
    ) -> Result<Self, OptionsError> {
        if interval.is_zero() {
            return Err(OptionsError::new("interval", "must be positive"));
        }
        // One announcement in flight, one waiting: a stale one is worth nothing.
        let options = ProducerOptions::builder(discovery)
            .window_size(1)
            .max_pending(1)
            .resend_timeout(interval)
            .build()?;
        let producer = start_producer(options);
        let announcing = producer.clone();
        let task = actix::spawn(async move {
            loop {
                let _ = announcing.tell(announcement.clone(), Confirmation::none());
                tokio::time::sleep(interval).await;
            }
        });
        Ok(Self { producer, task })
    }

    /// Ends the announcements.
    pub fn stop(&self) {
        self.task.abort();
        self.producer.stop();
    }
}

impl Drop for AnnouncerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for AnnouncerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnnouncerHandle").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> std::fmt::Debug for WorkerDiscoveryHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerDiscoveryHandle")
            .finish_non_exhaustive()
    }
}
