//! Reliable delivery between two processes over TCP, surviving a crash of the consumer's.
//!
//! One command runs both roles: the consumer node as a child process, the producer here; in
//! the middle the child is killed (SIGKILL) and started again, and every message is still
//! confirmed:
//!
//! ```text
//! cargo run --example two_nodes
//! ```
//!
//! Or in two terminals (kill and restart the consumer whenever you like):
//!
//! ```text
//! cargo run --example two_nodes -- consumer 127.0.0.1:7100
//! cargo run --example two_nodes -- producer 127.0.0.1:7100
//! ```
//!
//! Both sides must share a secret: `TWO_NODES_SECRET` (at least 16 bytes), or a built-in demo
//! secret when it is unset.
//!
//! With mutual TLS instead of the secret (feature `tls`), the same with `--tls` first:
//!
//! ```text
//! cargo run --features tls --example two_nodes -- --tls
//! cargo run --features tls --example two_nodes -- --tls consumer 127.0.0.1:7100
//! cargo run --features tls --example two_nodes -- --tls producer 127.0.0.1:7100
//! ```
//!
//! The PEM files come from `TWO_NODES_TLS_DIR` (default `target/two_nodes_tls`): `ca.pem`,
//! `consumer.pem`/`.key` (for `consumer.example` and 127.0.0.1) and `producer.pem`/`.key`
//! (for `producer.example`), made there by a demo CA when `ca.pem` is missing. The consumer
//! exposes "orders" to the identity `producer.example` only.

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
use actix_delivery::{
    ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery,
};

const MESSAGES: u64 = 100;

fn secret() -> NodeSecret {
    let secret = std::env::var("TWO_NODES_SECRET")
        .unwrap_or_else(|_| "demo secret: set TWO_NODES_SECRET in real use".into());
    NodeSecret::new(secret).expect("TWO_NODES_SECRET must be 16 to 1024 bytes")
}

/// Whether `--tls` was given (mutual TLS instead of the secret).
static TLS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The options of the node of `role` ("consumer" or "producer") in the chosen mode.
fn options(
    role: &str,
) -> Result<actix_delivery::tcp::NodeOptionsBuilder, Box<dyn std::error::Error>> {
    if !TLS.load(Ordering::Relaxed) {
        return Ok(NodeOptions::builder().secret(secret()));
    }
    #[cfg(feature = "tls")]
    {
        let dir = tls_files()?;
        let read = |name: String| std::fs::read(dir.join(name));
        let tls = actix_delivery::tcp::NodeTls::builder(read("ca.pem".into())?)?
            .certificate(read(format!("{role}.pem"))?, read(format!("{role}.key"))?)?
            .mutual()
            .build()?;
        Ok(NodeOptions::builder().tls(tls))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = role;
        Err(
            "--tls needs the tls feature: cargo run --features tls --example two_nodes -- --tls"
                .into(),
        )
    }
}

/// The directory of the PEM files, with a demo CA's files made there if it has none.
#[cfg(feature = "tls")]
fn tls_files() -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let dir = std::path::PathBuf::from(
        std::env::var("TWO_NODES_TLS_DIR").unwrap_or_else(|_| "target/two_nodes_tls".into()),
    );
    if dir.join("ca.pem").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key)?;
    let issuer = Issuer::new(params, ca_key);
    for (role, names) in [
        (
            "consumer",
            vec!["consumer.example".to_string(), "127.0.0.1".to_string()],
        ),
        ("producer", vec!["producer.example".to_string()]),
    ] {
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(names)?.signed_by(&key, &issuer)?;
        std::fs::write(dir.join(format!("{role}.pem")), cert.pem())?;
        std::fs::write(dir.join(format!("{role}.key")), key.serialize_pem())?;
    }
    // Written last: its presence says the others are there.
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    println!("[demo CA] made the PEM files in {}", dir.display());
    Ok(dir)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--tls") {
        args.remove(0);
        TLS.store(true, Ordering::Relaxed);
    }
    let addr = |i: usize| -> Result<SocketAddr, Box<dyn std::error::Error>> {
        Ok(args
            .get(i)
            .map_or("127.0.0.1:7100", String::as_str)
            .parse()?)
    };
    match args.first().map(String::as_str) {
        Some("consumer") => actix::System::new().block_on(consumer(addr(1)?)),
        Some("producer") => actix::System::new().block_on(producer(addr(1)?, None)),
        None => {
            let addr = addr(99)?;
            #[cfg(feature = "tls")]
            if TLS.load(Ordering::Relaxed) {
                tls_files()?; // before the child, so that both use the same files
            }
            let child = start_consumer(addr)?;
            actix::System::new().block_on(producer(addr, Some(child)))
        }
        Some(other) => Err(format!("unknown role {other:?}: consumer, producer or none").into()),
    }
}

/// The consumer's node: listens on `addr` and exposes an "orders" consumer.
async fn consumer(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let options = options("consumer")?.listen(addr).build()?;
    let node = NodeHandle::start(options).await?;
    let orders = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
            println!("  [consumer] handled {order}");
            Ok::<(), std::io::Error>(())
        }))
        .build()?,
    );
    if TLS.load(Ordering::Relaxed) {
        // Mutual TLS knows who connects: only the producer's identity may deliver here.
        node.expose_to("orders", &orders, ["producer.example"])?;
    } else {
        node.expose("orders", &orders)?;
    }
    println!("  [consumer] node {} listens on {addr}", node.id());
    std::future::pending::<()>().await;
    Ok(())
}

fn start_consumer(addr: SocketAddr) -> std::io::Result<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    if TLS.load(Ordering::Relaxed) {
        command.arg("--tls");
    }
    command.args(["consumer", &addr.to_string()]).spawn()
}

/// The producer's node: sends `MESSAGES` orders to "orders" at `addr`, one every 30 ms. With
/// `child`, kills the consumer's process after a third of them and starts it again.
async fn producer(
    addr: SocketAddr,
    mut child: Option<Child>,
) -> Result<(), Box<dyn std::error::Error>> {
    let node = NodeHandle::start(options("producer")?.build()?).await?;
    let orders = node.consumer_ref::<String>(addr, "orders")?;
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(orders)
            .resend_timeout(Duration::from_millis(300))
            .build()?,
    );
    let confirmed = Arc::new(AtomicU64::new(0));
    for n in 1..=MESSAGES {
        let count = confirmed.clone();
        producer.tell(
            format!("order #{n}"),
            move |result: Result<(), DeliveryError>| match result {
                Ok(()) => {
                    count.fetch_add(1, Ordering::Relaxed);
                    println!("[producer] order #{n} confirmed");
                }
                Err(err) => println!("[producer] order #{n} NOT confirmed: {err}"),
            },
        )?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        if n == MESSAGES / 3
            && let Some(running) = &mut child
        {
            println!("[producer] killing the consumer's process (SIGKILL)");
            running.kill()?;
            running.wait()?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            println!("[producer] starting it again");
            *running = start_consumer(addr)?;
        }
    }
    producer.idle().await;
    let confirmed = confirmed.load(Ordering::Relaxed);
    let peer = node.peer_id(addr).map(|id| id.to_string());
    let stats = node.stats();
    println!(
        "[producer] {confirmed} of {MESSAGES} confirmed; {} connections made, {} deliveries \
         dropped while the consumer was gone (retransmitted); consumer node now {}",
        stats.connections_opened,
        stats.deliveries_dropped_disconnected,
        peer.unwrap_or_default()
    );
    if let Some(mut child) = child {
        child.kill()?;
        child.wait()?;
    }
    if confirmed != MESSAGES {
        return Err("messages were lost".into());
    }
    Ok(())
}
