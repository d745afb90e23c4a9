//! The [`Console`] and its registrations: the parts the application gives it, each under a
//! name, and how to ask each for what it shows. Nothing is collected until a request asks.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::{join_all, LocalBoxFuture};
use futures_util::FutureExt;
use serde_json::{json, Value};

use crate::admin::confirm::ConfirmKey;
use crate::admin::guard::Bearer;
use crate::admin::views::{self, Section};
use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::dead_letter_handle::DeadLetters;
use crate::delivery::message::GetProducerStats;
use crate::delivery::producer::ProducerHandle;
use crate::error::OptionsError;
use crate::journal::{Journal, TagQuery};
use crate::persistence::EventSourced;
use crate::projection::ProjectionHandle;
use crate::runtime::random::random_bytes;
use crate::sharding::{EntityHostHandle, LeaseStore, ShardCoordinatorHandle};
use crate::tcp::NodeHandle;
use crate::work_pulling::WorkPullingHandle;

/// How long a part may take to answer before its view says it did not.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The shortest secret [`Console::confirm_key`] takes, in bytes.
const MIN_CONFIRM_SECRET: usize = 16;
/// The default of [`Console::stuck_after`].
const STUCK_AFTER: Duration = Duration::from_secs(30);

/// What a probe is given when it is asked: the dead-letter store, if the console has one.
#[derive(Clone)]
pub(crate) struct Asked {
    pub(crate) dead_letters: Option<DeadLetters>,
}

/// How to ask a registered part for its view (a JSON object with its `name`).
type Probe = Arc<dyn Fn(Asked) -> LocalBoxFuture<'static, Value> + Send + Sync>;

struct Registered {
    name: String,
    probe: Probe,
}

/// The admin console: the parts the application gives it, served as JSON endpoints and one
/// HTML page by the [`scope`](Self::scope) the application mounts on its own `actix-web`
/// server (see the [module documentation](crate::admin)).
///
/// Cheap to clone (clones share the registrations), `Send + Sync`: build it once, register
/// the parts, and give a clone to each `HttpServer` worker. Each registration holds a clone
/// of the part's handle (a weak address for producers and consumers), and asks it only when
/// a request comes: the console collects nothing in between. A handle it holds keeps a part
/// that stops when its last handle is dropped (an entity host, a node, a carrier, a work-
/// pulling producer) from stopping that way: stop those with `stop()` or the
/// [coordinated shutdown](crate::shutdown). A part registered again under the same name in
/// the same section replaces the first.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    parts: RwLock<Parts>,
    bearer: RwLock<Option<Arc<Bearer>>>,
    key: RwLock<Arc<ConfirmKey>>,
    stuck_after: RwLock<Duration>,
    /// For each part with work waiting, the progress counter last seen and since when it
    /// has not moved (updated by requests only).
    progress: Mutex<HashMap<(Section, String), (u64, Instant)>>,
}

#[derive(Default)]
struct Parts {
    dead_letters: Option<DeadLetters>,
    sections: HashMap<Section, Vec<Registered>>,
}

impl fmt::Debug for Console {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = self.parts();
        let mut debug = f.debug_struct("Console");
        for section in Section::ALL {
            let names: Vec<&str> = parts
                .sections
                .get(&section)
                .map(|all| all.iter().map(|part| part.name.as_str()).collect())
                .unwrap_or_default();
            debug.field(section.key(), &names);
        }
        debug
            .field("dead_letters", &parts.dead_letters.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for Console {
    fn default() -> Self {
        Self::new()
    }
}

impl Console {
    /// A console of no parts, with a confirmation key drawn from the OS (see
    /// [`scope`](Self::scope) for the tokens it makes).
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                parts: RwLock::new(Parts::default()),
                bearer: RwLock::new(None),
                key: RwLock::new(Arc::new(ConfirmKey::new(random_bytes()))),
                stuck_after: RwLock::new(STUCK_AFTER),
                progress: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Requires `Authorization: Bearer <token>` on every route of every scope of this console
    /// (made before or after): a request without it, or with another token, gets `401` with a
    /// JSON body. The token is compared in constant time. Without this, put the scope behind
    /// the application's own authentication; a browser reaches a console that requires a
    /// bearer token through a proxy that adds the header.
    ///
    /// # Errors
    /// An [`OptionsError`] for an empty token, or one with whitespace or control characters.
    pub fn require_bearer(&self, token: &str) -> Result<&Self, OptionsError> {
        let bearer = Bearer::new(token)?;
        *self
            .inner
            .bearer
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(bearer));
        Ok(self)
    }

    /// Makes the confirmation tokens of the writes (see [`scope`](Self::scope)) under a key
    /// derived from `secret` instead of the one drawn when the console was made: replicas of
    /// the application behind a load balancer, given the same secret, accept each other's
    /// tokens (a token shown by one replica confirms a write sent to another). Tokens made
    /// before under another key no longer confirm anything. Keep the secret as a password
    /// (anyone who has it can make tokens, though still only with the bearer token, if one
    /// is [required](Self::require_bearer)); changing it invalidates every token shown.
    ///
    /// # Errors
    /// An [`OptionsError`] naming `confirm_key` for a secret shorter than 16 bytes.
    pub fn confirm_key(&self, secret: &[u8]) -> Result<&Self, OptionsError> {
        if secret.len() < MIN_CONFIRM_SECRET {
            return Err(OptionsError::new(
                "confirm_key",
                format!(
                    "a secret of {} bytes is too short: at least {MIN_CONFIRM_SECRET}",
                    secret.len()
                ),
            ));
        }
        *self
            .inner
            .key
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(ConfirmKey::from_secret(secret));
        Ok(self)
    }

    /// How long a stream may hold an unconfirmed message, a part hold work without
    /// progress, or a projection lag, before the overview and the page list it under
    /// "attention" (default 30 s).
    pub fn stuck_after(&self, after: Duration) -> &Self {
        *self
            .inner
            .stuck_after
            .write()
            .unwrap_or_else(PoisonError::into_inner) = after;
        self
    }

    /// Shows the entries of `dead_letters` (list, show, replay and delete), and each
    /// consumer's dead letters by cause (those kept under the consumer's registered name).
    pub fn dead_letters(&self, dead_letters: &DeadLetters) -> &Self {
        self.parts_mut().dead_letters = Some(dead_letters.clone());
        self
    }

    /// Shows a producer under `name`: a durable one's unconfirmed messages, the age of the
    /// oldest and its writes in doubt, and every producer's window (in flight, queued,
    /// retransmissions, given up).
    pub fn producer<T: Clone + Send + 'static>(
        &self,
        name: impl Into<String>,
        producer: &ProducerHandle<T>,
    ) -> &Self {
        let addr = producer.addr().downgrade();
        let id = producer.producer_id().to_string();
        self.register(Section::Producers, name, move |name, _| {
            let stats = addr.upgrade().map(|addr| addr.send(GetProducerStats));
            let id = id.clone();
            async move {
                let stats = match stats {
                    Some(stats) => stats.await.ok(),
                    None => None,
                };
                views::producer(&name, &id, stats)
            }
        })
    }

    /// Shows a consumer under `name`: the producers it tracks, the messages waiting for its
    /// handler, how long they have waited without one being handled, and (with a
    /// [dead-letter store](Self::dead_letters)) its dead letters by cause, if it keeps them
    /// under the same name.
    pub fn consumer<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        consumer: &ConsumerHandle<T>,
    ) -> &Self {
        let addr = consumer.addr().downgrade();
        self.register(Section::Consumers, name, move |name, asked| {
            let stats = addr
                .upgrade()
                .map(|addr| addr.send(crate::delivery::message::GetConsumerStats));
            async move {
                let stats = match stats {
                    Some(stats) => stats.await.ok(),
                    None => None,
                };
                let by_cause = match &asked.dead_letters {
                    Some(dead_letters) => Some(views::by_cause_of(dead_letters, &name).await),
                    None => None,
                };
                views::consumer(&name, stats, by_cause)
            }
        })
    }

    /// Shows a work-pulling producer under `name`: its pool (workers, jobs waiting and held,
    /// failures, given up, each worker) and its producer.
    pub fn work_pulling<T: Clone + Send + 'static>(
        &self,
        name: impl Into<String>,
        pool: &WorkPullingHandle<T>,
    ) -> &Self {
        let pool = pool.clone();
        self.register(Section::WorkPulling, name, move |name, _| {
            let pool = pool.clone();
            async move {
                let stats = pool.pool_stats().await.ok();
                let producer = pool.stats().await.ok();
                views::work_pulling(&name, &pool.producer_id().to_string(), stats, producer)
            }
        })
    }

    /// Shows a projection under `name`: running or stopped (and why), its stored offset, the
    /// lag of its last batch, skips and failures. See
    /// [`projection_with_lag`](Self::projection_with_lag) for how far behind the journal it
    /// is.
    pub fn projection(&self, name: impl Into<String>, projection: &ProjectionHandle) -> &Self {
        let projection = projection.clone();
        self.register(Section::Projections, name, move |name, _| {
            let view = views::projection(&name, &projection);
            async move { view }
        })
    }

    /// As [`projection`](Self::projection), and how far behind `journal` it is: the entries
    /// of `query` (the projection's tag and slices) after its stored offset (counted up to
    /// 100 by reading them, on every request: beyond, it shows `≥ 100`), and how long ago
    /// the oldest of them was committed.
    pub fn projection_with_lag(
        &self,
        name: impl Into<String>,
        projection: &ProjectionHandle,
        journal: Arc<dyn Journal>,
        query: TagQuery,
    ) -> &Self {
        let projection = projection.clone();
        self.register(Section::Projections, name, move |name, _| {
            let mut view = views::projection(&name, &projection);
            let offset = projection.stats().offset;
            let (journal, query) = (journal.clone(), query.clone());
            async move {
                views::add_lag(&mut view, &*journal, &query, offset).await;
                view
            }
        })
    }

    /// Shows an entity host under `name`: its entity type and shards, the entities running,
    /// stopping and waited for, activations, passivations and refusals.
    pub fn entity_host<E: EventSourced>(
        &self,
        name: impl Into<String>,
        host: &EntityHostHandle<E>,
    ) -> &Self {
        let host = host.clone();
        self.register(Section::EntityHosts, name, move |name, _| {
            let view = views::entity_host(&name, host.entity_type(), host.shards(), host.stats());
            async move { view }
        })
    }

    /// Shows a shard coordinator under `name` (its node's member id, the shards it owns,
    /// renewals, handoffs), its host (as [`entity_host`](Self::entity_host)), and the shard
    /// map of its entity type in `leases` (the store it was started with): each shard's
    /// owner, fencing token and the time left on its lease, the live members, and the shards
    /// without a live lease.
    pub fn coordinator<E: EventSourced>(
        &self,
        name: impl Into<String>,
        coordinator: &ShardCoordinatorHandle<E>,
        leases: Arc<dyn LeaseStore>,
    ) -> &Self {
        let name = name.into();
        self.entity_host(name.clone(), coordinator.host());
        let namespace = coordinator.host().entity_type().to_owned();
        let shards = coordinator.host().shards();
        self.shard_map_of(name.clone(), leases, namespace, Some(shards));
        let coordinator = coordinator.clone();
        self.register(Section::Coordinators, name, move |name, _| {
            let coordinator = coordinator.clone();
            async move {
                let stats = coordinator.stats().await.ok();
                views::coordinator(
                    &name,
                    coordinator.member(),
                    coordinator.host().entity_type(),
                    stats,
                )
            }
        })
    }

    /// Shows under `name` the shard map of the entity type `namespace` in `leases`, for a
    /// node that runs no coordinator of it: each shard's owner, fencing token and time left,
    /// and the live members.
    pub fn shard_map(
        &self,
        name: impl Into<String>,
        leases: Arc<dyn LeaseStore>,
        namespace: impl Into<String>,
    ) -> &Self {
        self.shard_map_of(name, leases, namespace.into(), None)
    }

    fn shard_map_of(
        &self,
        name: impl Into<String>,
        leases: Arc<dyn LeaseStore>,
        namespace: String,
        shards: Option<u32>,
    ) -> &Self {
        self.register(Section::ShardMaps, name, move |name, _| {
            let (leases, namespace) = (leases.clone(), namespace.clone());
            async move {
                let records = leases.leases(&namespace).await;
                let view = leases.view(&namespace).await;
                views::shard_map(&name, &namespace, shards, records, view)
            }
        })
    }

    /// Shows a TCP node under `name`: its id and address, the peers it sends to (connected
    /// or not), its connections, and what it refused (handshakes, connections over the
    /// limit, unauthorized deliveries, undecodable bodies).
    pub fn node(&self, name: impl Into<String>, node: &NodeHandle) -> &Self {
        let node = node.clone();
        self.register(Section::Nodes, name, move |name, _| {
            let view = views::node(&name, &node);
            async move { view }
        })
    }

    /// Shows a NATS carrier under `name` (feature `nats`): its client's connection, and what
    /// it carried and refused.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats(&self, name: impl Into<String>, carrier: &crate::nats::NatsCarrierHandle) -> &Self {
        let carrier = carrier.clone();
        self.register(Section::Carriers, name, move |name, _| {
            let view = views::carrier(&name, &carrier);
            async move { view }
        })
    }

    fn register<F, Fut>(&self, section: Section, name: impl Into<String>, ask: F) -> &Self
    where
        F: Fn(String, Asked) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Value> + 'static,
    {
        let name = name.into();
        let probe: Probe = {
            let name = name.clone();
            Arc::new(move |asked| ask(name.clone(), asked).boxed_local())
        };
        let mut parts = self.parts_mut();
        let section = parts.sections.entry(section).or_default();
        match section.iter_mut().find(|part| part.name == name) {
            Some(part) => part.probe = probe,
            None => section.push(Registered { name, probe }),
        }
        self
    }

    /// The views of `section`'s parts, in the order they were registered, each asked now
    /// (at once, each within a bound).
    pub(crate) async fn collect(&self, section: Section) -> Vec<Value> {
        let (asked, probes) = {
            let parts = self.parts();
            let asked = Asked {
                dead_letters: parts.dead_letters.clone(),
            };
            let probes: Vec<(String, Probe)> = parts
                .sections
                .get(&section)
                .map(|all| {
                    let all = all.iter();
                    all.map(|part| (part.name.clone(), part.probe.clone()))
                        .collect()
                })
                .unwrap_or_default();
            (asked, probes)
        };
        let asks = probes.into_iter().map(|(name, probe)| {
            let view = probe(asked.clone());
            async move {
                match tokio::time::timeout(ASK_TIMEOUT, view).await {
                    Ok(view) => view,
                    Err(_) => json!({
                        "name": name,
                        "error": format!("did not answer within {} s", ASK_TIMEOUT.as_secs()),
                    }),
                }
            }
        });
        let mut views = join_all(asks).await;
        for view in &mut views {
            self.note_progress(section, view);
        }
        views
    }

    /// Every section's views, asked at once.
    pub(crate) async fn collect_all(&self) -> Vec<(Section, Vec<Value>)> {
        let all = Section::ALL.map(|section| async move { (section, self.collect(section).await) });
        join_all(all).await
    }

    /// Adds `stalled_ms` to the view of a part with work waiting (a consumer's messages, a
    /// producer's messages in flight): how long its progress counter (handled, confirmed)
    /// has not moved, as seen by the requests that asked.
    fn note_progress(&self, section: Section, view: &mut Value) {
        let number = |key: &str| view.get(key).and_then(Value::as_u64).unwrap_or(0);
        let (busy, counter) = match section {
            Section::Consumers => (
                number("waiting") + number("deferred") > 0,
                number("delivered") + number("handler_failures"),
            ),
            Section::Producers => (number("in_flight") > 0, number("confirmed")),
            _ => return,
        };
        let Some(name) = view.get("name").and_then(Value::as_str) else {
            return;
        };
        let key = (section, name.to_owned());
        let mut progress = self
            .inner
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !busy {
            progress.remove(&key);
            return;
        }
        let now = Instant::now();
        let (seen, since) = progress.entry(key).or_insert((counter, now));
        if *seen != counter {
            (*seen, *since) = (counter, now);
        }
        view["stalled_ms"] = json!(now.duration_since(*since).as_millis() as u64);
    }

    pub(crate) fn dead_letter_store(&self) -> Option<DeadLetters> {
        self.parts().dead_letters.clone()
    }

    pub(crate) fn bearer(&self) -> Option<Arc<Bearer>> {
        self.inner
            .bearer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn key(&self) -> Arc<ConfirmKey> {
        self.inner
            .key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn stuck_after_ms(&self) -> u64 {
        let after = *self
            .inner
            .stuck_after
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        after.as_millis() as u64
    }

    fn parts(&self) -> std::sync::RwLockReadGuard<'_, Parts> {
        self.inner
            .parts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn parts_mut(&self) -> std::sync::RwLockWriteGuard<'_, Parts> {
        self.inner
            .parts
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
