//! Shard leases in PostgreSQL (feature `postgres`): two tables of their own, created on first
//! connect, in the schema the application names (the shared journal's database, typically).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};

use crate::runtime::error_chain::ErrorChain;
use crate::sharding::entity_id::ShardId;
use crate::sharding::lease_store::{
    Lease, LeaseError, LeaseFuture, LeaseRecord, LeaseStore, LeaseView, Member,
};

/// A [`LeaseStore`] in PostgreSQL (feature `postgres`), for coordinators in several
/// processes: one row per shard (`shard_lease`: owner, fencing token, expiry) and one per
/// member (`shard_member`: address, expiry), expiry judged by the database's clock
/// (`now()`), so the nodes' clocks need not agree. An acquisition is one conditional
/// statement that takes only rows whose lease has expired and raises their token, so two
/// nodes racing for a shard cannot both get it; a renewal or release names the token, so a
/// node whose lease was taken meanwhile changes nothing.
///
/// The tables (see [`SCHEMA_SQL`](Self::SCHEMA_SQL)) are created on connect if missing, under
/// an advisory lock. The connection is made on the current Tokio runtime (an Actix arbiter),
/// lazily again after it broke; every operation is bounded by `timeout` (a coordinator
/// treats a failed renewal as no renewal). No TLS: connect over a trusted network.
#[derive(Clone)]
pub struct PostgresLeaseStore(Arc<Shared>);

struct Shared {
    config: Config,
    schema: String,
    timeout: Duration,
    client: Mutex<Option<Arc<Client>>>,
    sql: Sql,
}

struct Sql {
    acquire: String,
    renew: String,
    release: String,
    heartbeat: String,
    forget: String,
    leave: String,
    members: String,
    leases: String,
    records: String,
}

impl Sql {
    fn new(schema: &str) -> Self {
        let lease = format!("\"{schema}\".shard_lease");
        let member = format!("\"{schema}\".shard_member");
        let ms = "$4::float8 * interval '1 millisecond'";
        Self {
            acquire: format!(
                "INSERT INTO {lease} AS l (namespace, shard, owner, token, expires_at) \
                 SELECT $1, s, $3, 1, now() + {ms} FROM unnest($2::int4[]) AS s \
                 ON CONFLICT (namespace, shard) DO UPDATE \
                 SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at <= now() \
                 RETURNING shard, token"
            ),
            renew: format!(
                "UPDATE {lease} AS l SET expires_at = now() + {ms} \
                 FROM unnest($2::int4[], $5::int8[]) AS r(shard, token) \
                 WHERE l.namespace = $1 AND l.shard = r.shard AND l.token = r.token \
                 AND l.owner = $3 RETURNING l.shard"
            ),
            release: format!(
                "UPDATE {lease} AS l SET expires_at = '-infinity' \
                 FROM unnest($2::int4[], $4::int8[]) AS r(shard, token) \
                 WHERE l.namespace = $1 AND l.shard = r.shard AND l.token = r.token \
                 AND l.owner = $3"
            ),
            heartbeat: format!(
                "INSERT INTO {member} (namespace, member, address, expires_at) \
                 VALUES ($1, $2, $3, now() + {ms}) ON CONFLICT (namespace, member) DO UPDATE \
                 SET address = EXCLUDED.address, expires_at = EXCLUDED.expires_at"
            ),
            forget: format!(
                "DELETE FROM {member} WHERE namespace = $1 \
                 AND expires_at < now() - interval '1 hour'"
            ),
            leave: format!("DELETE FROM {member} WHERE namespace = $1 AND member = $2"),
            members: format!(
                "SELECT member, address FROM {member} \
                 WHERE namespace = $1 AND expires_at > now()"
            ),
            leases: format!(
                "SELECT l.shard, l.owner, l.token, m.address FROM {lease} l \
                 LEFT JOIN {member} m ON m.namespace = l.namespace AND m.member = l.owner \
                 AND m.expires_at > now() \
                 WHERE l.namespace = $1 AND l.expires_at > now()"
            ),
            records: format!(
                "SELECT shard, owner, token, CASE WHEN isfinite(expires_at) \
                 THEN (extract(epoch FROM expires_at - now()) * 1000)::int8 END \
                 FROM {lease} WHERE namespace = $1 ORDER BY shard"
            ),
        }
    }
}

impl PostgresLeaseStore {
    /// The SQL that creates the tables (in the schema first on the `search_path`); the store
    /// runs it itself, qualified with its schema, when they are missing.
    pub const SCHEMA_SQL: &'static str = "\
        CREATE TABLE IF NOT EXISTS shard_lease (\
            namespace text NOT NULL, shard integer NOT NULL, owner text NOT NULL, \
            token bigint NOT NULL, expires_at timestamptz NOT NULL, \
            PRIMARY KEY (namespace, shard)); \
        CREATE TABLE IF NOT EXISTS shard_member (\
            namespace text NOT NULL, member text NOT NULL, address text, \
            expires_at timestamptz NOT NULL, PRIMARY KEY (namespace, member));";

    /// Connects to the database `config` names (a libpq-style `key=value` string or a
    /// `postgresql://` URL) and creates the tables in `schema` (a plain identifier: `a-z`,
    /// `0-9`, `_`) if they are missing. Each operation waits at most `timeout`.
    ///
    /// # Errors
    /// [`LeaseError::Storage`] for a `config` that does not parse (saying what did not, never
    /// the password), an invalid schema name, a server that cannot be reached, or tables
    /// that cannot be created.
    pub async fn connect(
        config: &str,
        schema: &str,
        timeout: Duration,
    ) -> Result<Self, LeaseError> {
        if !crate::journal::is_plain_identifier(schema) {
            return Err(LeaseError::Storage(format!(
                "schema {schema:?} must be 1 to 63 characters of a-z, 0-9 and _, not starting \
                 with a digit"
            )));
        }
        let mut config = crate::journal::parse_config(config).map_err(LeaseError::Storage)?;
        if config.get_application_name().is_none() {
            config.application_name("actix-delivery leases");
        }
        config.connect_timeout(timeout);
        let store = Self(Arc::new(Shared {
            config,
            sql: Sql::new(schema),
            schema: schema.to_owned(),
            timeout,
            client: Mutex::new(None),
        }));
        let client = store.client().await?;
        store
            .bounded(create_tables(&client, &store.0.schema))
            .await?;
        Ok(store)
    }

    /// The connection, made anew if there is none or it broke.
    async fn client(&self) -> Result<Arc<Client>, LeaseError> {
        let current = self
            .0
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(client) = current.filter(|c| !c.is_closed()) {
            return Ok(client);
        }
        let connect = self.0.config.connect(NoTls);
        let (client, connection) = tokio::time::timeout(self.0.timeout, connect)
            .await
            .map_err(|_| LeaseError::Storage("connecting timed out".into()))?
            .map_err(|err| LeaseError::Storage(format!("cannot connect: {}", ErrorChain(&err))))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                log::warn!("the lease store's connection ended: {}", ErrorChain(&err));
            }
        });
        let client = Arc::new(client);
        *self.0.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// Runs `operation` within the timeout; a timed-out connection is dropped (its next use
    /// connects anew).
    async fn bounded<T>(
        &self,
        operation: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.0.timeout, operation).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(LeaseError::Storage(ErrorChain(&err).to_string())),
            Err(_) => {
                self.0
                    .client
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                Err(LeaseError::Storage(format!(
                    "no answer within {:?}",
                    self.0.timeout
                )))
            }
        }
    }
}

/// Creates the schema and tables if missing, serialised with other nodes doing the same.
/// Only when missing: `IF NOT EXISTS` needs the privilege to create regardless, and tables set
/// up by an administrator may be used without it.
async fn create_tables(client: &Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    let found = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
            &[
                &format!("\"{schema}\".shard_lease"),
                &format!("\"{schema}\".shard_member"),
            ],
        )
        .await?;
    if found.get::<_, bool>(0) {
        return Ok(());
    }
    let create = format!(
        "BEGIN; \
         SELECT pg_advisory_xact_lock(hashtext('actix-delivery shard leases {schema}')); \
         CREATE SCHEMA IF NOT EXISTS \"{schema}\"; \
         SET LOCAL search_path TO \"{schema}\"; \
         {tables} \
         COMMIT;",
        tables = PostgresLeaseStore::SCHEMA_SQL
    );
    let result = client.batch_execute(&create).await;
    if result.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

fn shard_numbers(shards: impl Iterator<Item = ShardId>) -> Vec<i32> {
    // Shard counts are at most 65 536 (validated), far below i32::MAX.
    shards.map(|s| s.0 as i32).collect()
}

fn tokens(leases: &[(ShardId, u64)]) -> Vec<i64> {
    leases.iter().map(|(_, t)| *t as i64).collect()
}

fn millis(ttl: Duration) -> f64 {
    ttl.as_secs_f64() * 1000.0
}

impl LeaseStore for PostgresLeaseStore {
    fn heartbeat(&self, namespace: &str, member: &Member, ttl: Duration) -> LeaseFuture<'_, ()> {
        let (namespace, member) = (namespace.to_owned(), member.clone());
        Box::pin(async move {
            let client = self.client().await?;
            let sql = &self.0.sql;
            self.bounded(async {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&namespace, &member.id, &member.address, &millis(ttl)];
                client.execute(&sql.heartbeat, &params).await?;
                client.execute(&sql.forget, &[&namespace]).await
            })
            .await
            .map(drop)
        })
    }

    fn acquire(
        &self,
        namespace: &str,
        shards: &[ShardId],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<(ShardId, u64)>> {
        let (namespace, owner) = (namespace.to_owned(), owner.to_owned());
        let mut shards = shard_numbers(shards.iter().copied());
        // Each once: PostgreSQL refuses a statement that would take one row twice (21000).
        shards.sort_unstable();
        shards.dedup();
        Box::pin(async move {
            if shards.is_empty() {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            let rows = self
                .bounded(client.query(
                    &self.0.sql.acquire,
                    &[&namespace, &shards, &owner, &millis(ttl)],
                ))
                .await?;
            Ok(rows
                .iter()
                .map(|row| {
                    (
                        ShardId(row.get::<_, i32>(0) as u32),
                        row.get::<_, i64>(1) as u64,
                    )
                })
                .collect())
        })
    }

    fn renew(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<ShardId>> {
        let (namespace, owner) = (namespace.to_owned(), owner.to_owned());
        let (shards, tokens) = (shard_numbers(leases.iter().map(|l| l.0)), tokens(leases));
        Box::pin(async move {
            if shards.is_empty() {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            let rows = self
                .bounded(client.query(
                    &self.0.sql.renew,
                    &[&namespace, &shards, &owner, &millis(ttl), &tokens],
                ))
                .await?;
            Ok(rows
                .iter()
                .map(|row| ShardId(row.get::<_, i32>(0) as u32))
                .collect())
        })
    }

    fn release(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
    ) -> LeaseFuture<'_, ()> {
        let (namespace, owner) = (namespace.to_owned(), owner.to_owned());
        let (shards, tokens) = (shard_numbers(leases.iter().map(|l| l.0)), tokens(leases));
        Box::pin(async move {
            if shards.is_empty() {
                return Ok(());
            }
            let client = self.client().await?;
            self.bounded(
                client.execute(&self.0.sql.release, &[&namespace, &shards, &owner, &tokens]),
            )
            .await
            .map(drop)
        })
    }

    fn leave(&self, namespace: &str, member: &str) -> LeaseFuture<'_, ()> {
        let (namespace, member) = (namespace.to_owned(), member.to_owned());
        Box::pin(async move {
            let client = self.client().await?;
            self.bounded(client.execute(&self.0.sql.leave, &[&namespace, &member]))
                .await
                .map(drop)
        })
    }

    fn view(&self, namespace: &str) -> LeaseFuture<'_, LeaseView> {
        let namespace = namespace.to_owned();
        Box::pin(async move {
            let client = self.client().await?;
            let (members, leases) = self
                .bounded(async {
                    let members = client.query(&self.0.sql.members, &[&namespace]).await?;
                    let leases = client.query(&self.0.sql.leases, &[&namespace]).await?;
                    Ok((members, leases))
                })
                .await?;
            let members = members
                .iter()
                .map(|row| Member {
                    id: row.get(0),
                    address: row.get(1),
                })
                .collect();
            let leases = leases
                .iter()
                .map(|row| {
                    let lease = Lease {
                        owner: row.get(1),
                        token: row.get::<_, i64>(2) as u64,
                        address: row.get(3),
                    };
                    (ShardId(row.get::<_, i32>(0) as u32), lease)
                })
                .collect();
            Ok(LeaseView { members, leases })
        })
    }

    fn leases(&self, namespace: &str) -> LeaseFuture<'_, Vec<LeaseRecord>> {
        let namespace = namespace.to_owned();
        Box::pin(async move {
            let client = self.client().await?;
            let rows = self
                .bounded(client.query(&self.0.sql.records, &[&namespace]))
                .await?;
            let records = rows.iter().map(|row| LeaseRecord {
                shard: ShardId(row.get::<_, i32>(0) as u32),
                owner: row.get(1),
                token: row.get::<_, i64>(2) as u64,
                expires_in_ms: row.get(3),
            });
            Ok(records.collect())
        })
    }
}

impl std::fmt::Debug for PostgresLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLeaseStore")
            .field("schema", &self.0.schema)
            .finish_non_exhaustive()
    }
}
