//! `dead-letters` on SQLite journals: letters kept by the library's `SqliteDeadLetters`, then
//! listed, filtered, shown and deleted by the binary, with the journal closed and with it open
//! in this process; and a journal whose database keeps none. The checks of the binary's output
//! are shared with the PostgreSQL test (`postgres`).

use std::path::Path;

use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::dead_letters::{
    delivery_key, DeadLetterCause, DeadLetterLimits, DeadLetterStore, NewDeadLetter, SourceKind,
};
use actix_delivery::journal::{SqliteDeadLetters, SqliteJournal};
use actix_delivery::{DeliveryInfo, IncarnationId};
use serde_json::{json, Value};

use crate::support::{fixture_copy, sqlite, Run};

/// The MessagePack body of the first letter.
fn order() -> Value {
    json!({ "id": 7, "total": 900 })
}

/// The bincode body of the second letter.
fn job_bytes() -> Vec<u8> {
    actix_delivery::codec::encode(&(41u32, "resize".to_owned())).unwrap()
}

/// The raw body of the third letter.
const RAW: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];

/// The incarnation of the second letter's origin.
const INCARNATION: u128 = 0x2a;

fn letter(kind: SourceKind, source: &str, cause: DeadLetterCause, key: &str) -> NewDeadLetter {
    NewDeadLetter {
        kind,
        source: source.to_owned(),
        cause,
        key: key.to_owned(),
        origin: None,
        manifest: Manifest::raw(),
        body: None,
        body_len: 0,
        attempts: 1,
        error: String::new(),
    }
}

/// Keeps four letters in `store`, at 1 000, 2 000, 3 000 and 4 000 ms; their ids, in order:
/// 1. poison, a projection's (`orders-view`): a MessagePack `app::Order` body, 3 attempts, an
///    error of two lines;
/// 2. given up, a work-pulling pool's (`jobs`): a bincode `app::Job` v2 body, with its origin
///    (producer `fixture-producer`, seq 7), 5 attempts;
/// 3. undecodable, a consumer's (`tcp-orders`): 4 raw bytes;
/// 4. malformed, the same consumer's: its body (2 000 000 bytes) not kept.
pub async fn keep_letters(store: &dyn DeadLetterStore) -> [u64; 4] {
    let body = Codec::MessagePack.encode(&order(), 1 << 20).unwrap();
    let poison = NewDeadLetter {
        manifest: Manifest::new(Codec::MessagePack, "app::Order", 1),
        body_len: body.len() as u64,
        body: Some(body),
        attempts: 3,
        error: "handler failed:\nboom".to_owned(),
        ..letter(
            SourceKind::Projection,
            "orders-view",
            DeadLetterCause::Poison,
            "orders-1/3",
        )
    };
    let origin = DeliveryInfo {
        producer_id: "fixture-producer".into(),
        incarnation: IncarnationId::from_u128(INCARNATION),
        seq: 7,
        window_start: 7,
        trace_context: None,
        first_seq: None,
    };
    let job = job_bytes();
    let given_up = NewDeadLetter {
        origin: Some(origin.clone()),
        manifest: Manifest::new(Codec::Bincode, "app::Job", 2),
        body_len: job.len() as u64,
        body: Some(job),
        attempts: 5,
        error: "no worker confirmed it".to_owned(),
        ..letter(
            SourceKind::WorkPulling,
            "jobs",
            DeadLetterCause::GivenUp,
            &delivery_key(&origin),
        )
    };
    let undecodable = NewDeadLetter {
        body: Some(RAW.to_vec()),
        body_len: RAW.len() as u64,
        error: "not an app::Order".to_owned(),
        ..letter(
            SourceKind::Consumer,
            "tcp-orders",
            DeadLetterCause::Undecodable,
            "peer-1/1",
        )
    };
    let malformed = NewDeadLetter {
        body_len: 2_000_000,
        ..letter(
            SourceKind::Consumer,
            "tcp-orders",
            DeadLetterCause::Malformed,
            "peer-1/2",
        )
    };
    let mut ids = [0; 4];
    for (n, letter) in [poison, given_up, undecodable, malformed]
        .into_iter()
        .enumerate()
    {
        ids[n] = store.keep(letter, 1_000 * (n as u64 + 1)).await.unwrap().id;
    }
    ids
}

/// The ids of a JSON listing.
fn listed_ids(run: Run) -> Vec<u64> {
    run.expect(0)
        .json_lines()
        .iter()
        .map(|line| line["id"].as_u64().unwrap())
        .collect()
}

/// What the binary does with the letters of [`keep_letters`] (`ids`), run by `cli` (the
/// journal's options first): lists them with and without filters, refuses bad filter values
/// naming their option, shows each with its body decoded or in hex, refuses a delete without
/// --write and of an unknown id (nothing changed), deletes with it. Leaves the first two
/// letters.
pub fn lists_shows_and_deletes(cli: &dyn Fn(&[&str]) -> Run, ids: [u64; 4]) {
    let [poison, given_up, undecodable, malformed] = ids;
    let text = |id: u64| id.to_string();

    // Listed, oldest first, without their bodies.
    let all = cli(&["--json", "dead-letters", "list"])
        .expect(0)
        .json_lines();
    let listed: Vec<u64> = all
        .iter()
        .map(|line| line["id"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, ids);
    let first = &all[0];
    assert_eq!(first["cause"], "poison");
    assert_eq!(first["kind"], "projection");
    assert_eq!(first["source"], "orders-view");
    assert_eq!(first["key"], "orders-1/3");
    assert_eq!(first["attempts"], 3);
    assert_eq!(first["replay_failures"], 0);
    assert_eq!(first["first_at_ms"], 1_000);
    assert_eq!(first["last_at"], "1970-01-01T00:00:01.000Z");
    assert_eq!(first["body_kept"], true);
    assert_eq!(first["manifest"]["codec"], "msgpack");
    assert_eq!(first["manifest"]["type"], "app::Order");
    assert!(
        first.get("value").is_none(),
        "no body in a listing: {first}"
    );
    assert_eq!(all[1]["origin"]["producer_id"], "fixture-producer");
    assert_eq!(all[3]["body_kept"], false);
    assert_eq!(all[3]["body_len"], 2_000_000);

    let table = cli(&["dead-letters", "list"]).expect(0);
    let rows: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(rows.len(), 5, "a header and four rows: {table:?}");
    assert!(rows[0].starts_with("ID "), "{table:?}");
    assert!(rows[0].contains("REPLAYS FAILED"), "{table:?}");
    assert!(rows[1].contains("projection/orders-view"), "{table:?}");
    assert!(
        rows[1].ends_with("handler failed: boom"),
        "one line: {table:?}"
    );
    assert!(rows[4].contains("2000000 B, not kept"), "{table:?}");

    // Filters.
    for (args, expected) in [
        (&["--cause", "poison"][..], vec![poison]),
        (&["--kind", "consumer"], vec![undecodable, malformed]),
        (&["--source", "jobs"], vec![given_up]),
        (
            &["--since-ms", "2000", "--until-ms", "4000"],
            vec![given_up, undecodable],
        ),
        (
            &["--kind", "consumer", "--cause", "malformed"],
            vec![malformed],
        ),
        (&["--after", &text(given_up)], vec![undecodable, malformed]),
        (&["--cause", "incompatible_version"], vec![]),
    ] {
        let mut all = vec!["--json", "dead-letters", "list"];
        all.extend_from_slice(args);
        assert_eq!(listed_ids(cli(&all)), expected, "{args:?}");
    }
    let page = cli(&["--json", "dead-letters", "list", "--limit", "2"]).expect(0);
    assert_eq!(page.json_lines().len(), 2, "{page:?}");
    assert!(
        page.stderr.contains(&format!("--after {given_up}")),
        "{page:?}"
    );
    let none = cli(&["dead-letters", "list", "--source", "nobody"]).expect(0);
    assert!(none.stderr.contains("no dead letter matches"), "{none:?}");

    // A bad filter value: refused, naming its option.
    for (option, value, reason) in [
        ("--cause", "lost", "is not one of given_up"),
        ("--kind", "robot", "is not one of producer"),
        ("--since-ms", "abc", "not a whole number"),
        ("--since-ms", "-1", "not a whole number"),
        ("--until-ms", "1.5", "not a whole number"),
        ("--after", "x", "not a whole number"),
        ("--limit", "0", "outside 1..=1000"),
        ("--limit", "1001", "outside 1..=1000"),
    ] {
        let refused = cli(&["dead-letters", "list", option, value]).expect(2);
        assert!(
            refused.stderr.contains(&format!("{option}: ")),
            "{option} {value}: {refused:?}"
        );
        assert!(
            refused.stderr.contains(reason),
            "{option} {value}: {refused:?}"
        );
        assert!(refused.stdout.is_empty(), "{refused:?}");
    }

    // Shown: MessagePack decoded to JSON, bincode and raw bytes in hex.
    let shown = |id: u64| {
        let mut lines = cli(&["--json", "dead-letters", "show", &text(id)])
            .expect(0)
            .json_lines();
        assert_eq!(lines.len(), 1);
        lines.remove(0)
    };
    let decoded = shown(poison);
    assert_eq!(decoded["value"], order());
    assert_eq!(decoded["error"], "handler failed:\nboom");
    assert_eq!(decoded["origin"], Value::Null);
    let job = shown(given_up);
    let hex: String = job_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(job["hex"], hex);
    assert_eq!(job["manifest"]["codec"], "bincode");
    assert_eq!(job["manifest"]["version"], 2);
    assert_eq!(
        job["origin"],
        json!({
            "producer_id": "fixture-producer",
            "incarnation": format!("{INCARNATION:032x}"),
            "seq": 7,
            "first_seq": null,
        })
    );
    assert_eq!(job["key"], format!("fixture-producer/{INCARNATION:032x}/7"));
    let raw = shown(undecodable);
    assert_eq!(raw["hex"], "deadbeef");
    assert_eq!(raw["manifest"]["codec"], "raw");
    let dropped = shown(malformed);
    assert_eq!(dropped["body_kept"], false);
    assert!(dropped.get("hex").is_none() && dropped.get("value").is_none());

    let text_show = cli(&["dead-letters", "show", &text(poison)]).expect(0);
    for expected in [
        "cause           poison",
        "source          orders-view",
        "manifest        msgpack app::Order v1",
        "\"total\": 900",
        "origin          -",
    ] {
        assert!(
            text_show.stdout.contains(expected),
            "{expected}: {text_show:?}"
        );
    }
    let text_job = cli(&["dead-letters", "show", &text(given_up)]).expect(0);
    assert!(
        text_job.stdout.contains(&format!(
            "producer fixture-producer, incarnation {INCARNATION:032x}, seq 7"
        )),
        "{text_job:?}"
    );
    assert!(
        text_job.stdout.contains(&format!("(hex) {hex}")),
        "{text_job:?}"
    );
    let unknown = cli(&["dead-letters", "show", "999999"]).expect(2);
    assert!(
        unknown.stderr.contains("no dead letter 999999"),
        "{unknown:?}"
    );
    cli(&["dead-letters", "show", "abc"]).expect(2);

    // Delete: refused without --write and for an unknown id, nothing changed; done with it.
    let refused = cli(&["dead-letters", "delete", &text(undecodable)]).expect(2);
    assert!(refused.stderr.contains("--write"), "{refused:?}");
    assert!(
        refused.stderr.contains("nothing was changed"),
        "{refused:?}"
    );
    let unknown = cli(&["--write", "dead-letters", "delete", "999999"]).expect(2);
    assert!(
        unknown.stderr.contains("no dead letter 999999"),
        "{unknown:?}"
    );
    assert_eq!(listed_ids(cli(&["--json", "dead-letters", "list"])), ids);

    let deleted = cli(&["--write", "dead-letters", "delete", &text(undecodable)]).expect(0);
    assert!(
        deleted
            .stdout
            .contains(&format!("deleted dead letter {undecodable}")),
        "{deleted:?}"
    );
    assert_eq!(
        listed_ids(cli(&["--json", "dead-letters", "list"])),
        [poison, given_up, malformed]
    );
    cli(&["dead-letters", "show", &text(undecodable)]).expect(2);
    let again = cli(&["dead-letters", "delete", "--write", &text(undecodable)]).expect(2);
    assert!(
        again
            .stderr
            .contains(&format!("no dead letter {undecodable}")),
        "{again:?}"
    );
    let json = cli(&[
        "--json",
        "--write",
        "dead-letters",
        "delete",
        &text(malformed),
    ])
    .expect(0)
    .json_lines();
    assert_eq!(json, [json!({ "deleted": malformed })]);
    assert_eq!(
        listed_ids(cli(&["--json", "dead-letters", "list"])),
        [poison, given_up]
    );
}

/// What `dead_letter_totals` says and what `dead_letter` holds, in the SQLite file.
fn sqlite_totals(file: &Path) -> ((i64, i64), (i64, i64)) {
    let conn = rusqlite::Connection::open(file).unwrap();
    let totals = conn
        .query_row("SELECT entries, bytes FROM dead_letter_totals", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap();
    let counted = conn
        .query_row(
            "SELECT count(*), coalesce(sum(weight), 0) FROM dead_letter",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    (totals, counted)
}

/// Opens the journal at `file` and keeps the letters through its store; returns the journal
/// (open) and the letters' ids.
async fn journal_with_letters(file: &Path) -> (SqliteJournal, [u64; 4]) {
    let journal = SqliteJournal::open(file).await.unwrap();
    let store = SqliteDeadLetters::open(&journal, DeadLetterLimits::default())
        .await
        .unwrap();
    let ids = keep_letters(&store).await;
    (journal, ids)
}

#[test]
fn dead_letters_of_a_closed_sqlite_journal_are_listed_filtered_shown_and_deleted() {
    let (_dir, file) = fixture_copy();
    let ids = actix::System::new().block_on({
        let file = file.clone();
        async move {
            let (journal, ids) = journal_with_letters(&file).await;
            journal.close().await;
            ids
        }
    });
    lists_shows_and_deletes(&|args| sqlite(&file, args), ids);
    let (totals, counted) = sqlite_totals(&file);
    assert_eq!(totals, counted, "the totals follow the deletions");
    assert_eq!(totals.0, 2);
    // The journal opens as before.
    actix::System::new().block_on(async move {
        SqliteJournal::open(&file).await.unwrap().close().await;
    });
}

#[test]
fn dead_letters_are_deleted_beside_the_application_that_has_the_journal_open() {
    let (_dir, file) = fixture_copy();
    let system = actix::System::new();
    let (journal, ids) = system.block_on(journal_with_letters(&file));
    // The journal (and its lock) stays open in this process while the binary works.
    lists_shows_and_deletes(&|args| sqlite(&file, args), ids);
    let (totals, counted) = sqlite_totals(&file);
    assert_eq!(totals, counted);
    assert_eq!(totals.0, 2);
    // The application's store goes on beside the deletions.
    system.block_on(async move {
        let store = SqliteDeadLetters::open(&journal, DeadLetterLimits::default())
            .await
            .unwrap();
        let page = store.list(Default::default()).await.unwrap();
        let left: Vec<u64> = page.entries.iter().map(|entry| entry.id).collect();
        assert_eq!(left, ids[..2]);
        drop(store);
        journal.close().await;
    });
}

#[test]
fn a_journal_without_dead_letters_lists_none_and_says_so_and_deletes_nothing() {
    let (_dir, file) = fixture_copy();
    let listed = sqlite(&file, &["--json", "dead-letters", "list"]).expect(0);
    assert!(listed.stdout.is_empty(), "{listed:?}");
    assert!(
        listed.stderr.contains("holds no dead letters"),
        "{listed:?}"
    );
    let shown = sqlite(&file, &["dead-letters", "show", "1"]).expect(2);
    assert!(shown.stderr.contains("no dead letter 1"), "{shown:?}");
    let deleted = sqlite(&file, &["--write", "dead-letters", "delete", "1"]).expect(2);
    assert!(deleted.stderr.contains("no dead letter 1"), "{deleted:?}");
    let conn = rusqlite::Connection::open(&file).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'dead_letter%'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "nothing was created");
}

#[test]
fn a_store_opened_on_a_file_refuses_one_that_is_not_a_journal_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("other.db");
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch("CREATE TABLE t (x INTEGER)")
        .unwrap();
    let refused = actix::System::new().block_on({
        let file = file.clone();
        async move {
            SqliteDeadLetters::open_file(&file, DeadLetterLimits::default())
                .await
                .err()
                .expect("refused")
        }
    });
    assert!(refused.to_string().contains("journal"), "{refused}");
    assert!(
        refused.to_string().contains("foreign database"),
        "{refused}"
    );
    let conn = rusqlite::Connection::open(&file).unwrap();
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .unwrap();
    assert_eq!(tables, 1, "left untouched");
}

#[test]
fn a_peers_control_characters_are_escaped_in_the_table_and_show_but_kept_in_json() {
    const KEY: &str = "k\x1b]52;c;aGVsbG8=\x07";
    let (_dir, file) = fixture_copy();
    let id = actix::System::new().block_on({
        let file = file.clone();
        async move {
            let journal = SqliteJournal::open(&file).await.unwrap();
            let store = SqliteDeadLetters::open(&journal, DeadLetterLimits::default())
                .await
                .unwrap();
            let mut evil = letter(
                SourceKind::Consumer,
                "tcp\x1b[2J",
                DeadLetterCause::Malformed,
                KEY,
            );
            evil.manifest = Manifest::new(Codec::Bincode, "T\u{9b}31m", 1);
            evil.error = "bad\x1b[31m frame\r\nagain".to_owned();
            evil.body = Some(b"\x1b]0;title\x07".to_vec());
            evil.body_len = 11;
            let id = store.keep(evil, 1_000).await.unwrap().id;
            drop(store);
            journal.close().await;
            id
        }
    });
    let raw = |text: &str| text.chars().any(|c| c.is_control() && c != '\n');
    let listed = sqlite(&file, &["dead-letters", "list"]).expect(0);
    assert!(!raw(&listed.stdout), "{:?}", listed.stdout);
    assert!(
        listed.stdout.contains("k\\u{1b}]52;c;aGVsbG8=\\u{7}"),
        "{}",
        listed.stdout
    );
    assert!(listed.stdout.contains("tcp\\u{1b}[2J"), "{}", listed.stdout);
    assert!(
        listed.stdout.contains("bad\\u{1b}[31m frame again"),
        "{}",
        listed.stdout
    );
    let shown = sqlite(&file, &["dead-letters", "show", &id.to_string()]).expect(0);
    assert!(!raw(&shown.stdout), "{:?}", shown.stdout);
    assert!(
        shown.stdout.contains("k\\u{1b}]52;c;aGVsbG8=\\u{7}"),
        "{}",
        shown.stdout
    );
    assert!(shown.stdout.contains("T\\u{9b}31m"), "{}", shown.stdout);
    assert!(shown.stdout.contains("\\u{d}"), "{}", shown.stdout);
    // JSON keeps the text as it is (escaped by JSON itself).
    let json = sqlite(&file, &["--json", "dead-letters", "list"]).expect(0);
    assert_eq!(json.json_lines()[0]["key"], KEY);
}
