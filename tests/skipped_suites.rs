//! Says which feature-gated suites this build skipped and how to run them: `cargo test` lists
//! each as ignored, with the reason (a plain `cargo test` would otherwise run them as 0 tests,
//! silently). Run with `--ignored`, each fails with the same explanation.

#[cfg(not(feature = "postgres"))]
#[test]
#[ignore = "skipped: the PostgreSQL suites (tests/postgres*.rs, the PostgreSQL part of tests/projection/) need `--features postgres` and a server on 127.0.0.1:5432; run `cargo test --all-features` (see the README's Tests section)"]
fn postgres_suites() {
    panic!("built without the `postgres` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "nats"))]
#[test]
#[ignore = "skipped: the NATS suites (tests/nats*.rs, tests/work_pulling_nats.rs) need `--features nats` and a server with JetStream on 127.0.0.1:4222; run `cargo test --all-features` (see the README's Tests section)"]
fn nats_suites() {
    panic!("built without the `nats` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "tls"))]
#[test]
#[ignore = "skipped: the TLS tests (tests/remote_security.rs, tests/postgres.rs) need `--features tls`; run `cargo test --all-features`"]
fn tls_tests() {
    panic!("built without the `tls` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "metrics"))]
#[test]
#[ignore = "skipped: the metrics tests (tests/metrics.rs, the /metrics scrape in tests/actix_web.rs) need `--features metrics`; run `cargo test --all-features`"]
fn metrics_tests() {
    panic!("built without the `metrics` feature: run `cargo test --all-features`");
}

#[cfg(not(feature = "tracing"))]
#[test]
#[ignore = "skipped: the tracing tests (tests/tracing.rs) need `--features tracing`; run `cargo test --all-features`"]
fn tracing_tests() {
    panic!("built without the `tracing` feature: run `cargo test --all-features`");
}
