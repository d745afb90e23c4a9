//! How a journal tells its readers that tagged entries were committed (a watch channel): apart
//! from the queries' data (`by_tag.rs`), which is core.

use tokio::sync::watch;

/// Tells a reader that tagged entries were committed: a counter that grows with each commit
/// the journal knows of (its own; for PostgreSQL those of every process, through
/// `LISTEN/NOTIFY`). A hint to read now rather than at the next poll: it may come more often
/// than needed, and a reader must still poll, in case one is lost.
#[derive(Clone, Debug)]
pub struct TagNotifications(watch::Receiver<u64>);

impl TagNotifications {
    /// Resolves at the next commit of tagged entries after the last call (at once if one came
    /// meanwhile). Never resolves once the journal is gone.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The sending end of [`TagNotifications`], kept by a journal.
#[derive(Debug)]
pub(crate) struct TagSignal(watch::Sender<u64>);

impl Default for TagSignal {
    fn default() -> Self {
        Self(watch::channel(0).0)
    }
}

impl TagSignal {
    /// Says that tagged entries were committed.
    pub(crate) fn notify(&self) {
        self.0.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// A new receiver.
    pub(crate) fn subscribe(&self) -> TagNotifications {
        TagNotifications(self.0.subscribe())
    }
}
