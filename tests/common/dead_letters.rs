//! A dead-letter store that fails on demand: a memory store whose keeps fail (a number of
//! times) or hang, and whose next removal fails, each injection counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use actix_delivery::dead_letters::{
    DeadLetterCounts, DeadLetterError, DeadLetterFilter, DeadLetterFuture, DeadLetterLimits,
    DeadLetterPage, DeadLetterStore, Kept, MemoryDeadLetters, NewDeadLetter, StoredDeadLetter,
};
use actix_delivery::Happened;

/// See the module documentation. Clones share their faults.
#[derive(Clone)]
pub struct FaultyDeadLetters {
    inner: MemoryDeadLetters,
    failing_keeps: Arc<AtomicU64>,
    hanging_keeps: Arc<AtomicBool>,
    failing_remove: Arc<AtomicBool>,
    injected: Arc<AtomicU64>,
}

impl FaultyDeadLetters {
    pub fn new() -> Self {
        Self {
            inner: MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap(),
            failing_keeps: Arc::default(),
            hanging_keeps: Arc::default(),
            failing_remove: Arc::default(),
            injected: Arc::default(),
        }
    }

    /// The next `n` keeps fail (nothing kept).
    pub fn fail_keeps(&self, n: u64) {
        self.failing_keeps.store(n, Ordering::SeqCst);
    }

    /// Every keep from now on never answers.
    pub fn hang_keeps(&self) {
        self.hanging_keeps.store(true, Ordering::SeqCst);
    }

    /// The next removal fails (nothing removed), as a crash before it would leave it.
    pub fn fail_next_remove(&self) {
        self.failing_remove.store(true, Ordering::SeqCst);
    }

    /// How many faults were injected.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn inject<T: Send + 'static>(&self, what: &str) -> DeadLetterFuture<'static, T> {
        self.injected.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Err(DeadLetterError::Storage {
            message: format!("injected: the {what} failed"),
            happened: Happened::CertainlyNot,
        })))
    }
}

impl DeadLetterStore for FaultyDeadLetters {
    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    fn limits(&self) -> &DeadLetterLimits {
        self.inner.limits()
    }
    fn keep(&self, letter: NewDeadLetter, now_ms: u64) -> DeadLetterFuture<'_, Kept> {
        if self.hanging_keeps.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let failing = &self.failing_keeps;
        if failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return self.inject("keep");
        }
        self.inner.keep(letter, now_ms)
    }
    fn list(&self, filter: DeadLetterFilter) -> DeadLetterFuture<'_, DeadLetterPage> {
        self.inner.list(filter)
    }
    fn get(&self, id: u64) -> DeadLetterFuture<'_, Option<StoredDeadLetter>> {
        self.inner.get(id)
    }
    fn remove(&self, id: u64) -> DeadLetterFuture<'_, bool> {
        if self.failing_remove.swap(false, Ordering::SeqCst) {
            return self.inject("removal");
        }
        self.inner.remove(id)
    }
    fn replay_failed(&self, id: u64, error: String, now_ms: u64) -> DeadLetterFuture<'_, bool> {
        self.inner.replay_failed(id, error, now_ms)
    }
    fn counts(&self) -> DeadLetterFuture<'_, DeadLetterCounts> {
        self.inner.counts()
    }
}
