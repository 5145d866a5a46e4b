//! The live progress bar.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over one epoch's steps showing loss, accuracy and throughput; hidden when disabled
/// (and by indicatif itself when stderr is not a terminal).
pub(crate) fn epoch_bar(enabled: bool, epoch: usize, steps: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(steps as u64),
        if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template(
            "epoch {prefix:>3} [{bar:30}] {pos}/{len} {msg} ({elapsed}<{eta})",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_prefix((epoch + 1).to_string());
    bar
}
