//! Replaying a range of a stream page by page.

use crate::journal::{Journal, JournalError, PersistenceId, StoredEvent};

/// Hands every event with `from_seq <= seq <= to_seq` to `f`, in seq order, fetching at most
/// `page_size` events at a time: the stream is never held in memory whole. Stops at the first
/// error, of the journal or of `f`.
///
/// Returns the seq of the last event handed to `f`, or 0 if there was none.
///
/// Events may be missing at the start of the range (deleted with
/// [`Journal::delete_to`]); a seq missing after the first event found is a hole in the
/// stream, reported as [`JournalError::Corrupt`] rather than skipped.
///
/// # Errors
/// [`JournalError::InvalidArgument`] if `page_size` is 0; the journal's errors; a hole or an
/// event out of order as [`JournalError::Corrupt`]; whatever `f` returns.
///
/// # Examples
/// ```
/// # use actix_delivery::journal::{replay_all, Journal, JournalError, MemoryJournal, PersistenceId};
/// # async fn demo() -> Result<(), JournalError> {
/// let journal = MemoryJournal::new();
/// let id = PersistenceId::new("counter-1")?;
/// journal.append(&id, 1, vec![b"a".to_vec(), b"b".to_vec()]).await?;
/// let mut seen = Vec::new();
/// let last = replay_all(&journal, &id, 1, u64::MAX, 100, |event| {
///     seen.push(event.payload);
///     Ok::<_, JournalError>(())
/// })
/// .await?;
/// assert_eq!((last, seen), (2, vec![b"a".to_vec(), b"b".to_vec()]));
/// # Ok(()) }
/// # futures_util::FutureExt::now_or_never(demo()).unwrap().unwrap();
/// ```
pub async fn replay_all<J, E, F>(
    journal: &J,
    id: &PersistenceId,
    from_seq: u64,
    to_seq: u64,
    page_size: usize,
    mut f: F,
) -> Result<u64, E>
where
    J: Journal + ?Sized,
    E: From<JournalError>,
    F: FnMut(StoredEvent) -> Result<(), E>,
{
    if page_size == 0 {
        return Err(JournalError::invalid(id, "replay page size 0").into());
    }
    let mut next = from_seq;
    let mut last = 0;
    while next <= to_seq {
        let page = journal.replay(id, next, to_seq, page_size).await?;
        let full = page.len() >= page_size;
        for event in page {
            let expected = if last == 0 {
                next..=to_seq
            } else {
                next..=next
            };
            if !expected.contains(&event.seq) {
                return Err(JournalError::Corrupt {
                    persistence_id: id.clone(),
                    seq: next,
                    reason: format!("missing: the journal returned seq {} next", event.seq),
                }
                .into());
            }
            last = event.seq;
            next = event.seq.saturating_add(1);
            f(event)?;
        }
        if !full || last == u64::MAX {
            break;
        }
    }
    Ok(last)
}
