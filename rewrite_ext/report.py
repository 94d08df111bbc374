"""What a rewrite did, rule by rule: the report, and the ``rewrite_ext`` logger.

Pass ``report=RewriteReport()`` to :func:`~rewrite_ext.rewrite_call`,
:func:`~rewrite_ext.apply_rules` or their passes, then print it; or turn
on the logger (``logging.basicConfig(level=logging.DEBUG)``) to see each
rewrite and each decline as it happens.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tvm import relax

from . import _ir
from .rule import Rule

__all__ = ["RewriteReport", "RuleReport"]

logger = logging.getLogger("rewrite_ext")


@dataclass
class RuleReport:
    """What one rule did.

    Each binding is named ``(function, binding var)``; a binding offered
    in several passes is counted in each.
    """

    name: str
    pattern: str
    offered: int = 0
    """Matches offered to the rewriter."""
    rewritten: list[tuple[str, str]] = field(default_factory=list)
    """Bindings whose value the rewriter replaced."""
    kept: list[tuple[str, str]] = field(default_factory=list)
    """Bindings kept with what the rewriter emitted inserted before them."""
    declined: list[tuple[str, str, str]] = field(default_factory=list)
    """``(function, binding var, reason)`` of each declined match."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pattern": self.pattern,
            "offered": self.offered,
            "rewritten": [list(b) for b in self.rewritten],
            "kept": [list(b) for b in self.kept],
            "declined": [list(b) for b in self.declined],
        }


class RewriteReport:
    """Per rule, the bindings offered, rewritten, kept and declined, and the passes run.

    Examples
    --------
    .. code-block:: python

        report = RewriteReport()
        mod = apply_rules(rules, mod, report=report)
        print(report)                 # a short table
        report.to_dict()              # for tools
    """

    def __init__(self) -> None:
        self.rules: dict[str, RuleReport] = {}
        """Each rule's report, by rule name (a repeated name gets ``#2``, ``#3``, ...)."""
        self.passes: dict[str, int] = {}
        """Passes run per function, added up over every rewrite the report was passed to."""
        self._by_rule: dict[int, RuleReport] = {}

    def rule(self, rule: Rule) -> RuleReport:
        """The report of ``rule``, made the first time it is asked for."""
        found = self._by_rule.get(id(rule))
        if found is None:
            name, n = rule.name, 1
            while name in self.rules:
                n += 1
                name = f"{rule.name}#{n}"
            found = self._by_rule[id(rule)] = self.rules[name] = RuleReport(
                name, rule.description.rsplit(" (rule ", 1)[0]
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": [report.to_dict() for report in self.rules.values()],
            "passes": dict(self.passes),
        }

    def __str__(self) -> str:
        rows = [("rule", "offered", "rewritten", "kept", "declined", "reasons declined")]
        for report in self.rules.values():
            reasons = Counter(reason for _, _, reason in report.declined)
            shown = ", ".join(f"{reason} ({n})" for reason, n in reasons.most_common(3))
            if len(reasons) > 3:
                shown += ", ..."
            rows.append(
                (
                    report.name,
                    str(report.offered),
                    str(len(report.rewritten)),
                    str(len(report.kept)),
                    str(len(report.declined)),
                    shown,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        passes = ", ".join(f"{name}: {n}" for name, n in self.passes.items()) or "none"
        lines.append(f"passes per function: {passes}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"RewriteReport({self.to_dict()!r})"


class Recorder:
    """Where the traversal tells what happened, for a report and the logger.

    Made only when a report is asked for or the logger shows DEBUG, so a
    plain rewrite pays nothing for it.
    """

    def __init__(self, report: RewriteReport | None) -> None:
        self.report = report
        self.log = logger.isEnabledFor(logging.DEBUG)

    @staticmethod
    def make(report: RewriteReport | None) -> Recorder | None:
        if report is None and not logger.isEnabledFor(logging.DEBUG):
            return None
        return Recorder(report)

    def offered(self, rule: Rule) -> None:
        if self.report is not None:
            self.report.rule(rule).offered += 1

    def done(self, rule: Rule, function: str, binding: relax.Binding, kept: bool) -> None:
        name = _ir.binding_label(binding)
        if self.report is not None:
            rule_report = self.report.rule(rule)
            (rule_report.kept if kept else rule_report.rewritten).append((function, name))
        if self.log:
            what = "kept, with bindings inserted before it," if kept else "rewritten"
            logger.debug("%s: binding '%s' %s by rule '%s'", function, name, what, rule.name)

    def declined(self, rule: Rule, function: str, binding: relax.Binding, reason: str) -> None:
        name = _ir.binding_label(binding)
        if self.report is not None:
            self.report.rule(rule).declined.append((function, name, reason))
        if self.log:
            logger.debug("%s: binding '%s' declined by rule '%s': %s", function, name, rule.name, reason)

    def passes(self, function: str, count: int) -> None:
        if self.report is not None:
            passes = self.report.passes
            passes[function] = passes.get(function, 0) + count
