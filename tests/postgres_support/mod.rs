//! Test support for the PostgreSQL journal: where the server is, a journal in the tests'
//! own schema, and an admin connection for what the tests do behind the journal's back.
//!
//! The server comes from `ACTIX_DELIVERY_POSTGRES` (a libpq `key=value` string or a
//! `postgresql://` URL), default `host=127.0.0.1 port=5432 user=postgres dbname=test`. The
//! tests kill connections and may restart the server, so they refuse any host but the
//! loopback interface or a Unix socket.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_delivery::journal::{PostgresJournal, PostgresOptions};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

/// The environment variable with the connection string.
pub const URL_VAR: &str = "ACTIX_DELIVERY_POSTGRES";
/// The connection string without it.
pub const DEFAULT_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";
/// The schema the tests' journals share (every case uses fresh stream names).
pub const SCHEMA: &str = "actix_delivery_test";

/// The connection string, checked to point at this machine.
pub fn url() -> String {
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let config = Config::from_str(&url)
        .unwrap_or_else(|err| panic!("{URL_VAR} does not parse as a connection string: {err}"));
    for host in config.get_hosts() {
        if let Host::Tcp(name) = host {
            let local = name == "localhost" || IpAddr::from_str(name).is_ok_and(|ip| ip.is_loopback());
            assert!(
                local,
                "{URL_VAR} names host {name}: these tests kill connections and may restart the \
                 server, so they run only against 127.0.0.1, ::1, localhost or a Unix socket"
            );
        }
    }
    for addr in config.get_hostaddrs() {
        assert!(addr.is_loopback(), "{URL_VAR} names hostaddr {addr}: loopback only");
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

/// The options of the tests' journals: the tests' schema.
pub fn options() -> PostgresOptions {
    PostgresOptions::default().schema(SCHEMA)
}

/// A journal on the tests' schema.
pub async fn journal() -> PostgresJournal {
    PostgresJournal::connect_with(&url(), options())
        .await
        .unwrap_or_else(|err| {
            panic!("cannot open the PostgreSQL journal ({URL_VAR}, default {DEFAULT_URL:?}): {err}")
        })
}

/// A journal whose connections carry `application_name`.
pub async fn journal_named(application_name: &str, options: PostgresOptions) -> PostgresJournal {
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
