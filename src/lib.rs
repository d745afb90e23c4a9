#![doc = "actix-delivery (docs to come)"]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod alarm;
pub mod config;
mod confirmation;
mod consumer;
mod dead_letter;
pub mod error;
mod facade;
mod handler;
pub mod message;
mod options;
mod producer;
pub mod protocol;

pub use config::{Backoff, ConsumerConfig, Limit, ProducerConfig};
pub use confirmation::Confirmation;
pub use consumer::{ConsumerController, ConsumerHandle};
pub use dead_letter::DeadLetter;
pub use error::{DeliveryError, OptionsError, TellError};
pub use facade::ReliableDelivery;
pub use handler::DeliveryHandler;
pub use message::{Delivery, ReplyTo, Tell};
pub use options::{
    ConsumerOptions, ConsumerOptionsBuilder, ProducerOptions, ProducerOptionsBuilder,
};
pub use producer::{ProducerController, ProducerHandle};
pub use protocol::consumer::ConsumerStats;
pub use protocol::envelope::{Ack, DeadLetterReason, DeliveryInfo, Incarnation, ProducerId};
pub use protocol::producer::ProducerStats;
