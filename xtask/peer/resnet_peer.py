"""PyTorch peer of kiln's training benchmark: the same step in the framework users know.

ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max-pool) and a base width, SGD with
momentum 0.9, synthetic CIFAR-shaped batches of 32 per replica, DistributedDataParallel over
gloo for several replicas. Each rank computes with `--threads` threads (torch.set_num_threads),
as kiln's replicas do with their own pools. Prints one JSON line:
{"images_per_sec": <all replicas>, "median_step_s": ..., "torch": <version>}.

Run: python3 resnet_peer.py --width 16 --replicas 2 --threads 1
Needs `pip install torch` (CPU is enough); `cargo xtask bench --only peer` runs it.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

# The CPU wheel may come without NumPy, which this script does not use.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def make_model(torch, width, classes=10):
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            skip = x if self.down is None else self.down(x)
            return torch.relu(out + skip)

    layers = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for stage, blocks in enumerate([2, 2, 2, 2]):
        cout = width * 2**stage
        for b in range(blocks):
            layers.append(Basic(cin, cout, 2 if (stage > 0 and b == 0) else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def free_port():
    """A TCP port the kernel has just handed out: a fixed or pid-derived one can clash."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_rank(rank, args, port, results):
    """One rank's process: trains, then leaves without running C++ static destructors.

    gloo's threads sometimes abort at interpreter exit ("terminate called without an active
    exception") after the rank finished and reported; `os._exit` skips that teardown, so a
    rank's exit code says whether it trained.
    """
    import traceback

    try:
        train(rank, args, port, results)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(rank, args, port, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    cuda = args.device == "cuda"
    # One GPU per rank, as kiln's one replica per device. `f32` turns TF32 off (f32 compared
    # with strict f32); `tf32` is PyTorch's default for convolutions (TF32 tensor cores), also
    # for matmuls; `bf16` is autocast to bfloat16 (f32 weights, as kiln's --amp bf16).
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        tf32 = args.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    autocast = args.precision == "bf16"
    process_start = time.perf_counter()
    model = make_model(torch, args.width).to(device)
    if args.replicas > 1:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=args.replicas,
        )
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if cuda else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch, 3, 32, 32, generator=generator).to(device)
    labels = torch.randint(0, 10, (args.batch,), generator=generator).to(device)

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    times = []
    for step in range(args.warmup + args.steps):
        synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        # The loss read every step, as kiln's trainer does (the step's one host sync).
        loss.item()
        synchronize()
        if step == 0:
            first_step = time.perf_counter() - process_start
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if args.replicas > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        peak = torch.cuda.max_memory_allocated(device) if cuda else None
        results.put((statistics.median(times), first_step, peak))


def profile(args):
    """torch.profiler's operator table of one training step (after warm-up steps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    model = make_model(torch, args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = torch.randn(args.batch, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu, or cuda: rank r on cuda:r, NCCL between ranks (the GPU bundle's peer)",
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "tf32", "bf16"],
        default="f32",
        help="on cuda: f32 (TF32 off), tf32 (PyTorch's default for convolutions), bf16 (autocast)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print torch.profiler's table of one step (one process) instead of timing",
    )
    args = parser.parse_args()
    if args.profile:
        return profile(args)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print(json.dumps({"error": "torch is not installed (pip install torch)"}))
        return 3
    port = free_port()
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    workers = [
        context.Process(target=run_rank, args=(rank, args, port, results))
        for rank in range(args.replicas)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if any(worker.exitcode != 0 for worker in workers) or results.empty():
        print(json.dumps({"error": "a PyTorch rank failed"}))
        return 1
    step, first_step, peak = results.get()
    print(
        json.dumps(
            {
                "images_per_sec": args.replicas * args.batch / step,
                "median_step_s": step,
                # From the training function's start (model built, data on the device) to
                # the first finished step: kernel selection and warm-up (cuDNN's heuristics).
                "first_step_s": first_step,
                "peak_memory_bytes": peak,
                "precision": args.precision,
                "torch": torch.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
