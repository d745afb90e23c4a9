//! The readers: a few connections of their own (`readers` of the options), so reads never
//! wait behind the writer's transaction. Each read takes the next connection in turn
//! (pipelining with the other reads on it); a lost one is replaced by the next read that comes
//! to it, and a read whose connection broke is retried once on a new one (reads change
//! nothing). Then what each read makes of its rows, checked: seqs in range and ascending,
//! manifests as stored, tag offsets ascending.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::codec::Manifest;
use crate::journal::by_tag::corrupt_tag_row;
use crate::journal::postgres::config::Counters;
use crate::journal::postgres::connector::{is_connection_lost, Connector};
use crate::journal::postgres::{db_error, seq_from_sql};
use crate::journal::{
    stored_manifest, JournalError, Offset, PersistenceId, Snapshot, StoredEvent, TagQuery,
    TaggedEvent,
};
use crate::runtime::error_chain::ErrorChain;

impl Connector {
    /// Opens a read connection with its statements prepared; from any runtime.
    async fn open_reader(&self) -> Result<ReadConnection, JournalError> {
        let connector = self.clone();
        let opening = self.runtime.spawn(async move {
            let client = connector.open().await?;
            let sql = &connector.sql;
            let prepared = async {
                Ok::<_, tokio_postgres::Error>((
                    client.prepare(&sql.replay).await?,
                    client.prepare(&sql.highest).await?,
                    client.prepare(&sql.load_snapshot).await?,
                    client.prepare(&sql.by_tag).await?,
                    client.prepare(&sql.ceiling).await?,
                ))
            }
            .await;
            let (replay, highest, load_snapshot, by_tag, ceiling) = prepared
                .map_err(|err| db_error(None, "cannot prepare the journal's reads", &err))?;
            Ok(ReadConnection {
                client,
                replay,
                highest,
                load_snapshot,
                by_tag,
                ceiling,
            })
        });
        opening.await.unwrap_or(Err(JournalError::Closed))
    }
}

/// A read connection and its prepared statements.
pub(super) struct ReadConnection {
    client: Client,
    replay: Statement,
    highest: Statement,
    load_snapshot: Statement,
    by_tag: Statement,
    ceiling: Statement,
}

/// The read connections: each read takes the next in turn (and pipelines with the others
/// on it); a lost one is replaced by the next read that comes to it.
pub(super) struct Readers {
    slots: Vec<tokio::sync::Mutex<Slot>>,
    next: AtomicUsize,
    /// Also the listener's and the runtime's way in (see `tag_notifications`).
    pub(super) connector: Connector,
    counters: Arc<Counters>,
}

/// One read connection's place.
#[derive(Default)]
struct Slot {
    connection: Option<Arc<ReadConnection>>,
    /// Whether it ever had one (so that the next one counts as a reconnect).
    opened: bool,
}

impl Readers {
    /// `count` read connections' places, none connected yet (see
    /// [`connection`](Self::connection)).
    pub(super) fn new(count: usize, connector: Connector, counters: Arc<Counters>) -> Self {
        Self {
            slots: (0..count)
                .map(|_| tokio::sync::Mutex::new(Slot::default()))
                .collect(),
            next: AtomicUsize::new(0),
            connector,
            counters,
        }
    }

    /// The connection of `slot`, connecting if it has none or lost it.
    pub(super) async fn connection(
        &self,
        slot: usize,
    ) -> Result<Arc<ReadConnection>, JournalError> {
        let mut held = self.slots[slot].lock().await;
        if let Some(connection) = &held.connection
            && !connection.client.is_closed()
        {
            return Ok(connection.clone());
        }
        let connection = Arc::new(self.connector.open_reader().await?);
        if held.opened {
            Counters::add(&self.counters.reconnects, 1);
        }
        *held = Slot {
            connection: Some(connection.clone()),
            opened: true,
        };
        Ok(connection)
    }

    /// Forgets `slot`'s connection if it is still `lost`.
    async fn discard(&self, slot: usize, lost: &Arc<ReadConnection>) {
        let mut held = self.slots[slot].lock().await;
        if held
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, lost))
        {
            held.connection = None;
        }
    }

    /// Runs `statement` of the next connection with `params` and reads its rows with
    /// `read`; once more on a new connection if it failed because its connection was lost
    /// (reads change nothing, so a retry is safe). Errors name stream `id`, if any.
    async fn run<T>(
        &self,
        id: Option<&PersistenceId>,
        what: &str,
        statement: fn(&ReadConnection) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
        read: impl FnOnce(Vec<tokio_postgres::Row>) -> Result<T, JournalError>,
    ) -> Result<T, JournalError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut retried = false;
        loop {
            let connection = self.connection(slot).await?;
            match connection
                .client
                .query(statement(&connection), params)
                .await
            {
                Ok(rows) => return read(rows),
                Err(err) if !retried && is_connection_lost(&err) => {
                    self.discard(slot, &connection).await;
                    retried = true;
                }
                Err(err) => return Err(db_error(id, what, &err)),
            }
        }
    }

    pub(super) async fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        let (from, to) = (sql_bound(from_seq), sql_bound(to_seq));
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 4] = [&id.as_str(), &from, &to, &limit];
        let events = self
            .run(
                Some(id),
                "replay failed",
                |c| &c.replay,
                &params,
                |rows| Replayed::from_rows(id, rows),
            )
            .await?;
        check_replayed(id, from_seq, to_seq, events.0)
    }

    pub(super) async fn highest_seq(&self, id: &PersistenceId) -> Result<u64, JournalError> {
        let highest = self
            .run(
                Some(id),
                "reading the highest seq failed",
                |c| &c.highest,
                &[&id.as_str()],
                |rows| Highest::from_rows(id, rows),
            )
            .await?;
        Ok(highest.0)
    }

    pub(super) async fn load_snapshot(
        &self,
        id: &PersistenceId,
    ) -> Result<Option<Snapshot>, JournalError> {
        self.run(
            Some(id),
            "loading the snapshot failed",
            |c| &c.load_snapshot,
            &[&id.as_str()],
            |rows| Option::<Snapshot>::from_rows(id, rows),
        )
        .await
    }

    pub(super) async fn by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> Result<Vec<TaggedEvent>, JournalError> {
        let Some((transaction, position)) = after.to_bigints() else {
            return Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: format!("offset {after} is beyond any PostgreSQL offset"),
            });
        };
        let (first, last) = (query.slices.first() as i16, query.slices.last() as i16);
        let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 6] = [
            &query.tag.as_str(),
            &transaction,
            &position,
            &first,
            &last,
            &limit,
        ];
        let what = format!("reading tag `{}` failed", query.tag);
        self.run(
            None,
            &what,
            |c| &c.by_tag,
            &params,
            |rows| tagged_events(query, after, rows),
        )
        .await
    }
}

impl Readers {
    /// See [`PostgresJournal::offset_ceiling`](crate::journal::Journal::offset_ceiling).
    pub(super) async fn ceiling(&self) -> Result<Offset, JournalError> {
        self.run(
            None,
            "reading the offset ceiling failed",
            |c| &c.ceiling,
            &[],
            |rows| {
                let Some(row) = rows.first() else {
                    return Ok(Offset::START);
                };
                let read =
                    (|| Ok::<_, tokio_postgres::Error>((row.try_get(0)?, row.try_get(1)?)))();
                match read {
                    Ok((transaction, position)) => {
                        offset_of(transaction, position).ok_or_else(|| {
                            JournalError::storage(
                                None,
                                format!("a tag row at offset {transaction}:{position}"),
                            )
                        })
                    }
                    Err(err) => Err(JournalError::storage(
                        None,
                        format!("reading the offset ceiling: {}", ErrorChain(&err)),
                    )),
                }
            },
        )
        .await
    }
}

/// The offset of a tag row's `txid` and `ordering`, unless one of them is negative.
fn offset_of(transaction: i64, position: i64) -> Option<Offset> {
    match (u64::try_from(transaction), u64::try_from(position)) {
        (Ok(transaction), Ok(position)) => Some(Offset::from_parts(transaction, position)),
        _ => None,
    }
}

/// The entries of a read by tag after `after`, from its rows.
fn tagged_events(
    query: &TagQuery,
    after: Offset,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Vec<TaggedEvent>, JournalError> {
    let corrupt_row = |err: &dyn std::fmt::Display| corrupt_tag_row(query, err);
    let mut events = Vec::with_capacity(rows.len());
    let mut last = None;
    let mut previous = after;
    for row in rows {
        let transaction: i64 = row
            .try_get(0)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let position: i64 = row
            .try_get(1)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let id: String = row
            .try_get(2)
            .map_err(|err| corrupt_row(&ErrorChain(&err)))?;
        let id = PersistenceId::new(id).map_err(|err| corrupt_row(&err))?;
        let raw_seq: i64 = row.try_get(3).map_err(|err| corrupt(&id, 0, &err))?;
        let seq = seq_from_sql(&id, raw_seq, 0)?;
        let micros: i64 = row.try_get(4).map_err(|err| corrupt(&id, seq, &err))?;
        let written_at = std::time::UNIX_EPOCH
            + std::time::Duration::from_micros(u64::try_from(micros).unwrap_or(0));
        let Some(offset) = offset_of(transaction, position) else {
            return Err(corrupt_row(&format!("offset {transaction}:{position}")));
        };
        if offset <= previous {
            return Err(corrupt_row(&format!(
                "offset {offset} after {previous}: out of order"
            )));
        }
        previous = offset;
        let payload: Option<Vec<u8>> = row.try_get(5).map_err(|err| corrupt(&id, seq, &err))?;
        let event = match payload {
            Some(payload) => Some(StoredEvent {
                seq,
                payload,
                manifest: manifest_at(&row, 6, &id, seq, &mut last)?,
            }),
            None => None,
        };
        events.push(TaggedEvent {
            offset,
            persistence_id: id,
            seq,
            written_at,
            event,
        });
    }
    Ok(events)
}

/// What a read makes of its rows.
trait FromRows: Sized {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError>;
}

struct Replayed(Vec<StoredEvent>);

impl FromRows for Replayed {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        let mut events = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in rows {
            let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
            let seq = seq_from_sql(id, raw, 0)?;
            let payload: Vec<u8> = row.try_get(1).map_err(|err| corrupt(id, seq, &err))?;
            let manifest = manifest(&row, id, seq, &mut last)?;
            events.push(StoredEvent {
                seq,
                payload,
                manifest,
            });
        }
        Ok(Self(events))
    }
}

struct Highest(u64);

impl FromRows for Highest {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        match rows.first() {
            None => Ok(Self(0)),
            Some(row) => {
                let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
                Ok(Self(seq_from_sql(id, raw, 0)?))
            }
        }
    }
}

impl FromRows for Option<Snapshot> {
    fn from_rows(id: &PersistenceId, rows: Vec<tokio_postgres::Row>) -> Result<Self, JournalError> {
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let raw: i64 = row.try_get(0).map_err(|err| corrupt(id, 0, &err))?;
        let seq = seq_from_sql(id, raw, 0)?;
        if seq == 0 {
            return Err(JournalError::Corrupt {
                persistence_id: id.clone(),
                seq,
                reason: "a snapshot at seq 0".into(),
            });
        }
        let payload: Vec<u8> = row.try_get(1).map_err(|err| corrupt(id, seq, &err))?;
        let manifest = manifest(row, id, seq, &mut None)?;
        Ok(Some(Snapshot {
            seq,
            payload,
            manifest,
        }))
    }
}

/// The manifest in columns 2 to 4 of `row` (see [`stored_manifest`]).
fn manifest(
    row: &tokio_postgres::Row,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    manifest_at(row, 2, id, seq, last)
}

/// The manifest in columns `first` to `first + 2` of `row` (see [`stored_manifest`]).
fn manifest_at(
    row: &tokio_postgres::Row,
    first: usize,
    id: &PersistenceId,
    seq: u64,
    last: &mut Option<Manifest>,
) -> Result<Manifest, JournalError> {
    let codec: i16 = row.try_get(first).map_err(|err| corrupt(id, seq, &err))?;
    let name: &str = row
        .try_get(first + 1)
        .map_err(|err| corrupt(id, seq, &err))?;
    let version: i64 = row
        .try_get(first + 2)
        .map_err(|err| corrupt(id, seq, &err))?;
    stored_manifest(id, seq, (i64::from(codec), name, version), last)
}

/// Checks that replayed events are ascending and within the range asked for.
fn check_replayed(
    id: &PersistenceId,
    from_seq: u64,
    to_seq: u64,
    events: Vec<StoredEvent>,
) -> Result<Vec<StoredEvent>, JournalError> {
    let mut expected = from_seq.max(1);
    for event in &events {
        if event.seq < expected || event.seq > to_seq {
            return Err(JournalError::Corrupt {
                persistence_id: id.clone(),
                seq: event.seq,
                reason: format!("out of order: expected seq {expected} or later"),
            });
        }
        expected = event.seq + 1;
    }
    Ok(events)
}

/// SQL integers are `i64`; a bound above `i64::MAX` means "no bound".
fn sql_bound(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A stored value that is not what the schema says.
fn corrupt(id: &PersistenceId, seq: u64, err: &tokio_postgres::Error) -> JournalError {
    JournalError::Corrupt {
        persistence_id: id.clone(),
        seq,
        reason: ErrorChain(err).to_string(),
    }
}
