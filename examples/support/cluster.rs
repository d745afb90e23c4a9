//! What the examples that run several node processes share (`#[path]`-included): where the
//! servers are, and starting this program again as a node.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

/// The PostgreSQL server: `ACTIX_DELIVERY_POSTGRES`, as for the tests.
pub fn postgres() -> String {
    std::env::var("ACTIX_DELIVERY_POSTGRES")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into())
}

/// The NATS server: `ACTIX_DELIVERY_NATS_URL`, as for the tests.
pub fn nats() -> String {
    std::env::var("ACTIX_DELIVERY_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Runs this program again with `args` (a node), its stdin and stdout piped; returns it and
/// the first line it printed (once it is ready). Closing its stdin tells it to end.
pub fn spawn_node(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("a node process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the node starts");
    (child, line.trim().to_owned())
}

/// Waits (without blocking the arbiter) until this node's stdin closes.
pub async fn until_stdin_closes() {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        while std::io::stdin()
            .lock()
            .read_line(&mut line)
            .is_ok_and(|n| n > 0)
        {}
    })
    .await
    .expect("stdin");
}
