"""Record kllint's findings on real releases, or compare them with a record.

A safety net for changes to the analysis: run it with ``--save`` before the
change and without it after; every difference (code, path, line, column) is
printed, and the exit status is 1 when there is one.

    python scripts/compare_findings.py --save before.json DIR [DIR ...]
    python scripts/compare_findings.py --against before.json DIR [DIR ...]

Each DIR is a package folder (e.g. an unzipped wheel's ``trl``); paths are
recorded relative to the DIR's parent, so the record can be compared across
machines. ``scripts/real_releases.sh`` downloads the releases.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def findings(root: Path) -> list[list[object]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kllint",
            "--no-cache",
            "--format",
            "json",
            "--exit-zero",
            str(root),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for item in json.loads(out):
        path = Path(item["path"]).resolve().relative_to(root.resolve().parent)
        rows.append([item["code"], path.as_posix(), item["line"], item["column"]])
    return sorted(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the findings to this file")
    group.add_argument("--against", type=Path, help="compare with this record")
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    record = {str(d): findings(d) for d in args.dirs}
    if args.save:
        args.save.write_text(json.dumps(record, indent=1) + "\n")
        for d, rows in record.items():
            print(f"{d}: {len(rows)} findings")
        return 0
    before = json.loads(args.against.read_text())
    differ = False
    for d, rows in record.items():
        old = {tuple(r) for r in before.get(d, [])}
        new = {tuple(r) for r in rows}
        for r in sorted(old - new):
            print(f"- {d}: {r[0]} {r[1]}:{r[2]}:{r[3]}")
        for r in sorted(new - old):
            print(f"+ {d}: {r[0]} {r[1]}:{r[2]}:{r[3]}")
        differ |= old != new
        print(f"{d}: {len(old)} before, {len(new)} after{'' if old == new else ' (differs)'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
