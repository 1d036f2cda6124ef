"""Benchmark kllint on real RL frameworks against a bare LibCST parse.

    python scripts/bench.py [--dir ~/.cache/kllint-bench] [--runs 3] [--jobs N]

Downloads trl 1.16.0, verl 0.9.1, OpenRLHF 0.11.2 and transformers 5.24.0
(``pip download --no-deps``, wheels unpacked into ``--dir``, outside the
repository; OpenRLHF's package sits in the wheel's ``.data/purelib``) and
prints, for the three RL frameworks together and for transformers, the files
and the files the prefilter keeps for analysis, then:

- kllint cold: a fresh process and an empty cache, as CI's first run;
- kllint warm: the same command again, every result from the cache;
- the floor: ``libcst.parse_module`` of every file in a pool of 2 processes,
  what any LibCST linter pays.

Each run measures the three back to back (paired: shared machines are
noisy), and the table shows medians over runs, the ratios to the parse, and
the peak memory of each (``wait4``'s ``ru_maxrss``: the largest resident set
among the process and the workers it waited for). kllint's own modules are
compiled to bytecode once before timing, as in an installed package, even
where ``PYTHONDONTWRITEBYTECODE`` is set. This is a benchmark to read, not a
timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

RELEASES = {
    "trl": ("trl==1.16.0", "trl"),
    "verl": ("verl==0.9.1", "verl"),
    "openrlhf": ("openrlhf==0.11.2", "openrlhf"),
    "transformers": ("transformers==5.24.0", "transformers"),
}
GROUPS = {
    "RL frameworks (trl+verl+openrlhf)": ["trl", "verl", "openrlhf"],
    "transformers": ["transformers"],
}


def fetch(directory: Path) -> dict[str, Path]:
    """The package folder of each release, downloaded and unpacked once."""
    directory.mkdir(parents=True, exist_ok=True)
    folders = {}
    for name, (requirement, package) in RELEASES.items():
        unpacked = directory / requirement.replace("==", "-")
        if not unpacked.is_dir():
            wheels = directory / "wheels"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "-q",
                    "-d",
                    str(wheels),
                    requirement,
                ],
                check=True,
            )
            version = requirement.split("==")[1]
            [wheel] = [
                w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{name}-{version}-")
            ]
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
        # The shallowest package folder: ``openrlhf-0.11.2.data/purelib/openrlhf`` too.
        found = sorted(unpacked.rglob(f"{package}/__init__.py"), key=lambda p: len(p.parts))
        if not found:
            raise SystemExit(f"bench: no {package}/ package in {unpacked}")
        folders[name] = found[0].parent
    return folders


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS in MB of ``command`` and the children it waited for."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        raise SystemExit(f"bench: {' '.join(command)} exited {process.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def parse_only(paths: list[str]) -> None:
    """The floor: parse every file with LibCST in a pool of 2."""
    from concurrent.futures import ProcessPoolExecutor

    files = sorted(str(f) for p in paths for f in Path(p).rglob("*.py"))
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_parse, files, chunksize=8))


def _parse(path: str) -> None:
    import libcst

    with contextlib.suppress(Exception):
        libcst.parse_module(Path(path).read_text(encoding="utf-8", errors="replace"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "kllint-bench")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument(
        "--only", choices=["rl", "transformers"], help="measure one group (default: both)"
    )
    parser.add_argument("--parse-only", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse_only:
        parse_only(args.parse_only)
        return 0
    folders = fetch(args.dir.expanduser())
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    compile_kllint = "import compileall, os, kllint; compileall.compile_dir(os.path.dirname(kllint.__file__), quiet=1)"
    subprocess.run([sys.executable, "-c", compile_kllint], env=environment, check=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kllint.prefilter import may_hold_kl_term

    header = (
        f"{'':36} {'files':>5} {'kept':>5} {'lines':>7} | {'cold':>6} {'warm':>6} {'parse':>6} | "
        f"{'cold/parse':>10} {'warm/parse':>10} | {'peak MB cold':>12} {'parse':>6}"
    )
    print(f"medians of {args.runs} paired runs; kllint --jobs {args.jobs or 'default'}")
    print(header)
    print("-" * len(header))
    for label, names in GROUPS.items():
        if args.only and (args.only == "transformers") != (names == ["transformers"]):
            continue
        paths = [str(folders[n]) for n in names]
        files = [f for p in paths for f in Path(p).rglob("*.py")]
        texts = [f.read_bytes().decode("utf-8", "replace") for f in files]
        lines = sum(t.count("\n") for t in texts)
        kept = sum(may_hold_kl_term(t) for t in texts)
        kllint = [sys.executable, "-m", "kllint", "--format", "concise", "--exit-zero", *paths]
        if args.jobs:
            kllint += ["--jobs", str(args.jobs)]
        rows = []
        for _ in range(args.runs):
            cache = tempfile.mkdtemp(prefix="kllint-bench-cache-")
            env = {**environment, "KLLINT_CACHE_DIR": cache}
            try:
                cold = measure(kllint, env)
                warm = measure(kllint, env)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            parse = measure([sys.executable, __file__, "--parse-only", *paths], env)
            rows.append((cold, warm, parse))
        med = statistics.median
        cold_s, warm_s, parse_s = (med(r[i][0] for r in rows) for i in range(3))
        print(
            f"{label:36} {len(files):>5} {kept:>5} {lines:>7} | {cold_s:>5.2f}s {warm_s:>5.2f}s {parse_s:>5.2f}s | "
            f"{med(r[0][0] / r[2][0] for r in rows):>10.2f} {med(r[1][0] / r[2][0] for r in rows):>10.2f} | "
            f"{max(r[0][1] for r in rows):>12.0f} {max(r[2][1] for r in rows):>6.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
