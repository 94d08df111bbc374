"""rewrite_ext.compat: one spelling that means the installed TVM's own names (0.25, 0.26, 0.27)."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import relax as R

from rewrite_ext import compat


def test_the_types_are_the_installed_tvms_and_read_back_through_ty():
    x = relax.Var("x", compat.TensorType([4, 8], "float16"))
    assert isinstance(compat.ty(x), compat.TensorType)
    assert compat.dtype_name(compat.ty(x)) == "float16"
    assert compat.var_name(x) == "x"
    pair = relax.Var("p", compat.TupleType([compat.ty(x), compat.ShapeType(ndim=2)]))
    assert isinstance(compat.ty(pair), compat.TupleType)
    assert isinstance(compat.ty(relax.Var("n", compat.PrimType("int64"))), compat.PrimType)
    # R.Object and R.Callable parameters are typed by the same classes TVMScript gives them
    @R.function
    def f(o: R.Object, g: R.Callable([R.Tensor((4,), "float32")], R.Tensor((4,), "float32"))):
        return o

    assert isinstance(compat.ty(f.params[0]), compat.ObjectType)
    assert isinstance(compat.ty(f.params[1]), compat.FuncType)
    assert tvm_ffi.structural_equal(compat.ret_ty(f), compat.ty(f.params[0]))


def test_void_calls_and_immediates_are_what_tvmscript_parses():
    @R.function(pure=False)
    def parsed(x: R.Tensor((4,), "float32")):
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 3, 1, x, x), **compat.VOID_TY_ARGS)
        return x

    (binding,) = parsed.body.blocks[0].bindings
    fields = list(binding.value.args[1].fields)
    assert [compat.imm_value(f) for f in fields[:3]] == [0, 3, 1]
    built = relax.op.call_builtin_with_ctx(
        "vm.builtin.hexagon.dma_wait", relax.Tuple([compat.imm(0), compat.imm(3), compat.imm(1), *fields[3:]]),
        **compat.VOID_TY_ARGS,
    )
    tvm.ir.assert_structural_equal(built.args[1], binding.value.args[1], map_free_vars=True)
    assert tvm_ffi.structural_equal(compat.ty_args(binding.value)[0], compat.void())
    assert compat.imm_value(fields[3]) is None  # a var is not an immediate


def test_a_symbolic_offset_is_an_argument_and_set_type_and_data_ptr_work():
    n = tvm.tirx.Var("n", "int64")
    storage = relax.Var("s", compat.ObjectType())
    call = relax.op.vm.alloc_tensor(storage, compat.imm(n), relax.ShapeExpr([4]), "float32")
    assert compat.imm_value(call.args[1]) is None
    fresh = relax.Call(tvm.ir.Op.get("relax.add"), [relax.Var("a"), relax.Var("b")])
    compat.set_type(fresh, compat.TensorType([4], "float32"))
    assert isinstance(compat.ty(fresh), compat.TensorType)
    data = np.arange(8, dtype="float32")
    whole = tvm.runtime.tensor(data)
    other = tvm.runtime.tensor(data)
    assert compat.data_ptr(whole) != compat.data_ptr(other)
    assert compat.data_ptr(whole) == compat.data_ptr(whole)
