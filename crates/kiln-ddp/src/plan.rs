//! Which gradients travel together, and when they are ready.

use std::ops::Range;

use kiln_core::{FlatLayout, ParamInfo};

/// The gradient buffer of one replica, cut into buckets.
///
/// Parameters are laid out in the order backward produces their gradients: segments from
/// last to first, and within a segment parameters in reverse declaration order. Buckets are
/// contiguous runs of that buffer (a parameter is never split), so a bucket is complete as
/// soon as the segment holding its last parameter has finished backward.
#[derive(Debug, Clone)]
pub struct BucketPlan {
    layout: FlatLayout,
    /// End (in the buffer) of each backward group, in backward order.
    group_ends: Vec<usize>,
    buckets: Vec<Range<usize>>,
}

impl BucketPlan {
    /// Plans buckets over `groups` (each a segment's trainable parameters, in backward
    /// order), with the first bucket capped at `first_cap` bytes and the others at `cap` (f32
    /// gradients; a parameter larger than its cap gets a bucket of its own).
    pub fn new(groups: Vec<Vec<ParamInfo>>, first_cap: usize, cap: usize) -> Self {
        let mut group_ends = Vec::with_capacity(groups.len());
        let mut ordered = Vec::new();
        let mut end = 0;
        for group in groups {
            for info in group.into_iter().rev() {
                end += info.numel();
                ordered.push(info);
            }
            group_ends.push(end);
        }
        let layout = FlatLayout::new(ordered);
        let mut buckets = Vec::new();
        let mut start = 0;
        for entry in layout.entries() {
            // A real cap: the bucket closes before the parameter that would take it past the
            // cap; a parameter larger than the cap travels alone.
            let stop = entry.offset + entry.info.numel();
            let limit = if buckets.is_empty() { first_cap } else { cap };
            if entry.offset > start && (stop - start) * 4 > limit {
                buckets.push(start..entry.offset);
                start = entry.offset;
            }
        }
        if start < layout.len() || buckets.is_empty() {
            buckets.push(start..layout.len());
        }
        Self {
            layout,
            group_ends,
            buckets,
        }
    }

    /// Where each parameter's gradient lives.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// The buckets, in the order they become ready.
    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// Backward groups (segments, last first).
    pub fn groups(&self) -> usize {
        self.group_ends.len()
    }

    /// How many buckets are complete once backward group `group` (0 = the first to run)
    /// has finished.
    pub fn ready_after_group(&self, group: usize) -> usize {
        let filled = self.group_ends[group];
        self.buckets.iter().take_while(|b| b.end <= filled).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ParamId;

    fn info(numel: usize) -> ParamInfo {
        ParamInfo {
            id: ParamId::new(),
            path: String::new(),
            shape: vec![numel],
            trainable: true,
        }
    }

    #[test]
    fn buckets_are_contiguous_capped_and_ready_with_their_last_group() {
        // Three groups: sizes (in floats) [10, 10], [300], [5, 5, 5].
        let groups = vec![
            vec![info(10), info(10)],
            vec![info(300)],
            vec![info(5), info(5), info(5)],
        ];
        // Caps: 40 bytes (10 floats) for the first bucket, 100 bytes (25 floats) after it.
        let plan = BucketPlan::new(groups, 40, 100);
        assert_eq!(plan.buckets(), &[0..10, 10..20, 20..320, 320..335]);
        // Every bucket keeps to its cap, except one holding a single larger parameter.
        for (index, bucket) in plan.buckets().iter().enumerate() {
            let cap = if index == 0 { 10 } else { 25 };
            let single = plan
                .layout()
                .entries()
                .iter()
                .any(|e| e.offset == bucket.start && e.offset + e.info.numel() == bucket.end);
            assert!(bucket.len() <= cap || single, "bucket {index}: {bucket:?}");
        }
        assert_eq!(plan.ready_after_group(0), 2);
        assert_eq!(plan.ready_after_group(1), 3);
        assert_eq!(plan.ready_after_group(2), 4);
        // Reverse order inside a group: the last declared parameter comes first.
        let first = &plan.layout().entries()[0];
        assert_eq!((first.offset, first.info.numel()), (0, 10));
    }

    #[test]
    fn a_huge_cap_gives_one_bucket() {
        let plan = BucketPlan::new(vec![vec![info(3)], vec![info(4)]], 1 << 30, 1 << 30);
        assert_eq!(plan.buckets(), std::slice::from_ref(&(0..7)));
        assert_eq!(plan.ready_after_group(0), 0);
        assert_eq!(plan.ready_after_group(1), 1);
    }
}
