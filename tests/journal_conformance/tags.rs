//! The conformance cases of tags: reading by tag, offsets, slices, deletion, notifications.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::journal::{
    slice_of, Journal, JournalError, Offset, PersistenceId, Slices, StoredEvent, Tag, TagQuery,
    TaggedEvent,
};
use futures_util::future::join_all;

use super::{fresh_id, payload};

/// A tag no other case (or run) uses.
pub fn fresh_tag(name: &str) -> Tag {
    Tag::new(fresh_id(name).as_str()).unwrap()
}

/// Every entry of `query` after `after`, read in pages of `page`.
pub async fn read_all(
    journal: &dyn Journal,
    query: &TagQuery,
    mut after: Offset,
    page: usize,
) -> Vec<TaggedEvent> {
    let mut all = Vec::new();
    loop {
        let events = journal.events_by_tag(query, after, page).await.unwrap();
        assert!(events.len() <= page, "a page of at most {page}");
        let Some(last) = events.last() else {
            return all;
        };
        after = last.offset;
        all.extend(events);
    }
}

/// Every entry of `query` after `after` once `count` of them are readable (and not more): a
/// journal may show a committed entry a little later (PostgreSQL: once every transaction on
/// the server that began before it has ended), never out of order.
pub async fn read_settled(
    journal: &dyn Journal,
    query: &TagQuery,
    after: Offset,
    page: usize,
    count: usize,
) -> Vec<TaggedEvent> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let all = read_all(journal, query, after, page).await;
        assert!(
            all.len() <= count,
            "{} entries, {count} expected",
            all.len()
        );
        if all.len() == count {
            return all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {count} entries readable after 30 s",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn keys(events: &[TaggedEvent]) -> Vec<(PersistenceId, u64)> {
    events
        .iter()
        .map(|event| (event.persistence_id.clone(), event.seq))
        .collect()
}

fn assert_ascending(events: &[TaggedEvent], what: &str) {
    for pair in events.windows(2) {
        assert!(
            pair[0].offset < pair[1].offset,
            "{what}: offset {} then {}",
            pair[0].offset,
            pair[1].offset
        );
    }
}

/// Tagged entries come back by tag in commit order, with their payload and manifest, and an
/// offset that goes on exactly where the last page ended; untagged entries and other tags do
/// not; pages of one and of many give the same.
pub async fn entries_are_read_by_tag_in_commit_order(journal: Arc<dyn Journal>) {
    let (a, b) = (fresh_id("tag-a"), fresh_id("tag-b"));
    let (red, blue) = (fresh_tag("red"), fresh_tag("blue"));
    let manifest = Manifest::new(Codec::MessagePack, "Event", 2);
    let append = |id: &PersistenceId, first: u64, tags: Vec<Vec<Tag>>| {
        let (journal, id, manifest) = (journal.clone(), id.clone(), manifest.clone());
        async move {
            let payloads = (first..first + tags.len() as u64)
                .map(|seq| payload(id.as_str(), seq))
                .collect();
            journal
                .append_tagged(&id, first, payloads, manifest, tags)
                .await
                .unwrap();
        }
    };
    append(
        &a,
        1,
        vec![vec![red.clone()], vec![], vec![blue.clone(), red.clone()]],
    )
    .await;
    append(&b, 1, vec![vec![red.clone(), red.clone()]]).await;
    journal.append(&a, 4, vec![payload("a", 4)]).await.unwrap();
    append(&b, 2, vec![vec![blue.clone()], vec![red.clone()]]).await;

    let query = TagQuery::new(red.clone());
    let reds = read_settled(&*journal, &query, Offset::START, 100, 4).await;
    let expected = vec![
        (a.clone(), 1),
        (a.clone(), 3),
        (b.clone(), 1),
        (b.clone(), 3),
    ];
    assert_eq!(
        keys(&reds),
        expected,
        "commit order; a tag twice counts once"
    );
    assert_ascending(&reds, "red");
    for event in &reds {
        assert_eq!(
            event.event,
            Some(StoredEvent {
                seq: event.seq,
                payload: payload(event.persistence_id.as_str(), event.seq),
                manifest: manifest.clone(),
            })
        );
        assert!(event.written_at > std::time::UNIX_EPOCH);
    }
    assert_eq!(read_all(&*journal, &query, Offset::START, 1).await, reds);
    assert_eq!(
        read_all(&*journal, &query, reds[1].offset, 3).await,
        reds[2..],
        "after an offset: exactly the entries after it"
    );
    assert!(journal
        .events_by_tag(&query, reds[3].offset, 10)
        .await
        .unwrap()
        .is_empty());
    let blues = read_settled(&*journal, &TagQuery::new(blue), Offset::START, 100, 2).await;
    assert_eq!(keys(&blues), vec![(a.clone(), 3), (b.clone(), 2)]);
    assert!(read_all(
        &*journal,
        &TagQuery::new(fresh_tag("none")),
        Offset::START,
        9
    )
    .await
    .is_empty());
    let zero = journal.events_by_tag(&query, Offset::START, 0).await;
    assert!(
        matches!(zero, Err(JournalError::InvalidArgument { .. })),
        "{zero:?}"
    );
}

/// Tags are one list per entry or none; a refused append (a conflict, or tags that do not
/// fit) leaves no tag behind.
pub async fn refused_appends_leave_no_tags(journal: Arc<dyn Journal>) {
    let id = fresh_id("tag-refused");
    let tag = fresh_tag("refused");
    let query = TagQuery::new(tag.clone());
    let mismatched = journal
        .append_tagged(
            &id,
            1,
            vec![vec![1], vec![2]],
            Manifest::raw(),
            vec![vec![tag.clone()]],
        )
        .await;
    assert!(
        matches!(&mismatched, Err(JournalError::InvalidArgument { .. })),
        "{mismatched:?}"
    );
    journal.append(&id, 1, vec![vec![1]]).await.unwrap();
    let conflict = journal
        .append_tagged(
            &id,
            1,
            vec![vec![9]],
            Manifest::raw(),
            vec![vec![tag.clone()]],
        )
        .await;
    assert!(
        matches!(conflict, Err(JournalError::Conflict { .. })),
        "{conflict:?}"
    );
    assert_eq!(journal.highest_seq(&id).await, Ok(1));
    // A tagged entry appended after them: once it is readable, so would be their tags.
    journal
        .append_tagged(
            &id,
            2,
            vec![vec![2]],
            Manifest::raw(),
            vec![vec![tag.clone()]],
        )
        .await
        .unwrap();
    let tagged = read_settled(&*journal, &query, Offset::START, 10, 1).await;
    assert_eq!(keys(&tagged), [(id, 2)], "only the later entry");
}

/// Deleting events keeps their place in the tag: a reader gets their offset, stream and seq
/// without the event, and the entries after them as before.
pub async fn deleted_entries_keep_their_place_in_the_tag(journal: Arc<dyn Journal>) {
    let id = fresh_id("tag-deleted");
    let tag = fresh_tag("deleted");
    let payloads: Vec<Vec<u8>> = (1..=4).map(|seq| payload("d", seq)).collect();
    journal
        .append_tagged(
            &id,
            1,
            payloads,
            Manifest::raw(),
            vec![vec![tag.clone()]; 4],
        )
        .await
        .unwrap();
    let query = TagQuery::new(tag);
    let before = read_settled(&*journal, &query, Offset::START, 10, 4).await;
    journal.delete_to(&id, 2).await.unwrap();
    let after = read_all(&*journal, &query, Offset::START, 10).await;
    assert_eq!(keys(&after), keys(&before));
    assert_eq!(
        after.iter().map(|e| e.offset).collect::<Vec<_>>(),
        before.iter().map(|e| e.offset).collect::<Vec<_>>(),
        "the offsets stay"
    );
    assert_eq!(
        after.iter().map(|e| e.event.is_some()).collect::<Vec<_>>(),
        [false, false, true, true]
    );
    assert_eq!(after[2..], before[2..]);
}

/// Slices split a tag between readers: each entry is in the slices of its stream, and the
/// readers of `Slices::split(n, _)` see every entry exactly once between them.
pub async fn slices_split_a_tag_between_readers(journal: Arc<dyn Journal>) {
    let tag = fresh_tag("sliced");
    let ids: Vec<PersistenceId> = (0..24).map(|n| fresh_id(&format!("slice-{n}"))).collect();
    for id in &ids {
        journal
            .append_tagged(
                id,
                1,
                vec![payload("s", 1)],
                Manifest::raw(),
                vec![vec![tag.clone()]],
            )
            .await
            .unwrap();
    }
    let all = TagQuery::new(tag.clone());
    read_settled(&*journal, &all, Offset::START, 100, ids.len()).await;
    let mut seen = BTreeSet::new();
    for part in 0..3 {
        let slices = Slices::split(3, part).unwrap();
        let query = TagQuery::new(tag.clone()).slices(slices);
        let mine = read_all(&*journal, &query, Offset::START, 5).await;
        assert_ascending(&mine, "a slice");
        for event in mine {
            assert!(slices.contains(&event.persistence_id));
            assert!(seen.insert(event.persistence_id), "one reader per stream");
        }
    }
    assert_eq!(seen.len(), ids.len(), "every stream in some slice");
    let one = slice_of(&ids[0]);
    let query = TagQuery::new(tag).slices(Slices::new(one, one).unwrap());
    assert!(
        keys(&read_all(&*journal, &query, Offset::START, 100).await).contains(&(ids[0].clone(), 1))
    );
}

/// Many streams appending tagged entries at once while a reader follows the tag live: the
/// reader sees each entry exactly once, in ascending offsets, and the same as a reader that
/// comes afterwards.
pub async fn a_live_reader_sees_concurrent_appends_once(journal: Arc<dyn Journal>) {
    const STREAMS: u64 = 16;
    const ENTRIES: u64 = 20;
    let tag = fresh_tag("live");
    let query = TagQuery::new(tag.clone());
    let writers = join_all((0..STREAMS).map(|n| {
        let (journal, tag) = (journal.clone(), tag.clone());
        async move {
            let id = fresh_id(&format!("live-{n}"));
            for seq in 1..=ENTRIES {
                let tags = vec![if seq % 3 == 0 {
                    vec![]
                } else {
                    vec![tag.clone()]
                }];
                journal
                    .append_tagged(&id, seq, vec![payload("l", seq)], Manifest::raw(), tags)
                    .await
                    .unwrap();
            }
        }
    }));
    let expected = (STREAMS * (ENTRIES - ENTRIES / 3)) as usize;
    let reader = async {
        let (mut after, mut seen) = (Offset::START, Vec::new());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while seen.len() < expected && std::time::Instant::now() < deadline {
            let page = journal.events_by_tag(&query, after, 7).await.unwrap();
            if let Some(last) = page.last() {
                after = last.offset;
            }
            seen.extend(page);
            tokio::task::yield_now().await;
        }
        seen
    };
    let (_, live) = futures_util::future::join(writers, reader).await;
    assert_ascending(&live, "live");
    let unique: BTreeSet<_> = keys(&live).into_iter().collect();
    assert_eq!(unique.len(), live.len(), "no entry twice");
    assert_eq!(live.len(), expected, "every entry");
    assert_eq!(read_all(&*journal, &query, Offset::START, 50).await, live);
}

/// A journal that has notifications signals a commit of tagged entries (and a reader woken by
/// it finds them).
pub async fn notifications_follow_tagged_commits(journal: Arc<dyn Journal>) {
    let Some(mut notifications) = journal.tag_notifications() else {
        return;
    };
    let tag = fresh_tag("notified");
    let id = fresh_id("notified");
    let append = journal.append_tagged(
        &id,
        1,
        vec![vec![1]],
        Manifest::raw(),
        vec![vec![tag.clone()]],
    );
    let (appended, ()) = futures_util::future::join(append, async {
        tokio::time::timeout(Duration::from_secs(10), notifications.changed())
            .await
            .expect("a notification within 10 s");
    })
    .await;
    appended.unwrap();
    read_settled(&*journal, &TagQuery::new(tag), Offset::START, 10, 1).await;
}
