//! The inspector on a PostgreSQL journal: a schema of each test's own, written by the
//! library's `PostgresJournal`, dropped at the end. The server is `ACTIX_DELIVERY_POSTGRES`
//! (`.ci/run` sets it; locally, e.g. `host=127.0.0.1 port=5432 user=postgres dbname=test`);
//! unset, the tests say so and skip.

use std::sync::Arc;

use actix_delivery::dead_letters::DeadLetterLimits;
use actix_delivery::journal::{slice_of, PostgresDeadLetters, PostgresJournal, PostgresOptions};
use serde_json::json;
use tokio_postgres::{Client, NoTls};

use crate::dead_letters::{keep_letters, lists_shows_and_deletes};
use crate::support::{id, run, write_fixture, Run};

const URL_VAR: &str = "ACTIX_DELIVERY_POSTGRES";

/// The server's connection string, or `None` (with a note) to skip.
fn server() -> Option<String> {
    let url = std::env::var(URL_VAR).ok();
    if url.is_none() {
        eprintln!("skipped: {URL_VAR} is not set (see .ci/run)");
    }
    url
}

/// A schema name no other test or run uses.
fn unique_schema(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// Runs the binary on `schema` of the server at `url`.
fn inspect(url: &str, schema: &str, args: &[&str]) -> Run {
    let mut all = vec!["--postgres", url, "--schema", schema];
    all.extend_from_slice(args);
    run(all)
}

async fn admin(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to PostgreSQL ({URL_VAR}): {err}"));
    actix_rt::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Drops `schema` when dropped (the test's tables go, whatever the test's outcome).
struct Dropped {
    url: String,
    schema: String,
}

impl Drop for Dropped {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                admin(&url)
                    .await
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await
            })
        })
        .join();
    }
}

/// The fixture's streams written by a `PostgresJournal` into a new schema of its own.
fn fixture_schema(url: &str, prefix: &str) -> Dropped {
    let schema = unique_schema(prefix);
    let dropped = Dropped {
        url: url.to_owned(),
        schema: schema.clone(),
    };
    let url = url.to_owned();
    actix::System::new().block_on(async move {
        let options = PostgresOptions::builder().schema(schema).build().unwrap();
        let journal = PostgresJournal::connect_with(&url, options).await.unwrap();
        write_fixture(Arc::new(journal.clone())).await;
        journal.close().await;
    });
    dropped
}

#[test]
fn a_postgres_journal_is_read_and_checked_and_its_corruption_named() {
    let Some(url) = server() else { return };
    let fixture = fixture_schema(&url, "cli_read");
    let schema = fixture.schema.as_str();

    let streams = inspect(&url, schema, &["--json", "streams"])
        .expect(0)
        .json_lines();
    let names: Vec<&str> = streams
        .iter()
        .map(|line| line["stream"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "account-1",
            "account-2",
            "legacy-1",
            "orders-out",
            "plain-1"
        ]
    );
    assert_eq!(streams[0]["highest_seq"], 5);
    assert_eq!(streams[0]["deleted_to"], json!(null), "not recorded");
    let compacted = &streams[1];
    assert_eq!(
        compacted["first_stored"],
        compacted["snapshot_seq"].as_u64().unwrap() + 1,
        "{compacted}"
    );

    let events = inspect(
        &url,
        schema,
        &["--json", "events", "account-1", "--from", "2"],
    )
    .expect(0)
    .json_lines();
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[0]["events"],
        json!([{ "Deposited": { "amount": 50 } }])
    );
    assert_eq!(events[0]["tags"], json!(["account"]));
    let legacy = inspect(&url, schema, &["--json", "events", "legacy-1"])
        .expect(0)
        .json_lines();
    assert_eq!(legacy[0]["manifest"]["codec"], "bincode");
    assert!(legacy[0]["hex"].is_string());

    let durable = inspect(&url, schema, &["--json", "durable"])
        .expect(0)
        .json_lines();
    assert_eq!(durable.len(), 1);
    assert_eq!(durable[0]["producer_id"], "fixture-producer");
    let seqs: Vec<u64> = durable[0]["unconfirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [2, 3]);

    let sound = inspect(&url, schema, &["check"]).expect(0);
    assert!(sound.stdout.contains("ok: no problem found"), "{sound:?}");
    assert!(
        sound.stdout.contains(&format!("schema `{schema}`")),
        "{sound:?}"
    );

    let backup = inspect(&url, schema, &["backup", "/tmp/never-written"]).expect(2);
    assert!(backup.stderr.contains("pg_dump"), "{backup:?}");

    let statements = format!(
        "DELETE FROM \"{schema}\".event_journal WHERE persistence_id = 'account-1' AND seq_nr = 3; \
         INSERT INTO \"{schema}\".event_tag (tag, persistence_id, seq_nr, slice) \
         VALUES ('account', 'ghost', 7, {});",
        slice_of(&id("ghost"))
    );
    let admin_url = url.clone();
    actix::System::new().block_on(async move {
        admin(&admin_url)
            .await
            .batch_execute(&statements)
            .await
            .unwrap();
    });
    let broken = inspect(&url, schema, &["check"]).expect(1);
    for expected in [
        "problem: gap: stream `account-1`: event 3 is missing",
        "problem: dangling-tag: stream `account-1`",
        "points at event 3, which is neither stored nor deleted",
        "problem: dangling-tag: stream `ghost`",
        "3 problem(s) found",
    ] {
        assert!(broken.stdout.contains(expected), "{expected}: {broken:?}");
    }
}

#[test]
fn a_postgres_schema_without_a_journal_or_of_a_newer_version_is_refused_and_server_errors_say_why()
{
    let Some(url) = server() else { return };
    let missing = unique_schema("cli_missing");
    let refused = inspect(&url, &missing, &["streams"]).expect(2);
    assert!(refused.stderr.contains("--postgres"), "{refused:?}");
    assert!(
        refused.stderr.contains(&format!("no schema `{missing}`")),
        "{refused:?}"
    );

    let fixture = fixture_schema(&url, "cli_newer");
    let schema = fixture.schema.clone();
    let admin_url = url.clone();
    actix::System::new().block_on(async move {
        admin(&admin_url)
            .await
            .batch_execute(&format!(
                "UPDATE \"{schema}\".journal_schema SET version = 99"
            ))
            .await
            .unwrap();
    });
    let refused = inspect(&url, &fixture.schema, &["check"]).expect(2);
    assert!(refused.stderr.contains("schema version 99"), "{refused:?}");
    assert!(refused.stderr.contains("newer version"), "{refused:?}");

    // The server's own refusal: its message and SQLSTATE (a `key=value` string, to which a
    // later option adds).
    if url.starts_with("postgres") {
        return;
    }
    let no_database = format!("{url} dbname=no_such_database_for_the_cli_test");
    let refused = inspect(&no_database, "public", &["streams"]).expect(3);
    assert!(refused.stderr.contains("--postgres"), "{refused:?}");
    assert!(refused.stderr.contains("SQLSTATE 3D000"), "{refused:?}");
    assert!(
        refused.stderr.contains("no_such_database_for_the_cli_test"),
        "{refused:?}"
    );
}

/// Keeps the letters of `dead_letters::keep_letters` in `schema` through a
/// `PostgresDeadLetters` on a `PostgresJournal`; their ids.
fn keep_letters_in(url: &str, schema: &str) -> [u64; 4] {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    actix::System::new().block_on(async move {
        let options = PostgresOptions::builder().schema(schema).build().unwrap();
        let journal = PostgresJournal::connect_with(&url, options).await.unwrap();
        let store = PostgresDeadLetters::open(&journal, DeadLetterLimits::default())
            .await
            .unwrap();
        let ids = keep_letters(&store).await;
        drop(store);
        journal.close().await;
        ids
    })
}

#[test]
fn dead_letters_of_a_postgres_schema_are_listed_shown_and_deleted() {
    let Some(url) = server() else { return };
    let fixture = fixture_schema(&url, "cli_dead_letters");
    let schema = fixture.schema.clone();

    // None kept yet: no table, and nothing is created.
    let listed = inspect(&url, &schema, &["--json", "dead-letters", "list"]).expect(0);
    assert!(listed.stdout.is_empty(), "{listed:?}");
    assert!(
        listed.stderr.contains("holds no dead letters"),
        "{listed:?}"
    );
    let deleted = inspect(&url, &schema, &["--write", "dead-letters", "delete", "1"]).expect(2);
    assert!(deleted.stderr.contains("no dead letter 1"), "{deleted:?}");

    let ids = keep_letters_in(&url, &schema);
    lists_shows_and_deletes(&|args| inspect(&url, &schema, args), ids);

    let (admin_url, tables) = (url.clone(), schema.clone());
    let (totals, counted) = actix::System::new().block_on(async move {
        let client = admin(&admin_url).await;
        let read = |sql: String| {
            let client = &client;
            async move {
                let row = client.query_one(&sql, &[]).await.unwrap();
                (row.get::<_, i64>(0), row.get::<_, i64>(1))
            }
        };
        (
            read(format!(
                "SELECT entries, bytes FROM \"{tables}\".dead_letter_totals"
            ))
            .await,
            read(format!(
                "SELECT count(*), coalesce(sum(weight), 0)::int8 FROM \"{tables}\".dead_letter"
            ))
            .await,
        )
    });
    assert_eq!(totals, counted, "the totals follow the deletions");
    assert_eq!(totals.0, 2);

    // The store opened without a journal refuses a schema that holds none, creating nothing.
    let missing = unique_schema("cli_no_journal");
    let refused = actix::System::new().block_on(async move {
        let options = PostgresOptions::builder().schema(missing).build().unwrap();
        PostgresDeadLetters::connect(&url, &options, DeadLetterLimits::default())
            .await
            .err()
            .expect("refused")
    });
    let refused = refused.to_string();
    assert!(refused.contains("invalid journal"), "{refused}");
    assert!(refused.contains("no journal tables"), "{refused}");
}
