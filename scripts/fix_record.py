"""Record what ``--fix --unsafe-fixes`` would do to the fixture corpus, and how
long planning it took: a safety net for changes to the fixer.

    python scripts/fix_record.py before.json    # with the old checkout first on PYTHONPATH
    python scripts/fix_record.py after.json
    cmp before.json after.json                  # the timing line is printed, not recorded

Runs on a copy of ``tests/fixtures``; the fixtures stay as they are. For each
file: a hash of the text ``--fix`` would write, how many fixes apply and why
the others are refused; for each finding: its fix (edits, confirmation) or
the reason it has none.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kllint.config import load_settings
from kllint.engine import lint_paths
from kllint.fix import fix_result

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "fixtures"
        shutil.copytree(FIXTURES, root)
        settings = load_settings([root])
        result = lint_paths([root], settings, jobs=1)
        start = time.perf_counter()
        fixes = fix_result(result, settings, unsafe=True)
        elapsed = time.perf_counter() - start

        def shown(path: str) -> str:
            return path.split("fixtures/", 1)[1]

        files = {
            shown(f.path): {
                "new": hashlib.sha1(f.new.encode()).hexdigest(),
                "applied": len(f.applied),
                "refused": sorted(f.refused.values()),
            }
            for f in fixes
        }
        findings = sorted(
            (
                [
                    shown(f.path),
                    f.line,
                    f.code,
                    json.dumps(f.fix, sort_keys=True).replace(tmp, "TMP") if f.fix else None,
                    f.facts.get("fix_unavailable"),
                ]
                for f in result.findings
            ),
            key=str,
        )
    Path(out).write_text(json.dumps({"files": files, "findings": findings}, indent=1) + "\n")
    print(
        f"{len(result.findings)} findings in {len(files)} files; fixes planned in {elapsed:.1f} s"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/fix_record.py OUT.json")
    main(sys.argv[1])
