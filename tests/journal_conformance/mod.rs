//! The conformance suite: what every `Journal` implementation must do, as async cases that
//! take the journal under test. A backend instantiates all of them with one line:
//!
//! ```ignore
//! #[macro_use]
//! mod journal_conformance;
//! use journal_conformance::Fixture;
//! async fn fixture() -> Fixture { /* a journal, and whatever must outlive it */ }
//! mod my_backend { journal_conformance!(super::fixture); }
//! ```
//!
//! Every case names its streams with a fresh unique prefix and never assumes the journal is
//! empty, so a backend may hand every case the same database (a shared PostgreSQL, say).
#![allow(dead_code)] // each test binary uses a different subset

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    replay_all, Journal, JournalError, JournalFuture, PersistenceId, PersistenceIdError, Snapshot,
    StoredEvent, MAX_SEQ,
};
use futures_util::future::{join, join_all};

pub mod tags;
pub use tags::*;

/// A journal under test, and what must live as long as it (a temporary directory, say).
pub struct Fixture {
    pub journal: Arc<dyn Journal>,
    pub keep: Box<dyn Any>,
}

/// Instantiates every case for the backend whose `async fn() -> Fixture` is `$fixture`.
#[macro_export]
macro_rules! journal_conformance {
    ($fixture:path) => {
        $crate::journal_conformance!(@cases $fixture;
            gapless_numbering,
            conflict_reports_the_real_highest_seq,
            two_writers_racing_on_one_stream,
            racing_batches_are_atomic,
            refused_batches_write_nothing,
            payloads_round_trip_exactly,
            replay_ranges_and_pages,
            replay_all_walks_pages,
            delete_to_keeps_the_highest_seq,
            snapshots,
            persistence_id_limits,
            every_character_but_nul_is_a_valid_id,
            payloads_over_the_limit_are_refused,
            concurrent_appends_to_many_streams,
            manifests_round_trip,
            entries_are_read_by_tag_in_commit_order,
            refused_appends_leave_no_tags,
            deleted_entries_keep_their_place_in_the_tag,
            slices_split_a_tag_between_readers,
            a_live_reader_sees_concurrent_appends_once,
            notifications_follow_tagged_commits,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = $fixture().await;
                $crate::journal_conformance::$case(fixture.journal.clone()).await;
                drop(fixture);
            }
        )*
    };
}

/// A stream id no other case (or run) uses.
pub fn fresh_id(name: &str) -> PersistenceId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    PersistenceId::new(format!("{name}-{}-{nanos}-{n}", std::process::id())).unwrap()
}

/// The payload of event `seq` written by `writer`: distinct per writer and seq, of varying
/// length (0 to 40 bytes of filler).
pub fn payload(writer: &str, seq: u64) -> Vec<u8> {
    let mut bytes = format!("{writer}:{seq}:").into_bytes();
    bytes.extend((0..seq % 41).map(|i| (i * 7 + seq) as u8));
    bytes
}

fn payloads(writer: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Vec<u8>> {
    seqs.map(|seq| payload(writer, seq)).collect()
}

fn events(writer: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<StoredEvent> {
    seqs.map(|seq| StoredEvent {
        seq,
        payload: payload(writer, seq),
        manifest: Manifest::raw(),
    })
    .collect()
}

async fn all(journal: &dyn Journal, id: &PersistenceId) -> Vec<StoredEvent> {
    journal.replay(id, 0, u64::MAX, usize::MAX).await.unwrap()
}

fn conflict(id: &PersistenceId, first_seq: u64, highest_seq: u64) -> JournalError {
    JournalError::Conflict {
        persistence_id: id.clone(),
        first_seq,
        highest_seq,
    }
}

/// Gives the other futures of a `join` a turn, without a runtime dependency.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn yield_now() -> YieldOnce {
    YieldOnce(false)
}

/// Events are numbered from 1 without gaps; an append must continue the stream exactly.
pub async fn gapless_numbering(journal: Arc<dyn Journal>) {
    let id = fresh_id("gapless");
    assert_eq!(journal.highest_seq(&id).await, Ok(0));
    assert_eq!(
        journal.append(&id, 2, payloads("w", 2..=2)).await,
        Err(conflict(&id, 2, 0)),
        "a new stream starts at 1"
    );
    let mut next = 1;
    for size in [1, 3, 1, 5] {
        let last = next + size - 1;
        journal
            .append(&id, next, payloads("w", next..=last))
            .await
            .unwrap();
        assert_eq!(journal.highest_seq(&id).await, Ok(last));
        next = last + 1;
    }
    assert_eq!(all(&*journal, &id).await, events("w", 1..=10));
    assert_eq!(
        journal.append(&id, 12, payloads("w", 12..=12)).await,
        Err(conflict(&id, 12, 10)),
        "a gap is refused"
    );
    // An empty batch writes nothing and is not fenced, whatever its seq.
    assert_eq!(journal.append(&id, 99, Vec::new()).await, Ok(()));
    assert_eq!(journal.append(&id, 11, Vec::new()).await, Ok(()));
    assert_eq!(journal.highest_seq(&id).await, Ok(10));
    // Invalid seqs are refused before anything else.
    for (first_seq, count) in [(0, 1), (0, 0), (MAX_SEQ, 2), (MAX_SEQ + 1, 1)] {
        let result = journal.append(&id, first_seq, vec![vec![1]; count]).await;
        assert!(
            matches!(&result, Err(JournalError::InvalidArgument { persistence_id: Some(p), .. }) if *p == id),
            "append of {count} at {first_seq}: {result:?}"
        );
    }
    assert_eq!(all(&*journal, &id).await, events("w", 1..=10));
}

/// A refused append reports the stream's actual highest seq.
pub async fn conflict_reports_the_real_highest_seq(journal: Arc<dyn Journal>) {
    let id = fresh_id("conflict");
    journal.append(&id, 1, payloads("a", 1..=3)).await.unwrap();
    assert_eq!(
        journal.append(&id, 2, payloads("b", 2..=4)).await,
        Err(conflict(&id, 2, 3))
    );
    assert_eq!(
        journal.append(&id, 3, payloads("b", 3..=3)).await,
        Err(conflict(&id, 3, 3))
    );
    assert_eq!(
        journal.append(&id, 5, payloads("b", 5..=5)).await,
        Err(conflict(&id, 5, 3))
    );
    journal.delete_to(&id, 3).await.unwrap();
    assert_eq!(
        journal.append(&id, 1, payloads("b", 1..=1)).await,
        Err(conflict(&id, 1, 3)),
        "deletion does not reopen seqs"
    );
    assert_eq!(journal.append(&id, 4, payloads("b", 4..=4)).await, Ok(()));
}

/// Two writers race on one stream, each appending at what it believes is the next seq: every
/// seq is won by exactly one of them, losers learn the real highest seq, nothing is doubled.
pub async fn two_writers_racing_on_one_stream(journal: Arc<dyn Journal>) {
    const TARGET: u64 = 200;
    let id = fresh_id("race");
    let conflicts = AtomicUsize::new(0);
    let writer = |name: &'static str, sizes: &'static [u64]| {
        let (journal, id, conflicts) = (journal.clone(), id.clone(), &conflicts);
        async move {
            let mut won = Vec::new();
            let mut next = journal.highest_seq(&id).await.unwrap() + 1;
            let mut round = 0;
            while next <= TARGET {
                // Vary the interleaving, so that each writer wins some races.
                for _ in 0..1 + round % sizes.len() {
                    yield_now().await;
                }
                let last = next + sizes[round % sizes.len()] - 1;
                round += 1;
                match journal.append(&id, next, payloads(name, next..=last)).await {
                    Ok(()) => {
                        won.push(next..=last);
                        next = last + 1;
                    }
                    Err(JournalError::Conflict {
                        first_seq,
                        highest_seq,
                        ..
                    }) => {
                        assert_eq!(first_seq, next);
                        assert!(highest_seq >= next, "{name}: {highest_seq} < {next}");
                        conflicts.fetch_add(1, Ordering::Relaxed);
                        next = highest_seq + 1;
                    }
                    Err(other) => panic!("{name}: {other}"),
                }
            }
            won
        }
    };
    let (won_a, won_b) = join(writer("a", &[1, 2, 3]), writer("b", &[2, 1])).await;
    assert!(
        conflicts.load(Ordering::Relaxed) > 0,
        "the writers never collided: the test proved nothing"
    );
    let stored = all(&*journal, &id).await;
    let highest = journal.highest_seq(&id).await.unwrap();
    assert!(highest >= TARGET);
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=highest).collect::<Vec<_>>()
    );
    let mut owner = vec![None; highest as usize + 1];
    for (name, won) in [("a", &won_a), ("b", &won_b)] {
        for range in won.iter() {
            for seq in range.clone() {
                assert_eq!(owner[seq as usize], None, "seq {seq} won twice");
                owner[seq as usize] = Some(name);
            }
        }
    }
    for event in &stored {
        let name = owner[event.seq as usize].expect("every stored seq was acknowledged");
        assert_eq!(event.payload, payload(name, event.seq));
    }
}

/// Two writers append a 50-event batch at the same seq concurrently: one batch is stored
/// whole, the other not at all (no interleaving of the two).
pub async fn racing_batches_are_atomic(journal: Arc<dyn Journal>) {
    for round in 0..5 {
        let id = fresh_id("atomic");
        let (a, b) = join(
            journal.append(&id, 1, payloads("a", 1..=50)),
            journal.append(&id, 1, payloads("b", 1..=50)),
        )
        .await;
        let winner = match (&a, &b) {
            (Ok(()), Err(err)) => {
                assert_eq!(*err, conflict(&id, 1, 50));
                "a"
            }
            (Err(err), Ok(())) => {
                assert_eq!(*err, conflict(&id, 1, 50));
                "b"
            }
            other => panic!("round {round}: exactly one must win: {other:?}"),
        };
        assert_eq!(all(&*journal, &id).await, events(winner, 1..=50));
    }
}

/// A batch refused by the fence leaves no trace, not even its first events.
pub async fn refused_batches_write_nothing(journal: Arc<dyn Journal>) {
    let id = fresh_id("refused");
    journal.append(&id, 1, payloads("a", 1..=2)).await.unwrap();
    assert_eq!(
        journal.append(&id, 2, payloads("b", 2..=5)).await,
        Err(conflict(&id, 2, 2))
    );
    assert_eq!(all(&*journal, &id).await, events("a", 1..=2));
    assert_eq!(journal.highest_seq(&id).await, Ok(2));
}

/// Payloads come back byte for byte: empty, every byte value, large.
pub async fn payloads_round_trip_exactly(journal: Arc<dyn Journal>) {
    let id = fresh_id("bytes");
    let every_byte: Vec<u8> = (0..=255).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let written = vec![Vec::new(), vec![0], every_byte, large, Vec::new()];
    journal.append(&id, 1, written.clone()).await.unwrap();
    let read: Vec<Vec<u8>> = all(&*journal, &id)
        .await
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(read, written);
}

/// `replay` returns one ascending page of a range.
pub async fn replay_ranges_and_pages(journal: Arc<dyn Journal>) {
    let id = fresh_id("ranges");
    journal.append(&id, 1, payloads("w", 1..=25)).await.unwrap();
    let replay = |from, to, max| journal.replay(&id, from, to, max);
    assert_eq!(replay(1, 25, 10).await.unwrap(), events("w", 1..=10));
    assert_eq!(replay(11, 25, 10).await.unwrap(), events("w", 11..=20));
    assert_eq!(replay(21, 25, 10).await.unwrap(), events("w", 21..=25));
    assert_eq!(replay(5, 7, 100).await.unwrap(), events("w", 5..=7));
    assert_eq!(replay(7, 7, 1).await.unwrap(), events("w", 7..=7));
    assert_eq!(replay(0, 2, 10).await.unwrap(), events("w", 1..=2));
    assert_eq!(
        replay(20, u64::MAX, 100).await.unwrap(),
        events("w", 20..=25)
    );
    assert_eq!(replay(8, 3, 10).await.unwrap(), Vec::new(), "from > to");
    assert_eq!(replay(26, 100, 10).await.unwrap(), Vec::new());
    assert_eq!(replay(1, 25, 0).await.unwrap(), Vec::new());
    assert_eq!(
        journal
            .replay(&fresh_id("unknown"), 1, 10, 10)
            .await
            .unwrap(),
        Vec::new()
    );
}

/// A journal that counts the pages asked of the one it wraps.
struct CountingPages {
    inner: Arc<dyn Journal>,
    pages: AtomicUsize,
}

impl Journal for CountingPages {
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
        from: u64,
        to: u64,
        max: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.pages.fetch_add(1, Ordering::Relaxed);
        self.inner.replay(id, from, to, max)
    }
    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }
    fn delete_to(&self, id: &PersistenceId, to: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to)
    }
    fn save_snapshot(&self, id: &PersistenceId, s: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, s)
    }
    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.inner.load_snapshot(id)
    }
    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}

/// `replay_all` walks a range in pages of the given size and stops where asked.
pub async fn replay_all_walks_pages(journal: Arc<dyn Journal>) {
    let id = fresh_id("pages");
    journal.append(&id, 1, payloads("w", 1..=30)).await.unwrap();
    journal.delete_to(&id, 2).await.unwrap();
    let counting = CountingPages {
        inner: journal.clone(),
        pages: AtomicUsize::new(0),
    };
    let mut seen = Vec::new();
    let last = replay_all(&counting, &id, 1, 22, 4, |event| {
        seen.push(event);
        Ok::<_, JournalError>(())
    })
    .await
    .unwrap();
    assert_eq!(last, 22);
    assert_eq!(seen, events("w", 3..=22), "starts after the deleted prefix");
    // 3-6, 7-10, 11-14, 15-18, 19-22: the last page is full and reaches `to_seq`, so no
    // sixth (empty) page is asked for.
    assert_eq!(counting.pages.load(Ordering::Relaxed), 5);

    let mut count = 0;
    let result = replay_all(&*journal, &id, 1, u64::MAX, 7, |event| {
        count += 1;
        if event.seq == 12 {
            return Err(JournalError::Closed); // stands for any caller error
        }
        Ok(())
    })
    .await;
    assert_eq!((result, count), (Err(JournalError::Closed), 10));

    let empty = replay_all(&*journal, &fresh_id("none"), 1, u64::MAX, 7, |_| {
        Ok::<_, JournalError>(())
    })
    .await;
    assert_eq!(empty, Ok(0));
    let zero = replay_all(&*journal, &id, 1, 5, 0, |_| Ok::<_, JournalError>(())).await;
    assert!(
        matches!(zero, Err(JournalError::InvalidArgument { .. })),
        "{zero:?}"
    );
}

/// `delete_to` removes a prefix; the highest seq stays, so seqs are never reused.
pub async fn delete_to_keeps_the_highest_seq(journal: Arc<dyn Journal>) {
    let id = fresh_id("delete");
    journal.append(&id, 1, payloads("w", 1..=10)).await.unwrap();
    journal.delete_to(&id, 4).await.unwrap();
    assert_eq!(journal.highest_seq(&id).await, Ok(10));
    assert_eq!(all(&*journal, &id).await, events("w", 5..=10));
    assert_eq!(journal.replay(&id, 1, 3, 10).await.unwrap(), Vec::new());
    assert_eq!(
        journal.replay(&id, 3, 6, 10).await.unwrap(),
        events("w", 5..=6)
    );
    journal.delete_to(&id, 2).await.unwrap();
    assert_eq!(all(&*journal, &id).await, events("w", 5..=10), "no-op");
    journal.delete_to(&id, 0).await.unwrap();
    assert_eq!(all(&*journal, &id).await, events("w", 5..=10), "no-op");

    // Beyond the highest seq: everything goes, the highest stays where it was.
    journal.delete_to(&id, 1_000).await.unwrap();
    assert_eq!(all(&*journal, &id).await, Vec::new());
    assert_eq!(journal.highest_seq(&id).await, Ok(10));
    assert_eq!(
        journal.append(&id, 1, payloads("w", 1..=1)).await,
        Err(conflict(&id, 1, 10))
    );
    journal
        .append(&id, 11, payloads("w", 11..=12))
        .await
        .unwrap();
    assert_eq!(journal.highest_seq(&id).await, Ok(12));
    assert_eq!(all(&*journal, &id).await, events("w", 11..=12));

    let unknown = fresh_id("delete-unknown");
    journal.delete_to(&unknown, u64::MAX).await.unwrap();
    assert_eq!(journal.highest_seq(&unknown).await, Ok(0));
    journal
        .append(&unknown, 1, payloads("w", 1..=1))
        .await
        .unwrap();
}

/// One current snapshot per stream: saved, replaced by newer ones, never by older ones.
pub async fn snapshots(journal: Arc<dyn Journal>) {
    let id = fresh_id("snap");
    let snapshot = |seq, payload: &[u8]| Snapshot::new(seq, payload.to_vec());
    assert_eq!(journal.load_snapshot(&id).await, Ok(None));
    for seq in [0, 1] {
        let result = journal.save_snapshot(&id, snapshot(seq, b"x")).await;
        assert!(
            matches!(&result, Err(JournalError::InvalidArgument { persistence_id: Some(p), .. }) if *p == id),
            "snapshot at {seq} of an empty stream: {result:?}"
        );
    }
    journal.append(&id, 1, payloads("w", 1..=5)).await.unwrap();
    assert!(matches!(
        journal.save_snapshot(&id, snapshot(6, b"x")).await,
        Err(JournalError::InvalidArgument { .. })
    ));
    journal
        .save_snapshot(&id, snapshot(3, b"three"))
        .await
        .unwrap();
    assert_eq!(
        journal.load_snapshot(&id).await,
        Ok(Some(snapshot(3, b"three")))
    );
    journal
        .save_snapshot(&id, snapshot(5, b"five"))
        .await
        .unwrap();
    assert_eq!(
        journal.load_snapshot(&id).await,
        Ok(Some(snapshot(5, b"five")))
    );
    journal
        .save_snapshot(&id, snapshot(4, b"older"))
        .await
        .unwrap();
    assert_eq!(
        journal.load_snapshot(&id).await,
        Ok(Some(snapshot(5, b"five"))),
        "an older snapshot does not replace a newer one"
    );
    journal.save_snapshot(&id, snapshot(5, b"")).await.unwrap();
    assert_eq!(
        journal.load_snapshot(&id).await,
        Ok(Some(snapshot(5, b""))),
        "the same seq replaces"
    );
    journal.delete_to(&id, 5).await.unwrap();
    assert_eq!(journal.load_snapshot(&id).await, Ok(Some(snapshot(5, b""))));
    assert_eq!(
        journal.load_snapshot(&fresh_id("snap-other")).await,
        Ok(None)
    );
}

/// Ids are 1 to 256 bytes (bytes, not characters), and a 256-byte id works end to end.
pub async fn persistence_id_limits(journal: Arc<dyn Journal>) {
    let too_long = |len| PersistenceIdError::Length { len, max: 256 };
    assert_eq!(PersistenceId::new(""), Err(too_long(0)));
    assert_eq!(PersistenceId::new("x".repeat(257)), Err(too_long(257)));
    assert_eq!(PersistenceId::new("é".repeat(129)), Err(too_long(258)));
    let prefix = fresh_id("id").to_string();
    for filler in ["x", "é"] {
        let mut name = prefix.clone();
        while name.len() + filler.len() <= 256 {
            name.push_str(filler);
        }
        while name.len() < 256 {
            name.push('x');
        }
        assert_eq!(name.len(), 256);
        let id = PersistenceId::new(name.clone()).unwrap();
        journal.append(&id, 1, payloads("w", 1..=2)).await.unwrap();
        assert_eq!(journal.highest_seq(&id).await, Ok(2));
        assert_eq!(all(&*journal, &id).await, events("w", 1..=2));
        // Ids differing only in their last byte are different streams.
        let mut sibling = name;
        sibling.pop();
        sibling.push('y');
        let sibling = PersistenceId::new(sibling).unwrap();
        assert_eq!(journal.highest_seq(&sibling).await, Ok(0));
    }
}

/// An id may hold any character but NUL (which PostgreSQL's `TEXT` cannot store, so it is
/// refused for every journal alike): control characters, quotes, backslashes, SQL wildcards
/// and multibyte characters are each a stream of their own, stored and found again.
pub async fn every_character_but_nul_is_a_valid_id(journal: Arc<dyn Journal>) {
    assert_eq!(
        PersistenceId::new("a\0b"),
        Err(PersistenceIdError::Nul { position: 1 })
    );
    let prefix = fresh_id("chars").to_string();
    let odd: String = (1u8..0x20)
        .map(char::from)
        .chain("\u{7f}'\"\\%_*?;é€😀\u{fffd}".chars())
        .collect();
    let ids: Vec<_> = [
        format!("{prefix}{odd}"),
        format!("{prefix}%"),
        format!("{prefix}_"),
    ]
    .into_iter()
    .map(|name| PersistenceId::new(name).unwrap())
    .collect();
    for (n, id) in ids.iter().enumerate() {
        let n = n as u64 + 1;
        journal.append(id, 1, payloads("w", 1..=n)).await.unwrap();
        journal
            .save_snapshot(id, Snapshot::new(n, vec![n as u8]))
            .await
            .unwrap();
    }
    for (n, id) in ids.iter().enumerate() {
        let n = n as u64 + 1;
        assert_eq!(journal.highest_seq(id).await, Ok(n), "{id:?}");
        assert_eq!(all(&*journal, id).await, events("w", 1..=n), "{id:?}");
        assert_eq!(
            journal.load_snapshot(id).await,
            Ok(Some(Snapshot::new(n, vec![n as u8])))
        );
    }
}

/// An event or a snapshot larger than [`Journal::max_payload`] is refused as an invalid
/// argument and nothing of its append is written; the limit is the crate's for every journal.
pub async fn payloads_over_the_limit_are_refused(journal: Arc<dyn Journal>) {
    let max = journal.max_payload();
    assert_eq!(max, actix_delivery::journal::MAX_PAYLOAD_BYTES);
    let id = fresh_id("too-large");
    let invalid = |result: Result<(), JournalError>, what: &str| {
        assert!(
            matches!(&result, Err(JournalError::InvalidArgument { persistence_id: Some(p), reason })
                if *p == id && reason.contains(&format!("limit of {max} bytes"))),
            "{what}: {result:?}"
        );
    };
    // Zeroed memory the allocator maps lazily: nothing of the 512 MiB is written.
    let result = journal
        .append(&id, 1, vec![vec![1], vec![0; max + 1]])
        .await;
    invalid(result, "an append with one event over the limit");
    assert_eq!(journal.highest_seq(&id).await, Ok(0), "nothing written");
    journal.append(&id, 1, payloads("w", 1..=1)).await.unwrap();
    let snapshot = Snapshot::new(1, vec![0; max + 1]);
    invalid(
        journal.save_snapshot(&id, snapshot).await,
        "a snapshot over the limit",
    );
    assert_eq!(journal.load_snapshot(&id).await, Ok(None));
    assert_eq!(all(&*journal, &id).await, events("w", 1..=1));
}

/// 64 streams appended to concurrently, 20 appends each: all present, each gapless.
pub async fn concurrent_appends_to_many_streams(journal: Arc<dyn Journal>) {
    const STREAMS: usize = 64;
    const APPENDS: u64 = 20;
    let ids: Vec<_> = (0..STREAMS)
        .map(|i| fresh_id(&format!("many{i}")))
        .collect();
    let writers = ids.iter().enumerate().map(|(i, id)| {
        let journal = journal.clone();
        async move {
            let mut next = 1;
            for round in 0..APPENDS {
                let size = 1 + (i as u64 + round) % 3;
                let last = next + size - 1;
                journal
                    .append(id, next, payloads("w", next..=last))
                    .await
                    .unwrap();
                next = last + 1;
            }
            next - 1
        }
    });
    let highest = join_all(writers).await;
    for (i, id) in ids.iter().enumerate() {
        let expected: u64 = (0..APPENDS).map(|round| 1 + (i as u64 + round) % 3).sum();
        assert_eq!(highest[i], expected);
        assert_eq!(journal.highest_seq(id).await, Ok(expected));
        assert_eq!(all(&*journal, id).await, events("w", 1..=expected));
    }
}

/// Each event and snapshot comes back with the manifest it was written with: codec, name and
/// version as given (a codec id this crate does not know included), raw for a plain append.
pub async fn manifests_round_trip(journal: Arc<dyn Journal>) {
    use actix_delivery::codec::Codec;
    let id = fresh_id("manifests");
    let first = Manifest::new(Codec::MessagePack, "app::OrderEvent", 3);
    let unknown = Manifest::from_stored(200, "from a newer crate", u32::MAX);
    journal
        .append_as(&id, 1, vec![b"a".to_vec(), b"b".to_vec()], first.clone())
        .await
        .unwrap();
    journal
        .append_as(&id, 3, vec![b"c".to_vec()], unknown.clone())
        .await
        .unwrap();
    journal.append(&id, 4, vec![b"d".to_vec()]).await.unwrap();
    let manifests: Vec<Manifest> = journal
        .replay(&id, 1, 4, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.manifest)
        .collect();
    assert_eq!(manifests, [first.clone(), first, unknown, Manifest::raw()]);
    let snapshot = Snapshot {
        seq: 4,
        payload: b"state".to_vec(),
        manifest: Manifest::new(Codec::Bincode, "app::State", 2),
    };
    journal.save_snapshot(&id, snapshot.clone()).await.unwrap();
    assert_eq!(journal.load_snapshot(&id).await.unwrap(), Some(snapshot));
}
