"""TVM's cleanups between rewriting passes, for ``cleanup=True``.

TVM's ``rewrite_call`` canonicalizes bindings, eliminates common
subexpressions and removes unused bindings after each pass, until they
change nothing.  The same passes run here, with one difference: a void or
impure binding is never removed, since it is there for its effect.

* ``CanonicalizeBindings`` only removes trivial ``y = x`` aliases, whose
  effect is the one of the binding of ``x``.
* Common subexpressions are merged as TVM's ``EliminateCommonSubexpr``
  merges them, except across an impure binding (TVM's merges a pure value
  computed before ``R.vm.copy_tensor(x, a)`` with the same expression after
  it, although the copy may have changed what it reads) and except void
  values (TVM's replaces the second of two equal pure void calls by the
  first's var, and the call is gone).
* Unused bindings are removed only when pure, not void and not a
  ``match_cast`` (TVM's ``remove_all_unused`` also removes unused void bindings).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _ir
from .compat import set_var_remap, ty

__all__ = ["cleanup"]

_CANONICALIZE = relax.transform.CanonicalizeBindings()
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
        func = _EliminateCommonSubexpr().visit_expr(func)
        func = _remove_unused(func)
        if tvm_ffi.structural_equal(start, func):
            return func


def _through_module(transform: tvm.transform.Pass, func: relax.Function) -> relax.Function:
    # The passes are module passes; only this function is handed over, so functions the
    # rewrite did not change are not touched.
    return transform(tvm.IRModule({_TARGET: func}))[_TARGET]


@mutator
class _EliminateCommonSubexpr(PyExprMutator):
    """TVM's ``EliminateCommonSubexpr`` with impure bindings as barriers.

    A later binding whose value equals an earlier one's becomes an alias of
    it (``CanonicalizeBindings`` and ``_remove_unused`` then drop it), as in
    TVM.  Unlike TVM's, nothing is merged across an impure binding, since
    memory it writes in place makes the same expression differ before and
    after it; void values, impure values, allocations and ``match_cast`` are
    never merged.  An If branch or a local function sees what its enclosing
    scope computed before it, and nothing it computes is seen outside it.
    """

    def __init__(self) -> None:
        super().__init__()
        # structural hash -> [(value, var)]: the values computed since the last barrier
        self.seen: dict[int, list[tuple[relax.Expr, relax.Var]]] = {}
        # the dataflow vars of the dataflow block being visited: the only ones in scope
        self.dataflow_vars: set[relax.Var] = set()

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        try:
            return super().visit_dataflow_block_(block)
        finally:
            self.dataflow_vars.clear()

    def visit_seq_expr_(self, seq: relax.SeqExpr) -> relax.Expr:
        # an If branch or a function body: what it computes stays in it
        outer = {key: list(entries) for key, entries in self.seen.items()}
        try:
            return super().visit_seq_expr_(seq)
        finally:
            self.seen = outer

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        var = binding.var
        if _ir.is_impure(value):
            self.seen.clear()
        elif not isinstance(value, relax.Var) and not _ir.is_void(ty(var)) and not _is_allocation(value):
            key = tvm_ffi.structural_hash(value)
            entries = self.seen.setdefault(key, [])
            for earlier_value, earlier in entries:
                if self._in_scope(earlier) and tvm_ffi.structural_equal(value, earlier_value):
                    # a block's output var stays the name its later uses know it by
                    if isinstance(var, relax.DataflowVar) or not isinstance(earlier, relax.DataflowVar):
                        set_var_remap(self, var, earlier)
                    self.builder_.emit_normalized(relax.VarBinding(var, earlier))
                    return
            entries.append((value, var))
            if isinstance(var, relax.DataflowVar):
                self.dataflow_vars.add(var)
        self.builder_.emit_normalized(relax.VarBinding(var, value))

    def _in_scope(self, var: relax.Var) -> bool:
        # a dataflow var is visible only in the dataflow block that binds it
        return not isinstance(var, relax.DataflowVar) or var in self.dataflow_vars


def _is_allocation(value: relax.Expr) -> bool:
    # TVM's CSE skips allocators too: two equal allocations are two buffers
    return (
        type(value) is relax.Call
        and isinstance(value.op, tvm.ir.Op)
        and bool(value.op.get_attr("TAllocator"))
    )


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
