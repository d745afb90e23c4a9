//! Says which feature-gated suites this build skipped and how to run them: `cargo test` lists
//! each as ignored, with the reason (a plain `cargo test` would otherwise run them as 0 tests,
//! silently). Run with `--ignored`, each fails with the same explanation.

#[cfg(not(feature = "postgres"))]
#[test]
#[ignore = "skipped: the PostgreSQL suites (`features`: postgres, the PostgreSQL parts of journal, sharding and schema_evolution; `processes`: durable_lease, postgres_nodes, work_pulling_crash, projection::postgres; the test binary `postgres_restart`) need `--features postgres` and a server on 127.0.0.1:5432; run `cargo test --all-features` (see the README's Tests section)"]
fn postgres_suites() {
    panic!("built without the `postgres` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "nats"))]
#[test]
#[ignore = "skipped: the NATS suites (`features`: nats, work_pulling_nats; `processes`: nats_failover, sharding_crash) need `--features nats` and a server with JetStream on 127.0.0.1:4222; run `cargo test --all-features` (see the README's Tests section)"]
fn nats_suites() {
    panic!("built without the `nats` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "tls"))]
#[test]
#[ignore = "skipped: the TLS tests (`features`: remote_security, postgres; the TCP suites over mutual TLS) need `--features tls`; run `cargo test --all-features`"]
fn tls_tests() {
    panic!("built without the `tls` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "metrics"))]
#[test]
#[ignore = "skipped: the metrics tests (the test binary `metrics`, the /metrics scrape in `processes`: actix_web) need `--features metrics`; run `cargo test --all-features`"]
fn metrics_tests() {
    panic!("built without the `metrics` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "tracing"))]
#[test]
#[ignore = "skipped: the tracing tests (`features`: tracing) need `--features tracing`; run `cargo test --all-features`"]
fn tracing_tests() {
    panic!("built without the `tracing` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "admin"))]
#[test]
#[ignore = "skipped: the admin console's tests (`features`: admin, its browser test in headless Chromium) need `--features admin`; run `cargo test --all-features`"]
fn admin_tests() {
    panic!("built without the `admin` feature: run `cargo test --all-features`");
}
