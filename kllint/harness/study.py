"""``kllint estimators``: the table of canonical KL surrogates with their
computed verdicts, as text or JSON, and optionally the training figure.

The command's only module that imports both the table
(:mod:`kllint.harness.estimators`) and the figure
(:mod:`kllint.harness.figure`), which do not import each other.
"""

from __future__ import annotations

import json
import os
import sys

from kllint.harness.estimators import estimator_table, render_table, table_json
from kllint.harness.figure import FORMATS


def main_estimators(plot: str | None = None, output_format: str = "text") -> int:
    """Print the table and, with ``plot``, write the figure there (PNG, SVG or
    PDF by extension). Returns 0, or 2 when the figure cannot be written."""
    if plot is not None:
        # Fail before the table and seconds of training, not after.
        if os.path.splitext(plot)[1].lower() not in FORMATS:
            print(
                f"kllint: cannot write {plot}: the figure must end in {', '.join(FORMATS)}",
                file=sys.stderr,
            )
            return 2
        if not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
            print(f"kllint: cannot write {plot}: no such directory", file=sys.stderr)
            return 2
    rows = estimator_table()
    if output_format == "json":
        print(json.dumps(table_json(rows), indent=2))
    else:
        print(render_table(rows))
    if plot is not None:
        try:
            from kllint.harness.figure import plot as draw

            draw(plot, rows)
        except ImportError as exc:
            print(
                f"kllint: --plot needs {exc.name or 'matplotlib'}: pip install 'kllint[confirm]'",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:
            print(f"kllint: cannot write {plot}: {exc}", file=sys.stderr)
            return 2
        if output_format != "json":
            print(f"\nwrote {plot}")
    return 0
