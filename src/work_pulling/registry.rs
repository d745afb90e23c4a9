//! The in-process registry of workers: a service key that work-pulling producers watch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use actix::{Message, Recipient};

use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::message::ConsumerRef;
use crate::work_pulling::Job;

/// The longest worker name: with the producer id (at most 127 bytes) and a `/`, a worker
/// stream's id stays within the 256 bytes of a producer id.
pub const MAX_WORKER_NAME: usize = 128;

/// Why a worker was not registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// Another worker is registered under this name.
    #[error("a worker named `{0}` is registered already")]
    NameTaken(String),
    /// The name is empty or longer than [`MAX_WORKER_NAME`] bytes.
    #[error("a worker name must be 1 to {MAX_WORKER_NAME} bytes long (got {0} bytes)")]
    InvalidName(usize),
}

/// The workers of one kind of job, by name: what work-pulling producers watch (Akka's
/// `ServiceKey` with its receptionist, in one process). Cheap to clone; every clone is the
/// same registry.
///
/// A worker is any consumer of [`Job<T>`]: a local [`ConsumerHandle`] registered with
/// [`register_consumer`](Self::register_consumer) (removed when it stops), or any [`ConsumerRef`]
/// registered with [`register`](Self::register) — a consumer across the network (a TCP
/// [`NodeHandle::consumer_ref`](crate::tcp::NodeHandle::consumer_ref), a NATS subject) — removed by
/// [`deregister`](Self::deregister) (a [`WorkerDiscovery`](crate::work_pulling::WorkerDiscovery)
/// does that for workers that stop announcing themselves).
///
/// ```
/// use actix_delivery::work_pulling::{Job, WorkerRegistry};
/// use actix_delivery::{ConsumerOptions, DeliveryHandler, ReliableDelivery};
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = WorkerRegistry::<String>::new();
/// let worker = ReliableDelivery::consumer(
///     ConsumerOptions::builder(DeliveryHandler::from_fn(|job: Job<String>| async move {
///         println!("job {}: {}", job.info.seq, job.body);
///         Ok::<(), std::io::Error>(())
///     }))
///     .build()?,
/// );
/// registry.register_consumer("worker-1", &worker)?;
/// assert_eq!(registry.names(), ["worker-1"]);
/// # Ok(()) }
/// ```
pub struct WorkerRegistry<T: Send + 'static> {
    shared: Arc<Mutex<State<T>>>,
}

struct State<T: Send + 'static> {
    next_id: u64,
    workers: BTreeMap<Arc<str>, Registered<T>>,
    watchers: Vec<Recipient<WorkersChanged<T>>>,
}

struct Registered<T: Send + 'static> {
    id: u64,
    worker: ConsumerRef<Job<T>>,
}

/// A change of the registry, told to the producers that watch it.
pub(crate) enum WorkersChanged<T: Send + 'static> {
    /// A worker registered.
    Joined {
        name: Arc<str>,
        worker: ConsumerRef<Job<T>>,
    },
    /// A worker was deregistered (or its consumer stopped).
    Left { name: Arc<str> },
}

impl<T: Send + 'static> Message for WorkersChanged<T> {
    type Result = ();
}

impl<T: Send + 'static> Clone for WorkersChanged<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Joined { name, worker } => Self::Joined {
                name: name.clone(),
                worker: worker.clone(),
            },
            Self::Left { name } => Self::Left { name: name.clone() },
        }
    }
}

impl<T: Send + 'static> WorkerRegistry<T> {
    /// An empty registry.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Mutex::new(State {
                next_id: 1,
                workers: BTreeMap::new(),
                watchers: Vec::new(),
            })),
        }
    }

    /// Registers `worker` under `name`; the producers watching the registry start sending it
    /// jobs. It stays registered until [`deregister`](Self::deregister)ed, also when it is a
    /// local consumer that stopped: register those with
    /// [`register_consumer`](Self::register_consumer).
    ///
    /// # Errors
    /// [`RegisterError`] if the name is taken or invalid.
    pub fn register(
        &self,
        name: &str,
        worker: impl Into<ConsumerRef<Job<T>>>,
    ) -> Result<(), RegisterError> {
        self.register_with_id(name, worker.into()).map(drop)
    }

    /// Registers a local consumer under `name`, as [`register`](Self::register) does, and
    /// deregisters it when it stops. Call it inside an Actix system (it spawns the watch).
    ///
    /// # Errors
    /// [`RegisterError`] if the name is taken or invalid.
    pub fn register_consumer(
        &self,
        name: &str,
        consumer: &ConsumerHandle<Job<T>>,
    ) -> Result<(), RegisterError> {
        let id = self.register_with_id(name, consumer.consumer_ref())?;
        let (registry, name, stopped) = (self.clone(), Arc::<str>::from(name), consumer.stopped());
        actix::spawn(async move {
            stopped.await;
            registry.remove(&name, Some(id));
        });
        Ok(())
    }

    /// Removes the worker registered under `name`: the producers stop sending it jobs and
    /// re-route the ones it has not confirmed. Returns whether one was registered.
    pub fn deregister(&self, name: &str) -> bool {
        self.remove(name, None)
    }

    /// The names of the registered workers, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().workers.keys().map(|n| n.to_string()).collect()
    }

    /// Adds a watcher and returns what is registered now (atomically: no change is missed or
    /// told twice).
    pub(crate) fn watch(
        &self,
        watcher: Recipient<WorkersChanged<T>>,
    ) -> Vec<(Arc<str>, ConsumerRef<Job<T>>)> {
        let mut state = self.lock();
        state.watchers.retain(|watcher| watcher.connected());
        state.watchers.push(watcher);
        let workers = state.workers.iter();
        workers
            .map(|(n, r)| (n.clone(), r.worker.clone()))
            .collect()
    }

    /// Registers as [`register`](Self::register) does and returns the registration's id.
    pub(crate) fn register_with_id(
        &self,
        name: &str,
        worker: ConsumerRef<Job<T>>,
    ) -> Result<u64, RegisterError> {
        if name.is_empty() || name.len() > MAX_WORKER_NAME {
            return Err(RegisterError::InvalidName(name.len()));
        }
        let mut state = self.lock();
        if state.workers.contains_key(name) {
            return Err(RegisterError::NameTaken(name.to_owned()));
        }
        let id = state.next_id;
        state.next_id += 1;
        let name = Arc::<str>::from(name);
        let registered = Registered {
            id,
            worker: worker.clone(),
        };
        state.workers.insert(name.clone(), registered);
        state.tell(WorkersChanged::Joined { name, worker });
        Ok(id)
    }

    /// Whether `name` is registered under the registration `id`.
    pub(crate) fn holds(&self, name: &str, id: u64) -> bool {
        self.lock().workers.get(name).is_some_and(|r| r.id == id)
    }

    /// Removes `name` if present (and, with `id`, only that registration of it).
    pub(crate) fn remove(&self, name: &str, id: Option<u64>) -> bool {
        let mut state = self.lock();
        let Some((name, registered)) = state.workers.remove_entry(name) else {
            return false;
        };
        if id.is_some_and(|id| id != registered.id) {
            state.workers.insert(name, registered);
            return false;
        }
        state.tell(WorkersChanged::Left { name });
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        // The state stays consistent at every await-free step: a panic elsewhere cannot
        // leave it half-changed.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + 'static> State<T> {
    /// Tells every watcher, forgetting those that stopped.
    fn tell(&mut self, change: WorkersChanged<T>) {
        self.watchers.retain(|watcher| watcher.connected());
        for watcher in &self.watchers {
            watcher.do_send(change.clone());
        }
    }
}

impl<T: Send + 'static> Default for WorkerRegistry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> Clone for WorkerRegistry<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for WorkerRegistry<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerRegistry")
            .field("workers", &self.names())
            .finish()
    }
}
