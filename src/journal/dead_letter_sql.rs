//! What the SQL dead-letter stores (`SqliteDeadLetters`, `PostgresDeadLetters`) share: the
//! requests their worker takes, the handle that sends them, how a row becomes an entry, and
//! how their errors say whether the operation happened.
//!
//! Each store has one worker (a thread with the store's own connection) that takes requests
//! in order. Keeps queued behind one another are committed together, in one transaction
//! ([`group`]), each of them whole or not at all, in the order they came; the replies go out
//! after the commit. The tables (`dead_letter`, `dead_letter_totals`) are described in each
//! journal's schema module.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::codec::Manifest;
use crate::delivery::dead_letter_store::{DeadLetterError, DeadLetterFuture};
use crate::delivery::dead_letters::{
    DeadLetterCause, DeadLetterCounts, DeadLetterFilter, DeadLetterLimits, DeadLetterPage,
    FieldError, Kept, NewDeadLetter, SourceKind, StoredDeadLetter,
};
use crate::error::{Happened, OptionsError};
use crate::journal::JournalId;
use crate::protocol::envelope::DeliveryInfo;
use crate::runtime::error_chain::ErrorChain;

/// The most keeps committed in one transaction.
pub(crate) const MAX_GROUP: usize = 64;
/// Requests queued in front of a worker before callers wait.
pub(crate) const QUEUE: usize = 1024;

/// The columns an entry is read from, in the order [`Row`] takes them.
pub(crate) const COLUMNS: &str = "id, kind, source, cause, key, origin, ser_codec, ser_manifest, \
     ser_version, body, body_len, attempts, error, first_at, last_at, replay_failures";

/// The columns a page of entries is read from: [`COLUMNS`] with the body `NULL` when the
/// boolean parameter `without_bodies` (a filter's [`DeadLetterFilter::without_bodies`]) is
/// true; the body is then not read.
pub(crate) fn list_columns(without_bodies: &str) -> String {
    COLUMNS.replace(
        " body,",
        &format!(" CASE WHEN {without_bodies} THEN NULL ELSE body END,"),
    )
}

/// The columns of a listing without bodies: [`COLUMNS`] with `null_body` (a `NULL` of the
/// body's type) in the body's place, then `length(body)` (by the database's `length`
/// function): the body is never read.
pub(crate) fn listing_columns(null_body: &str, length: &str) -> String {
    let columns = COLUMNS.replace(" body,", &format!(" {null_body},"));
    format!("{columns}, {length}(body)")
}

/// Where a worker's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, DeadLetterError>>;

/// A letter to keep, [bounded](NewDeadLetter::bounded) already, with its origin encoded.
pub(crate) struct KeepRequest {
    pub(crate) letter: NewDeadLetter,
    /// The [`DeliveryInfo`], encoded with [`crate::codec::encode`].
    pub(crate) origin: Option<Vec<u8>>,
    pub(crate) now_ms: u64,
    pub(crate) reply: Reply<Kept>,
}

/// One request for a store's worker.
pub(crate) enum Request {
    Keep(KeepRequest),
    List {
        filter: DeadLetterFilter,
        reply: Reply<DeadLetterPage>,
    },
    Get {
        id: u64,
        reply: Reply<Option<StoredDeadLetter>>,
    },
    Remove {
        id: u64,
        reply: Reply<bool>,
    },
    ReplayFailed {
        id: u64,
        error: String,
        now_ms: u64,
        reply: Reply<bool>,
    },
    Counts {
        reply: Reply<DeadLetterCounts>,
    },
}

/// `first` and the keeps queued right behind it (from `next`), at most [`MAX_GROUP`]; the
/// request that ended the group, if it is not a keep, comes back to be served next.
pub(crate) fn group(
    first: KeepRequest,
    mut next: impl FnMut() -> Option<Request>,
) -> (Vec<KeepRequest>, Option<Request>) {
    let mut keeps = vec![first];
    while keeps.len() < MAX_GROUP {
        match next() {
            Some(Request::Keep(keep)) => keeps.push(keep),
            Some(other) => return (keeps, Some(other)),
            None => break,
        }
    }
    (keeps, None)
}

/// The side of a store that callers hold: its id, its bounds, and its worker's queue.
#[derive(Clone)]
pub(crate) struct StoreClient {
    id: Arc<str>,
    limits: DeadLetterLimits,
    requests: mpsc::Sender<Request>,
}

/// Where a store's worker says, once it opened, the store's id (or why it could not open).
pub(crate) type Opened = oneshot::Sender<Result<JournalId, DeadLetterError>>;

impl StoreClient {
    /// Starts a store's worker, `serve`, on a thread of its own named `thread` (given the
    /// requests and where to say it opened), and waits for it to open.
    ///
    /// # Errors
    /// [`DeadLetterError::Storage`] if the thread cannot start; the worker's error if it
    /// cannot open.
    pub(crate) async fn start(
        thread: &str,
        limits: DeadLetterLimits,
        serve: impl FnOnce(mpsc::Receiver<Request>, Opened) + Send + 'static,
    ) -> Result<Self, DeadLetterError> {
        let (requests, queue) = mpsc::channel(QUEUE);
        let (opened, ready) = oneshot::channel();
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || serve(queue, opened))
            .map_err(|err| {
                storage(
                    Happened::CertainlyNot,
                    format_args!("cannot start a thread: {}", ErrorChain(&err)),
                )
            })?;
        let id = ready.await.unwrap_or_else(|_| {
            Err(storage(
                Happened::CertainlyNot,
                "the dead-letter store's thread ended while opening",
            ))
        })?;
        Ok(Self {
            id: id.as_str().into(),
            limits,
            requests,
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn limits(&self) -> &DeadLetterLimits {
        &self.limits
    }

    /// Sends the request `make` makes and waits for its answer. A write whose worker ended
    /// after taking it may have happened.
    async fn call<T>(
        &self,
        write: bool,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<T, DeadLetterError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(make(reply))
            .await
            .map_err(|_| storage(Happened::CertainlyNot, "the dead-letter store is closed"))?;
        answer.await.unwrap_or_else(|_| {
            let happened = if write {
                Happened::InDoubt
            } else {
                Happened::CertainlyNot
            };
            Err(storage(
                happened,
                "the dead-letter store's worker ended before it answered",
            ))
        })
    }

    pub(crate) fn keep(&self, letter: NewDeadLetter, now_ms: u64) -> DeadLetterFuture<'_, Kept> {
        Box::pin(async move {
            let letter = letter.bounded(self.limits.max_body_bytes);
            let origin = letter
                .origin
                .as_ref()
                .map(crate::codec::encode)
                .transpose()
                .map_err(|err| {
                    storage(
                        Happened::CertainlyNot,
                        format_args!("cannot encode the letter's origin: {err}"),
                    )
                })?;
            self.call(true, |reply| {
                Request::Keep(KeepRequest {
                    letter,
                    origin,
                    now_ms,
                    reply,
                })
            })
            .await
        })
    }

    pub(crate) fn list(&self, filter: DeadLetterFilter) -> DeadLetterFuture<'_, DeadLetterPage> {
        Box::pin(self.call(false, |reply| Request::List { filter, reply }))
    }

    pub(crate) fn get(&self, id: u64) -> DeadLetterFuture<'_, Option<StoredDeadLetter>> {
        Box::pin(self.call(false, move |reply| Request::Get { id, reply }))
    }

    pub(crate) fn remove(&self, id: u64) -> DeadLetterFuture<'_, bool> {
        Box::pin(self.call(true, move |reply| Request::Remove { id, reply }))
    }

    pub(crate) fn replay_failed(
        &self,
        id: u64,
        error: String,
        now_ms: u64,
    ) -> DeadLetterFuture<'_, bool> {
        Box::pin(self.call(true, move |reply| Request::ReplayFailed {
            id,
            error,
            now_ms,
            reply,
        }))
    }

    pub(crate) fn counts(&self) -> DeadLetterFuture<'_, DeadLetterCounts> {
        Box::pin(self.call(false, |reply| Request::Counts { reply }))
    }
}

/// Checks `limits` before a store opens, naming the bound at fault.
pub(crate) fn check_limits(limits: &DeadLetterLimits) -> Result<(), DeadLetterError> {
    limits
        .validate()
        .map_err(|OptionsError { field, reason, .. }| FieldError::new(field, reason).into())
}

/// A [`DeadLetterError::Storage`] that says `message` and whether it `happened`.
pub(crate) fn storage(happened: Happened, message: impl fmt::Display) -> DeadLetterError {
    DeadLetterError::Storage {
        message: message.to_string(),
        happened,
    }
}

/// `value` as an SQL integer (`i64::MAX` for what does not fit).
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// What a filter asks for, as SQL parameters: `after_id`, `cause`, `kind`, `source`,
/// `since_ms`, `until_ms`, the rows to read (one more than the page, to tell whether there
/// is a next one), and whether to leave the bodies out (parameter 8 of a page's statement).
pub(crate) struct FilterParams {
    pub(crate) after: i64,
    pub(crate) cause: Option<&'static str>,
    pub(crate) kind: Option<&'static str>,
    pub(crate) source: Option<String>,
    pub(crate) since: Option<i64>,
    pub(crate) until: Option<i64>,
    pub(crate) rows: i64,
    /// Whether the body is left out ([`list_columns`]).
    pub(crate) without_bodies: bool,
}

impl FilterParams {
    pub(crate) fn of(filter: &DeadLetterFilter) -> Self {
        Self {
            after: int(filter.after_id.unwrap_or(0)),
            cause: filter.cause.map(DeadLetterCause::as_str),
            kind: filter.kind.map(SourceKind::as_str),
            source: filter.source.clone(),
            since: filter.since_ms.map(int),
            until: filter.until_ms.map(int),
            rows: filter.page_size() as i64 + 1,
            without_bodies: filter.without_bodies,
        }
    }
}

/// The `WHERE … ORDER BY … LIMIT` of a listing, with its parameters written by `param(n)`
/// (`?n` for SQLite, `$n` with its type for PostgreSQL), `n` from 1 as in [`FilterParams`].
pub(crate) fn list_clause(param: impl Fn(usize) -> String) -> String {
    format!(
        "WHERE id > {after} AND ({cause} IS NULL OR cause = {cause}) \
         AND ({kind} IS NULL OR kind = {kind}) AND ({source} IS NULL OR source = {source}) \
         AND ({since} IS NULL OR last_at >= {since}) AND ({until} IS NULL OR last_at < {until}) \
         ORDER BY id LIMIT {rows}",
        after = param(1),
        cause = param(2),
        kind = param(3),
        source = param(4),
        since = param(5),
        until = param(6),
        rows = param(7),
    )
}

/// An entry as its columns hold it ([`COLUMNS`]).
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) source: String,
    pub(crate) cause: String,
    pub(crate) key: String,
    pub(crate) origin: Option<Vec<u8>>,
    pub(crate) codec: i64,
    pub(crate) manifest: String,
    pub(crate) version: i64,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) body_len: i64,
    pub(crate) attempts: i64,
    pub(crate) error: String,
    pub(crate) first_at: i64,
    pub(crate) last_at: i64,
    pub(crate) replay_failures: i64,
}

impl Row {
    /// The entry; a value out of range is an error that names the entry (nothing changed).
    pub(crate) fn into_entry(self) -> Result<StoredDeadLetter, DeadLetterError> {
        let id = self.id;
        let corrupt = |what: &dyn fmt::Display| {
            storage(
                Happened::CertainlyNot,
                format_args!("dead letter {id} cannot be read: {what}"),
            )
        };
        let number = |name: &str, value: i64| {
            u64::try_from(value).map_err(|_| corrupt(&format_args!("{name} {value}")))
        };
        let small = |name: &str, value: i64| {
            u32::try_from(value).map_err(|_| corrupt(&format_args!("{name} {value}")))
        };
        let codec = u8::try_from(self.codec)
            .map_err(|_| corrupt(&format_args!("ser_codec {}", self.codec)))?;
        let origin = self
            .origin
            .map(|bytes| crate::codec::decode::<DeliveryInfo>(&bytes))
            .transpose()
            .map_err(|err| corrupt(&format_args!("its origin: {err}")))?;
        Ok(StoredDeadLetter {
            id: number("id", id)?,
            letter: NewDeadLetter {
                kind: self.kind.parse().map_err(|err| corrupt(&err))?,
                source: self.source,
                cause: self.cause.parse().map_err(|err| corrupt(&err))?,
                key: self.key,
                origin,
                manifest: Manifest::from_stored(
                    codec,
                    self.manifest,
                    small("ser_version", self.version)?,
                ),
                body: self.body,
                body_len: number("body_len", self.body_len)?,
                attempts: small("attempts", self.attempts)?,
                error: self.error,
            },
            first_at_ms: number("first_at", self.first_at)?,
            last_at_ms: number("last_at", self.last_at)?,
            replay_failures: small("replay_failures", self.replay_failures)?,
        })
    }
}

/// The counts of `rows`, each `(cause, entries, bytes)` as a `GROUP BY cause` reads them.
pub(crate) fn counts(
    rows: impl IntoIterator<Item = (String, i64, i64)>,
) -> Result<DeadLetterCounts, DeadLetterError> {
    let mut counts = DeadLetterCounts::default();
    let mut by_cause = BTreeMap::new();
    for (cause, entries, bytes) in rows {
        let cause: DeadLetterCause = cause.parse().map_err(|err| {
            storage(
                Happened::CertainlyNot,
                format_args!("dead letters cannot be counted: {err}"),
            )
        })?;
        let (entries, bytes) = (entries.max(0) as u64, bytes.max(0) as u64);
        counts.entries += entries;
        counts.bytes += bytes;
        if entries > 0 {
            *by_cause.entry(cause).or_insert(0) += entries;
        }
    }
    counts.by_cause = by_cause.into_iter().collect();
    Ok(counts)
}

/// The [`DeadLetterStore`] of a SQL store whose requests go through its field `client` (a
/// [`StoreClient`]): one forwarding impl for both stores.
macro_rules! store_through_client {
    ($store:ty) => {
        impl $crate::delivery::dead_letter_store::DeadLetterStore for $store {
            fn store_id(&self) -> &str {
                self.client.id()
            }

            fn limits(&self) -> &$crate::delivery::dead_letters::DeadLetterLimits {
                self.client.limits()
            }

            fn keep(
                &self,
                letter: $crate::delivery::dead_letters::NewDeadLetter,
                now_ms: u64,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<
                '_,
                $crate::delivery::dead_letters::Kept,
            > {
                self.client.keep(letter, now_ms)
            }

            fn list(
                &self,
                filter: $crate::delivery::dead_letters::DeadLetterFilter,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<
                '_,
                $crate::delivery::dead_letters::DeadLetterPage,
            > {
                self.client.list(filter)
            }

            fn get(
                &self,
                id: u64,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<
                '_,
                Option<$crate::delivery::dead_letters::StoredDeadLetter>,
            > {
                self.client.get(id)
            }

            fn remove(
                &self,
                id: u64,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<'_, bool> {
                self.client.remove(id)
            }

            fn replay_failed(
                &self,
                id: u64,
                error: String,
                now_ms: u64,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<'_, bool> {
                self.client.replay_failed(id, error, now_ms)
            }

            fn counts(
                &self,
            ) -> $crate::delivery::dead_letter_store::DeadLetterFuture<
                '_,
                $crate::delivery::dead_letters::DeadLetterCounts,
            > {
                self.client.counts()
            }
        }
    };
}

pub(crate) use store_through_client;

/// The causes a peer's input makes ([`DeadLetterCause::is_peer_input`]) as a SQL list of
/// literals, for the stores' schemas (a literal, so that it goes into `concat!`) and their
/// eviction, which drops these entries first.
///
/// The partial index `dead_letter_peer_input` is made with this list and is used only by
/// statements with the same list: a change to it must rename the index (its old predicate
/// stays in existing databases under `IF NOT EXISTS`).
macro_rules! peer_input_causes {
    () => {
        "'undecodable', 'incompatible_version', 'malformed'"
    };
}

pub(crate) use peer_input_causes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_list_of_peer_input_causes_is_the_cores() {
        let causes: Vec<String> = DeadLetterCause::ALL
            .into_iter()
            .filter(|cause| cause.is_peer_input())
            .map(|cause| format!("'{}'", cause.as_str()))
            .collect();
        assert_eq!(peer_input_causes!(), causes.join(", "));
    }
}
