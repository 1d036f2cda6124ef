"""Fuzz a lint run: generated programs and mutated fixtures must never crash,
hang or silence kllint.

    python scripts/fuzz.py [--programs 300] [--mutants 1000] [--seed 0] [--keep DIR]

Programs come from hypothesmith (valid Python from the grammar), mutants from
the fixtures under tests/fixtures (lines deleted, duplicated or swapped,
brackets and operators inserted, the text cut short, bytes flipped). Every
input starts with ``# kl loss`` so the prefilter sends it to the analysis.
All inputs are linted in one run with workers (the isolation under test);
the run fails on an internal error, a crash, a timeout or an exception out
of ``lint_paths``. ``--keep`` saves the inputs that failed.

The test suite runs a few seconds of the same (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PREFIX = "# kl loss backward\n"
LIMITS = ("LibCST cannot parse", "file too large")


def mutate(source: str, rng: random.Random) -> str:
    """One to three random edits of ``source``."""
    lines = source.splitlines(keepends=True) or ["\n"]
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(7)
        i = rng.randrange(len(lines))
        if kind == 0 and len(lines) > 1:
            del lines[i]
        elif kind == 1:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif kind == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == 3:
            line = lines[i]
            k = rng.randint(0, len(line))
            lines[i] = (
                line[:k]
                + rng.choice(["(", ")", "[", "]", ":", " + ", " - ", "**", "\t", "'"])
                + line[k:]
            )
        elif kind == 4:
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: rng.randint(0, len(lines[-1]))]
        elif kind == 5:
            line = lines[i]
            k = rng.randint(0, len(line))
            lines[i] = (
                line[:k]
                + rng.choice(["kl", "ref_logp", "logp", ".detach()", ".exp()", "loss"])
                + line[k:]
            )
        else:
            line = lines[i]
            if line:
                k = rng.randrange(len(line))
                lines[i] = line[:k] + chr(rng.randrange(0x20, 0x2100)) + line[k + 1 :]
    return "".join(lines)


def mutants(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    sources = [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py"))]
    return [PREFIX + mutate(rng.choice(sources), rng) for _ in range(count)]


def programs(count: int, seed: int) -> list[str]:
    """Valid programs from hypothesmith's grammar strategy."""
    import hypothesmith
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed

    found: list[str] = []

    @fixed_seed(seed)
    @settings(
        max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(hypothesmith.from_grammar())
    def collect(source: str) -> None:
        found.append(PREFIX + source)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # hypothesmith compiles each program
        collect()
    return found


def run(sources: list[str], directory: Path) -> list[tuple[Path, str]]:
    """Lint ``sources`` as files in ``directory``; the inputs kllint failed on."""
    from kllint.config import Settings
    from kllint.engine import lint_paths

    for index, source in enumerate(sources):
        (directory / f"case_{index:05}.py").write_text(
            source, encoding="utf-8", errors="surrogatepass"
        )
    result = lint_paths([directory], Settings(root=directory))
    failures = []
    for error in result.errors:
        # E999 is the input's fault (a syntax error); E998 is kllint's, except
        # for the documented limits of its parser.
        if error.code == "E998" and not any(limit in error.message for limit in LIMITS):
            failures.append((directory / Path(error.path).name, error.message))
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--mutants", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="copy failing inputs here")
    args = parser.parse_args()
    start = time.monotonic()
    sources = mutants(args.mutants, args.seed) + programs(args.programs, args.seed)
    with tempfile.TemporaryDirectory(prefix="kllint-fuzz-") as folder:
        failures = run(sources, Path(folder))
        if args.keep and failures:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path, _ in failures:
                shutil.copy(path, args.keep / path.name)
    for path, message in failures:
        print(f"{path.name}: {message}")
    print(
        f"fuzz: {len(sources)} inputs ({args.mutants} mutants, {args.programs} programs), "
        f"{len(failures)} failures, {time.monotonic() - start:.0f} s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
