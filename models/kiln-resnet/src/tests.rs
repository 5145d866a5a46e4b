//! Parameter counts against torchvision and segment equivalence.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Tensor};
use kiln_core::{
    Activation, SegmentId, Segmented, forward_segments, init_module, param_infos, with_seed,
};

use crate::{ResNet, ResNetConfig, StemKind};

/// Trainable parameters of `config`'s model, counted from the shapes of its lazy
/// parameters: building and counting allocate no weights (asserted), so even ResNet-152 is
/// cheap. Burn's batch-norm running statistics are allocated at once; they are buffers and
/// not counted.
fn trainable_params(config: &ResNetConfig) -> usize {
    let model = config.init(&Device::flex().autodiff());
    let mut counter = LazyCount::default();
    model.visit(&mut counter);
    assert!(counter.trainable > 0);
    assert_eq!(counter.materialised, 0, "counting allocated weights");
    counter.trainable
}

/// Counts the elements of lazy (not yet allocated) parameters and of allocated trainable ones.
#[derive(Default)]
struct LazyCount {
    trainable: usize,
    /// Allocated trainable parameters: none, if nothing forced initialisation.
    materialised: usize,
}

impl burn::module::ModuleVisitor for LazyCount {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
        if !param.is_initialized() {
            self.trainable += param.lazy_shape().num_elements();
        } else if param.val().is_require_grad() {
            self.trainable += param.val().shape().num_elements();
            self.materialised += 1;
        }
    }
}

#[test]
fn parameter_counts_equal_torchvision() {
    assert_eq!(trainable_params(&ResNetConfig::resnet18(1000)), 11_689_512);
    assert_eq!(trainable_params(&ResNetConfig::resnet34(1000)), 21_797_672);
    assert_eq!(trainable_params(&ResNetConfig::resnet50(1000)), 25_557_032);
    assert_eq!(trainable_params(&ResNetConfig::resnet101(1000)), 44_549_160);
    assert_eq!(trainable_params(&ResNetConfig::resnet152(1000)), 60_192_808);
    assert_eq!(
        trainable_params(&ResNetConfig::resnet18(10).with_stem(StemKind::Cifar)),
        11_173_962
    );
}

#[test]
fn deeper_configs_build_with_the_expected_block_counts() {
    let device = Device::flex();
    for (depth, blocks) in [(101, 33), (152, 50)] {
        let model = ResNetConfig::from_depth(depth, 10)
            .unwrap()
            .with_base_width(2)
            .init(&device);
        assert_eq!(model.num_middle_segments(), blocks);
    }
    assert!(ResNetConfig::from_depth(20, 10).is_none());
}

fn small(stem: StemKind, depth: usize, device: &Device) -> ResNet {
    init_module(device, 3, || {
        ResNetConfig::from_depth(depth, 5)
            .unwrap()
            .with_stem(stem)
            .with_base_width(4)
            .init(device)
    })
}

#[test]
fn segments_in_order_give_exactly_forward_output() {
    let device = Device::flex();
    for (stem, depth, side) in [(StemKind::Cifar, 18, 8), (StemKind::ImageNet, 50, 32)] {
        let model = small(stem, depth, &device);
        let input = with_seed(&device, 9, || {
            Tensor::<4>::random([2, 3, side, side], Distribution::Default, &device)
        });
        let whole = model.forward(input.clone()).into_data();
        let segmented = forward_segments(&model, input).into_data();
        assert_eq!(whole, segmented, "{stem:?} resnet{depth}");
    }
}

/// Backward one segment at a time (cut at every boundary) gives the same gradients as one
/// backward through the whole model. Both runs start from the same weights and inputs.
#[test]
fn segment_by_segment_backward_gives_forward_gradients() {
    let device = Device::flex().autodiff();
    let model = small(StemKind::Cifar, 18, &device);
    let input = with_seed(&device, 9, || {
        Tensor::<4>::random([2, 3, 8, 8], Distribution::Default, &device)
    });

    let reference =
        GradientsParams::from_grads(model.forward(input.clone()).sum().backward(), &model);

    // Forward with a cut at every boundary, remembering each segment's input and output.
    let mut cuts = Vec::new();
    let mut hidden = model.forward_input(input.clone());
    let mut outputs = vec![hidden.clone()];
    for index in 0..model.num_middle_segments() {
        let cut = hidden.detach_boundary();
        hidden = model.forward_middle(index, cut.clone());
        cuts.push(cut);
        outputs.push(hidden.clone());
    }
    let last = hidden.detach_boundary();
    let mut grads = model.forward_output(last.clone()).sum().backward();
    let mut upstream = last.boundary_grad(&grads).unwrap();
    let mut collected = GradientsParams::from_module(&mut grads, &model);
    for index in (0..model.num_middle_segments()).rev() {
        let mut segment_grads = outputs[index + 1].backward_with(upstream);
        upstream = cuts[index].boundary_grad(&segment_grads).unwrap();
        merge(
            &mut collected,
            GradientsParams::from_module(&mut segment_grads, &model),
            &model,
        );
    }
    let mut stem_grads = outputs[0].backward_with(upstream);
    merge(
        &mut collected,
        GradientsParams::from_module(&mut stem_grads, &model),
        &model,
    );

    let mut compared = 0;
    for info in param_infos(&model).iter().filter(|p| p.trainable) {
        let (a, b) = match info.shape.len() {
            1 => (
                reference.get::<1>(info.id).map(|t| t.into_data()),
                collected.get::<1>(info.id).map(|t| t.into_data()),
            ),
            2 => (
                reference.get::<2>(info.id).map(|t| t.into_data()),
                collected.get::<2>(info.id).map(|t| t.into_data()),
            ),
            _ => (
                reference.get::<4>(info.id).map(|t| t.into_data()),
                collected.get::<4>(info.id).map(|t| t.into_data()),
            ),
        };
        let (a, b) = (
            a.expect("reference gradient"),
            b.unwrap_or_else(|| panic!("no segment gradient for {}", info.path)),
        );
        assert_eq!(a, b, "gradient of {}", info.path);
        compared += 1;
    }
    assert_eq!(
        compared,
        param_infos(&model).iter().filter(|p| p.trainable).count()
    );
    assert!(compared > 40);
    let _ = SegmentId::Output;
}

/// Moves every gradient of `from` into `into` (segments own disjoint parameters).
fn merge(into: &mut GradientsParams, mut from: GradientsParams, model: &ResNet) {
    for info in param_infos(model) {
        match info.shape.len() {
            1 => {
                if let Some(g) = from.remove::<1>(info.id) {
                    into.register(info.id, g);
                }
            }
            2 => {
                if let Some(g) = from.remove::<2>(info.id) {
                    into.register(info.id, g);
                }
            }
            _ => {
                if let Some(g) = from.remove::<4>(info.id) {
                    into.register(info.id, g);
                }
            }
        }
    }
}

#[test]
fn visiting_every_segment_visits_every_parameter_once() {
    let model = small(StemKind::ImageNet, 34, &Device::flex());
    let mut ids = Vec::new();
    for segment in model.segments() {
        let mut collector = Ids(&mut ids);
        model.visit_segment(segment, &mut collector);
    }
    let mut all: Vec<_> = param_infos(&model).into_iter().map(|p| p.id).collect();
    ids.sort_by_key(|id| id.val());
    all.sort_by_key(|id| id.val());
    assert_eq!(ids, all);
}

struct Ids<'a>(&'a mut Vec<burn::module::ParamId>);

impl burn::module::ModuleVisitor for Ids<'_> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
        self.0.push(param.id);
    }
}
