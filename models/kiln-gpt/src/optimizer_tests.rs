//! The GPT's AdamW decays the weight matrices only: with a zero gradient (Adam's update
//! zero) one step shrinks exactly the decayed parameters, by `lr × decay`.

use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor};
use kiln_core::{FlatLayout, Forward, init_module, param_infos, read_params};
use kiln_kernels::FusedAdamWConfig;

use crate::{GptConfig, adamw};

/// Every parameter's values, by path.
fn by_path<M: burn::module::Module>(model: &M) -> Vec<(String, Vec<f32>)> {
    let layout = FlatLayout::new(param_infos(model));
    let flat = read_params(model, &layout);
    layout
        .entries()
        .iter()
        .map(|e| {
            let range = e.offset..e.offset + e.info.numel();
            (e.info.path.clone(), flat[range].to_vec())
        })
        .collect()
}

#[test]
fn weight_decay_shrinks_the_matrices_and_spares_biases_norms_and_embeddings() {
    let device = Device::flex().autodiff();
    for tied in [true, false] {
        let config = GptConfig::new(32, 8, 2, 2, 16).with_tied(tied);
        let model = init_module(&device, 3, || config.init(&device));
        let before = by_path(&model);
        let tokens = Tensor::<2, Int>::zeros([1, 8], &device);
        // A loss whose gradient is zero everywhere: Adam's step is zero, the decay remains.
        let loss = model.forward(tokens).sum().mul_scalar(0.0);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let (lr, decay) = (0.5, 0.1);
        let mut optimizer = adamw(&FusedAdamWConfig::new().with_weight_decay(decay));
        let after = by_path(&optimizer.step(lr, model, grads));
        let mut decayed = Vec::new();
        for ((path, old), (_, new)) in before.iter().zip(&after) {
            let shrunk = old
                .iter()
                .zip(new)
                .all(|(o, n)| (n - o * (1.0 - lr as f32 * decay)).abs() <= 1e-6 * o.abs().max(1.0));
            let kept = old == new;
            assert!(
                shrunk != kept || old.iter().all(|v| *v == 0.0),
                "{path}: neither kept nor decayed"
            );
            if shrunk && !kept {
                decayed.push(path.clone());
            }
        }
        let expected_not: Vec<&str> = vec!["token.weight", "position.weight", "norm.gamma"];
        for path in &expected_not {
            assert!(!decayed.iter().any(|p| p == path), "{path} was decayed");
        }
        assert!(
            decayed
                .iter()
                .all(|p| p.ends_with(".weight") && !p.contains("norm")),
            "{decayed:?}"
        );
        // Every block's six matrices (query, key, value, output, expand, contract), and an
        // untied head.
        assert_eq!(decayed.len(), 2 * 6 + usize::from(!tied), "{decayed:?}");
    }
}
