//! A read model in PostgreSQL (feature `postgres`): exactly once (the handler writes in the
//! transaction that stores the offset), or as the offset store of an at-least-once
//! projection.

use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls, Transaction};

use crate::journal::{
    is_connection_lost, is_plain_identifier, parse_config, JournalId, Offset, Slices,
};
use crate::projection::core::Batch;
use crate::projection::envelope::{Envelope, EventDecoder};
use crate::projection::runner::{guarded, recorded_journal, Failure, Key, Sink};
use crate::projection::{
    HandlerError, HandlerFuture, OffsetStore, Projection, ProjectionError, ProjectionHandle,
};
use crate::runtime::error_chain::ErrorChain;

/// A read model in a PostgreSQL database, with the tables `<schema>.projection_offset
/// (projection, first_slice, last_slice, offset_transaction, offset_position, updated_at)`
/// and `<schema>.projection_journal(projection, journal_id)`, created (with the schema) on
/// connect if missing. The latter records the [journal](crate::journal::Journal::journal_id)
/// each projection follows, at its first start; a start on another journal (another schema,
/// or another database) is refused. A read model whose tables are made by hand (for a role
/// that may not create tables) needs both: one of the previous release needs
/// `projection_journal (projection TEXT PRIMARY KEY, journal_id TEXT NOT NULL)` added, and
/// until then connecting fails naming the tables.
///
/// With [`Projection::exactly_once_postgres`] the handler gets the `tokio_postgres`
/// [`Transaction`] in which the projection then stores its offset: the read model's rows and
/// the offset commit together or not at all. A commit whose answer is lost (the connection
/// broke) is no problem: the projection connects again and loads the offset, which says
/// whether it went through. The read model may live in the journal's database or another.
/// Plain connections only (no TLS).
///
/// Every call on the database is bounded by a [timeout](Self::with_timeout) (30 s by
/// default): a batch (handler, offset and commit), loading or storing an offset, connecting.
/// One that runs over is cancelled on the server, its connection dropped, and the projection
/// connects again and loads its offset, as after any failure of the read model.
#[derive(Debug)]
pub struct PostgresReadModel {
    config: Config,
    /// `"schema".projection_offset`.
    table: String,
    /// `"schema".projection_journal`.
    journals: String,
    client: Client,
    timeout: Duration,
    /// A call ran over its timeout: connect again before the next.
    abandoned: bool,
}

/// The default [`PostgresReadModel::with_timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl PostgresReadModel {
    /// Connects to the database `config` names (as `PostgresJournal::connect` takes it) and
    /// creates `schema` and the read model's tables in it if they are missing. Its
    /// connection's I/O runs on the current Tokio runtime (an Actix arbiter's).
    ///
    /// # Errors
    /// [`ProjectionError::Store`] for a `config` that does not parse (saying what did not,
    /// never the password), a `schema` that is not a plain identifier (1 to 63 of `a-z`,
    /// `0-9`, `_`, not starting with a digit), a server that cannot be reached, or tables
    /// that cannot be created.
    pub async fn connect(config: &str, schema: &str) -> Result<Self, ProjectionError> {
        let store = |what: &str, err: &dyn std::fmt::Display| {
            ProjectionError::Store(format!("{what}: {err}"))
        };
        let mut config = parse_config(config).map_err(ProjectionError::Store)?;
        if config.get_application_name().is_none() {
            config.application_name("actix-delivery projection");
        }
        if !is_plain_identifier(schema) {
            return Err(ProjectionError::Store(format!(
                "schema {schema:?} must be 1 to 63 characters of a-z, 0-9 and _, not starting \
                 with a digit"
            )));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_TIMEOUT);
        }
        let client = open(&config).await.map_err(ProjectionError::Store)?;
        let table = format!("\"{schema}\".projection_offset");
        let journals = format!("\"{schema}\".projection_journal");
        let found = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1), \
                 to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL",
                &[&schema, &table, &journals],
            )
            .await
            .map_err(|err| store("cannot look up the read model's tables", &ErrorChain(&err)))?;
        let (schema_exists, tables_exist): (bool, bool) = (found.get(0), found.get(1));
        // Created only when missing: `IF NOT EXISTS` needs the privilege to create regardless,
        // and a read model set up by hand may run without it.
        if !tables_exist {
            let create_schema = if schema_exists {
                String::new()
            } else {
                format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";")
            };
            client
                .batch_execute(&format!(
                    "BEGIN; \
                     SELECT pg_advisory_xact_lock(hashtext('actix-delivery projection_offset {schema}')); \
                     {create_schema} \
                     CREATE TABLE IF NOT EXISTS {table} ( \
                         projection TEXT NOT NULL, \
                         first_slice SMALLINT NOT NULL, \
                         last_slice SMALLINT NOT NULL, \
                         offset_transaction BIGINT NOT NULL, \
                         offset_position BIGINT NOT NULL, \
                         updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
                         PRIMARY KEY (projection, first_slice, last_slice)); \
                     CREATE TABLE IF NOT EXISTS {journals} ( \
                         projection TEXT PRIMARY KEY, \
                         journal_id TEXT NOT NULL); \
                     COMMIT;"
                ))
                .await
                .map_err(|err| {
                    store(
                        &format!("cannot create the read model's tables {table} and {journals}"),
                        &ErrorChain(&err),
                    )
                })?;
        }
        Ok(Self {
            config,
            table,
            journals,
            client,
            timeout: DEFAULT_TIMEOUT,
            abandoned: false,
        })
    }

    /// Bounds each call on the database by `timeout` (30 s by default): a batch (the
    /// handler's work, the offset and the commit), loading or storing an offset, and a
    /// connection attempt unless the connection string sets `connect_timeout`. Make it
    /// longer than the slowest batch the handler takes.
    ///
    /// # Errors
    /// [`ProjectionError::Store`] for a zero `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, ProjectionError> {
        if timeout.is_zero() {
            return Err(ProjectionError::Store(
                "a read model's timeout must be longer than zero".into(),
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The connection (for setting up the read model's tables and reading them).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Connects again if the connection was lost or abandoned.
    async fn reconnect_if_lost(&mut self) -> Result<(), String> {
        if self.abandoned || self.client.is_closed() {
            self.client = open(&self.config).await?;
            self.abandoned = false;
        }
        Ok(())
    }

    /// What a call bounded by [`timeout`](Self::with_timeout) returned, or an error if it
    /// ran over: then its query is cancelled on the server and its connection dropped.
    fn settle<T>(
        &mut self,
        outcome: Result<Result<T, Failure>, tokio::time::error::Elapsed>,
    ) -> Result<T, Failure> {
        outcome.unwrap_or_else(|_| {
            self.abandoned = true;
            let cancel = self.client.cancel_token();
            tokio::spawn(async move {
                let _ = cancel.cancel_query(NoTls).await;
            });
            Err(Failure::Store(format!(
                "PostgreSQL did not answer within {:?}",
                self.timeout
            )))
        })
    }

    async fn load_offset(&mut self, key: &Key) -> Result<Offset, String> {
        self.reconnect_if_lost().await?;
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT offset_transaction, offset_position FROM {} \
                     WHERE projection = $1 AND first_slice = $2 AND last_slice = $3",
                    self.table
                ),
                &[
                    &key.name,
                    &slice(key.slices.first()),
                    &slice(key.slices.last()),
                ],
            )
            .await
            .map_err(|err| ErrorChain(&err).to_string())?;
        let Some(row) = row else {
            return Ok(Offset::START);
        };
        let (transaction, position): (i64, i64) = (row.get(0), row.get(1));
        match (u64::try_from(transaction), u64::try_from(position)) {
            (Ok(transaction), Ok(position)) => Ok(Offset::from_parts(transaction, position)),
            _ => Err(format!("a stored offset of {transaction}:{position}")),
        }
    }

    async fn save_offset(&mut self, key: &Key, offset: Offset) -> Result<(), String> {
        self.reconnect_if_lost().await?;
        save(&self.client, &self.table, key, offset).await
    }

    /// Records `journal` as the one `projection` follows unless one is recorded: the one
    /// recorded, as stored.
    async fn follow(&mut self, projection: &str, journal: &JournalId) -> Result<String, String> {
        self.reconnect_if_lost().await?;
        // The row inserted, or else the one there before; none only if another instance
        // inserted one after this statement's snapshot was taken (then go again).
        let rows = self
            .client
            .query(
                &format!(
                    "WITH recorded AS ( \
                         INSERT INTO {journals} (projection, journal_id) VALUES ($1, $2) \
                         ON CONFLICT (projection) DO NOTHING RETURNING journal_id \
                     ) \
                     SELECT journal_id FROM recorded \
                     UNION ALL SELECT journal_id FROM {journals} WHERE projection = $1",
                    journals = self.journals
                ),
                &[&projection, &journal.as_str()],
            )
            .await
            .map_err(|err| ErrorChain(&err).to_string())?;
        match rows.first() {
            Some(row) => row.try_get(0).map_err(|err| ErrorChain(&err).to_string()),
            None => Err(format!(
                "the journal of projection `{projection}` was recorded by another instance \
                 meanwhile"
            )),
        }
    }

    /// [`follow`](Self::follow) within the [timeout](Self::with_timeout).
    async fn follow_in_time(
        &mut self,
        projection: &str,
        journal: &JournalId,
    ) -> Result<String, Failure> {
        let timeout = self.timeout;
        let following = async {
            self.follow(projection, journal)
                .await
                .map_err(Failure::Store)
        };
        let outcome = tokio::time::timeout(timeout, following).await;
        self.settle(outcome)
    }
}

impl PostgresReadModel {
    /// Exactly once: the stored offset of `key`, unless the table holds offsets of the same
    /// name under slices that overlap `key`'s but are not the same (a change of slicing).
    async fn load_exactly_once(&mut self, key: &Key) -> Result<Offset, Failure> {
        self.reconnect_if_lost().await.map_err(Failure::Store)?;
        let others = self
            .client
            .query(
                &format!(
                    "SELECT first_slice, last_slice FROM {} WHERE projection = $1 \
                     AND first_slice <= $3 AND last_slice >= $2 \
                     AND NOT (first_slice = $2 AND last_slice = $3) ORDER BY first_slice",
                    self.table
                ),
                &[
                    &key.name,
                    &slice(key.slices.first()),
                    &slice(key.slices.last()),
                ],
            )
            .await
            .map_err(|err| Failure::Store(ErrorChain(&err).to_string()))?;
        if !others.is_empty() {
            let others: Vec<(u16, u16)> = others
                .iter()
                .map(|row| (row.get::<_, i16>(0) as u16, row.get::<_, i16>(1) as u16))
                .collect();
            return Err(Failure::resliced(key, &others));
        }
        self.load_offset(key).await.map_err(Failure::Store)
    }
}

/// Exactly once: stores `offset` as `key`'s in `table` if the stored one is still `stored`
/// (nothing stored counts as [`Offset::START`]); [`Failure::Conflict`] if another instance
/// moved it, [`Failure::Handler`] if the transaction had failed before (a handler went on
/// after an error). A concurrent writer's row lock makes this wait for its commit, then see
/// its offset.
async fn advance(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
    key: &Key,
    stored: Offset,
    offset: Offset,
) -> Result<(), Failure> {
    let (Some((stored_transaction, stored_position)), Some((transaction, position))) =
        (stored.to_bigints(), offset.to_bigints())
    else {
        return Err(Failure::Store(format!(
            "offset {offset} does not fit BIGINTs"
        )));
    };
    let (first, last) = (slice(key.slices.first()), slice(key.slices.last()));
    let changed = if stored == Offset::START {
        client
            .execute(
                &format!(
                    "INSERT INTO {table} AS stored (projection, first_slice, last_slice, \
                     offset_transaction, offset_position) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (projection, first_slice, last_slice) DO UPDATE SET \
                     offset_transaction = excluded.offset_transaction, \
                     offset_position = excluded.offset_position, updated_at = now() \
                     WHERE stored.offset_transaction = 0 AND stored.offset_position = 0"
                ),
                &[&key.name, &first, &last, &transaction, &position],
            )
            .await
    } else {
        client
            .execute(
                &format!(
                    "UPDATE {table} SET offset_transaction = $4, offset_position = $5, \
                     updated_at = now() WHERE projection = $1 AND first_slice = $2 \
                     AND last_slice = $3 AND offset_transaction = $6 AND offset_position = $7"
                ),
                &[
                    &key.name,
                    &first,
                    &last,
                    &transaction,
                    &position,
                    &stored_transaction,
                    &stored_position,
                ],
            )
            .await
    };
    match changed {
        Ok(1) => Ok(()),
        Ok(_) => Err(Failure::moved(stored)),
        Err(err) if err.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => {
            Err(Failure::Handler(format!(
                "the handler returned Ok from a transaction in which a statement had failed: \
                 {}",
                ErrorChain(&err)
            )))
        }
        Err(err) => Err(Failure::Store(ErrorChain(&err).to_string())),
    }
}

/// A slice number as the table's SMALLINT (slices are below 1024).
fn slice(slice: u16) -> i16 {
    slice as i16
}

/// Connects, driving the connection on the current runtime.
async fn open(config: &Config) -> Result<Client, String> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|err| format!("cannot connect to PostgreSQL: {}", ErrorChain(&err)))?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            log::debug!(
                "projection: a PostgreSQL connection ended: {}",
                ErrorChain(&err)
            );
        }
    });
    Ok(client)
}

/// Stores `offset` as `key`'s in `table`, on `client` (a transaction's, or the connection).
async fn save(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
    key: &Key,
    offset: Offset,
) -> Result<(), String> {
    let Some((transaction, position)) = offset.to_bigints() else {
        return Err(format!("offset {offset} does not fit BIGINTs"));
    };
    client
        .execute(
            &format!(
                "INSERT INTO {table} (projection, first_slice, last_slice, offset_transaction, \
                 offset_position) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (projection, first_slice, last_slice) DO UPDATE SET \
                 offset_transaction = excluded.offset_transaction, \
                 offset_position = excluded.offset_position, updated_at = now()"
            ),
            &[
                &key.name,
                &slice(key.slices.first()),
                &slice(key.slices.last()),
                &transaction,
                &position,
            ],
        )
        .await
        .map_err(|err| ErrorChain(&err).to_string())?;
    Ok(())
}

/// Whether a handler's error is the read model failing rather than the events: a lost
/// connection (class 08), refused authorization (28), a missing database or schema (3D,
/// 3F), a serialization failure or deadlock (40), a missing table or column, a syntax error
/// or a missing privilege (42: the read model's schema or the handler's SQL), the server short
/// of resources (53), an object not in the state needed (55, a lock not available), shutting
/// down (57), a system or internal error (58, XX). Then the offset is loaded again and the
/// batch retried, and the entries are not blamed (no retry counts against them, no poison:
/// a broken read model never makes [`PoisonPolicy::Skip`](crate::projection::PoisonPolicy::Skip)
/// skip events). Data and constraint errors (22, 23) are the events'.
fn is_storage_failure(err: &HandlerError) -> bool {
    let Some(err) = err.downcast_ref::<tokio_postgres::Error>() else {
        return false;
    };
    is_connection_lost(err)
        || err.code().is_some_and(|code| {
            let code = code.code();
            [
                "08", "28", "3D", "3F", "40", "42", "53", "55", "57", "58", "XX",
            ]
            .iter()
            .any(|class| code.starts_with(class))
        })
}

/// The read model and handler of an exactly-once projection into PostgreSQL.
struct ExactlyOnce<F> {
    model: PostgresReadModel,
    handler: F,
}

impl<Ev, F> Sink<Ev> for ExactlyOnce<F>
where
    Ev: 'static,
    F: for<'a> FnMut(&'a Transaction<'a>, &'a [Envelope<Ev>]) -> HandlerFuture<'a> + 'static,
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
            let recorded = self.model.follow_in_time(&key.name, journal).await?;
            recorded_journal(recorded)
        })
    }

    fn load<'a>(&'a mut self, key: &'a Key) -> LocalBoxFuture<'a, Result<Offset, Failure>> {
        Box::pin(async move {
            let model = &mut self.model;
            let outcome = tokio::time::timeout(model.timeout, model.load_exactly_once(key)).await;
            model.settle(outcome)
        })
    }

    fn process<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        batch: Batch<Ev>,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let (model, handler) = (&mut self.model, &mut self.handler);
            let timeout = model.timeout;
            let outcome = tokio::time::timeout(timeout, async {
                model.reconnect_if_lost().await.map_err(Failure::Store)?;
                let store =
                    |err: tokio_postgres::Error| Failure::Store(ErrorChain(&err).to_string());
                let transaction = model.client.transaction().await.map_err(store)?;
                match guarded(|| handler(&transaction, batch.events())).await? {
                    Ok(()) => {}
                    Err(err) if is_storage_failure(&err) || transaction.client().is_closed() => {
                        return Err(Failure::Store(ErrorChain(&*err).to_string()))
                    }
                    Err(err) => return Err(Failure::Handler(ErrorChain(&*err).to_string())),
                }
                advance(&transaction, &model.table, key, stored, batch.to).await?;
                transaction.commit().await.map_err(store)
            })
            .await;
            model.settle(outcome)
        })
    }

    fn save<'a>(
        &'a mut self,
        key: &'a Key,
        stored: Offset,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let model = &mut self.model;
            let outcome = tokio::time::timeout(model.timeout, async {
                model.reconnect_if_lost().await.map_err(Failure::Store)?;
                advance(&model.client, &model.table, key, stored, offset).await
            })
            .await;
            model.settle(outcome)
        })
    }
}

impl OffsetStore for PostgresReadModel {
    fn load<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
    ) -> LocalBoxFuture<'a, Result<Offset, HandlerError>> {
        let key = Key::new(projection, slices);
        Box::pin(async move {
            let timeout = self.timeout;
            let loading = async { self.load_offset(&key).await.map_err(Failure::Store) };
            let outcome = tokio::time::timeout(timeout, loading).await;
            Ok(self.settle(outcome)?)
        })
    }

    fn save<'a>(
        &'a mut self,
        projection: &'a str,
        slices: Slices,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), HandlerError>> {
        let key = Key::new(projection, slices);
        Box::pin(async move {
            let timeout = self.timeout;
            let saving = async { self.save_offset(&key, offset).await.map_err(Failure::Store) };
            let outcome = tokio::time::timeout(timeout, saving).await;
            Ok(self.settle(outcome)?)
        })
    }

    fn follow<'a>(
        &'a mut self,
        projection: &'a str,
        journal: &'a JournalId,
    ) -> LocalBoxFuture<'a, Result<JournalId, HandlerError>> {
        Box::pin(async move {
            let recorded = self.follow_in_time(projection, journal).await?;
            Ok(JournalId::new(recorded)?)
        })
    }
}

impl<D: EventDecoder> Projection<D> {
    /// Starts the projection exactly once into the PostgreSQL read model `model`, on the
    /// current arbiter: `handler` gets each batch of events with the transaction in which the
    /// projection then stores the batch's offset (write it as
    /// `|transaction, events| Box::pin(async move { … })`); an error or a panic rolls both
    /// back, and the batch is retried. So after any crash the read model holds every event
    /// exactly once.
    ///
    /// # Panics
    /// Outside an Actix system.
    pub fn exactly_once_postgres<F>(self, model: PostgresReadModel, handler: F) -> ProjectionHandle
    where
        F: for<'a> FnMut(&'a Transaction<'a>, &'a [Envelope<D::Event>]) -> HandlerFuture<'a>
            + 'static,
    {
        self.start(ExactlyOnce { model, handler })
    }
}
