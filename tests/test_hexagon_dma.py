"""copy_to_dma: the exact IR it produces, its options, its pass and its errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import rewrite_ext  # noqa: F401 - registers R.vm.copy_tensor
from rewrite_ext import RewriteError, rewrite_call
from rewrite_ext.hexagon import CopyToDMA, DMAChunkWarning, copy_tensor_pattern, copy_to_dma, cpu_dma, sink_dma_waits
from rewrite_ext.hexagon.dma import CHUNK_BYTES, MAX_DESCRIPTOR_BYTES
from rewrite_ext.ops import copy_tensor
from rewrite_ext.compat import VOID_TY_ARGS, TensorType, TupleType, imm_value, ret_ty, ty, var_name


@I.ir_module
class Seed:
    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), "int32")) -> R.Tensor((32, 64), "int32"):
        vtcm_obj = R.vm.alloc_storage(R.shape([16384]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(vtcm_obj, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
        R.vm.copy_tensor(x, a)
        b = R.vm.alloc_tensor(vtcm_obj, R.prim_value(8192), R.shape([32, 64]), R.dtype("int32"))
        R.vm.copy_tensor(a, b)
        return b


@I.ir_module
class SeedAfter:
    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), "int32")) -> R.Tensor((32, 64), "int32"):
        vtcm_obj = R.vm.alloc_storage(R.shape([16384]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(vtcm_obj, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, x, a], **VOID_TY_ARGS)
        b = R.vm.alloc_tensor(vtcm_obj, R.prim_value(8192), R.shape([32, 64]), R.dtype("int32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [a, b, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, a, b], **VOID_TY_ARGS)
        return b


def test_seed_module_becomes_the_expected_ir():
    tvm.ir.assert_structural_equal(copy_to_dma(Seed), SeedAfter)


def test_seed_module_checked_binding_by_binding():
    out = copy_to_dma(Seed)["main"]
    bindings = out.body.blocks[0].bindings
    x = out.params[0]
    vtcm, a = bindings[0].var, bindings[1].var
    assert [type(b.value).__name__ for b in bindings].count("Call") == len(bindings) == 7
    copy, wait = bindings[2].value, bindings[3].value
    assert copy.op.same_as(tvm.ir.Op.get("relax.call_builtin_with_ctx"))
    assert copy.args[0].global_symbol == "vm.builtin.hexagon.dma_copy"
    assert wait.args[0].global_symbol == "vm.builtin.hexagon.dma_wait"
    copy_args, wait_args = list(copy.args[1].fields), list(wait.args[1].fields)
    assert copy_args[0].same_as(x) and copy_args[1].same_as(a)  # the var a, not a second alloc_tensor
    assert [imm_value(v) for v in copy_args[2:]] == [0, 1]
    assert [imm_value(v) for v in wait_args[:3]] == [0, 0, 1]
    assert wait_args[3].same_as(x) and wait_args[4].same_as(a)
    for binding in (bindings[2], bindings[3]):
        assert isinstance(ty(binding.var), TupleType) and len(ty(binding.var).fields) == 0
    # nothing else moved: the allocation of b still comes after the first copy's wait
    assert var_name(bindings[4].var) == "b" and bindings[0].var.same_as(vtcm)


def test_queue_id_bypass_cache_and_legacy_wait_options():
    out = copy_to_dma(Seed, queue_id=3, bypass_cache=False, legacy_wait=True)["main"]
    copy, wait = out.body.blocks[0].bindings[2].value, out.body.blocks[0].bindings[3].value
    assert [imm_value(v) for v in list(copy.args[1].fields)[2:]] == [3, 0]
    assert [imm_value(v) for v in wait.args[1].fields] == [3, 0]


def test_output_survives_a_tvmscript_round_trip():
    out = copy_to_dma(Seed)
    tvm.ir.assert_structural_equal(tvm.script.from_source(out.script()), out)


def test_input_module_is_unchanged():
    before = Seed.script()
    copy_to_dma(Seed)
    assert Seed.script() == before


@I.ir_module
class _NoCopy:
    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), "int32")) -> R.Tensor((32, 64), "int32"):
        y = R.add(x, x)
        return y


@pytest.mark.parametrize("overlap", [False, True])
def test_a_module_without_copies_comes_back_itself(overlap):
    assert copy_to_dma(_NoCopy, overlap=overlap).same_as(_NoCopy)
    assert sink_dma_waits(_NoCopy).same_as(_NoCopy)


def test_function_target_returns_a_function():
    out = copy_to_dma(Seed["main"])
    assert isinstance(out, relax.Function)
    tvm.ir.assert_structural_equal(out, SeedAfter["main"])


def test_copy_to_dma_pass_composes_in_sequential():
    seq = tvm.transform.Sequential([CopyToDMA()])
    tvm.ir.assert_structural_equal(seq(Seed), SeedAfter)
    assert CopyToDMA().info.name == "CopyToDMA"


def test_the_pattern_matches_copy_tensor_calls_only():
    x = relax.Var("x", TensorType((4,), "float32"))
    y = relax.Var("y", TensorType((4,), "float32"))
    assert copy_tensor_pattern().match(copy_tensor(x, y))
    assert not copy_tensor_pattern().match(relax.op.add(x, y))


def test_copy_in_a_pure_function_is_reported_as_a_purity_error():
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4,), "float32"))
    y = relax.Var("y", TensorType((4,), "float32"))
    # Built impure, then re-declared pure: what a careless pass could leave behind.
    with bb.function("main", [x, y], pure=False):
        bb.emit(copy_tensor(x, y))
        bb.emit_func_output(y)
    func = bb.get()["main"]
    pure = relax.Function(func.params, func.body, ret_ty(func), is_pure=True, attrs=func.attrs)
    with pytest.raises(RewriteError, match="pure=False"):
        rewrite_call(copy_tensor_pattern(), _emit_dma_like, pure)


def _emit_dma_like(orig, matchings, builder):
    # the same shape as the reference rewriter: emit an impure call, return another
    src, dst = orig.args
    builder.emit(relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, dst], **VOID_TY_ARGS))
    return relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [src, dst], **VOID_TY_ARGS)


def test_copies_in_if_branches_and_several_blocks_are_all_rewritten():
    @I.ir_module
    class Mod:
        @R.function(pure=False)
        def main(c: R.Tensor((), "bool"), x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
            R.vm.copy_tensor(x, y)
            if c:
                R.vm.copy_tensor(y, x)
                r = x
            else:
                r = y
            return r

    out = copy_to_dma(Mod)
    text = out.script()
    assert "copy_tensor" not in text
    assert text.count("hexagon.dma_copy") == 2 and text.count("hexagon.dma_wait") == 2
    relax.analysis.well_formed(out)


# ---------------------------------------------------------------------------------------------
# The engine's limits, checked when the rewrite is made
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue_id", "num_queues", "message"),
    [
        (9, 1, r"queue 9 outside the user DMA queues 0..8 \(the runtime keeps queue 9"),
        (10, 1, "queue 10 outside"),
        (-1, 1, "queue -1 outside"),
        (7, 3, r"queues 7..9 outside the user DMA queues 0..8"),
        (0, 10, r"queues 0..9 outside"),
        (0, 0, "num_queues must be at least 1, got 0"),
    ],
)
def test_queues_outside_the_user_queues_are_a_value_error_when_the_rewrite_is_made(queue_id, num_queues, message):
    with pytest.raises(ValueError, match=message):
        copy_to_dma(Seed, queue_id=queue_id, num_queues=num_queues)
    with pytest.raises(ValueError, match=message):
        CopyToDMA(queue_id=queue_id, num_queues=num_queues)  # already when the pass is made


def test_all_nine_user_queues_are_accepted():
    out = copy_to_dma(Seed, queue_id=0, num_queues=9)
    assert out.script().count("hexagon.dma_copy") == 2
    assert copy_to_dma(Seed, queue_id=8).script().count("(0, 0, 1") == 0  # both on queue 8


def _copy_of(n: int | str, dtype: str = "float32") -> tvm.IRModule:
    """``main(x)``: copy x, of ``n`` elements, into an output tensor."""
    bb = relax.BlockBuilder()
    dim = tvm.tirx.Var("n", "int64") if n == "symbolic" else n
    x = relax.Var("x", TensorType([dim], dtype))
    with bb.function("main", [x], pure=False):
        out = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([dim]), dtype, 0))
        bb.emit(copy_tensor(x, out))
        bb.emit_func_output(out)
    return bb.get()


def _builtin_calls(func: relax.Function) -> list[tuple[str, list]]:
    calls = []
    for binding in func.body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_builtin_with_ctx")):
            calls.append((str(value.args[0].global_symbol).rsplit(".", 1)[1], list(value.args[1].fields)))
        elif isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.memory.view")):
            calls.append(("view", list(value.args)))
    return calls


def test_a_copy_larger_than_a_descriptor_becomes_chunks_on_one_queue_with_one_wait():
    big = 17 * 2**20 // 4  # 17 MiB of float32: more than 2**24 - 1 bytes
    with pytest.warns(DMAChunkWarning, match=r"1 copy\(ies\) .*: x -> \w+ \(17825792 bytes\)\. TVM 0\.27's .* byte_offset"):
        out = copy_to_dma(_copy_of(big), queue_id=4)["main"]
    relax.analysis.well_formed(out)
    calls = _builtin_calls(out)
    assert [name for name, _ in calls] == ["view", "view", "view", "view", "dma_copy", "dma_copy", "dma_wait"]
    views = [args for name, args in calls if name == "view"]
    # flat uint8 views at byte offsets 0 and CHUNK_BYTES, each at most one descriptor
    sizes = [int(args[1].values[0]) for args in views]
    offsets = [imm_value(args[3]) for args in views]
    assert sorted(sizes) == sorted([CHUNK_BYTES, big * 4 - CHUNK_BYTES] * 2)
    assert max(sizes) <= MAX_DESCRIPTOR_BYTES and CHUNK_BYTES % 64 == 0
    assert sorted(offsets) == [0, 0, CHUNK_BYTES, CHUNK_BYTES]
    copies = [args for name, args in calls if name == "dma_copy"]
    assert all(imm_value(args[2]) == 4 for args in copies)
    (wait,) = [args for name, args in calls if name == "dma_wait"]
    assert [imm_value(v) for v in wait[:3]] == [4, 0, 1]
    assert wait[3].same_as(out.params[0])  # the wait carries the whole src and dst
    # each view named after what it views, so reports say `x_chunk1 -> out_chunk1`
    dst = var_name(wait[4])
    view_names = [var_name(b.var) for b in out.body.blocks[0].bindings if "memory.view" in str(b.value.op)]
    assert view_names == ["x_chunk0", "x_chunk1", f"{dst}_chunk0", f"{dst}_chunk1"]


def test_a_copy_of_exactly_one_descriptor_is_not_split():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DMAChunkWarning)
        out = copy_to_dma(_copy_of(MAX_DESCRIPTOR_BYTES, "uint8"))["main"]
    assert [name for name, _ in _builtin_calls(out)] == ["dma_copy", "dma_wait"]
    with pytest.warns(DMAChunkWarning):
        out = copy_to_dma(_copy_of(MAX_DESCRIPTOR_BYTES + 1, "uint8"))["main"]
    assert [name for name, _ in _builtin_calls(out)].count("dma_copy") == 2


def test_a_copy_of_zero_bytes_becomes_nothing():
    out = copy_to_dma(_copy_of(0))["main"]
    relax.analysis.well_formed(out)
    assert [var_name(b.var) for b in out.body.blocks[0].bindings] == ["gv"]  # the allocation only
    assert "copy_tensor" not in out.script() and "hexagon" not in out.script()


def test_a_copy_of_a_tensor_onto_itself_becomes_nothing():
    @I.ir_module
    class SelfCopy:
        @R.function(pure=False)
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            R.vm.copy_tensor(x, x)
            return x

    for overlap in (False, True):
        out = copy_to_dma(SelfCopy, overlap=overlap)
        relax.analysis.well_formed(out)
        assert "copy_tensor" not in out.script() and "hexagon" not in out.script()
        with cpu_dma() as engine:  # a dma_copy of x onto x would be a DMAError here
            vm = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
            got = vm["main"](tvm.runtime.tensor(np.arange(4, dtype="float32"))).numpy()
        np.testing.assert_array_equal(got, np.arange(4, dtype="float32"))
        assert engine.copies == 0


@I.ir_module
class _ViaAlias:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32")):
        a = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(x, a)
        b = a
        R.vm.copy_tensor(a, b)
        return b


@I.ir_module
class _ViaTupleItem:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32")):
        a = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(x, a)
        t = (x, a)
        b = t[1]
        R.vm.copy_tensor(a, b)
        return b


def _at_offsets(second: int):
    @I.ir_module
    class AtOffsets:
        @R.function(pure=False)
        def main(x: R.Tensor((16,), "float32")):
            s = R.vm.alloc_storage(R.shape([128]), R.prim_value(0), R.dtype("uint8"))
            a = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([16]), R.dtype("float32"))
            R.vm.copy_tensor(x, a)
            t = s
            b = R.vm.alloc_tensor(t, R.prim_value(second), R.shape([16]), R.dtype("float32"))
            R.vm.copy_tensor(a, b)
            out = R.builtin.alloc_tensor(R.shape([16]), R.dtype("float32"), R.prim_value(0))
            R.vm.copy_tensor(b, out)
            return out

    return AtOffsets


@pytest.mark.parametrize(
    "mod, dma_copies, kept",
    [
        (_ViaAlias, 1, 0),
        (_ViaTupleItem, 1, 0),
        (_at_offsets(0), 2, 0),
        (_at_offsets(32), 2, 1),
        (_at_offsets(64), 3, 0),
    ],
    ids=["alias", "tuple item", "same-offset", "partly-overlapping", "disjoint"],
)
def test_a_copy_between_the_same_bytes_is_dropped_and_one_between_overlapping_bytes_kept(mod, dma_copies, kept):
    # The engine's result for overlapping src and dst is undefined (cpu_dma() raises): the
    # same bytes need no copy, and bytes shared in part keep the synchronous copy_tensor.
    x = np.arange(16, dtype="float32")
    expected = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    for overlap in (False, True):
        out = copy_to_dma(mod, overlap=overlap)
        relax.analysis.well_formed(out)
        assert out.script().count("R.vm.copy_tensor") == kept
        with cpu_dma() as engine:
            vm = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, expected)
        assert engine.copies == dma_copies


def test_a_copy_of_symbolic_size_stays_a_synchronous_copy_tensor():
    mod = _copy_of("symbolic")
    out = copy_to_dma(mod, overlap=True)
    tvm.ir.assert_structural_equal(out, mod)
    assert "R.vm.copy_tensor" in out.script()
