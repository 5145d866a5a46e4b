//! Residual blocks: the basic block of ResNet-18/34 and the bottleneck of ResNet-50+.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Initializer, PaddingConfig2d};
use burn::tensor::{Device, FloatDType, Tensor};
use kiln_kernels::conv2d;
use kiln_kernels::{add_relu, relu};

use crate::BlockKind;

/// Applies `bn` under any mixed-precision policy, synchronised over data-parallel replicas
/// when the step asks for it (`kiln_core::sync_batch_norm`, which computes in f32).
///
/// - Everything in one dtype: the layer's own forward.
/// - Layer kept f32, input in f16/bf16 (kiln-amp's default policy): the input is cast to
///   f32 and the output back, so normalisation and its statistics are f32.
/// - Layer cast to the input's half type, running statistics f32 (buffers are never cast;
///   kiln-amp's `cast_everything`): normalisation runs in half precision, saving the f32
///   copy of every activation, while the running statistics accumulate in f32.
pub(crate) fn norm(bn: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
    if kiln_core::sync_batch_norm_active() {
        return kiln_core::sync_batch_norm(bn, x);
    }
    let layer = bn.gamma.val().dtype();
    let input = x.dtype();
    if input == layer {
        layer_dtype_norm(bn, x)
    } else {
        layer_dtype_norm(bn, x.cast(FloatDType::from(layer))).cast(FloatDType::from(input))
    }
}

/// `bn.forward(x)` for `x` in the layer's dtype, running statistics in theirs: training mode
/// on kiln's batch-norm kernel (`kiln_kernels::batch_norm_train`: Burn's arithmetic, without
/// its channels-first copies; the statistics update keeps the buffers' dtype), inference
/// mode on `kiln_kernels::batch_norm_inference` (one pass; Burn's composition under
/// autodiff) with the running statistics cast to `x`'s dtype, as Burn's ops require.
fn layer_dtype_norm(bn: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
    if x.device().is_autodiff() && bn.training.is_enabled() {
        let batch = kiln_kernels::batch_norm_train(x, bn.gamma.val(), bn.beta.val(), bn.epsilon);
        kiln_core::update_running_statistics(bn, batch.mean.detach(), batch.variance.detach());
        return batch.output;
    }
    let (device, dtype) = (x.device(), FloatDType::from(x.dtype()));
    let running = |t: Tensor<1>| t.to_device(&device).cast(dtype);
    let statistics = (
        running(bn.running_mean.value()),
        running(bn.running_var.value()),
    );
    kiln_kernels::batch_norm_inference(x, (bn.gamma.val(), bn.beta.val()), statistics, bn.epsilon)
}

/// torchvision's convolution initialiser: Kaiming normal, fan-out, ReLU gain.
pub(crate) fn conv_initializer() -> Initializer {
    Initializer::KaimingNormal {
        gain: std::f64::consts::SQRT_2,
        fan_out_only: true,
    }
}

fn conv(channels: [usize; 2], kernel: usize, stride: usize, device: &Device) -> Conv2d {
    let pad = kernel / 2;
    Conv2dConfig::new(channels, [kernel, kernel])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .with_bias(false)
        .with_initializer(conv_initializer())
        .init(device)
}

/// The 1×1 projection on the skip path when a block changes shape.
#[derive(Module, Debug)]
pub struct Downsample {
    /// 1×1 convolution with the block's stride.
    pub conv: Conv2d,
    /// Its batch norm.
    pub bn: BatchNorm,
}

impl Downsample {
    fn new(channels: [usize; 2], stride: usize, device: &Device) -> Self {
        Self {
            conv: conv(channels, 1, stride, device),
            bn: BatchNormConfig::new(channels[1]).init(device),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        norm(&self.bn, conv2d(&self.conv, x))
    }
}

fn skip(downsample: &Option<Downsample>, x: Tensor<4>) -> Tensor<4> {
    match downsample {
        Some(down) => down.forward(x),
        None => x,
    }
}

fn downsample_if_needed(
    in_channels: usize,
    out_channels: usize,
    stride: usize,
    device: &Device,
) -> Option<Downsample> {
    (stride != 1 || in_channels != out_channels)
        .then(|| Downsample::new([in_channels, out_channels], stride, device))
}

/// Two 3×3 convolutions with a skip connection (expansion 1).
#[derive(Module, Debug)]
pub struct BasicBlock {
    /// First 3×3 convolution (carries the stride).
    pub conv1: Conv2d,
    /// Batch norm after `conv1`.
    pub bn1: BatchNorm,
    /// Second 3×3 convolution.
    pub conv2: Conv2d,
    /// Batch norm after `conv2`.
    pub bn2: BatchNorm,
    /// Projection of the skip path, when the shape changes.
    pub downsample: Option<Downsample>,
}

impl BasicBlock {
    /// A block from `in_channels` to `width` channels.
    pub fn new(in_channels: usize, width: usize, stride: usize, device: &Device) -> Self {
        Self {
            conv1: conv([in_channels, width], 3, stride, device),
            bn1: BatchNormConfig::new(width).init(device),
            conv2: conv([width, width], 3, 1, device),
            bn2: BatchNormConfig::new(width).init(device),
            downsample: downsample_if_needed(in_channels, width, stride, device),
        }
    }

    /// Applies the block.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let out = relu(norm(&self.bn1, conv2d(&self.conv1, x.clone())));
        let out = norm(&self.bn2, conv2d(&self.conv2, out));
        add_relu(out, skip(&self.downsample, x))
    }
}

/// 1×1 reduce, 3×3, 1×1 expand, with a skip connection (expansion 4).
#[derive(Module, Debug)]
pub struct Bottleneck {
    /// 1×1 reduction to `width`.
    pub conv1: Conv2d,
    /// Batch norm after `conv1`.
    pub bn1: BatchNorm,
    /// 3×3 convolution (carries the stride, as in torchvision's "ResNet v1.5").
    pub conv2: Conv2d,
    /// Batch norm after `conv2`.
    pub bn2: BatchNorm,
    /// 1×1 expansion to `4 × width`.
    pub conv3: Conv2d,
    /// Batch norm after `conv3`.
    pub bn3: BatchNorm,
    /// Projection of the skip path, when the shape changes.
    pub downsample: Option<Downsample>,
}

impl Bottleneck {
    /// A block from `in_channels` to `4 × width` channels.
    pub fn new(in_channels: usize, width: usize, stride: usize, device: &Device) -> Self {
        let out = width * BlockKind::Bottleneck.expansion();
        Self {
            conv1: conv([in_channels, width], 1, 1, device),
            bn1: BatchNormConfig::new(width).init(device),
            conv2: conv([width, width], 3, stride, device),
            bn2: BatchNormConfig::new(width).init(device),
            conv3: conv([width, out], 1, 1, device),
            bn3: BatchNormConfig::new(out).init(device),
            downsample: downsample_if_needed(in_channels, out, stride, device),
        }
    }

    /// Applies the block.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let out = relu(norm(&self.bn1, conv2d(&self.conv1, x.clone())));
        let out = relu(norm(&self.bn2, conv2d(&self.conv2, out)));
        let out = norm(&self.bn3, conv2d(&self.conv3, out));
        add_relu(out, skip(&self.downsample, x))
    }
}

/// Either kind of residual block, so one model type covers the whole family.
// Blocks are built once and never moved in a hot loop; boxing would only add an indirection
// (and Burn's `Module` derive does not cover `Box`).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum ResidualBlock {
    /// A basic block.
    Basic(BasicBlock),
    /// A bottleneck block.
    Bottleneck(Bottleneck),
}

impl ResidualBlock {
    /// A block of `kind` from `in_channels` to `width × expansion` channels.
    pub fn new(
        kind: BlockKind,
        in_channels: usize,
        width: usize,
        stride: usize,
        device: &Device,
    ) -> Self {
        match kind {
            BlockKind::Basic => Self::Basic(BasicBlock::new(in_channels, width, stride, device)),
            BlockKind::Bottleneck => {
                Self::Bottleneck(Bottleneck::new(in_channels, width, stride, device))
            }
        }
    }

    /// Applies the block.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        match self {
            Self::Basic(block) => block.forward(x),
            Self::Bottleneck(block) => block.forward(x),
        }
    }
}
