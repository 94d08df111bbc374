"""A rewrite rule: a pattern, the rewriter that replaces its matches, and a name.

The rule also holds what is known of its pattern in advance (which ops
can stand at its root, how deep it looks through bindings), so the
traversal can skip bindings the rule cannot match without asking TVM's
matcher.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Union

from tvm import relax
from tvm.relax.dpl import DFPattern

from . import _patterns

__all__ = ["Decline", "Rewriter", "Rule"]

Rewriter = Union[
    Callable[[relax.Expr, Mapping[DFPattern, relax.Expr]], Union[relax.Expr, None]],
    Callable[[relax.Expr, Mapping[DFPattern, relax.Expr], relax.BlockBuilder], Union[relax.Expr, None]],
]
"""A rewriter: ``(orig, matchings)`` or ``(orig, matchings, builder)`` to a new expression."""


class Decline(Exception):  # noqa: N818 - named for what the rewriter does, as MLIR's notifyMatchFailure
    """Raised inside a rewriter to decline the match it was offered, with a reason.

    It has the effect of returning None: the binding is left as it was and
    the next rule (or the next alternative of an OrPattern) is offered it.
    Anything emitted through the builder for this match is discarded.

    Parameters
    ----------
    reason : str
        Why the match was declined, e.g. ``"dst is not in VTCM"``.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def _takes_builder(rewriter: Callable[..., Any]) -> bool:
    """Whether ``rewriter`` is the three-argument form, read from its signature once.

    A third positional parameter with a default is left to it, as TVM's
    ``rewrite_call`` leaves it: ``rewriter(orig, matchings, verbose=False)``
    written for TVM must not receive the builder as ``verbose``.
    """
    try:
        params = inspect.signature(rewriter).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: TVM's form
        return False
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 3


class Rule:
    """A named rewrite rule: replace each binding value that ``pattern`` matches.

    Parameters
    ----------
    pattern : DFPattern
        The pattern matched against each binding's value.
    rewriter : Callable
        ``rewriter(orig, matchings)`` (the form of
        ``tvm.relax.dpl.rewrite_call``) or ``rewriter(orig, matchings,
        builder)``, chosen once from its signature.  It returns the
        expression that replaces ``orig``; returning None, or raising
        :class:`Decline`, declines the match.  Returning ``orig`` itself
        after emitting keeps the binding and inserts what was emitted
        before it.
    name : Optional[str]
        The rule's name in reports and error messages; the rewriter's
        ``__name__`` by default.
    """

    __slots__ = (
        "pattern",
        "rewriter",
        "name",
        "takes_builder",
        "root_ops",
        "lookup_depth",
        "alternatives",
        "description",
    )

    def __init__(self, pattern: DFPattern, rewriter: Rewriter, *, name: str | None = None) -> None:
        if not isinstance(pattern, DFPattern):
            raise TypeError(f"pattern must be a relax.dpl.DFPattern, got {type(pattern).__name__}")
        if not callable(rewriter):
            raise TypeError(f"rewriter must be callable, got {type(rewriter).__name__}")
        self.pattern = pattern
        self.rewriter = rewriter
        self.name: str = name or getattr(rewriter, "__name__", None) or type(rewriter).__name__
        self.takes_builder = _takes_builder(rewriter)
        try:
            self.root_ops = _patterns.root_ops(pattern)
            """The ops a matched value can call, or None when any value may match."""
            self.lookup_depth = _patterns.lookup_depth(pattern) if _patterns.needs_bindings(pattern) else 0
            """How many levels of bindings the pattern sees through (0: none; None: any)."""
        except RecursionError:  # nested deeper than Python recurses (TVM's matcher does not mind)
            self.root_ops, self.lookup_depth = None, None
        self.alternatives = tuple(_patterns.alternatives(pattern))
        """Each alternative of a top-level OrPattern, with the Or nodes enclosing it."""
        self.description = f"{_patterns.describe(pattern)} (rule '{self.name}')"

    def __repr__(self) -> str:
        return f"Rule({self.description})"
