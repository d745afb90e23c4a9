//! What a node's tasks share (its connections, listener and remote addresses): apart from the
//! node's handle (`node.rs`), so that the tasks' files import it without importing the node.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix::ArbiterHandle;
use tokio_util::sync::CancellationToken;

use crate::codec::schema::Schemas;
use crate::tcp::handshake::Local;
use crate::tcp::options::NodeOptions;
use crate::tcp::pending::Pending;
use crate::tcp::registry::Registry;
use crate::tcp::stats::{Counters, Warnings};

/// What the node's tasks share: its identity, options, counters, budgets and schemas, and
/// the registry of exposed consumers.
pub(crate) struct Context {
    pub(crate) local: Local,
    pub(crate) options: NodeOptions,
    pub(crate) counters: Arc<Counters>,
    /// The counters' metrics, published after each socket write, received frame and
    /// connection's start and end.
    #[cfg(feature = "metrics")]
    pub(crate) meter: Mutex<crate::tcp::metrics::NodeMeter>,
    pub(crate) warnings: Warnings,
    pub(crate) cancel: CancellationToken,
    /// Where the node's tasks run: the arbiter that started it.
    pub(crate) arbiter: ArbiterHandle,
    /// Authenticated incoming connections open now (at most `max_connections`).
    pub(crate) inbound_open: AtomicUsize,
    /// Incoming connections in their handshake (at most `max_handshakes`), each with what
    /// closes it when evicted.
    pub(crate) handshakes: Mutex<Pending<CancellationToken>>,
    /// How bodies are written and read, by message type.
    pub(crate) schemas: Schemas,
    /// The consumers exposed on the node, by name.
    pub(crate) registry: Registry,
}

impl Context {
    /// After a socket write of `frames` frames in `bytes` bytes: records them and publishes
    /// the counters.
    #[cfg(feature = "metrics")]
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn written(&self, frames: usize, bytes: usize) {
        let mut meter = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
        meter.write_frames.record(frames as f64);
        meter.write_bytes.record(bytes as f64);
        meter.publish(&self.counters.snapshot());
    }

    /// Publishes the counters to the metrics.
    #[cfg(feature = "metrics")]
    pub(crate) fn publish(&self) {
        let mut meter = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
        meter.publish(&self.counters.snapshot());
    }

    /// The incoming handshakes in progress.
    pub(crate) fn handshakes(&self) -> MutexGuard<'_, Pending<CancellationToken>> {
        self.handshakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
