//! `Journal::offset_ceiling`: every committed tagged entry's offset is at or below it, so an
//! offset above it (stored by a projection of another, reset or restored journal) is told
//! apart; and the PostgreSQL journal's refusal to open tag rows of transaction ids its server
//! has not reached (a logical restore into another cluster), with the re-numbering that
//! lifts it. The PostgreSQL cases (feature `postgres`) need a server: `ACTIX_DELIVERY_POSTGRES`,
//! see `tests/postgres_support`; each uses a schema of its own.

use actix_delivery::codec::Manifest;
use actix_delivery::journal::{
    Journal, MemoryJournal, Offset, PersistenceId, SqliteJournal, Tag, TagQuery,
};

fn id(name: &str) -> PersistenceId {
    PersistenceId::new(name).unwrap()
}

fn tag(name: &str) -> Tag {
    Tag::new(name).unwrap()
}

/// Appends `count` entries to `stream` from `first`, each filed under `tags`.
async fn append(
    journal: &dyn Journal,
    stream: &PersistenceId,
    first: u64,
    count: u64,
    tags: &[Tag],
) {
    let payloads = (first..first + count)
        .map(|seq| format!("{stream}:{seq}").into_bytes())
        .collect();
    let tags = (0..count).map(|_| tags.to_vec()).collect();
    journal
        .append_tagged(stream, first, payloads, Manifest::raw(), tags)
        .await
        .unwrap();
}

/// The offsets of every entry of `tag`.
async fn offsets(journal: &dyn Journal, tag: &Tag) -> Vec<Offset> {
    let events = journal
        .events_by_tag(&TagQuery::new(tag.clone()), Offset::START, 1000)
        .await
        .unwrap();
    events.iter().map(|event| event.offset).collect()
}

/// For the journals whose offsets are `0:n`, numbered across all tags: the ceiling is the
/// offset of the last tagged entry committed, in any tag (not the last of one tag), so an
/// offset above it is one the journal never gave; untagged appends leave it alone; the next
/// tagged entry comes above it.
async fn ceiling_is_the_last_offset_in_any_tag(journal: &dyn Journal) {
    assert_eq!(journal.offset_ceiling().await.unwrap(), Offset::START);
    let (red, blue) = (tag("red"), tag("blue"));
    let (a, b) = (id("a"), id("b"));
    append(journal, &a, 1, 3, std::slice::from_ref(&red)).await;
    append(journal, &b, 1, 2, &[red.clone(), blue.clone()]).await;
    append(journal, &a, 4, 1, std::slice::from_ref(&red)).await;
    journal
        .append(&b, 3, vec![b"untagged".to_vec()])
        .await
        .unwrap();

    let ceiling = journal.offset_ceiling().await.unwrap();
    let (reds, blues) = (offsets(journal, &red).await, offsets(journal, &blue).await);
    assert_eq!((reds.len(), blues.len()), (6, 2));
    let all: Vec<Offset> = reds.iter().chain(&blues).copied().collect();
    assert!(
        all.iter().all(|offset| *offset <= ceiling),
        "{all:?} vs {ceiling}"
    );
    // Tight: the last entry committed (red's, after blue's last) is at the ceiling itself.
    assert_eq!(Some(&ceiling), all.iter().max());
    assert!(
        *blues.iter().max().unwrap() < ceiling,
        "the ceiling spans all tags"
    );
    assert_eq!(
        ceiling,
        Offset::from_parts(0, 8),
        "8 tag rows, numbered 1 to 8"
    );

    append(journal, &b, 4, 1, std::slice::from_ref(&blue)).await;
    let newest = *offsets(journal, &blue).await.last().unwrap();
    assert!(newest > ceiling, "{newest} after the old ceiling {ceiling}");
    assert_eq!(journal.offset_ceiling().await.unwrap(), newest);
}

#[tokio::test]
async fn memory_ceiling_is_the_last_offset_in_any_tag() {
    ceiling_is_the_last_offset_in_any_tag(&MemoryJournal::new()).await;
}

/// A projection paired with a new (reset) journal: its stored offset is above the new
/// journal's ceiling.
#[tokio::test]
async fn memory_offsets_of_a_previous_journal_are_above_a_new_ones_ceiling() {
    let old = MemoryJournal::new();
    append(&old, &id("s"), 1, 5, &[tag("t")]).await;
    let stored = *offsets(&old, &tag("t")).await.last().unwrap();
    let new = MemoryJournal::new();
    append(&new, &id("s"), 1, 2, &[tag("t")]).await;
    let ceiling = new.offset_ceiling().await.unwrap();
    assert!(stored > ceiling, "{stored} vs {ceiling}");
    // Held commits count once they are committed, not before.
    new.faults().hold_commits();
    let held = new.append_tagged(
        &id("s"),
        3,
        vec![b"x".to_vec()],
        Manifest::raw(),
        vec![vec![tag("t")]],
    );
    let mut held = Box::pin(held);
    assert!(futures_util::FutureExt::now_or_never(&mut held).is_none());
    assert_eq!(new.offset_ceiling().await.unwrap(), ceiling);
    new.faults().release();
    held.await.unwrap();
    assert_eq!(
        new.offset_ceiling().await.unwrap(),
        Offset::from_parts(0, 3)
    );
}

#[tokio::test]
async fn sqlite_ceiling_is_the_last_offset_in_any_tag() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("journal.db"))
        .await
        .unwrap();
    ceiling_is_the_last_offset_in_any_tag(&journal).await;
}

/// The ceiling survives a reopen (it is the file's, not the process's), and a journal on a
/// new file has a lower one than offsets read from the old file.
#[tokio::test]
async fn sqlite_ceiling_survives_reopen_and_a_new_file_starts_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = SqliteJournal::open(&path).await.unwrap();
    append(&journal, &id("s"), 1, 4, &[tag("t"), tag("u")]).await;
    let ceiling = journal.offset_ceiling().await.unwrap();
    assert_eq!(ceiling, Offset::from_parts(0, 8));
    journal.close().await;

    let reopened = SqliteJournal::open(&path).await.unwrap();
    assert_eq!(reopened.offset_ceiling().await.unwrap(), ceiling);
    append(&reopened, &id("s"), 5, 1, &[tag("t")]).await;
    assert_eq!(
        reopened.offset_ceiling().await.unwrap(),
        Offset::from_parts(0, 9)
    );

    let other = SqliteJournal::open(dir.path().join("other.db"))
        .await
        .unwrap();
    append(&other, &id("s"), 1, 2, &[tag("t")]).await;
    let stored = *offsets(&reopened, &tag("t")).await.last().unwrap();
    let other_ceiling = other.offset_ceiling().await.unwrap();
    assert!(stored > other_ceiling, "{stored} vs {other_ceiling}");
}

#[cfg(feature = "postgres")]
use crate::postgres_support;

#[cfg(feature = "postgres")]
mod postgres {
    use super::postgres_support::{admin, unique, url};
    use super::{append, id, tag, Offset};
    use actix_delivery::journal::{
        Journal, JournalError, PersistenceId, PostgresJournal, PostgresOptions,
    };
    use tokio_postgres::Client;

    /// A schema of the case's own, dropped when the case ends well.
    struct Schema {
        name: String,
        admin: Client,
    }

    impl Schema {
        async fn new(prefix: &str) -> Self {
            Self {
                name: unique(prefix),
                admin: admin().await,
            }
        }

        async fn connect(&self) -> Result<PostgresJournal, JournalError> {
            let options = PostgresOptions::builder()
                .schema(&self.name)
                .build()
                .unwrap();
            PostgresJournal::connect_with(&url(), options).await
        }

        /// `(txid, ordering)` of every tag row: every committed entry's offset.
        async fn committed(&self) -> Vec<Offset> {
            let rows = self
                .admin
                .query(
                    &format!(
                        "SELECT txid::text::int8, ordering FROM \"{}\".event_tag",
                        self.name
                    ),
                    &[],
                )
                .await
                .unwrap();
            rows.iter()
                .map(|row| {
                    let (txid, ordering): (i64, i64) = (row.get(0), row.get(1));
                    Offset::from_parts(txid as u64, ordering as u64)
                })
                .collect()
        }

        /// `(stream, seq)` of `tag`'s rows in offset order.
        async fn in_offset_order(&self, tag: &str) -> Vec<(String, i64)> {
            let rows = self
                .admin
                .query(
                    &format!(
                        "SELECT persistence_id, seq_nr FROM \"{}\".event_tag WHERE tag = $1 \
                         ORDER BY txid, ordering",
                        self.name
                    ),
                    &[&tag],
                )
                .await
                .unwrap();
            rows.iter().map(|row| (row.get(0), row.get(1))).collect()
        }

        /// A transaction id the server assigns now.
        async fn new_transaction_id(&self) -> u64 {
            let row = self
                .admin
                .query_one("SELECT pg_current_xact_id()::text::int8", &[])
                .await
                .unwrap();
            row.get::<_, i64>(0) as u64
        }

        async fn drop(self) {
            self.admin
                .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", self.name))
                .await
                .unwrap();
        }
    }

    fn stream(name: &str) -> PersistenceId {
        id(&unique(name))
    }

    /// The ceiling is the highest offset of the journal's own entries (read from the table,
    /// not through the journal's horizon), across its tags: [`Offset::START`] while it has
    /// none, and no activity elsewhere on the server (another journal's appends, any other
    /// transaction) raises it, where the server's next transaction id goes up with all of it.
    #[tokio::test]
    async fn postgres_ceiling_is_the_highest_offset_of_its_own_entries_not_the_servers() {
        let schema = Schema::new("jceil").await;
        let journal = schema.connect().await.unwrap();
        assert_eq!(journal.offset_ceiling().await.unwrap(), Offset::START);
        let (a, b, c) = (stream("a"), stream("b"), stream("c"));
        // Concurrent appends: several entries per transaction of the group commit, and
        // several transactions.
        futures_util::future::join3(
            append(&journal, &a, 1, 3, &[tag("red")]),
            append(&journal, &b, 1, 2, &[tag("red"), tag("blue")]),
            append(&journal, &c, 1, 1, &[tag("blue")]),
        )
        .await;
        append(&journal, &a, 4, 2, &[tag("blue")]).await;

        let ceiling = journal.offset_ceiling().await.unwrap();
        let committed = schema.committed().await;
        assert_eq!(committed.len(), 3 + 4 + 1 + 2);
        assert_eq!(
            Some(&ceiling),
            committed.iter().max(),
            "tight: its newest entry"
        );
        // Reading after it finds nothing committed so far.
        let after = journal
            .events_by_tag(
                &actix_delivery::journal::TagQuery::new(tag("red")),
                ceiling,
                10,
            )
            .await
            .unwrap();
        assert!(after.is_empty());

        // Another journal on the server, and transactions of no journal at all.
        let other = Schema::new("jceil_other").await;
        let elsewhere = other.connect().await.unwrap();
        append(&elsewhere, &stream("d"), 1, 3, &[tag("red")]).await;
        let next = schema.new_transaction_id().await;
        assert!(Offset::from_parts(next, 0) > ceiling);
        assert_eq!(journal.offset_ceiling().await.unwrap(), ceiling);

        append(&journal, &c, 2, 1, &[tag("green")]).await;
        let newest = journal.offset_ceiling().await.unwrap();
        assert!(
            newest > Offset::from_parts(next, 0),
            "{newest} vs transaction {next}"
        );
        assert_eq!(Some(&newest), schema.committed().await.iter().max());
        journal.close().await;
        elsewhere.close().await;
        schema.drop().await;
        other.drop().await;
    }

    /// A tag row of a transaction id the server has not reached (as after a logical restore
    /// into another cluster) makes the journal refuse to open, saying why and what to do;
    /// after `RENUMBER_TAGS_SQL` it opens, the old entries keep each stream's order, and a new
    /// entry sorts after all of them.
    #[tokio::test]
    async fn postgres_refuses_tag_rows_of_transactions_the_server_has_not_run() {
        let schema = Schema::new("jceil_restore").await;
        let journal = schema.connect().await.unwrap();
        let (a, b) = (stream("a"), stream("b"));
        let red = tag("red");
        append(&journal, &a, 1, 2, std::slice::from_ref(&red)).await;
        append(&journal, &b, 1, 1, std::slice::from_ref(&red)).await;
        append(&journal, &a, 3, 1, std::slice::from_ref(&red)).await;
        journal.close().await;
        // Opening is fine while every row is of a transaction the server ran.
        schema.connect().await.unwrap().close().await;

        // One row "from another cluster": a transaction id a million ahead.
        let updated = schema
            .admin
            .execute(
                &format!(
                    "UPDATE \"{}\".event_tag SET txid = \
                     (pg_current_xact_id()::text::int8 + 1000000)::text::xid8 \
                     WHERE persistence_id = $1 AND seq_nr = 2",
                    schema.name
                ),
                &[&a.as_str()],
            )
            .await
            .unwrap();
        assert_eq!(updated, 1);
        let refused = schema.connect().await;
        match &refused {
            Err(JournalError::Schema { found, expected }) => {
                let message = refused.as_ref().unwrap_err().to_string();
                for part in [
                    "has not reached that transaction id",
                    "logical dump",
                    "sort before those rows",
                    "would miss them",
                ] {
                    assert!(found.contains(part), "{part:?} not in {message}");
                }
                for part in ["pg_basebackup", "pg_upgrade", "RENUMBER_TAGS_SQL"] {
                    assert!(expected.contains(part), "{part:?} not in {message}");
                }
                assert!(message.contains(&schema.name), "{message}");
            }
            other => panic!("expected a refusal, got {:?}", other.as_ref().map(|_| ())),
        }

        // Re-numbered, it opens; each stream's entries keep their order, new ones come last.
        let before = schema.in_offset_order(red.as_str()).await;
        schema
            .admin
            .batch_execute(&format!(
                "BEGIN; SET LOCAL search_path TO \"{}\"; {} COMMIT;",
                schema.name,
                PostgresJournal::RENUMBER_TAGS_SQL
            ))
            .await
            .unwrap();
        let journal = schema.connect().await.unwrap();
        append(&journal, &b, 2, 1, std::slice::from_ref(&red)).await;
        let after = schema.in_offset_order(red.as_str()).await;
        assert_eq!(after.len(), 5);
        assert_eq!(after.last(), Some(&(b.as_str().to_owned(), 2)));
        let of = |rows: &[(String, i64)], s: &PersistenceId| -> Vec<i64> {
            rows.iter()
                .filter(|(p, _)| p == s.as_str())
                .map(|(_, seq)| *seq)
                .collect()
        };
        assert_eq!(of(&after, &a), vec![1, 2, 3]);
        assert_eq!(of(&after, &b), vec![1, 2]);
        // What the restore did before: a's seq 2 sorted after everything.
        assert_eq!(of(&before, &a), vec![1, 3, 2]);
        let ceiling = journal.offset_ceiling().await.unwrap();
        for offset in schema.committed().await {
            assert!(offset <= ceiling, "{offset} above {ceiling}");
        }
        journal.close().await;
        schema.drop().await;
    }
}
