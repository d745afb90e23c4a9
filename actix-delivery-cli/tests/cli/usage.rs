//! The inspector's usage: every command's help, and bad input refused with exit code 2 (or 3
//! for a server that cannot be reached), naming the argument.

use crate::support::{fixture_copy, run, sqlite};

const COMMANDS: [&str; 6] = [
    "streams",
    "events",
    "durable",
    "check",
    "backup",
    "dead-letters",
];

#[test]
fn the_help_of_every_command_succeeds_and_gives_the_exit_codes_and_the_write_rule() {
    let mut helps = vec![run(["--help"])];
    for command in COMMANDS {
        helps.push(run([command, "--help"]));
        helps.push(run(["help", command]));
    }
    for help in helps {
        let help = help.expect(0);
        for expected in [
            "Exit codes:",
            "  1  problems found",
            "  2  usage or bad input",
            "  3  storage or connection error",
            "--write",
            "Read-only by default",
            "--sqlite <PATH>",
            "--postgres <CONNECTION>",
        ] {
            assert!(help.stdout.contains(expected), "{expected}: {help:?}");
        }
    }
    let top = run(["--help"]);
    for command in COMMANDS {
        assert!(
            top.stdout.contains(&format!("  {command}")),
            "{command}: {top:?}"
        );
    }
    run(["--version"]).expect(0);
}

#[test]
fn the_help_of_the_dead_letter_commands_gives_the_exit_codes_and_sends_replays_to_the_console() {
    let group = run(["dead-letters", "--help"]).expect(0);
    for expected in [
        "  list",
        "  show",
        "  delete",
        "  replay",
        "through the running application's admin console",
        "DeadLetters::on_replay",
    ] {
        assert!(group.stdout.contains(expected), "{expected}: {group:?}");
    }
    for action in ["list", "show", "delete", "replay"] {
        for help in [
            run(["dead-letters", action, "--help"]),
            run(["help", "dead-letters", action]),
        ] {
            let help = help.expect(0);
            for expected in [
                "Exit codes:",
                "  0  done",
                "  2  usage or bad input",
                "  3  storage or connection error",
                "--write",
                "--json",
            ] {
                assert!(
                    help.stdout.contains(expected),
                    "{action}: {expected}: {help:?}"
                );
            }
        }
    }
    let list = run(["dead-letters", "list", "--help"]).expect(0);
    for option in [
        "--cause <C>",
        "--kind <K>",
        "--source <S>",
        "--since-ms <N>",
        "--until-ms <N>",
        "--after <ID>",
        "--limit <N>",
    ] {
        assert!(list.stdout.contains(option), "{option}: {list:?}");
    }
    let delete = run(["dead-letters", "delete", "--help"]).expect(0);
    assert!(delete.stdout.contains("needs --write"), "{delete:?}");
    let replay = run(["dead-letters", "replay", "--help"]).expect(0);
    for expected in [
        "needs --write",
        "--console <URL>",
        "--token-env <VAR>",
        "ACTIX_DELIVERY_ADMIN_TOKEN",
        "Plain http:// only",
        "never from the command line",
        "in doubt",
        "POST <URL>/dead-letters/ID/replay",
    ] {
        assert!(replay.stdout.contains(expected), "{expected}: {replay:?}");
    }
}

#[test]
fn malformed_numbers_and_arguments_are_refused_naming_the_argument() {
    let (_dir, file) = fixture_copy();
    for (args, named) in [
        (
            &["events", "account-1", "--from", "abc"][..],
            "--from <SEQ>",
        ),
        (&["events", "account-1", "--from", "0"], "--from <SEQ>"),
        (&["events", "account-1", "--limit", "-3"], "--limit"),
        (&["events", "account-1", "--limit", "0"], "--limit <N>"),
        (&["streams", "--limit", "1e3"], "--limit <N>"),
        (&["check", "--max-problems", "many"], "--max-problems <N>"),
        (&["streams", "--after", ""], "--after <ID>"),
        (&["events"], "<STREAM>"),
        (&["dead-letters", "show", "x"], "<ID>"),
        (&["dead-letters", "delete", "-1", "--write"], "<ID>"),
        (&["dead-letters"], "dead-letters"),
        (&["frobnicate"], "frobnicate"),
    ] {
        let refused = sqlite(&file, args).expect(2);
        assert!(refused.stderr.contains(named), "{args:?}: {refused:?}");
        assert!(refused.stdout.is_empty(), "{args:?}: {refused:?}");
    }
}

#[test]
fn which_journal_must_be_given_once() {
    let none = run(["streams"]).expect(2);
    assert!(
        none.stderr
            .contains("--sqlite PATH or --postgres CONNECTION"),
        "{none:?}"
    );
    let both = run(["--sqlite", "a", "--postgres", "host=x", "streams"]).expect(2);
    assert!(both.stderr.contains("--sqlite"), "{both:?}");
    assert!(both.stderr.contains("cannot be used with"), "{both:?}");
    let schema = run(["--sqlite", "a", "--schema", "journal", "streams"]).expect(2);
    assert!(schema.stderr.contains("--postgres"), "{schema:?}");
}

#[test]
fn bad_postgres_arguments_are_refused_before_connecting_and_never_echo_the_password() {
    let secret = "s3cr3t-pw";
    let unparsable = run([
        "--postgres",
        &format!("host=127.0.0.1 user=u passwrd={secret}"),
        "streams",
    ])
    .expect(2);
    assert!(unparsable.stderr.contains("--postgres"), "{unparsable:?}");
    assert!(
        unparsable.stderr.contains("unknown option `passwrd`"),
        "{unparsable:?}"
    );
    assert!(!unparsable.stderr.contains(secret), "{unparsable:?}");

    let schema = run([
        "--postgres",
        "host=127.0.0.1",
        "--schema",
        "Bad-Name",
        "streams",
    ])
    .expect(2);
    assert!(schema.stderr.contains("--schema"), "{schema:?}");
    assert!(schema.stderr.contains("\"Bad-Name\""), "{schema:?}");

    let backup = run(["--postgres", "host=127.0.0.1", "backup", "/tmp/never"]).expect(2);
    assert!(backup.stderr.contains("pg_dump"), "{backup:?}");
    assert!(backup.stderr.contains("pg_basebackup"), "{backup:?}");
}

#[test]
fn a_server_that_refuses_the_connection_is_a_storage_error_with_exit_code_3() {
    // Port 1 on the loopback interface: nothing listens there.
    let refused = run([
        "--postgres",
        "host=127.0.0.1 port=1 user=postgres dbname=test password=hunter2 connect_timeout=5",
        "check",
    ])
    .expect(3);
    assert!(refused.stderr.contains("--postgres"), "{refused:?}");
    assert!(
        refused.stderr.contains("cannot connect to PostgreSQL"),
        "{refused:?}"
    );
    assert!(refused.stderr.contains("Connection refused"), "{refused:?}");
    assert!(!refused.stderr.contains("hunter2"), "{refused:?}");
}
