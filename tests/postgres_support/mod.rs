//! Test support for the PostgreSQL journal: where the server is, a journal in the tests'
//! own schema, and an admin connection for what the tests do behind the journal's back.
//!
//! The server comes from `ACTIX_DELIVERY_POSTGRES` (a libpq `key=value` string or a
//! `postgresql://` URL), default `host=127.0.0.1 port=5432 user=postgres dbname=test`. The
//! tests kill connections and may restart the server, so they refuse any host but the
//! loopback interface or a Unix socket.
#![allow(dead_code)] // each test binary uses a different subset

pub mod proxy;

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix_delivery::journal::{
    Journal, JournalError, PersistenceId, PostgresJournal, PostgresOptions, PostgresOptionsBuilder,
};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

/// The environment variable with the connection string.
pub const URL_VAR: &str = "ACTIX_DELIVERY_POSTGRES";
/// The connection string without it.
pub const DEFAULT_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";
/// The schema the tests' journals share (every case uses fresh stream names), named after
/// the journal's schema version: code of another version (a branch, another developer's
/// run) on the same server then never migrates, or refuses, the tables of this one.
pub const SCHEMA: &str = "actix_delivery_test_v3";

/// The connection string, checked to point at this machine.
pub fn url() -> String {
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let config = Config::from_str(&url)
        .unwrap_or_else(|err| panic!("{URL_VAR} does not parse as a connection string: {err}"));
    for host in config.get_hosts() {
        if let Host::Tcp(name) = host {
            let local =
                name == "localhost" || IpAddr::from_str(name).is_ok_and(|ip| ip.is_loopback());
            assert!(
                local,
                "{URL_VAR} names host {name}: these tests kill connections and may restart the \
                 server, so they run only against 127.0.0.1, ::1, localhost or a Unix socket"
            );
        }
    }
    for addr in config.get_hostaddrs() {
        assert!(
            addr.is_loopback(),
            "{URL_VAR} names hostaddr {addr}: loopback only"
        );
    }
    url
}

/// The connection string with `application_name` set, so that a test can find (and kill)
/// exactly the connections of its own journal.
pub fn url_named(application_name: &str) -> String {
    let url = url();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}application_name={application_name}")
    } else {
        format!("{url} application_name={application_name}")
    }
}

/// A name no other test (or run) uses: `<prefix>_<pid>_<n>`, a valid identifier.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// The options of the tests' journals, to build on: the tests' schema.
pub fn options() -> PostgresOptionsBuilder {
    PostgresOptions::builder().schema(SCHEMA)
}

/// A journal on the tests' schema.
pub async fn journal() -> PostgresJournal {
    PostgresJournal::connect_with(&url(), options().build().unwrap())
        .await
        .unwrap_or_else(|err| {
            panic!("cannot open the PostgreSQL journal ({URL_VAR}, default {DEFAULT_URL:?}): {err}")
        })
}

/// A journal whose connections carry `application_name`, with `options` built.
pub async fn journal_named(
    application_name: &str,
    options: PostgresOptionsBuilder,
) -> PostgresJournal {
    let options = options.build().unwrap();
    PostgresJournal::connect_with(&url_named(application_name), options)
        .await
        .unwrap_or_else(|err| panic!("cannot open the PostgreSQL journal: {err}"))
}

/// A plain connection for the tests' own SQL, driven by the current runtime.
pub async fn admin() -> Client {
    let (client, connection) = tokio_postgres::connect(&url(), NoTls)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to PostgreSQL ({URL_VAR}): {err}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Terminates every server session whose `application_name` is `name`; returns how many.
pub async fn terminate(admin: &Client, name: &str) -> i64 {
    let row = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .await
        .expect("terminate the journal's sessions");
    row.get(0)
}

/// What one of [`run_appenders`]'s appenders saw, as `(first, last)`: the batches
/// acknowledged, the batches whose append failed, and of those the ones the journal said
/// were definitely not stored (see [`says_not_stored`]).
#[derive(Debug, Default)]
pub struct Appended {
    pub acked: Vec<(u64, u64)>,
    pub failed: Vec<(u64, u64)>,
    pub not_stored: Vec<(u64, u64)>,
    pub errors: Vec<String>,
}

/// Whether a storage error's message says its write was definitely not stored (rather than
/// "may or may not be stored", an unknown outcome).
pub fn says_not_stored(message: &str) -> bool {
    message.contains("not stored") && !message.contains("may or may not be stored")
}

/// The payload of event `seq` of stream `s`, appended in the batch `first..=last`.
pub fn batch_payload(s: usize, seq: u64, first: u64, last: u64) -> Vec<u8> {
    let mut bytes = format!("{s}:{seq}:{first}:{last}:").into_bytes();
    bytes.extend((0..seq % 97).map(|i| (i as u8) ^ (s as u8)));
    bytes
}

/// `streams.len()` appenders, one per stream, append batches of 1 to 3 events until
/// `stop` says so, each awaiting its append before the next, as a persistent actor does.
/// After a failed append an appender recovers like one: it re-reads its stream's highest
/// seq (retrying while the database cannot be reached) and goes on from there. Any error
/// but [`JournalError::Storage`] fails the test (there is one writer per stream).
pub async fn run_appenders(
    journal: &impl Journal,
    streams: &[PersistenceId],
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<Appended> {
    let appenders = streams.iter().enumerate().map(|(s, id)| async move {
        let mut seen = Appended::default();
        let mut next = journal.highest_seq(id).await.expect("read the highest seq") + 1;
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let (first, last) = (next, next + (s as u64 + round) % 3);
            round += 1;
            let batch = (first..=last)
                .map(|seq| batch_payload(s, seq, first, last))
                .collect();
            match journal.append(id, first, batch).await {
                Ok(()) => {
                    seen.acked.push((first, last));
                    next = last + 1;
                }
                Err(JournalError::Storage { message, .. }) => {
                    seen.failed.push((first, last));
                    if says_not_stored(&message) {
                        seen.not_stored.push((first, last));
                    }
                    seen.errors.push(message);
                    next = loop {
                        match journal.highest_seq(id).await {
                            Ok(highest) => break highest + 1,
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    };
                }
                Err(other) => panic!("stream {s}: an append failed with {other}"),
            }
        }
        seen
    });
    futures_util::future::join_all(appenders).await
}

/// `(first, last)` of the batch a payload of [`batch_payload`] says it belongs to.
fn batch_of(payload: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(payload.get(..payload.len().min(64))?).ok()?;
    let mut fields = text.split(':').skip(2).map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// Checks what [`run_appenders`] left: each stream gapless from 1, every acknowledged batch stored
/// byte for byte, every stored event from a batch that was appended (acknowledged or failed), every
/// stored batch whole, none said to be not stored. Returns how many failed batches turned out to be
/// stored (committed, but the answer was lost).
pub async fn check_appended(
    journal: &impl Journal,
    streams: &[PersistenceId],
    seen: &[Appended],
) -> usize {
    let mut committed_unacknowledged = 0;
    for (s, (id, seen)) in streams.iter().zip(seen).enumerate() {
        let stored = journal
            .replay(id, 1, u64::MAX, usize::MAX)
            .await
            .expect("replay");
        let highest = journal.highest_seq(id).await.expect("highest seq");
        assert_eq!(
            stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=highest).collect::<Vec<_>>(),
            "stream {s}: not gapless"
        );
        let mut batch_at = std::collections::BTreeMap::new();
        for event in &stored {
            let batch = batch_of(&event.payload)
                .filter(|&(first, last)| event.payload == batch_payload(s, event.seq, first, last))
                .unwrap_or_else(|| panic!("stream {s}, seq {}: a foreign payload", event.seq));
            assert!(
                seen.acked.contains(&batch) || seen.failed.contains(&batch),
                "stream {s}, seq {}: stored from batch {batch:?}, which was never appended",
                event.seq
            );
            batch_at.insert(event.seq, batch);
        }
        let mut stored_batches: Vec<(u64, u64)> = batch_at.values().copied().collect();
        stored_batches.dedup();
        for &(first, last) in &stored_batches {
            for seq in first..=last {
                assert_eq!(
                    batch_at.get(&seq),
                    Some(&(first, last)),
                    "stream {s}: batch {first}..={last} stored in part"
                );
            }
            assert!(
                !seen.not_stored.contains(&(first, last)),
                "stream {s}: batch {first}..={last} is stored, but its append was reported \
                 definitely not stored"
            );
            if !seen.acked.contains(&(first, last)) {
                committed_unacknowledged += 1;
            }
        }
        for batch in &seen.acked {
            assert!(
                stored_batches.contains(batch),
                "stream {s}: acknowledged batch {batch:?} is not stored"
            );
        }
    }
    committed_unacknowledged
}
