//! A non-classifier model for tests of every step (feature `testing`): a small segmented
//! regression network, its own batch type, a mean-squared-error objective, a hand-written
//! single-device f32 reference and the per-tensor comparison of parameter changes.
//!
//! kiln-ddp and kiln-pipeline test their steps on it too (their dev-dependencies turn the
//! feature on), so every step is checked against the same reference on a model that is not
//! an image classifier.

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{Module, ModuleVisitor};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use kiln_core::{
    FlatLayout, Forward, SegmentId, Segmented, forward_segments, init_module, param_infos,
    read_params,
};
use kiln_data::{Batch, BatchList};

use crate::Objective;

/// Features per sample.
pub const FEATURES: usize = 4;
/// Hidden width.
const WIDTH: usize = 8;

/// Linear → ReLU, two hidden Linear → ReLU segments, Linear to one value: `Tensor<2>` in,
/// `Tensor<2>` out, four segments.
#[derive(Module, Debug)]
pub struct RegressionNet {
    input: Linear,
    middle: Vec<Linear>,
    output: Linear,
}

impl RegressionNet {
    /// The network, seeded, on `device`.
    pub fn new(device: &Device, seed: u64) -> Self {
        init_module(device, seed, || Self {
            input: LinearConfig::new(FEATURES, WIDTH).init(device),
            middle: (0..2)
                .map(|_| LinearConfig::new(WIDTH, WIDTH).init(device))
                .collect(),
            output: LinearConfig::new(WIDTH, 1).init(device),
        })
    }
}

impl Segmented for RegressionNet {
    type Input = Tensor<2>;
    type Hidden = Tensor<2>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.middle.len()
    }

    fn forward_input(&self, input: Tensor<2>) -> Tensor<2> {
        relu(self.input.forward(input))
    }

    fn forward_middle(&self, index: usize, hidden: Tensor<2>) -> Tensor<2> {
        relu(self.middle[index].forward(hidden))
    }

    fn forward_output(&self, hidden: Tensor<2>) -> Tensor<2> {
        self.output.forward(hidden)
    }

    fn visit_segment<V: ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        match segment {
            SegmentId::Input => self.input.visit(visitor),
            SegmentId::Middle(index) => self.middle[index].visit(visitor),
            SegmentId::Output => self.output.visit(visitor),
        }
    }
}

impl Forward for RegressionNet {
    type Input = Tensor<2>;
    type Output = Tensor<2>;

    fn forward(&self, input: Tensor<2>) -> Tensor<2> {
        forward_segments(self, input)
    }
}

/// A batch of feature rows and their float targets.
#[derive(Debug, Clone)]
pub struct Rows {
    /// `[samples, FEATURES]`.
    pub features: Tensor<2>,
    /// `[samples, 1]`.
    pub targets: Tensor<2>,
}

impl Batch for Rows {
    fn samples(&self) -> usize {
        self.features.dims()[0]
    }

    fn slice(&self, range: Range<usize>) -> Self {
        Rows {
            features: self.features.clone().slice([range.clone()]),
            targets: self.targets.clone().slice([range]),
        }
    }

    fn to_device(&self, device: &Device) -> Option<Self> {
        Some(Rows {
            features: self.features.clone().to_device(device),
            targets: self.targets.clone().to_device(device),
        })
    }
}

/// Mean squared error × `scale` (1 is the plain loss; another scale is a different loss,
/// for the control runs).
#[derive(Debug, Clone, Copy)]
pub struct Mse {
    /// Factor on the loss.
    pub scale: f32,
}

impl Default for Mse {
    fn default() -> Self {
        Self { scale: 1.0 }
    }
}

impl Objective for Mse {
    type Batch = Rows;
    type Input = Tensor<2>;
    type Output = Tensor<2>;

    fn input(&self, batch: &Rows) -> Tensor<2> {
        batch.features.clone()
    }

    fn loss(&self, output: &Tensor<2>, batch: &Rows) -> Tensor<1> {
        let loss = MseLoss::new().forward(output.clone(), batch.targets.clone(), Reduction::Mean);
        if self.scale == 1.0 {
            loss
        } else {
            loss.mul_scalar(self.scale)
        }
    }

    fn correct(&self, output: &Tensor<2>, batch: &Rows) -> usize {
        // Within 0.5 of the target counts as right (an accuracy for the reports).
        let error = (output.clone().detach() - batch.targets.clone()).abs();
        error.lower_elem(0.5).int().sum().into_scalar::<i64>() as usize
    }
}

/// `count` batches of `size` rows on `device`: features from a fixed generator, targets a
/// smooth function of them.
pub fn regression_batches(count: usize, size: usize, device: &Device) -> Vec<Rows> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    (0..count)
        .map(|_| {
            let features: Vec<f32> = (0..size * FEATURES).map(|_| next()).collect();
            let targets: Vec<f32> = features
                .chunks(FEATURES)
                .map(|x| 0.5 * x[0] - x[1] + 0.25 * x[2] * x[3] + 0.1)
                .collect();
            Rows {
                features: Tensor::from_data(TensorData::new(features, [size, FEATURES]), device),
                targets: Tensor::from_data(TensorData::new(targets, [size, 1]), device),
            }
        })
        .collect()
}

/// The batches as a source on `device`.
pub fn source(batches: Vec<Rows>, device: &Device) -> BatchList<Rows> {
    BatchList::new(batches).on_device(device.clone())
}

/// SGD with momentum 0.9.
pub fn sgd() -> ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

/// Single-device f32 training written out by hand (no kiln step): step `s` takes batch
/// `s mod batches.len()` whole, forward, mean squared error, backward, SGD with momentum at
/// `lr`. The trained parameters by path.
pub fn reference(seed: u64, batches: &[Rows], steps: usize, lr: f64) -> HashMap<String, Vec<f32>> {
    let device = Device::flex().autodiff();
    let mut model = RegressionNet::new(&device, seed);
    let mut optimizer = sgd();
    for step in 0..steps {
        let batch = &batches[step % batches.len()];
        let output = Forward::forward(&model, batch.features.clone());
        let loss = MseLoss::new().forward(output, batch.targets.clone(), Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(lr, model, grads);
    }
    by_path(&model)
}

/// A step's record at `images_per_sec` (the rest fixed), for tests of what reports compute
/// from a run's steps.
pub fn step_at(images_per_sec: f64) -> crate::StepRecord {
    crate::StepRecord {
        epoch: 0,
        step: 0,
        loss: 1.0,
        accuracy: 0.0,
        lr: 0.1,
        images_per_sec,
        data_wait: std::time::Duration::ZERO,
        loss_scale: None,
    }
}

/// Trainable parameters by path.
pub fn by_path<M: Module>(model: &M) -> HashMap<String, Vec<f32>> {
    let layout = FlatLayout::new(param_infos(model).into_iter().filter(|i| i.trainable));
    let flat = read_params(model, &layout);
    layout
        .entries()
        .iter()
        .map(|e| {
            let values = flat[e.offset..e.offset + e.info.numel()].to_vec();
            (e.info.path.clone(), values)
        })
        .collect()
}

/// Windows of the first 20,000 bytes of the shipped Jargon File, `context` tokens each,
/// `batch` a batch for replica `rank` of `world`, seeded: the text of the language-model
/// tests (kiln-ddp's and kiln-pipeline's GPT tests).
pub fn jargon_windows(
    (context, batch): (usize, usize),
    (rank, world): (usize, usize),
    seed: u64,
    device: &Device,
) -> kiln_data::TextWindows {
    let text = kiln_data::TextCorpus::jargon_file();
    let head =
        kiln_data::TextCorpus::from_bytes("the Jargon File's head", &text.tokens()[..20_000]);
    kiln_data::TextWindows::builder(head)
        .context(context)
        .batch_size(batch)
        .shard(rank, world)
        .seed(seed)
        .device(device.clone())
        .build()
        .expect("20,000 bytes make windows")
}
