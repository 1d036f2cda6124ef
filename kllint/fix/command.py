"""What ``--fix``, ``--unsafe-fixes``, ``--diff`` and ``--show-fixes`` do to a lint
result (the command line only calls :meth:`FixMode.run`)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from kllint.config import Settings
from kllint.engine import lint_paths
from kllint.findings import LintResult
from kllint.fix import run as fixer
from kllint.fix.verify import key


@dataclass
class FixMode:
    fix: bool
    unsafe: bool
    diff: bool
    show: bool
    jobs: int | None = None
    exit_code: int | None = None

    def run(self, result: LintResult, settings: Settings, output_format: str) -> int | None:
        """Fill each finding's ``fix``; with ``--diff`` print the diffs and
        return the exit code (the findings are not reported); with ``--fix``
        write the files and leave in ``result`` only what remains."""
        try:
            fixes = fixer.fix_result(result, settings, unsafe=self.unsafe, jobs=self.jobs)
        except Exception as err:  # a bug in the fixer: nothing is written
            problem = f"fixing failed: {type(err).__name__}: {err} (a bug in kllint)"
            if not (self.fix or self.diff):  # the findings are still worth reporting
                click.echo(f"kllint: warning: {problem}", err=True)
                return None
            click.echo(f"kllint: error: {problem}", err=True)
            self.exit_code = 2
            return 2
        changed = [f for f in fixes if f.changed]
        if self.diff:
            for f in changed:
                click.echo(f.diff(), nl=False)
            if self.show:
                self._summary(fixes, would=True, to_stderr=False)
            self.exit_code = 1 if changed else 0
            return self.exit_code
        if self.fix:
            try:
                fixer.write(changed)
            except OSError as err:
                click.echo(f"kllint: error: cannot write a fixed file: {err}", err=True)
                self.exit_code = 2
                return 2
            self._relint(result, settings, fixes)
        if self.show:
            self._summary(
                fixes, would=not self.fix, to_stderr=output_format not in ("full", "concise")
            )
        elif self.fix and changed:
            n = sum(len(f.applied) for f in fixes)
            click.echo(f"kllint: fixed {n} finding(s) in {len(changed)} file(s)", err=True)
        return None

    def _relint(self, result: LintResult, settings: Settings, fixes: list[fixer.FileFixes]) -> None:
        """The findings left, at their positions in the written files. Every
        file with findings is linted again: a helper fixed in one file clears
        the findings at its calls in others."""
        if not any(f.changed for f in fixes):
            return
        changed = {f.path for f in fixes}
        reasons = {
            key(f): f.facts["fix_unavailable"]
            for f in result.findings
            if f.path in changed and "fix_unavailable" in f.facts
        }
        again = lint_paths(sorted(changed), settings, jobs=1)
        for finding in again.findings:
            if key(finding) in reasons:
                finding.facts["fix_unavailable"] = reasons[key(finding)]
        result.findings = sorted(
            [f for f in result.findings if f.path not in changed] + again.findings,
            key=lambda f: f.sort_key(),
        )
        result.errors = [e for e in result.errors if e.path not in changed] + again.errors
        result.sources.update(again.sources)

    def _summary(self, fixes: list[fixer.FileFixes], would: bool, to_stderr: bool) -> None:
        applied = [(f.path, p) for f in fixes for p in f.applied]
        verb = "Would fix" if would else "Fixed"
        lines = [f"{verb} {len(applied)} finding(s):"] if applied else ["No fixes available."]
        for path, p in applied:
            codes = ", ".join(sorted({finding.code for finding in p.findings}))
            line = p.findings[0].line
            lines.append(f"- {path}:{line}: {codes} [{p.applicability.value}] {p.message}")
        click.echo("\n".join(lines), err=to_stderr)
