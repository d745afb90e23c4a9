//! Reading by tag: offsets, the query, what it returns, and the signal that new tagged
//! entries were committed.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::journal::error::JournalError;
use crate::journal::event::StoredEvent;
use crate::journal::id::PersistenceId;
use crate::journal::tag::{Slices, Tag};

/// A position in the entries of a tag: `Journal::events_by_tag`
/// returns the entries after one, and each entry carries its own. Totally ordered; offsets of
/// one journal compare, offsets of different journals mean nothing to each other.
///
/// Two numbers: the committing transaction's position (PostgreSQL: its transaction id; 0 for
/// SQLite and memory journals, whose commits are numbered by the second) and the entry's
/// position after it. A projection stores its offset as these two numbers; whether a stored
/// one can have come from a journal at all, `Journal::offset_ceiling` tells.
///
/// # It never skips
///
/// A reader asks for the entries of a tag *after* an [`Offset`] and gets them in offset order.
/// The offset is total, and an entry becomes visible only once no entry with a lower offset can
/// still appear: so a reader that goes on from the last offset it handled never misses one,
/// and never sees one twice. How each journal keeps that promise:
///
/// - **SQLite** and **memory**: one writer commits one transaction at a time and numbers the
///   tagged entries in commit order; a reader sees a prefix of that numbering.
/// - **PostgreSQL**, where several processes commit at once: a number taken from a sequence is
///   *not* enough. Transaction A takes 7, transaction B takes 8 and commits first; a reader
///   that sees 8 and goes on from "> 8" never sees 7 once A commits. So the offset is the
///   writing transaction's id (`pg_current_xact_id()`, `xid8`) and then a per-row number, and a
///   query returns only rows whose transaction id is below `pg_snapshot_xmin` of its own
///   snapshot: every transaction below that horizon has ended, and every transaction that has
///   not yet committed has a higher id, so whatever commits later sorts after all that was
///   returned. The cost: a transaction that stays open (any transaction that wrote, on any
///   database of the server) holds the live tail back until it ends; nothing is lost, the
///   tail waits.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Offset {
    transaction: u64,
    position: u64,
}

impl Offset {
    /// Before the first entry: reading after it starts at the beginning.
    pub const START: Self = Self {
        transaction: 0,
        position: 0,
    };

    /// The offset of these two numbers (as [`parts`](Self::parts) gave them).
    pub const fn from_parts(transaction: u64, position: u64) -> Self {
        Self {
            transaction,
            position,
        }
    }

    /// The two numbers: the transaction's, then the entry's.
    pub const fn parts(&self) -> (u64, u64) {
        (self.transaction, self.position)
    }

    /// The two numbers as SQL `BIGINT`s, if both fit.
    pub fn to_bigints(self) -> Option<(i64, i64)> {
        Some((
            i64::try_from(self.transaction).ok()?,
            i64::try_from(self.position).ok()?,
        ))
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.transaction, self.position)
    }
}

/// What to read: the entries of `tag` in the streams of `slices`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TagQuery {
    /// The tag.
    pub tag: Tag,
    /// The slices of the streams (all by default).
    pub slices: Slices,
}

impl TagQuery {
    /// Every entry of `tag`, in all slices.
    pub fn new(tag: Tag) -> Self {
        Self {
            tag,
            slices: Slices::ALL,
        }
    }

    /// Only the streams of `slices`.
    #[must_use]
    pub fn slices(mut self, slices: Slices) -> Self {
        self.slices = slices;
        self
    }
}

/// One tagged entry, as `Journal::events_by_tag` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaggedEvent {
    /// Its offset in the tag.
    pub offset: Offset,
    /// Its stream.
    pub persistence_id: PersistenceId,
    /// Its seq in the stream.
    pub seq: u64,
    /// When it was committed (the journal's clock: PostgreSQL's, for the PostgreSQL journal).
    pub written_at: SystemTime,
    /// The entry; `None` if it was deleted (`Journal::delete_to`)
    /// after it was tagged. Deletion never removes an entry from its tags silently: a reader
    /// that comes by later learns that it is gone, and where.
    pub event: Option<StoredEvent>,
}

/// Checks the tags of an append of `count` entries: none at all, or one list per entry.
pub fn check_tags(id: &PersistenceId, count: usize, tags: &[Vec<Tag>]) -> Result<(), JournalError> {
    if tags.is_empty() || tags.len() == count {
        return Ok(());
    }
    Err(JournalError::invalid(
        id,
        format!(
            "tags for {} entries in an append of {count}: give one list per entry, or none",
            tags.len()
        ),
    ))
}

/// The tags of an append, each entry's list sorted and without repeats; empty if no entry
/// has one.
pub fn normalized(mut tags: Vec<Vec<Tag>>) -> Vec<Vec<Tag>> {
    if tags.iter().all(Vec::is_empty) {
        return Vec::new();
    }
    for list in &mut tags {
        list.sort_unstable();
        list.dedup();
    }
    tags
}

/// Checks the page size of a read by tag.
pub fn check_max_events(max_events: usize) -> Result<(), JournalError> {
    if max_events == 0 {
        return Err(JournalError::InvalidArgument {
            persistence_id: None,
            reason: "a read by tag of 0 entries".into(),
        });
    }
    Ok(())
}

/// A tag row that is not what the schema says: corrupt, reported on the tag's
/// [`JournalError::Storage`] (it names no stream of its own).
pub fn corrupt_tag_row(query: &TagQuery, err: impl fmt::Display) -> JournalError {
    JournalError::storage(
        None,
        format!("corrupt journal data: a row of tag `{}`: {err}", query.tag),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_order_by_transaction_then_position() {
        let a = Offset::from_parts(5, 100);
        let b = Offset::from_parts(6, 1);
        assert!(Offset::START < a && a < b);
        assert!(Offset::from_parts(5, 101) > a);
        assert_eq!(b.parts(), (6, 1));
        assert_eq!(a.to_string(), "5:100");
    }

    #[test]
    fn tags_are_one_list_per_entry_or_none_and_normalized() {
        let id = PersistenceId::new("s").unwrap();
        let t = |s: &'static str| Tag::from_static(s);
        assert!(check_tags(&id, 2, &[]).is_ok());
        assert!(check_tags(&id, 2, &[vec![t("a")], vec![]]).is_ok());
        let err = check_tags(&id, 2, &[vec![t("a")]]).unwrap_err();
        assert!(
            err.to_string()
                .contains("tags for 1 entries in an append of 2"),
            "{err}"
        );
        assert_eq!(normalized(vec![vec![], vec![]]), Vec::<Vec<Tag>>::new());
        assert_eq!(
            normalized(vec![vec![t("b"), t("a"), t("b")], vec![]]),
            vec![vec![t("a"), t("b")], vec![]]
        );
        assert!(check_max_events(0).is_err());
    }
}
