//! A journal that tells the test process what its appends are doing: a child wraps its
//! journal in [`Hooked`], which prints a marker line when an append is handed to the journal
//! and another once it has committed (before the caller hears of it), and can hold one append
//! for good, before it reaches the journal or after its commit, so that the test's kill lands
//! in that window: decided and not stored, or stored and not yet ACKed.

use std::sync::atomic::{AtomicU64, Ordering};

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{Journal, JournalFuture, PersistenceId, Snapshot, StoredEvent};

/// Which append [`Hooked`] holds, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// None.
    #[default]
    Never,
    /// Append `n` (from 1) never reaches the journal.
    Before(u64),
    /// Append `n` (from 1) commits, and its caller never hears of it.
    After(u64),
}

impl Hold {
    /// `before:<n>`, `after:<n>` or anything else for [`Hold::Never`].
    pub fn parse(text: &str) -> Self {
        let number = |n: &str| n.parse().unwrap_or(0);
        match text.split_once(':') {
            Some(("before", n)) if number(n) > 0 => Self::Before(number(n)),
            Some(("after", n)) if number(n) > 0 => Self::After(number(n)),
            _ => Self::Never,
        }
    }

    /// What [`parse`](Self::parse) reads.
    pub fn encode(self) -> String {
        match self {
            Self::Never => "never".to_owned(),
            Self::Before(n) => format!("before:{n}"),
            Self::After(n) => format!("after:{n}"),
        }
    }

    /// Whether the held append's marker is among `markers`, counted from its line on.
    pub fn is_held(self, markers: &Markers) -> bool {
        match self {
            Self::Never => false,
            Self::Before(n) => markers.appending >= n,
            Self::After(n) => markers.committed >= n,
        }
    }
}

/// The markers of one child's [`Hooked`] journal seen so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Markers {
    /// Appends handed to the journal.
    pub appending: u64,
    /// Appends committed, and the highest seq of them.
    pub committed: u64,
    pub committed_seq: u64,
}

impl Markers {
    /// Counts `line` if it is a marker of `marker`; true if it was one.
    pub fn take(&mut self, line: &str, marker: &str) -> bool {
        let Some(rest) = line.strip_prefix(marker) else {
            return false;
        };
        if let Some(seq) = rest.strip_prefix(" committed ") {
            self.committed += 1;
            self.committed_seq = self.committed_seq.max(seq.parse().unwrap_or(0));
            true
        } else if rest.starts_with(" appending ") {
            self.appending += 1;
            true
        } else {
            false
        }
    }
}

/// `inner`, printing `<marker> appending <last seq>` when an append is handed to it and
/// `<marker> committed <last seq>` once it committed, and holding the append `hold` says.
pub struct Hooked<J> {
    inner: J,
    marker: &'static str,
    hold: Hold,
    appends: AtomicU64,
}

impl<J: Journal> Hooked<J> {
    /// See the type.
    pub fn new(inner: J, marker: &'static str, hold: Hold) -> Self {
        Self {
            inner,
            marker,
            hold,
            appends: AtomicU64::new(0),
        }
    }
}

impl<J: Journal> Journal for Hooked<J> {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        let n = self.appends.fetch_add(1, Ordering::Relaxed) + 1;
        let last = (first_seq + payloads.len() as u64).saturating_sub(1);
        // Printed (and flushed: stdout is line buffered) before anything else happens.
        println!("{} appending {last}", self.marker);
        if self.hold == Hold::Before(n) {
            return Box::pin(std::future::pending()); // decided, and never stored
        }
        let append = self.inner.append_as(id, first_seq, payloads, manifest);
        Box::pin(async move {
            append.await?;
            println!("{} committed {last}", self.marker);
            if self.hold == Hold::After(n) {
                std::future::pending::<()>().await; // committed, and nobody hears of it
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
