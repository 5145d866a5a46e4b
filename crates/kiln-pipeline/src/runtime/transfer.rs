//! Stages on different devices: activations, gradients and batches moved to the device of the
//! stage that uses them.
//!
//! A send between two stages of one process on different devices goes through a courier
//! thread for that pair, which moves the value ([`Activation::to_device`]) and puts it into the
//! receiver's mailbox. Burn 0.22 moves a tensor between device kinds with a blocking read into
//! host memory (`burn-dispatch`'s `transfer.rs`), and between CUDA devices on the GPUs; on the
//! courier the copy blocks only the courier, so the sending stage goes on with its next
//! micro-batch while the value travels. Two limits: a move reads a tensor its stage has only
//! queued, so on a GPU it waits for that compute to finish (the stage does not); and a
//! courier moves one value at a time, so two values of one pair travel one after the other.
//! Across processes the wire already rebuilds each value on the receiving stage's device
//! (`wire.rs`), so no courier is needed there.
//!
//! The first stage's inputs and the last stage's targets come from batches built on the
//! loader's device; with stages on several devices those stages move their micro-batches
//! to their own device ([`kiln_data::Batch::to_device`]) as a step starts.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::{Scope, ScopedJoinHandle};

use burn::tensor::Device;
use crossbeam_channel::{Receiver, Sender, unbounded};
use kiln_core::Activation;
use kiln_data::Batch;

use crate::runtime::PipelineError;
use crate::runtime::mailbox::{Abort, Message};
use crate::runtime::worker::StepData;

/// Whether `devices` name more than one compute resource (autodiff settings aside).
pub(crate) fn mixed(devices: &[Device]) -> bool {
    devices.windows(2).any(|pair| pair[0] != pair[1])
}

/// The couriers of a run, joined once the stages are done.
pub(crate) type Couriers<'scope> = Vec<ScopedJoinHandle<'scope, Result<(), PipelineError>>>;

/// Each stage thread's senders to the stages of its pipeline (`peers[group][stage]`, one
/// mailbox per stage): direct where both stages share a device, else through a courier that
/// moves the value to the receiver's device. `devices` are the stage threads' devices, in
/// (group, stage) order. Only neighbours (stage ± 1, wrapping for interleaved schedules)
/// exchange messages, so only they get couriers. `always`: couriers between neighbours on
/// one device too (the tests' way to run this path on a CPU alone).
pub(crate) fn routes<'scope, H: Activation>(
    scope: &'scope Scope<'scope, '_>,
    peers: &[Vec<Sender<Message<H>>>],
    devices: &[Device],
    abort: &Abort,
    always: bool,
) -> (Vec<Vec<Sender<Message<H>>>>, Couriers<'scope>) {
    let mut couriers = Vec::new();
    let mut routes = Vec::with_capacity(devices.len());
    for (group, senders) in peers.iter().enumerate() {
        let stages = senders.len();
        for from in 0..stages {
            let from_device = &devices[group * stages + from];
            let outbox = (0..stages)
                .map(|to| {
                    let to_device = &devices[group * stages + to];
                    let neighbour =
                        to != from && (to == (from + 1) % stages || from == (to + 1) % stages);
                    if !neighbour || (to_device == from_device && !always) {
                        return senders[to].clone();
                    }
                    let (sender, inbox) = unbounded();
                    let courier = Courier {
                        inbox,
                        mailbox: senders[to].clone(),
                        device: to_device.clone(),
                        stages: (from, to),
                        abort: abort.clone(),
                    };
                    let handle = std::thread::Builder::new()
                        .name(format!("kiln-move-{group}-{from}-{to}"))
                        .spawn_scoped(scope, move || courier.run())
                        .expect("spawning a courier thread");
                    couriers.push(handle);
                    sender
                })
                .collect();
            routes.push(outbox);
        }
    }
    (routes, couriers)
}

/// Waits for the couriers (each ends when its sending stage is done): their errors.
pub(crate) fn join(couriers: Couriers<'_>) -> Vec<PipelineError> {
    couriers
        .into_iter()
        .filter_map(|courier| {
            let moved = courier.join().unwrap_or_else(|panic| {
                Err(PipelineError::Stage {
                    stage: 0,
                    message: format!("a courier thread: {}", kiln_core::panic_message(&*panic)),
                })
            });
            moved.err()
        })
        .collect()
}

/// Moves what one stage sends another to the receiver's device.
struct Courier<H> {
    inbox: Receiver<Message<H>>,
    mailbox: Sender<Message<H>>,
    device: Device,
    /// (sending stage, receiving stage).
    stages: (usize, usize),
    abort: Abort,
}

impl<H: Activation> Courier<H> {
    /// Moves every message until the sending stage is done (its sender dropped); a value
    /// that cannot move stops the run (every waiting stage sees the abort).
    fn run(self) -> Result<(), PipelineError> {
        let (from, to) = self.stages;
        for message in self.inbox {
            let Message {
                carries,
                micro,
                to: virtual_stage,
                value,
            } = message;
            let failed = |why: String| PipelineError::Transfer {
                from,
                to,
                what: format!("the {carries} of micro-batch {micro}"),
                why,
            };
            let moved = match catch_unwind(AssertUnwindSafe(|| value.to_device(&self.device))) {
                Ok(Some(value)) => value,
                Ok(None) => {
                    self.abort.raise();
                    return Err(failed(
                        "the model's activation type cannot move between devices \
                         (implement kiln_core::Activation::to_device)"
                            .into(),
                    ));
                }
                Err(panic) => {
                    self.abort.raise();
                    return Err(failed(kiln_core::panic_message(&*panic)));
                }
            };
            // A receiver that is gone shows up as its own error on the driver.
            let _ = self.mailbox.send(Message {
                carries,
                micro,
                to: virtual_stage,
                value: moved,
            });
        }
        Ok(())
    }
}

impl<B: Batch> StepData<B> {
    /// The step's micro-batches moved to `device` (stage `stage` reads them there).
    ///
    /// # Errors
    /// [`PipelineError::Config`] if the batch type cannot move.
    pub(crate) fn move_batches(
        &mut self,
        device: &Device,
        stage: usize,
    ) -> Result<(), PipelineError> {
        for batch in &mut self.micro_batches {
            *batch = batch.to_device(device).ok_or_else(|| {
                PipelineError::Config(format!(
                    "stage {stage} sits on another device than the batches, and the batch type \
                     cannot move (implement kiln_data::Batch::to_device)"
                ))
            })?;
        }
        Ok(())
    }
}
