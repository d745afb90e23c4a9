//! What a persistent entity starts with: its journal and stream, its settings, an outbox,
//! where it runs and whether a supervisor restarts it.

use std::sync::Arc;

use actix::ArbiterHandle;

use crate::journal::{Journal, PersistenceId};
use crate::persistence::config::PersistentConfig;
use crate::persistence::outbox::Outbox;
use crate::runtime::placement::Placement;

/// Everything [`PersistentHandle::start`](crate::persistence::PersistentHandle::start) needs;
/// checked when the entity starts.
///
/// ```
/// # use std::sync::Arc;
/// # use actix_delivery::journal::{MemoryJournal, PersistenceId};
/// # use actix_delivery::persistence::{PersistentConfig, PersistentOptions};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let journal = Arc::new(MemoryJournal::new());
/// let options = PersistentOptions::new(journal, PersistenceId::new("counter-1")?)
///     .config(PersistentConfig {
///         snapshot_every: Some(100),
///         ..Default::default()
///     })
///     .supervised();
/// # drop(options);
/// # Ok(()) }
/// ```
pub struct PersistentOptions {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) id: PersistenceId,
    pub(crate) config: PersistentConfig,
    pub(crate) outbox: Option<Outbox>,
    pub(crate) placement: Placement,
}

impl PersistentOptions {
    /// The entity of stream `id` in `journal`, with the default settings, on the arbiter that
    /// starts it, unsupervised, without an outbox.
    pub fn new(journal: Arc<dyn Journal>, id: PersistenceId) -> Self {
        Self {
            journal,
            id,
            config: PersistentConfig::default(),
            outbox: None,
            placement: Placement::default(),
        }
    }

    /// Its settings (e.g. loaded from the application's config file).
    pub fn config(mut self, config: PersistentConfig) -> Self {
        self.config = config;
        self
    }

    /// An outbox: its decisions may deliver to `outbox`'s destinations
    /// ([`Decision::deliver`](crate::persistence::Decision::deliver)).
    pub fn outbox(mut self, outbox: Outbox) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// Runs the entity under an Actix `Supervisor`: after a failed append it restarts and
    /// recovers from the journal. [`stop`](crate::persistence::PersistentHandle::stop) still
    /// stops it for good.
    pub fn supervised(mut self) -> Self {
        self.placement.supervised = true;
        self
    }

    /// Runs the entity on `arbiter` (another thread): the actor is made and runs there; its
    /// handle works from anywhere.
    pub fn arbiter(mut self, arbiter: &ArbiterHandle) -> Self {
        self.placement.arbiter = Some(arbiter.clone());
        self
    }
}

impl std::fmt::Debug for PersistentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentOptions")
            .field("id", &self.id)
            .field("config", &self.config)
            .field("outbox", &self.outbox.is_some())
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}
