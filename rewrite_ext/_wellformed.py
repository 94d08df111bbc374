"""Is the rewritten IR well formed?  A local check per match, TVM's check when it cannot tell.

``relax.analysis.well_formed`` costs 85-110 us per binding on VM-level IR,
more than the whole rewrite, so it runs only when the local check cannot
vouch for a result.  The local check looks at each binding a match added:
every var it reads must be one the match could read where the binding
stands (read by the matched value, defined by a binding the match saw or
emitted, a parameter, or bound earlier in the same block), and every var
it defines must be new.  A var it cannot account for (bound in an outer
block, say) is a suspect: TVM's full check then decides, and its verdict is
reported against the first suspect's binding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm import relax

from . import _ir

# Values that may read vars below them; anything else without a var in it is a plain leaf
# (constants, prim values, strings, shapes, extern funcs, ops: their classes move between
# TVM versions, these do not).
_NESTED = {relax.Call, relax.If, relax.SeqExpr, relax.Function, relax.TupleGetItem}


@dataclass
class Suspect:
    """A var a new binding reads that the local check could not account for."""

    function: str
    binding: str
    rule: str
    var: str


@dataclass
class LocalCheck:
    """The well-formedness verdict of one rewrite, built match by match.

    The traversal reports what each match's new bindings read to
    :meth:`check_reads` (it checks itself that the vars they define are new)
    and anything else only TVM can judge to :meth:`defer`; the driver runs
    TVM's full check when :attr:`vouches` is False.
    """

    global_vars: set[int] | None
    """Hashes of the module's GlobalVars (None for a lone function: not checked)."""
    suspects: list[Suspect] = field(default_factory=list)
    full_check_reasons: list[str] = field(default_factory=list)
    """Why the local check cannot vouch, besides suspects (a raw emit, a GlobalVar the module lacks)."""

    @property
    def vouches(self) -> bool:
        return not self.suspects and not self.full_check_reasons

    def defer(self, reason: str) -> None:
        """Leave the verdict to TVM's full check."""
        if len(self.full_check_reasons) < 10:
            self.full_check_reasons.append(reason)

    def check_reads(
        self,
        value: relax.Expr,
        is_known: Callable[[relax.Var], bool],
        where: tuple[str, relax.Binding, str],
    ) -> None:
        """Note every var ``value`` reads that ``is_known`` cannot account for.

        ``where`` is (function, the matched binding, the pattern's description).
        """
        function, binding, rule = where
        for var in reads(value, self.global_vars):
            if var is None:
                self.defer(f"binding '{_ir.var_name(binding.var)}' reads a GlobalVar the module lacks")
            elif not is_known(var):
                self.suspects.append(Suspect(function, _ir.var_name(binding.var), rule, _ir.var_name(var)))


def reads(value: relax.Expr, global_vars: set[int] | None) -> list[relax.Var | None]:
    """The vars ``value`` reads; None for each GlobalVar that is not in ``global_vars``.

    A normalized call's arguments are leaves or tuples of leaves, read here
    without a walk in C++; anything else asks TVM.  Classes are compared
    exactly: ``isinstance`` against TVM's classes goes through ABCMeta.
    """
    found: list[relax.Var | None] = []
    cls = type(value)
    if cls is relax.Call:
        stack = [value.op, *_ir.elements(value.args)]
    elif cls is relax.Tuple or cls in _VAR_CLASSES:
        stack = [value]
    else:
        stack = None
    while stack:
        expr = stack.pop()
        cls = type(expr)
        if cls in _VAR_CLASSES:
            found.append(expr)
        elif cls is relax.Tuple:
            stack.extend(_ir.elements(expr.fields))
        elif cls is relax.GlobalVar:
            if global_vars is not None and hash(expr) not in global_vars:
                found.append(None)
        elif cls in _NESTED:
            stack = None  # something nested: let TVM list what it reads
    if stack is not None:
        return found
    found = [v for v in relax.analysis.free_vars(value) if type(v) in _VAR_CLASSES]
    if global_vars is not None:
        found.extend(None for gv in relax.analysis.all_global_vars(value) if hash(gv) not in global_vars)
    return found


_VAR_CLASSES = {relax.Var, relax.DataflowVar}


def full_check(obj: relax.Function | tvm.IRModule) -> str | None:
    """TVM's verdict: None when ``obj`` is well formed, else TVM's message."""
    try:
        verdict = relax.analysis.well_formed(obj)
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        return str(exc)
    # TVM 0.27 returns None and raises; earlier versions return a bool.
    return "relax.analysis.well_formed returned False" if verdict is False else None
