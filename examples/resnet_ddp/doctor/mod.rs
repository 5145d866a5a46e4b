//! `resnet_ddp doctor`: what this build and this machine can do, checked before a training run
//! (and on a GPU node without a Rust toolchain, since the binary carries it). One table:
//! the compiled features, the CPU, every device it can open, CUDA's libraries, MPI, an
//! all-reduce bandwidth per available transport, and for each problem its fix. The exit code
//! is non-zero when a device named by `--devices` cannot be used.

mod check;
mod comm;
mod gpu;
mod machine;
mod report;
#[cfg(test)]
mod tests;

pub use check::run;
