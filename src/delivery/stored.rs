//! The receipt of a message a durable producer stored.

use tokio::sync::oneshot;

use crate::delivery::confirmation::MessageId;
use crate::error::DeliveryError;

/// A message stored by a durable producer
/// ([`ProducerHandle::store`](crate::ProducerHandle::store)).
#[derive(Debug)]
pub struct Stored {
    /// Its id.
    pub id: MessageId,
    confirmed: oneshot::Receiver<Result<(), DeliveryError>>,
}

impl Stored {
    pub(crate) fn new(
        id: MessageId,
        confirmed: oneshot::Receiver<Result<(), DeliveryError>>,
    ) -> Self {
        Self { id, confirmed }
    }

    /// Resolves once the message is confirmed and the confirmation recorded.
    ///
    /// # Errors
    /// Why it was not: the producer stopped ([`DeliveryError::StoppedUnconfirmed`]: the
    /// message stays stored and is sent again by the next start, whose sink reports it), gave
    /// it up, or could not learn whether its record was stored ([`DeliveryError::InDoubt`]).
    pub async fn confirmed(self) -> Result<(), DeliveryError> {
        self.confirmed
            .await
            .unwrap_or(Err(DeliveryError::StoppedUnconfirmed))
    }
}
