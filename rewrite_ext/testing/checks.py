"""``check_rewrite`` and ``check_pass``: the properties every rewrite should have, on one input.

Structural (the output is well formed, the input unchanged, the rewrite
deterministic, ...) and, with ``run=True``, semantic: the input and the
output are built and run on the VM on the same inputs and must compute the
same results (:func:`rewrite_ext.testing.running.assert_same_results`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern

from ..rewrite import rewrite_call
from .._wellformed import check_alone, full_check
from ..rule import Rewriter, _takes_builder
from .running import ResultMismatch, assert_same_results

__all__ = ["CheckReport", "PassReport", "RewriteCheckFailure", "check_pass", "check_rewrite"]


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
    """How many of those calls returned a replacement (neither declined nor kept the match)."""
    output_matches: bool
    """Whether the rewriter was offered a match in its own output."""
    ran: bool = False
    """Whether input and output were run and compared (``run=True`` and the output differs)."""
    kept: int = 0
    """How many of those calls returned ``orig`` after emitting: the binding kept, with the
    emitted bindings before it (``RewriteReport``'s "kept")."""


@dataclass(frozen=True)
class PassReport:
    """What :func:`check_pass` saw."""

    output: tvm.IRModule
    """The transformed module."""
    changed: bool
    """Whether the output differs structurally from the input."""
    ran: bool
    """Whether input and output were run and compared."""


class _Counting:
    """Wraps a rewriter, keeping its form (two or three arguments), to count calls."""

    def __init__(self, rewriter: Rewriter) -> None:
        self.rewriter = rewriter
        self.calls = 0
        self.rewrites = 0
        self.kept = 0

    def wrapped(self) -> Callable[..., Any]:
        if _takes_builder(self.rewriter):

            def three(orig, matchings, builder):
                result = self.rewriter(orig, matchings, builder)
                # orig returned after emitting keeps the binding with the emitted ones before it.
                return self._count(orig, result, emitted=getattr(builder, "opened", False))

            wrapper = three
        else:

            def two(orig, matchings):
                return self._count(orig, self.rewriter(orig, matchings))

            wrapper = two
        # Errors and reports name the rule after the user's rewriter, not this wrapper.
        wrapper.__name__ = getattr(self.rewriter, "__name__", type(self.rewriter).__name__)
        return wrapper

    def _count(self, orig: relax.Expr, result: Any, emitted: bool = False) -> Any:
        self.calls += 1
        if result is None:
            return result
        if not (isinstance(result, tvm.runtime.Object) and result.same_as(orig)):
            self.rewrites += 1
        elif emitted:
            self.kept += 1
        return result


def _script(obj: relax.Function | tvm.IRModule) -> str:
    return obj.script(show_meta=False)


def _fail(
    prop: str, detail: str, before: str, after: str | None = None, who: str = "check_rewrite", shown: str = "input"
) -> None:
    report = [f"{who}: {prop}", detail]
    if after is None:
        report += [f"--- {shown} ---", before]
    else:
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "expected", "got", lineterm="")
        report += ["--- diff ---", *diff]
    raise RewriteCheckFailure("\n".join(report))


def _ill_formed(before: relax.Function | tvm.IRModule, output: relax.Function | tvm.IRModule) -> str | None:
    """TVM's verdict against ``output``, None when it is well formed.

    A module TVM rejects before the rewrite too (``IRModule({"main": f})``
    keeps ``f``'s ``global_symbol``) has each Relax function checked alone
    and its GlobalVars against the module's, as ``rewrite_call`` checks it.
    """
    verdict = full_check(output)
    if verdict is None or not isinstance(output, tvm.IRModule) or full_check(before) is None:
        return verdict
    names = [gvar.name_hint for gvar, func in output.functions_items() if isinstance(func, relax.Function)]
    found = check_alone(output, names)
    if found is None:
        return None
    name, verdict, _ = found
    return f"(the input module is not well formed either; its function '{name}' alone:) {verdict}"


def _equal(a: Any, b: Any) -> bool:
    return bool(tvm_ffi.structural_equal(a, b, map_free_vars=True))


def check_rewrite(
    pattern: DFPattern,
    rewriter: Rewriter,
    func: relax.Function | tvm.IRModule,
    *,
    max_iterations: int = 10,
    run: bool = True,
    inputs: Sequence[Any] | None = None,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    entry: str | None = None,
) -> CheckReport:
    """Check the properties every rewrite by :func:`rewrite_ext.rewrite_call` should have.

    On ``func``: the output is well formed; the input is unchanged;
    rewriting is deterministic (two runs give structurally equal output);
    where nothing matched (or every match was declined) the output is
    structurally equal to the input; where the rewriter is not
    offered any match in its own output, a second application changes
    nothing; and (``run=True``, when the output differs from the input) the
    input and the output, built for ``llvm`` and run on the VM on the same
    inputs, compute the same results (see
    :func:`rewrite_ext.testing.assert_same_results`; under ``cpu_dma()``
    when the output calls the Hexagon DMA builtins).  Meant to be called
    from a property test over generated IR (see
    :mod:`rewrite_ext.testing.strategies`).

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
    run : bool
        Also build and run input and output and compare their results.  A
        module runs its ``main`` (or ``entry``); pass ``run=False`` for a
        structural check only (a rewrite meant to change results).
    inputs : sequence, optional
        One value per parameter of ``main``; by default seeded random inputs
        (:func:`rewrite_ext.testing.random_inputs` with ``seed`` and ``sizes``).
    seed : int
        Seed of the default inputs.
    sizes : Mapping[str, int], optional
        Values of symbolic shape variables for the default inputs.
    rtol, atol : float, optional
        Float tolerances; by default per dtype (see ``assert_same_results``).
    entry : str, optional
        The function to run instead of ``main``; by default ``main``, or the
        module's only public Relax function (``forward`` of a module from
        ``nn.Module.export_tvm``).

    Returns
    -------
    report : CheckReport
        The output and what was counted, for further assertions.

    Raises
    ------
    RewriteCheckFailure
        An ``AssertionError`` whose message names the property that does not
        hold and shows the IR (or a diff of it); for different results, the
        first output that differs and the inputs that show it.
    rewrite_ext.RewriteError
        From ``rewrite_call`` itself, when the rewrite fails.
    """
    # (tvm.ir.save_json crashes on Relax functions in TVM 0.27, so no deep copy: the
    # structural hash and the printed text stand for the input's content.)
    before_hash = tvm_ffi.structural_hash(func)
    before = _script(func)
    first = _Counting(rewriter)
    output = rewrite_call(pattern, first.wrapped(), func, max_iterations=max_iterations)

    verdict = _ill_formed(func, output)
    if verdict is not None:
        _fail("output is well formed", f"relax.analysis.well_formed: {verdict}", _script(output), shown="output")
    if tvm_ffi.structural_hash(func) != before_hash or _script(func) != before:
        _fail("input is unchanged", "the input changed during the rewrite", before, _script(func))
    again = rewrite_call(pattern, rewriter, func, max_iterations=max_iterations)
    if not _equal(output, again):
        _fail("deterministic", "two runs on the same input differ", _script(output), _script(again))
    if first.rewrites + first.kept == 0 and not _equal(output, func):
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
    ran = run and not output.same_as(func)
    if ran:
        _compare("check_rewrite", func, output, inputs, seed, sizes, rtol, atol, entry)
    return CheckReport(output, first.calls, first.rewrites, second.calls > 0, ran, first.kept)


def _compare(who: str, before, after, inputs, seed, sizes, rtol, atol, entry) -> None:
    try:
        assert_same_results(
            before, after, inputs=inputs, seed=seed, sizes=sizes, rtol=rtol, atol=atol, entry=entry
        )
    except ResultMismatch as exc:
        detail = str(exc).removeprefix("assert_same_results: ")
        raise RewriteCheckFailure(
            "\n".join([f"{who}: the output computes what the input computes", detail, "--- output ---", _script(after)])
        ) from None


def check_pass(
    pass_: tvm.transform.Pass | Callable[[tvm.IRModule], tvm.IRModule],
    mod: tvm.IRModule,
    *,
    run: bool = True,
    inputs: Sequence[Any] | None = None,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    entry: str | None = None,
) -> PassReport:
    """Check the properties every module pass should have, on ``mod``.

    The output is well formed; the input is unchanged; the pass is
    deterministic (two runs give structurally equal output); and
    (``run=True``, when the output differs from the input) ``main`` of the
    input and of the output compute the same results on the VM, on the same
    inputs (under ``cpu_dma()`` when the output calls the Hexagon DMA
    builtins, as ``rewrite_ext.hexagon.CopyToDMA()``'s does).

    Parameters
    ----------
    pass_ : Union[tvm.transform.Pass, Callable]
        A module pass (``CopyToDMA()``, ``RewriteCall(...)``, a TVM pass), or any
        function from module to module.
    mod : tvm.IRModule
        The input.
    run, inputs, seed, sizes, rtol, atol, entry
        As for :func:`check_rewrite`.

    Returns
    -------
    report : PassReport
        The output, whether it changed and whether it was run.

    Raises
    ------
    RewriteCheckFailure
        Naming the property that does not hold, as for ``check_rewrite``.
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"check_pass takes a tvm.IRModule, got {type(mod).__name__}; wrap a function in one")
    who = "check_pass"
    before_hash = tvm_ffi.structural_hash(mod)
    before = _script(mod)
    output = pass_(mod)
    verdict = _ill_formed(mod, output)
    if verdict is not None:
        _fail("output is well formed", f"relax.analysis.well_formed: {verdict}", _script(output), who=who, shown="output")
    if tvm_ffi.structural_hash(mod) != before_hash or _script(mod) != before:
        _fail("input is unchanged", "the input changed during the pass", before, _script(mod), who=who)
    again = pass_(mod)
    if not _equal(output, again):
        _fail("deterministic", "two runs on the same input differ", _script(output), _script(again), who=who)
    changed = not _equal(output, mod)
    ran = run and changed
    if ran:
        _compare(who, mod, output, inputs, seed, sizes, rtol, atol, entry)
    return PassReport(output, changed, ran)

