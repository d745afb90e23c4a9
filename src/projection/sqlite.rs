//! A read model in a SQLite file: exactly once (the handler writes in the transaction that
//! stores the offset), or as the offset store of an at-least-once projection (feature
//! `sqlite`, on by default).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use futures_util::future::LocalBoxFuture;
use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior,
};

use crate::journal::{unix_millis, JournalId, Offset, Slices};
use crate::projection::core::Batch;
use crate::projection::envelope::{Envelope, EventDecoder};
use crate::projection::runner::{panicked, recorded_journal, Failure, Key, Sink};
use crate::projection::{HandlerError, OffsetStore, Projection, ProjectionError, ProjectionHandle};
use crate::runtime::error_chain::ErrorChain;

/// The offsets' table and the journals' (added since, on its own: a read model of the
/// previous release keeps its offsets, and that release still opens it), created on open if
/// missing.
const CREATE: &str = "CREATE TABLE IF NOT EXISTS projection_offset (
    projection TEXT NOT NULL,
    first_slice INTEGER NOT NULL,
    last_slice INTEGER NOT NULL,
    offset_transaction INTEGER NOT NULL,
    offset_position INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (projection, first_slice, last_slice)
);
CREATE TABLE IF NOT EXISTS projection_journal (
    projection TEXT PRIMARY KEY NOT NULL,
    journal_id TEXT NOT NULL
)";

/// A read model in one SQLite file (feature `sqlite`, on by default; WAL,
/// `synchronous=FULL`: a commit is on disk when it returns), with the tables
/// `projection_offset(projection, first_slice, last_slice, offset_transaction,
/// offset_position, updated_at)` and `projection_journal(projection,
/// journal_id)`: the [journal](crate::journal::Journal::journal_id) each projection follows,
/// recorded at its first start; a start on another journal is refused.
///
/// With [`Projection::exactly_once_sqlite`] the handler gets the `rusqlite` [`Transaction`]
/// in which the projection then stores its offset: the read model's rows and the offset
/// commit together or not at all, so after any crash every event is in the read model
/// exactly once. Create the read model's tables with [`execute_batch`](Self::execute_batch)
/// before starting; read them from other connections (WAL lets readers run beside the
/// writer). It must be its own file, not the journal's: the journal's writer owns that one.
///
/// The handler runs on Tokio's blocking threads, one batch at a time, never on the
/// arbiter's thread.
#[derive(Debug)]
pub struct SqliteReadModel {
    path: PathBuf,
    /// Taken while a blocking call has it.
    connection: Option<Connection>,
}

impl SqliteReadModel {
    /// Opens (or creates) the read model at `path` and its offsets' table.
    ///
    /// # Errors
    /// [`ProjectionError::Store`] if the file cannot be opened or set up.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ProjectionError> {
        let path = path.as_ref().to_path_buf();
        let opening = path.clone();
        let connection = tokio::task::spawn_blocking(move || {
            let connection = Connection::open(&opening)?;
            connection.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
            connection.pragma_update(None, "synchronous", "FULL")?;
            connection.busy_timeout(std::time::Duration::from_secs(5))?;
            connection.execute_batch(CREATE)?;
            Ok::<_, rusqlite::Error>(connection)
        })
        .await
        .map_err(|err| ProjectionError::Store(ErrorChain(&err).to_string()))?
        .map_err(|err| {
            ProjectionError::Store(format!("{}: {}", path.display(), ErrorChain(&err)))
        })?;
        Ok(Self {
            path,
            connection: Some(connection),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `sql` (say the read model's `CREATE TABLE IF NOT EXISTS …`) on the connection.
    ///
    /// # Errors
    /// [`ProjectionError::Store`] with SQLite's message.
    pub async fn execute_batch(&mut self, sql: &str) -> Result<(), ProjectionError> {
        let sql = sql.to_owned();
        self.blocking(move |connection| {
            connection
                .execute_batch(&sql)
                .map_err(|e| ErrorChain(&e).to_string())
        })
        .await
        .map_err(ProjectionError::Store)
    }

    /// Runs `work` on the connection on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Connection) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let mut connection = self
            .connection
            .take()
            .ok_or("the read model's connection was lost")?;
        let (connection, result) = tokio::task::spawn_blocking(move || {
            // A rollback that did not go through: never build on a half transaction.
            let settled = if connection.is_autocommit() {
                Ok(())
            } else {
                connection.execute_batch("ROLLBACK")
            };
            let result = settled
                .map_err(|err| ErrorChain(&err).to_string())
                .and_then(|()| work(&mut connection));
            (connection, result)
        })
        .await
        .map_err(|err| format!("the read model's thread failed: {}", ErrorChain(&err)))?;
        self.connection = Some(connection);
        result
    }
}

/// The stored offset of `key`.
fn load(connection: &Connection, key: &Key) -> rusqlite::Result<Offset> {
    let stored: Option<(i64, i64)> = connection
        .query_row(
            "SELECT offset_transaction, offset_position FROM projection_offset \
             WHERE projection = ?1 AND first_slice = ?2 AND last_slice = ?3",
            params![key.name, key.slices.first(), key.slices.last()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    Ok(stored.map_or(Offset::START, |(transaction, position)| {
        // Written from u64s below 2^63 by `save`.
        Offset::from_parts(transaction as u64, position as u64)
    }))
}

/// Records `journal` as the one `projection` follows unless one is recorded: the one
/// recorded, as stored.
fn follow(
    connection: &Connection,
    projection: &str,
    journal: &JournalId,
) -> rusqlite::Result<String> {
    connection.execute(
        "INSERT INTO projection_journal (projection, journal_id) VALUES (?1, ?2) \
         ON CONFLICT (projection) DO NOTHING",
        params![projection, journal.as_str()],
    )?;
    connection.query_row(
        "SELECT journal_id FROM projection_journal WHERE projection = ?1",
        params![projection],
        |row| row.get(0),
    )
}

/// Stores `offset` as `key`'s.
fn save(connection: &Connection, key: &Key, offset: Offset) -> rusqlite::Result<()> {
    let Some((transaction, position)) = offset.to_bigints() else {
        return Err(rusqlite::Error::IntegralValueOutOfRange(3, 0));
    };
    let now = unix_millis();
    connection.execute(
        "INSERT INTO projection_offset (projection, first_slice, last_slice, \
         offset_transaction, offset_position, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (projection, first_slice, last_slice) DO UPDATE SET \
         offset_transaction = excluded.offset_transaction, \
         offset_position = excluded.offset_position, updated_at = excluded.updated_at",
        params![
            key.name,
            key.slices.first(),
            key.slices.last(),
            transaction,
            position,
            now
        ],
    )?;
    Ok(())
}

/// Exactly once: stores `offset` as `key`'s if the stored one is still `stored` (nothing
/// stored counts as [`Offset::START`]); `false` if another instance moved it. In the batch's
/// `IMMEDIATE` transaction, which no other writer interleaves with.
fn advance(
    connection: &Connection,
    key: &Key,
    stored: Offset,
    offset: Offset,
) -> Result<bool, String> {
    let current = load(connection, key).map_err(|err| ErrorChain(&err).to_string())?;
    if current != stored {
        return Ok(false);
    }
    save(connection, key, offset).map_err(|err| ErrorChain(&err).to_string())?;
    Ok(true)
}

/// Exactly once: the stored offset of `key`, unless the read model holds offsets of the same
/// name under slices that overlap `key`'s but are not the same (a change of slicing: their
/// events would be handled again).
fn load_exactly_once(connection: &Connection, key: &Key) -> Result<Offset, Failure> {
    let store = |err: rusqlite::Error| Failure::Store(ErrorChain(&err).to_string());
    let mut statement = connection
        .prepare(
            "SELECT first_slice, last_slice FROM projection_offset WHERE projection = ?1 \
             AND first_slice <= ?3 AND last_slice >= ?2 \
             AND NOT (first_slice = ?2 AND last_slice = ?3) ORDER BY first_slice",
        )
        .map_err(store)?;
    let others = statement
        .query_map(
            params![key.name, key.slices.first(), key.slices.last()],
            |row| Ok((row.get::<_, u16>(0)?, row.get::<_, u16>(1)?)),
        )
        .map_err(store)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(store)?;
    if !others.is_empty() {
        return Err(Failure::resliced(key, &others));
    }
    load(connection, key).map_err(store)
}

/// Whether a handler's error is the read model failing rather than the events: a full disk,
/// an I/O error, a lock held too long, a file it may not write, a table or column that is
/// not there (SQLite's generic error, also a syntax error: the read model's schema or the
/// handler's SQL). Then the offset is loaded again and the batch retried, and the entries
/// are not blamed (no retry counts against them, no poison: a broken read model never makes
/// [`PoisonPolicy::Skip`](crate::projection::PoisonPolicy::Skip) skip events).
fn is_storage_failure(err: &HandlerError) -> bool {
    let Some(rusqlite::Error::SqliteFailure(failure, _)) = err.downcast_ref::<rusqlite::Error>()
    else {
        return false;
    };
    matches!(
        failure.code,
        ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::OutOfMemory
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::NotADatabase
            | ErrorCode::PermissionDenied
            | ErrorCode::AuthorizationForStatementDenied
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::NoLargeFileSupport
            | ErrorCode::SchemaChanged
            | ErrorCode::Unknown
    )
}

/// The read model and handler of an exactly-once projection into SQLite.
struct ExactlyOnce<F> {
    model: SqliteReadModel,
    /// Taken while a batch runs.
    handler: Option<F>,
}

/// One batch: the handler and the offset in one transaction, if the stored offset is still
/// `stored`.
fn transact<Ev, F>(
    connection: &mut Connection,
    key: &Key,
    stored: Offset,
    batch: &Batch<Ev>,
    handler: &mut F,
) -> Result<(), Failure>
where
    F: FnMut(&Transaction<'_>, &[Envelope<Ev>]) -> Result<(), HandlerError>,
{
    let store = |err: rusqlite::Error| Failure::Store(ErrorChain(&err).to_string());
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(store)?;
    let ran = catch_unwind(AssertUnwindSafe(|| handler(&transaction, batch.events())));
    match ran.map_err(panicked)? {
        Ok(()) => {}
        Err(err) if is_storage_failure(&err) => {
            return Err(Failure::Store(ErrorChain(&*err).to_string()))
        }
        Err(err) => return Err(Failure::Handler(ErrorChain(&*err).to_string())),
    }
    if transaction.is_autocommit() {
        // SQLite would commit the offset on its own, without the batch's rows.
        return Err(Failure::Handler(
            "the handler ended the projection's transaction (a COMMIT or ROLLBACK of its own, \
             or an error on which SQLite rolled back); what it wrote after that is not undone"
                .into(),
        ));
    }
    if !advance(&transaction, key, stored, batch.to).map_err(Failure::Store)? {
        return Err(Failure::moved(stored));
    }
    transaction.commit().map_err(store)
}

impl<Ev, F> Sink<Ev> for ExactlyOnce<F>
where
    Ev: Send + Sync + 'static,
    F: FnMut(&Transaction<'_>, &[Envelope<Ev>]) -> Result<(), HandlerError> + Send + 'static,
{
    fn offset_in_transaction(&self) -> bool {
        true
    }

    fn follow<'a>(
        &'a mut self,
        key: &'a Key,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, Failure>> {
        Box::pin(async move {
            let recorded = self.model.follow(&key.name, journal).await;
            recorded_journal(recorded.map_err(Failure::Store)?)
        })
    }

    fn load<'a>(&'a mut self, key: &'a Key) -> LocalBoxFuture<'a, Result<Offset, Failure>> {
        let key = key.clone();
        Box::pin(async move {
            self.model
                .blocking(move |connection| Ok(load_exactly_once(connection, &key)))
                .await
                .map_err(Failure::Store)?
        })
    }

    fn process<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        batch: Batch<Ev>,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let mut handler = self
                .handler
                .take()
                .ok_or_else(|| Failure::Store("the handler was lost".into()))?;
            let key = key.clone();
            let outcome = self
                .model
                .blocking(move |connection| {
                    let result = transact(connection, &key, stored, &batch, &mut handler);
                    Ok((handler, result))
                })
                .await;
            let (handler, result) = outcome.map_err(Failure::Store)?;
            self.handler = Some(handler);
            result
        })
    }

    fn save<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        let key = key.clone();
        Box::pin(async move {
            let advanced = self
                .model
                .blocking(move |connection| {
                    let transaction = connection
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .map_err(|err| ErrorChain(&err).to_string())?;
                    let advanced = advance(&transaction, &key, stored, offset)?;
                    transaction
                        .commit()
                        .map_err(|err| ErrorChain(&err).to_string())?;
                    Ok(advanced)
                })
                .await
                .map_err(Failure::Store)?;
            if advanced {
                Ok(())
            } else {
                Err(Failure::moved(stored))
            }
        })
    }
}

impl SqliteReadModel {
    async fn load_offset(&mut self, key: &Key) -> Result<Offset, String> {
        let key = key.clone();
        self.blocking(move |connection| {
            load(connection, &key).map_err(|e| ErrorChain(&e).to_string())
        })
        .await
    }

    async fn save_offset(&mut self, key: &Key, offset: Offset) -> Result<(), String> {
        let key = key.clone();
        self.blocking(move |connection| {
            save(connection, &key, offset).map_err(|e| ErrorChain(&e).to_string())
        })
        .await
    }

    async fn follow(&mut self, projection: &str, journal: &JournalId) -> Result<String, String> {
        let (projection, journal) = (projection.to_owned(), journal.clone());
        self.blocking(move |connection| {
            follow(connection, &projection, &journal).map_err(|e| e.to_string())
        })
        .await
    }
}

impl OffsetStore for SqliteReadModel {
    fn load<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
    ) -> LocalBoxFuture<'a, Result<Offset, HandlerError>> {
        let key = Key::new(projection, slices);
        Box::pin(async move { Ok(self.load_offset(&key).await?) })
    }

    fn save<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), HandlerError>> {
        let key = Key::new(projection, slices);
        Box::pin(async move { Ok(self.save_offset(&key, offset).await?) })
    }

    fn follow<'a>(
        &'a mut self,
        projection: &'a str,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, HandlerError>> {
        Box::pin(async move { Ok(JournalId::new(self.follow(projection, journal).await?)?) })
    }
}

impl<D: EventDecoder> Projection<D>
where
    D::Event: Send + Sync,
{
    /// Starts the projection exactly once into the SQLite read model `model` (feature
    /// `sqlite`, on by default), on the current arbiter: `handler` gets each batch of events
    /// with the transaction in which the projection then stores the batch's offset (an error
    /// or a panic rolls both back, and the batch is retried). So after any crash the read model
    /// holds every event exactly once. The handler runs on a blocking thread.
    ///
    /// # Panics
    /// Outside an Actix system.
    pub fn exactly_once_sqlite<F>(self, model: SqliteReadModel, handler: F) -> ProjectionHandle
    where
        F: FnMut(&Transaction<'_>, &[Envelope<D::Event>]) -> Result<(), HandlerError>
            + Send
            + 'static,
    {
        self.start(ExactlyOnce {
            model,
            handler: Some(handler),
        })
    }
}
