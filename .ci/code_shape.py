#!/usr/bin/env python3
"""The code's shape, as docs/architecture.md promises it: no Rust file over 500 lines and no
function over 120 (from its `fn` line to its closing brace), so every piece stays readable
in one sitting. Test files are held to the same limits."""

import re
import subprocess
import sys

MAX_FILE, MAX_FN = 500, 120


def functions(lines):
    """(name, first line, length) of every fn whose body is a brace block."""
    found = []
    for i, line in enumerate(lines):
        match = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+|async\s+|unsafe\s+|extern\s+\"C\"\s+)*fn\s+(\w+)", line)
        if not match:
            continue
        indent = len(line) - len(line.lstrip())
        # The body ends at the first line, at this indentation, that closes it.
        for j in range(i, len(lines)):
            text = lines[j]
            if j > i and text.strip() and len(text) - len(text.lstrip()) == indent and text.strip().startswith("}"):
                found.append((match.group(1), i + 1, j - i + 1))
                break
            if j == i and (text.rstrip().endswith(";") or text.rstrip().endswith("}")):
                break  # a declaration, or a one-line body
    return found


def main():
    files = subprocess.run(["git", "ls-files", "*.rs"], capture_output=True, text=True, check=True).stdout.split()
    problems = []
    for path in files:
        lines = open(path, encoding="utf-8").read().splitlines()
        if len(lines) > MAX_FILE:
            problems.append(f"{path}: {len(lines)} lines (at most {MAX_FILE})")
        for name, start, length in functions(lines):
            if length > MAX_FN:
                problems.append(f"{path}:{start}: fn {name} is {length} lines (at most {MAX_FN})")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{len(files)} Rust files within {MAX_FILE} lines, every function within {MAX_FN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
