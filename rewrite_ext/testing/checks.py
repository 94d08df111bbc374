"""``check_rewrite``: the properties every rewrite should have, checked on one function."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern

from ..rewrite import Rewriter, _takes_builder, rewrite_call

__all__ = ["CheckReport", "RewriteCheckFailure", "check_rewrite"]


class RewriteCheckFailure(AssertionError):
    """A property of :func:`check_rewrite` does not hold; the message is the report."""


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_rewrite` saw."""

    output: relax.Function | tvm.IRModule
    """The rewritten function or module."""
    calls: int
    """How often the rewriter was called in the first application."""
    rewrites: int
    """How many of those calls returned a replacement (did not decline)."""
    output_matches: bool
    """Whether the rewriter was offered a match in its own output."""


class _Counting:
    """Wraps a rewriter, keeping its form (two or three arguments), to count calls."""

    def __init__(self, rewriter: Rewriter) -> None:
        self.rewriter = rewriter
        self.calls = 0
        self.rewrites = 0

    def wrapped(self) -> Callable[..., Any]:
        if _takes_builder(self.rewriter):

            def three(orig, matchings, builder):
                return self._count(orig, self.rewriter(orig, matchings, builder))

            return three

        def two(orig, matchings):
            return self._count(orig, self.rewriter(orig, matchings))

        return two

    def _count(self, orig: relax.Expr, result: Any) -> Any:
        self.calls += 1
        if result is not None and not (isinstance(result, tvm.runtime.Object) and result.same_as(orig)):
            self.rewrites += 1
        return result


def _script(obj: relax.Function | tvm.IRModule) -> str:
    return obj.script(show_meta=False)


def _fail(prop: str, detail: str, before: str, after: str | None = None) -> None:
    report = [f"check_rewrite: {prop}", detail]
    if after is None:
        report += ["--- input ---", before]
    else:
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "expected", "got", lineterm="")
        report += ["--- diff ---", *diff]
    raise RewriteCheckFailure("\n".join(report))


def _equal(a: Any, b: Any) -> bool:
    return bool(tvm_ffi.structural_equal(a, b, map_free_vars=True))


def check_rewrite(
    pattern: DFPattern,
    rewriter: Rewriter,
    func: relax.Function | tvm.IRModule,
    *,
    max_iterations: int = 10,
) -> CheckReport:
    """Check the properties every rewrite by :func:`rewrite_ext.rewrite_call` should have.

    On ``func``: the output is well formed; the input is unchanged;
    rewriting is deterministic (two runs give structurally equal output);
    where nothing matched (or every match was declined) the output is
    structurally equal to the input; and where the rewriter is not
    offered any match in its own output, a second application changes
    nothing.  Meant to be called from a property test over generated IR
    (see :mod:`rewrite_ext.testing.strategies`).

    Parameters
    ----------
    pattern : DFPattern
        The pattern, as for ``rewrite_call``.
    rewriter : Callable
        The rewriter under test, two- or three-argument form.
    func : Union[relax.Function, tvm.IRModule]
        The input.
    max_iterations : int
        Passed to ``rewrite_call``.

    Returns
    -------
    report : CheckReport
        The output and what was counted, for further assertions.

    Raises
    ------
    RewriteCheckFailure
        An ``AssertionError`` whose message names the property that does not
        hold and shows the IR (or a diff of it).
    rewrite_ext.RewriteError
        From ``rewrite_call`` itself, when the rewrite fails.
    """
    # (tvm.ir.save_json crashes on Relax functions in TVM 0.27, so no deep copy: the
    # structural hash and the printed text stand for the input's content.)
    before_hash = tvm_ffi.structural_hash(func)
    before = _script(func)
    first = _Counting(rewriter)
    output = rewrite_call(pattern, first.wrapped(), func, max_iterations=max_iterations)

    try:
        relax.analysis.well_formed(output)
    except Exception as exc:  # noqa: BLE001
        _fail("output is well formed", f"relax.analysis.well_formed: {exc}", _script(output))
    if tvm_ffi.structural_hash(func) != before_hash or _script(func) != before:
        _fail("input is unchanged", "the input changed during the rewrite", before, _script(func))
    again = rewrite_call(pattern, rewriter, func, max_iterations=max_iterations)
    if not _equal(output, again):
        _fail("deterministic", "two runs on the same input differ", _script(output), _script(again))
    if first.rewrites == 0 and not _equal(output, func):
        _fail(
            "no match leaves the input as it was",
            f"the rewriter was called {first.calls} time(s) and declined each, yet the output differs",
            before,
            _script(output),
        )
    second = _Counting(rewriter)
    twice = rewrite_call(pattern, second.wrapped(), output, max_iterations=max_iterations)
    if second.calls == 0 and not _equal(twice, output):
        _fail(
            "a second application changes nothing",
            "the output holds no match of the pattern, yet rewriting it again changed it",
            _script(output),
            _script(twice),
        )
    return CheckReport(output, first.calls, first.rewrites, second.calls > 0)

