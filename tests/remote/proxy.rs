//! A TCP proxy on 127.0.0.1 that injects seeded faults into the byte streams it forwards:
//! it drops chunks (the stream is corrupted from there on), delays them, cuts connections,
//! half-closes one direction, stalls (forwards nothing for a while) and refuses connections.
//! Every fault is counted, so a test can check it really injected some. It can also record
//! the bytes of each connection, for replays.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Fault probabilities (per forwarded chunk, or per connection for `refuse`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub drop_chunk: f64,
    pub delay: f64,
    pub max_delay: Duration,
    pub cut: f64,
    pub half_close: f64,
    pub stall: f64,
    pub stall_for: Duration,
    pub refuse: f64,
    /// Keep every forwarded byte in [`Proxy::recorded`].
    pub record: bool,
}

/// How many faults of each kind were injected.
#[derive(Debug, Default)]
pub struct Injected {
    pub connections: AtomicU64,
    pub dropped_chunks: AtomicU64,
    pub delayed: AtomicU64,
    pub cuts: AtomicU64,
    pub half_closes: AtomicU64,
    pub stalls: AtomicU64,
    pub refused: AtomicU64,
    pub bytes: AtomicU64,
}

impl Injected {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The bytes of one proxied connection, both ways.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub to_server: Vec<u8>,
    pub to_client: Vec<u8>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub injected: Arc<Injected>,
    pub recorded: Arc<Mutex<Vec<Recorded>>>,
    faults: Arc<Mutex<Faults>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Forwards connections to `target` with `faults`, seeded.
    pub async fn start(target: SocketAddr, faults: Faults, seed: u64) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            injected: Arc::default(),
            recorded: Arc::default(),
            faults: Arc::new(Mutex::new(faults)),
            stop: CancellationToken::new(),
        };
        let (injected, recorded, shared_faults, stop) = (
            proxy.injected.clone(),
            proxy.recorded.clone(),
            proxy.faults.clone(),
            proxy.stop.clone(),
        );
        actix::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed);
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                injected.connections.fetch_add(1, Ordering::Relaxed);
                let faults = *shared_faults.lock().unwrap();
                if rng.random_bool(faults.refuse) {
                    injected.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let index = {
                    let mut recorded = recorded.lock().unwrap();
                    recorded.push(Recorded::default());
                    recorded.len() - 1
                };
                let conn_seed = rng.random();
                let ctx = Conn {
                    faults: shared_faults.clone(),
                    injected: injected.clone(),
                    recorded: recorded.clone(),
                    index,
                    cut: stop.child_token(),
                };
                actix::spawn(ctx.run(client, server, conn_seed));
            }
        });
        proxy
    }

    /// Changes the faults for chunks forwarded from now on.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    /// Stops accepting and cuts every connection.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct Conn {
    faults: Arc<Mutex<Faults>>,
    injected: Arc<Injected>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    index: usize,
    /// Cancelled: both directions end (a cut).
    cut: CancellationToken,
}

impl Conn {
    async fn run(self, client: TcpStream, server: TcpStream, seed: u64) {
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let up = self.clone().pump(client_read, server_write, true, seed);
        let down = self
            .clone()
            .pump(server_read, client_write, false, seed ^ 0x5555);
        tokio::join!(up, down);
    }

    async fn pump(self, mut from: OwnedReadHalf, mut to: OwnedWriteHalf, up: bool, seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                () = self.cut.cancelled() => return,
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => {
                        let _ = to.shutdown().await;
                        return;
                    }
                    Ok(n) => n,
                },
            };
            let faults = *self.faults.lock().unwrap();
            let count = |c: &AtomicU64| {
                c.fetch_add(1, Ordering::Relaxed);
            };
            if rng.random_bool(faults.cut) {
                count(&self.injected.cuts);
                self.cut.cancel();
                return;
            }
            if rng.random_bool(faults.half_close) {
                count(&self.injected.half_closes);
                let _ = to.shutdown().await; // FIN this way; the other way goes on
                return;
            }
            if rng.random_bool(faults.stall) {
                count(&self.injected.stalls);
                tokio::select! {
                    () = self.cut.cancelled() => return,
                    () = tokio::time::sleep(faults.stall_for) => {}
                }
            }
            if rng.random_bool(faults.delay) {
                count(&self.injected.delayed);
                let delay = faults.max_delay.mul_f64(rng.random());
                tokio::time::sleep(delay).await;
            }
            if rng.random_bool(faults.drop_chunk) {
                count(&self.injected.dropped_chunks);
                continue;
            }
            if faults.record {
                let mut recorded = self.recorded.lock().unwrap();
                let record = &mut recorded[self.index];
                let side = if up {
                    &mut record.to_server
                } else {
                    &mut record.to_client
                };
                side.extend_from_slice(&buf[..n]);
            }
            self.injected.bytes.fetch_add(n as u64, Ordering::Relaxed);
            let written = tokio::select! {
                () = self.cut.cancelled() => return,
                written = to.write_all(&buf[..n]) => written,
            };
            if written.is_err() {
                self.cut.cancel();
                return;
            }
        }
    }
}
