//! The SQLite journal against real crashes and real storage failures.
//!
//! `sigkill_at_random_moments_loses_nothing_acknowledged`: this test binary re-runs itself
//! as a child (`crash_child`, selected by an environment variable) that appends batches to
//! one journal file and prints each batch the moment its append resolved. The parent
//! SIGKILLs it at seeded random moments, reopens the file and checks every acknowledged event,
//! then starts the next child on the same file. Kills that land after a batch committed and
//! before the child printed its ACK are counted (the reopened file holds a batch the child
//! never acknowledged), and the test asserts a minimum of them. In some rounds the child
//! SIGKILLs itself right after printing a seeded ACK instead, the closest to a commit a kill
//! can land. The default seed is fixed;
//! every failure names the seed and the round. Rerun another seed with
//! `JOURNAL_CRASH_SEED=<seed> cargo test --test processes journal_crash::`.
//!
//! The storage tests make writes really fail: a size cap (SQLite `max_page_count`) stands
//! for a full disk, and the immutable attribute (`chattr +i`, which binds root too) makes
//! files read-only (a user who is not root gets file permissions for the open-time case, and
//! the write-ahead-log case is skipped with a printed reason where `chattr` cannot be used).

use crate::process;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{
    replay_all, Journal, JournalError, PersistenceId, SqliteJournal, SqliteOptions,
};
use futures_util::future::join_all;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CHILD_DB: &str = "JOURNAL_CRASH_CHILD_DB";
const CHILD_CONFIG: &str = "JOURNAL_CRASH_CHILD_CONFIG";
/// Marks the child's own lines, which may share a line with the test harness's output.
const MARK: &str = "@@";
const KILLS: usize = 24;
/// The rounds whose kill must land between a commit and its ACK (seen on the default seed: see
/// the count the test prints).
const MIN_KILLS_AFTER_COMMIT: usize = 8;
/// The seed of an ordinary run.
const DEFAULT_SEED: u64 = 24;

fn stream(s: usize) -> PersistenceId {
    PersistenceId::new(format!("crash-stream-{s}")).unwrap()
}

fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The payload of event `seq` of stream `s`, appended in the batch `first..=last`: its
/// identity, then filler derived from stream and seq, mostly 0–600 bytes, one in 16 over a
/// page (4–7 kB).
fn payload(s: usize, seq: u64, first: u64, last: u64) -> Vec<u8> {
    let h = mix((s as u64) << 40 ^ seq);
    let len = if h.is_multiple_of(16) {
        4000 + h % 3000
    } else {
        h % 600
    };
    let mut bytes = format!("{s}:{seq}:{first}:{last}:").into_bytes();
    bytes.extend((0..len).map(|i| (h >> (i % 8 * 8)) as u8 ^ i as u8));
    bytes
}

/// `(first, last)` of the batch a stored payload says it belongs to.
fn batch_of(bytes: &[u8]) -> Option<(usize, u64, u64, u64)> {
    let mut fields = bytes.splitn(5, |&b| b == b':');
    let mut number = || -> Option<u64> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
    Some((number()? as usize, number()?, number()?, number()?))
}

/// What one child does.
#[derive(Debug, Clone)]
struct Config {
    seed: u64,
    streams: usize,
    appenders: usize,
    batch_sizes: Vec<u64>,
    buffer_events: usize,
    /// The child SIGKILLs itself right after printing this many ACKs (0: never): the moment
    /// closest to the commit a kill can land, which no kill from outside hits.
    die_at_ack: u64,
}

impl Config {
    fn random(rng: &mut SmallRng) -> Self {
        let streams = rng.random_range(1..=8);
        let mut batch_sizes: Vec<u64> = [1, 3, 17, 40] // 40: past the buffer, into the index
            .into_iter()
            .filter(|_| rng.random_bool(0.6))
            .collect();
        if batch_sizes.is_empty() {
            batch_sizes.push(2);
        }
        Self {
            seed: rng.random(),
            streams,
            appenders: rng.random_range(1..=streams.min(4)),
            batch_sizes,
            buffer_events: [16, 256, 4096][rng.random_range(0..3)],
            die_at_ack: if rng.random_bool(0.4) {
                rng.random_range(1..=120)
            } else {
                0
            },
        }
    }

    fn encode(&self) -> String {
        let sizes: Vec<String> = self.batch_sizes.iter().map(u64::to_string).collect();
        format!(
            "{} {} {} {} {} {}",
            self.seed,
            self.streams,
            self.appenders,
            sizes.join(","),
            self.buffer_events,
            self.die_at_ack
        )
    }

    fn decode(text: &str) -> Self {
        let fields: Vec<&str> = text.split(' ').collect();
        Self {
            seed: fields[0].parse().unwrap(),
            streams: fields[1].parse().unwrap(),
            appenders: fields[2].parse().unwrap(),
            batch_sizes: fields[3].split(',').map(|n| n.parse().unwrap()).collect(),
            buffer_events: fields[4].parse().unwrap(),
            die_at_ack: fields[5].parse().unwrap(),
        }
    }
}

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}").unwrap();
    out.flush().unwrap();
}

/// The child role: a no-op in a normal test run.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let config = Config::decode(&std::env::var(CHILD_CONFIG).unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(child(Path::new(&path), config));
}

async fn child(path: &Path, config: Config) {
    let options = SqliteOptions::builder()
        .buffer_events(config.buffer_events)
        .build()
        .unwrap();
    let journal = SqliteJournal::open_with(path, options).await.unwrap();
    let mut next = Vec::new();
    for s in 0..config.streams {
        let highest = journal.highest_seq(&stream(s)).await.unwrap();
        say(format_args!("START {s} {highest}"));
        next.push(highest + 1);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let acks = std::cell::Cell::new(0);
    let appenders = (0..config.appenders).map(|a| {
        let (journal, config, acks) = (&journal, &config, &acks);
        // Each stream has one writer: appender `a` owns the streams `s % appenders == a`.
        let mut mine: Vec<(usize, u64)> = (a..config.streams)
            .step_by(config.appenders)
            .map(|s| (s, next[s]))
            .collect();
        async move {
            let mut rng = SmallRng::seed_from_u64(config.seed ^ a as u64);
            for _ in 0..2_000 {
                if Instant::now() > deadline {
                    break;
                }
                let pick = rng.random_range(0..mine.len());
                let (s, next) = &mut mine[pick];
                let size = config.batch_sizes[rng.random_range(0..config.batch_sizes.len())];
                let (first, last) = (*next, *next + size - 1);
                let batch = (first..=last)
                    .map(|seq| payload(*s, seq, first, last))
                    .collect();
                match journal.append(&stream(*s), first, batch).await {
                    Ok(()) => {
                        say(format_args!("ACK {s} {first} {last}"));
                        acks.set(acks.get() + 1);
                        if acks.get() == config.die_at_ack {
                            process::sigkill_self();
                        }
                    }
                    Err(err) => {
                        say(format_args!("ERR {s} {first} {err}"));
                        std::process::exit(2);
                    }
                }
                *next = last + 1;
            }
        }
    });
    join_all(appenders).await;
    say(format_args!("DONE"));
}

/// A line of the child's output.
enum Said {
    Start { s: usize, highest: u64 },
    Ack { s: usize, first: u64, last: u64 },
    Other(String),
}

fn parse(line: &str) -> Option<Said> {
    let line = &line[line.find(MARK)? + MARK.len()..];
    let fields: Vec<&str> = line.split(' ').collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(match fields[0] {
        "START" => Said::Start {
            s: number(1)? as usize,
            highest: number(2)?,
        },
        "ACK" => Said::Ack {
            s: number(1)? as usize,
            first: number(2)?,
            last: number(3)?,
        },
        _ => Said::Other(line.to_string()),
    })
}

fn spawn_child(
    path: &Path,
    config: &Config,
    stderr: File,
    context: &str,
) -> (Child, mpsc::Receiver<Said>) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{context}: the test binary: {e}"));
    let mut child = Command::new(exe)
        .args([
            crate::process::test_name(concat!(module_path!(), "::crash_child")),
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env(CHILD_DB, path)
        .env(CHILD_CONFIG, config.encode())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("{context}: spawn the child: {e}"));
    let stdout = child.stdout.take().expect("piped");
    let (lines, said) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(parsed) = parse(&line)
                && lines.send(parsed).is_err()
            {
                break;
            }
        }
    });
    (child, said)
}

/// Acknowledged batches per stream, `first → last`.
type Acked = BTreeMap<usize, BTreeMap<u64, u64>>;

/// `result`'s value, or a panic naming `context` (the seed and round) and what failed.
fn ok<T, E: std::fmt::Display>(result: Result<T, E>, context: &str, what: &str) -> T {
    result.unwrap_or_else(|error| panic!("{context}: {what}: {error}"))
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let seed = std::env::var("JOURNAL_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("journal crash test seed: {seed} (rerun with JOURNAL_CRASH_SEED={seed})");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("seed {seed}: a temp dir: {e}"));
    let path = dir.path().join("journal.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("seed {seed}: a runtime: {e}"));
    let mut acked = Acked::new();
    // Stored batches that were never acknowledged (their child died in between).
    let mut unacked = Acked::new();
    let mut highest: BTreeMap<usize, u64> = BTreeMap::new();
    let (mut kills, mut self_kills, mut acks_total) = (0, 0, 0);
    // Kills that landed after a commit and before its ACK, and the batches they caught so.
    let (mut kills_after_commit, mut committed_unacked) = (0, 0);
    for round in 0..KILLS {
        let config = Config::random(&mut rng);
        let context = format!("seed {seed}, round {round}, {config:?}");
        let stderr_path = dir.path().join(format!("child-{round}.stderr"));
        let stderr = ok(File::create(&stderr_path), &context, "the child's stderr");
        let (mut child, said) = spawn_child(&path, &config, stderr, &context);
        // A child that kills itself is left to it.
        let kill_after_acks = if config.die_at_ack > 0 {
            u64::MAX
        } else {
            rng.random_range(0..=120)
        };
        let extra_delay = Duration::from_micros(rng.random_range(0..2_000));

        // Returns 1 for an acknowledged batch.
        let mut record = |said: Said| match said {
            Said::Start { s, highest: h } => {
                assert_eq!(
                    h,
                    highest.get(&s).copied().unwrap_or(0),
                    "{context}: the child resumed stream {s} at the wrong seq"
                );
                0
            }
            Said::Ack { s, first, last } => {
                acked.entry(s).or_default().insert(first, last);
                1
            }
            Said::Other(line) => {
                assert!(
                    line == "DONE",
                    "{context}: the child said {line:?}; stderr: {}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
                0
            }
        };
        let mut acks = 0;
        while acks < kill_after_acks {
            match said.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => acks += record(line),
                Err(_) => break, // the child is done (or hung: the status below tells)
            }
        }
        std::thread::sleep(extra_delay);
        let still_running = ok(child.try_wait(), &context, "the child's status").is_none();
        // `Child::kill` sends SIGKILL on Unix (std documents it as equivalent): no handler,
        // no cleanup, no flush; the process dies between two instructions.
        ok(child.kill(), &context, "SIGKILL the child");
        let status = ok(child.wait(), &context, "reap the child");
        for line in said.iter() {
            acks += record(line); // printed before it died: acknowledged all the same
        }
        if still_running || config.die_at_ack > 0 {
            assert_eq!(status.signal(), Some(9), "{context}: {status}");
            kills += 1;
            self_kills += usize::from(!still_running);
        } else {
            assert!(
                status.success(),
                "{context}: the child failed: {status}; stderr: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        acks_total += acks;
        let verified = runtime.block_on(verify(&path, &acked, &unacked, &context));
        highest = verified.highest;
        kills_after_commit += usize::from(!verified.unacked.is_empty());
        committed_unacked += verified.unacked.len();
        for (s, first, last) in verified.unacked {
            unacked.entry(s).or_default().insert(first, last);
        }
    }
    assert!(kills >= 20, "seed {seed}: only {kills} kills");
    assert!(acks_total > 0, "seed {seed}: nothing was ever acknowledged");
    assert!(
        kills_after_commit >= MIN_KILLS_AFTER_COMMIT,
        "seed {seed}: only {kills_after_commit} kills landed between a commit and its ACK"
    );
    eprintln!(
        "seed {seed}: {kills} kills ({self_kills} by the child itself right after an ACK), \
         {acks_total} acknowledged batches; {kills_after_commit} \
         kills between a commit and its ACK ({committed_unacked} batches committed, not ACKed)"
    );
}

/// What [`verify`] found.
struct Verified {
    /// Each stream's highest seq.
    highest: BTreeMap<usize, u64>,
    /// Batches stored that no child acknowledged and no earlier check found: this child died
    /// after their commit, before its ACK.
    unacked: Vec<(usize, u64, u64)>,
}

/// Reopens the file and checks every stream: gapless from 1, each payload exactly as
/// written, batches whole, every acknowledged batch present. Returns the stored batches that
/// are neither acknowledged nor in `earlier` (found unacknowledged by an earlier check).
async fn verify(path: &Path, acked: &Acked, earlier: &Acked, context: &str) -> Verified {
    let journal = ok(
        process::open_journal(path).await,
        context,
        "reopen the journal",
    );
    let mut highest = BTreeMap::new();
    let mut unacked = Vec::new();
    for s in 0..8 {
        let id = stream(s);
        let top = ok(journal.highest_seq(&id).await, context, "highest_seq");
        let mut batches = BTreeMap::new();
        let mut open_batch: Option<(u64, u64)> = None;
        let mut expected = 1;
        let last = replay_all(&journal, &id, 1, u64::MAX, 256, |event| {
            assert_eq!(event.seq, expected, "{context}: stream {s} has a gap");
            expected += 1;
            let (from, seq, first, last) = batch_of(&event.payload)
                .unwrap_or_else(|| panic!("{context}: stream {s} seq {}: garbage", event.seq));
            assert_eq!((from, seq), (s, event.seq), "{context}: misplaced event");
            assert_eq!(
                event.payload,
                payload(s, seq, first, last),
                "{context}: stream {s} seq {seq}: payload differs"
            );
            match open_batch {
                Some(batch) if seq > batch.0 => {
                    assert_eq!(
                        (first, last),
                        batch,
                        "{context}: stream {s} seq {seq}: mixed batches"
                    );
                }
                _ => {
                    assert_eq!(
                        first, seq,
                        "{context}: stream {s} seq {seq}: batch begins mid-way"
                    );
                    batches.insert(first, last);
                }
            }
            open_batch = (seq < last).then_some((first, last));
            Ok::<_, JournalError>(())
        })
        .await;
        let last = ok(last, context, &format!("replay stream {s}"));
        assert_eq!(
            last, top,
            "{context}: stream {s}: replay and highest_seq disagree"
        );
        assert_eq!(
            open_batch, None,
            "{context}: stream {s}: the last batch is partial"
        );
        let mine = acked.get(&s);
        for (&first, &last) in mine.into_iter().flatten() {
            assert_eq!(
                batches.get(&first),
                Some(&last),
                "{context}: stream {s}: acknowledged batch {first}..={last} is missing"
            );
        }
        let known = |first: &u64| {
            [mine, earlier.get(&s)]
                .into_iter()
                .flatten()
                .any(|batches| batches.contains_key(first))
        };
        for (&first, &last) in &batches {
            if !known(&first) {
                unacked.push((s, first, last));
            }
        }
        if top > 0 {
            highest.insert(s, top);
        }
    }
    journal.close().await;
    // Nothing hidden elsewhere: the reopened journal moved the buffer into event_journal.
    let conn = ok(
        rusqlite::Connection::open(path),
        context,
        "open with rusqlite",
    );
    let buffered: i64 = ok(
        conn.query_row("SELECT count(*) FROM event_buffer", [], |row| row.get(0)),
        context,
        "count event_buffer",
    );
    assert_eq!(buffered, 0, "{context}");
    let mut statement = ok(
        conn.prepare("SELECT persistence_id, count(*), max(seq_nr) FROM event_journal GROUP BY 1"),
        context,
        "prepare the count",
    );
    let stored: BTreeMap<String, (i64, i64)> = ok(
        statement
            .query_map([], |row| Ok((row.get(0)?, (row.get(1)?, row.get(2)?))))
            .and_then(Iterator::collect),
        context,
        "count event_journal",
    );
    let expected: BTreeMap<String, (i64, i64)> = highest
        .iter()
        .map(|(&s, &top)| (stream(s).to_string(), (top as i64, top as i64)))
        .collect();
    assert_eq!(stored, expected, "{context}");
    Verified { highest, unacked }
}

// --- Storage failures ---------------------------------------------------------------------

/// Appends single events round robin to `streams` until `stop` says so; returns what was
/// acknowledged per stream and the errors, in order.
async fn append_until(
    journal: &SqliteJournal,
    streams: usize,
    mut stop: impl FnMut(usize, &[JournalError]) -> bool,
) -> (Vec<u64>, Vec<JournalError>) {
    let mut next = vec![1u64; streams];
    let mut errors = Vec::new();
    for i in 0.. {
        if stop(i, &errors) {
            break;
        }
        let s = i % streams;
        let seq = next[s];
        match journal
            .append(&stream(s), seq, vec![payload(s, seq, seq, seq)])
            .await
        {
            Ok(()) => next[s] += 1,
            Err(err) => errors.push(err),
        }
    }
    (next.iter().map(|n| n - 1).collect(), errors)
}

/// Reopens `path` (without limits) and checks each stream holds exactly `acked[s]` events.
async fn assert_exactly(path: &Path, acked: &[u64]) {
    let journal = process::open_journal(path).await.unwrap();
    for (s, &count) in acked.iter().enumerate() {
        assert_eq!(
            journal.highest_seq(&stream(s)).await,
            Ok(count),
            "stream {s}"
        );
        let events = journal
            .replay(&stream(s), 1, u64::MAX, usize::MAX)
            .await
            .unwrap();
        assert_eq!(events.len() as u64, count, "stream {s}");
        for event in events {
            assert_eq!(event.payload, payload(s, event.seq, event.seq, event.seq));
        }
    }
    journal.close().await;
}

#[tokio::test]
async fn a_full_disk_fails_appends_and_acknowledges_only_what_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let options = SqliteOptions::builder()
        .max_size_bytes(Some(256 * 1024))
        .buffer_events(64)
        .build()
        .unwrap();
    let journal = SqliteJournal::open_with(&path, options).await.unwrap();
    let (acked, errors) =
        append_until(&journal, 4, |i, errors| errors.len() >= 8 || i > 5_000).await;
    assert!(
        acked.iter().sum::<u64>() > 20,
        "some appends fit: {acked:?}"
    );
    assert_eq!(errors.len(), 8, "the cap was never reached: {acked:?}");
    for err in &errors {
        assert!(
            matches!(err, JournalError::Storage { persistence_id: Some(_), message } if message.contains("full")),
            "{err:?}"
        );
    }
    journal.close().await;
    assert_exactly(&path, &acked).await;
}

/// Makes a file read-only until dropped: immutable (`chattr +i`, which binds root and
/// writes through descriptors already open) or, with `permissions_do`, read-only by its mode
/// (which binds a user who is not root, for files opened afterwards). `None` when neither can
/// be done here (not root and no `chattr`, or a file system without the attribute).
struct ReadOnly {
    path: PathBuf,
    mode: Option<std::fs::Permissions>,
}

impl ReadOnly {
    fn new(path: &Path, permissions_do: bool) -> Option<Self> {
        let writable = || std::fs::OpenOptions::new().append(true).open(path).is_ok();
        let chattr = Command::new("chattr").arg("+i").arg(path).status();
        if matches!(chattr, Ok(status) if status.success()) && !writable() {
            return Some(Self {
                path: path.to_path_buf(),
                mode: None,
            });
        }
        let _ = Command::new("chattr").arg("-i").arg(path).status();
        let mode = std::fs::metadata(path).ok()?.permissions();
        let mut read_only = mode.clone();
        read_only.set_readonly(true);
        if permissions_do && std::fs::set_permissions(path, read_only).is_ok() && !writable() {
            return Some(Self {
                path: path.to_path_buf(),
                mode: Some(mode),
            });
        }
        let _ = std::fs::set_permissions(path, mode);
        eprintln!(
            "skipped: cannot make {} read-only here (chattr +i needs root and a file system \
             that has the attribute)",
            path.display()
        );
        None
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        match &self.mode {
            None => {
                let _ = Command::new("chattr").arg("-i").arg(&self.path).status();
            }
            Some(mode) => {
                let _ = std::fs::set_permissions(&self.path, mode.clone());
            }
        }
    }
}

#[tokio::test]
async fn a_read_only_file_is_refused_at_open_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = process::open_journal(&path).await.unwrap();
    let (acked, _) = append_until(&journal, 2, |i, _| i == 10).await;
    journal.close().await;
    let before = std::fs::read(&path).unwrap();
    {
        let Some(_read_only) = ReadOnly::new(&path, true) else {
            return;
        };
        let result = process::open_journal(&path).await;
        assert!(
            matches!(&result, Err(JournalError::Storage { persistence_id: None, message }) if message.contains("read-only")),
            "{:?}",
            result.err()
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_exactly(&path, &acked).await;
}

#[tokio::test]
async fn a_write_ahead_log_turning_read_only_fails_appends_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = process::open_journal(&path).await.unwrap();
    let (mut acked, errors) = append_until(&journal, 3, |i, _| i == 30).await;
    assert!(errors.is_empty());
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    {
        // Only the immutable attribute stops writes through the writer's open descriptor.
        let Some(_read_only) = ReadOnly::new(&wal, false) else {
            return;
        };
        for (s, &count) in acked.iter().enumerate() {
            let seq = count + 1;
            let result = journal
                .append(&stream(s), seq, vec![payload(s, seq, seq, seq)])
                .await;
            assert!(
                matches!(&result, Err(JournalError::Storage { persistence_id: Some(id), .. }) if *id == stream(s)),
                "stream {s}: {result:?}"
            );
        }
        // Reads still work from what was committed.
        assert_eq!(journal.highest_seq(&stream(0)).await, Ok(acked[0]));
    }
    // Writable again: the journal goes on where the stored events end.
    for (s, count) in acked.iter_mut().enumerate() {
        let seq = *count + 1;
        journal
            .append(&stream(s), seq, vec![payload(s, seq, seq, seq)])
            .await
            .unwrap();
        *count = seq;
    }
    journal.close().await;
    assert_exactly(&path, &acked).await;
}
