//! The core of in-process delivery's kept dead letters: what a dead-letter store holds, how it
//! is listed and bounded, and how floods of refused input are sampled.

pub mod dead_letter_book;
pub mod dead_letter_sampler;
pub mod dead_letters;
