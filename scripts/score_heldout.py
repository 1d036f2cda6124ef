"""Score held-out sets the way their READMEs count: an item is a ``.py`` file
or a directory of them (each analysed with its folder as the project); a bug
item counts as found when every ``# error:`` line is reported with its code
(KL003 also where KL002 is annotated); an item has a false positive when a
reported line carries a code its annotations do not allow.

    python scripts/score_heldout.py tests/fixtures/heldout142 [tests/fixtures_pending/heldout142 ...]

Run from a checkout at the commit to score (``PYTHONPATH`` or a worktree for
an older one). Prints each item that misses or has a false positive, then the
totals."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from corpus import findings_of  # noqa: E402
from test_fixtures import expectations  # noqa: E402


def main(folders: list[str]) -> int:
    found = bugs = with_fp = items = 0
    for folder in map(Path, folders):
        entries = sorted(
            p for p in folder.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name[:1] in "eo")
        )
        for item in entries:
            items += 1
            files = [item] if item.is_file() else sorted(item.rglob("*.py"))
            missed, wrong, has_bug = [], [], False
            for path in files:
                expected = expectations(path.read_text())
                reported: dict[int, set[str]] = {}
                for finding in findings_of(path.resolve()):
                    reported.setdefault(finding.line, set()).add(finding.code)
                for line, codes in expected["error"].items():
                    has_bug = True
                    if codes - reported.get(line, set()):
                        missed.append(f"{path.name}:{line} {sorted(codes)}")
                for line, codes in reported.items():
                    allowed = expected["error"].get(line, set()) | expected["todo-error"].get(
                        line, set()
                    )
                    if "KL002" in allowed:
                        allowed |= {"KL003"}
                    if codes - allowed:
                        wrong.append(f"{path.name}:{line} {sorted(codes - allowed)}")
            bugs += has_bug
            found += has_bug and not missed
            with_fp += bool(wrong)
            if missed or wrong:
                print(f"{folder.name}/{item.name}: missed {missed} false positive {wrong}")
    print(f"bugs found {found}/{bugs}; items with a false positive {with_fp}/{items}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
