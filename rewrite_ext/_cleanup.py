"""TVM's cleanups between rewriting passes, for ``cleanup=True``.

TVM's ``rewrite_call`` canonicalizes bindings, eliminates common
subexpressions and removes unused bindings after each pass, until they
change nothing.  The same passes run here, with one difference: a void or
impure binding is never removed, since it is there for its effect.

* ``CanonicalizeBindings`` only removes trivial ``y = x`` aliases, whose
  effect is the one of the binding of ``x``.
* ``EliminateCommonSubexpr`` leaves impure calls alone, but replaces the
  second of two equal *pure* void calls (``R.call_pure_packed(...,
  ty_args=R.Tuple())``) by the first's var or by ``R.tuple()``: such a
  binding gets its value back.
* Unused bindings are removed only when pure, not void and not a
  ``match_cast`` (TVM's ``remove_all_unused`` also removes unused void bindings).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _ir
from .compat import ty

__all__ = ["cleanup"]

_CANONICALIZE = relax.transform.CanonicalizeBindings()
_CSE = relax.transform.EliminateCommonSubexpr()
_TARGET = tvm.ir.GlobalVar("cleanup_target")


def cleanup(func: relax.Function) -> relax.Function:
    """``func`` after TVM's cleanups, repeated until they change nothing.

    Parameters
    ----------
    func : relax.Function
        A well-formed function, as a rewriting pass leaves it.

    Returns
    -------
    func : relax.Function
        The function canonicalized, with common subexpressions merged and
        unused pure, non-void bindings removed; every void or impure binding
        of ``func`` is still there.
    """
    while True:
        start = func
        func = _through_module(_CANONICALIZE, func)
        func = _cse_keeping_void(func)
        func = _remove_unused(func)
        if tvm_ffi.structural_equal(start, func):
            return func


def _through_module(transform: tvm.transform.Pass, func: relax.Function) -> relax.Function:
    # The passes are module passes; only this function is handed over, so functions the
    # rewrite did not change are not touched.
    return transform(tvm.IRModule({_TARGET: func}))[_TARGET]


def _cse_keeping_void(func: relax.Function) -> relax.Function:
    """CSE, then the value of every void binding it changed put back."""
    void = {
        b.var: b.value
        for b in _ir.all_bindings(func)
        if type(b) is relax.VarBinding and _ir.is_void(ty(b.var)) and not isinstance(b.value, relax.Var)
    }
    merged = _through_module(_CSE, func)
    if not void:
        return merged
    # CSE gives a repeated void value as the earlier var, or as R.tuple() (the void value
    # itself); either way the call, and what it does, would be gone.
    changed = {
        b.var: void[b.var]
        for b in _ir.all_bindings(merged)
        if b.var in void
        and not b.value.same_as(void[b.var])
        and not tvm_ffi.structural_equal(b.value, void[b.var])
    }
    return _Restore(changed).visit_expr(merged) if changed else merged


@mutator
class _Restore(PyExprMutator):
    """Give each binding of ``values`` its value back."""

    def __init__(self, values: dict[relax.Var, relax.Expr]) -> None:
        super().__init__()
        self.values = values

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.values.get(binding.var)
        if value is None:
            super().visit_var_binding_(binding)
        else:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def _remove_unused(func: relax.Function) -> relax.Function:
    """Unused bindings removed, except impure ones (as TVM's ``remove_all_unused``) and void ones."""
    # A match_cast stays: it checks at run time, and may define symbolic vars used elsewhere.
    removable = [
        binding.var
        for binding in _ir.all_bindings(func)
        if type(binding) is relax.VarBinding
        and not _ir.is_void(ty(binding.var))
        and not _ir.is_impure(binding.value)
    ]
    return _ir.drop_unused_bindings(func, removable) if removable else func
