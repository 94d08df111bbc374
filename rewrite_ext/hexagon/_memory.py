"""Where a tensor's bytes are, and which of them a kernel writes, as far as the IR shows it.

``copy_to_dma`` asks it whether a copy's src and dst are the same bytes
(the engine's result is undefined for overlapping buffers); ``stage_in_vtcm``
whether a kernel's input shares bytes with what the kernel writes (a VTCM
copy of it would not see those writes).  What is known: aliases (``b = a``,
a ``match_cast``, ``t[i]`` of a tuple bound here), ``alloc_tensor`` s of one
storage at static offsets and ``R.memory.view`` s.  Tensors of different
storages, and parameters, are taken to be apart, as the engine takes them.

``lookup`` gives the value a var is bound to (None if unknown): the
builder's ``lookup_binding`` during a rewrite, a dict's ``get`` otherwise.

``written_params`` tells ``stage_in_vtcm`` which arguments it must not stage
and the overlap schedule which a kernel call may write.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import tvm
from tvm import relax

from .. import _ir
from ..compat import imm_value, sblock_written_params

Lookup = Callable[[relax.Var], "relax.Expr | None"]

ALLOC_TENSOR = frozenset({"relax.vm.alloc_tensor", "relax.memory.alloc_tensor"})
VARS = frozenset({relax.Var, relax.DataflowVar})


def op_name(value: relax.Expr | None) -> str | None:
    """The name of the op ``value`` calls, if it is a call of an op."""
    if type(value) is relax.Call and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def view_offset(args: list) -> int | None:
    """The byte offset of ``R.memory.view(tensor, shape, dtype, offset)``, its args read; 0
    when not given, None when not static."""
    if len(args) > 3 and not (isinstance(args[3], relax.Tuple) and len(args[3].fields) == 0):
        return imm_value(args[3])
    return 0


def bound(lookup: Lookup, expr: relax.Expr) -> tuple[relax.Expr, relax.Expr | None]:
    """``expr`` seen through aliases: the last var and the value it is bound to, if known."""
    for _ in range(64):  # (an alias chain; this bounds the walk)
        if type(expr) is relax.TupleGetItem:
            _, tup = bound(lookup, expr.tuple_value)
            if type(tup) is not relax.Tuple:
                return expr, None
            expr = tup.fields[expr.index]
            continue
        if type(expr) not in VARS:
            break
        value = lookup(expr)
        if type(value) not in VARS and type(value) is not relax.TupleGetItem:
            return expr, value
        expr = value
    return expr, None


def where(lookup: Lookup, tensor: relax.Expr, value: relax.Expr | None) -> tuple[relax.Expr, int | None]:
    """The memory ``tensor`` (bound to ``value``) starts at: a storage and the byte offset of an
    ``alloc_tensor`` in it, what a ``R.memory.view`` views and the view's offset, else the
    tensor itself at 0.  The offset is None where it is not static."""
    name = op_name(value)
    if name in ALLOC_TENSOR:
        args = _ir.elements(value.args)
        return bound(lookup, args[0])[0], imm_value(args[1])
    if name == "relax.memory.view":
        args = _ir.elements(value.args)
        base, at = where(lookup, *bound(lookup, args[0]))
        offset = view_offset(args)
        return base, None if at is None or offset is None else at + offset
    return tensor, 0


def shared_bytes(
    lookup: Lookup, a: relax.Expr, a_nbytes: int, b: relax.Expr, b_nbytes: int
) -> Literal["same", "partly"] | None:
    """Whether tensors ``a`` and ``b`` are provably the "same" bytes, may share "partly" some,
    or are apart (None).  At offsets that are not static, they may share bytes."""
    a, a_value = bound(lookup, a)
    b, b_value = bound(lookup, b)
    if a.same_as(b):
        return "same" if a_nbytes == b_nbytes else "partly"
    a_op, b_op = op_name(a_value), op_name(b_value)
    if a_op != "relax.memory.view" and b_op != "relax.memory.view" and (
        a_op not in ALLOC_TENSOR or b_op not in ALLOC_TENSOR
    ):
        return None  # (the common case: an allocation, and a parameter or what a kernel wrote)
    (a_base, a_at), (b_base, b_at) = where(lookup, a, a_value), where(lookup, b, b_value)
    if not a_base.same_as(b_base):
        return None
    if a_at is None or b_at is None:
        return "partly"
    if a_at == b_at and a_nbytes == b_nbytes:
        return "same"  # one offset of one piece of memory, as many bytes
    return "partly" if a_at < b_at + b_nbytes and b_at < a_at + a_nbytes else None


@functools.lru_cache(maxsize=1024)  # a model calls each kernel many times
def written_params(func: tvm.tirx.PrimFunc) -> frozenset[int]:
    """The indices of the PrimFunc parameters it may write (all, when it cannot tell)."""
    written = sblock_written_params(func)
    return frozenset(range(len(func.params)) if written is None else written)
