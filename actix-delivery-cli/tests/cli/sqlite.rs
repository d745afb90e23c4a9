//! The inspector on SQLite journals.

use actix_delivery::journal::{slice_of, Journal, SqliteJournal};
use serde_json::json;

use crate::support::{fixture_copy, id, old_fixture_copy, sqlite};

#[test]
fn streams_lists_each_stream_with_its_highest_seq_deletion_point_and_type_a_page_at_a_time() {
    let (_dir, file) = fixture_copy();
    let lines = sqlite(&file, &["--json", "streams"]).expect(0).json_lines();
    let names: Vec<&str> = lines
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
    let account = &lines[0];
    assert_eq!(account["highest_seq"], 5);
    assert_eq!(account["first_stored"], 1);
    assert_eq!(account["deleted_to"], json!(null));
    assert!(
        account["type"]
            .as_str()
            .unwrap()
            .ends_with("::AccountEvent"),
        "{account}"
    );
    // Compacted: deleted up to its snapshot, whose events are gone.
    let compacted = &lines[1];
    assert_eq!(compacted["highest_seq"], 5);
    let deleted_to = compacted["deleted_to"].as_u64().expect("deleted");
    assert!(deleted_to >= 2, "{compacted}");
    assert_eq!(compacted["snapshot_seq"], deleted_to);
    assert_eq!(compacted["first_stored"], deleted_to + 1);
    assert_eq!(lines[2]["type"], "app::Legacy");
    assert!(
        lines[3]["type"]
            .as_str()
            .unwrap()
            .starts_with("actix_delivery::durable::log::LogEvent<"),
        "{}",
        lines[3]
    );

    // A page, and where the next one starts.
    let page = sqlite(&file, &["streams", "--limit", "2"]).expect(0);
    let rows: Vec<&str> = page.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "a header and two rows: {page:?}");
    assert!(rows[0].starts_with("STREAM"), "{page:?}");
    assert!(rows[1].starts_with("account-1 "), "{page:?}");
    assert!(page.stderr.contains("--after account-2"), "{page:?}");
    let next = sqlite(&file, &["--json", "streams", "--after", "account-2"])
        .expect(0)
        .json_lines();
    assert_eq!(next[0]["stream"], "legacy-1");
    assert_eq!(next.len(), 3);
}

#[test]
fn events_are_decoded_to_json_from_messagepack_and_shown_in_hex_from_bincode() {
    let (_dir, file) = fixture_copy();
    let account = sqlite(&file, &["--json", "events", "account-1"])
        .expect(0)
        .json_lines();
    assert_eq!(account.len(), 5);
    let first = &account[0];
    assert_eq!(first["seq"], 1);
    assert_eq!(first["events"], json!([{ "Deposited": { "amount": 100 } }]));
    assert_eq!(
        account[2]["events"],
        json!([{ "Withdrew": { "amount": 30 } }])
    );
    assert_eq!(first["tags"], json!(["account"]));
    assert_eq!(first["manifest"]["codec"], "msgpack");
    assert_eq!(first["manifest"]["version"], 1);
    assert!(first["written_at"].as_str().unwrap().ends_with('Z'));

    let legacy = sqlite(&file, &["--json", "events", "legacy-1", "--from", "2"])
        .expect(0)
        .json_lines();
    assert_eq!(legacy.len(), 2);
    assert_eq!(legacy[0]["seq"], 2);
    assert_eq!(
        legacy[0]["manifest"],
        json!({ "codec": "bincode", "codec_id": 1, "type": "app::Legacy", "version": 2 })
    );
    let bytes = actix_delivery::codec::encode(&(2u32, "legacy 2".to_string())).unwrap();
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(legacy[0]["hex"], hex);
    assert!(legacy[0].get("events").is_none());
    assert_eq!(legacy[0]["tags"], json!(["legacy"]));

    let plain = sqlite(&file, &["--json", "events", "plain-1"])
        .expect(0)
        .json_lines();
    assert_eq!(plain[0]["value"], json!({ "name": "x", "n": 7 }));

    // The table: one row an event, the payload decoded; a page says where the next begins.
    let table = sqlite(&file, &["events", "account-1", "--limit", "2"]).expect(0);
    let rows: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{table:?}");
    assert!(rows[1].contains("msgpack"), "{table:?}");
    assert!(
        rows[1].contains(r#"[{"Deposited":{"amount":100}}]"#),
        "{table:?}"
    );
    assert!(table.stderr.contains("--from 3"), "{table:?}");
    let legacy = sqlite(&file, &["events", "legacy-1"]).expect(0);
    assert!(legacy.stdout.contains(&hex), "{legacy:?}");
    assert!(
        legacy.stdout.contains("bincode app::Legacy v2"),
        "{legacy:?}"
    );
}

#[test]
fn durable_shows_a_producers_unconfirmed_messages_with_their_age_and_size() {
    let (_dir, file) = fixture_copy();
    let lines = sqlite(&file, &["--json", "durable"]).expect(0).json_lines();
    assert_eq!(lines.len(), 1, "only the producer's stream: {lines:?}");
    let durable = &lines[0];
    assert_eq!(durable["stream"], "orders-out");
    assert_eq!(durable["producer_id"], "fixture-producer");
    assert!(
        durable["message_type"]
            .as_str()
            .unwrap()
            .ends_with("::Order"),
        "{durable}"
    );
    assert_eq!(durable["openings"], 1);
    assert_eq!(durable["next_seq"], 4);
    let unconfirmed = durable["unconfirmed"].as_array().unwrap();
    let seqs: Vec<u64> = unconfirmed
        .iter()
        .map(|message| message["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [2, 3], "order 1 was confirmed: {durable}");
    for message in unconfirmed {
        assert!(message["bytes"].as_u64().unwrap() > 2, "{message}");
        let age = message["age_ms"].as_u64().unwrap();
        assert!(age < 600_000, "stored by this test run: {message}");
    }

    let one = sqlite(&file, &["durable", "orders-out"]).expect(0);
    assert!(
        one.stdout.contains("producer `fixture-producer`"),
        "{one:?}"
    );
    assert!(one.stdout.contains("2 unconfirmed"), "{one:?}");
    assert!(one.stdout.contains("\n  seq 2: stored "), "{one:?}");
    assert!(one.stdout.contains("\n  seq 3: stored "), "{one:?}");
    let not_durable = sqlite(&file, &["durable", "account-1"]).expect(2);
    assert!(
        not_durable.stderr.contains("not a durable producer's"),
        "{not_durable:?}"
    );
}

#[test]
fn check_passes_on_a_sound_journal_and_exits_1_naming_each_broken_invariant() {
    let (_dir, file) = fixture_copy();
    let sound = sqlite(&file, &["check"]).expect(0);
    assert!(sound.stdout.contains("ok: no problem found"), "{sound:?}");
    assert!(sound.stdout.contains("schema version 3"), "{sound:?}");
    let report = &sqlite(&file, &["--json", "check"]).expect(0).json_lines()[0];
    assert_eq!(report["passed"], true);
    assert_eq!(report["streams"], 5);
    assert!(report["tag_rows"].as_u64().unwrap() >= 8, "{report}");
    assert!(report["journal_id"].is_string(), "{report}");

    // A middle event deleted behind the journal's back (with its tag row left), and a tag row
    // of a stream that has no events.
    let db = rusqlite::Connection::open(&file).unwrap();
    for table in ["event_journal", "event_buffer"] {
        db.execute(
            &format!("DELETE FROM {table} WHERE persistence_id = 'account-1' AND seq_nr = 3"),
            [],
        )
        .unwrap();
    }
    db.execute(
        "INSERT INTO event_tag (tag, persistence_id, seq_nr, slice, written_at) \
         VALUES ('account', 'ghost', 7, ?1, 0)",
        [slice_of(&id("ghost"))],
    )
    .unwrap();
    drop(db);

    let broken = sqlite(&file, &["check"]).expect(1);
    for expected in [
        "problem: gap: stream `account-1`: event 3 is missing",
        "problem: dangling-tag: stream `account-1`: the tag row of tag `account`",
        "points at event 3, which is neither stored nor deleted",
        "problem: dangling-tag: stream `ghost`",
        "points at event 7",
        "3 problem(s) found",
    ] {
        assert!(broken.stdout.contains(expected), "{expected}: {broken:?}");
    }
    let report = &sqlite(&file, &["--json", "check"]).expect(1).json_lines()[0];
    assert_eq!(report["passed"], false);
    let kinds: Vec<(&str, &str)> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["stream"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("gap", "account-1"),
            ("dangling-tag", "account-1"),
            ("dangling-tag", "ghost")
        ]
    );
    let capped = sqlite(&file, &["check", "--max-problems", "1"]).expect(1);
    assert!(capped.stdout.contains("raise --max-problems"), "{capped:?}");
}

#[test]
fn check_names_a_tag_row_out_of_order_and_one_of_another_slice() {
    let (_dir, file) = fixture_copy();
    let db = rusqlite::Connection::open(&file).unwrap();
    // Event 1 of legacy-1 filed again, after event 3: its offset no longer rises with its seq.
    db.execute(
        "INSERT INTO event_tag (tag, persistence_id, seq_nr, slice, written_at) \
         VALUES ('legacy', 'legacy-1', 1, ?1, 0)",
        [slice_of(&id("legacy-1"))],
    )
    .unwrap();
    db.execute(
        "INSERT INTO event_tag (tag, persistence_id, seq_nr, slice, written_at) \
         VALUES ('other', 'plain-1', 1, ?1, 0)",
        [(slice_of(&id("plain-1")) + 1) % 1024],
    )
    .unwrap();
    drop(db);
    let broken = sqlite(&file, &["check"]).expect(1);
    for expected in [
        "problem: tag-order: stream `legacy-1`: under tag `legacy`, event 1",
        "follows event 3",
        "problem: tag-slice: stream `plain-1`",
    ] {
        assert!(broken.stdout.contains(expected), "{expected}: {broken:?}");
    }
}

#[test]
fn backup_writes_a_journal_the_library_opens_and_refuses_an_existing_file() {
    let (dir, file) = fixture_copy();
    let dest = dir.path().join("backup.sqlite");
    let dest_arg = dest.to_str().unwrap();
    let done = sqlite(&file, &["backup", dest_arg]).expect(0);
    assert!(done.stdout.contains("backed up"), "{done:?}");
    let again = sqlite(&file, &["backup", dest_arg]).expect(2);
    assert!(again.stderr.contains("the file exists"), "{again:?}");
    assert!(again.stderr.contains(dest_arg), "{again:?}");

    actix::System::new().block_on(async {
        let journal = SqliteJournal::open(&dest).await.unwrap();
        assert_eq!(journal.highest_seq(&id("account-1")).await.unwrap(), 5);
        let events = journal
            .replay(&id("legacy-1"), 1, u64::MAX, 10)
            .await
            .unwrap();
        assert_eq!(events.len(), 3);
        journal.close().await;
    });
}

#[test]
fn the_inspector_reads_beside_a_live_journal_that_holds_the_file_and_appends() {
    let (dir, file) = fixture_copy();
    actix::System::new().block_on(async {
        let journal = SqliteJournal::open(&file).await.unwrap();
        // The journal holds the writer's lock: a second journal could not open the file.
        let appended = id("live-1");
        journal
            .append(&appended, 1, vec![b"one".to_vec(), b"two".to_vec()])
            .await
            .unwrap();

        let streams = sqlite(&file, &["--json", "streams"]).expect(0).json_lines();
        let live = streams
            .iter()
            .find(|line| line["stream"] == "live-1")
            .expect("the stream appended by the live journal");
        assert_eq!(live["highest_seq"], 2);
        let events = sqlite(&file, &["--json", "events", "live-1"])
            .expect(0)
            .json_lines();
        assert_eq!(events[1]["hex"], "74776f");
        assert_eq!(events[1]["manifest"]["codec"], "raw");
        sqlite(&file, &["check"]).expect(0);
        sqlite(&file, &["durable"]).expect(0);
        let dest = dir.path().join("live-backup.sqlite");
        sqlite(&file, &["backup", dest.to_str().unwrap()]).expect(0);

        // The journal goes on writing meanwhile, and the inspector sees it.
        journal
            .append(&appended, 3, vec![b"three".to_vec()])
            .await
            .unwrap();
        let events = sqlite(&file, &["--json", "events", "live-1"])
            .expect(0)
            .json_lines();
        assert_eq!(events.len(), 3);
        journal.close().await;

        let backup = SqliteJournal::open(&dest).await.unwrap();
        assert_eq!(backup.highest_seq(&appended).await.unwrap(), 2);
        backup.close().await;
    });
}

#[test]
fn older_schema_versions_are_read_as_they_are_and_left_unchanged() {
    for (name, version) in [("journal-v1.sqlite", 1), ("journal-v2.sqlite", 2)] {
        let (_dir, file) = old_fixture_copy(name);
        let before = std::fs::read(&file).unwrap();
        let streams = sqlite(&file, &["--json", "streams"]).expect(0).json_lines();
        let names: Vec<&str> = streams
            .iter()
            .map(|line| line["stream"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["account-1", "account-2", "orders-out"], "{name}");
        let events = sqlite(&file, &["--json", "events", "account-2"])
            .expect(0)
            .json_lines();
        assert_eq!(events.len(), 2, "{name}: in event_buffer");
        // Schema 1 recorded no manifests (bincode); schema 2 wrote MessagePack entries.
        if version == 2 {
            assert_eq!(
                events[0]["events"],
                json!([{ "Deposited": { "amount": 7 } }])
            );
        } else {
            assert_eq!(events[0]["manifest"]["codec"], "bincode", "{name}");
        }
        // Older, not broken: a note; but no identity (given on the journal's next open).
        let check = &sqlite(&file, &["--json", "check"]).expect(1).json_lines()[0];
        assert_eq!(check["schema_version"], version);
        assert!(
            check["notes"][0].as_str().unwrap().contains("migrates"),
            "{check}"
        );
        assert_eq!(check["problems"][0]["kind"], "identity", "{check}");
        assert_eq!(check["problems"].as_array().unwrap().len(), 1, "{check}");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            before,
            "{name}: not migrated"
        );
    }
    // The schema 2 producer's stream predates the message type in its names.
    let (_dir, file) = old_fixture_copy("journal-v2.sqlite");
    let durable = sqlite(&file, &["--json", "durable"]).expect(0).json_lines();
    assert_eq!(durable[0]["producer_id"], "fixture-producer");
    let seqs: Vec<u64> = durable[0]["unconfirmed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [2, 3]);
}

#[test]
fn a_file_that_is_not_a_journal_or_of_a_newer_schema_is_refused_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "not a database, but long enough to be read as a header...\n".repeat(20),
    )
    .unwrap();
    let refused = sqlite(&text, &["streams"]).expect(2);
    assert!(refused.stderr.contains("--sqlite"), "{refused:?}");
    assert!(
        refused.stderr.contains("not an SQLite database"),
        "{refused:?}"
    );

    let empty = dir.path().join("empty.sqlite");
    rusqlite::Connection::open(&empty)
        .unwrap()
        .execute_batch("VACUUM")
        .unwrap();
    let refused = sqlite(&empty, &["check"]).expect(2);
    assert!(refused.stderr.contains("an empty database"), "{refused:?}");

    let foreign = dir.path().join("foreign.sqlite");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let refused = sqlite(&foreign, &["streams"]).expect(2);
    assert!(refused.stderr.contains("a foreign database"), "{refused:?}");

    let (_dir, newer) = fixture_copy();
    rusqlite::Connection::open(&newer)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let refused = sqlite(&newer, &["streams"]).expect(2);
    assert!(refused.stderr.contains("schema version 99"), "{refused:?}");
    assert!(refused.stderr.contains("newer version"), "{refused:?}");

    let missing = dir.path().join("missing.sqlite");
    let refused = sqlite(&missing, &["streams"]).expect(2);
    assert!(refused.stderr.contains("no such file"), "{refused:?}");
    assert!(!missing.exists(), "not created");
}

#[test]
fn an_unknown_stream_is_bad_input_naming_the_argument() {
    let (_dir, file) = fixture_copy();
    for command in ["events", "durable"] {
        let refused = sqlite(&file, &[command, "no-such-stream"]).expect(2);
        assert!(
            refused
                .stderr
                .contains("STREAM: no stream `no-such-stream`"),
            "{refused:?}"
        );
    }
}
