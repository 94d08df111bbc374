"""The public API: ``rewrite_call``, ``apply_rules`` and their passes.

A thin layer over the engine: :mod:`rewrite_ext.rule` (what a rule is),
``_walker`` (one pass over one function), ``_driver`` (the fixed point and
the well-formedness verdict).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern

from . import _driver
from .errors import remember
from .report import RewriteReport
from .rule import Rewriter, Rule

__all__ = ["RewriteCall", "RewriteRules", "apply_rules", "rewrite_call"]


def rewrite_call(
    pattern: DFPattern,
    rewriter: Rewriter,
    target: relax.Function | tvm.IRModule,
    *,
    max_iterations: int = 10,
    report: RewriteReport | None = None,
    dry_run: bool = False,
    cleanup: bool = False,
) -> relax.Function | tvm.IRModule:
    """Rewrite every binding whose value matches ``pattern``.

    A drop-in extension of ``tvm.relax.dpl.rewrite_call``: the rewriter may
    also take a ``relax.BlockBuilder`` and emit bindings, void and impure
    ones included, that land just before the rewritten binding.

    Matching rules:

    * Every binding's value is offered, wherever a binding can stand:
      DataflowBlocks and plain BindingBlocks, pure, impure and
      ``relax.force_pure`` functions, If branches, local functions.
      (TVM's rewrite_call never offers impure calls in plain blocks.)
    * Patterns see through earlier bindings of the same block, as TVM's
      matcher does, but never through a ``match_cast``, nor across an impure
      binding or an in-place call such as ``R.call_tir_inplace`` (memory
      written in place there makes a value computed before
      it differ from the same expression after it).
    * ``matchings[p]`` is what ``p`` matched, as TVM gives it: a var for a
      leaf, the bound call for a sub-pattern seen through a var.  An
      expression the rewriter returns or emits that *is* (the same object)
      a value bound earlier in the block is replaced by that binding's var,
      so nothing is computed twice.  Pure bindings seen through by a
      non-wildcard sub-pattern and unused after the rewrite are removed.
    * Returning None (or raising :class:`~rewrite_ext.Decline`) declines
      the match; returning a structurally equal expression changes nothing.
      Returning ``orig`` after emitting keeps the binding and inserts what
      was emitted before it; the rule is not offered that binding again.
    * Nothing else changes: no re-sorting, dead-code elimination, CSE or
      canonicalization.  The input is never modified.

    Parameters
    ----------
    pattern : DFPattern
        The pattern to match against each binding's value.
    rewriter : Callable
        ``rewriter(orig, matchings)`` (TVM's form) or
        ``rewriter(orig, matchings, builder)``, chosen once from its
        signature.  It returns the expression that replaces ``orig``.
        Whatever it emits through ``builder`` lands just before the
        rewritten binding, in order; a void call emitted is bound to a
        fresh ``R.Tuple()`` var.
    target : Union[relax.Function, tvm.IRModule]
        A function, or a module whose Relax functions are all rewritten
        (everything else in it is kept as is).
    max_iterations : int
        The most passes that may change something; one more pass must then
        change nothing.
    report : Optional[RewriteReport]
        Filled with what each rule did: bindings offered, rewritten, kept
        and declined (with the reason), and the passes run.
    dry_run : bool
        Rewrite and check as usual, fill ``report``, and return ``target``
        itself.
    cleanup : bool
        After each pass that changed something, run TVM's cleanups
        (``CanonicalizeBindings``, common-subexpression elimination, removal
        of unused pure bindings; never a void or impure binding), so results
        come out as TVM's ``rewrite_call`` gives them.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The rewritten function or a new module, which passes
        ``relax.analysis.well_formed``; the input itself when nothing was
        rewritten.

    Raises
    ------
    RewriteError
        When the rewriter raises, returns a non-expression, emits and then
        returns None, opens or closes a frame of the builder, returns a void
        value for a binding whose var is used later, puts an impure call in
        a DataflowBlock or a pure function, or keeps matching after
        ``max_iterations``; or when the result is not well formed.  The
        message names the function, the binding and the pattern.

    Examples
    --------
    .. code-block:: python

        def to_dma(orig, m, builder):
            src, dst = m[src_pat], m[dst_pat]
            builder.emit(R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy",
                         [src, dst, 0, True], ty_args=[R.Tuple()]))
            return R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait",
                         [0, 0, True, src, dst], ty_args=[R.Tuple()])

        func = rewrite_call(is_op("relax.vm.copy_tensor")(src_pat, dst_pat), to_dma, func)

    turns ``R.vm.copy_tensor(x, a)`` into::

        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, True), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, True, x, a), ty_args=(R.Tuple,))
    """
    return apply_rules(
        [Rule(pattern, rewriter)],
        target,
        max_iterations=max_iterations,
        report=report,
        dry_run=dry_run,
        cleanup=cleanup,
    )


def apply_rules(
    rules: Sequence[Rule],
    target: relax.Function | tvm.IRModule,
    *,
    max_iterations: int = 10,
    report: RewriteReport | None = None,
    dry_run: bool = False,
    cleanup: bool = False,
) -> relax.Function | tvm.IRModule:
    """Rewrite ``target`` with several rules in one traversal per pass.

    At each binding the rules are tried in order; the first whose pattern
    matches and whose rewriter does not decline rewrites it.  Otherwise as
    :func:`rewrite_call`, which is ``apply_rules([Rule(pattern, rewriter)], ...)``.

    Parameters
    ----------
    rules : Sequence[Rule]
        The rules, in order of preference.
    target : Union[relax.Function, tvm.IRModule]
        As for :func:`rewrite_call`.
    max_iterations, report, dry_run, cleanup
        As for :func:`rewrite_call`.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        As for :func:`rewrite_call`.
    """
    rules = _as_rules(rules)
    result = _driver.apply(rules, target, max_iterations, report, cleanup)
    return target if dry_run else result


def _as_rules(rules: Sequence[Rule]) -> list[Rule]:
    rules = list(rules)
    for rule in rules:
        if not isinstance(rule, Rule):
            raise TypeError(f"rules must be rewrite_ext.Rule objects, got {type(rule).__name__}")
    return rules


def RewriteRules(  # noqa: N802 - TVM names passes in CamelCase
    rules: Sequence[Rule],
    *,
    name: str | None = None,
    max_iterations: int = 10,
    report: RewriteReport | None = None,
    cleanup: bool = False,
) -> tvm.ir.transform.Pass:
    """A module pass applying :func:`apply_rules` to every Relax function.

    Parameters
    ----------
    rules : Sequence[Rule]
        As for :func:`apply_rules`.
    name : Optional[str]
        The pass name (default ``"RewriteRules"``), as shown by pass
        instrumentation and ``PassContext`` options.
    max_iterations, report, cleanup
        As for :func:`rewrite_call`; ``report`` accumulates over every run
        of the pass.

    Returns
    -------
    pass : tvm.ir.transform.Pass
        A module-level pass, composable in ``tvm.transform.Sequential``.
        A failure raises :class:`RewriteError` through TVM's pass
        infrastructure with its type and message intact; a
        ``KeyboardInterrupt`` or ``SystemExit`` raised in a rewriter comes
        out as itself.
    """
    rules = _as_rules(rules)  # fail at construction, not at the first run

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        try:
            return apply_rules(rules, mod, max_iterations=max_iterations, report=report, cleanup=cleanup)
        except BaseException as exc:
            remember(exc)
            raise

    return tvm.ir.transform.module_pass(transform, opt_level=0, name=name or "RewriteRules")


def RewriteCall(  # noqa: N802 - TVM names passes in CamelCase
    pattern: DFPattern,
    rewriter: Rewriter,
    *,
    name: str | None = None,
    max_iterations: int = 10,
    report: RewriteReport | None = None,
    cleanup: bool = False,
) -> tvm.ir.transform.Pass:
    """A module pass applying :func:`rewrite_call` to every Relax function.

    Parameters
    ----------
    pattern : DFPattern
        The pattern to match.
    rewriter : Callable
        As for :func:`rewrite_call`.
    name : Optional[str]
        The pass name (default ``"RewriteCall"``).
    max_iterations, report, cleanup
        As for :func:`RewriteRules`.

    Returns
    -------
    pass : tvm.ir.transform.Pass
        As for :func:`RewriteRules`.
    """
    return RewriteRules(
        [Rule(pattern, rewriter)],
        name=name or "RewriteCall",
        max_iterations=max_iterations,
        report=report,
        cleanup=cleanup,
    )
