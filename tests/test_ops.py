"""The op ``relax.vm.copy_tensor``: registration, typing, TVMScript, lowering, running."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.ir import Op
from tvm.script import ir as I
from tvm.script import relax as R

import rewrite_ext.ops as ops
from rewrite_ext.ops import COPY_TENSOR_OP, copy_tensor
from rewrite_ext.compat import INFER_TYPE_ATTR, ShapeType, TensorType, TupleType, ty, var_name

VOID = TupleType([])


def _impure_copy_function(src_ty: relax.Type, dst_ty: relax.Type, pure: bool = False) -> tvm.IRModule:
    src, dst = relax.Var("x", src_ty), relax.Var("a", dst_ty)
    bb = relax.BlockBuilder()
    with bb.function("main", [src, dst], pure=pure):
        bb.emit(copy_tensor(src, dst))
        bb.emit_func_output(dst)
    return bb.get()


def test_op_is_registered_with_two_inputs_impure_and_lowerable():
    op = Op.get(COPY_TENSOR_OP)
    assert COPY_TENSOR_OP == "relax.vm.copy_tensor"
    assert op.num_inputs == 2
    assert [arg.name for arg in op.arguments] == ["src", "dst"]
    assert op.get_attr("FPurity") is False
    assert op.has_attr(INFER_TYPE_ATTR) and op.has_attr("FLowerBuiltin")
    # No PyPI TVM has the op: this one is ours.
    assert op.get_attr(ops._OWNER_ATTR) is True
    assert R.vm.copy_tensor is ops.copy_tensor


def test_reimport_and_reload_are_no_ops():
    op_before = Op.get(COPY_TENSOR_OP)
    reloaded = importlib.reload(ops)
    importlib.reload(reloaded)
    assert Op.get(COPY_TENSOR_OP).same_as(op_before)
    # The parser now resolves the reloaded module's function, which still works.
    assert R.vm.copy_tensor is reloaded.copy_tensor
    mod = _impure_copy_function(TensorType((4,), "int8"), TensorType((4,), "int8"))
    relax.analysis.well_formed(mod)


def test_call_is_void_impure_and_well_formed_in_an_impure_function():
    mod = _impure_copy_function(TensorType((2, 3), "float32"), TensorType((2, 3), "float32"))
    binding = mod["main"].body.blocks[0].bindings[0]
    assert isinstance(binding.value, relax.Call) and binding.value.op.same_as(Op.get(COPY_TENSOR_OP))
    # (An empty TupleType's repr is "None" in TVM 0.27: compare structurally.)
    tvm.ir.assert_structural_equal(ty(binding.var), VOID)
    tvm.ir.assert_structural_equal(ty(relax.BlockBuilder().normalize(binding.value)), VOID)
    assert relax.analysis.contains_impure_call(mod["main"])
    assert relax.analysis.check_well_formed(mod)


def test_call_in_a_pure_function_is_not_well_formed():
    mod = _impure_copy_function(TensorType((4,), "float32"), TensorType((4,), "float32"), pure=True)
    assert not relax.analysis.check_well_formed(mod)


def test_type_inference_accepts_equal_byte_sizes_across_shapes_and_dtypes():
    # 4 x float32 == 2 x float64 == 16 bytes: the runtime copy only compares byte sizes.
    mod = _impure_copy_function(TensorType((4,), "float32"), TensorType((2,), "float64"))
    assert relax.analysis.check_well_formed(mod)
    # Unknown shapes are left to the runtime check.
    mod = _impure_copy_function(TensorType(ndim=1, dtype="float32"), TensorType((5,), "float32"))
    assert relax.analysis.check_well_formed(mod)


@pytest.mark.parametrize(
    ("src_ty", "dst_ty", "message"),
    [
        (TensorType((4,), "float32"), TensorType((5,), "float32"), "16 bytes"),
        (TensorType((4,), "int8"), TensorType((4,), "int16"), "8 bytes"),
        (TensorType((4,), "float32"), ShapeType(ndim=1), "dst must be a tensor"),
    ],
)
def test_type_inference_rejects_what_the_runtime_copy_would(src_ty, dst_ty, message):
    call = copy_tensor(relax.Var("x", src_ty), relax.Var("a", dst_ty))
    with pytest.raises((ValueError, TypeError), match=message):
        relax.BlockBuilder().normalize(call)


@I.ir_module
class Seed:
    """The seed module of the forum thread, for the CPU (storage scope "global")."""

    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), dtype="int32")) -> R.Tensor((32, 64), dtype="int32"):
        vtcm_obj: R.Object = R.vm.alloc_storage(R.shape([16384]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a: R.Tensor((32, 64), dtype="int32") = R.vm.alloc_tensor(
            vtcm_obj, R.prim_value(0), R.shape([32, 64]), R.dtype("int32")
        )
        R.vm.copy_tensor(x, a)
        b: R.Tensor((32, 64), dtype="int32") = R.vm.alloc_tensor(
            vtcm_obj, R.prim_value(8192), R.shape([32, 64]), R.dtype("int32")
        )
        R.vm.copy_tensor(a, b)
        out: R.Tensor((32, 64), dtype="int32") = R.builtin.alloc_tensor(
            R.shape([32, 64]), R.dtype("int32"), R.prim_value(0)
        )
        R.vm.copy_tensor(b, out)
        return out


def test_tvmscript_prints_and_parses_the_op():
    text = Seed.script()
    assert "R.vm.copy_tensor(x, a)" in text
    assert "R.vm.copy_tensor(a, b)" in text
    parsed = tvm.script.from_source(text)
    tvm.ir.assert_structural_equal(parsed, Seed)
    assert parsed.script() == text


def test_lowering_replaces_the_op_by_the_runtime_copy():
    lowered = relax.transform.LowerRuntimeBuiltin()(relax.transform.LowerAllocTensor()(Seed))
    calls = [b.value for b in lowered["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    copies = [c for c in calls if isinstance(c.op, relax.ExternFunc)]
    assert [c.op.global_symbol for c in copies] == ["runtime.TVMTensorCopyFromTo"] * 3
    assert not any(isinstance(c.op, Op) and c.op.name == COPY_TENSOR_OP for c in calls)
    assert [[var_name(arg) for arg in c.args] for c in copies] == [["x", "a"], ["a", "b"], ["b", "out"]]


def _run(mod: tvm.IRModule, exec_mode: str, *inputs: np.ndarray):
    executable = relax.build(mod, target="llvm", exec_mode=exec_mode)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(x) for x in inputs))


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_seed_module_runs(exec_mode):
    x = np.random.default_rng(0).integers(-1000, 1000, size=(32, 64), dtype="int32")
    np.testing.assert_array_equal(_run(Seed, exec_mode, x).numpy(), x)


def _offset_module(offset: int) -> tvm.IRModule:
    # a = storage[0:128), b = storage[offset:offset + 128): with offset 128, b sits right
    # after a, so a copy that ignored either offset would overwrite the other tensor.
    #
    # What works with a tensor at a non-zero byte offset on the CPU (TVM 0.27):
    # - R.vm.copy_tensor into or out of it (runtime.TVMTensorCopyFromTo honours byte_offset);
    # - returning it: Tensor.numpy() honours byte_offset;
    # - R.memory.ensure_zero_offset(b), then any kernel: lowered to
    #   vm.builtin.ensure_zero_offset, a zero-copy view with the data pointer moved when
    #   the offset is a multiple of 64 (kAllocAlignment), else a copy into a new tensor.
    # What fails: passing it to a compiled kernel (R.add(a, b), any call_tir), which raises
    # ValueError "Invalid b.byte_offset on argument #1 ... expected 0".
    @I.ir_module
    class Offsets:
        @R.function(pure=False)
        def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
            storage = R.vm.alloc_storage(R.shape([512]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
            a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
            b = R.vm.alloc_tensor(storage, R.prim_value(offset), R.shape([4, 8]), R.dtype("float32"))
            R.vm.copy_tensor(x, a)
            R.vm.copy_tensor(a, b)  # b = x
            R.vm.copy_tensor(y, a)  # a = y; b must keep x
            diff = R.subtract(a, R.memory.ensure_zero_offset(b))  # y - x
            c = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
            R.vm.copy_tensor(b, c)  # back to a fresh offset-0 tensor
            prod = R.multiply(c, a)  # x * y
            return (diff, prod, b)

    return Offsets


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
@pytest.mark.parametrize("offset", [128, 132], ids=["aligned-offset", "unaligned-offset"])
def test_copies_into_and_out_of_a_tensor_at_a_nonzero_offset(exec_mode, offset):
    rng = np.random.default_rng(offset)
    x, y = rng.standard_normal((2, 4, 8), dtype="float32")
    diff, prod, b = _run(_offset_module(offset), exec_mode, x, y)
    np.testing.assert_array_equal(diff.numpy(), y - x)
    np.testing.assert_array_equal(prod.numpy(), x * y)
    np.testing.assert_array_equal(b.numpy(), x)


def test_a_kernel_rejects_a_tensor_at_a_nonzero_offset():
    # The reason for ensure_zero_offset above: this is the trap it avoids.
    @I.ir_module
    class Direct:
        @R.function(pure=False)
        def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
            storage = R.vm.alloc_storage(R.shape([512]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
            a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
            b = R.vm.alloc_tensor(storage, R.prim_value(128), R.shape([4, 8]), R.dtype("float32"))
            R.vm.copy_tensor(x, a)
            R.vm.copy_tensor(y, b)
            out = R.add(a, b)
            return out

    x = np.ones((4, 8), "float32")
    with pytest.raises(ValueError, match="byte_offset"):
        _run(Direct, "bytecode", x, x)


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_runtime_rejects_a_byte_size_mismatch_that_types_cannot_see(exec_mode):
    @I.ir_module
    class Dynamic:
        @R.function(pure=False)
        def main(x: R.Tensor(("n",), "float32")):
            out = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
            R.vm.copy_tensor(x, out)
            return out

    np.testing.assert_array_equal(_run(Dynamic, exec_mode, np.arange(4, dtype="float32")).numpy(), np.arange(4))
    with pytest.raises(RuntimeError, match="size in bytes must exactly match"):
        _run(Dynamic, exec_mode, np.arange(5, dtype="float32"))
