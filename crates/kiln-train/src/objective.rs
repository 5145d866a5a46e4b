//! What a model is trained to do: the loss of its output against a batch's targets.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Int, Tensor};
use kiln_amp::FloatCast;
use kiln_data::{Batch, ImageBatch};

/// The training objective: how a batch feeds the model, and how the model's output is
/// scored against the batch's targets.
///
/// Every step of kiln (one device, data parallel, every pipeline schedule) computes the
/// gradient of [`loss`](Self::loss) and reports its value and [`correct`](Self::correct)
/// (summed over micro-batches and replicas weighted by sample count, so the step's loss is
/// the mean over all its samples). [`Classification`] (cross-entropy over
/// [`ImageBatch`]es) is the default everywhere; supply your own for any other model:
/// give it to [`Trainer::with_objective`](crate::Trainer::with_objective),
/// [`LocalStep::with_objective`](crate::LocalStep::with_objective),
/// `kiln_ddp::Replica::overlapped_step_with` or `kiln_pipeline::Pipeline::with_objective`.
///
/// **Mixed precision is the step's job, not the objective's**: the step casts what
/// [`input`](Self::input) returns to the working precision and widens the model's output
/// to f32 before it calls [`loss`](Self::loss) ([`FloatCast`]: float tensors cast, int
/// and bool tensors kept), so an objective written for f32 runs unchanged under f16/bf16.
///
/// A regression model trained on its own batches with a mean squared error, in a few lines:
///
/// ```
/// use burn::module::Module;
/// use burn::nn::loss::{MseLoss, Reduction};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::SgdConfig;
/// use burn::tensor::{Device, Tensor};
/// use kiln_core::Forward;
/// use kiln_data::{Batch, BatchList};
/// use kiln_train::{LrSchedule, Objective, Trainer};
///
/// #[derive(Module, Debug)]
/// struct Regressor {
///     fc: Linear,
/// }
///
/// impl Forward for Regressor {
///     type Input = Tensor<2>;
///     type Output = Tensor<2>;
///     fn forward(&self, x: Tensor<2>) -> Tensor<2> {
///         self.fc.forward(x)
///     }
/// }
///
/// /// Features and float targets.
/// #[derive(Debug, Clone)]
/// struct Pairs {
///     x: Tensor<2>,
///     y: Tensor<2>,
/// }
///
/// impl Batch for Pairs {
///     fn samples(&self) -> usize {
///         self.x.dims()[0]
///     }
///     fn slice(&self, range: std::ops::Range<usize>) -> Self {
///         Pairs { x: self.x.clone().slice([range.clone()]), y: self.y.clone().slice([range]) }
///     }
/// }
///
/// #[derive(Debug, Clone)]
/// struct Mse;
///
/// impl Objective for Mse {
///     type Batch = Pairs;
///     type Input = Tensor<2>;
///     type Output = Tensor<2>;
///     fn input(&self, batch: &Pairs) -> Tensor<2> {
///         batch.x.clone()
///     }
///     fn loss(&self, output: &Tensor<2>, batch: &Pairs) -> Tensor<1> {
///         MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean)
///     }
/// }
///
/// let device = Device::flex().autodiff();
/// let model = kiln_core::init_module(&device, 1, || Regressor { fc: LinearConfig::new(3, 1).init(&device) });
/// let x = Tensor::<2>::random([16, 3], burn::tensor::Distribution::Default, &device);
/// let y = x.clone().sum_dim(1); // learn the sum of the features
/// let batches = BatchList::new(vec![Pairs { x, y }]).on_device(device);
/// let (_model, report) = Trainer::with_objective(model, SgdConfig::new().init(), Mse)
///     .schedule(LrSchedule::constant(0.1))
///     .train_loader(batches)
///     .max_steps(20)
///     .progress(false)
///     .log_epochs(false)
///     .build()
///     .unwrap()
///     .fit()
///     .unwrap();
/// let losses = report.losses();
/// assert!(losses[19] < losses[0], "the loss falls: {losses:?}");
/// ```
pub trait Objective: Clone + Send + Sync + 'static {
    /// The batches it reads (inputs and targets).
    type Batch: Batch;
    /// The model's input (cloned where a step replays a forward).
    type Input: FloatCast + Clone;
    /// The model's output.
    type Output: FloatCast;

    /// The model's input for `batch` (in f32: the step casts it).
    fn input(&self, batch: &Self::Batch) -> Self::Input;

    /// The mean loss over `batch`'s samples of the model's `output` (in f32), as a
    /// one-element f32 tensor (shape `[1]`, as Burn's losses with a mean reduction give;
    /// [`objective_loss`] checks it); its gradient is what the step descends.
    fn loss(&self, output: &Self::Output, batch: &Self::Batch) -> Tensor<1>;

    /// Samples of `batch` the `output` gets right, for the accuracy the reports show
    /// (called on the output the loss saw; no gradient flows through it). The default, for
    /// objectives without such a metric, counts none.
    fn correct(&self, output: &Self::Output, batch: &Self::Batch) -> usize {
        let _ = (output, batch);
        0
    }

    /// How the run's printed lines name its samples and whether they show accuracy. The
    /// default: "samples", no accuracy (as the default [`correct`](Self::correct) counts
    /// none); an objective that counts correct samples says so here.
    fn reporting(&self) -> Reporting {
        Reporting {
            sample: "samples",
            accuracy: false,
        }
    }
}

/// How a run's printed lines (the progress bar, each epoch's line, the last line) name what
/// an [`Objective`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reporting {
    /// A sample's short name in rates: `"img"` prints "img/s".
    pub sample: &'static str,
    /// Whether the lines show accuracy ([`Objective::correct`] counts something).
    pub accuracy: bool,
}

impl Reporting {
    /// Image classification's: "img", with accuracy.
    pub const IMAGES: Reporting = Reporting {
        sample: "img",
        accuracy: true,
    };
}

/// `objective`'s loss of `output` against `batch`, checked to be what every step needs: the
/// mean over the batch's samples, one element. (Every kiln step scores through it.)
///
/// # Panics
/// If the loss has another shape: a per-sample loss would be summed by backward, not
/// averaged, and silently scale the gradient by the batch size.
pub fn objective_loss<O: Objective>(
    objective: &O,
    output: &O::Output,
    batch: &O::Batch,
) -> Tensor<1> {
    let loss = objective.loss(output, batch);
    assert_eq!(
        loss.dims(),
        [1],
        "the objective's loss must be the mean over the batch's samples, one element (shape [1]); it gave shape {:?}",
        loss.dims()
    );
    loss
}

/// Image classification: cross-entropy of the logits against [`ImageBatch`] labels, and
/// the correctly classified images; the objective of every step unless another is given.
///
/// For an [`ImageClassifier`](kiln_core::ImageClassifier) (whose
/// [`Forward`](kiln_core::Forward) is its logits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classification;

impl Objective for Classification {
    type Batch = ImageBatch;
    type Input = Tensor<4>;
    type Output = Tensor<2>;

    fn input(&self, batch: &ImageBatch) -> Tensor<4> {
        batch.images.clone()
    }

    fn loss(&self, logits: &Tensor<2>, batch: &ImageBatch) -> Tensor<1> {
        classification_loss(logits.clone(), batch.labels.clone())
    }

    fn correct(&self, logits: &Tensor<2>, batch: &ImageBatch) -> usize {
        count_correct(logits.clone().detach(), batch.labels.clone())
    }

    fn reporting(&self) -> Reporting {
        Reporting::IMAGES
    }
}

/// Mean cross-entropy of `logits` against `labels`.
pub fn classification_loss(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

/// Number of correct predictions among `logits` for `labels`.
pub fn count_correct(logits: Tensor<2>, labels: Tensor<1, Int>) -> usize {
    let [batch, _] = logits.dims();
    let predicted = logits.argmax(1).reshape([batch]);
    predicted.equal(labels).int().sum().into_scalar::<i64>() as usize
}
