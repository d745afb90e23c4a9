//! The PostgreSQL journal across a server restart (feature `postgres`), in a test binary of
//! its own so that no other test runs while the server is down.
//!
//! The restart is a shell command from `ACTIX_DELIVERY_POSTGRES_RESTART`, e.g. on Debian as
//! root: `pg_ctlcluster --skip-systemctl-redirect -m fast 15 main restart`. Without it the
//! test is skipped (and says so on stderr): a developer's server is never restarted by
//! surprise.
#![cfg(feature = "postgres")]

mod postgres_support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix_delivery::journal::PersistenceId;
use postgres_support::{journal_named, options, unique};

const RESTART_VAR: &str = "ACTIX_DELIVERY_POSTGRES_RESTART";

/// Restarts the server while 16 appenders run: appends in flight fail with storage errors
/// (never `Ok` unless committed), the journal reconnects, and appends work afterwards.
#[tokio::test]
async fn appends_go_on_after_a_server_restart() {
    let Ok(command) = std::env::var(RESTART_VAR) else {
        // Past the test harness's capture, so that the skip is visible.
        let _ = writeln!(
            std::io::stderr(),
            "appends_go_on_after_a_server_restart: SKIPPED, {RESTART_VAR} is not set (a shell \
             command that restarts the PostgreSQL server, e.g. \
             `pg_ctlcluster --skip-systemctl-redirect -m fast 15 main restart`)"
        );
        return;
    };
    let name = unique("restart");
    let journal = journal_named(
        &name,
        options()
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(250))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await;
    let streams: Vec<_> = (0..16)
        .map(|s| PersistenceId::new(unique(&format!("restart{s}"))).unwrap())
        .collect();
    let stop = AtomicBool::new(false);
    let restarter = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let appends_before = journal.stats().appends;
        let (done, restarted) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let status = std::process::Command::new("sh")
                .args(["-c", &command])
                .status();
            let _ = done.send(status);
        });
        let started = Instant::now();
        let status = restarted.await.unwrap().expect("run the restart command");
        assert!(status.success(), "{RESTART_VAR} failed: {status}");
        let took = started.elapsed();
        // Then until the appenders have gone on for a while.
        let after = journal.stats().appends;
        let deadline = Instant::now() + Duration::from_secs(20);
        while journal.stats().appends < after + 200 {
            assert!(Instant::now() < deadline, "no appends after the restart");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::Relaxed);
        (appends_before, took)
    };
    let (seen, (appends_before, took)) = futures_util::future::join(
        postgres_support::run_appenders(&journal, &streams, &stop),
        restarter,
    )
    .await;
    assert!(
        appends_before > 0,
        "nothing was appended before the restart"
    );
    let errors: Vec<&String> = seen.iter().flat_map(|s| &s.errors).collect();
    assert!(
        !errors.is_empty(),
        "no append failed: did the server restart?"
    );
    for message in &errors {
        assert!(
            message.contains("may or may not be stored") || message.contains("not stored"),
            "{message}"
        );
    }
    let committed_unacknowledged =
        postgres_support::check_appended(&journal, &streams, &seen).await;
    for (s, seen) in seen.iter().enumerate() {
        assert!(
            seen.acked.last() > seen.failed.last(),
            "stream {s}: no append succeeded after its last failure: {seen:?}"
        );
    }
    let stats = journal.stats();
    assert!(stats.reconnects >= 1, "{stats:?}");
    println!(
        "restart took {took:?}: {} appends failed ({committed_unacknowledged} of them committed \
         nevertheless), {} acknowledged, {} reconnects",
        errors.len(),
        seen.iter().map(|s| s.acked.len()).sum::<usize>(),
        stats.reconnects
    );
    journal.close().await;
}
