//! A decoder-only transformer language model for kiln: token and learned position
//! embeddings, N pre-norm blocks of causal multi-head self-attention and a GELU MLP, a final
//! layer norm and an output head tied to the token embedding (GPT-2's shape), built with
//! [`GptConfig::init`] like Burn's modules.
//!
//! [`Gpt`] is [`Segmented`](kiln_core::Segmented) by block — the embeddings are the input
//! segment, each block a middle segment, the final norm and head the output segment — so the
//! planner, data parallelism's overlapped buckets and pipeline stages cut it like any other
//! model; and a [`Forward`](kiln_core::Forward) from token ids `[batch, time]` to logits
//! `[batch, time, vocabulary]`.
//!
//! ```
//! use burn::module::Module;
//! use burn::tensor::{Device, Int, Tensor};
//! use kiln_core::Forward;
//! use kiln_gpt::GptConfig;
//!
//! let device = Device::flex();
//! let config = GptConfig::new(256, 16, 2, 2, 32);
//! let model = kiln_core::init_module(&device, 7, || config.init(&device));
//! assert_eq!(model.num_params(), config.param_count());
//! let tokens = Tensor::<2, Int>::from_ints([[72, 105, 33, 10]], &device);
//! assert_eq!(model.forward(tokens).dims(), [1, 4, 256]);
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod block;
mod cache;
#[cfg(test)]
mod cache_tests;
mod config;
mod model;
mod optimizer;
#[cfg(test)]
mod optimizer_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod training_tests;

pub use block::{Block, NORM_EPSILON};
pub use cache::KvCache;
pub use config::GptConfig;
pub use model::Gpt;
pub use optimizer::adamw;
