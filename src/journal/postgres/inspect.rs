//! Reading a journal's tables as they are, read-only, beside the applications that use them:
//! the [`PostgresInspector`] (see [`JournalInspector`]).
//!
//! One connection of its own, whose session is read-only (`SET SESSION CHARACTERISTICS AS
//! TRANSACTION READ ONLY`: the server refuses any write), driven on a thread of its own as the
//! journal's are. It reads the schema's marks as the journal does (`journal_schema`, the tables
//! of the version), refusing what the journal would refuse, and reads schema versions 1 and 2 as
//! they are (without manifests, without tags) instead of migrating them. A check runs in one
//! `REPEATABLE READ` transaction: every query sees the same snapshot. The dead letters the
//! dead-letter store keeps in the schema are read as the store lists them (a listing never
//! reads the bodies).
//!
//! The PostgreSQL journal does not record how far a stream was deleted: a stream's events are
//! those from its lowest stored seq to its highest seq (`stream_metadata`), and what is below
//! was deleted.

use std::future::Future;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::codec::Manifest;
use crate::delivery::dead_letters::{DeadLetterFilter, StoredDeadLetter};
use crate::journal::dead_letter_sql::{list_clause, listing_columns, FilterParams, COLUMNS};
use crate::journal::inspect::{
    attach_tags, check_id, check_identity, check_seq, check_slice, dead_letter_entry,
    dead_letter_error, dead_letter_listing, gap, snapshot_problem, tag_order_problem, CheckReport,
    DeadLetterListing, InspectedEvent, InspectedSnapshot, JournalInspector, Problem, ProblemKind,
    Problems, SchemaInfo, StreamInfo,
};
use crate::journal::postgres::connector::Connector;
use crate::journal::postgres::dead_letters::entry as dead_letter_columns;
use crate::journal::postgres::schema::{highest_offset_sql, table, SCHEMA_VERSION};
use crate::journal::postgres::{db_error, seq_from_sql, PostgresOptions};
use crate::journal::{
    stored_manifest, JournalError, JournalFuture, JournalId, PersistenceId, Snapshot, StoredEvent,
};
use crate::runtime::error_chain::ErrorChain;

/// What `journal_schema.application` holds.
const APPLICATION: &str = "actix-delivery";

/// The tables of the journal's schema versions (`event_tag` from version 3).
const TABLES: [&str; 5] = [
    "event_journal",
    "snapshot",
    "stream_metadata",
    "journal_schema",
    "event_tag",
];

/// A read-only view of a PostgreSQL journal's schema (feature `postgres`): see
/// [`JournalInspector`].
///
/// ```no_run
/// use actix_delivery::journal::{JournalInspector, PostgresInspector, PostgresOptions};
///
/// # async fn _demo() -> Result<(), Box<dyn std::error::Error>> {
/// let options = PostgresOptions::builder().schema("journal").build()?;
/// let inspector =
///     PostgresInspector::connect("host=127.0.0.1 user=postgres dbname=orders", &options).await?;
/// let report = inspector.check(100).await?;
/// for problem in &report.problems {
///     println!("{problem}");
/// }
/// # Ok(()) }
/// ```
///
/// Its futures can be awaited on any runtime: the connection's I/O runs on the inspector's own
/// thread. Clones share one connection; dropping the last one closes it.
#[derive(Clone)]
pub struct PostgresInspector {
    shared: Arc<Shared>,
}

struct Shared {
    /// One operation at a time (a check's transaction holds it throughout).
    client: tokio::sync::Mutex<Client>,
    runtime: tokio::runtime::Handle,
    schema: SchemaInfo,
    tables: Tables,
    /// Dropped with the last handle: the thread ends, and the connection with it.
    _stop: oneshot::Sender<()>,
}

impl PostgresInspector {
    /// Connects to the database `connection` names (a libpq-style `key=value` string or a
    /// `postgresql://` URL, as [`PostgresJournal::connect_with`](super::PostgresJournal)
    /// takes it), read-only, to the journal in the schema of `options` (also its connect
    /// timeout and, with feature `tls`, its TLS). Connections without an `application_name`
    /// get `actix-delivery inspector`.
    ///
    /// # Errors
    /// [`JournalError::InvalidArgument`] for a `connection` that does not parse (saying what
    /// did not, never the password); [`JournalError::Schema`] if the schema holds no journal,
    /// another application's tables or a journal of a newer schema version;
    /// [`JournalError::Storage`] if the server cannot be reached or refuses the login (the
    /// server's message and SQLSTATE), or the thread cannot start.
    pub async fn connect(
        connection: &str,
        options: &PostgresOptions,
    ) -> Result<Self, JournalError> {
        let config = &options.config;
        let (runtime, stop) = start_runtime()?;
        let connector = Connector::for_connection(
            connection,
            options,
            "actix-delivery inspector",
            runtime.clone(),
        )?;
        let schema_name = config.schema.clone();
        let opening = runtime.spawn(async move {
            let client = connector.open().await?;
            client
                .batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
                .await
                .map_err(|err| db_error(None, "cannot make the session read-only", &err))?;
            let version = marks(&client, &schema_name).await?;
            let tables = Tables::of(&schema_name, version);
            let journal_id =
                identity_rows(&client, &tables)
                    .await?
                    .and_then(|rows| match rows.as_slice() {
                        [id] => JournalId::new(id.as_str()).ok(),
                        _ => None,
                    });
            let schema = SchemaInfo {
                location: format!("schema `{schema_name}`"),
                version: version.unsigned_abs(),
                current: SCHEMA_VERSION.unsigned_abs(),
                journal_id,
            };
            Ok::<_, JournalError>((client, schema, tables))
        });
        let (client, schema, tables) = opening.await.unwrap_or(Err(JournalError::Closed))?;
        Ok(Self {
            shared: Arc::new(Shared {
                client: tokio::sync::Mutex::new(client),
                runtime,
                schema,
                tables,
                _stop: stop,
            }),
        })
    }

    /// Runs `read` on the inspector's runtime, with the connection to itself.
    fn read<T, F>(
        &self,
        read: impl FnOnce(Arc<Shared>) -> F + Send + 'static,
    ) -> JournalFuture<'_, T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, JournalError>> + Send + 'static,
    {
        let shared = self.shared.clone();
        Box::pin(async move {
            let runtime = shared.runtime.clone();
            runtime
                .spawn(read(shared))
                .await
                .unwrap_or(Err(JournalError::Closed))
        })
    }
}

impl std::fmt::Debug for PostgresInspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresInspector")
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

/// A current-thread runtime on a thread of its own, running until the sender is dropped.
fn start_runtime() -> Result<(tokio::runtime::Handle, oneshot::Sender<()>), JournalError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            JournalError::storage(
                None,
                format!("cannot start a runtime: {}", ErrorChain(&err)),
            )
        })?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    thread::Builder::new()
        .name("actix-delivery-inspector".to_string())
        .spawn(move || {
            let _ = runtime.block_on(stopped);
        })
        .map_err(|err| {
            JournalError::storage(None, format!("cannot start a thread: {}", ErrorChain(&err)))
        })?;
    Ok((handle, stop))
}

/// The schema's tables, qualified, and the SQL that differs between schema versions.
struct Tables {
    name: String,
    events: String,
    snapshots: String,
    streams: String,
    tags: String,
    identity: String,
    /// The dead-letter store's entries (`dead_letter`, which may not exist).
    dead_letters: String,
    /// The manifest's three columns (the legacy manifest in schema 1, which had none).
    manifest: &'static str,
    /// The manifest's name column.
    manifest_name: &'static str,
    /// Whether there is an `event_tag` table (schema 3 on).
    has_tags: bool,
}

impl Tables {
    fn of(schema: &str, version: i32) -> Self {
        let with_manifests = version >= 2;
        Self {
            name: schema.to_owned(),
            events: table(schema, "event_journal"),
            snapshots: table(schema, "snapshot"),
            streams: table(schema, "stream_metadata"),
            tags: table(schema, "event_tag"),
            identity: table(schema, "journal_identity"),
            dead_letters: table(schema, "dead_letter"),
            manifest: if with_manifests {
                "ser_codec::int8, ser_manifest, ser_version::int8"
            } else {
                "1::int8, ''::text, 1::int8"
            },
            manifest_name: if with_manifests {
                "ser_manifest"
            } else {
                "''::text"
            },
            has_tags: version >= 3,
        }
    }
}

/// A `timestamptz` column as microseconds since the Unix epoch.
fn micros(column: &str) -> String {
    format!("(extract(epoch FROM {column}) * 1000000)::int8")
}

/// A time stored as microseconds since the Unix epoch (before it: the epoch).
fn from_micros(micros: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

fn expected() -> String {
    format!("an {APPLICATION} journal, schema version 1 to {SCHEMA_VERSION}")
}

fn schema_error(found: String) -> JournalError {
    JournalError::Schema {
        found,
        expected: expected(),
    }
}

/// The schema version of the journal in `schema`, read as the journal reads it; anything but
/// a journal of a version this code reads is refused.
async fn marks(client: &Client, schema: &str) -> Result<i32, JournalError> {
    let catalog = |err| db_error(None, "cannot read the catalog", &err);
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .map_err(catalog)?;
    if exists.is_none() {
        return Err(schema_error(format!(
            "no schema `{schema}` in the database"
        )));
    }
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2) \
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            &[&schema, &&TABLES[..]],
        )
        .await
        .map_err(catalog)?;
    let present = rows
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(catalog)?;
    if present.is_empty() {
        return Err(schema_error(format!(
            "no journal tables in schema `{schema}`"
        )));
    }
    if !present.iter().any(|name| name == "journal_schema") {
        return Err(schema_error(format!(
            "tables {} in schema `{schema}` not made by {APPLICATION} (no journal_schema table)",
            present.join(", ")
        )));
    }
    let marks = client
        .query(
            &format!(
                "SELECT application::text, version::int4 FROM {}",
                table(schema, "journal_schema")
            ),
            &[],
        )
        .await
        .map_err(|err| match err.code() {
            Some(_) => schema_error(format!(
                "a journal_schema table in schema `{schema}` of another shape ({})",
                ErrorChain(&err)
            )),
            None => db_error(None, "cannot read journal_schema", &err),
        })?;
    let marks: Vec<(Option<String>, Option<i32>)> = marks
        .iter()
        .map(|row| {
            (
                row.try_get(0).unwrap_or(None),
                row.try_get(1).unwrap_or(None),
            )
        })
        .collect();
    match marks.as_slice() {
        [(Some(application), Some(version))] if application == APPLICATION => {
            let version = *version;
            if version > SCHEMA_VERSION {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}`, written by a newer version \
                     of {APPLICATION} (this one reads schema versions 1 to {SCHEMA_VERSION})"
                )));
            }
            if version < 1 {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}`"
                )));
            }
            let tables = if version >= 3 {
                &TABLES[..]
            } else {
                &TABLES[..4]
            };
            if let Some(missing) = tables
                .iter()
                .find(|table| !present.iter().any(|name| name == *table))
            {
                return Err(schema_error(format!(
                    "schema version {version} in schema `{schema}` without its table `{missing}`"
                )));
            }
            Ok(version)
        }
        [(application, version)] => Err(schema_error(format!(
            "journal_schema in schema `{schema}` says application {application:?}, version \
             {version:?}"
        ))),
        other => Err(schema_error(format!(
            "journal_schema in schema `{schema}` with {} rows instead of one",
            other.len()
        ))),
    }
}

/// The rows of `journal_identity`; `None` without the table.
async fn identity_rows(
    client: &Client,
    tables: &Tables,
) -> Result<Option<Vec<String>>, JournalError> {
    let failed = |err| db_error(None, "cannot read journal_identity", &err);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&tables.identity])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(failed)?;
    if !exists {
        return Ok(None);
    }
    let rows = client
        .query(
            &format!("SELECT journal_id::text FROM {}", tables.identity),
            &[],
        )
        .await
        .map_err(failed)?;
    rows.iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(failed)
}

/// Runs `sql`; `what` names it in errors.
async fn query(
    client: &Client,
    what: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, JournalError> {
    client
        .query(sql, params)
        .await
        .map_err(|err| db_error(None, what, &err))
}

/// Runs `sql` and reads each row with `read`; `what` names it in errors.
async fn rows<T>(
    client: &Client,
    what: &str,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    read: impl Fn(&Row) -> Result<T, tokio_postgres::Error>,
) -> Result<Vec<T>, JournalError> {
    let failed = |err| db_error(None, what, &err);
    let rows = client.query(sql, params).await.map_err(failed)?;
    rows.iter()
        .map(&read)
        .collect::<Result<_, _>>()
        .map_err(failed)
}

impl JournalInspector for PostgresInspector {
    fn schema(&self) -> &SchemaInfo {
        &self.shared.schema
    }

    fn streams(
        &self,
        after: Option<&PersistenceId>,
        limit: usize,
    ) -> JournalFuture<'_, Vec<StreamInfo>> {
        let after = after.map_or_else(String::new, |id| id.as_str().to_owned());
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let sql = stream_sql(&shared.tables, "m.persistence_id > $1");
            let found = query(&client, "cannot list the streams", &sql, &[&after, &limit]).await?;
            found.iter().map(stream_info).collect()
        })
    }

    fn stream(&self, id: &PersistenceId) -> JournalFuture<'_, Option<StreamInfo>> {
        let id = id.as_str().to_owned();
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            let sql = stream_sql(&shared.tables, "m.persistence_id = $1");
            let found = query(&client, "cannot read the stream", &sql, &[&id, &1i64]).await?;
            found.first().map(stream_info).transpose()
        })
    }

    fn events(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<InspectedEvent>> {
        let id = id.clone();
        self.read(move |shared| async move {
            if max_events == 0 {
                return Ok(Vec::new());
            }
            let client = shared.client.lock().await;
            let tables = &shared.tables;
            let from = i64::try_from(from_seq).unwrap_or(i64::MAX);
            let limit = i64::try_from(max_events).unwrap_or(i64::MAX);
            let sql = format!(
                "SELECT seq_nr, payload, {}, {} FROM {} \
                 WHERE persistence_id = $1 AND seq_nr >= $2 ORDER BY seq_nr LIMIT $3",
                tables.manifest,
                micros("written_at"),
                tables.events
            );
            let found = query(
                &client,
                "cannot read the events",
                &sql,
                &[&id.as_str(), &from, &limit],
            )
            .await?;
            let mut events = Vec::with_capacity(found.len());
            let mut last = None;
            for row in &found {
                let (event, written_at) = stored(row, &id, &mut last)?;
                events.push(InspectedEvent {
                    event,
                    written_at,
                    tags: Vec::new(),
                });
            }
            if let (true, Some(first), Some(last)) =
                (tables.has_tags, events.first(), events.last())
            {
                // event_tag has no index by stream: one scan per page.
                let sql = format!(
                    "SELECT seq_nr, tag FROM {} WHERE persistence_id = $1 \
                     AND seq_nr BETWEEN $2 AND $3 ORDER BY txid, ordering",
                    tables.tags
                );
                let (first, last) = (first.event.seq as i64, last.event.seq as i64);
                let tags = rows(
                    &client,
                    "cannot read the events' tags",
                    &sql,
                    &[&id.as_str(), &first, &last],
                    |row| Ok((row.try_get::<_, i64>(0)?, row.try_get::<_, String>(1)?)),
                )
                .await?;
                attach_tags(&id, &mut events, tags)?;
            }
            Ok(events)
        })
    }

    fn snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<InspectedSnapshot>> {
        let id = id.clone();
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            let tables = &shared.tables;
            let sql = format!(
                "SELECT seq_nr, payload, {}, {} FROM {} WHERE persistence_id = $1",
                tables.manifest,
                micros("written_at"),
                tables.snapshots
            );
            let found = query(&client, "cannot read the snapshot", &sql, &[&id.as_str()]).await?;
            let Some(row) = found.first() else {
                return Ok(None);
            };
            let (event, written_at) = stored(row, &id, &mut None)?;
            Ok(Some(InspectedSnapshot {
                snapshot: Snapshot {
                    seq: event.seq,
                    payload: event.payload,
                    manifest: event.manifest,
                },
                written_at,
            }))
        })
    }

    fn check(&self, max_problems: usize) -> JournalFuture<'_, CheckReport> {
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .await
                .map_err(|err| db_error(None, "cannot begin the check's transaction", &err))?;
            let report = check(&client, &shared.tables, shared.schema.clone(), max_problems).await;
            let _ = client.batch_execute("COMMIT").await;
            report
        })
    }

    fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> JournalFuture<'_, Option<DeadLetterListing>> {
        let filter = filter.clone();
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            let t = &shared.tables.dead_letters;
            if !table_present(&client, t).await? {
                return Ok(None);
            }
            let sql = format!(
                "SELECT {} FROM {t} {}",
                listing_columns("NULL::bytea", "octet_length"),
                list_clause(|n| {
                    let ty = if (2..=4).contains(&n) { "text" } else { "int8" };
                    format!("${n}::{ty}")
                })
            );
            let p = FilterParams::of(&filter);
            let params: [&(dyn ToSql + Sync); 7] = [
                &p.after, &p.cause, &p.kind, &p.source, &p.since, &p.until, &p.rows,
            ];
            let what = "cannot list the dead letters";
            let found = query(&client, what, &sql, &params).await?;
            let rows = found
                .iter()
                .map(|row| {
                    // octet_length is an int4.
                    let kept: Option<i32> =
                        row.try_get(16).map_err(|err| db_error(None, what, &err))?;
                    let entry = dead_letter_columns(row).map_err(dead_letter_error)?;
                    Ok((entry, kept.is_some()))
                })
                .collect::<Result<Vec<_>, JournalError>>()?;
            dead_letter_listing(rows, &filter).map(Some)
        })
    }

    fn dead_letter(&self, id: u64) -> JournalFuture<'_, Option<StoredDeadLetter>> {
        self.read(move |shared| async move {
            let client = shared.client.lock().await;
            let t = &shared.tables.dead_letters;
            if !table_present(&client, t).await? {
                return Ok(None);
            }
            let Ok(id) = i64::try_from(id) else {
                return Ok(None);
            };
            let sql = format!("SELECT {COLUMNS} FROM {t} WHERE id = $1::int8");
            let found = query(&client, "cannot read the dead letter", &sql, &[&id]).await?;
            found
                .first()
                .map(|row| {
                    dead_letter_columns(row)
                        .map_err(dead_letter_error)
                        .and_then(dead_letter_entry)
                })
                .transpose()
        })
    }
}

/// Whether the (qualified) table `table` exists.
async fn table_present(client: &Client, table: &str) -> Result<bool, JournalError> {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|err| db_error(None, "cannot read the catalog", &err))
}

/// The streams of `stream_metadata` that `filter` selects (`$1`, at most `$2` of them), with
/// their lowest stored seq, newest event and snapshot.
fn stream_sql(tables: &Tables, filter: &str) -> String {
    format!(
        "SELECT m.persistence_id, m.highest_seq, \
         (SELECT min(e.seq_nr) FROM {events} e WHERE e.persistence_id = m.persistence_id), \
         newest.written_at, newest.name, s.seq_nr, {snapshot_at}, {snapshot_name} \
         FROM {streams} m \
         LEFT JOIN LATERAL (SELECT {written_at} AS written_at, {name} AS name FROM {events} e \
             WHERE e.persistence_id = m.persistence_id ORDER BY e.seq_nr DESC LIMIT 1) newest \
             ON true \
         LEFT JOIN {snapshots} s ON s.persistence_id = m.persistence_id \
         WHERE {filter} ORDER BY m.persistence_id LIMIT $2",
        events = tables.events,
        streams = tables.streams,
        snapshots = tables.snapshots,
        written_at = micros("e.written_at"),
        name = tables.manifest_name,
        snapshot_at = micros("s.written_at"),
        snapshot_name = if tables.manifest_name == "ser_manifest" {
            "s.ser_manifest"
        } else {
            "''::text"
        },
    )
}

/// A row of [`stream_sql`].
fn stream_info(row: &Row) -> Result<StreamInfo, JournalError> {
    let failed = |err| db_error(None, "cannot read a stream", &err);
    let id: String = row.try_get(0).map_err(failed)?;
    let id = PersistenceId::new(id)
        .map_err(|err| JournalError::storage(None, format!("corrupt journal data: {err}")))?;
    let seq = |index: usize| -> Result<Option<u64>, JournalError> {
        row.try_get::<_, Option<i64>>(index)
            .map_err(failed)?
            .map(|raw| seq_from_sql(&id, raw, 0))
            .transpose()
    };
    let highest_seq = seq(1)?.unwrap_or(0);
    let first_stored = seq(2)?;
    let last_written_at = row
        .try_get::<_, Option<i64>>(3)
        .map_err(failed)?
        .map(from_micros);
    let newest_name: Option<String> = row.try_get(4).map_err(failed)?;
    let snapshot_seq = seq(5)?;
    let snapshot_at = row
        .try_get::<_, Option<i64>>(6)
        .map_err(failed)?
        .map(from_micros);
    let snapshot_name: Option<String> = row.try_get(7).map_err(failed)?;
    let type_name = newest_name
        .filter(|name| !name.is_empty())
        .or(snapshot_name.filter(|name| !name.is_empty()));
    Ok(StreamInfo {
        persistence_id: id,
        highest_seq,
        deleted_to: None,
        first_stored,
        last_written_at,
        type_name,
        snapshot: snapshot_seq.map(|seq| (seq, snapshot_at.unwrap_or(SystemTime::UNIX_EPOCH))),
    })
}

/// An event or snapshot row: seq, payload, manifest (three columns), written at.
fn stored(
    row: &Row,
    id: &PersistenceId,
    last: &mut Option<Manifest>,
) -> Result<(StoredEvent, SystemTime), JournalError> {
    let corrupt = |seq: u64| {
        move |err: tokio_postgres::Error| JournalError::Corrupt {
            persistence_id: id.clone(),
            seq,
            reason: ErrorChain(&err).to_string(),
        }
    };
    let seq = seq_from_sql(id, row.try_get(0).map_err(corrupt(0))?, 0)?;
    let payload: Vec<u8> = row.try_get(1).map_err(corrupt(seq))?;
    let codec: i64 = row.try_get(2).map_err(corrupt(seq))?;
    let name: String = row.try_get(3).map_err(corrupt(seq))?;
    let version: i64 = row.try_get(4).map_err(corrupt(seq))?;
    let manifest = stored_manifest(id, seq, (codec, &name, version), last)?;
    let written_at = from_micros(row.try_get(5).map_err(corrupt(seq))?);
    Ok((
        StoredEvent {
            seq,
            payload,
            manifest,
        },
        written_at,
    ))
}

/// Every invariant, in the transaction the caller began.
async fn check(
    client: &Client,
    tables: &Tables,
    schema: SchemaInfo,
    max_problems: usize,
) -> Result<CheckReport, JournalError> {
    let Tables {
        events,
        snapshots,
        streams,
        ..
    } = tables;
    let mut problems = Problems::new(max_problems);
    let mut notes = Vec::new();
    if schema.version < schema.current {
        notes.push(format!(
            "schema version {} (this code's is {}): the journal migrates the tables when it next \
             connects (unless create_tables is off)",
            schema.version, schema.current
        ));
    }
    let identity = identity_rows(client, tables).await?.unwrap_or_default();
    problems.extend(check_identity(
        &identity,
        "connecting the journal gives it one (or run PostgresJournal::IDENTITY_SQL)",
    ));

    let all_ids = format!(
        "SELECT persistence_id FROM {streams} UNION SELECT persistence_id FROM {events} \
         UNION SELECT persistence_id FROM {snapshots}"
    );
    let count = rows(
        client,
        "cannot count the streams",
        &format!("SELECT count(*) FROM ({all_ids}) ids"),
        &[],
        |row| row.try_get::<_, i64>(0),
    )
    .await?;
    let stream_count = count.first().copied().unwrap_or(0);
    let invalid = rows(
        client,
        "cannot check the persistence ids",
        &format!(
            "SELECT persistence_id FROM ({all_ids}) ids \
             WHERE octet_length(persistence_id) NOT BETWEEN 1 AND 256 LIMIT $1"
        ),
        &[&problems.room()],
        |row| row.try_get::<_, String>(0),
    )
    .await?;
    for id in invalid {
        problems.extend(check_id(&id));
    }

    // Each stream's stored seqs in a run, ending at its highest seq.
    let gaps = rows(
        client,
        "cannot check the streams' seqs",
        &format!(
            "SELECT persistence_id, prev, seq_nr FROM ( \
                 SELECT persistence_id, seq_nr, \
                 lag(seq_nr) OVER (PARTITION BY persistence_id ORDER BY seq_nr) AS prev \
                 FROM {events} \
             ) e WHERE prev IS NOT NULL AND seq_nr > prev + 1 \
             ORDER BY persistence_id, seq_nr LIMIT $1"
        ),
        &[&problems.room()],
        |row| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
            ))
        },
    )
    .await?;
    for (id, previous, seq) in gaps {
        problems.extend(check_seq(&id, previous, seq, 0));
    }
    let ends = rows(
        client,
        "cannot check the streams' highest seqs",
        &format!(
            "SELECT m.persistence_id, m.highest_seq, x.max_seq FROM {streams} m \
             JOIN LATERAL (SELECT max(e.seq_nr) AS max_seq FROM {events} e \
                 WHERE e.persistence_id = m.persistence_id) x ON x.max_seq IS NOT NULL \
             WHERE x.max_seq <> m.highest_seq ORDER BY m.persistence_id LIMIT $1"
        ),
        &[&problems.room()],
        |row| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, i64>(2)?,
            ))
        },
    )
    .await?;
    for (id, highest, stored) in ends {
        problems.push(if stored < highest {
            gap(&id, stored + 1, highest)
        } else {
            Problem::new(
                ProblemKind::BeyondHighest,
                Some(&id),
                format!("event {stored} is stored, beyond the stream's highest seq {highest}"),
            )
        });
    }
    let unfenced = rows(
        client,
        "cannot check the streams' highest seqs",
        &format!(
            "SELECT DISTINCT e.persistence_id FROM {events} e WHERE NOT EXISTS \
             (SELECT 1 FROM {streams} m WHERE m.persistence_id = e.persistence_id) \
             ORDER BY e.persistence_id LIMIT $1"
        ),
        &[&problems.room()],
        |row| row.try_get::<_, String>(0),
    )
    .await?;
    for id in unfenced {
        problems.push(Problem::new(
            ProblemKind::NoHighestSeq,
            Some(&id),
            "events stored without the stream's row in stream_metadata (its highest seq, the \
             fence of its appends)",
        ));
    }
    let bad_snapshots = rows(
        client,
        "cannot check the snapshots",
        &format!(
            "SELECT s.persistence_id, s.seq_nr, coalesce(m.highest_seq, 0) FROM {snapshots} s \
             LEFT JOIN {streams} m ON m.persistence_id = s.persistence_id \
             WHERE s.seq_nr > coalesce(m.highest_seq, 0) OR s.seq_nr < 1 \
             ORDER BY s.persistence_id LIMIT $1"
        ),
        &[&problems.room()],
        |row| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, i64>(2)?,
            ))
        },
    )
    .await?;
    for (id, seq, highest) in bad_snapshots {
        problems.push(snapshot_problem(&id, seq, highest));
    }

    let mut tag_rows = 0;
    if tables.has_tags {
        let count = rows(
            client,
            "cannot count the tag rows",
            &format!("SELECT count(*) FROM {}", tables.tags),
            &[],
            |row| row.try_get::<_, i64>(0),
        )
        .await?;
        tag_rows = count.first().copied().unwrap_or(0);
        check_tags(client, tables, &mut problems).await?;
    }
    Ok(CheckReport {
        schema,
        streams: stream_count.unsigned_abs(),
        tag_rows: tag_rows.unsigned_abs(),
        problems: problems.found,
        truncated: problems.truncated,
        notes,
    })
}

/// The tag rows: each one's event stored or deleted, offsets rising with seqs within a
/// stream, each row in its stream's slice, of a transaction this server has run.
async fn check_tags(
    client: &Client,
    tables: &Tables,
    problems: &mut Problems,
) -> Result<(), JournalError> {
    let Tables {
        events,
        streams,
        tags,
        ..
    } = tables;
    // Deleted: below the stream's lowest stored seq, or none stored (what the PostgreSQL
    // journal's deletion leaves).
    let dangling = rows(
        client,
        "cannot check the tag rows",
        &format!(
            "SELECT t.tag, t.txid::text, t.ordering, t.persistence_id, t.seq_nr FROM {tags} t \
             LEFT JOIN {streams} m ON m.persistence_id = t.persistence_id \
             WHERE NOT EXISTS (SELECT 1 FROM {events} e \
                 WHERE e.persistence_id = t.persistence_id AND e.seq_nr = t.seq_nr) \
               AND (m.highest_seq IS NULL OR t.seq_nr > m.highest_seq \
                 OR t.seq_nr > (SELECT min(e.seq_nr) FROM {events} e \
                     WHERE e.persistence_id = t.persistence_id)) \
             ORDER BY t.txid, t.ordering LIMIT $1"
        ),
        &[&problems.room()],
        |row| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, String>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get::<_, String>(3)?,
                row.try_get::<_, i64>(4)?,
            ))
        },
    )
    .await?;
    for (tag, txid, ordering, id, seq) in dangling {
        problems.push(Problem::new(
            ProblemKind::DanglingTag,
            Some(&id),
            format!(
                "the tag row of tag `{tag}` at offset {txid}:{ordering} points at event {seq}, \
                 which is neither stored nor deleted"
            ),
        ));
    }

    let disordered = rows(
        client,
        "cannot check the tag rows' order",
        &format!(
            "SELECT tag, persistence_id, txid::text, ordering, seq_nr, prev_txid::text, \
             prev_ordering, prev_seq FROM ( \
                 SELECT tag, persistence_id, txid, ordering, seq_nr, \
                 lag(txid) OVER w AS prev_txid, lag(ordering) OVER w AS prev_ordering, \
                 lag(seq_nr) OVER w AS prev_seq \
                 FROM {tags} WINDOW w AS (PARTITION BY tag, persistence_id ORDER BY txid, ordering) \
             ) t WHERE seq_nr <= prev_seq ORDER BY txid, ordering LIMIT $1"
        ),
        &[&problems.room()],
        |row| {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, String>(1)?,
                format!(
                    "{}:{}",
                    row.try_get::<_, String>(2)?,
                    row.try_get::<_, i64>(3)?
                ),
                row.try_get::<_, i64>(4)?,
                format!(
                    "{}:{}",
                    row.try_get::<_, String>(5)?,
                    row.try_get::<_, i64>(6)?
                ),
                row.try_get::<_, i64>(7)?,
            ))
        },
    )
    .await?;
    for (tag, id, offset, seq, before, before_seq) in disordered {
        problems.push(tag_order_problem(
            &tag,
            &id,
            (&offset, seq),
            (&before, before_seq),
        ));
    }

    let slices = rows(
        client,
        "cannot check the tag rows' slices",
        &format!("SELECT DISTINCT persistence_id, slice::int8 FROM {tags}"),
        &[],
        |row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, i64>(1)?)),
    )
    .await?;
    for (id, slice) in slices {
        problems.extend(check_slice(&id, slice));
    }

    // As the journal checks on connect: tag rows of transactions this server has not reached
    // (a logical restore into another cluster) would sort after every entry appended now.
    let newest = rows(
        client,
        "cannot check the tag rows' transactions",
        &highest_offset_sql(&tables.name),
        &[],
        |row| row.try_get::<_, i64>(0),
    )
    .await?;
    let next = rows(
        client,
        "cannot check the tag rows' transactions",
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8",
        &[],
        |row| row.try_get::<_, i64>(0),
    )
    .await?;
    if let (Some(&newest), Some(&next)) = (newest.first(), next.first())
        && newest >= next
    {
        problems.push(Problem::new(
            ProblemKind::TagTransaction,
            None,
            format!(
                "tag rows written by transaction {newest}, which this server has not reached \
                 (its next one is {next}): the tables were restored from a logical dump into \
                 another cluster; the journal refuses them until they are re-numbered \
                 (PostgresJournal::RENUMBER_TAGS_SQL)"
            ),
        ));
    }
    Ok(())
}
