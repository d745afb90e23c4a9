//! The writer: owns the write connection and commits in groups.
//!
//! It waits for a write, takes every write already queued behind it (from any stream, up to
//! the batch bounds) and sends them as one transaction, pipelined: `BEGIN`, the steps,
//! `COMMIT`, all in one round trip, then the answers. A step is one set-based append
//! statement for a run of appends (at most one per stream; a second append to a stream goes
//! into the next step, after the first), or one delete, or one snapshot, in arrival order.
//!
//! A conflict is no error inside the transaction: the append statement stores only the
//! appends whose stream still had the expected highest seq, and returns which. So a refused
//! append leaves no trace and the rest of the group commits. A database error (a deadlock
//! with another node, a row stored outside the journal in the way) aborts the transaction and
//! PostgreSQL rolls it back at the pipelined `COMMIT`: nothing of the group is stored; if the
//! error may concern one write alone, the writes are retried one per transaction, so only that
//! one fails. A lost connection (or no answer within the commit timeout) leaves the outcome
//! unknown: every write of the group fails with an error that says it may or may not be
//! stored, and the next group connects anew. Replies go out after the commit's answer.
//!
//! A group with tagged appends also sends `pg_notify` (channel [`TAGS_CHANNEL`], the schema's
//! name as payload) before its `COMMIT`: PostgreSQL delivers it to the listeners of every
//! process once the transaction commits. After the commit the writer also tells this
//! journal's [`TagSignal`] at once.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::TryStreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::codec::Manifest;
use crate::journal::postgres::config::{Counters, PostgresConfig};
use crate::journal::postgres::options::PostgresOptions;
use crate::journal::postgres::{db_error, is_connection_lost, schema, seq_from_sql, Connector};
use crate::journal::write::{WriteOp, WriteRequest};
use crate::journal::{check_snapshot, slice_of, JournalError, JournalId, PersistenceId, TagSignal};
use crate::runtime::backoff::Reconnect;
use crate::runtime::error_chain::ErrorChain;
use crate::runtime::random::random_u64;

/// The channel of the notifications that tagged entries were committed; the payload names
/// the schema.
pub(super) const TAGS_CHANNEL: &str = "actix_delivery_tags";

/// The largest message PostgreSQL accepts from a client (since version 14; before, one it
/// cannot buffer fails the same way): `PQ_LARGE_MESSAGE_LIMIT`, 1 GiB - 2 bytes, its length
/// word included. A larger one makes the server drop the connection, so a write that would
/// need one must never be sent: its outcome would be unknown, though nothing was stored.
const MAX_MESSAGE_BYTES: usize = (1 << 30) - 2;
/// A bound on the message bytes of an append step beyond its appends (the Bind message's
/// header, statement name, formats and nine array headers).
const STEP_OVERHEAD: usize = 1024;

/// A bound on what a write (`op` on stream `id`) adds to the Bind message of the step that
/// carries it, as this
/// module encodes it (see [`StepParams`]): per append its stream id and two seqs, each as an
/// array element with a 4-byte length; per event its row number, seq and payload likewise
/// (the payload also padded to 4 bytes in the server's array). A delete or a snapshot is a
/// step of its own, of about its payload.
fn message_bytes(id: &PersistenceId, op: &WriteOp) -> usize {
    let id = 4 + id.as_str().len() + 2 * 12;
    match op {
        WriteOp::Append {
            payloads,
            manifest,
            tags,
            ..
        } => {
            // Per tag of an event: row number, seq, tag (padded to 4 bytes) and slice, each
            // with a 4-byte length.
            let tags = tags.iter().flatten().fold(0usize, |sum, tag| {
                sum.saturating_add(4 + 8 + 4 + 8 + 4 + tag.as_str().len() + 4 + 4 + 2)
            });
            payloads
                .iter()
                .fold(id + manifest_bytes(manifest), |sum, payload| {
                    sum.saturating_add(32 + payload.len())
                })
                .saturating_add(tags)
        }
        WriteOp::DeleteTo { .. } => id,
        WriteOp::SaveSnapshot(snapshot) => id
            .saturating_add(manifest_bytes(&snapshot.manifest))
            .saturating_add(snapshot.payload.len()),
    }
}

/// What a manifest adds: its codec, name and version, each an array element with a 4-byte
/// length (the name padded to 4 bytes in the server's array).
fn manifest_bytes(manifest: &Manifest) -> usize {
    3 * 8 + manifest.name().len() + 4
}

/// Whether a step of `bytes` (from [`message_bytes`]) fits one message.
fn fits_one_message(bytes: usize) -> bool {
    bytes.saturating_add(STEP_OVERHEAD) <= MAX_MESSAGE_BYTES
}

/// How long the writer waits for the first of the writers it just answered to come back…
const LINGER_FIRST: Duration = Duration::from_micros(100);
/// … and for each next one.
const LINGER_GAP: Duration = Duration::from_micros(30);

impl WriteRequest {
    /// What this write is, for error messages: names the seqs.
    fn describe(&self) -> String {
        match &self.op {
            WriteOp::Append {
                first_seq,
                payloads,
                ..
            } => {
                let last = first_seq + payloads.len() as u64 - 1;
                if last == *first_seq {
                    format!("the append at seq {first_seq}")
                } else {
                    format!("the append of seqs {first_seq} to {last}")
                }
            }
            WriteOp::DeleteTo { to_seq } => format!("the deletion up to seq {to_seq}"),
            WriteOp::SaveSnapshot(snapshot) => format!("the snapshot at seq {}", snapshot.seq),
        }
    }

    fn error(&self, message: impl std::fmt::Display) -> JournalError {
        JournalError::storage(Some(&self.id), format!("{}: {message}", self.describe()))
    }
}

/// The write connection and its prepared statements.
struct WriteConnection {
    client: Client,
    begin: Statement,
    commit: Statement,
    append: Statement,
    delete_to: Statement,
    save_snapshot: Statement,
    highest_of: Statement,
    notify: Statement,
}

/// The writer's state between groups.
pub(super) struct Writer {
    connector: Connector,
    options: PostgresOptions,
    counters: Arc<Counters>,
    signal: Arc<TagSignal>,
    connection: Option<WriteConnection>,
    /// The waits between connection attempts.
    backoff: Reconnect,
    retry_at: Option<Instant>,
}

/// How a group's transaction ended, short of committing.
enum Failure {
    /// PostgreSQL refused a statement and rolled the transaction back: nothing is stored.
    RolledBack(tokio_postgres::Error),
    /// The connection broke, or did not answer in time: the outcome is unknown.
    Unknown(String),
}

/// What a committed transaction says about one write.
enum Outcome {
    Done,
    /// The fence refused the append; its stream's highest seq is read after the commit.
    Conflict,
    Refused(JournalError),
}

/// One statement of a group's transaction.
enum Step {
    /// Indices into the group of appends to distinct streams.
    Appends(Vec<usize>),
    /// The index of a delete or a snapshot.
    Single(usize),
}

impl Writer {
    pub(super) fn new(
        connector: Connector,
        options: PostgresOptions,
        counters: Arc<Counters>,
        signal: Arc<TagSignal>,
    ) -> Self {
        Self {
            connector,
            backoff: Reconnect::new(
                options.config.reconnect_min,
                options.config.reconnect_max,
                random_u64(),
            ),
            options,
            counters,
            signal,
            connection: None,
            retry_at: None,
        }
    }

    /// The writer's life: connects, checks (or creates) the schema, reports through `opened` (with
    /// the journal's id), then commits groups until every sender is gone and the queue is empty.
    pub(super) async fn run(
        mut self,
        mut requests: mpsc::Receiver<WriteRequest>,
        opened: oneshot::Sender<Result<Option<JournalId>, JournalError>>,
    ) {
        let first = async {
            let client = self.connector.open().await?;
            let id = schema::check_or_create(&client, &self.options.config).await?;
            schema::check_transaction_ids(&client, &self.options.config.schema).await?;
            Ok::<_, JournalError>((self.prepare(client).await?, id))
        };
        let id = match first.await {
            Ok((connection, id)) => {
                self.connection = Some(connection);
                id
            }
            Err(err) => {
                let _ = opened.send(Err(err));
                return;
            }
        };
        if opened.send(Ok(id)).is_err() {
            return; // the opener gave up waiting
        }
        #[cfg(feature = "metrics")]
        let mut meter = crate::journal::metrics::PostgresMeter::new(
            self.options
                .metrics_label
                .as_deref()
                .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
        );
        let mut carried = None;
        let (mut last_replies, mut last_commit) = (0, Duration::ZERO);
        loop {
            let first = match carried.take() {
                Some(request) => request,
                None => match requests.recv().await {
                    Some(request) => request,
                    None => break,
                },
            };
            let mut group = Group::new(first, &self.options.config);
            while let Ok(request) = requests.try_recv() {
                if let Some(over) = group.push(request) {
                    carried = Some(over);
                    break;
                }
            }
            if carried.is_none() && last_replies > 1 && group.requests.len() < last_replies {
                linger(
                    &mut requests,
                    &mut group,
                    &mut carried,
                    last_replies,
                    last_commit,
                )
                .await;
            }
            last_replies = group.requests.len();
            #[cfg(feature = "metrics")]
            let transactions = self.counters.read(0).transactions;
            let started = Instant::now();
            self.commit(group.requests).await;
            last_commit = started.elapsed();
            #[cfg(feature = "metrics")]
            {
                let stats = self.counters.read(requests.len());
                let committed = stats.transactions > transactions;
                meter.transaction(committed.then_some((last_replies, last_commit)), &stats);
            }
        }
    }

    async fn prepare(&self, client: Client) -> Result<WriteConnection, JournalError> {
        let sql = &self.connector.sql;
        let prepared = async {
            Ok::<_, tokio_postgres::Error>(WriteConnection {
                begin: client.prepare("BEGIN").await?,
                commit: client.prepare("COMMIT").await?,
                append: client.prepare(&sql.append).await?,
                delete_to: client.prepare(&sql.delete_to).await?,
                save_snapshot: client.prepare(&sql.save_snapshot).await?,
                highest_of: client.prepare(&sql.highest_of).await?,
                notify: client.prepare("SELECT pg_notify($1, $2)").await?,
                client,
            })
        };
        prepared
            .await
            .map_err(|err| db_error(None, "cannot prepare the journal's writes", &err))
    }

    /// Connects unless connected, waiting out the backoff after a failed attempt first.
    async fn connect(&mut self) -> Result<(), JournalError> {
        if self
            .connection
            .as_ref()
            .is_some_and(|connection| !connection.client.is_closed())
        {
            return Ok(());
        }
        self.connection = None;
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
        }
        let connected = match self.connector.open().await {
            Ok(client) => self.prepare(client).await,
            Err(err) => Err(err),
        };
        match connected {
            Ok(connection) => {
                Counters::add(&self.counters.reconnects, 1);
                log::info!("journal: connected to PostgreSQL again");
                self.connection = Some(connection);
                self.backoff.reset();
                self.retry_at = None;
                Ok(())
            }
            Err(err) => {
                self.retry_at = Some(Instant::now() + self.backoff.next_wait());
                Err(err)
            }
        }
    }

    /// Commits `group` and replies to each write.
    async fn commit(&mut self, group: Vec<WriteRequest>) {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            let span = crate::journal::write::journal_commit("postgres", &group);
            return self.commit_group(group).instrument(span).await;
        }
        #[cfg(not(feature = "tracing"))]
        self.commit_group(group).await
    }

    async fn commit_group(&mut self, group: Vec<WriteRequest>) {
        if let Err(err) = self.connect().await {
            log::warn!("journal: a group of {} writes failed: {err}", group.len());
            Counters::add(&self.counters.rejected, group.len() as u64);
            for request in group {
                let error = match &err {
                    JournalError::Storage { message, .. } => {
                        request.error(format!("not stored: {message}"))
                    }
                    other => other.clone(),
                };
                let _ = request.reply.send(Err(error));
            }
            return;
        }
        match self.attempt(&group).await {
            Ok(outcomes) => self.reply(group, outcomes).await,
            Err(Failure::RolledBack(err)) if group.len() > 1 && concerns_one_write(&err) => {
                log::warn!(
                    "journal: a group of {} writes was rolled back ({}); retrying them one by one",
                    group.len(),
                    ErrorChain(&err)
                );
                for request in group {
                    let single = vec![request];
                    match self.attempt(&single).await {
                        Ok(outcomes) => self.reply(single, outcomes).await,
                        Err(failure) => self.fail(single, failure),
                    }
                }
            }
            Err(failure) => self.fail(group, failure),
        }
    }

    /// Replies to every write of `group` with its error.
    fn fail(&mut self, group: Vec<WriteRequest>, failure: Failure) {
        if let Failure::RolledBack(err) = &failure
            && let Some(altered) = schema::altered("a write was rolled back", err)
        {
            log::error!(
                "journal: a group of {} writes failed: {altered}",
                group.len()
            );
            Counters::add(&self.counters.rejected, group.len() as u64);
            for request in group {
                let _ = request.reply.send(Err(altered.clone()));
            }
            return;
        }
        let message = match &failure {
            Failure::RolledBack(err) => {
                format!(
                    "not stored, the transaction was rolled back: {}",
                    ErrorChain(err)
                )
            }
            Failure::Unknown(cause) => {
                self.connection = None; // broken, or in an unknown state
                format!(
                    "{cause}; the commit's outcome is unknown, so it may or may not be stored: \
                     re-read the stream before going on"
                )
            }
        };
        log::warn!(
            "journal: a group of {} writes failed: {message}",
            group.len()
        );
        Counters::add(&self.counters.rejected, group.len() as u64);
        for request in group {
            let error = request.error(&message);
            let _ = request.reply.send(Err(error));
        }
    }

    /// Sends the group's transaction and reads its answers.
    async fn attempt(&mut self, group: &[WriteRequest]) -> Result<Vec<Outcome>, Failure> {
        let Some(connection) = &self.connection else {
            return Err(Failure::Unknown("no connection".into()));
        };
        let steps = plan(group);
        let notify = group
            .iter()
            .any(|request| request.op.is_tagged())
            .then_some(self.connector.sql.schema.as_str());
        let transaction = transact(connection, group, &steps, notify);
        match tokio::time::timeout(self.options.config.commit_timeout, transaction).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Unknown(format!(
                "no answer from PostgreSQL within {:?}",
                self.options.config.commit_timeout
            ))),
        }
    }

    /// Replies after a commit: reads the highest seq of the streams whose appends the
    /// fence refused, so that each loser learns where its stream is.
    async fn reply(&mut self, group: Vec<WriteRequest>, outcomes: Vec<Outcome>) {
        Counters::add(&self.counters.transactions, 1);
        let tagged = group
            .iter()
            .zip(&outcomes)
            .any(|(request, outcome)| request.op.is_tagged() && matches!(outcome, Outcome::Done));
        if tagged {
            self.signal.notify();
        }
        let refused: Vec<&str> = group
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| matches!(outcome, Outcome::Conflict))
            .map(|(request, _)| request.id.as_str())
            .collect();
        let highest = if refused.is_empty() {
            Ok(HashMap::new())
        } else {
            self.highest_of(&refused).await
        };
        for (request, outcome) in group.into_iter().zip(outcomes) {
            let result = match outcome {
                Outcome::Done => {
                    if let WriteOp::Append { payloads, .. } = &request.op {
                        Counters::add(&self.counters.appends, 1);
                        Counters::add(&self.counters.events, payloads.len() as u64);
                    }
                    Ok(())
                }
                Outcome::Conflict => Err(conflict(&request, &highest)),
                Outcome::Refused(err) => Err(err),
            };
            if result.is_err() {
                Counters::add(&self.counters.rejected, 1);
            }
            // A caller that dropped its future has left; the write stands regardless.
            let _ = request.reply.send(result);
        }
    }

    /// The highest seqs of `ids` as committed now (a stream without a row has 0).
    async fn highest_of(&mut self, ids: &[&str]) -> Result<HashMap<String, u64>, JournalError> {
        let Some(connection) = &self.connection else {
            return Err(JournalError::storage(None, "no connection"));
        };
        let rows = connection
            .client
            .query(&connection.highest_of, &[&ids])
            .await
            .map_err(|err| {
                if is_connection_lost(&err) {
                    self.connection = None;
                }
                db_error(None, "cannot read the highest seq", &err)
            })?;
        let mut highest = HashMap::with_capacity(rows.len());
        for row in rows {
            let read = (|| Ok::<_, tokio_postgres::Error>((row.try_get(0)?, row.try_get(1)?)))();
            let (id, raw): (String, i64) =
                read.map_err(|err| db_error(None, "cannot read the highest seq", &err))?;
            let seq = PersistenceId::new(id.clone())
                .map_err(JournalError::from)
                .and_then(|pid| seq_from_sql(&pid, raw, 0))
                .map_err(|err| JournalError::storage(None, err))?;
            highest.insert(id, seq);
        }
        Ok(highest)
    }
}

/// The conflict error of a refused append, with its stream's highest seq.
fn conflict(
    request: &WriteRequest,
    highest: &Result<HashMap<String, u64>, JournalError>,
) -> JournalError {
    let WriteOp::Append { first_seq, .. } = &request.op else {
        return request.error("refused");
    };
    match highest {
        Ok(highest) => JournalError::Conflict {
            persistence_id: request.id.clone(),
            first_seq: *first_seq,
            highest_seq: highest.get(request.id.as_str()).copied().unwrap_or(0),
        },
        Err(err) => request.error(format!(
            "not stored (another writer got there first), but its highest seq is unknown: {err}"
        )),
    }
}

/// Whether a rolled-back group's error may concern one of its writes alone (a constraint,
/// a value, a deadlock or serialization failure), so that retrying them one by one helps.
fn concerns_one_write(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        let code = code.code();
        ["23", "22", "40", "54"]
            .iter()
            .any(|class| code.starts_with(class))
    })
}

/// The steps of `group`'s transaction, in arrival order: each run of appends becomes as
/// many append steps as it has appends to its busiest stream (the n-th append to a stream
/// goes into the n-th step), each delete or snapshot a step of its own.
fn plan(group: &[WriteRequest]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut run: Vec<Vec<usize>> = Vec::new();
    let mut seen: HashMap<&PersistenceId, usize> = HashMap::new();
    let flush = |run: &mut Vec<Vec<usize>>,
                 seen: &mut HashMap<&PersistenceId, usize>,
                 steps: &mut Vec<Step>| {
        for mut appends in run.drain(..) {
            // Streams in a stable order: writers on several nodes then take the rows'
            // locks in the same order, which keeps them from deadlocking.
            appends.sort_by(|&a, &b| group[a].id.cmp(&group[b].id));
            steps.push(Step::Appends(appends));
        }
        seen.clear();
    };
    for (index, request) in group.iter().enumerate() {
        match request.op {
            WriteOp::Append { .. } => {
                let round = seen.entry(&request.id).or_insert(0);
                if *round == run.len() {
                    run.push(Vec::new());
                }
                run[*round].push(index);
                *round += 1;
            }
            WriteOp::DeleteTo { .. } | WriteOp::SaveSnapshot(_) => {
                flush(&mut run, &mut seen, &mut steps);
                steps.push(Step::Single(index));
            }
        }
    }
    flush(&mut run, &mut seen, &mut steps);
    steps
}

/// The parameters of one step's statement, borrowed from the group.
// A transaction has a few steps: boxing the append's vectors would save nothing worth it.
#[allow(clippy::large_enum_variant)]
enum StepParams<'a> {
    /// One row per append: stream, the seq it follows, its last seq; one row per event:
    /// the append's row number (from 1), seq, payload.
    Appends {
        ids: Vec<&'a str>,
        prevs: Vec<i64>,
        lasts: Vec<i64>,
        rows: Vec<i64>,
        seqs: Vec<i64>,
        payloads: Vec<&'a [u8]>,
        codecs: Vec<i16>,
        names: Vec<&'a str>,
        versions: Vec<i64>,
        /// One row per tag of an event: the append's row number, the event's seq, the tag,
        /// the stream's slice.
        tag_rows: Vec<i64>,
        tag_seqs: Vec<i64>,
        tags: Vec<&'a str>,
        slices: Vec<i16>,
    },
    DeleteTo {
        id: &'a str,
        to_seq: i64,
    },
    SaveSnapshot {
        id: &'a str,
        seq: i64,
        payload: &'a [u8],
        codec: i16,
        name: &'a str,
        version: i64,
    },
}

impl<'a> StepParams<'a> {
    fn new(group: &'a [WriteRequest], step: &Step) -> Self {
        let appends = match step {
            Step::Appends(appends) => appends,
            Step::Single(index) => {
                let request = &group[*index];
                let id = request.id.as_str();
                return match &request.op {
                    // Checked against MAX_SEQ, so it fits; a larger bound means "all".
                    WriteOp::SaveSnapshot(snapshot) => Self::SaveSnapshot {
                        id,
                        seq: snapshot.seq as i64,
                        payload: &snapshot.payload,
                        codec: i16::from(snapshot.manifest.codec_id()),
                        name: snapshot.manifest.name(),
                        version: i64::from(snapshot.manifest.version()),
                    },
                    WriteOp::DeleteTo { to_seq } => Self::DeleteTo {
                        id,
                        to_seq: i64::try_from(*to_seq).unwrap_or(i64::MAX),
                    },
                    // plan() makes appends into append steps only.
                    WriteOp::Append { .. } => Self::DeleteTo { id, to_seq: 0 },
                };
            }
        };
        let (mut ids, mut prevs, mut lasts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut rows, mut seqs, mut payloads) = (Vec::new(), Vec::new(), Vec::new());
        let (mut codecs, mut names, mut versions) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tag_rows, mut tag_seqs) = (Vec::new(), Vec::new());
        let (mut tag_names, mut slices) = (Vec::new(), Vec::new());
        for (row, &index) in (1i64..).zip(appends) {
            let request = &group[index];
            let WriteOp::Append {
                first_seq,
                payloads: events,
                manifest,
                tags,
            } = &request.op
            else {
                continue; // plan() puts only appends here
            };
            // Below SLICES (1024), so it fits an i16.
            let slice = slice_of(&request.id) as i16;
            for (seq, entry_tags) in (*first_seq as i64..).zip(tags) {
                for tag in entry_tags {
                    tag_rows.push(row);
                    tag_seqs.push(seq);
                    tag_names.push(tag.as_str());
                    slices.push(slice);
                }
            }
            // check_append bounded every seq by MAX_SEQ, so they fit an i64.
            let first = *first_seq as i64;
            ids.push(request.id.as_str());
            codecs.push(i16::from(manifest.codec_id()));
            names.push(manifest.name());
            versions.push(i64::from(manifest.version()));
            prevs.push(first - 1);
            lasts.push(first + events.len() as i64 - 1);
            for (seq, payload) in (first..).zip(events) {
                rows.push(row);
                seqs.push(seq);
                payloads.push(payload.as_slice());
            }
        }
        Self::Appends {
            ids,
            prevs,
            lasts,
            rows,
            seqs,
            payloads,
            codecs,
            names,
            versions,
            tag_rows,
            tag_seqs,
            tags: tag_names,
            slices,
        }
    }

    fn as_params(&self) -> Vec<&(dyn ToSql + Sync)> {
        match self {
            Self::Appends {
                ids,
                prevs,
                lasts,
                rows,
                seqs,
                payloads,
                codecs,
                names,
                versions,
                tag_rows,
                tag_seqs,
                tags,
                slices,
            } => vec![
                ids, prevs, lasts, rows, seqs, payloads, codecs, names, versions, tag_rows,
                tag_seqs, tags, slices,
            ],
            Self::DeleteTo { id, to_seq } => vec![id, to_seq],
            Self::SaveSnapshot {
                id,
                seq,
                payload,
                codec,
                name,
                version,
            } => vec![id, seq, payload, codec, name, version],
        }
    }
}

/// What one step's statement answered.
enum Answer {
    /// An append step: the row numbers (from 1) of the appends that were stored.
    Stored(Vec<i64>),
    /// A snapshot step: the stream's highest seq.
    Highest(i64),
    Nothing,
}

type StepFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, tokio_postgres::Error>> + 'a>>;

/// Sends `BEGIN`, the steps, the notification (with `notify`'s payload, if any) and `COMMIT`
/// pipelined, and makes the answers into outcomes.
async fn transact(
    connection: &WriteConnection,
    group: &[WriteRequest],
    steps: &[Step],
    notify: Option<&str>,
) -> Result<Vec<Outcome>, Failure> {
    let client = &connection.client;
    let params: Vec<StepParams<'_>> = steps.iter().map(|s| StepParams::new(group, s)).collect();
    let param_lists: Vec<Vec<&(dyn ToSql + Sync)>> =
        params.iter().map(StepParams::as_params).collect();

    let mut futures: Vec<StepFuture<'_>> = Vec::with_capacity(steps.len() + 2);
    futures.push(Box::pin(async {
        client
            .execute(&connection.begin, &[])
            .await
            .map(|_| Answer::Nothing)
    }));
    for (step, list) in params.iter().zip(&param_lists) {
        let list = list.as_slice();
        futures.push(match step {
            StepParams::Appends { .. } => Box::pin(async move {
                let rows = client.query(&connection.append, list).await?;
                let mut stored = Vec::with_capacity(rows.len());
                for row in rows {
                    stored.push(row.try_get(0)?);
                }
                Ok(Answer::Stored(stored))
            }),
            StepParams::DeleteTo { .. } => Box::pin(async move {
                client.execute(&connection.delete_to, list).await?;
                Ok(Answer::Nothing)
            }),
            StepParams::SaveSnapshot { .. } => Box::pin(async move {
                let row = client.query_one(&connection.save_snapshot, list).await?;
                Ok(Answer::Highest(row.try_get(0)?))
            }),
        });
    }
    if let Some(payload) = notify {
        futures.push(Box::pin(async move {
            let params: [&(dyn ToSql + Sync); 2] = [&TAGS_CHANNEL, &payload];
            client.execute(&connection.notify, &params).await?;
            Ok(Answer::Nothing)
        }));
    }
    futures.push(Box::pin(commit(connection)));
    let answers = pipeline(futures).await;

    // Any error: the transaction did not commit as sent. A statement refused by the server
    // (on a live connection) aborted it, and the pipelined COMMIT rolled it back.
    let mut rolled_back = None;
    let mut answers_ok = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            Ok(answer) => answers_ok.push(answer),
            Err(err) if is_connection_lost(&err) || err.as_db_error().is_none() => {
                return Err(Failure::Unknown(format!(
                    "the connection to PostgreSQL failed: {}",
                    ErrorChain(&err)
                )));
            }
            Err(err) => {
                rolled_back.get_or_insert(err);
            }
        }
    }
    if let Some(err) = rolled_back {
        return Err(Failure::RolledBack(err));
    }

    let mut outcomes: Vec<Option<Outcome>> = group.iter().map(|_| None).collect();
    // answers_ok: BEGIN, one per step, perhaps the notification, COMMIT.
    for (step, answer) in steps.iter().zip(answers_ok.into_iter().skip(1)) {
        match (step, answer) {
            (Step::Appends(appends), Answer::Stored(stored)) => {
                for (row, &index) in (1i64..).zip(appends) {
                    outcomes[index] = Some(if stored.contains(&row) {
                        Outcome::Done
                    } else {
                        Outcome::Conflict
                    });
                }
            }
            (Step::Single(index), Answer::Highest(raw)) => {
                let request = &group[*index];
                let checked = match &request.op {
                    WriteOp::SaveSnapshot(snapshot) => seq_from_sql(&request.id, raw, 0)
                        .and_then(|highest| check_snapshot(&request.id, snapshot.seq, highest)),
                    _ => Ok(()),
                };
                outcomes[*index] = Some(match checked {
                    Ok(()) => Outcome::Done,
                    Err(err) => Outcome::Refused(err),
                });
            }
            (Step::Single(index), Answer::Nothing) => outcomes[*index] = Some(Outcome::Done),
            _ => {}
        }
    }
    Ok(outcomes
        .into_iter()
        .zip(group)
        .map(|(outcome, request)| {
            // Every write is in exactly one step; a gap would be a bug of this module.
            outcome.unwrap_or_else(|| Outcome::Refused(request.error("not planned (a bug)")))
        })
        .collect())
}

/// Sends `COMMIT` and waits for its answer. The server confirms a commit with
/// `CommandComplete` and then says it is ready for the next command; a session ended in
/// between (`pg_terminate_backend` is noticed right after a commit, when interrupts are
/// allowed again) leaves an error where the second message would be, yet the commit was
/// confirmed: that counts as committed.
async fn commit(connection: &WriteConnection) -> Result<Answer, tokio_postgres::Error> {
    run_commit(&connection.client, &connection.commit)
        .await
        .map(|()| Answer::Nothing)
}

/// Runs the prepared `COMMIT` statement `commit` on `client`, as [`commit`] says: a session
/// ended after the server confirmed the commit counts as committed.
pub(super) async fn run_commit(
    client: &Client,
    commit: &Statement,
) -> Result<(), tokio_postgres::Error> {
    let no_params: [&(dyn ToSql + Sync); 0] = [];
    let stream = client.query_raw(commit, no_params).await?;
    let mut stream = std::pin::pin!(stream);
    loop {
        match stream.as_mut().try_next().await {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(()),
            Err(_) if stream.rows_affected().is_some() => return Ok(()),
            Err(err) => return Err(err),
        }
    }
}

/// Polls `futures` in their order until all are done, so that their requests go out in that
/// order (each sends on its first poll) and travel together: one round trip for all.
pub(super) async fn pipeline<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + '_>>>) -> Vec<T> {
    let mut results: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, result) in futures.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *result = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}

/// Waits for the writers just answered to send their next writes, so that they join this
/// group instead of forming a small one of their own while it commits (64 appenders would
/// otherwise settle into alternating groups of, say, 40 and 24): until `expected` writes
/// are in the group, as long as they keep arriving (each within [`LINGER_GAP`] of the
/// previous one, the first within [`LINGER_FIRST`]), and never longer than half the last
/// commit took. Only called when the last commit answered more than one write: a lone
/// sequential writer never waits.
async fn linger(
    requests: &mut mpsc::Receiver<WriteRequest>,
    group: &mut Group,
    carried: &mut Option<WriteRequest>,
    expected: usize,
    last_commit: Duration,
) {
    let start = Instant::now();
    let deadline = start + last_commit / 2;
    let mut last_arrival = None;
    while group.requests.len() < expected {
        match requests.try_recv() {
            Ok(request) => {
                if let Some(over) = group.push(request) {
                    *carried = Some(over);
                    return;
                }
                last_arrival = Some(Instant::now());
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                let now = Instant::now();
                let quiet = match last_arrival {
                    None => now - start > LINGER_FIRST,
                    Some(at) => now - at > LINGER_GAP,
                };
                if quiet || now > deadline {
                    return;
                }
                // Lets the connections' tasks on this runtime run, and other threads.
                tokio::task::yield_now().await;
                std::thread::yield_now();
            }
        }
    }
}

/// The writes of the next transaction, within the batch bounds, and small enough together
/// that each of its steps fits one protocol message (a step holds at most the whole group).
struct Group {
    requests: Vec<WriteRequest>,
    events: usize,
    bytes: usize,
    message_bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

impl Group {
    fn new(first: WriteRequest, options: &PostgresConfig) -> Self {
        Self {
            events: first.op.events(),
            bytes: first.op.bytes(),
            message_bytes: message_bytes(&first.id, &first.op),
            requests: vec![first],
            max_events: options.max_batch_events,
            max_bytes: options.max_batch_bytes,
        }
    }

    /// Adds `request`, or hands it back if it would cross a bound.
    fn push(&mut self, request: WriteRequest) -> Option<WriteRequest> {
        let (events, bytes) = (request.op.events(), request.op.bytes());
        let message = self
            .message_bytes
            .saturating_add(message_bytes(&request.id, &request.op));
        if self.events + events > self.max_events
            || self.bytes + bytes > self.max_bytes
            || !fits_one_message(message)
        {
            return Some(request);
        }
        self.events += events;
        self.bytes += bytes;
        self.message_bytes = message;
        self.requests.push(request);
        None
    }
}

/// Refuses a write too large for one protocol message, before it is sent: the server would
/// drop the connection, leaving its outcome unknown (though nothing would be stored).
pub(super) fn check_message(id: &PersistenceId, op: &WriteOp) -> Result<(), JournalError> {
    let bytes = message_bytes(id, op);
    if fits_one_message(bytes) {
        return Ok(());
    }
    Err(JournalError::invalid(
        id,
        format!(
            "an append of {} payload bytes needs a message of about {bytes} bytes, more than \
             the {} PostgreSQL accepts in one (send it in smaller appends)",
            op.bytes(),
            MAX_MESSAGE_BYTES
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::Semaphore;

    use super::*;

    fn append(id: &str, payloads: Vec<Vec<u8>>) -> WriteRequest {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        WriteRequest {
            id: PersistenceId::new(id).unwrap(),
            op: WriteOp::Append {
                first_seq: 1,
                payloads,
                manifest: Manifest::raw(),
                tags: Vec::new(),
            },
            reply: oneshot::channel().0,
            _permit: permit,
        }
    }

    #[test]
    fn a_group_never_needs_a_message_larger_than_the_server_accepts() {
        // Batch bounds far above the message limit: only the message bound splits.
        let options = PostgresConfig {
            max_batch_bytes: usize::MAX,
            max_batch_events: usize::MAX,
            ..PostgresConfig::default()
        };
        // Zeroed memory the allocator maps lazily: nothing of it is written.
        let half = || vec![vec![0u8; 300 << 20], vec![0u8; 300 << 20]];
        let mut group = Group::new(append("a", half()), &options);
        assert!(group.push(append("b", half())).is_some(), "1200 MiB: over");
        assert!(group
            .push(append("c", vec![vec![0u8; 400 << 20]]))
            .is_none());
        assert_eq!(group.requests.len(), 2);
        assert!(fits_one_message(group.message_bytes));
        assert!(group.push(append("d", vec![vec![0u8; 30 << 20]])).is_some());
        // Small appends group by the batch bounds as before.
        let mut small = Group::new(append("a", vec![vec![1]]), &PostgresConfig::default());
        assert!(small.push(append("b", vec![vec![2]; 5])).is_none());
        assert_eq!((small.events, small.bytes), (6, 6));
    }

    #[test]
    fn the_message_bound_counts_every_byte_the_encoding_sends() {
        let request = append("stream", vec![vec![0u8; 100], Vec::new()]);
        // id (4 + 6), two seqs (2 * 12) and the manifest (3 * 8 + 4 + its name, "" here); per
        // event 32 bytes besides its payload.
        assert_eq!(
            message_bytes(&request.id, &request.op),
            4 + 6 + 24 + 28 + 2 * 32 + 100
        );
        // Per tag of an event: 38 bytes besides the tag's name (padded to 4 bytes).
        let mut tagged = append("stream", vec![Vec::new()]);
        if let WriteOp::Append { tags, .. } = &mut tagged.op {
            *tags = vec![vec![crate::journal::Tag::from_static("ab")]];
        }
        assert_eq!(
            message_bytes(&tagged.id, &tagged.op),
            4 + 6 + 24 + 28 + 32 + 38 + 2
        );
        assert!(fits_one_message(MAX_MESSAGE_BYTES - STEP_OVERHEAD));
        assert!(!fits_one_message(MAX_MESSAGE_BYTES - STEP_OVERHEAD + 1));
    }
}
