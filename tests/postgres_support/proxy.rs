//! A TCP proxy on 127.0.0.1 in front of the PostgreSQL server that cuts a connection right
//! after the server has committed a transaction and before its client hears so: it forwards
//! everything, watches what the server sends for the `CommandComplete` of a `COMMIT`
//! (PostgreSQL sends it only once the commit is durable), and when armed drops both sides
//! of the connection instead of forwarding it. The client then sees a lost connection for a
//! transaction that is stored: an outcome it can only report as unknown.
//!
//! `pg_terminate_backend` cannot make this happen (the server ends a session only where a
//! commit has not begun or has been confirmed), so this is the fault that tells a journal
//! that reports "not stored" for an unknown outcome.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// The server's `CommandComplete` message for a `COMMIT`: type `C`, length 11, the tag.
const COMMIT_COMPLETE: &[u8] = b"C\0\0\0\x0bCOMMIT\0";

/// The proxy: forwards connections to the server of [`super::url`] until dropped.
pub struct CommitCutter {
    addr: SocketAddr,
    config: Config,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    /// Cut this many more connections at a commit's answer.
    cuts_left: AtomicU64,
    /// Let this many commits' answers through before each cut…
    spare: AtomicU64,
    /// … of which this many are still to come before the next.
    spare_left: AtomicU64,
    commits_seen: AtomicU64,
    cuts: AtomicU64,
    connections: AtomicU64,
}

impl CommitCutter {
    /// Starts the proxy on an ephemeral port of 127.0.0.1, unarmed (it forwards everything).
    pub async fn start() -> Self {
        let config = Config::from_str(&super::url()).unwrap();
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            other => panic!("the commit cutter needs a TCP server address, not {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = if host == "localhost" {
            "127.0.0.1".into()
        } else {
            host
        };
        let target: SocketAddr = format!("{host}:{port}").parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let accept = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue; // the client sees its connection closed
                    };
                    state.connections.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(forward(client, server, state.clone()));
                }
            }
        });
        Self {
            addr,
            config,
            state,
            accept,
        }
    }

    /// A connection string to the server through the proxy, with `application_name`.
    pub fn url(&self, application_name: &str) -> String {
        let mut url = format!(
            "host={} port={} application_name={application_name}",
            self.addr.ip(),
            self.addr.port()
        );
        if let Some(user) = self.config.get_user() {
            url.push_str(&format!(" user={user}"));
        }
        if let Some(dbname) = self.config.get_dbname() {
            url.push_str(&format!(" dbname={dbname}"));
        }
        if let Some(password) = self.config.get_password() {
            url.push_str(&format!(" password={}", String::from_utf8_lossy(password)));
        }
        url
    }

    /// From now on, cuts `cuts` connections at a commit's answer, letting `spare` commits
    /// through before each cut (so that work goes on in between).
    pub fn arm(&self, cuts: u64, spare: u64) {
        self.state.spare.store(spare, Ordering::Relaxed);
        self.state.spare_left.store(spare, Ordering::Relaxed);
        self.state.cuts_left.store(cuts, Ordering::Relaxed);
    }

    /// Connections cut at a commit's answer so far.
    pub fn cuts(&self) -> u64 {
        self.state.cuts.load(Ordering::Relaxed)
    }

    /// Commits' answers seen (forwarded or cut) so far.
    pub fn commits_seen(&self) -> u64 {
        self.state.commits_seen.load(Ordering::Relaxed)
    }

    /// Connections made through the proxy so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }
}

impl Drop for CommitCutter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Forwards one connection both ways until either side closes or a cut; then drops both.
async fn forward(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = copy(client_read, server_write) => {}
        () = answers(server_read, client_write, &state) => {}
    }
}

/// Client to server: everything, as it comes.
async fn copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let mut buffer = vec![0; 64 << 10];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Server to client: everything, except that when armed a commit's answer ends the
/// connection instead (whatever came before it in the same read is forwarded first).
async fn answers(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: &State) {
    let mut buffer = vec![0; 64 << 10];
    // The end of what was forwarded, so that a tag split across two reads is found too.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        let mut seen = tail.clone();
        seen.extend_from_slice(chunk);
        let mut forward_up_to = n;
        let mut from_index = 0;
        while let Some(at) = find(&seen[from_index..], COMMIT_COMPLETE) {
            let at = from_index + at;
            from_index = at + COMMIT_COMPLETE.len();
            state.commits_seen.fetch_add(1, Ordering::Relaxed);
            if take_cut(state) {
                forward_up_to = at.saturating_sub(tail.len());
                let _ = to.write_all(&chunk[..forward_up_to]).await;
                state.cuts.fetch_add(1, Ordering::Relaxed);
                return; // drops both directions: the client never hears of the commit
            }
        }
        if to.write_all(&chunk[..forward_up_to]).await.is_err() {
            return;
        }
        let keep = seen.len().min(COMMIT_COMPLETE.len() - 1);
        tail = seen[seen.len() - keep..].to_vec();
    }
}

/// Whether to cut at this commit's answer: armed, and the spare commits since the last cut
/// have passed.
fn take_cut(state: &State) -> bool {
    if state.cuts_left.load(Ordering::Relaxed) == 0 {
        return false;
    }
    if state.spare_left.load(Ordering::Relaxed) > 0 {
        state.spare_left.fetch_sub(1, Ordering::Relaxed);
        return false;
    }
    let cut = state
        .cuts_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    if cut {
        let spare = state.spare.load(Ordering::Relaxed);
        state.spare_left.store(spare, Ordering::Relaxed);
    }
    cut
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
