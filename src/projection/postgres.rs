//! A read model in PostgreSQL (feature `postgres`): exactly once (the handler writes in the
//! transaction that stores the offset), or as the offset store of an at-least-once
//! projection.

use std::str::FromStr;

use futures_util::future::LocalBoxFuture;
use tokio_postgres::{Client, Config, NoTls, Transaction};

use crate::journal::{is_connection_lost, is_plain_identifier, Offset, Slices};
use crate::projection::core::Batch;
use crate::projection::envelope::{Envelope, EventDecoder};
use crate::projection::runner::{guarded, Failure, Key, Sink};
use crate::projection::{
    HandlerError, HandlerFuture, OffsetStore, Projection, ProjectionError, ProjectionHandle,
};

/// A read model in a PostgreSQL database, with the table `<schema>.projection_offset
/// (projection, first_slice, last_slice, offset_transaction, offset_position, updated_at)`,
/// created (with the schema) on connect if missing.
///
/// With [`Projection::exactly_once_postgres`] the handler gets the `tokio_postgres`
/// [`Transaction`] in which the projection then stores its offset: the read model's rows and
/// the offset commit together or not at all. A commit whose answer is lost (the connection
/// broke) is no problem: the projection connects again and loads the offset, which says
/// whether it went through. The read model may live in the journal's database or another.
/// Plain connections only (no TLS).
#[derive(Debug)]
pub struct PostgresReadModel {
    config: Config,
    /// `"schema".projection_offset`.
    table: String,
    client: Client,
}

impl PostgresReadModel {
    /// Connects to the database `config` names (as `PostgresJournal::connect` takes it) and
    /// creates `schema` and the offsets' table in it if they are missing. Its connection's I/O
    /// runs on the current Tokio runtime (an Actix arbiter's).
    ///
    /// # Errors
    /// [`ProjectionError::Store`] for a `config` that does not parse, a `schema` that is not
    /// a plain identifier (1 to 63 of `a-z`, `0-9`, `_`, not starting with a digit), a
    /// server that cannot be reached, or tables that cannot be created.
    pub async fn connect(config: &str, schema: &str) -> Result<Self, ProjectionError> {
        let store = |what: &str, err: &dyn std::fmt::Display| {
            ProjectionError::Store(format!("{what}: {err}"))
        };
        let mut config = Config::from_str(config)
            .map_err(|err| store("a connection string that does not parse", &err))?;
        if config.get_application_name().is_none() {
            config.application_name("actix-delivery projection");
        }
        if !is_plain_identifier(schema) {
            return Err(ProjectionError::Store(format!(
                "schema {schema:?} must be 1 to 63 characters of a-z, 0-9 and _, not starting \
                 with a digit"
            )));
        }
        let client = open(&config).await.map_err(ProjectionError::Store)?;
        let table = format!("\"{schema}\".projection_offset");
        let found = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1), \
                 to_regclass($2) IS NOT NULL",
                &[&schema, &table],
            )
            .await
            .map_err(|err| store("cannot look up the offsets' table", &err))?;
        let (schema_exists, table_exists): (bool, bool) = (found.get(0), found.get(1));
        // Created only when missing: `IF NOT EXISTS` needs the privilege to create regardless,
        // and a read model set up by hand may run without it.
        if !table_exists {
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
                     COMMIT;"
                ))
                .await
                .map_err(|err| store("cannot create the offsets' table", &err))?;
        }
        Ok(Self {
            config,
            table,
            client,
        })
    }

    /// The connection (for setting up the read model's tables and reading them).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Connects again if the connection was lost.
    async fn reconnect_if_lost(&mut self) -> Result<(), String> {
        if self.client.is_closed() {
            self.client = open(&self.config).await?;
        }
        Ok(())
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
            .map_err(|err| err.to_string())?;
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
        save(&self.client, &self.table, key, offset)
            .await
            .map_err(|err| err.to_string())
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
        .map_err(|err| format!("cannot connect to PostgreSQL: {err}"))?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            log::debug!("projection: a PostgreSQL connection ended: {err}");
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
    let (transaction, position) = offset.parts();
    let (Ok(transaction), Ok(position)) = (i64::try_from(transaction), i64::try_from(position))
    else {
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
        .map_err(|err| err.to_string())?;
    Ok(())
}

/// Whether a handler's error is the database failing rather than the events: a lost
/// connection, a serialization failure or deadlock (class 40), the server short of resources
/// (53) or shutting down (57). Then the offset is loaded again, and the entries are not
/// blamed.
fn is_storage_failure(err: &HandlerError) -> bool {
    let Some(err) = err.downcast_ref::<tokio_postgres::Error>() else {
        return false;
    };
    is_connection_lost(err)
        || err.code().is_some_and(|code| {
            let code = code.code();
            ["40", "53", "57"]
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

    fn load<'a>(&'a mut self, key: &'a Key) -> LocalBoxFuture<'a, Result<Offset, String>> {
        Box::pin(self.model.load_offset(key))
    }

    fn process<'a>(
        &'a mut self,
        key: &'a Key,
        batch: Batch<Ev>,
    ) -> LocalBoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let model = &mut self.model;
            model.reconnect_if_lost().await.map_err(Failure::Store)?;
            let store = |err: tokio_postgres::Error| Failure::Store(err.to_string());
            let transaction = model.client.transaction().await.map_err(store)?;
            let handler = &mut self.handler;
            match guarded(|| handler(&transaction, batch.events())).await? {
                Ok(()) => {}
                Err(err) if is_storage_failure(&err) || transaction.client().is_closed() => {
                    return Err(Failure::Store(err.to_string()))
                }
                Err(err) => return Err(Failure::Handler(err.to_string())),
            }
            save(&transaction, &model.table, key, batch.to)
                .await
                .map_err(Failure::Store)?;
            transaction.commit().await.map_err(store)
        })
    }

    fn save<'a>(
        &'a mut self,
        key: &'a Key,
        offset: Offset,
    ) -> LocalBoxFuture<'a, Result<(), String>> {
        Box::pin(self.model.save_offset(key, offset))
    }
}

impl OffsetStore for PostgresReadModel {
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
