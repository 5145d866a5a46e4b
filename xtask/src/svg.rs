//! The charts of the benchmark suite: kiln-train's line charts.

pub use kiln::train::plot::{Series, line_chart};
