//! What a durable producer stores: its identity, every message before its first transmission,
//! and which messages were settled. An [`EventSourced`] entity, so the persistent actor gives
//! it batching, snapshots (with the settled messages deleted) and recovery.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::persistence::{Decision, EventSourced};
use crate::protocol::envelope::Incarnation;

/// A durable producer's journal state: who it is, the next seq, and the messages stored but
/// not yet settled (their encoded bodies). A snapshot of it is O(unsettled).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ProducerLog {
    identity: Option<(String, Incarnation)>,
    /// The seq the next stored message gets (from 1).
    next_seq: u64,
    unsettled: BTreeMap<u64, Vec<u8>>,
}

/// What the producer asks of its log.
#[derive(Debug)]
pub(crate) enum LogCommand {
    /// Opens the stream as producer `producer_id`; a new stream takes `incarnation`.
    Open {
        producer_id: String,
        incarnation: Incarnation,
    },
    /// Stores messages `first_seq..` (fails if another producer stored first).
    Store {
        first_seq: u64,
        bodies: Vec<Vec<u8>>,
    },
    /// Records messages settled (confirmed or given up): they are not resent.
    Settle { seqs: Vec<u64> },
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum LogEvent {
    Created {
        producer_id: String,
        incarnation: Incarnation,
    },
    /// One message (an event each, so compaction counts messages).
    Stored {
        seq: u64,
        body: Vec<u8>,
    },
    Settled {
        seqs: Vec<u64>,
    },
}

/// What the log answers.
#[derive(Debug)]
pub(crate) enum LogReply {
    /// The stream is open: the producer's incarnation, its next seq, and the messages to send
    /// again (ascending).
    Opened {
        incarnation: Incarnation,
        next_seq: u64,
        unsettled: Vec<(u64, Vec<u8>)>,
    },
    /// Stored or recorded.
    Done,
}

impl EventSourced for ProducerLog {
    type Command = LogCommand;
    type Event = LogEvent;
    type Reply = LogReply;
    type Rejection = String;

    fn decide(&self, command: &LogCommand) -> Result<Decision<Self>, String> {
        match command {
            LogCommand::Open {
                producer_id,
                incarnation,
            } => match &self.identity {
                None => Ok(Decision::persist(
                    [LogEvent::Created {
                        producer_id: producer_id.clone(),
                        incarnation: *incarnation,
                    }],
                    LogReply::Opened {
                        incarnation: *incarnation,
                        next_seq: 1,
                        unsettled: Vec::new(),
                    },
                )),
                Some((owner, _)) if owner != producer_id => Err(format!(
                    "the stream belongs to producer `{owner}`, not `{producer_id}`"
                )),
                Some((_, incarnation)) => Ok(Decision::reply(LogReply::Opened {
                    incarnation: *incarnation,
                    next_seq: self.next_seq.max(1),
                    unsettled: self
                        .unsettled
                        .iter()
                        .map(|(&s, b)| (s, b.clone()))
                        .collect(),
                })),
            },
            LogCommand::Store { first_seq, bodies } => {
                if self.identity.is_none() {
                    return Err("the stream is not open".into());
                }
                if *first_seq != self.next_seq.max(1) {
                    return Err(format!(
                        "another producer writes this stream: it stored up to seq {}, this \
                         one expected to store seq {first_seq} next",
                        self.next_seq.max(1) - 1
                    ));
                }
                let events = (*first_seq..)
                    .zip(bodies)
                    .map(|(seq, body)| LogEvent::Stored {
                        seq,
                        body: body.clone(),
                    });
                Ok(Decision::persist(events, LogReply::Done))
            }
            LogCommand::Settle { seqs } => {
                let seqs: Vec<u64> = seqs
                    .iter()
                    .copied()
                    .filter(|seq| self.unsettled.contains_key(seq))
                    .collect();
                if seqs.is_empty() {
                    return Ok(Decision::reply(LogReply::Done));
                }
                Ok(Decision::persist(
                    [LogEvent::Settled { seqs }],
                    LogReply::Done,
                ))
            }
        }
    }

    /// A snapshot holds every unsettled message: take one only after as many writes.
    fn snapshot_weight(&self) -> u64 {
        self.unsettled.len() as u64
    }

    fn apply(&mut self, event: &LogEvent) {
        match event {
            LogEvent::Created {
                producer_id,
                incarnation,
            } => {
                self.identity = Some((producer_id.clone(), *incarnation));
                self.next_seq = 1;
            }
            LogEvent::Stored { seq, body } => {
                self.unsettled.insert(*seq, body.clone());
                self.next_seq = seq + 1;
            }
            LogEvent::Settled { seqs } => {
                for seq in seqs {
                    self.unsettled.remove(seq);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(log: &mut ProducerLog, command: &LogCommand) -> Result<LogReply, String> {
        let decision = log.decide(command)?;
        for event in &decision.events {
            log.apply(event);
        }
        Ok(decision.reply)
    }

    fn open(log: &mut ProducerLog, id: &str, incarnation: u128) -> Result<LogReply, String> {
        replay(
            log,
            &LogCommand::Open {
                producer_id: id.into(),
                incarnation: Incarnation::from_u128(incarnation),
            },
        )
    }

    #[test]
    fn a_stream_keeps_its_incarnation_and_hands_back_what_is_unsettled() {
        let mut log = ProducerLog::default();
        let first = open(&mut log, "p", 1).unwrap();
        assert!(matches!(first, LogReply::Opened { next_seq: 1, .. }));
        let store = |first_seq, n: u8| LogCommand::Store {
            first_seq,
            bodies: (0..n).map(|b| vec![b]).collect(),
        };
        replay(&mut log, &store(1, 3)).unwrap();
        replay(&mut log, &LogCommand::Settle { seqs: vec![2, 99] }).unwrap();
        match open(&mut log, "p", 2).unwrap() {
            LogReply::Opened {
                incarnation,
                next_seq,
                unsettled,
            } => {
                assert_eq!(
                    incarnation,
                    Incarnation::from_u128(1),
                    "kept, not the new one"
                );
                assert_eq!(next_seq, 4);
                assert_eq!(unsettled, [(1, vec![0]), (3, vec![2])]);
            }
            other => panic!("{other:?}"),
        }
        // Settling only what is unsettled: nothing to record otherwise.
        let nothing = log.decide(&LogCommand::Settle { seqs: vec![2] }).unwrap();
        assert!(nothing.events.is_empty());
    }

    #[test]
    fn a_second_writer_and_another_producer_id_are_refused_clearly() {
        let mut log = ProducerLog::default();
        open(&mut log, "p", 1).unwrap();
        let stored = LogCommand::Store {
            first_seq: 1,
            bodies: vec![vec![1]],
        };
        replay(&mut log, &stored).unwrap();
        let error = replay(&mut log, &stored).unwrap_err();
        assert!(
            error.contains("another producer writes this stream"),
            "{error}"
        );
        let error = open(&mut log, "q", 1).unwrap_err();
        assert!(error.contains("belongs to producer `p`"), "{error}");
    }
}
