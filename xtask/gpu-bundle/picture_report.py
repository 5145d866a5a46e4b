"""Reads the logs of `run.sh --picture` and writes results.json and summary.md.

Every figure comes from one run of the script on one machine: kiln's own lines (start-up,
median step, replicas, pipeline), PyTorch's peer JSON, GPU memory samples, the kernel profile.
A step that did not run, or whose figure is missing, is `null` in results.json and `—` in the
table, so that the table always has the same rows (the CPU dry run checks the shape).
"""

import argparse
import json
import os
import re
import sys

ROWS = [
    ("startup_first", "start-up, first run (s to first step)"),
    ("startup_second", "start-up, second run (s to first step)"),
    ("f32", "kiln default (TF32 tiles on CUDA) vs PyTorch TF32, img/s"),
    ("f32_strict", "kiln default vs PyTorch f32 (TF32 off), img/s"),
    ("bf16", "bf16 (kiln --amp bf16 vs PyTorch autocast), img/s"),
    ("shared", "2 replicas sharing the device, img/s (all)"),
    ("pipeline", "2-stage pipeline sharing the device, img/s"),
    ("pipeline_two", "2-stage pipeline on two GPUs (cuda:0,cuda:1), img/s"),
    ("cpu_1", "CPU, 1 replica x all cores, img/s"),
    ("cpu_2", "CPU, 2 replicas x half the cores, img/s"),
]


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def steps(out):
    table = {}
    for line in (read(os.path.join(out, "steps.tsv")) or "").splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            table[parts[0]] = {"status": parts[1], "seconds": parts[2]}
    return table


def kiln_run(out, name, batch):
    """Figures of one kiln data-parallel run: start-up, median step, images/s, peak memory."""
    log = read(os.path.join(out, f"{name}.log"))
    if log is None:
        return None
    run = {"images_per_sec": None, "median_step_ms": None, "startup_s": None}
    m = re.search(r"start-up: first step finished ([0-9.]+) s after the process started \| planner ([0-9.]+) s \| first step ([0-9.]+) s(?:, ([0-9.]+) s beyond a median step of ([0-9.]+) ms)?", log)
    if m:
        run["startup_s"] = float(m.group(1))
        run["planner_s"] = float(m.group(2))
        run["first_step_s"] = float(m.group(3))
        if m.group(5):
            run["first_step_extra_s"] = float(m.group(4))
            run["median_step_ms"] = float(m.group(5))
    replicas = re.findall(r"^replica (\d+):", log, re.M)
    count = max(1, len(replicas))
    if run["median_step_ms"]:
        run["images_per_sec"] = count * batch / (run["median_step_ms"] / 1e3)
    m = re.search(r"sync \(([^)]*)\): ([0-9.]+) MB/step in (\d+) buckets, exposed ([0-9.]+)% of compute", log)
    if m:
        run["sync"] = {"transport": m.group(1), "mb_per_step": float(m.group(2)),
                       "buckets": int(m.group(3)), "exposed_percent": float(m.group(4))}
    elif "nothing to exchange" in log:
        run["sync"] = "nothing to exchange (one replica)"
    m = re.search(r"AMP (\w+): loss scale ([^,]+), (\d+) of (\d+) steps skipped", log)
    if m:
        run["amp"] = {"precision": m.group(1), "skipped": int(m.group(3)), "steps": int(m.group(4))}
    m = re.search(r"final val acc ([0-9.]+)%", log) or re.search(r"val acc ([0-9.]+)%", log)
    if m:
        run["valid_accuracy_percent"] = float(m.group(1))
    m = re.search(r"final parameters fingerprint: ([0-9a-f]+)", log)
    if m:
        run["fingerprint"] = m.group(1)
    run["peak_memory_mib"] = peak_memory(out, name)
    return run


def pipeline_run(out, name, batch):
    log = read(os.path.join(out, f"{name}.log"))
    if log is None:
        return None
    m = re.search(r"\| step ([0-9.]+) ms \| ([0-9.]+) (?:img|samples)/s", log)
    run = {"images_per_sec": float(m.group(2)) if m else None,
           "mean_step_ms": float(m.group(1)) if m else None}
    m = re.search(r"bubble: measured ([0-9.]+)%", log)
    if m:
        run["bubble_percent"] = float(m.group(1))
    run["peak_memory_mib"] = peak_memory(out, name)
    return run


def peak_memory(out, name):
    text = read(os.path.join(out, f"{name}.mem"))
    values = [int(v) for v in (text or "").split() if v.isdigit()]
    return max(values) if values else None


def torch_run(out, name):
    log = read(os.path.join(out, f"{name}.log"))
    if not log:
        return None
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if "images_per_sec" in value:
                peak = value.get("peak_memory_bytes")
                value["peak_memory_mib"] = round(peak / 2**20) if peak else None
                return value
    return None


UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def kernel_families(out, top=15):
    """Kernel time by family, from the lines after kiln's steady-state mark."""
    text = read(os.path.join(out, "kernels.log"))
    if text is None:
        return None
    mark = text.find("kiln: steady state")
    if mark < 0:
        return {"error": "no steady-state mark in kernels.log"}
    families, total = {}, 0.0
    for line in text[mark:].splitlines():
        m = re.match(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.+)", line)
        if not m:
            continue
        seconds = float(m.group(1)) * UNITS[m.group(2)]
        name = m.group(3).strip()
        family = re.split(r"[<({\[: ]", name, maxsplit=1)[0] or name
        entry = families.setdefault(family, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
        total += seconds
    ranked = sorted(families.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "total_ms": total * 1e3,
        "launches": sum(v[1] for v in families.values()),
        "families": [
            {"family": k, "ms": v[0] * 1e3, "launches": v[1],
             "percent": 100 * v[0] / total if total else None}
            for k, v in ranked
        ],
    }


def self_test():
    """kernel_families on a profile in cubecl's format: the warm-up before kiln's mark is left
    out, durations in every unit Rust's Duration prints are summed by family."""
    import tempfile
    with tempfile.TemporaryDirectory() as out:
        with open(os.path.join(out, "kernels.log"), "w") as f:
            f.write("| 9s         | matmul_tune_candidate<f32>\n")
            f.write("kiln: steady state after 3 steps\n")
            f.write("| 1.5ms      | conv2d_implicit_gemm<f32, 3x3>\n")
            f.write("| 500µs      | conv2d_implicit_gemm<f32, 1x1>\n")
            f.write("| 250us      | reduce_sum(f32)\n")
            f.write("| 250000ns   | reduce_sum(f32)\n")
            f.write("| not measured | copy_kernel\n")
        got = kernel_families(out)
    families = {f["family"]: f for f in got["families"]}
    assert abs(got["total_ms"] - 2.5) < 1e-9, got
    assert set(families) == {"conv2d_implicit_gemm", "reduce_sum"}, families
    assert families["conv2d_implicit_gemm"]["launches"] == 2, families
    assert abs(families["reduce_sum"]["percent"] - 20.0) < 1e-9, families
    print("picture_report self-test: ok")
    return 0


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--kind", default="cuda")
    parser.add_argument("--budget", type=int, default=0)
    parser.add_argument("--elapsed", type=int, default=0)
    args = parser.parse_args()
    out = args.out
    gpu_batch, cpu_batch = (16, 16) if args.kind == "cpu" else (128, 32)
    kiln = {
        "first": kiln_run(out, "first", gpu_batch),
        "second": kiln_run(out, "second", gpu_batch),
        "bf16": kiln_run(out, "bf16", gpu_batch),
        "shared": kiln_run(out, "shared", gpu_batch),
        "pipeline": pipeline_run(out, "pipeline", 2 * gpu_batch),
        "pipeline_two": pipeline_run(out, "pipeline-two", 2 * gpu_batch),
        "cpu_1": kiln_run(out, "cpu-1", cpu_batch),
        "cpu_2": kiln_run(out, "cpu-2", cpu_batch),
    }
    torch = {p: torch_run(out, f"torch-{p}") for p in ["tf32", "f32", "bf16", "cpu-1", "cpu-2"]}

    def ips(run):
        return run.get("images_per_sec") if run else None

    def startup(run):
        return run.get("startup_s") if run else None

    rows = {
        "startup_first": (startup(kiln["first"]), torch["tf32"] and torch["tf32"].get("first_step_s")),
        "startup_second": (startup(kiln["second"]), torch["tf32"] and torch["tf32"].get("first_step_s")),
        "f32": (ips(kiln["second"]), ips(torch["tf32"])),
        "f32_strict": (ips(kiln["second"]), ips(torch["f32"])),
        "bf16": (ips(kiln["bf16"]), ips(torch["bf16"])),
        "shared": (ips(kiln["shared"]), None),
        "pipeline": (ips(kiln["pipeline"]), None),
        "pipeline_two": (ips(kiln["pipeline_two"]), None),
        "cpu_1": (ips(kiln["cpu_1"]), ips(torch["cpu-1"])),
        "cpu_2": (ips(kiln["cpu_2"]), ips(torch["cpu-2"])),
    }
    results = {
        "machine": (read(os.path.join(out, "machine.txt")) or "").strip().splitlines(),
        "kind": args.kind,
        "budget_s": args.budget,
        "elapsed_s": args.elapsed,
        "steps": steps(out),
        "kiln": kiln,
        "pytorch": torch,
        "rows": {key: {"kiln": k, "pytorch": p, "ratio": ratio(k, p)} for key, (k, p) in rows.items()},
        "kernels": kernel_families(out),
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    def cell(value, digits=1):
        return "—" if value is None else f"{value:,.{digits}f}"

    lines = [f"# kiln GPU picture ({args.kind}, {args.elapsed} s of a {args.budget} s budget)", ""]
    lines += [f"- {m}" for m in results["machine"]]
    lines += ["", "| row | kiln | PyTorch | kiln ÷ PyTorch |", "|---|---|---|---|"]
    for key, title in ROWS:
        row = results["rows"][key]
        digits = 2 if key.startswith("startup") else 1
        lines.append(f"| {title} | {cell(row['kiln'], digits)} | {cell(row['pytorch'], digits)} | {cell(row['ratio'], 2)} |")
    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {k} | {v['status']} | {v['seconds']} |" for k, v in results["steps"].items()]
    extras = []
    for name in ["first", "second", "bf16", "shared"]:
        run = kiln[name]
        if run:
            extras.append(f"- kiln {name}: peak {cell(run.get('peak_memory_mib'), 0)} MiB, sync {run.get('sync')}, "
                          f"first step {cell(run.get('first_step_s'))} s, median step {cell(run.get('median_step_ms'))} ms")
    for name, run in torch.items():
        if run:
            extras.append(f"- PyTorch {name}: peak {cell(run.get('peak_memory_mib'), 0)} MiB, first step {cell(run.get('first_step_s'))} s")
    if extras:
        lines += [""] + extras
    kernels = results["kernels"]
    if kernels and "families" in kernels:
        lines += ["", f"Kernel families over the profiled steady-state steps ({cell(kernels['total_ms'])} ms, {kernels['launches']} launches):", "",
                  "| family | ms | launches | % |", "|---|---|---|---|"]
        lines += [f"| {f['family'][:60]} | {cell(f['ms'], 2)} | {f['launches']} | {cell(f['percent'])} |" for f in kernels["families"]]
    elif kernels:
        lines += ["", f"kernel profile: {kernels.get('error')}"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
