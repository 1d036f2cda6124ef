"""Benchmark kllint against a bare LibCST parse of the same files.

    python scripts/bench.py PATH [PATH ...] [--runs 5] [--jobs N]

For each PATH: the median wall time of `kllint PATH` (a fresh process each
run, as a pre-commit hook would start it), its peak memory, and the median
time to `libcst.parse_module` every .py file under PATH in one process - the
floor any LibCST linter pays. Medians of several runs, side by side, because
shared machines are noisy.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import libcst


def time_kllint(path: Path, jobs: int | None) -> tuple[float, int]:
    command = [sys.executable, "-m", "kllint", str(path), "--format", "concise", "--exit-zero"]
    if jobs:
        command += ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    peak_kb = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    return elapsed, peak_kb


def time_parse(path: Path) -> tuple[float, int, int]:
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    lines = 0
    start = time.perf_counter()
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        lines += text.count("\n")
        try:
            libcst.parse_module(text)
        except libcst.ParserSyntaxError:
            pass
    return time.perf_counter() - start, len(files), lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    print(f"{'path':40} {'files':>6} {'lines':>8} {'kllint (median)':>16} {'peak RSS':>10} {'parse only':>11} {'ratio':>6}")
    for path in args.paths:
        if not path.exists():
            print(f"no such path: {path}", file=sys.stderr)
            return 2
        runs = [time_kllint(path, args.jobs) for _ in range(args.runs)]
        parses = [time_parse(path) for _ in range(max(1, args.runs // 2))]
        kllint_s = statistics.median(r[0] for r in runs)
        parse_s = statistics.median(p[0] for p in parses)
        _, files, lines = parses[0]
        peak_mb = max(r[1] for r in runs) / 1024
        print(
            f"{str(path)[-40:]:40} {files:>6} {lines:>8} {kllint_s:>14.2f} s {peak_mb:>7.0f} MB "
            f"{parse_s:>9.2f} s {kllint_s / parse_s:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
