//! The outbox's lanes: one producer per destination, inside the persistent actor, sending the
//! deliveries its decisions recorded (after their commit, and again after a recovery) until the
//! destination confirms them.

use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{self, CodecError};
use crate::config::ProducerConfig;
use crate::delivery::message::{ConsumerRef, Delivery, ReplyTo};
use crate::error::DeliveryError;
use crate::error::OptionsError;
use crate::journal::PersistenceId;
use crate::persistence::outbox_state::LaneState;
use crate::protocol::envelope::{check_producer_id, Ack, Incarnation, ProducerId};
use crate::protocol::producer::ProducerCore;
use crate::protocol::rate_limit::RateLimited;

/// Where a persistent entity's decisions deliver to
/// ([`Decision::deliver`](crate::persistence::Decision::deliver)): named destinations, each a
/// consumer reference (local or remote) and the reliability settings of its lane.
///
/// Each destination is one lane: a producer with id `<persistence id>/<name>` and the outbox's
/// incarnation (stored in the journal with the first delivery, kept across recoveries), whose
/// seqs are recorded with the deliveries. Its `window_size` bounds the deliveries in flight,
/// and so also the burst sent again after a recovery; `max_attempts` (default unbounded) gives
/// a delivery up, which settles it like a confirmation.
#[derive(Default)]
pub struct Outbox {
    pub(crate) lanes: Vec<Box<dyn Lane>>,
}

impl Outbox {
    /// No destinations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Deliveries to `name` go to `consumer` as messages of type `M`, sent as `config` says
    /// (its `producer_id` is replaced by the lane's).
    ///
    /// # Errors
    /// [`OptionsError`] if `config` is invalid or the name is empty.
    pub fn destination<M>(
        mut self,
        name: &str,
        consumer: impl Into<ConsumerRef<M>>,
        config: ProducerConfig,
    ) -> Result<Self, OptionsError>
    where
        M: Serialize + DeserializeOwned + Clone + Send + 'static,
    {
        config.validate()?;
        if name.is_empty() {
            return Err(OptionsError::new("destination", "a name must not be empty"));
        }
        self.lanes.push(Box::new(TypedLane {
            name: name.to_owned(),
            config,
            consumer: consumer.into(),
            core: None,
            slow: RateLimited::default(),
        }));
        Ok(self)
    }

    /// The destination names.
    pub(crate) fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.lanes.iter().map(|lane| lane.name().to_owned())
    }

    /// Checks the lanes' producer ids for stream `id`.
    pub(crate) fn check(&self, id: &PersistenceId) -> Result<(), OptionsError> {
        for lane in &self.lanes {
            check_producer_id(&lane_id(id, lane.name())).map_err(|error| {
                OptionsError::new("destination", format!("`{}`: {error}", lane.name()))
            })?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.lanes.iter().map(|lane| lane.name()).collect();
        f.debug_struct("Outbox")
            .field("destinations", &names)
            .finish()
    }
}

/// The producer id of destination `name`'s lane.
fn lane_id(id: &PersistenceId, name: &str) -> String {
    format!("{id}/{name}")
}

/// One destination's lane, its message type erased (`Send`: an outbox can be handed to an
/// entity started on another arbiter).
pub(crate) trait Lane: Send {
    fn name(&self) -> &str;
    /// (Re)starts the lane of stream `id` from what the outbox recorded.
    fn resume(
        &mut self,
        id: &PersistenceId,
        incarnation: Incarnation,
        state: &LaneState,
    ) -> Result<(), CodecError>;
    /// Sends a committed delivery (the lane was resumed, or starts with it).
    fn send(
        &mut self,
        id: &PersistenceId,
        incarnation: Incarnation,
        seq: u64,
        message: &[u8],
    ) -> Result<(), CodecError>;
    fn handle_ack(&mut self, ack: &Ack) -> bool;
    fn handle_timeout(&mut self, now: Instant);
    fn set_durably_confirmed_below(&mut self, seq: u64);
    /// Transmits what is due; settled seqs (confirmed or given up) go to `settled`. Returns
    /// how many deliveries went out for the `warn_after`-th time (stalled).
    fn flush(
        &mut self,
        now: Instant,
        reply_to: &ReplyTo,
        warn_after: u32,
        settled: &mut Vec<u64>,
    ) -> u64;
    fn next_deadline(&self) -> Option<Instant>;
    fn producer_id(&self) -> Option<&ProducerId>;
    /// Drops the lane's producer (the actor stops, or recovers again).
    fn stop(&mut self);
}

struct TypedLane<M: Send + 'static> {
    name: String,
    config: ProducerConfig,
    consumer: ConsumerRef<M>,
    core: Option<ProducerCore<M, u64>>,
    slow: RateLimited,
}

impl<M> Lane for TypedLane<M>
where
    M: Serialize + DeserializeOwned + Clone + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn resume(
        &mut self,
        id: &PersistenceId,
        incarnation: Incarnation,
        state: &LaneState,
    ) -> Result<(), CodecError> {
        let mut resumed = Vec::with_capacity(state.unconfirmed.len());
        for (&seq, message) in &state.unconfirmed {
            resumed.push((seq, codec::decode::<M>(message)?, seq));
        }
        let config = ProducerConfig {
            producer_id: Some(lane_id(id, &self.name)),
            ..self.config.clone()
        };
        let next_seq = state.next_seq.max(1);
        self.core = Some(ProducerCore::resume(
            &config,
            incarnation,
            next_seq,
            resumed,
            crate::runtime::random::random_u64,
        ));
        Ok(())
    }

    fn send(
        &mut self,
        id: &PersistenceId,
        incarnation: Incarnation,
        seq: u64,
        message: &[u8],
    ) -> Result<(), CodecError> {
        let message = codec::decode::<M>(message)?;
        if self.core.is_none() {
            let fresh = LaneState {
                next_seq: seq,
                ..LaneState::default()
            };
            self.resume(id, incarnation, &fresh)?;
        }
        if let Some(core) = &mut self.core {
            // Sent under its recorded seq, never refused: `max_unconfirmed` bounds what a
            // destination holds.
            if core.handle_stored(seq, message, seq).is_err() {
                // Unreachable: deliveries are recorded and committed in seq order, and the
                // lane resumed from the recorded next seq.
                log::error!(
                    "outbox `{}`: delivery {seq} is not the lane's next seq: not sent",
                    self.name
                );
                debug_assert!(false, "outbox lane numbering diverged at seq {seq}");
            }
        }
        Ok(())
    }

    fn handle_ack(&mut self, ack: &Ack) -> bool {
        self.core.as_mut().is_some_and(|core| core.handle_ack(ack))
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(core) = &mut self.core {
            core.handle_timeout(now);
        }
    }

    fn set_durably_confirmed_below(&mut self, seq: u64) {
        if let Some(core) = &mut self.core {
            core.set_durably_settled_below(seq);
        }
    }

    fn flush(
        &mut self,
        now: Instant,
        reply_to: &ReplyTo,
        warn_after: u32,
        settled: &mut Vec<u64>,
    ) -> u64 {
        let Some(core) = &mut self.core else {
            return 0;
        };
        let mut slow = 0;
        let deliveries = std::iter::from_fn(|| core.poll_transmit(now)).map(|transmission| {
            slow += u64::from(transmission.attempt == warn_after);
            Delivery::from_transmission(transmission, reply_to.clone())
        });
        self.consumer.do_send_all(deliveries);
        if let Some(n) = self.slow.record(now, slow) {
            log::warn!(
                "outbox destination `{}`: {n} deliveries sent {warn_after} times without a \
                 confirmation",
                self.name
            );
        }
        while let Some((seq, result)) = core.poll_settled() {
            if !result.as_ref().is_err_and(DeliveryError::is_stop) {
                settled.push(seq);
            }
        }
        slow
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.core.as_ref()?.next_deadline()
    }

    fn producer_id(&self) -> Option<&ProducerId> {
        self.core.as_ref().map(ProducerCore::id)
    }

    fn stop(&mut self) {
        self.core = None;
    }
}
