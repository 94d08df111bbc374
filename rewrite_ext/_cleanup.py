"""TVM's cleanups between rewriting passes, for ``cleanup=True``.

TVM's ``rewrite_call`` canonicalizes bindings, eliminates common
subexpressions and removes unused bindings after each pass.  The same
passes run here, except that a void or impure binding is never removed:
it is there for its effect.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprVisitor, visitor

from . import _ir

_CANONICALIZE = relax.transform.CanonicalizeBindings()
_CSE = relax.transform.EliminateCommonSubexpr()


def cleanup(func: relax.Function) -> relax.Function:
    """``func`` after TVM's cleanups, repeated until they change nothing."""
    while True:
        start = func
        func = _through_module(_CANONICALIZE, func)
        func = _through_module(_CSE, func)
        func = _remove_unused(func)
        if tvm_ffi.structural_equal(start, func):
            return func


def _through_module(transform: tvm.transform.Pass, func: relax.Function) -> relax.Function:
    gvar = tvm.ir.GlobalVar("cleanup_target")
    return transform(tvm.IRModule({gvar: func}))[gvar]


def _remove_unused(func: relax.Function) -> relax.Function:
    """Unused bindings removed, except impure ones (as TVM's ``remove_all_unused``) and void ones."""
    removable = [
        binding.var
        for binding in _bindings(func)
        if not _ir.is_void(binding.var.ty) and not _ir.is_impure(binding.value)
    ]
    return _ir.drop_unused_bindings(func, removable) if removable else func


def _bindings(func: relax.Function) -> list[relax.Binding]:
    found: list[relax.Binding] = []

    @visitor
    class Collect(PyExprVisitor):
        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            found.append(binding)
            super().visit_var_binding_(binding)

    Collect().visit_expr(func)
    return found
