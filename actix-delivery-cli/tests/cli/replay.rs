//! `dead-letters replay` through the application's admin console: a console (the library's
//! `admin::Console`) served by actix-web in this process, over a memory dead-letter store
//! whose `deposits` letters replay into an `Account` entity effectively once
//! (`ask_delivered` on the replay's id), whose `failing` letters have a route that fails, and
//! whose `slow` letters a route that waits until the test releases it.
//! The binary replays without any journal option; refuses without --write, for an unknown id,
//! an entry that does not decode as its route's type, a bearer token the console refuses, an
//! https:// or unreachable console; and reports a failed route as in doubt, or as applying
//! nothing when its route says so (exit 1).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::admin::Console;
use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::dead_letters::{
    DeadLetterCause, DeadLetterError, DeadLetterLimits, DeadLetters, MemoryDeadLetters,
    NewDeadLetter, Replay, Replayed, RouteError, SourceKind,
};
use actix_delivery::journal::MemoryJournal;
use actix_delivery::persistence::{Outcome, PersistentHandle, PersistentOptions};
use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer};
use serde_json::json;

use crate::support::{id, run_env, Account, Run};

/// The variable the binary reads the bearer token from by default.
const TOKEN_ENV: &str = "ACTIX_DELIVERY_ADMIN_TOKEN";

/// A console served in this process, and what it replays into.
struct Served {
    /// The console's scope: `http://127.0.0.1:<port>/admin`.
    url: String,
    dead_letters: DeadLetters,
    account: PersistentHandle<Account>,
    /// Set: the `slow` route ends.
    released: Arc<AtomicBool>,
    server: ServerHandle,
}

impl Served {
    /// Serves a console over a new store (requiring `bearer`, if given), its `deposits`
    /// letters replayed into a new account, its `failing` letters into a route that fails.
    async fn start(bearer: Option<&str>) -> Self {
        let dead_letters =
            DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
        let account = PersistentHandle::<Account>::start(PersistentOptions::new(
            Arc::new(MemoryJournal::new()),
            id("account-replayed"),
        ))
        .unwrap();
        let destination = account.clone();
        dead_letters.on_replay("deposits", move |replay: Replay<i64>| {
            let answer = destination.ask_delivered(replay.info, replay.body);
            async move {
                match answer.await {
                    Ok(Outcome::Done(_)) => Ok(Replayed::Applied),
                    Ok(Outcome::AlreadyProcessed) => Ok(Replayed::AlreadyApplied),
                    Err(error) => Err(error.to_string().into()),
                }
            }
        });
        dead_letters.on_replay("failing", |_: Replay<i64>| async {
            Err::<Replayed, _>("the destination is down".into())
        });
        dead_letters.on_replay("refusing", |_: Replay<i64>| async {
            Err::<Replayed, _>(RouteError::certainly_not("the account is closed"))
        });
        let released = Arc::new(AtomicBool::new(false));
        let gate = released.clone();
        dead_letters.on_replay("slow", move |_: Replay<i64>| {
            let gate = gate.clone();
            async move {
                while !gate.load(Ordering::SeqCst) {
                    actix_rt::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(Replayed::Applied)
            }
        });
        let console = Console::new();
        console.dead_letters(&dead_letters);
        if let Some(token) = bearer {
            console.require_bearer(token).unwrap();
        }
        let server = HttpServer::new(move || App::new().service(console.scope("/admin")))
            .workers(1)
            .disable_signals()
            .bind(("127.0.0.1", 0))
            .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix::spawn(server);
        Self {
            url: format!("http://{addr}/admin"),
            dead_letters,
            account,
            released,
            server: handle,
        }
    }

    /// Keeps a letter of `source` whose MessagePack body is `body` (its key: both; a letter of
    /// the same key would update the entry); its id.
    async fn keep(&self, source: &str, value: &serde_json::Value) -> u64 {
        let body = Codec::MessagePack.encode(value, 1 << 20).unwrap();
        let letter = NewDeadLetter {
            kind: SourceKind::WorkPulling,
            source: source.to_owned(),
            cause: DeadLetterCause::GivenUp,
            key: format!("{source}/{value}"),
            origin: None,
            manifest: Manifest::new(Codec::MessagePack, "i64", 1),
            body_len: body.len() as u64,
            body: Some(body),
            attempts: 3,
            error: "no worker confirmed it".to_owned(),
        };
        self.dead_letters.keep(letter).await.unwrap().id
    }

    /// Whether the entry `id` is still kept.
    async fn kept(&self, id: u64) -> bool {
        match self.dead_letters.get(id).await {
            Ok(_) => true,
            Err(DeadLetterError::NotFound(_)) => false,
            Err(error) => panic!("{error}"),
        }
    }

    /// The account's balance.
    async fn balance(&self) -> i64 {
        self.account.ask(0).await.unwrap()
    }

    async fn stop(self) {
        self.server.stop(true).await;
        self.account.stop();
    }
}

/// Runs the binary with `args` off the test's System (the console's routes run on it), each
/// variable of `env` set (or removed), and the default token variable removed unless given.
async fn cli(args: &[&str], env: &[(&str, Option<&str>)]) -> Run {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut env: Vec<(String, Option<String>)> = env
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.map(str::to_owned)))
        .collect();
    if !env.iter().any(|(name, _)| name == TOKEN_ENV) {
        env.push((TOKEN_ENV.to_owned(), None));
    }
    actix_rt::task::spawn_blocking(move || {
        let env: Vec<(&str, Option<&str>)> = env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref()))
            .collect();
        run_env(&args, &env)
    })
    .await
    .unwrap()
}

#[actix::test]
async fn a_dead_letter_is_replayed_through_the_console_once_with_write_and_no_journal() {
    let served = Served::start(None).await;
    let deposit = served.keep("deposits", &json!(25)).await;
    let already = served.keep("deposits", &json!(40)).await;
    let text = |id: u64| id.to_string();

    // Without --write: refused, nothing changed.
    let refused = cli(
        &[
            "dead-letters",
            "replay",
            &text(deposit),
            "--console",
            &served.url,
        ],
        &[],
    )
    .await
    .expect(2);
    assert!(refused.stderr.contains("--write"), "{refused:?}");
    assert!(
        refused.stderr.contains("nothing was changed"),
        "{refused:?}"
    );
    assert!(served.kept(deposit).await);
    assert_eq!(served.balance().await, 0);

    // A journal option: refused, the console's store is the one replayed from.
    let journal = cli(
        &[
            "--sqlite",
            "orders.journal",
            "--write",
            "dead-letters",
            "replay",
            &text(deposit),
            "--console",
            &served.url,
        ],
        &[],
    )
    .await
    .expect(2);
    assert!(journal.stderr.contains("--sqlite"), "{journal:?}");
    assert!(
        journal.stderr.contains("takes no journal option"),
        "{journal:?}"
    );
    assert!(served.kept(deposit).await);

    // With --write: applied, the entry gone.
    let replayed = cli(
        &[
            "--write",
            "dead-letters",
            "replay",
            &text(deposit),
            "--console",
            &format!("{}/", served.url),
        ],
        &[],
    )
    .await
    .expect(0);
    assert_eq!(
        replayed.stdout.trim_end(),
        format!("replayed dead letter {deposit} (given_up, work_pulling `deposits`): applied"),
        "{replayed:?}"
    );
    assert!(!served.kept(deposit).await, "removed once replayed");
    assert_eq!(served.balance().await, 25, "applied once");

    // Gone: an unknown id, nothing changed.
    let again = cli(
        &[
            "--write",
            "dead-letters",
            "replay",
            &text(deposit),
            "--console",
            &served.url,
        ],
        &[],
    )
    .await
    .expect(2);
    assert!(
        again.stderr.contains(&format!("no dead letter {deposit}")),
        "{again:?}"
    );
    let unknown = cli(
        &[
            "--write",
            "dead-letters",
            "replay",
            "999999",
            "--console",
            &served.url,
        ],
        &[],
    )
    .await
    .expect(2);
    assert!(
        unknown.stderr.contains("no dead letter 999999"),
        "{unknown:?}"
    );
    assert!(unknown.stderr.contains("nothing changed"), "{unknown:?}");

    // Applied before (as a replay that crashed before the removal would leave it): recognised,
    // not applied twice.
    let info = served.dead_letters.replay_info("deposits", already);
    let outcome = served.account.ask_delivered(info, 40).await.unwrap();
    assert!(matches!(outcome, Outcome::Done(65)), "{outcome:?}");
    let recognised = cli(
        &[
            "--json",
            "--write",
            "dead-letters",
            "replay",
            &text(already),
            "--console",
            &served.url,
        ],
        &[],
    )
    .await
    .expect(0);
    assert_eq!(
        recognised.json_lines(),
        [json!({ "id": already, "replayed": "already_applied" })]
    );
    assert!(!served.kept(already).await);
    assert_eq!(served.balance().await, 65, "applied once");
    served.stop().await;
}

#[actix::test]
async fn entries_the_application_cannot_replay_stay_and_a_failed_route_says_whether_it_applied() {
    let served = Served::start(None).await;
    let unreadable = served.keep("deposits", &json!("not a number")).await;
    let no_route = served.keep("nobody", &json!(5)).await;
    let failing = served.keep("failing", &json!(7)).await;
    let replay = |id: u64| {
        let url = served.url.clone();
        async move {
            cli(
                &[
                    "--write",
                    "dead-letters",
                    "replay",
                    &id.to_string(),
                    "--console",
                    &url,
                ],
                &[],
            )
            .await
        }
    };

    let refused = replay(unreadable).await.expect(2);
    assert!(refused.stderr.contains("cannot be replayed"), "{refused:?}");
    assert!(
        refused.stderr.contains("type `i64` version 1"),
        "the server's error: {refused:?}"
    );
    assert!(refused.stderr.contains("nothing changed"), "{refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");
    let routeless = replay(no_route).await.expect(2);
    assert!(
        routeless
            .stderr
            .contains("no replay route for source `nobody`"),
        "{routeless:?}"
    );

    let failed = replay(failing).await.expect(1);
    assert!(
        failed.stderr.contains("the destination is down"),
        "{failed:?}"
    );
    assert!(failed.stderr.contains("the entry is kept"), "{failed:?}");
    assert!(failed.stderr.contains("in doubt"), "{failed:?}");
    // A route that knows its destination refused it says so, and so does the replay.
    let refusing = served.keep("refusing", &json!(3)).await;
    let refused = replay(refusing).await.expect(1);
    assert!(
        refused.stderr.contains("the account is closed")
            && refused.stderr.contains("nothing was applied")
            && !refused.stderr.contains("in doubt"),
        "{refused:?}"
    );

    // A replay of the entry already running (the page, another operator): nothing changed.
    let slow = served.keep("slow", &json!(9)).await;
    let running = actix_rt::spawn({
        let dead_letters = served.dead_letters.clone();
        async move { dead_letters.replay(slow).await }
    });
    actix_rt::time::sleep(Duration::from_millis(50)).await;
    let busy = replay(slow).await.expect(2);
    assert!(busy.stderr.contains("already running"), "{busy:?}");
    assert!(busy.stderr.contains("nothing changed"), "{busy:?}");
    served.released.store(true, Ordering::SeqCst);
    assert_eq!(running.await.unwrap(), Ok(Replayed::Applied));
    assert!(
        !served.kept(slow).await,
        "replayed once, by the first replay"
    );

    for id in [unreadable, no_route, failing, refusing] {
        assert!(served.kept(id).await, "{id} is kept");
    }
    let failures = |id| {
        let dead_letters = served.dead_letters.clone();
        async move { dead_letters.get(id).await.unwrap().replay_failures }
    };
    assert_eq!(failures(unreadable).await, 0, "nothing changed");
    assert_eq!(failures(failing).await, 1, "the failed replay is noted");
    assert_eq!(served.balance().await, 0);
    served.stop().await;
}

#[actix::test]
async fn the_bearer_token_is_read_from_the_variable_and_a_refused_one_is_named() {
    let secret = "s3cret-admin-token";
    let served = Served::start(Some(secret)).await;
    let deposit = served.keep("deposits", &json!(3)).await;
    let args = |extra: &[&str]| {
        let mut args = vec![
            "--write".to_owned(),
            "dead-letters".to_owned(),
            "replay".to_owned(),
            deposit.to_string(),
            "--console".to_owned(),
            served.url.clone(),
        ];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    };
    let run = |args: Vec<String>, env: Vec<(&'static str, Option<&'static str>)>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&args, &env).await
    };

    // No token: the default variable is named, unset.
    let missing = run(args(&[]), vec![]).await.expect(2);
    assert!(missing.stderr.contains(TOKEN_ENV), "{missing:?}");
    assert!(missing.stderr.contains("not set"), "{missing:?}");
    assert!(missing.stderr.contains("401"), "{missing:?}");

    // A wrong token: its variable named, the token never echoed.
    let wrong = run(
        args(&["--token-env", "MY_CONSOLE_TOKEN"]),
        vec![("MY_CONSOLE_TOKEN", Some("not-the-token"))],
    )
    .await
    .expect(2);
    assert!(wrong.stderr.contains("MY_CONSOLE_TOKEN"), "{wrong:?}");
    assert!(wrong.stderr.contains("does not accept"), "{wrong:?}");
    assert!(!wrong.stderr.contains("not-the-token"), "{wrong:?}");

    // A variable named but unset: refused before connecting.
    let unset = run(
        args(&["--token-env", "MY_CONSOLE_TOKEN"]),
        vec![("MY_CONSOLE_TOKEN", None)],
    )
    .await
    .expect(2);
    assert!(unset.stderr.contains("MY_CONSOLE_TOKEN"), "{unset:?}");
    assert!(unset.stderr.contains("is not set"), "{unset:?}");

    assert!(served.kept(deposit).await, "nothing changed");
    assert_eq!(served.balance().await, 0);

    // The right token, from the default variable.
    let replayed = run(args(&[]), vec![(TOKEN_ENV, Some(secret))])
        .await
        .expect(0);
    assert!(replayed.stdout.contains(": applied"), "{replayed:?}");
    assert!(!replayed.stdout.contains(secret) && !replayed.stderr.contains(secret));
    assert!(!served.kept(deposit).await);
    assert_eq!(served.balance().await, 3);
    served.stop().await;
}

#[actix::test]
async fn a_console_nobody_listens_on_is_a_connection_error_and_only_http_is_taken() {
    // Port 1 on the loopback interface: nothing listens there.
    let refused = cli(
        &[
            "--write",
            "dead-letters",
            "replay",
            "1",
            "--console",
            "http://127.0.0.1:1/admin",
        ],
        &[],
    )
    .await
    .expect(3);
    assert!(
        refused.stderr.contains("cannot reach the console"),
        "{refused:?}"
    );
    assert!(refused.stderr.contains("Connection refused"), "{refused:?}");
    assert!(refused.stderr.contains("nothing changed"), "{refused:?}");

    for (url, expected) in [
        ("https://127.0.0.1:8443/admin", "only http://"),
        ("127.0.0.1:8080/admin", "not an http:// URL"),
        (
            "http://admin:pw@127.0.0.1:8080/admin",
            "no user or password",
        ),
        ("http://127.0.0.1:8080/admin?x=1", "no query"),
    ] {
        let bad = cli(
            &["--write", "dead-letters", "replay", "1", "--console", url],
            &[],
        )
        .await
        .expect(2);
        assert!(bad.stderr.contains("--console"), "{url}: {bad:?}");
        assert!(bad.stderr.contains(expected), "{url}: {bad:?}");
        assert!(!bad.stderr.contains(":pw@"), "{url}: {bad:?}");
    }
    let no_console = cli(&["--write", "dead-letters", "replay", "1"], &[])
        .await
        .expect(2);
    assert!(
        no_console.stderr.contains("--console <URL>"),
        "{no_console:?}"
    );
}
