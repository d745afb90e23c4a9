//! The listener: hears of the tagged commits of every process through `LISTEN/NOTIFY`.
//!
//! One connection of its own `LISTEN`s on the writers' channel; a notification whose payload
//! names this journal's schema tells the journal's [`TagSignal`]. A lost connection is opened
//! again after a backoff (100 ms, doubling up to 5 s), and the signal is told once it listens
//! again: notifications sent meanwhile are lost, so readers look anyway. It runs until the
//! journal's runtime ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::journal::postgres::writer::TAGS_CHANNEL;
use crate::journal::postgres::Connector;
use crate::journal::TagSignal;
use crate::runtime::error_chain::ErrorChain;

/// The first wait before opening a lost connection again, and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Listens for as long as the journal's runtime runs.
pub(super) async fn listen(connector: Connector, signal: Arc<TagSignal>) {
    let mut backoff = BACKOFF.0;
    loop {
        let (sender, mut notifications) = mpsc::unbounded_channel();
        let listening = async {
            let client = connector
                .open_forwarding(Some(sender))
                .await
                .map_err(|err| err.to_string())?;
            client
                .batch_execute(&format!("LISTEN {TAGS_CHANNEL}"))
                .await
                .map_err(|err| ErrorChain(&err).to_string())?;
            Ok::<_, String>(client)
        };
        match listening.await {
            Ok(_client) => {
                backoff = BACKOFF.0;
                signal.notify(); // whatever was committed while nobody listened
                while let Some(schema) = notifications.recv().await {
                    if schema == connector.sql.schema {
                        signal.notify();
                    }
                }
                log::debug!("journal: the tag listener's connection ended; listening again");
            }
            Err(err) => {
                log::warn!("journal: cannot listen for tagged commits (retrying): {err}");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}
