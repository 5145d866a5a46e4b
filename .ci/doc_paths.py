#!/usr/bin/env python3
"""Every file path the docs name exists, and docs/architecture.md's crate graph is the
manifests' one: the newcomer's map must not point at moved files or missing edges.

Checks the backticked names in README.md and docs/*.md that look like paths: a name with a
slash (`crates/kiln-train/src/train_loop.rs`, `runtime/engine.rs`, `sgd/`) must be a path
under the repository, or end a path in it; a bare file name (`train_loop.rs`) must be some
file's name in the tree. Rust paths (`kiln_core::init_module`), URLs, options and globs are
not paths and are left alone.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
)
EXTENSIONS = (".rs", ".md", ".toml", ".py", ".sh", ".json", ".yml")
# Files a run or a user makes, named in the docs as what to expect, not as sources.
MADE_BY_RUNS = {
    "metrics.jsonl", "curves.svg", "results.json", "summary.md", "plan.json", "manifest.json",
    "model.bpk", "run.sh", "picture.sh", "cubecl.toml",
}
# Directories runs write into.
MADE_UNDER = ("runs/", "target/", "bench-results/", "results/", ".parts-step-")


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [line for line in out.stdout.splitlines() if line]
    dirs = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    return files, dirs


def looks_like_path(name):
    if "://" in name or name.startswith("-") or any(c in name for c in " *?<>{}|=$,()[]'\"") or "::" in name:
        return False
    if name.startswith(("~", "/", "$", "../")):
        return False
    return "/" in name or name.endswith(EXTENSIONS)


def manifest_edges():
    """kiln crate -> the kiln crates its [dependencies] name (not dev-dependencies)."""
    edges = {}
    for folder in ("crates", "models", "datasets"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            path = os.path.join(ROOT, folder, name, "Cargo.toml")
            if not os.path.exists(path):
                continue
            section, deps = None, set()
            for line in open(path, encoding="utf-8"):
                line = line.strip()
                if line.startswith("["):
                    section = line
                elif section == "[dependencies]":
                    match = re.match(r"(kiln-[a-z-]+)\b", line)
                    if match:
                        deps.add(match.group(1))
            edges[name] = deps
    return edges


def graph_mismatches():
    """The crate graph's lines (`├── kiln-x ──▶ kiln-y (why), …`) against the manifests."""
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    edges = manifest_edges()
    drawn = {}
    for line in text.splitlines():
        match = re.match(r"\s*[├└]── (kiln-[a-z-]+) ──▶ (.*)", line)
        if match:
            # The edges: crate names outside the parenthesised notes.
            targets = re.sub(r"\([^)]*\)", "", match.group(2))
            drawn[match.group(1)] = set(re.findall(r"kiln-[a-z-]+", targets))
    problems = []
    for crate, deps in sorted(edges.items()):
        if crate == "kiln-test-support":
            continue  # drawn apart: a dev-dependency
        if crate not in drawn:
            problems.append(f"docs/architecture.md: the crate graph lacks {crate}")
        elif drawn[crate] != deps:
            problems.append(
                f"docs/architecture.md: {crate} depends on {sorted(deps)} in its manifest, the graph draws {sorted(drawn[crate])}"
            )
    return problems


def main():
    files, dirs = tracked()
    names = {os.path.basename(f) for f in files}
    missing = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        for line_no, line in enumerate(text.splitlines(), 1):
            for name in re.findall(r"`([^`\n]+)`", line):
                name = name.strip()
                if not looks_like_path(name) or name in MADE_BY_RUNS or name.startswith(MADE_UNDER):
                    continue
                bare = name.rstrip("/")
                if "/" not in bare:
                    ok = bare in names or bare in {d.split("/")[-1] for d in dirs}
                else:
                    ok = any(f == bare or f.endswith("/" + bare) for f in files) or any(
                        d == bare or d.endswith("/" + bare) for d in dirs
                    )
                if not ok:
                    missing.append(f"{doc}:{line_no}: `{name}`")
    graph = graph_mismatches()
    if missing:
        print("the docs name paths that do not exist:")
        print("\n".join(missing))
    if graph:
        print("\n".join(graph))
    if missing or graph:
        return 1
    print(f"every path named in {len(DOCS)} docs exists; the crate graph is the manifests'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
