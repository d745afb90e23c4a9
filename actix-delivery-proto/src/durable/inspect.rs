//! What a durable producer's log holds, for inspectors: the log's own answer to an opening of
//! its stream (what the producer would send again), without opening it.

use crate::durable::log::{LogCommand, LogRefusal, LogReply, ProducerLog};
use crate::persistence::behavior::EventSourced;
use crate::protocol::chunk::ChunkHeader;
use crate::protocol::envelope::Incarnation;

/// A recovered log's owner and the messages it holds unsettled.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// The producer id that owns the stream.
    pub producer_id: String,
    /// The incarnation it sends under.
    pub incarnation: Incarnation,
    /// How often the stream was opened.
    pub openings: u64,
    /// The seq of the next message.
    pub next_seq: u64,
    /// The messages stored and not settled, ascending by seq: what the next opening sends
    /// again.
    pub messages: Vec<PendingMessage>,
    /// Chunked messages of which only some chunks were stored: the next opening records them
    /// settled (they were never sent).
    pub partly_stored: Vec<ChunkHeader>,
}

/// One message stored and not settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// Its seq: a chunked message's last one (the seq it is settled by).
    pub seq: u64,
    /// Its first seq: `seq` unless it is chunked.
    pub first_seq: u64,
    /// Its stored bytes (all its chunks').
    pub bytes: u64,
}

/// What the next opening of the recovered `log`'s stream would find: its owner and the
/// messages it would send again, as the log decides it (nothing is changed); `None` for a
/// log whose stream was never created.
///
/// # Errors
/// The log's refusal of any opening: the stream is corrupt (its events contradict each other).
pub fn pending(log: &ProducerLog) -> Result<Option<Pending>, LogRefusal> {
    // Asked as a producer that reads every version, first under no id: the refusal names the
    // owner, who is then asked as itself.
    let open = |producer_id: String| LogCommand::Open {
        producer_id,
        incarnation: Incarnation::from_u128(0),
        reopening: None,
        message_version: u32::MAX,
        chunk_version: Some(u32::MAX),
    };
    let (decision, producer_id) = match log.decide(&open(String::new())) {
        Err(LogRefusal::OtherProducer { owner, .. }) => (log.decide(&open(owner.clone()))?, owner),
        Ok(decision) => (decision, String::new()),
        Err(refusal) => return Err(refusal),
    };
    let LogReply::Opened {
        epoch,
        incarnation,
        next_seq,
        unsettled,
        chunked,
        dropped,
    } = decision.reply
    else {
        return Ok(None);
    };
    // An opening that would create the stream: there is none yet.
    if decision
        .events
        .iter()
        .any(|event| matches!(event, crate::durable::log::LogEvent::Created { .. }))
    {
        return Ok(None);
    }
    let mut messages: Vec<PendingMessage> = unsettled
        .iter()
        .map(|(seq, body)| PendingMessage {
            seq: *seq,
            first_seq: *seq,
            bytes: body.len() as u64,
        })
        .chain(chunked.iter().map(|(header, chunks)| PendingMessage {
            seq: header.last_seq(),
            first_seq: header.first_seq,
            bytes: chunks.iter().map(|chunk| chunk.len() as u64).sum(),
        }))
        .collect();
    messages.sort_by_key(|message| message.seq);
    Ok(Some(Pending {
        producer_id,
        incarnation,
        openings: epoch - 1,
        next_seq,
        messages,
        partly_stored: dropped,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::log::LogEvent;

    fn log(events: &[LogEvent]) -> ProducerLog {
        let mut log = ProducerLog::default();
        for event in events {
            log.apply(event);
        }
        log
    }

    #[test]
    fn the_owner_and_the_unsettled_messages_whole_and_chunked_are_what_an_opening_finds() {
        let chunk = ChunkHeader {
            first_seq: 3,
            chunks: 2,
            message_len: 5,
        };
        let partial = ChunkHeader {
            first_seq: 5,
            chunks: 3,
            message_len: 9,
        };
        let log = log(&[
            LogEvent::Created {
                producer_id: "p".into(),
                incarnation: Incarnation::from_u128(7),
            },
            LogEvent::Opened { epoch: 1 },
            LogEvent::Stored {
                seq: 1,
                body: vec![1; 10],
            },
            LogEvent::Stored {
                seq: 2,
                body: vec![2; 20],
            },
            LogEvent::StoredChunk {
                seq: 3,
                chunk,
                body: vec![3; 3],
            },
            LogEvent::StoredChunk {
                seq: 4,
                chunk,
                body: vec![4; 2],
            },
            LogEvent::StoredChunk {
                seq: 5,
                chunk: partial,
                body: vec![5; 3],
            },
            LogEvent::Settled { seqs: vec![1] },
            LogEvent::Opened { epoch: 2 },
        ]);
        let pending = pending(&log).unwrap().unwrap();
        assert_eq!(pending.producer_id, "p");
        assert_eq!(pending.incarnation, Incarnation::from_u128(7));
        assert_eq!(pending.openings, 2);
        assert_eq!(pending.next_seq, 6);
        assert_eq!(
            pending.messages,
            [
                PendingMessage {
                    seq: 2,
                    first_seq: 2,
                    bytes: 20
                },
                PendingMessage {
                    seq: 4,
                    first_seq: 3,
                    bytes: 5
                },
            ]
        );
        assert_eq!(pending.partly_stored, [partial]);
    }

    #[test]
    fn a_log_never_created_holds_nothing_and_a_corrupt_one_is_refused() {
        assert_eq!(pending(&ProducerLog::default()).unwrap(), None);
        let corrupt = log(&[LogEvent::Stored {
            seq: 1,
            body: vec![1],
        }]);
        assert!(matches!(pending(&corrupt), Err(LogRefusal::Corrupt(_))));
    }
}
