//! Journal doubles shared by the persistence tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};

/// A journal that commits the next armed append and then reports it failed (as a commit whose
/// fsync failed, or a connection lost after COMMIT, does): [`JournalError::Storage`] documents
/// that "the operation may or may not have taken effect".
#[derive(Clone)]
pub struct CommitThenFail {
    pub inner: MemoryJournal,
    pub armed: Arc<AtomicBool>,
}

impl CommitThenFail {
    pub fn new(inner: MemoryJournal) -> Self {
        Self {
            inner,
            armed: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Journal for CommitThenFail {
    fn append(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            self.inner.append(&id, first_seq, payloads).await?;
            if self.armed.swap(false, Ordering::SeqCst) {
                return Err(JournalError::Storage {
                    persistence_id: Some(id),
                    message: "fsync failed (the commit is on disk anyway)".into(),
                });
            }
            Ok(())
        })
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.inner.replay(id, from_seq, to_seq, max_events)
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to_seq)
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, snapshot)
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.inner.load_snapshot(id)
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}
