//! Stages in other processes (feature `mpi`): one stage per MPI process, world rank
//! `group × P + stage` (the layout of [`groups`](crate::runtime::groups)). The stage code is
//! the same as for threads: its sends to a stage of another process go into a channel that a
//! link thread empties, encoding each message ([`wire`](crate::runtime::wire)) and sending it
//! with [`MpiMessages`]; a receiving thread probes for messages from any process, rebuilds
//! them on the stage's device and puts them into the stage's mailbox. Waits stay bounded by
//! the mailbox's timeout; a failing stage ends the MPI job (every process with an error).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use burn::tensor::Device;
use crossbeam_channel::{Sender, unbounded};
use kiln_comm::{Communicator, MpiMessages};
use kiln_core::Activation;

use crate::runtime::PipelineError;
use crate::runtime::mailbox::{Abort, Message};
use crate::runtime::wire;

/// Tags: the stages' messages, and the trained parameters gathered at the end.
const MESSAGES: u16 = 0;
const PARAMETERS: u16 = 1;

/// One sender per stage of the pipeline.
pub(crate) type Peers<H> = Vec<Sender<Message<H>>>;

/// Checks that `world` holds `groups` data-parallel pipelines of `stages` stages, one stage
/// per process. Every process checks the same numbers, so all refuse together, before any
/// collective.
///
/// # Errors
/// [`PipelineError::Config`] naming what does not match.
pub(crate) fn check(
    world: &Communicator,
    stages: usize,
    groups: usize,
) -> Result<(), PipelineError> {
    if world.world_size() != groups * stages {
        return Err(PipelineError::Config(format!(
            "across processes a pipeline has one stage per process: {groups} data-parallel pipeline(s) x {stages} stages need mpirun -np {}, got {} processes",
            groups * stages,
            world.world_size()
        )));
    }
    Ok(())
}

/// Starts the link threads of this process's stage (whose inbox is `inbox`) in `scope`:
/// senders to every other stage of its pipeline (`pipeline`, split from the world, ranked by
/// stage), a receiver for messages from them. Returns the peers to give the stage and a
/// guard that stops and joins the threads.
pub(crate) fn link<'scope, 'env, H: Activation>(
    scope: &'scope Scope<'scope, 'env>,
    pipeline: &Communicator,
    inbox: Sender<Message<H>>,
    device: Device,
    abort: Abort,
) -> Result<(Peers<H>, Guard<'scope>), PipelineError> {
    let messages = MpiMessages::new(pipeline, MESSAGES).map_err(comm)?;
    let (rank, stages) = (messages.rank(), messages.size());
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut peers = Vec::with_capacity(stages);
    for to in 0..stages {
        if to == rank {
            peers.push(inbox.clone());
            continue;
        }
        let (sender, receiver) = unbounded::<Message<H>>();
        peers.push(sender);
        let (messages, abort) = (messages.clone(), abort.clone());
        handles.push(scope.spawn(move || {
            for message in receiver {
                let sent = wire::encode(&message)
                    .and_then(|bytes| messages.send(to, &bytes).map_err(comm));
                if let Err(err) = sent {
                    abort.raise();
                    return Err(err);
                }
            }
            Ok(())
        }));
    }
    let (receiving, abort) = (Arc::clone(&stop), abort.clone());
    handles.push(scope.spawn(move || {
        while !receiving.load(Ordering::Acquire) {
            match messages.try_recv() {
                Some((_, bytes)) => {
                    let message =
                        wire::decode::<H>(&bytes, &device).inspect_err(|_| abort.raise())?;
                    // The stage gone: the run is ending (its error is reported by itself).
                    let _ = inbox.send(message);
                }
                None => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        Ok(())
    }));
    Ok((peers, Guard { handles, stop }))
}

/// Stops the receiving thread and joins the link threads (once the stage and the senders'
/// channels are done).
pub(crate) struct Guard<'scope> {
    handles: Vec<ScopedJoinHandle<'scope, Result<(), PipelineError>>>,
    stop: Arc<AtomicBool>,
}

impl Guard<'_> {
    /// Joins the link threads; the first error.
    pub(crate) fn finish(self) -> Result<(), PipelineError> {
        self.stop.store(true, Ordering::Release);
        let mut result = Ok(());
        for handle in self.handles {
            let joined = handle.join().unwrap_or_else(|_| {
                Err(PipelineError::Stage {
                    stage: 0,
                    message: "a link thread panicked".into(),
                })
            });
            if result.is_ok() {
                result = joined;
            }
        }
        result
    }
}

/// Gathers the trained parameters of every stage of `pipeline` into its rank 0's `params`
/// (the others send theirs), so that the first stage's report holds the whole model.
pub(crate) fn gather_params(
    pipeline: &Communicator,
    params: &mut HashMap<String, Vec<f32>>,
    timeout: Duration,
) -> Result<(), PipelineError> {
    let messages = MpiMessages::new(pipeline, PARAMETERS).map_err(comm)?;
    if messages.rank() != 0 {
        return messages.send(0, &wire::encode_params(params)).map_err(comm);
    }
    let start = Instant::now();
    let mut received = 0;
    while received + 1 < messages.size() {
        match messages.try_recv() {
            Some((_, bytes)) => {
                params.extend(wire::decode_params(&bytes)?);
                received += 1;
            }
            None if start.elapsed() > timeout => {
                return Err(PipelineError::PeerLost {
                    stage: 0,
                    what: "the other processes' trained parameters".into(),
                });
            }
            None => std::thread::sleep(Duration::from_micros(100)),
        }
    }
    Ok(())
}

fn comm(err: kiln_comm::CommError) -> PipelineError {
    PipelineError::PeerLost {
        stage: 0,
        what: format!("a stage in another process ({err})"),
    }
}
