"""Small stateless helpers over Relax IR used by the rewriting driver."""

from __future__ import annotations

from collections.abc import Iterable

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


def is_void(ty: object) -> bool:
    """Whether ``ty`` is the empty tuple type ``R.Tuple()``, the type of a void call."""
    return isinstance(ty, relax.TupleType) and len(ty.fields) == 0


def var_name(var: relax.Var) -> str:
    """A var's name: ``Var.name`` in TVM 0.27, ``Var.name_hint`` before."""
    name = getattr(var, "name_hint", None)
    return str(name if name is not None else var.name)


def static_nbytes(ty: object) -> int | None:
    """The bytes of a tensor type of static shape and dtype (runtime rounding), else None."""
    if not isinstance(ty, relax.TensorType) or ty.dtype is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    count = 1
    for dim in ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        count *= int(dim)
    dtype = ty.dtype.dtype  # TensorType.dtype is a PrimType; its .dtype has bits and lanes
    return count * ((dtype.bits * dtype.lanes + 7) // 8)


def used_vars(expr: relax.Expr) -> set[relax.Var]:
    """The set of vars that ``expr`` reads anywhere (definitions do not count)."""
    return set(relax.analysis.used_vars(expr))


def function_name(func: relax.Function, default: str = "<anonymous function>") -> str:
    """The function's ``global_symbol``, or ``default`` when it has none."""
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return default


@mutator
class _BindingDropper(PyExprMutator):
    """Re-emits every binding except those whose var is in ``dead``."""

    def __init__(self, dead: set[relax.Var]) -> None:
        super().__init__()
        self.dead = dead

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.dead:
            super().visit_var_binding_(binding)


def drop_unused_bindings(func: relax.Function, candidates: Iterable[relax.Var]) -> relax.Function:
    """Remove the bindings of ``candidates`` that nothing reads any more.

    Dropping one binding can make another candidate unused (a chain of
    interior bindings), so this repeats until nothing more can go.  Only
    the candidates are considered: every other binding stays, used or not.
    """
    remaining = set(candidates)
    while remaining:
        dead = remaining - used_vars(func)
        if not dead:
            break
        func = _BindingDropper(dead).visit_expr(func)
        remaining -= dead
    return func
