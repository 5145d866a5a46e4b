#!/usr/bin/env python3
"""kiln's GPT example in PyTorch, nanoGPT style: the PyTorch peer of `cargo xtask bench --only gpt`.

The same model (GPT-2's shape: learned positions, pre-norm causal attention and GELU MLP
blocks, final layer norm, head tied to the token embedding, weights normal(0, 0.02), biases
zero), the same data (the Jargon File that kiln ships, bytes as tokens, the first 95 % for
training, windows at random offsets), the same optimizer (AdamW with Burn's defaults:
betas 0.9/0.999, eps 1e-5; weight decay on the weight matrices only; warm-up then cosine to
a tenth) and batch. Attention is `F.scaled_dot_product_attention(is_causal=True)`, as
nanoGPT runs it. The windows are drawn by PyTorch's generator, so the batches are not
kiln's, only drawn the same way: the loss curves are compared, not bit for bit.

Prints one JSON line: tokens/s (median step over the steps after warm-up), the loss of every
step, and the held-out loss at the end.
"""

import argparse
import gzip
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CORPUS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "datasets", "kiln-data", "corpora", "jargon-4.4.7.txt.gz",
)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm_attention = nn.LayerNorm(width, eps=1e-5)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width, eps=1e-5)
        self.expand = nn.Linear(width, 4 * width)
        self.contract = nn.Linear(4 * width, width)

    def forward(self, x):
        batch, time_, width = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).split(width, dim=2)
        shape = (batch, time_, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, time_, width))
        return x + self.contract(F.gelu(self.expand(self.norm_mlp(x))))


class Gpt(nn.Module):
    def __init__(self, vocabulary, context, layers, heads, width):
        super().__init__()
        self.token = nn.Embedding(vocabulary, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, eps=1e-5)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.token.weight.t()  # the tied head

    def parameter_count(self):
        return sum(p.numel() for p in self.parameters())


def windows(data, context, batch, generator):
    starts = torch.randint(0, len(data) - context, (batch,), generator=generator)
    tokens = torch.stack([data[s : s + context] for s in starts.tolist()])
    targets = torch.stack([data[s + 1 : s + 1 + context] for s in starts.tolist()])
    return tokens, targets


def learning_rate(step, steps, peak):
    """kiln's LrSchedule::constant(peak).warmup(min(50, steps/4)).cosine(steps, peak/10)."""
    warmup = min(50, steps // 4)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    floor = peak / 10
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def held_out_loss(model, data, context):
    """The mean loss over the held-out text cut end to end into windows, as kiln's is."""
    count = (len(data) - 1) // context
    losses = []
    with torch.no_grad():
        for first in range(0, count, 64):
            rows = range(first, min(first + 64, count))
            tokens = torch.stack([data[r * context : (r + 1) * context] for r in rows])
            targets = torch.stack([data[r * context + 1 : (r + 1) * context + 1] for r in rows])
            logits = model(tokens)
            losses.append((F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item(), len(rows)))
    return sum(l * n for l, n in losses) / sum(n for _, n in losses)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the speed")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    corpus = torch.frombuffer(bytearray(gzip.open(CORPUS).read()), dtype=torch.uint8).long()
    cut = round(len(corpus) * 0.95)
    train, held_out = corpus[:cut], corpus[cut:]
    model = Gpt(256, args.context, args.layers, args.heads, args.width)
    # Weight decay on the weight matrices only (kiln_gpt::adamw): not biases, norms, embeddings.
    decayed = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2
               and not n.startswith(("token.", "position."))]
    others = [p for p in model.parameters() if all(p is not d for d in decayed)]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": args.weight_decay},
         {"params": others, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.999), eps=1e-5,
    )
    generator = torch.Generator().manual_seed(args.seed)
    losses, seconds = [], []
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        started = time.perf_counter()
        tokens, targets = windows(train, args.context, args.batch, generator)
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # a host read per step, as kiln's loss read
        seconds.append(time.perf_counter() - started)
    measured = seconds[args.warmup :] or seconds
    step_seconds = statistics.median(measured)
    print(json.dumps({
        "torch": torch.__version__,
        "threads": args.threads,
        "parameters": model.parameter_count(),
        "tokens_per_sec": args.batch * args.context / step_seconds,
        "median_step_seconds": step_seconds,
        "losses": losses,
        "held_out_loss": held_out_loss(model, held_out, args.context),
    }))


if __name__ == "__main__":
    main()
