"""Prints the test executables of one package that a `cargo test --no-run` build produced.

CI runs some tests again under other conditions (kernels held to an instruction set, a CPU
emulated by qemu). Running the test command's own executables, rather than `cargo test -p`,
avoids a second build of every dependency: cargo unifies features over the packages it is
asked for, so `-p kiln-kernels` alone resolves another feature set and rebuilds Burn.

usage: cargo test --workspace --no-run --message-format=json \
         | python3 .ci/test_executables.py PACKAGE [TARGET]
"""

import json
import subprocess
import sys


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    package = sys.argv[1]
    target = sys.argv[2] if len(sys.argv) == 3 else None
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    ids = {p["id"] for p in metadata["packages"] if p["name"] == package}
    if not ids:
        print(f"no workspace package named {package}", file=sys.stderr)
        return 1
    found = []
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if message["package_id"] not in ids or not message["profile"]["test"]:
            continue
        if target is not None and message["target"]["name"] != target:
            continue
        found.append(message["executable"])
    if not found:
        print(f"the build produced no test executable of {package} {target or ''}", file=sys.stderr)
        return 1
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
