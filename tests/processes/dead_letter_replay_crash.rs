//! Replaying kept dead letters across SIGKILLs: each is applied once. This test binary runs
//! itself as the child (selected by [`ROLE`]): on a SQLite file holding a dead-letter store
//! and a ledger entity, it replays every entry into the ledger (effectively once on the
//! replay's id), printing each. The ledger's journal is wrapped in [`Hooked`], which holds one
//! append after its commit: the test SIGKILLs the child there, between the ledger applying a
//! replay and the store removing its entry. The next life replays what is left.

use crate::process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::dead_letters::{
    DeadLetterCause, DeadLetterFilter, DeadLetterLimits, DeadLetters, NewDeadLetter, Replay,
    Replayed, SourceKind,
};
use actix_delivery::journal::SqliteDeadLetters;
use actix_delivery::persistence::{recover_state, Outcome, PersistentHandle, PersistentOptions};
use process::hook::{Hold, Hooked};

use crate::common::entities::{ledger_id, Ledger, Op};

/// The test that is the child (it does nothing unless [`ROLE`] is set).
const ENTRY: &str = concat!(module_path!(), "::child_entry");
/// Set for the child: `replay`.
const ROLE: &str = "DLQ_REPLAY_ROLE";
/// The child's SQLite file.
const DB: &str = "DLQ_REPLAY_DB";
/// The ledger append its journal holds ([`Hold::encode`]).
const HOLD: &str = "DLQ_REPLAY_HOLD";
/// Set (to anything) to plant a fault: replays go without the replay's id (`ask`), so the
/// test must see an entry applied twice.
const PLANT: &str = "DLQ_REPLAY_PLANT";
const MARKER: &str = "ledger-journal";
/// How many dead letters the test keeps.
const LETTERS: u64 = 12;

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is set for the child"))
}

/// The child: replays every entry, printing `replayed <id> <how>`, then `done`.
async fn replay_all() {
    let journal = process::open_journal(env(DB)).await.unwrap();
    let dead_letters = DeadLetters::new(
        SqliteDeadLetters::open(&journal, DeadLetterLimits::default())
            .await
            .unwrap(),
    );
    let hooked = Hooked::new(journal, MARKER, Hold::parse(&env(HOLD)));
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(Arc::new(hooked), ledger_id()))
            .unwrap();
    let planted = std::env::var(PLANT).is_ok();
    dead_letters.on_replay("jobs", move |replay: Replay<u64>| {
        let ledger = ledger.clone();
        async move {
            if planted {
                return match ledger.ask(Op::Apply(replay.body)).await {
                    Ok(_) => Ok(Replayed::Applied),
                    Err(error) => Err(error.to_string().into()),
                };
            }
            match ledger
                .ask_delivered(replay.info, Op::Apply(replay.body))
                .await
            {
                Ok(Outcome::Done(_)) => Ok(Replayed::Applied),
                Ok(Outcome::AlreadyProcessed) => Ok(Replayed::AlreadyApplied),
                Err(error) => Err(error.to_string().into()),
            }
        }
    });
    println!("ready");
    let entries = dead_letters
        .list(DeadLetterFilter::default())
        .await
        .unwrap()
        .entries;
    for entry in entries {
        let replayed = dead_letters.replay(entry.id).await.unwrap();
        println!("replayed {} {replayed:?}", entry.id);
    }
    println!("done");
    std::future::pending::<()>().await;
}

/// The child, by [`ROLE`].
#[test]
fn child_entry() {
    if std::env::var(ROLE).is_err() {
        return; // run as an ordinary test: nothing to do
    }
    actix::System::new().block_on(replay_all());
}

/// Keeps [`LETTERS`] given-up jobs (bodies 100, 101, …) in the file's store.
async fn keep_letters(db: &std::path::Path) {
    let journal = process::open_journal(db).await.unwrap();
    let dead_letters = DeadLetters::new(
        SqliteDeadLetters::open(&journal, DeadLetterLimits::default())
            .await
            .unwrap(),
    );
    for n in 0..LETTERS {
        let body = Codec::MessagePack.encode(&(100 + n), 64).unwrap();
        dead_letters
            .keep(NewDeadLetter {
                kind: SourceKind::WorkPulling,
                source: "jobs".into(),
                cause: DeadLetterCause::GivenUp,
                key: format!("job-{n}"),
                origin: None,
                manifest: Manifest::new(Codec::MessagePack, "u64", 1),
                body_len: body.len() as u64,
                body: Some(body),
                attempts: 3,
                error: "no worker confirmed it".into(),
            })
            .await
            .unwrap();
    }
    journal.close().await;
}

/// How often the ledger applied each body, as recovered from its journal.
async fn applied(db: &std::path::Path) -> std::collections::BTreeMap<u64, u32> {
    let journal = process::open_journal(db).await.unwrap();
    let ledger = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    journal.close().await;
    ledger.applied
}

/// One life: replays until the held append committed (then SIGKILLed) or until done.
fn life(db: &std::path::Path, hold: Hold, plant: bool) -> Vec<String> {
    let mut env = vec![
        (ROLE, "replay".to_string()),
        (DB, db.display().to_string()),
        (HOLD, hold.encode()),
    ];
    if plant {
        env.push((PLANT, "1".to_string()));
    }
    let child = process::spawn(ENTRY, &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = match hold {
        Hold::After(n) => format!("{MARKER} committed {n}"),
        _ => "done".to_string(),
    };
    let mut lines = Vec::new();
    while let Some(line) = child.next_line(deadline) {
        let end = line.starts_with(&held);
        lines.push(line);
        if end {
            lines.extend(child.kill_collect());
            return lines;
        }
    }
    panic!("no {held:?} within 60 s: {lines:?}");
}

fn replay_across_a_sigkill(plant: bool) -> (std::collections::BTreeMap<u64, u32>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("letters.sqlite");
    let runtime = actix::System::new();
    runtime.block_on(keep_letters(&db));
    let first = life(&db, Hold::After(5), plant);
    let replayed_first = first.iter().filter(|l| l.starts_with("replayed")).count();
    assert_eq!(
        replayed_first, 4,
        "killed while the fifth was applied: {first:?}"
    );
    let second = life(&db, Hold::Never, plant);
    let applied = runtime.block_on(applied(&db));
    (applied, second)
}

#[test]
fn a_replay_cut_by_a_sigkill_after_it_applied_is_recognised_and_each_letter_applied_once() {
    let (applied, second) = replay_across_a_sigkill(false);
    assert_eq!(applied.len() as u64, LETTERS, "{applied:?}");
    assert!(applied.values().all(|&n| n == 1), "each once: {applied:?}");
    let recognised: Vec<_> = second
        .iter()
        .filter(|l| l.ends_with("AlreadyApplied"))
        .collect();
    assert_eq!(recognised.len(), 1, "the fifth was recognised: {second:?}");
    let replayed = second.iter().filter(|l| l.starts_with("replayed")).count() as u64;
    assert_eq!(replayed, LETTERS - 4, "{second:?}");
}

/// The planted fault: replays sent without the replay's id apply the letter cut by the
/// SIGKILL twice, which the test above would catch.
#[test]
fn without_the_replay_id_the_letter_cut_by_the_sigkill_is_applied_twice() {
    let (applied, _) = replay_across_a_sigkill(true);
    let twice: Vec<_> = applied.iter().filter(|(_, n)| **n == 2).collect();
    assert_eq!(twice.len(), 1, "{applied:?}");
    assert_eq!(applied.len() as u64, LETTERS, "{applied:?}");
}
