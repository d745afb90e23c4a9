//! Journal doubles shared by the persistence tests.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};

use super::Gate;

/// What the next append of a [`Faulty`] journal does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Commits and reports it.
    None = 0,
    /// Fails before committing: nothing is written.
    BeforeCommit = 1,
    /// Commits, then reports a storage error (as a commit whose fsync failed, or a connection
    /// lost after COMMIT, does): [`JournalError::Storage`] documents that "the operation may
    /// or may not have taken effect".
    AfterCommit = 2,
}

/// A MemoryJournal whose next append can be made to fail, before or after its commit, and
/// that counts what it injected.
#[derive(Clone)]
pub struct Faulty {
    pub inner: MemoryJournal,
    next: Arc<AtomicU8>,
    injected: Arc<[std::sync::atomic::AtomicU64; 3]>,
}

impl Faulty {
    pub fn new(inner: MemoryJournal) -> Self {
        Self {
            inner,
            next: Arc::new(AtomicU8::new(Fault::None as u8)),
            injected: Arc::default(),
        }
    }

    /// The next append fails this way (replacing an armed fault).
    pub fn arm(&self, fault: Fault) {
        self.next.store(fault as u8, Ordering::SeqCst);
    }

    /// How many faults of this kind were injected.
    pub fn injected(&self, fault: Fault) -> u64 {
        self.injected[fault as usize].load(Ordering::SeqCst)
    }

    fn failed(&self, fault: Fault, id: &PersistenceId) -> JournalError {
        self.injected[fault as usize].fetch_add(1, Ordering::SeqCst);
        JournalError::Storage {
            persistence_id: Some(id.clone()),
            message: format!("injected fault: {fault:?}"),
        }
    }
}

impl Journal for Faulty {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            let fault = self.next.swap(Fault::None as u8, Ordering::SeqCst);
            if fault == Fault::BeforeCommit as u8 {
                return Err(self.failed(Fault::BeforeCommit, &id));
            }
            self.inner
                .append_as(&id, first_seq, payloads, manifest)
                .await?;
            if fault == Fault::AfterCommit as u8 {
                return Err(self.failed(Fault::AfterCommit, &id));
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

/// A MemoryJournal whose next recovery (its first read, `load_snapshot`) waits until released:
/// a journal slow to answer one opening's reads.
#[derive(Clone)]
pub struct SlowRecovery {
    inner: MemoryJournal,
    hold_next: Arc<AtomicBool>,
    gate: Gate,
}

impl SlowRecovery {
    pub fn new(inner: MemoryJournal) -> Self {
        Self {
            inner,
            hold_next: Arc::new(AtomicBool::new(false)),
            gate: Gate::default(),
        }
    }

    /// The next recovery waits until [`release`](Self::release).
    pub fn hold_next(&self) {
        self.hold_next.store(true, Ordering::SeqCst);
    }

    /// Lets the held recovery (and every later one) go on.
    pub fn release(&self) {
        self.gate.open();
    }
}

impl Journal for SlowRecovery {
    fn append_as(
        &self,
        id: &PersistenceId,
        first: u64,
        p: Vec<Vec<u8>>,
        m: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.inner.append_as(id, first, p, m)
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
        let id = id.clone();
        Box::pin(async move {
            if self.hold_next.swap(false, Ordering::SeqCst) {
                self.gate.pass().await;
            }
            self.inner.load_snapshot(&id).await
        })
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}
