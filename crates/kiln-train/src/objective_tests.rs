//! A model that is not an image classifier trains through the trainer for its own objective
//! exactly like single-device f32 training written out by hand: one batch per step is
//! bit-identical, two accumulated micro-batches per step within 1e-5 of the change per tensor
//! (another summation order); a different loss, or a micro-batch left out, misses by far.

use burn::tensor::{DType, Device};
use kiln_amp::{MixedPrecision, Precision, module_dtypes};

use crate::testing::{
    Mse, RegressionNet, Rows, by_path, reference, regression_batches, sgd, source,
};
use crate::{LocalStep, LrSchedule, TrainError, TrainReport, Trainer};
use kiln_data::Batch;
use kiln_test_support::change_error;

const SEED: u64 = 3;
const STEPS: usize = 6;
const LR: f64 = 0.05;
/// The same samples' gradients, summed in the same order or in an order that rounds alike.
const TOLERANCE: f32 = kiln_test_support::tolerance::SAME_ORDER;

/// Trains the regression network with `step` on `batches`, `accumulation` per step.
fn train(
    step: LocalStep<Mse>,
    batches: Vec<Rows>,
    accumulation: usize,
) -> (RegressionNet, TrainReport) {
    let device = Device::flex().autodiff();
    Trainer::with_objective(RegressionNet::new(&device, SEED), sgd(), Mse::default())
        .gradient_step(step)
        .schedule(LrSchedule::constant(LR))
        .train_loader(source(batches, &device))
        .accumulation_steps(accumulation)
        .max_steps(STEPS)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit()
        .unwrap()
}

fn halves(batches: &[Rows]) -> Vec<Rows> {
    batches
        .iter()
        .flat_map(|b| {
            let half = b.samples() / 2;
            [b.slice(0..half), b.slice(half..b.samples())]
        })
        .collect()
}

#[test]
fn a_regression_model_trains_bit_for_bit_like_the_hand_written_reference() {
    let device = Device::flex().autodiff();
    let batches = regression_batches(2, 16, &device);
    let start = by_path(&RegressionNet::new(&device, SEED));
    let want = reference(SEED, &batches, STEPS, LR);
    let (model, report) = train(
        LocalStep::with_objective(Mse::default()),
        batches.clone(),
        1,
    );
    let got = by_path(&model);
    assert_eq!(got, want, "one batch per step: the same arithmetic");
    assert!(report.losses().iter().all(|l| l.is_finite()));
    assert!(report.losses()[STEPS - 1] < report.losses()[0], "it learns");
    // The control: the same run for a different loss (× 1.01) fails the comparison.
    let (other, _) = train(LocalStep::with_objective(Mse { scale: 1.01 }), batches, 1);
    let error = change_error(&start, &want, &by_path(&other));
    println!("trainer, loss x 1.01 (control): {error:e}");
    assert!(error > TOLERANCE, "the control passed: {error:e}");
}

#[test]
fn accumulated_micro_batches_train_like_the_whole_batch() {
    let device = Device::flex().autodiff();
    let batches = regression_batches(2, 16, &device);
    let start = by_path(&RegressionNet::new(&device, SEED));
    let want = reference(SEED, &batches, STEPS, LR);
    let (model, _) = train(
        LocalStep::with_objective(Mse::default()),
        halves(&batches),
        2,
    );
    let error = change_error(&start, &want, &by_path(&model));
    println!("trainer, 2 accumulated micro-batches: {error:e}");
    assert!(error <= TOLERANCE, "relative error of the change {error:e}");
    // The control: one micro-batch of each step dropped (only the first halves train).
    let first_halves: Vec<Rows> = halves(&batches).into_iter().step_by(2).collect();
    let (dropped, _) = train(LocalStep::with_objective(Mse::default()), first_halves, 1);
    let error = change_error(&start, &want, &by_path(&dropped));
    println!("trainer, a micro-batch dropped (control): {error:e}");
    assert!(error > TOLERANCE, "the control passed: {error:e}");
}

#[test]
fn the_objective_trains_in_bf16_with_f32_masters_and_validates() {
    let device = Device::flex().autodiff();
    let batches = regression_batches(2, 16, &device);
    let step = LocalStep::with_objective(Mse::default())
        .with_precision(MixedPrecision::new(Precision::Bf16));
    let (model, report) = train(step, batches.clone(), 1);
    assert!(module_dtypes(&model).iter().all(|d| *d == DType::F32));
    let (_, f32_report) = train(LocalStep::with_objective(Mse::default()), batches, 1);
    // bf16 keeps 8 bits of mantissa: the first loss (same weights, same batch) within 5 %.
    let (half, full) = (report.losses()[0], f32_report.losses()[0]);
    assert!(
        (half - full).abs() <= 0.05 * full,
        "bf16 {half} vs f32 {full}"
    );

    // Validation for the objective, on an inference device.
    let valid = source(regression_batches(1, 8, &Device::flex()), &Device::flex());
    let (_, report) =
        Trainer::with_objective(RegressionNet::new(&device, SEED), sgd(), Mse::default())
            .train_loader(source(regression_batches(2, 16, &device), &device))
            .valid_loader(valid)
            .epochs(1)
            .progress(false)
            .log_epochs(false)
            .build()
            .unwrap()
            .fit()
            .unwrap();
    let epoch = &report.epochs[0];
    assert!(epoch.valid_loss.is_some_and(f32::is_finite), "{epoch:?}");
}

#[test]
fn batches_on_a_plain_device_are_refused_with_the_reason() {
    let device = Device::flex().autodiff();
    let plain = Device::flex();
    let result = Trainer::with_objective(RegressionNet::new(&device, SEED), sgd(), Mse::default())
        .train_loader(source(regression_batches(1, 4, &plain), &plain))
        .build();
    assert!(matches!(result, Err(TrainError::Config(msg)) if msg.contains("autodiff")));
}

/// Per-sample losses where the mean belongs.
#[derive(Debug, Clone, Copy)]
struct PerSample;

impl crate::Objective for PerSample {
    type Batch = Rows;
    type Input = burn::tensor::Tensor<2>;
    type Output = burn::tensor::Tensor<2>;

    fn input(&self, batch: &Rows) -> burn::tensor::Tensor<2> {
        batch.features.clone()
    }

    fn loss(&self, output: &burn::tensor::Tensor<2>, batch: &Rows) -> burn::tensor::Tensor<1> {
        (output.clone() - batch.targets.clone())
            .powi_scalar(2)
            .flatten(0, 1)
    }
}

#[test]
#[should_panic(expected = "the objective's loss must be the mean over the batch's samples")]
fn a_loss_that_is_not_a_mean_is_refused_with_the_reason() {
    let device = Device::flex().autodiff();
    let _ = Trainer::with_objective(RegressionNet::new(&device, SEED), sgd(), PerSample)
        .train_loader(source(regression_batches(1, 4, &device), &device))
        .max_steps(1)
        .progress(false)
        .log_epochs(false)
        .build()
        .unwrap()
        .fit();
}
