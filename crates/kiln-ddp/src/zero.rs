//! ZeRO stage 1: optimizer state sharded over replicas.
//!
//! Each trainable parameter is owned by one replica (greedy by size, so shards are balanced;
//! parameters are never split, because Burn's optimizers update whole tensors). The flat
//! gradient buffer holds one equal-sized region per replica, padded, plus one element for the
//! sample count. A step reduce-scatters the buffer, so each replica receives only its region
//! already summed; the replica's optimizer updates only the parameters it owns (and so keeps
//! state only for them); then the regions of updated parameters are all-gathered.

use kiln_core::{FlatLayout, ParamInfo};

/// Which replica owns which parameter, and where everything lives in the buffers.
#[derive(Debug, Clone)]
pub(crate) struct ZeroPlan {
    /// Elements per region: the largest shard, plus one for the sample count.
    pub region: usize,
    /// Every trainable parameter at its offset in the `world × region` buffer.
    pub full: FlatLayout,
    /// This replica's parameters at their offsets within its region.
    pub owned: FlatLayout,
    /// Elements of this replica's parameters.
    pub owned_numel: usize,
    /// Elements of all trainable parameters.
    pub total_numel: usize,
}

impl ZeroPlan {
    /// Assigns `params` (the same list, in the same order, on every replica) to `world` owners.
    pub fn new(params: Vec<ParamInfo>, rank: usize, world: usize) -> Self {
        // Largest first onto the least-loaded replica; ties to the lower rank and the earlier
        // parameter keep the assignment identical on every replica.
        let mut order: Vec<usize> = (0..params.len()).collect();
        order.sort_by(|&a, &b| params[b].numel().cmp(&params[a].numel()).then(a.cmp(&b)));
        let mut loads = vec![0usize; world];
        let mut owner = vec![0usize; params.len()];
        for index in order {
            let (least, _) = loads
                .iter()
                .enumerate()
                .min_by_key(|&(r, &load)| (load, r))
                .expect("world > 0");
            owner[index] = least;
            loads[least] += params[index].numel();
        }
        let region = loads.iter().copied().max().unwrap_or(0) + 1;
        let mut cursor = vec![0usize; world];
        let mut full = Vec::with_capacity(params.len());
        let mut owned = Vec::new();
        for (index, info) in params.into_iter().enumerate() {
            let r = owner[index];
            let local = cursor[r];
            cursor[r] += info.numel();
            if r == rank {
                owned.push((info.clone(), local));
            }
            full.push((info, r * region + local));
        }
        Self {
            region,
            full: FlatLayout::with_offsets(full, world * region),
            owned: FlatLayout::with_offsets(owned, region),
            owned_numel: loads[rank],
            total_numel: loads.iter().sum(),
        }
    }

    /// The paths of this replica's parameters.
    pub fn owned_paths(&self) -> Vec<String> {
        self.owned
            .entries()
            .iter()
            .map(|entry| entry.info.path.clone())
            .collect()
    }

    /// Index of the sample-count slot of region `r`.
    pub fn count_slot(&self, r: usize) -> usize {
        (r + 1) * self.region - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ParamId;

    fn info(numel: usize) -> ParamInfo {
        ParamInfo {
            id: ParamId::new(),
            path: format!("p{numel}"),
            shape: vec![numel],
            trainable: true,
        }
    }

    #[test]
    fn every_parameter_has_one_owner_and_shards_are_balanced() {
        let params: Vec<ParamInfo> = [100, 10, 60, 50, 5, 5].into_iter().map(info).collect();
        let plans: Vec<ZeroPlan> = (0..2)
            .map(|r| ZeroPlan::new(params.clone(), r, 2))
            .collect();
        assert_eq!(plans[0].owned_numel + plans[1].owned_numel, 230);
        assert_eq!((plans[0].owned_numel, plans[1].owned_numel), (115, 115));
        assert_eq!(plans[0].region, 116);
        for p in &params {
            let owners = plans
                .iter()
                .filter(|plan| plan.owned.get(p.id).is_some())
                .count();
            assert_eq!(owners, 1, "{}", p.path);
        }
        // The full layout agrees with each owner's local layout.
        for (r, plan) in plans.iter().enumerate() {
            for entry in plan.owned.entries() {
                assert_eq!(
                    plans[0].full.get(entry.info.id).unwrap().offset,
                    r * plan.region + entry.offset
                );
            }
        }
    }
}
