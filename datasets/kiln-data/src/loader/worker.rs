//! A persistent worker thread and the messages it exchanges with the loader.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::collate::BatchRecipe;
use crate::{DataError, ImageBatch};

/// The batches one worker must build for one epoch.
pub(crate) struct Plan {
    pub generation: u64,
    pub epoch: u64,
    /// (batch number in the epoch, sample indices).
    pub batches: Vec<(usize, Vec<usize>)>,
}

/// A finished batch.
pub(crate) struct Delivery {
    pub generation: u64,
    pub batch: usize,
    pub result: Result<ImageBatch, DataError>,
}

/// The loader's handle on one worker thread.
pub(crate) struct Worker {
    pub plans: Option<Sender<Plan>>,
    pub deliveries: Receiver<Delivery>,
    pub handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts worker `id` with a queue of `prefetch` finished batches.
    pub fn spawn(
        id: usize,
        recipe: Arc<BatchRecipe>,
        prefetch: usize,
        current: Arc<AtomicU64>,
    ) -> Self {
        let (plan_tx, plan_rx) = crossbeam_channel::unbounded::<Plan>();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Delivery>(prefetch);
        let handle = std::thread::Builder::new()
            .name(format!("kiln-loader-{id}"))
            .spawn(move || run(&recipe, &plan_rx, &done_tx, &current))
            .expect("failed to spawn a loader worker thread");
        Self {
            plans: Some(plan_tx),
            deliveries: done_rx,
            handle: Some(handle),
        }
    }
}

fn run(recipe: &BatchRecipe, plans: &Receiver<Plan>, done: &Sender<Delivery>, current: &AtomicU64) {
    // Ends when the loader drops its plan sender (no more epochs) or its delivery receiver
    // (a blocked `send` then fails at once, so a full queue cannot keep the worker alive).
    while let Ok(plan) = plans.recv() {
        for (batch, indices) in plan.batches {
            if current.load(Ordering::Acquire) != plan.generation {
                break; // the epoch was abandoned: skip the rest of its work
            }
            let result = recipe.build(plan.epoch, indices);
            if done
                .send(Delivery {
                    generation: plan.generation,
                    batch,
                    result,
                })
                .is_err()
            {
                return;
            }
        }
    }
}
