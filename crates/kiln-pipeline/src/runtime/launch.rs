//! This process's stage threads: the run's channels, each thread's links, the threads
//! themselves, and the couriers and links to other processes their sends go through.

use std::thread::{Scope, ScopedJoinHandle};

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use kiln_comm::Communicator;
use kiln_core::{Segmented, panic_message};
use kiln_train::Objective;

use crate::runtime::PipelineError;
use crate::runtime::checkpoint::{PartMessage, PartSender};
use crate::runtime::layout::RunLayout;
use crate::runtime::mailbox::{Abort, Mailbox, Message};
use crate::runtime::pipeline::Pipeline;
#[cfg(feature = "mpi")]
use crate::runtime::processes::{Guard, Peers};
use crate::runtime::stage::Stage;
use crate::runtime::stage_start::StageStart;
use crate::runtime::transfer::{self, Couriers};
use crate::runtime::worker::{Links, StepData, StepDone};

/// A run's channels (stage activations and gradients of type `H`, batches `B`): the stage
/// threads' ends, and the driver's.
pub(crate) struct Channels<'a, H, B> {
    /// What the stage threads take, with their groups.
    pub stage_ends: StageEnds<'a, H, B>,
    /// The driver's step sender to each stage thread of this process.
    pub step_senders: Vec<Sender<StepData<B>>>,
    /// Where the stage threads report their steps.
    pub done: Receiver<StepDone>,
    /// Where the first pipeline's stages hand over their checkpoint parts.
    pub parts: Receiver<PartMessage>,
}

/// The stage threads' ends of a run's channels, and their groups.
pub(crate) struct StageEnds<'a, H, B> {
    /// Per data-parallel group, a sender to each of its stages' mailboxes.
    peers: Vec<Vec<Sender<Message<H>>>>,
    /// Each stage thread's mailbox, in (group, stage) order.
    inboxes: Vec<Receiver<Message<H>>>,
    /// Each stage thread's group of the copies of its stage.
    replicas: Vec<Option<Communicator>>,
    /// Each stage thread's group of its pipeline's stages.
    pipelines: Vec<Option<&'a Communicator>>,
    /// The step receiver of each stage thread of this process.
    steps: Vec<Receiver<StepData<B>>>,
    /// Where the stages report their steps.
    done: Sender<StepDone>,
    /// Where the stages hand over their checkpoint parts.
    parts: PartSender,
}

impl<'a, H, B> Channels<'a, H, B> {
    /// The channels of `layout`'s stage threads, whose groups are `replicas` and `pipelines`
    /// (one of each per stage thread).
    pub(crate) fn new(
        layout: &RunLayout,
        replicas: Vec<Option<Communicator>>,
        pipelines: Vec<Option<&'a Communicator>>,
    ) -> Self {
        // Messages stay inside a pipeline: one set of channels per data-parallel group.
        let mut peers = Vec::with_capacity(layout.groups);
        let mut inboxes = Vec::with_capacity(layout.total);
        for _ in 0..layout.groups {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..layout.stages).map(|_| unbounded()).unzip();
            peers.push(senders);
            inboxes.extend(receivers);
        }
        let (step_senders, steps) = layout.local.iter().map(|_| bounded(1)).unzip();
        let (done_sender, done) = unbounded();
        let (part_sender, parts) = unbounded();
        Self {
            stage_ends: StageEnds {
                peers,
                inboxes,
                replicas,
                pipelines,
                steps,
                done: done_sender,
                parts: part_sender,
            },
            step_senders,
            done,
            parts,
        }
    }
}

/// What every stage thread of a run starts from: the pipeline, the factories of the model
/// (`B`) and of the optimizers (`F`), the run's layout and its abort flag.
pub(crate) struct Launch<'a, B, F, O: Objective> {
    /// The pipeline that trains.
    pub pipeline: &'a Pipeline<O>,
    /// Builds the model on a stage's device.
    pub build: &'a B,
    /// Makes a stage's optimizer.
    pub optimizer: &'a F,
    /// The run's layout in this process.
    pub layout: &'a RunLayout,
    /// Raised by whichever thread fails first.
    pub abort: &'a Abort,
    /// Across processes: this process's pipeline, over which its stage's links run.
    #[cfg(feature = "mpi")]
    pub across: Option<&'a Communicator>,
}

/// This process's stage threads (training models `M`), and the threads their sends go
/// through.
pub(crate) struct StageThreads<'scope, M> {
    /// One per stage thread of this process, in (group, stage) order.
    stages: Vec<ScopedJoinHandle<'scope, Result<Stage<M>, PipelineError>>>,
    /// The couriers between stages on different devices.
    couriers: Couriers<'scope>,
    /// Across processes: the link threads to the other processes' stages.
    #[cfg(feature = "mpi")]
    linked: Option<Guard<'scope>>,
}

impl<'a, B, F, O: Objective> Launch<'a, B, F, O> {
    /// Starts this process's stage threads in `scope`, each with its share of `ends`, once the
    /// couriers and links their sends go through are started.
    pub(crate) fn start<'scope, M>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        ends: StageEnds<'a, M::Hidden, O::Batch>,
    ) -> Result<StageThreads<'scope, M>, PipelineError>
    where
        'a: 'scope,
        M: Segmented<Input = O::Input, Output = O::Output> + 'static,
        B: Fn(&Device) -> M + Sync,
        F: Fn() -> ModuleOptimizer + Sync,
    {
        let StageEnds {
            peers,
            inboxes,
            replicas,
            pipelines,
            steps,
            done,
            parts,
        } = ends;
        let layout = self.layout;
        // Sends between stages on different devices go through couriers that move them.
        let (mut routes, couriers) = if layout.mixed {
            transfer::routes(scope, &peers, &layout.devices, self.abort, layout.always)
        } else {
            (Vec::new(), Vec::new())
        };
        // Across processes, the local stage's sends to the others go through link threads.
        #[cfg(feature = "mpi")]
        let (peers, linked) = self.link(scope, peers)?;
        let mut steps = steps.into_iter();
        let stages = inboxes
            .into_iter()
            .zip(replicas)
            .zip(pipelines)
            .enumerate()
            .filter(|(thread, _)| layout.local.contains(thread))
            .map(|(thread, ((inbox, replicas), pipeline))| {
                let steps = steps.next().expect("one per local thread");
                let outbox = routes
                    .get_mut(thread)
                    .map(std::mem::take)
                    .unwrap_or_else(|| peers[thread / layout.stages].clone());
                let links = self.links(thread, (inbox, outbox), replicas, pipeline, &parts);
                self.spawn(scope, links, steps, done.clone())
            })
            .collect();
        Ok(StageThreads {
            stages,
            couriers,
            #[cfg(feature = "mpi")]
            linked,
        })
    }

    /// Stage thread `thread`'s links: its mailbox on `inbox`, its senders to its pipeline's
    /// stages (`peers`), its groups, where its checkpoint parts go, and its batches' device.
    fn links<H>(
        &self,
        thread: usize,
        (inbox, peers): (Receiver<Message<H>>, Vec<Sender<Message<H>>>),
        replicas: Option<Communicator>,
        pipeline: Option<&'a Communicator>,
        parts: &PartSender,
    ) -> Links<'a, H> {
        let layout = self.layout;
        let (group, index) = (thread / layout.stages, thread % layout.stages);
        Links {
            mailbox: Mailbox::new(
                index,
                inbox,
                self.pipeline.config.timeout,
                self.abort.clone(),
            ),
            peers,
            replicas,
            pipeline,
            thread,
            // The pipelines mirror each other: the first one's stages save.
            parts: (self.pipeline.checkpointer.is_some() && group == 0).then(|| parts.clone()),
            batches_to: (layout.mixed && (index == 0 || index + 1 == layout.stages))
                .then(|| layout.devices[thread].clone()),
        }
    }

    /// Starts the thread of the stage `links` serve, taking its steps from `steps` and
    /// reporting them to `done`.
    fn spawn<'scope, M>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        links: Links<'a, M::Hidden>,
        steps: Receiver<StepData<O::Batch>>,
        done: Sender<StepDone>,
    ) -> ScopedJoinHandle<'scope, Result<Stage<M>, PipelineError>>
    where
        'a: 'scope,
        M: Segmented<Input = O::Input, Output = O::Output> + 'static,
        B: Fn(&Device) -> M + Sync,
        F: Fn() -> ModuleOptimizer + Sync,
    {
        let (layout, pipeline) = (self.layout, self.pipeline);
        let thread = links.thread;
        let (group, index) = (thread / layout.stages, thread % layout.stages);
        let start = StageStart {
            index,
            device: layout.devices[thread].clone(),
            threads: layout.threads,
            warm: layout.warm,
            build: self.build,
            optimizer: self.optimizer,
            objective: &pipeline.objective,
            config: &pipeline.config,
            plan: &layout.plan,
            links,
            resume: pipeline.resume.as_ref(),
            steps,
            done,
            abort: self.abort.clone(),
        };
        std::thread::Builder::new()
            .name(format!("kiln-stage-{group}-{index}"))
            .spawn_scoped(scope, move || start.run())
            .expect("spawning a stage thread")
    }

    /// Across processes: link threads that carry the local stage's sends to the other
    /// processes' stages (its pipeline's senders in `peers` become theirs), and their guard.
    #[cfg(feature = "mpi")]
    fn link<'scope, H: kiln_core::Activation>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        mut peers: Vec<Peers<H>>,
    ) -> Result<(Vec<Peers<H>>, Option<Guard<'scope>>), PipelineError> {
        let (Some(world), Some(pipeline)) = (&self.pipeline.processes, self.across) else {
            return Ok((peers, None));
        };
        let stages = self.layout.stages;
        let rank = world.rank();
        let (group, stage) = (rank / stages, rank % stages);
        let device = self
            .pipeline
            .config
            .train_device(&self.pipeline.devices[rank]);
        let (links, guard) = crate::runtime::processes::link(
            scope,
            pipeline,
            peers[group][stage].clone(),
            device,
            self.abort.clone(),
        )?;
        peers[group] = links;
        Ok((peers, Some(guard)))
    }
}

impl<M> StageThreads<'_, M> {
    /// Waits for the stage threads of `layout`, then for the threads serving them: each
    /// stage's result (a panic as its error), and the helpers' errors.
    pub(crate) fn join(
        self,
        layout: &RunLayout,
    ) -> (Vec<Result<Stage<M>, PipelineError>>, Vec<PipelineError>) {
        let mut results = Vec::with_capacity(layout.local.len());
        for (&thread, handle) in layout.local.iter().zip(self.stages) {
            results.push(handle.join().unwrap_or_else(|panic| {
                Err(PipelineError::Stage {
                    stage: thread % layout.stages,
                    message: panic_message(&*panic),
                })
            }));
        }
        #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
        let mut helpers = transfer::join(self.couriers);
        #[cfg(feature = "mpi")]
        helpers.extend(self.linked.and_then(|guard| guard.finish().err()));
        (results, helpers)
    }
}
