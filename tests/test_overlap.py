"""sink_dma_waits: exact IR for every rule, the report, and runs under cpu_dma().

The IR cases write the DMA builtins through the small helpers ``dma_copy`` /
``dma_wait`` / ``legacy_wait`` below, which TVMScript calls like any other
function returning a Relax call: ``dma_copy(x, a)`` is
``R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext  # noqa: F401 - registers R.vm.copy_tensor
from rewrite_ext import _ir
from rewrite_ext.hexagon import DMA_COPY, DMA_WAIT, copy_to_dma, cpu_dma
from rewrite_ext.hexagon.overlap import (
    TransferOverlap,
    format_overlap_report,
    overlap_report,
    sink_dma_waits,
)
from rewrite_ext.ops import copy_tensor
from rewrite_ext.testing.strategies import lowered_copy_functions
from rewrite_ext.compat import TY_ARGS, VOID_TY_ARGS, ObjectType, TensorType, dtype_name, imm, imm_value, ty, var_name, TupleType

# ---------------------------------------------------------------------------------------------
# Writing DMA builtins in TVMScript
# ---------------------------------------------------------------------------------------------


def dma_copy(src: relax.Expr, dst: relax.Expr, queue: int = 0, bypass: int = 1) -> relax.Call:
    return relax.op.call_builtin_with_ctx(DMA_COPY, [src, dst, imm(queue), imm(bypass)], **VOID_TY_ARGS)


def dma_wait(src: relax.Expr, dst: relax.Expr, queue: int = 0, inflight: int = 0, bypass: int = 1) -> relax.Call:
    return relax.op.call_builtin_with_ctx(DMA_WAIT, [imm(queue), imm(inflight), imm(bypass), src, dst], **VOID_TY_ARGS)


def legacy_wait(queue: int = 0) -> relax.Call:
    return relax.op.call_builtin_with_ctx(DMA_WAIT, [imm(queue), imm(0)], **VOID_TY_ARGS)


def _alloc(storage: relax.Expr, offset: int | tvm.ir.PrimExpr, n: int = 16) -> relax.Call:
    """``R.vm.alloc_tensor(storage, offset, R.shape([n]), "float32")``: ``4 * n`` bytes."""
    return relax.op.vm.alloc_tensor(storage, imm(offset), relax.ShapeExpr([n]), "float32")


def _storage(nbytes: int = 1024) -> relax.Call:
    return relax.op.vm.alloc_storage(relax.ShapeExpr([nbytes]), 0, "uint8", "global")


def _snapshot(obj) -> tuple[int, str]:
    return tvm_ffi.structural_hash(obj), obj.script(show_meta=False)


def assert_sinks_to(before: relax.Function, expected: relax.Function) -> relax.Function:
    """sink_dma_waits(before) is exactly ``expected``, well formed, idempotent; input untouched."""
    snapshot = _snapshot(before)
    got = sink_dma_waits(before)
    relax.analysis.well_formed(got)
    # The expected function is parsed under another name; compare everything else.
    tvm.ir.assert_structural_equal(got, expected.with_attr("global_symbol", before.attrs["global_symbol"]))
    assert _snapshot(before) == snapshot, "the input changed"
    assert sink_dma_waits(got).same_as(got), "a second application changed the IR"
    return got


def assert_unchanged(before: relax.Function) -> None:
    assert sink_dma_waits(before).same_as(before)


def waits(func: relax.Function) -> list[relax.VarBinding]:
    return [b for blk in func.body.blocks for b in blk.bindings if _builtin(b) == DMA_WAIT]


def _builtin(binding: relax.Binding) -> str | None:
    value = binding.value
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        if value.op.name == "relax.call_builtin_with_ctx":
            return str(value.args[0].global_symbol)
    return None


# ---------------------------------------------------------------------------------------------
# Inflight arithmetic and order
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def two_copies(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    b = _alloc(storage, 64)
    dma_copy(y, b)
    dma_wait(y, b)
    c = R.add(x, y)
    d = R.add(a, c)
    e = R.add(b, d)
    return e


@R.function(pure=False)
def two_copies_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    b = _alloc(storage, 64)
    dma_copy(y, b)
    c = R.add(x, y)
    dma_wait(x, a, inflight=1)  # b's transfer, issued later, may stay in flight
    d = R.add(a, c)
    dma_wait(y, b)
    e = R.add(b, d)
    return e


def test_copy_a_copy_b_use_of_a_waits_for_a_with_one_in_flight():
    got = assert_sinks_to(two_copies, two_copies_sunk)
    # The wait bindings keep their vars (unused R.Tuple() vars).
    kept = [new.var.same_as(old.var) for new, old in zip(waits(got), waits(two_copies), strict=True)]
    assert kept == [True, True]


@R.function(pure=False)
def three_unused(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    e = _alloc(storage, 128)
    dma_copy(x, a)
    dma_wait(x, a)
    dma_copy(x, b)
    dma_wait(x, b)
    dma_copy(x, e)
    dma_wait(x, e)
    c = R.add(x, x)
    return c


@R.function(pure=False)
def three_unused_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)  # each copy starts right after what defines its dst
    b = _alloc(storage, 64)
    dma_copy(x, b)  # reading x, the first transfer's src, is no conflict
    e = _alloc(storage, 128)
    dma_copy(x, e)
    c = R.add(x, x)
    dma_wait(x, a, inflight=2)  # all land at the block's end, in issue order
    dma_wait(x, b, inflight=1)
    dma_wait(x, e, inflight=0)
    return c


def test_waits_landing_together_come_in_issue_order_with_decreasing_inflight():
    assert_sinks_to(three_unused, three_unused_sunk)


@R.function(pure=False)
def two_used_at_one_point(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    e = _alloc(storage, 128)
    dma_copy(x, a, bypass=0)
    dma_wait(x, a, bypass=0)
    dma_copy(x, b, bypass=0)
    dma_wait(x, b, bypass=0)
    dma_copy(x, e, bypass=0)
    dma_wait(x, e, bypass=0)
    c = R.add(a, b)
    d = R.add(c, e)
    return d


@R.function(pure=False)
def two_used_at_one_point_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a, bypass=0)
    b = _alloc(storage, 64)
    dma_copy(x, b, bypass=0)
    e = _alloc(storage, 128)
    dma_copy(x, e, bypass=0)
    # b's wait completes a's transfer too (FIFO); a's own wait is merged into it, as x (a
    # parameter) and a (used by the add) stay alive past it anyway.
    dma_wait(x, b, inflight=1, bypass=0)  # e's transfer overlaps the first add
    c = R.add(a, b)
    dma_wait(x, e, bypass=0)
    d = R.add(c, e)
    return d


# The merging tests use bypass_cache=0: with it, the real dma_wait flushes its own dst's cache
# after waiting, so a wait that cleans a dst is never merged into another one.
def test_several_waits_at_one_point_count_only_later_transfers_still_in_flight():
    assert_sinks_to(two_used_at_one_point, two_used_at_one_point_sunk)


def test_a_wait_that_cleans_its_dsts_cache_is_never_merged():
    @R.function(pure=False)
    def cached(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage = _storage()
        a = _alloc(storage, 0)
        b = _alloc(storage, 64)
        dma_copy(x, a)
        dma_wait(x, a)
        dma_copy(x, b)
        dma_wait(x, b)
        c = R.add(a, b)
        return c

    got = sink_dma_waits(cached)
    relax.analysis.well_formed(got)
    # a's wait stays, right before b's: both dsts get the real wait's cache flush.
    assert _bindings_in_order(got) == [
        "storage", "a", "copy(x->a)", "b", "copy(x->b)", "wait(x->a, 1)", "wait(x->b, 0)", "c"
    ]


@R.function(pure=False)
def later_used_first(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a, bypass=0)
    dma_wait(x, a, bypass=0)
    dma_copy(y, b, bypass=0)
    dma_wait(y, b, bypass=0)
    c = R.add(b, b)
    d = R.add(a, c)
    return d


@R.function(pure=False)
def later_used_first_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a, bypass=0)
    b = _alloc(storage, 64)
    dma_copy(y, b, bypass=0)
    # b's wait must come before c and completes a's transfer too (FIFO), so a's wait never
    # moves below it; here it merges into it, since x and a stay alive past it anyway.
    dma_wait(y, b, bypass=0)
    c = R.add(b, b)
    d = R.add(a, c)
    return d


def test_a_wait_never_moves_below_a_later_wait_of_its_queue():
    assert_sinks_to(later_used_first, later_used_first_sunk)


@R.function(pure=False)
def later_used_first_two_queues(
    x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")
) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a, queue=0)
    dma_wait(x, a, queue=0)
    dma_copy(y, b, queue=1)
    dma_wait(y, b, queue=1)
    c = R.add(b, b)
    d = R.add(a, c)
    return d


@R.function(pure=False)
def later_used_first_two_queues_sunk(
    x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")
) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a, queue=0)
    b = _alloc(storage, 64)
    dma_copy(y, b, queue=1)
    dma_wait(y, b, queue=1)  # another queue: a's transfer keeps running
    c = R.add(b, b)
    dma_wait(x, a, queue=0)
    d = R.add(a, c)
    return d


def test_waits_of_different_queues_move_independently():
    assert_sinks_to(later_used_first_two_queues, later_used_first_two_queues_sunk)


@R.function(pure=False)
def round_robin(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    e = _alloc(storage, 128)
    f = _alloc(storage, 192)
    dma_copy(x, a, queue=0)
    dma_wait(x, a, queue=0)
    dma_copy(y, b, queue=1)
    dma_wait(y, b, queue=1)
    dma_copy(x, e, queue=0)
    dma_wait(x, e, queue=0)
    dma_copy(y, f, queue=1)
    dma_wait(y, f, queue=1)
    g = R.add(a, b)
    h = R.add(e, f)
    k = R.add(g, h)
    return k


@R.function(pure=False)
def round_robin_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a, queue=0)
    b = _alloc(storage, 64)
    dma_copy(y, b, queue=1)
    e = _alloc(storage, 128)
    dma_copy(x, e, queue=0)
    f = _alloc(storage, 192)
    dma_copy(y, f, queue=1)
    dma_wait(x, a, queue=0, inflight=1)  # e is in flight behind a on queue 0
    dma_wait(y, b, queue=1, inflight=1)  # f is in flight behind b on queue 1
    g = R.add(a, b)
    dma_wait(x, e, queue=0)
    dma_wait(y, f, queue=1)
    h = R.add(e, f)
    k = R.add(g, h)
    return k


def test_two_queues_count_inflight_per_queue():
    assert_sinks_to(round_robin, round_robin_sunk)


# ---------------------------------------------------------------------------------------------
# Aliasing through storages and views
# ---------------------------------------------------------------------------------------------


def _reader_at(offset: int | str):
    """A function copying x into a = storage[0:64) and reading h = storage[offset:offset+64)."""
    if offset == "symbolic":

        @R.function(pure=False)
        def func(x: R.Tensor((16,), "float32"), s: R.Shape(["n"])) -> R.Tensor((16,), "float32"):
            n = T.int64()
            storage = _storage()
            a = _alloc(storage, 0)
            h = _alloc(storage, n)
            dma_copy(x, a)
            dma_wait(x, a)
            c = R.add(x, x)
            d = R.add(h, c)
            return d

        return func

    @R.function(pure=False)
    def func(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage = _storage()
        a = _alloc(storage, 0)
        h = _alloc(storage, offset)
        dma_copy(x, a)
        dma_wait(x, a)
        c = R.add(x, x)
        d = R.add(h, c)
        return d

    return func


def _bindings_in_order(func: relax.Function) -> list[str]:
    """Names of the block's bindings; DMA builtins as ``copy(src->dst)`` / ``wait(src->dst, n)``."""
    names = []
    for binding in func.body.blocks[0].bindings:
        builtin = _builtin(binding)
        if builtin is None:
            names.append(var_name(binding.var))
            continue
        fields = list(binding.value.args[1].fields)
        if builtin == DMA_COPY:
            names.append(f"copy({var_name(fields[0])}->{var_name(fields[1])})")
        else:
            names.append(f"wait({var_name(fields[3])}->{var_name(fields[4])}, {imm_value(fields[1])})")
    return names


@pytest.mark.parametrize(
    "offset, order",
    [
        (32, ["h", "c", "wait(x->a, 0)", "d"]),  # [32, 96) overlaps a = [0, 64)
        (0, ["h", "c", "wait(x->a, 0)", "d"]),  # the same bytes
        ("symbolic", ["h", "c", "wait(x->a, 0)", "d"]),  # not provably disjoint
        (64, ["h", "c", "d", "wait(x->a, 0)"]),  # [64, 128): disjoint, no conflict
    ],
    ids=["overlapping", "same-range", "symbolic-offset", "disjoint"],
)
def test_tensors_of_the_same_storage_conflict_unless_provably_disjoint(offset, order):
    got = sink_dma_waits(_reader_at(offset))
    relax.analysis.well_formed(got)
    assert _bindings_in_order(got)[:3] == ["storage", "a", "copy(x->a)"]  # starts once a exists
    assert _bindings_in_order(got)[3:] == order


def _view_reader(make_view):
    """Copy x into a, then read ``make_view(a)``, a view made before the copy."""

    @R.function(pure=False)
    def before(x: R.Tensor((16,), "float32")):
        storage = _storage()
        a = _alloc(storage, 0)
        v = make_view(a)
        dma_copy(x, a)
        dma_wait(x, a)
        c = R.add(x, x)
        d = R.add(v, v)
        return d

    @R.function(pure=False)
    def expected(x: R.Tensor((16,), "float32")):
        storage = _storage()
        a = _alloc(storage, 0)
        v = make_view(a)
        dma_copy(x, a)
        c = R.add(x, x)
        dma_wait(x, a)
        d = R.add(v, v)
        return d

    return before, expected


VIEWS = {
    "reshape": lambda a: relax.op.reshape(a, (4, 4)),
    "memory.view": lambda a: relax.op.memory.view(a, relax.ShapeExpr([4, 4])),
    "ensure_zero_offset": lambda a: relax.op.memory.ensure_zero_offset(a),
    "view-of-a-view": lambda a: relax.op.reshape(relax.op.memory.ensure_zero_offset(a), (4, 4)),
}


@pytest.mark.parametrize("make_view", VIEWS.values(), ids=VIEWS.keys())
def test_reading_a_view_of_dst_is_a_conflict(make_view):
    before, expected = _view_reader(make_view)
    assert_sinks_to(before, expected)


@R.function(pure=False)
def view_made_during_transfer(x: R.Tensor((16,), "float32")) -> R.Tensor((4, 4), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    v = R.reshape(a, R.shape([4, 4]))
    return v


@R.function(pure=False)
def view_made_during_transfer_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((4, 4), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    c = R.add(x, x)
    # A pure call reads its arguments: a reshape outside dataflow blocks is legalized to a
    # call_tir that copies, so making the view already reads dst.
    dma_wait(x, a)
    v = R.reshape(a, R.shape([4, 4]))
    return v


def test_making_a_view_of_dst_is_a_read():
    assert_sinks_to(view_made_during_transfer, view_made_during_transfer_sunk)


@R.function(pure=False)
def view_outside_dst(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    big = _alloc(storage, 0, n=64)  # bytes [0, 256)
    a = _alloc(storage, 256)  # bytes [256, 320)
    inside = R.memory.view(big, R.shape([16]), R.dtype("float32"), R.prim_value(192))  # [192, 256)
    dma_copy(x, a)
    dma_wait(x, a)
    d = R.add(inside, inside)
    return d


@R.function(pure=False)
def view_outside_dst_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    big = _alloc(storage, 0, n=64)
    a = _alloc(storage, 256)
    dma_copy(x, a)
    inside = R.memory.view(big, R.shape([16]), R.dtype("float32"), R.prim_value(192))
    d = R.add(inside, inside)
    dma_wait(x, a)
    return d


def test_a_memory_view_covers_only_its_own_bytes():
    assert_sinks_to(view_outside_dst, view_outside_dst_sunk)


# ---------------------------------------------------------------------------------------------
# Frees, Ifs, returns
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def frees(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    h = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    R.memory.kill_tensor(h)  # frees other bytes: no conflict
    R.vm.kill_object(storage)  # frees a's storage
    return c


@R.function(pure=False)
def frees_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    h = _alloc(storage, 64)
    c = R.add(x, x)
    R.memory.kill_tensor(h)
    dma_wait(x, a)
    R.vm.kill_object(storage)
    return c


def test_killing_the_storage_is_a_conflict_killing_other_bytes_is_not():
    assert_sinks_to(frees, frees_sunk)


@R.function(pure=False)
def kill_dst(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    R.memory.kill_tensor(a)
    return c


@R.function(pure=False)
def kill_dst_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    c = R.add(x, x)
    dma_wait(x, a)
    R.memory.kill_tensor(a)
    return c


def test_killing_dst_is_a_conflict():
    assert_sinks_to(kill_dst, kill_dst_sunk)


@R.function(pure=False)
def ifs(x: R.Tensor((16,), "float32"), cond: R.Prim("bool")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    if cond:  # touches only c: the wait moves past it
        p = R.multiply(c, c)
    else:
        p = R.negative(c)
    if cond:  # uses dst
        q = R.add(a, p)
    else:
        q = p
    return q


@R.function(pure=False)
def ifs_sunk(x: R.Tensor((16,), "float32"), cond: R.Prim("bool")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    c = R.add(x, x)
    if cond:
        p = R.multiply(c, c)
    else:
        p = R.negative(c)
    dma_wait(x, a)
    if cond:
        q = R.add(a, p)
    else:
        q = p
    return q


def test_an_if_using_dst_is_a_conflict_an_if_touching_none_is_not():
    assert_sinks_to(ifs, ifs_sunk)


@R.function(pure=False)
def copy_in_branch(x: R.Tensor((16,), "float32"), cond: R.Prim("bool")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    if cond:
        dma_copy(x, a)
        dma_wait(x, a)
        c = R.add(x, x)
        r = R.multiply(c, c)
    else:
        r = R.negative(x)
    d = R.add(a, r)
    return d


@R.function(pure=False)
def copy_in_branch_sunk(x: R.Tensor((16,), "float32"), cond: R.Prim("bool")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    if cond:
        dma_copy(x, a)
        c = R.add(x, x)
        r_then = R.multiply(c, c)
        dma_wait(x, a)  # the end of its own block (before the If's result): never out of it
        r = r_then
    else:
        r = R.negative(x)
    d = R.add(a, r)
    return d


def test_a_wait_in_a_branch_stays_in_its_branch():
    assert_sinks_to(copy_in_branch, copy_in_branch_sunk)


@R.function(pure=False)
def returns_dst(x: R.Tensor((16,), "float32")) -> R.Tuple(R.Tensor((16,), "float32"), R.Tensor((16,), "float32")):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    d = R.multiply(c, c)
    return (a, d)


@R.function(pure=False)
def returns_dst_sunk(
    x: R.Tensor((16,), "float32"),
) -> R.Tuple(R.Tensor((16,), "float32"), R.Tensor((16,), "float32")):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    c = R.add(x, x)
    d = R.multiply(c, c)
    dma_wait(x, a)  # the return reads a: the wait ends the last block
    return (a, d)


def test_returning_dst_waits_at_the_end_of_the_last_block():
    assert_sinks_to(returns_dst, returns_dst_sunk)


# ---------------------------------------------------------------------------------------------
# Reads and writes of calls
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def src_read_then_written(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)  # reads src
    dma_copy(x, b)  # reads src
    dma_wait(x, b)
    R.call_packed("fill_zero", x, **VOID_TY_ARGS)  # may write src
    return c


@R.function(pure=False)
def src_read_then_written_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    b = _alloc(storage, 64)
    dma_copy(x, b)  # starts before c: reading x is no conflict
    c = R.add(x, x)
    dma_wait(x, a, inflight=1)
    dma_wait(x, b)
    R.call_packed("fill_zero", x, **VOID_TY_ARGS)
    return c


def test_reading_src_is_no_conflict_writing_it_is():
    assert_sinks_to(src_read_then_written, src_read_then_written_sunk)


@R.function(pure=False)
def chained(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    b = _alloc(storage, 64)
    dma_copy(a, b)  # reads the first transfer's dst
    dma_wait(a, b)
    e = _alloc(storage, 128)
    dma_copy(x, e)
    dma_wait(x, e)
    dma_copy(x, e)  # writes the third transfer's dst again
    dma_wait(x, e)
    return b


@R.function(pure=False)
def chained_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    b = _alloc(storage, 64)
    dma_wait(x, a)
    dma_copy(a, b)
    e = _alloc(storage, 128)
    dma_copy(x, e)
    # The rewrite of e needs the third transfer done; the second one's wait could go to the
    # end but does not move below the third one's, which would complete it anyway (FIFO).
    dma_wait(a, b, inflight=1)
    dma_wait(x, e)
    dma_copy(x, e)
    dma_wait(x, e)
    return b


def test_another_copy_reading_or_rewriting_dst_is_a_conflict():
    assert_sinks_to(chained, chained_sunk)


@R.function(pure=False)
def parameters(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    scratch = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
    dma_copy(x, a)
    dma_wait(x, a)
    R.call_packed("tick", **VOID_TY_ARGS)  # no tensor arguments: touches none
    R.call_packed("scribble", scratch, **VOID_TY_ARGS)  # allocated here: not x, not a
    R.call_packed("scribble", y, **VOID_TY_ARGS)  # y may alias x, the src
    return a


@R.function(pure=False)
def parameters_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    scratch = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
    R.call_packed("tick", **VOID_TY_ARGS)
    R.call_packed("scribble", scratch, **VOID_TY_ARGS)
    dma_wait(x, a)
    R.call_packed("scribble", y, **VOID_TY_ARGS)
    return a


def test_a_parameter_may_alias_another_parameter_but_not_local_memory():
    assert_sinks_to(parameters, parameters_sunk)


@R.function(pure=False)
def packed_results(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    u = R.call_pure_packed("identity", a, **{TY_ARGS: R.Tensor((16,), "float32")})  # may be a
    dma_copy(x, a)
    dma_wait(x, a)
    t = R.call_packed("get_buffer", **{TY_ARGS: R.Tensor((16,), "float32")})  # may be x, never a
    c = R.add(t, t)
    d = R.add(u, c)
    R.call_packed("scribble", t, **VOID_TY_ARGS)
    return d


@R.function(pure=False)
def packed_results_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    u = R.call_pure_packed("identity", a, **{TY_ARGS: R.Tensor((16,), "float32")})
    dma_copy(x, a)
    t = R.call_packed("get_buffer", **{TY_ARGS: R.Tensor((16,), "float32")})
    c = R.add(t, t)
    dma_wait(x, a)
    d = R.add(u, c)
    R.call_packed("scribble", t, **VOID_TY_ARGS)
    return d


def test_packed_results_may_be_their_arguments_or_outside_memory():
    assert_sinks_to(packed_results, packed_results_sunk)


@R.function(pure=False)
def packed_result_written(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    dma_wait(x, a)
    t = R.call_packed("get_buffer", **{TY_ARGS: R.Tensor((16,), "float32")})
    R.call_packed("scribble", t, **VOID_TY_ARGS)  # t may be x: writes the src
    return a


@R.function(pure=False)
def packed_result_written_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    t = R.call_packed("get_buffer", **{TY_ARGS: R.Tensor((16,), "float32")})
    dma_wait(x, a)
    R.call_packed("scribble", t, **VOID_TY_ARGS)
    return a


def test_writing_outside_memory_may_write_a_parameter_src():
    assert_sinks_to(packed_result_written, packed_result_written_sunk)


@R.function(pure=False)
def closure(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)

    @R.function
    def read_a() -> R.Tensor((16,), "float32"):
        r = R.add(a, a)
        return r

    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    d = read_a()  # no arguments, but the closure captured a
    return d


@R.function(pure=False)
def closure_sunk(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)

    @R.function
    def read_a() -> R.Tensor((16,), "float32"):
        r = R.add(a, a)
        return r

    dma_copy(x, a)
    c = R.add(x, x)
    dma_wait(x, a)
    d = read_a()
    return d


def test_calling_a_closure_touches_what_it_captured():
    assert_sinks_to(closure, closure_sunk)


@I.ir_module
class DestinationPassing:
    @T.prim_func
    def add_one(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        for i in range(16):
            B[i] = A[i] + T.float32(1)

    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        cls = DestinationPassing
        storage = _storage()
        a = _alloc(storage, 0)
        s = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        t = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(x, s)
        R.vm.copy_tensor(s, a)
        cls.add_one(x, t)  # writes neither s nor a
        cls.add_one(x, s)  # overwrites s, the src of the copy into a
        d = R.add(a, s)
        return d


@I.ir_module
class DestinationPassingSunk:
    @T.prim_func
    def add_one(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        for i in range(16):
            B[i] = A[i] + T.float32(1)

    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        cls = DestinationPassingSunk
        storage = _storage()
        a = _alloc(storage, 0)
        s = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        dma_copy(x, s)
        t = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        dma_wait(x, s)  # the next copy reads s
        dma_copy(s, a)
        cls.add_one(x, t)
        dma_wait(s, a)
        cls.add_one(x, s)
        d = R.add(a, s)
        return d


def test_a_lowered_call_tir_may_write_every_argument():
    got = sink_dma_waits(copy_to_dma(DestinationPassing))
    relax.analysis.well_formed(got)
    tvm.ir.assert_structural_equal(got, DestinationPassingSunk)


# ---------------------------------------------------------------------------------------------
# What is left alone
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def with_legacy(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    dma_copy(y, b)
    legacy_wait()
    c = R.add(x, y)
    return c


@R.function(pure=False)
def with_legacy_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    b = _alloc(storage, 64)
    dma_wait(x, a)  # not below the legacy transfer of its queue, which stays as it was
    dma_copy(y, b)
    legacy_wait()
    c = R.add(x, y)
    return c


def test_legacy_waits_stay_next_to_their_copy_and_bound_other_waits():
    assert_sinks_to(with_legacy, with_legacy_sunk)


def test_all_legacy_output_of_copy_to_dma_is_unchanged():
    legacy = copy_to_dma(two_copies_original(), legacy_wait=True)["main"]
    assert_unchanged(legacy)
    # and copy_to_dma(overlap=True) gives the same: each copy with its legacy wait
    tvm.ir.assert_structural_equal(copy_to_dma(two_copies_original(), legacy_wait=True, overlap=True)["main"], legacy)


@R.function(pure=False)
def hand_pipelined(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_copy(y, b)
    dma_wait(x, a, inflight=1)
    c = R.add(x, y)
    dma_wait(y, b)
    return c


def _wait_var_used() -> relax.Function:
    # A void var's uses are normalized to R.tuple(), so the wait is typed R.Object here to
    # give it a var that can be used; moving it below that use would be ill-formed.
    x = relax.Var("x", TensorType([16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("wait_var_used", [x], pure=False):
        storage = bb.emit(_storage())
        a = bb.emit(_alloc(storage, 0))
        bb.emit(dma_copy(x, a))
        wait = dma_wait(x, a)
        done = bb.emit(relax.Call(wait.op, wait.args, wait.attrs, [ObjectType()]))
        c = bb.emit(relax.op.add(x, x))
        bb.emit_func_output(bb.emit(relax.Tuple([done, c])))
    func = bb.get()["wait_var_used"]
    assert func.body.blocks[0].bindings[3].var in _ir.used_vars(func)
    return func


wait_var_used = _wait_var_used()


@R.function(pure=False)
def no_dma(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    c = R.add(x, x)
    return c


@pytest.mark.parametrize(
    "func",
    [hand_pipelined, wait_var_used, no_dma, two_copies_sunk],
    ids=["already-pipelined", "wait-var-used", "no-dma", "already-sunk"],
)
def test_blocks_not_in_copy_then_wait_form_are_left_alone(func):
    assert_unchanged(func)


@I.ir_module
class CopyBesidePipelinedByHand:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        # One storage a tensor: CPU kernels refuse a tensor at a non-zero byte offset.
        sa, sb, sd = _storage(), _storage(), _storage()
        a = _alloc(sa, 0)
        b = _alloc(sb, 0)
        dma_copy(x, a)
        dma_copy(y, b)
        dma_wait(x, a, inflight=1)
        c = R.add(x, y)
        dma_wait(y, b)
        d = _alloc(sd, 0)
        R.vm.copy_tensor(c, d)
        e = R.add(d, a)
        f = R.add(e, b)
        return f


def test_copy_to_dma_overlap_on_a_block_left_alone_waits_right_after_each_copy():
    # The hand-made waits leave the block to its author: each new copy gets its wait at once.
    mod = CopyBesidePipelinedByHand
    got = copy_to_dma(mod, overlap=True)
    relax.analysis.well_formed(got)
    tvm.ir.assert_structural_equal(got, copy_to_dma(mod))
    bindings = got["main"].body.blocks[0].bindings
    assert [_builtin(b) for b in bindings[11:13]] == [DMA_COPY, DMA_WAIT]
    x, y = _inputs(mod["main"], seed=3)
    results, engine = _run(got, [x, y], dma=True)
    np.testing.assert_allclose(results[0], 2 * x + 2 * y, rtol=1e-6)
    assert engine.copies == engine.waits == 3


def two_copies_original() -> tvm.IRModule:
    @I.ir_module
    class Module:
        @R.function(pure=False)
        def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
            storage = _storage()
            a = _alloc(storage, 0)
            R.vm.copy_tensor(x, a)
            b = _alloc(storage, 64)
            R.vm.copy_tensor(y, b)
            c = R.add(x, y)
            az = R.memory.ensure_zero_offset(a)
            d = R.add(az, c)
            bz = R.memory.ensure_zero_offset(b)
            e = R.multiply(bz, d)
            return e

    return Module


def test_modules_come_back_as_new_modules_with_other_functions_kept():
    mod = copy_to_dma(DestinationPassing)
    mod["other"] = two_copies.with_attr("global_symbol", "other")
    snapshot = _snapshot(mod)
    got = sink_dma_waits(mod)
    assert isinstance(got, tvm.IRModule) and got is not mod
    assert _snapshot(mod) == snapshot
    assert got["add_one"].same_as(mod["add_one"])
    tvm.ir.assert_structural_equal(
        got["other"], two_copies_sunk.with_attr("global_symbol", "other"), map_free_vars=True
    )
    tvm.ir.assert_structural_equal(got["main"], DestinationPassingSunk["main"], map_free_vars=True)


def test_anything_else_is_a_type_error():
    with pytest.raises(TypeError, match="relax.Function or an IRModule"):
        sink_dma_waits(DestinationPassing["add_one"])
    with pytest.raises(TypeError, match="relax.Function or an IRModule"):
        overlap_report("main")


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def test_overlap_report_of_sunk_and_unsunk_ir():
    mod = tvm.IRModule({"main": round_robin.with_attr("global_symbol", "main")})
    before = overlap_report(mod)
    assert [(t.queue, t.src, t.dst, t.overlapped, t.inflight) for t in before] == [
        (0, "x", "a", 0, 0),
        (1, "y", "b", 0, 0),
        (0, "x", "e", 0, 0),
        (1, "y", "f", 0, 0),
    ]
    assert before[0].stopped_by == "the copy y -> b"  # a wait not moved: no reason to give
    assert overlap_report(sink_dma_waits(mod)) == [
        TransferOverlap("main", 0, "x", "a", 3, 1, starts_after=_AFTER_STORAGE, stopped_by=_reads("g"), kernels=0),
        TransferOverlap("main", 1, "y", "b", 2, 1, starts_after=_AFTER_STORAGE, stopped_by=_reads("g"), kernels=0),
        TransferOverlap("main", 0, "x", "e", 2, 0, starts_after=_AFTER_STORAGE, stopped_by=_reads("h"), kernels=0),
        TransferOverlap("main", 1, "y", "f", 1, 0, starts_after=_AFTER_STORAGE, stopped_by=_reads("h"), kernels=0),
    ]


# dst's allocation, just before its copy, moves with the transfer: not what stopped it.
_AFTER_STORAGE = "`storage = R.vm.alloc_storage` (defines dst's storage)"


def _reads(name: str) -> str:
    return f"`{name} = R.add` (reads dst)"


def test_format_overlap_report():
    report = overlap_report(sink_dma_waits(two_copies))
    assert format_overlap_report(report) == "\n".join(
        [
            "# DMA overlap: 2 dma_copy; 2 overlap other bindings, 4 bindings (not DMA builtins) in all; "
            "0 overlap a kernel call",
            "#   two_copies: x -> a on queue 0, 2 bindings overlapped, 0 kernel calls (wait inflight 1); "
            f"starts after {_AFTER_STORAGE}; waited before {_reads('d')}",
            "#   two_copies: y -> b on queue 0, 2 bindings overlapped, 0 kernel calls (wait inflight 0); "
            f"starts after {_AFTER_STORAGE}; waited before {_reads('e')}",
        ]
    )


@R.function(pure=False)
def kernel_reading_dst(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    out = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    c = R.add(x, x)
    k = R.call_packed("my.kernel", a, out)
    return out


def test_a_kernel_taking_dst_as_input_is_reported_as_reading_or_writing_it():
    # A packed call may write any argument it gets: both are possible, and the report says so.
    (transfer,) = overlap_report(sink_dma_waits(kernel_reading_dst))
    assert transfer.overlapped == 2  # out's allocation and c
    assert transfer.stopped_by == "`k = my.kernel` (reads or writes dst)"


def _copy_into_a_then(src_name: str, *calls: tuple[str, list]) -> tvm.IRModule:
    """``main(src)``: ``a`` and ``out`` in bytes 0-63 and 64-127 of one storage,
    ``copy_tensor(src, a)``, then a void packed call ``(symbol, args)`` for each of ``calls``,
    where an arg ``"a"`` or ``"out"`` is that tensor."""
    src = relax.Var(src_name, TensorType((16,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [src], pure=False):
        storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([128]), 0, "uint8"))
        tensors = {
            name: bb.emit(relax.op.vm.alloc_tensor(storage, offset, relax.ShapeExpr([16]), "float32"))
            for name, offset in (("a", 0), ("out", 64))
        }
        bb.emit(copy_tensor(src, tensors["a"]))
        for symbol, args in calls:
            args = [tensors.get(arg, arg) if isinstance(arg, str) else arg for arg in args]
            bb.emit(relax.Call(relax.ExternFunc(symbol), args, **VOID_TY_ARGS))
        bb.emit_func_output(tensors["out"])
    return bb.get()


def test_the_report_names_vars_and_void_calls_as_tvmscript_prints_them():
    # nn.Module exports parameters as `fc1.weight`, which TVMScript prints `fc1_weight`; a void
    # call prints as a bare statement, with no `_ =`.
    scheduled = copy_to_dma(_copy_into_a_then("fc1.weight", ("my.kernel", ["a", "out"])), overlap=True)
    (transfer,) = overlap_report(scheduled)
    printed = scheduled["main"].script()
    assert transfer.src == "fc1_weight" and "fc1_weight" in printed
    assert transfer.stopped_by == "`my.kernel(...)` (reads or writes dst)"
    assert "_ = " not in printed and "my.kernel" in printed


def test_a_call_given_no_tensor_is_not_counted_as_a_kernel():
    # A trace call, R.call_packed("trace", "name"), computes nothing a transfer overlaps.
    mod = _copy_into_a_then(
        "x", ("trace", [_ir.StringImm("k")]), ("my.kernel", ["out"]), ("my.kernel", ["a", "out"])
    )
    (transfer,) = overlap_report(copy_to_dma(mod, overlap=True))
    assert transfer.overlapped == 3  # out's allocation, the trace and the first kernel
    assert transfer.kernels == 1


@R.function(pure=False)
def chained_copies(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    dma_copy(a, b)
    dma_wait(a, b)
    return b


def test_a_transfer_bounded_by_another_transfer_says_how_they_conflict():
    first, second = overlap_report(chained_copies)
    assert first.stopped_by == "the copy a -> b (reads dst)"
    assert second.starts_after == "the wait for x -> a (writes src)"


@R.function(pure=False)
def unwaited_and_legacy(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a, queue=2)
    c = R.add(x, y)
    legacy_wait(queue=2)
    dma_copy(y, b)
    return c


def test_report_pairs_legacy_waits_by_order_and_shows_copies_without_a_wait():
    report = overlap_report(unwaited_and_legacy)
    assert [(t.queue, t.src, t.dst, t.overlapped, t.inflight, t.legacy) for t in report] == [
        (2, "x", "a", 1, 0, True),
        (0, "y", "b", None, None, False),
    ]
    assert format_overlap_report(report).splitlines() == [
        "# DMA overlap: 2 dma_copy; 1 overlap other bindings, 1 binding (not DMA builtins) in all; "
        "0 overlap a kernel call",
        "#   unwaited_and_legacy: x -> a on queue 2, 1 binding overlapped, 0 kernel calls (wait inflight 0, legacy wait); "
        "starts after `b = R.vm.alloc_tensor`; waited before the copy y -> b",
        "#   unwaited_and_legacy: y -> b on queue 0, no wait in its block completes it; starts after a legacy wait",
    ]


# ---------------------------------------------------------------------------------------------
# Copies start as early as is safe; waits merge where nothing is lost
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def late_copies(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    t = R.add(x, x)
    R.call_packed("fill", y, **VOID_TY_ARGS)
    u = R.add(t, y)
    dma_copy(x, a, bypass=0)
    dma_wait(x, a, bypass=0)
    dma_copy(y, b, bypass=0)
    dma_wait(y, b, bypass=0)
    v = R.add(a, b)
    w = R.add(u, v)
    return w


@R.function(pure=False)
def late_copies_hoisted(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    t = R.add(x, x)  # reading a src is no reason to wait
    # The packed call may write y, and x too (parameters may alias each other): both copies
    # start right after it, the last write of their src.
    R.call_packed("fill", y, **VOID_TY_ARGS)
    dma_copy(x, a, bypass=0)
    dma_copy(y, b, bypass=0)
    u = R.add(t, y)
    dma_wait(y, b, bypass=0)  # completes x -> a too; a's own wait merged into it: x and a stay alive
    v = R.add(a, b)
    w = R.add(u, v)
    return w


def test_a_copy_starts_right_after_what_defines_its_tensors_and_the_last_write_of_src():
    assert_sinks_to(late_copies, late_copies_hoisted)


def _reused(other: int):
    """a and h share a storage: h at byte ``other`` (a is [0, 64)); h is read before the copy."""

    @R.function(pure=False)
    def before(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage = _storage()
        a = _alloc(storage, 0)
        h = _alloc(storage, other)
        d = R.add(h, h)
        e = R.add(x, x)
        dma_copy(x, a)
        dma_wait(x, a)
        f = R.add(a, d)
        return f

    return before


def _allocated_late(other: int):
    """a is allocated just before its copy, as stage_in_vtcm emits it; h, read by d, sits at
    byte ``other`` of the same storage (a is [0, 64))."""

    @R.function(pure=False)
    def before(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage = _storage()
        h = _alloc(storage, other)
        d = R.add(h, h)
        e = R.add(x, x)
        a = _alloc(storage, 0)
        dma_copy(x, a)
        dma_wait(x, a)
        f = R.add(a, d)
        return f

    return before


@pytest.mark.parametrize(
    "make, other, order",
    [
        (_reused, 0, ["storage", "a", "h", "d", "copy(x->a)", "e", "wait(x->a, 0)", "f"]),  # a overwrites h
        (_reused, 64, ["storage", "a", "copy(x->a)", "h", "d", "e", "wait(x->a, 0)", "f"]),  # other bytes
        # a's allocation moves up with its transfer, as far as the last read of its bytes
        (_allocated_late, 0, ["storage", "h", "d", "a", "copy(x->a)", "e", "wait(x->a, 0)", "f"]),
        (_allocated_late, 64, ["storage", "a", "copy(x->a)", "h", "d", "e", "wait(x->a, 0)", "f"]),
    ],
    ids=["same-bytes", "other-bytes", "allocated-late-same-bytes", "allocated-late-other-bytes"],
)
def test_a_copy_never_starts_before_the_last_read_of_its_dst_bytes(make, other, order):
    got = sink_dma_waits(make(other))
    relax.analysis.well_formed(got)
    assert _bindings_in_order(got) == order


def _two_queues_or_one(second: int):
    @R.function(pure=False)
    def before(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage = _storage()
        a = _alloc(storage, 0)
        b = _alloc(storage, 64)
        s = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        R.call_packed("fill", s, **VOID_TY_ARGS)
        dma_copy(s, a, queue=0)
        dma_wait(s, a, queue=0)
        dma_copy(x, b, queue=second)
        dma_wait(x, b, queue=second)
        c = R.add(a, b)
        return c

    return before


@pytest.mark.parametrize(
    "second, starts_after",
    [(0, "copy(s->a)"), (1, "b")],
    ids=["same-queue-keeps-order", "other-queue-passes"],
)
def test_a_copy_never_passes_an_earlier_copy_of_its_queue(second, starts_after):
    got = sink_dma_waits(_two_queues_or_one(second))
    order = _bindings_in_order(got)
    assert order[order.index("copy(x->b)") - 1] == starts_after


@R.function(pure=False)
def dying_buffer(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_wait(x, a)
    dma_copy(y, b)
    dma_wait(y, b)
    c = R.add(b, b)
    return c


@R.function(pure=False)
def dying_buffer_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a)
    b = _alloc(storage, 64)
    dma_copy(y, b)
    # b's wait would complete a's transfer too, but nothing uses a later: its own wait stays,
    # so that KillAfterLastUse cannot free a while the engine writes it.
    dma_wait(x, a, inflight=1)
    dma_wait(y, b)
    c = R.add(b, b)
    return c


def test_a_wait_is_not_merged_when_its_buffer_would_die_before_the_merged_wait():
    assert_sinks_to(dying_buffer, dying_buffer_sunk)


@R.function(pure=False)
def merged_then_read(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    e = _alloc(storage, 128)
    dma_copy(x, a, bypass=0)
    dma_wait(x, a, bypass=0)
    dma_copy(y, b, bypass=0)
    dma_wait(y, b, bypass=0)
    c = R.add(b, b)
    dma_copy(a, e, bypass=0)
    dma_wait(a, e, bypass=0)
    d = R.add(c, e)
    f = R.add(a, d)
    return f


@R.function(pure=False)
def merged_then_read_sunk(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    dma_copy(x, a, bypass=0)
    b = _alloc(storage, 64)
    dma_copy(y, b, bypass=0)
    e = _alloc(storage, 128)
    dma_wait(y, b, bypass=0)  # completes x -> a too: a's own wait merged into it
    dma_copy(a, e, bypass=0)  # reads a: starts after the wait that completes x -> a, not before
    c = R.add(b, b)
    dma_wait(a, e, bypass=0)
    d = R.add(c, e)
    f = R.add(a, d)
    return f


def test_a_copy_reading_a_merged_transfers_dst_starts_after_the_wait_that_completes_it():
    assert_sinks_to(merged_then_read, merged_then_read_sunk)


def _copy_into_constant() -> tvm.IRModule:
    """The issue's race: ``k = R.const(...)``; ``copy_tensor(x, k)``; a read of k."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([16], "float32"))
    with bb.function("main", [x], pure=False):
        k = bb.emit(relax.const(np.zeros(16, "float32")), "k")
        bb.emit(copy_tensor(x, k))
        z = bb.emit(relax.op.ones(relax.ShapeExpr([16]), "float32"), "z")  # touches nothing of k
        d = bb.emit(relax.op.add(k, z), "d")
        bb.emit_func_output(d)
    return bb.get()


def test_a_copy_into_a_constant_is_waited_for_before_the_constant_is_read():
    mod = _copy_into_constant()
    got = copy_to_dma(mod, overlap=True)
    relax.analysis.well_formed(got)
    (x,) = _inputs(mod["main"], seed=4)
    expected, _ = _run(mod, [x], dma=False)
    plain, _ = _run(copy_to_dma(mod), [x], dma=True)
    overlapped, _ = _run(got, [x], dma=True)
    np.testing.assert_array_equal(expected[0], x + 1)
    np.testing.assert_array_equal(plain[0], x + 1)
    np.testing.assert_array_equal(overlapped[0], x + 1)  # was NaN: k read before it landed
    names = [var_name(b.var) if _builtin(b) is None else _builtin(b).rsplit(".", 1)[1] for b in got["main"].body.blocks[0].bindings]
    assert names == ["k", "dma_copy", "z", "dma_wait", "d"]


# ---------------------------------------------------------------------------------------------
# Running under cpu_dma()
# ---------------------------------------------------------------------------------------------


def _inputs(func: relax.Function, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for param in func.params:
        shape = [int(d) for d in ty(param).shape.values]
        dtype = dtype_name(ty(param))
        data = rng.standard_normal(shape) if dtype.startswith("float") else rng.integers(-99, 99, shape)
        out.append(data.astype(dtype))
    return out


def _results(value) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [v.numpy() for v in value]


def _run(mod: tvm.IRModule, inputs: list[np.ndarray], dma: bool):
    """Run ``main``; with ``dma`` inside cpu_dma(), returning the engine's counters too."""
    executable = relax.build(mod, target="llvm")
    args = [tvm.runtime.tensor(x) for x in inputs]
    if not dma:
        return _results(relax.VirtualMachine(executable, tvm.cpu())["main"](*args)), None
    with cpu_dma() as engine:  # leaving it raises DMAError if a transfer is still in flight
        vm = relax.VirtualMachine(executable, tvm.cpu())
        results = _results(vm["main"](*args))
    assert engine.in_flight == {} and engine.completed == engine.copies
    return results, engine


def _independent_copies(count: int) -> tvm.IRModule:
    """``count`` copies of x into tensors of one storage, all returned: none needs a wait
    before the end of the function."""
    x = relax.Var("x", TensorType([16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([64 * count]), 0, "uint8", "global"))
        outs = []
        for i in range(count):
            outs.append(bb.emit(relax.op.vm.alloc_tensor(storage, 64 * i, relax.ShapeExpr([16]), "float32")))
            bb.emit(copy_tensor(x, outs[-1]))
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get()


@pytest.mark.parametrize("queues", [1, 3])
def test_the_schedule_keeps_at_most_100_transfers_in_flight(queues):
    # One ring of 100 descriptors serves every queue.  With other queues in flight a copy on a
    # full ring makes TVM's runtime miscount them (cpu_dma raises), so the schedule waits first.
    original = _independent_copies(250)
    (x,) = _inputs(original["main"], seed=3)
    got, engine = _run(copy_to_dma(original, overlap=True, num_queues=queues), [x], dma=True)
    assert len(got) == 250 and all(np.array_equal(out, x) for out in got)
    assert engine.peak_in_flight_total == 100
    assert engine.ring_stalls == 0


@tvm.register_global_func("test.reads_all", override=True)
def _reads_all(*tensors):
    return None


def test_a_transfer_starts_no_earlier_than_the_ring_has_room_for_it():
    # 100 transfers, a packed call reading all their dsts (so waited for before it), then one
    # more copy of x: hoisted to the top it would be the 101st in flight.
    x = relax.Var("x", TensorType([16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([64 * 101]), 0, "uint8", "global"))
        outs = []
        for i in range(100):
            outs.append(bb.emit(relax.op.vm.alloc_tensor(storage, 64 * i, relax.ShapeExpr([16]), "float32")))
            bb.emit(copy_tensor(x, outs[-1]))
        bb.emit(relax.Call(relax.ExternFunc("test.reads_all"), outs, None, [TupleType([])]))
        last = bb.emit(relax.op.vm.alloc_tensor(storage, 6400, relax.ShapeExpr([16]), "float32"))
        bb.emit(copy_tensor(x, last))
        bb.emit_func_output(last)
    mod = copy_to_dma(bb.get(), overlap=True, num_queues=2)
    (x_data,) = _inputs(mod["main"], seed=4)
    got, engine = _run(mod, [x_data], dma=True)
    np.testing.assert_array_equal(got[0], x_data)
    assert engine.peak_in_flight_total == 100 and engine.ring_stalls == 0


def _copies_around_nested_dma(where: str) -> tvm.IRModule:
    """100 copies of x, an If branch or a call of another function doing a copy of its own (on
    memory nothing else touches), then 100 more copies of x."""
    t = TensorType([16], "float32")
    bb = relax.BlockBuilder()
    p = relax.Var("p", t)
    with bb.function("helper", [p], pure=False, private=True):
        q = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([16]), "float32", 0))
        bb.emit(copy_tensor(p, q))
        bb.emit_func_output(q)
    helper = bb.get().get_global_var("helper")
    x, y = relax.Var("x", t), relax.Var("y", t)
    cond = relax.Var("cond", TensorType([], "bool"))
    with bb.function("main", [x, y, cond], pure=False):
        z = bb.emit(relax.op.add(y, y))
        outs = []

        def copies(count):
            for _ in range(count):
                outs.append(bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([16]), "float32", 0)))
                bb.emit(copy_tensor(x, outs[-1]))

        copies(100)
        inner, void = relax.Var("inner", t), relax.Var("void", TupleType([]))
        if where == "branch":
            then = relax.SeqExpr(
                [relax.BindingBlock([
                    relax.VarBinding(inner, relax.op.builtin.alloc_tensor(relax.ShapeExpr([16]), "float32", 0)),
                    relax.VarBinding(void, copy_tensor(z, inner)),
                ])],
                inner,
            )
            nested = bb.emit(relax.If(cond, then, relax.SeqExpr([], z)))
        elif where == "branch calling the callee":
            then = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(inner, relax.Call(helper, [z]))])], inner)
            nested = bb.emit(relax.If(cond, then, relax.SeqExpr([], z)))
        elif where == "closure calling the callee":
            pp = relax.Var("pp", t)
            body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(inner, relax.Call(helper, [pp]))])], inner)
            closure = bb.emit(relax.Function([pp], body, t, is_pure=False))
            nested = bb.emit(relax.Call(closure, [z]))
        else:
            nested = bb.emit(relax.Call(helper, [z]))
        copies(100)
        bb.emit_func_output(relax.Tuple(outs + [nested]))
    return relax.transform.Normalize()(bb.get())


@pytest.mark.parametrize("where", ["branch", "callee", "branch calling the callee", "closure calling the callee"])
def test_dma_issued_in_a_branch_or_a_callee_shares_the_ring_with_what_is_in_flight(where):
    # The 100 transfers before it would stay in flight to the end of the block, and the 100
    # after it could start before it: either way its own copy would be the 101st in flight.
    original = _copies_around_nested_dma(where)
    mod = copy_to_dma(original, overlap=True, num_queues=2)
    relax.analysis.well_formed(mod)
    if "closure" in where:  # (relax.build needs local functions lifted)
        original, mod = relax.transform.LambdaLift()(original), relax.transform.LambdaLift()(mod)
    x, y = (np.arange(16, dtype="float32") + k for k in (0, 10))
    inputs = [x, y, np.array(True)]
    got, engine = _run(mod, inputs, dma=True)
    expected, _ = _run(original, inputs, dma=False)
    assert len(got) == len(expected) == 201
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    assert engine.copies == 201 and engine.ring_stalls == 0 and engine.peak_in_flight_total == 100
    # Nothing crosses it: the 100 before are waited for just before it, none after starts before.
    names = _bindings_in_order(mod["main"])
    bindings = list(mod["main"].body.blocks[0].bindings)
    nested = next(i for i, b in enumerate(bindings) if isinstance(b.value, (relax.If, relax.Call)) and (
        isinstance(b.value, relax.If) or isinstance(b.value.op, relax.GlobalVar)))
    assert sum(n.startswith("copy(") for n in names[:nested]) == 100
    assert sum(n.startswith("copy(") for n in names[nested:]) == 100
    assert names[nested - 1].startswith("wait(")
    report = [r for r in overlap_report(mod) if r.function == "main"]
    assert any("may issue dma_copy s of its own" in r.stopped_by for r in report)


@I.ir_module
class _CopyAcrossKernel:
    @T.prim_func(private=True)
    def double(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        for i in range(16):
            b[i] = a[i] * T.float32(2)

    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")):
        cls = _CopyAcrossKernel
        t = R.add(x, x)  # memory of its own: the kernel (which may write y and b) leaves it be
        a = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(t, a)
        b = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        cls.double(y, b)
        c = R.add(a, b)
        return c


def test_a_kernel_call_overlaps_a_transfer_in_a_module_and_not_in_a_function_alone():
    # Alone, the callee of a GlobalVar may be a Relax function issuing DMA of its own.
    in_module = copy_to_dma(_CopyAcrossKernel, overlap=True)
    alone = copy_to_dma(_CopyAcrossKernel["main"], overlap=True)
    for target, overlapped in ((in_module, 1), (alone, 0)):
        relax.analysis.well_formed(target)
        (transfer,) = overlap_report(target)
        assert transfer.kernels == overlapped, transfer
        assert ("may issue dma_copy" in transfer.stopped_by) == (not overlapped), transfer


@pytest.mark.filterwarnings("ignore::rewrite_ext.hexagon.DMAChunkWarning")  # the CPU stand-in honours byte_offset
def test_a_transfer_of_more_chunks_than_the_ring_has_runs_alone():
    # 102 chunks of 2**24 - 64 bytes: more descriptors than the ring holds.  On its own queue
    # the engine only stalls; nothing of another queue may be in flight beside it.
    big = 102 * (2**24 - 64) - 5

    @I.ir_module
    class Big:
        @R.function(pure=False)
        def main(x: R.Tensor((16,), "float32"), y: R.Tensor((big,), "uint8")):
            a = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
            R.vm.copy_tensor(x, a)
            b = R.builtin.alloc_tensor(R.shape([big]), R.dtype("uint8"), R.prim_value(0))
            R.vm.copy_tensor(y, b)
            c = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
            R.vm.copy_tensor(x, c)
            return (a, b, c)

    out = copy_to_dma(Big, overlap=True, num_queues=2)
    relax.analysis.well_formed(out)
    builtins = [
        (name, imm_value(b.value.args[1].fields[0 if name == "wait" else 2]))
        for b in _ir.all_bindings(out["main"])
        for name in [{DMA_COPY: "copy", DMA_WAIT: "wait"}.get(_builtin(b))]
        if name
    ]
    copies = [i for i, (name, _) in enumerate(builtins) if name == "copy"]
    assert len(copies) == 104
    first_big, last_big = copies[1], copies[102]
    # a's transfer (queue 0) is complete before the first chunk; c's (queue 0 again) starts
    # after the big one's wait (queue 1).
    assert ("wait", 0) in builtins[:first_big]
    assert ("wait", 1) in builtins[last_big:copies[103]]


@I.ir_module
class _CastThenAlloc:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32"), p: R.Tensor(ndim=1, dtype="float32")):
        n = T.int64()
        s = R.vm.alloc_storage(R.shape([64]), R.prim_value(0), R.dtype("uint8"))
        q = R.match_cast(p, R.Tensor((n,), "float32"))
        a = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([n]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        return a


def test_an_allocation_moving_with_its_transfer_stays_after_the_match_cast_defining_its_shape():
    out = copy_to_dma(_CastThenAlloc, overlap=True)
    relax.analysis.well_formed(out)
    names = _bindings_in_order(out["main"])
    assert names.index("q") < names.index("a")
    x = np.arange(16, dtype="float32")
    got, _ = _run(out, [x, np.zeros(16, "float32")], dma=True)
    np.testing.assert_array_equal(got[0], x)


@I.ir_module
class _ShapeVarThenAlloc:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32")):
        s = R.vm.alloc_storage(R.shape([64]), R.prim_value(0), R.dtype("uint8"))
        z = R.add(x, x)
        sh = R.shape_of(z)
        a = R.vm.alloc_tensor(s, R.prim_value(0), sh, R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        w = R.add(a, z)
        return w


def test_an_allocation_moving_with_its_transfer_stays_after_the_binding_of_its_shape_var():
    # (Found by an adversarial trial: the allocation went up to just after its storage, above
    # `sh`, and the output failed well_formed and relax.build.)
    out = copy_to_dma(_ShapeVarThenAlloc, overlap=True)
    relax.analysis.well_formed(out)
    names = _bindings_in_order(out["main"])
    assert names.index("sh") < names.index("a")
    x = np.arange(16, dtype="float32")
    got, _ = _run(out, [x], dma=True)
    np.testing.assert_array_equal(got[0], x + x + x)


def test_sunk_output_runs_like_numpy_and_the_unsunk_rewrite_with_two_in_flight():
    original = two_copies_original()
    x, y = _inputs(original["main"], seed=1)
    unsunk, _ = _run(copy_to_dma(original), [x, y], dma=True)
    sunk, engine = _run(sink_dma_waits(copy_to_dma(original)), [x, y], dma=True)
    np.testing.assert_allclose(sunk[0], y * (x + x + y), rtol=1e-6)
    np.testing.assert_array_equal(sunk[0], unsunk[0])
    assert engine.copies == engine.waits == 2
    assert engine.peak_in_flight == {0: 2}


def test_destination_passing_writes_to_src_wait_first_at_run_time():
    (x,) = _inputs(DestinationPassing["main"], seed=2)
    expected, _ = _run(DestinationPassing, [x], dma=False)
    got, engine = _run(sink_dma_waits(copy_to_dma(DestinationPassing)), [x], dma=True)
    # cpu_dma reads src when a transfer completes: a wait sunk past add_one(x, s) would give
    # a = x + 1 here instead of x.
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[0], x + (x + 1), rtol=1e-6)
    assert engine.peak_in_flight == {0: 1}


@R.function(pure=False)
def runnable_round_robin(
    x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")
) -> R.Tensor((16,), "float32"):
    # Every tensor that compute reads is at offset 0 of its own storage (CPU kernels
    # reject non-zero byte offsets).
    s0 = _storage(64)
    s1 = _storage(64)
    s2 = _storage(64)
    s3 = _storage(64)
    a = _alloc(s0, 0)
    b = _alloc(s1, 0)
    e = _alloc(s2, 0)
    f = _alloc(s3, 0)
    dma_copy(x, a, queue=0)
    dma_wait(x, a, queue=0)
    dma_copy(y, b, queue=1)
    dma_wait(y, b, queue=1)
    dma_copy(x, e, queue=0)
    dma_wait(x, e, queue=0)
    dma_copy(y, f, queue=1)
    dma_wait(y, f, queue=1)
    g = R.add(a, b)
    h = R.multiply(e, f)
    k = R.subtract(g, h)
    return k


def test_two_queues_run_with_two_in_flight_on_each():
    mod = tvm.IRModule({"main": runnable_round_robin.with_attr("global_symbol", "main")})
    x, y = _inputs(mod["main"], seed=3)
    got, engine = _run(sink_dma_waits(mod), [x, y], dma=True)
    np.testing.assert_allclose(got[0], (x + y) - x * y, rtol=1e-6)
    assert engine.peak_in_flight == {0: 2, 1: 2} and engine.peak_in_flight_total == 4
    unsunk, engine = _run(mod, [x, y], dma=True)
    np.testing.assert_array_equal(got[0], unsunk[0])
    assert engine.peak_in_flight_total == 1


# ---------------------------------------------------------------------------------------------
# Property: on generated lowered functions, sinking never changes results
# ---------------------------------------------------------------------------------------------


def _assert_waits_exact(func: relax.Function) -> None:
    """Each five-argument wait, run as the engine runs it (per queue, oldest first), completes
    its own transfer's last ``dma_copy`` and nothing issued after it: its inflight count is
    neither too high (a race) nor too low (a needless stall)."""
    for block in func.body.blocks:
        views = {}
        fifo: dict[int, list] = {}
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.memory.view":
                views[binding.var] = value.args[0]
            name = _builtin(binding)
            if name is None:
                continue
            fields = list(binding.value.args[1].fields)
            if name == DMA_COPY:
                src, dst = (views.get(f, f) for f in fields[:2])
                fifo.setdefault(imm_value(fields[2]), []).append((src, dst))
            elif len(fields) == 5:
                queue, inflight = imm_value(fields[0]), imm_value(fields[1])
                pending = fifo.get(queue, [])
                assert len(pending) > inflight, "a wait that completes nothing"
                last = pending[len(pending) - inflight - 1]
                assert last[0].same_as(fields[3]) and last[1].same_as(fields[4]), "inflight_dma not exact"
                del pending[: len(pending) - inflight]


def test_sinking_generated_lowered_functions_keeps_their_results():
    peaks: list[int] = []
    generated = lowered_copy_functions(max_copies=8, max_storages=2, legalize=False) | lowered_copy_functions(
        max_copies=8, max_storages=2, legalize=True
    )

    @settings(max_examples=40)
    @given(generated, st.integers(1, 3))
    def check(mod: tvm.IRModule, queues: int) -> None:
        sunk = sink_dma_waits(copy_to_dma(mod, num_queues=queues))
        relax.analysis.well_formed(sunk)
        tvm.ir.assert_structural_equal(copy_to_dma(mod, overlap=True, num_queues=queues), sunk)
        inputs = _inputs(mod["main"], seed=0)
        expected, _ = _run(mod, inputs, dma=False)
        got, engine = _run(sunk, inputs, dma=True)  # nothing in flight at exit, else DMAError
        _assert_waits_exact(sunk["main"])
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
        if engine.peak_in_flight_total > 1:
            assert any(t.overlapped for t in overlap_report(sunk))
        peaks.append(engine.peak_in_flight_total)

    check()
    assert any(peak > 1 for peak in peaks), peaks


@R.function(pure=False)
def waits_out_of_order(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
    storage = _storage()
    a = _alloc(storage, 0)
    b = _alloc(storage, 64)
    dma_copy(x, a)
    dma_copy(y, b)
    c = R.add(x, y)
    dma_wait(y, b, inflight=1)
    dma_wait(x, a)
    d = R.add(c, x)
    dma_copy(x, b)
    dma_wait(x, b)
    return d


def test_the_report_completes_transfers_as_the_engine_does_oldest_first():
    # The first wait names y -> b, but with inflight 1 it completes x -> a, the oldest
    # transfer of its queue; the second completes y -> b.  Both are another's wait: merged.
    report = overlap_report(waits_out_of_order)
    assert [(t.src, t.dst, t.overlapped, t.inflight, t.merged) for t in report] == [
        ("x", "a", 1, 1, True),
        ("y", "b", 1, 0, True),
        ("x", "b", 0, 0, False),
    ]
    assert report[0].stopped_by == "`d = R.add` (waits with a later transfer of queue 0)"
    assert report[2].stopped_by == "the end of its block"
