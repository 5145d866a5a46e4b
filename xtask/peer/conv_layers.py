"""Each of ResNet-18's convolutions (CIFAR stem, batch 32) timed alone in PyTorch on one
thread: forward, input gradient and weight gradient, the peer of `cargo xtask bench --only
kernels` (same shapes, same order, fastest of 15 runs after a warm-up; `PEER_REPEAT` sets the
count). The last line is the totals as JSON, for the bench.

    python3 xtask/peer/conv_layers.py [--width 16] [--threads 1]
"""

import argparse
import json
import time

import torch


def resnet18_convolutions(w):
    return [
        (3, w, 32, 3, 1, 1),
        (w, w, 32, 3, 1, 4),
        (w, 2 * w, 32, 3, 2, 1),
        (2 * w, 2 * w, 16, 3, 1, 3),
        (w, 2 * w, 32, 1, 2, 1),
        (2 * w, 4 * w, 16, 3, 2, 1),
        (4 * w, 4 * w, 8, 3, 1, 3),
        (2 * w, 4 * w, 16, 1, 2, 1),
        (4 * w, 8 * w, 8, 3, 2, 1),
        (8 * w, 8 * w, 4, 3, 1, 3),
        (4 * w, 8 * w, 8, 1, 2, 1),
    ]


def fastest_ms(f):
    f()
    best = float("inf")
    for _ in range(int(__import__("os").environ.get("PEER_REPEAT", "15"))):
        start = time.perf_counter()
        f()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    totals = [0.0, 0.0, 0.0]
    for cin, cout, size, k, stride, count in resnet18_convolutions(args.width):
        pad = k // 2
        x = torch.randn(args.batch, cin, size, size)
        weight = torch.randn(cout, cin, k, k)
        out = torch.nn.functional.conv2d(x, weight, None, stride, pad)
        grad = torch.randn_like(out)

        def halves(mask):
            return lambda: torch.ops.aten.convolution_backward(
                grad, x, weight, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask
            )

        with torch.no_grad():
            f = fastest_ms(lambda: torch.nn.functional.conv2d(x, weight, None, stride, pad))
            i = 0.0 if cin == 3 else fastest_ms(halves([True, False, False]))
            wg = fastest_ms(halves([False, True, False]))
        print(
            f"{cin:>4}->{cout:<4} {size:>2}x{size:<2} k{k} s{stride} x{count}: "
            f"forward {f:7.2f} input grad {i:7.2f} weight grad {wg:7.2f} ms"
        )
        for n, t in enumerate([f, i, wg]):
            totals[n] += t * count
    f, i, wg = totals
    print(
        f"width {args.width}, all layers: forward {f:.1f} input grad {i:.1f} "
        f"weight grad {wg:.1f} ms, sum {f + i + wg:.1f} ms"
    )
    print(json.dumps({"forward_ms": f, "input_gradient_ms": i, "weight_gradient_ms": wg,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
