"""Where kllint's time goes on a tree: the analysis of every file the
prefilter keeps, in this process (no workers), under ``cProfile``.

    python scripts/profile_analysis.py DIR [DIR ...] [--top 25] [--save out.prof]

Prints the total, the share spent in LibCST's parser (and how many
characters it parsed), the share spent interpreting functions that reach no
loss, how many functions were inlined into the entries (a count, steadier
than a time for comparing two commits), the slowest files, and the
functions with the most cumulative time.
A profile to read, not a timed test: ``cProfile`` slows Python code (not the
parser) by about half.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
import warnings
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()

    import libcst

    from kllint.analysis import interpreter
    from kllint.analysis.project import Project
    from kllint.config import Settings
    from kllint.driver import check_source
    from kllint.prefilter import may_hold_kl_term

    parsed = {"calls": 0, "seconds": 0.0, "chars": 0}
    parse = libcst.parse_module

    def timed_parse(source: str, *rest: object, **options: object) -> libcst.Module:
        start = time.perf_counter()
        try:
            return parse(source, *rest, **options)  # type: ignore[arg-type]
        finally:
            parsed["calls"] += 1
            parsed["seconds"] += time.perf_counter() - start
            parsed["chars"] += len(source)

    libcst.parse_module = timed_parse  # type: ignore[assignment]

    entries = {"count": 0, "silent": 0, "seconds": 0.0, "silent_seconds": 0.0, "inlined": 0}
    run_function = interpreter.Interpreter.run_function

    def timed_run(self: interpreter.Interpreter, fn: object, *rest: object, **options: object):  # type: ignore[no-untyped-def]
        if self.depth:
            entries["inlined"] += 1
            return run_function(self, fn, *rest, **options)  # type: ignore[arg-type]
        before, start = len(self.context.sinks), time.perf_counter()
        try:
            return run_function(self, fn, *rest, **options)  # type: ignore[arg-type]
        finally:
            took = time.perf_counter() - start
            entries["count"] += 1
            entries["seconds"] += took
            if len(self.context.sinks) == before:
                entries["silent"] += 1
                entries["silent_seconds"] += took

    interpreter.Interpreter.run_function = timed_run  # type: ignore[method-assign]

    files = [path for root in args.dirs for path in sorted(root.rglob("*.py"))]
    texts = [(path, path.read_text(encoding="utf-8", errors="replace")) for path in files]
    kept = [(path, text) for path, text in texts if may_hold_kl_term(text)]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    gc.disable()  # as in a worker
    project = Project(args.dirs)
    roles = Settings().roles
    profile = cProfile.Profile()
    per_file: list[tuple[float, str]] = []
    findings = 0
    start = time.perf_counter()
    profile.enable()
    for path, text in kept:
        began = time.perf_counter()
        project.begin_file()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                findings += len(check_source(text, str(path), project, roles))
        except Exception as err:  # a file kllint reports as E998/E999
            print(f"{path}: {type(err).__name__}: {err}", file=sys.stderr)
        per_file.append((time.perf_counter() - began, str(path)))
    profile.disable()
    total = time.perf_counter() - start

    print(f"{len(files)} files, {len(kept)} kept, {findings} findings: {total:.2f} s (profiled)")
    share = 100 * parsed["seconds"] / total
    print(
        f"LibCST parse: {parsed['seconds']:.2f} s ({share:.0f}%), "
        f"{parsed['calls']} parses of {parsed['chars'] / 1e6:.2f} M characters"
    )
    print(
        f"entry functions: {entries['count']} interpreted in {entries['seconds']:.2f} s; "
        f"{entries['silent']} reach no loss, {entries['silent_seconds']:.2f} s; "
        f"{entries['inlined']} functions inlined into them"
    )
    print("slowest files:")
    for seconds, path in sorted(per_file, reverse=True)[:10]:
        print(f"  {seconds:7.3f} s  {path}")
    if args.save:
        profile.dump_stats(str(args.save))
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(r"kllint", args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
