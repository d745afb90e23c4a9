//! The meters of the SQLite and PostgreSQL journals (feature `metrics`; the memory journal's
//! is beside its stats; the catalogue of names is in `telemetry::metrics`).

use std::time::Duration;

#[cfg(feature = "postgres")]
use crate::journal::postgres::PostgresStats;
#[cfg(feature = "sqlite")]
use crate::journal::sqlite::SqliteStats;
use crate::telemetry::metrics::meter;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::telemetry::metrics::record_seconds;

#[cfg(feature = "sqlite")]
meter! {
    /// A SQLite journal's metrics (published by its writer thread).
    SqliteMeter(SqliteStats, "journal") {
        counter appends: "actix_delivery_sqlite_appends_total",
        counter events: "actix_delivery_sqlite_events_total",
        counter transactions: "actix_delivery_sqlite_transactions_total",
        counter rejected: "actix_delivery_sqlite_rejected_total",
        counter folds: "actix_delivery_sqlite_folds_total",
        gauge queued: "actix_delivery_sqlite_queued",
        histogram commit_seconds: "actix_delivery_sqlite_commit_seconds",
        histogram commit_writes: "actix_delivery_sqlite_commit_writes",
    }
}

#[cfg(feature = "postgres")]
meter! {
    /// A PostgreSQL journal's metrics (published by its writer task).
    PostgresMeter(PostgresStats, "journal") {
        counter appends: "actix_delivery_postgres_appends_total",
        counter events: "actix_delivery_postgres_events_total",
        counter transactions: "actix_delivery_postgres_transactions_total",
        counter rejected: "actix_delivery_postgres_rejected_total",
        counter reconnects: "actix_delivery_postgres_reconnects_total",
        gauge queued: "actix_delivery_postgres_queued",
        histogram commit_seconds: "actix_delivery_postgres_commit_seconds",
        histogram commit_writes: "actix_delivery_postgres_commit_writes",
    }
}

/// A journal writer's commit histograms (the journals of features `sqlite` and `postgres`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! journal_transaction {
    ($meter:ident, $stats:ty) => {
        impl $meter {
            /// After a transaction: records it if it committed (`writes` in it, taking
            /// `took`), and publishes the counters.
            #[allow(clippy::cast_precision_loss)]
            pub(crate) fn transaction(
                &mut self,
                committed: Option<(usize, Duration)>,
                stats: &$stats,
            ) {
                if let Some((writes, took)) = committed {
                    record_seconds(&self.commit_seconds, took);
                    self.commit_writes.record(writes as f64);
                }
                self.publish(stats);
            }
        }
    };
}

#[cfg(feature = "sqlite")]
journal_transaction!(SqliteMeter, SqliteStats);
#[cfg(feature = "postgres")]
journal_transaction!(PostgresMeter, PostgresStats);
