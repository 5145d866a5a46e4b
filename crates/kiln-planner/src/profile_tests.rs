//! The profiler on a real (tiny) ResNet; this test binary runs with the tracking allocator
//! (see `memory.rs`), as a binary that profiles on the CPU would.

use burn::module::Module;
use burn::tensor::{Device, Distribution, Int, Tensor};
use kiln_core::{ImageClassifier, SegmentId, Segmented, init_module, param_infos};
use kiln_resnet::{ResNet, ResNetConfig, StemKind};

use crate::{ProfileOptions, profile_segments};

fn model(device: &Device) -> ResNet {
    init_module(device, 7, || {
        ResNetConfig::resnet18(4)
            .with_stem(StemKind::Cifar)
            .with_base_width(4)
            .init(device)
    })
}

#[test]
fn every_segment_is_timed_and_sized() {
    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = model(&device);
    let batch = 6;
    let images = kiln_core::with_seed(&device, 1, || {
        Tensor::<4>::random([batch, 3, 16, 16], Distribution::Normal(0.0, 1.0), &device)
    });
    let labels = Tensor::<1, Int>::from_ints([0, 1, 2, 3, 0, 1], &device);
    let options = ProfileOptions {
        runs: 3,
        warmup: 1,
        threads: Some(1),
    };
    let profile = profile_segments(&model, images, labels, &options).unwrap();
    assert_eq!(profile.batch, batch);
    assert_eq!(profile.segments.len(), model.segments().len());
    assert_eq!(profile.segments[0].name, "input");
    assert_eq!(profile.segments.last().unwrap().name, "output");
    for segment in &profile.segments {
        assert!(segment.forward_seconds > 0.0, "{segment:?}");
        assert!(segment.backward_seconds > 0.0, "{segment:?}");
        assert!(
            segment.activation_bytes.is_some(),
            "the tracking allocator is installed"
        );
    }
    // The segments keep at least their outputs (a kernel's scratch buffer shrinking inside
    // one segment can make that segment's own count smaller, never the sum).
    let kept: u64 = profile
        .segments
        .iter()
        .map(|s| s.activation_bytes.unwrap())
        .sum();
    let outputs: u64 = profile.segments.iter().map(|s| s.output_bytes).sum();
    assert!(kept >= outputs, "{kept} < {outputs}");
    // The stem's output: batch x width 4 x 16 x 16 floats.
    assert_eq!(
        profile.segments[0].output_bytes,
        (batch * 4 * 16 * 16 * 4) as u64
    );
    // Parameter bytes over the segments are the model's.
    let (trainable, buffers) = param_infos(&model).iter().fold((0, 0), |(t, b), info| {
        let bytes = 4 * info.numel() as u64;
        if info.trainable {
            (t + bytes, b)
        } else {
            (t, b + bytes)
        }
    });
    let sum = |pick: fn(&crate::SegmentProfile) -> u64| -> u64 {
        profile.segments.iter().map(pick).sum()
    };
    assert_eq!(sum(|s| s.trainable_bytes), trainable);
    assert_eq!(sum(|s| s.buffer_bytes), buffers);
    assert!(buffers > 0, "batch-norm statistics are buffers");
}

#[test]
fn kept_activations_grow_with_the_batch() {
    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = model(&device);
    let run = |batch: usize| {
        let images = kiln_core::with_seed(&device, 1, || {
            Tensor::<4>::random([batch, 3, 16, 16], Distribution::Normal(0.0, 1.0), &device)
        });
        let labels = Tensor::<1, Int>::zeros([batch], &device);
        profile_segments(&model, images, labels, &ProfileOptions::default()).unwrap()
    };
    let (small, large) = (run(2), run(16));
    let kept = |p: &crate::BatchProfile| -> u64 {
        p.segments.iter().map(|s| s.activation_bytes.unwrap()).sum()
    };
    let outputs =
        |p: &crate::BatchProfile| -> u64 { p.segments.iter().map(|s| s.output_bytes).sum() };
    // What grows with the batch is at least the outputs' growth (the graph's bookkeeping is
    // a fixed cost on top).
    let growth = kept(&large) - kept(&small);
    assert!(
        growth >= outputs(&large) - outputs(&small),
        "{} vs {}",
        kept(&large),
        kept(&small)
    );
}

#[test]
fn an_empty_batch_or_no_runs_is_an_error() {
    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = model(&device);
    let images = Tensor::<4>::zeros([0, 3, 16, 16], &device);
    let labels = Tensor::<1, Int>::zeros([0], &device);
    let err = profile_segments(&model, images, labels, &ProfileOptions::default()).unwrap_err();
    assert!(err.to_string().contains("one sample"), "{err}");
}

#[test]
fn an_update_costs_a_positive_time_per_byte() {
    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = model(&device);
    let images = kiln_core::with_seed(&device, 1, || {
        Tensor::<4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), &device)
    });
    let labels = Tensor::<1, Int>::from_ints([0, 1, 2, 3], &device);
    let optimizer = burn::optim::SgdConfig::new()
        .with_momentum(Some(burn::optim::momentum::MomentumConfig::new()))
        .init();
    let options = ProfileOptions {
        runs: 3,
        warmup: 0,
        threads: Some(1),
    };
    let per_byte =
        crate::profile_update(&model, images.clone(), labels.clone(), optimizer, &options).unwrap();
    assert!(per_byte.is_finite() && per_byte > 0.0, "{per_byte}");
    let optimizer = burn::optim::SgdConfig::new().init();
    let none = ProfileOptions { runs: 0, ..options };
    let err = crate::profile_update(&model, images, labels, optimizer, &none).unwrap_err();
    assert!(err.to_string().contains("runs"), "{err}");
}

/// ResNet whose third block panics, as a model failing on a device would.
#[derive(Module, Debug)]
struct Faulty {
    inner: ResNet,
}

impl ImageClassifier for Faulty {
    fn forward_logits(&self, images: Tensor<4>) -> Tensor<2> {
        kiln_core::forward_segments(self, images)
    }
}

impl Segmented for Faulty {
    type Input = Tensor<4>;
    type Hidden = Tensor<4>;
    type Output = Tensor<2>;

    fn num_middle_segments(&self) -> usize {
        self.inner.num_middle_segments()
    }
    fn forward_input(&self, input: Tensor<4>) -> Tensor<4> {
        self.inner.forward_input(input)
    }
    fn forward_middle(&self, index: usize, hidden: Tensor<4>) -> Tensor<4> {
        assert!(index != 2, "planted failure in block 2");
        self.inner.forward_middle(index, hidden)
    }
    fn forward_output(&self, hidden: Tensor<4>) -> Tensor<2> {
        self.inner.forward_output(hidden)
    }
    fn visit_segment<V: burn::module::ModuleVisitor>(&self, segment: SegmentId, visitor: &mut V) {
        self.inner.visit_segment(segment, visitor);
    }
}

#[test]
fn a_model_failing_on_the_device_is_an_error_naming_the_device() {
    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = Faulty {
        inner: model(&device),
    };
    let images = Tensor::<4>::zeros([2, 3, 16, 16], &device);
    let labels = Tensor::<1, Int>::zeros([2], &device);
    let err = profile_segments(&model, images, labels, &ProfileOptions::default()).unwrap_err();
    let crate::ProfileError::Device {
        device: name,
        message,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(
        *name,
        format!("{device:?}"),
        "the device the profile ran on"
    );
    assert!(message.contains("planted failure in block 2"), "{err}");
    assert!(err.to_string().starts_with("profiling on "), "{err}");
}

#[test]
fn a_model_that_is_not_a_classifier_is_profiled_for_its_objective() {
    use kiln_train::testing::{Mse, RegressionNet, regression_batches};

    let _alone = crate::memory::MEASURING.lock();
    let device = Device::flex().autodiff();
    let model = RegressionNet::new(&device, 1);
    let batch = regression_batches(1, 8, &device).remove(0);
    let options = ProfileOptions {
        runs: 2,
        warmup: 0,
        threads: Some(1),
    };
    let profile =
        crate::profile_segments_with(&model, &Mse::default(), &batch, &device, &options).unwrap();
    assert_eq!(profile.batch, 8);
    assert_eq!(profile.segments.len(), 4, "input, two middles, output");
    for segment in &profile.segments {
        assert!(segment.forward_seconds > 0.0, "{segment:?}");
        assert!(segment.backward_seconds > 0.0, "{segment:?}");
        assert!(segment.trainable_bytes > 0, "{segment:?}");
    }
    let optimizer = burn::optim::SgdConfig::new().init();
    let per_byte = crate::profile_update_with(
        &model,
        (&Mse::default(), &batch),
        &device,
        optimizer,
        &options,
    )
    .unwrap();
    assert!(per_byte.is_finite() && per_byte > 0.0, "{per_byte}");
}

#[test]
fn a_whole_model_is_profiled_at_each_batch_size_and_a_short_batch_is_refused() {
    let _alone = crate::memory::MEASURING.lock();
    let key = crate::ProfileKey {
        model: "resnet18 width 4".into(),
        device: "cpu".into(),
        machine: "test".into(),
        precision: "f32".into(),
        optimizer: "sgd".into(),
        threads: 1,
        batches: vec![2, 4],
        kiln: "test".into(),
        gradient_checkpointing: false,
    };
    let device = key.training_device(&Device::flex());
    let model = model(&device);
    let images = kiln_core::with_seed(&device, 1, || {
        Tensor::<4>::random([4, 3, 16, 16], Distribution::Normal(0.0, 1.0), &device)
    });
    let labels = Tensor::<1, Int>::from_ints([0, 1, 2, 3], &device);
    let batch = kiln_data::ImageBatch {
        images,
        labels,
        indices: (0..4).collect(),
    };
    let sgd = || burn::optim::SgdConfig::new().init();
    let models = (&model, &kiln_train::Classification);
    let profile = crate::profile_model(key.clone(), models, &batch, &device, sgd(), 1).unwrap();
    assert_eq!(profile.key, key);
    let sizes: Vec<usize> = profile.batches.iter().map(|b| b.batch).collect();
    assert_eq!(sizes, [2, 4]);
    assert!(profile.update_seconds_per_byte > 0.0);
    let short = kiln_data::Batch::slice(&batch, 0..3);
    let err = crate::profile_model(key, models, &short, &device, sgd(), 1).unwrap_err();
    assert!(err.to_string().contains("a batch of 3 samples"), "{err}");
}
