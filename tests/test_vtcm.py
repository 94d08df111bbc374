"""stage_in_vtcm: kernel inputs staged into planned VTCM slots, then DMA, run on the CPU."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext  # noqa: F401 - registers R.vm.copy_tensor
from rewrite_ext.hexagon import (
    CPUVTCM,
    LowerToVMIR,
    DMA_COPY,
    DMA_WAIT,
    VTCM_BLOCK_BYTES,
    VTCM_SCOPE,
    VTCMCapacityWarning,
    copy_to_dma,
    cpu_dma,
    cpu_vtcm,
    overlap_report,
    plan_vtcm,
    stage_in_vtcm,
    vtcm_capacity,
)
from rewrite_ext.compat import VOID_TY_ARGS, TensorType, ty_args, var_name
from _helpers import spelled_as_026

_spec = importlib.util.spec_from_file_location(
    "mlp_vtcm", Path(__file__).resolve().parent.parent / "examples" / "mlp_vtcm.py"
)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
LOWER = example.LOWER_TO_VM_IR


@I.ir_module
class Tiny:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((8,), "float32"), z: R.Tensor((16, 8), "float32")):
        with R.dataflow():
            a = R.add(x, y)
            b = R.multiply(a, a)
            c = R.concat([b, z, b], axis=0)
            R.output(c)
        return c


TINY = LOWER(Tiny)


def _run(mod: tvm.IRModule, inputs: list[np.ndarray], name: str = "main") -> np.ndarray:
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm[name](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _tiny_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in [(4, 8), (8,), (16, 8)]]


def _vtcm_lines(func: relax.Function) -> list[str]:
    keep = ("vtcm", "add(", "multiply(", "concatenate(")
    return [line.strip() for line in spelled_as_026(func.script()).splitlines() if any(k in line for k in keep)]


def _staged(mod: tvm.IRModule, **kwargs) -> tvm.IRModule:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no tensor left in place unless a test says so
        return stage_in_vtcm(mod, **kwargs)


# -- the IR ------------------------------------------------------------------------------


def test_tiny_module_exact_staging():
    staged = _staged(TINY)
    assert _vtcm_lines(staged["main"]) == [
        'vtcm_storage: R.Any = R.vm.alloc_storage(R.shape([512]), 0, R.dtype("uint8"), R.str("global.vtcm"))',
        'x_vtcm: R.Tensor((4, 8), dtype="float32") = R.vm.alloc_tensor(vtcm_storage, 0, R.shape([4, 8]), R.dtype("float32"), 0)',
        "R.vm.copy_tensor(x, x_vtcm)",
        'vtcm_storage1: R.Any = R.vm.alloc_storage(R.shape([128]), 0, R.dtype("uint8"), R.str("global.vtcm"))',
        'y_vtcm: R.Tensor((8,), dtype="float32") = R.vm.alloc_tensor(vtcm_storage1, 0, R.shape([8]), R.dtype("float32"), 0)',
        "R.vm.copy_tensor(y, y_vtcm)",
        "add(x_vtcm, y_vtcm, alloc)",
        # a different call: the same slots again
        'a_vtcm: R.Tensor((4, 8), dtype="float32") = R.vm.alloc_tensor(vtcm_storage, 0, R.shape([4, 8]), R.dtype("float32"), 0)',
        "R.vm.copy_tensor(a, a_vtcm)",
        # an argument passed twice is staged once; the output alloc1 is never staged
        "multiply(a_vtcm, a_vtcm, alloc1)",
        'b_vtcm: R.Tensor((4, 8), dtype="float32") = R.vm.alloc_tensor(vtcm_storage1, 0, R.shape([4, 8]), R.dtype("float32"), 0)',
        "R.vm.copy_tensor(b, b_vtcm)",
        'z_vtcm: R.Tensor((16, 8), dtype="float32") = R.vm.alloc_tensor(vtcm_storage, 0, R.shape([16, 8]), R.dtype("float32"), 0)',
        "R.vm.copy_tensor(z, z_vtcm)",
        "concatenate(b_vtcm, z_vtcm, b_vtcm, alloc2)",
    ]
    relax.analysis.well_formed(staged)


def test_the_input_is_not_changed_and_a_second_staging_finds_everything_in_vtcm():
    before = TINY.script()
    staged = _staged(TINY)
    assert TINY.script() == before
    plan = plan_vtcm(staged)
    assert plan.tensors == ()
    tvm.ir.assert_structural_equal(_staged(staged), staged)


def test_plan_lists_every_chosen_argument_and_the_slots():
    plan = plan_vtcm(TINY)
    assert [(t.kernel, t.argument, t.indices, t.nbytes, t.slot) for t in plan.tensors] == [
        ("add", "x", (0,), 128, 0),
        ("add", "y", (1,), 32, 1),
        ("multiply", "a", (0, 1), 128, 0),
        ("concatenate", "b", (0, 2), 128, 1),
        ("concatenate", "z", (1,), 512, 0),
    ]
    assert plan.slots == {"main": (512, 128)}
    assert plan.left_in_place == []
    assert "5 tensor(s) staged, 0 left in place; main: 640 bytes in 2 slot(s), 4096 in 2048-byte blocks" in str(plan)


# -- capacity ----------------------------------------------------------------------------


def test_exact_capacity_in_whole_blocks_stages_everything_one_byte_less_leaves_some_in_place():
    # TVM's VTCM allocator rounds every storage up to 2 KiB: Tiny's slots of 512 and 128
    # bytes take two blocks.
    assert plan_vtcm(TINY, capacity=2 * VTCM_BLOCK_BYTES).left_in_place == []
    plan = plan_vtcm(TINY, capacity=2 * VTCM_BLOCK_BYTES - 1)
    assert [(t.kernel, t.argument) for t in plan.left_in_place] == [("add", "y"), ("concatenate", "b")]
    assert plan.slots == {"main": (512,)}
    with pytest.warns(VTCMCapacityWarning, match=r"2 tensor\(s\) do not fit in 4095 bytes.*concatenate argument b"):
        staged = stage_in_vtcm(TINY, capacity=2 * VTCM_BLOCK_BYTES - 1)
    assert "concatenate(b, z_vtcm, b, alloc2)" in _vtcm_lines(staged["main"])


def test_a_tensor_larger_than_vtcm_stays_in_place_and_smaller_ones_share_what_is_left():
    mod = _concat_module([[0, 1], [2]], [2048, 256, 300])  # float32: 8 KiB, 1 KiB, 1200 bytes
    plan = plan_vtcm(mod, capacity=2 * VTCM_BLOCK_BYTES)
    assert [t.nbytes for t in plan.left_in_place] == [8192]
    assert plan.slots == {"main": (1200,)}  # the 1 KiB tensor's slot, grown for the next call


def test_vtcm_the_function_allocates_already_is_not_planned_again():
    # Staging a staged module again, or after a pass that allocates VTCM itself, stays within
    # the capacity: the tensor left in place the first time is left in place again.
    capacity = 2 * VTCM_BLOCK_BYTES - 1
    with pytest.warns(VTCMCapacityWarning):
        once = stage_in_vtcm(TINY, capacity=capacity)
    with pytest.warns(VTCMCapacityWarning, match="concatenate argument b"):
        twice = stage_in_vtcm(once, capacity=capacity)
    tvm.ir.assert_structural_equal(twice, once)


def test_zero_capacity_changes_nothing_and_reports_every_tensor():
    with pytest.warns(VTCMCapacityWarning, match=r"5 tensor\(s\)"):
        staged = stage_in_vtcm(TINY, capacity=0)
    assert staged.same_as(TINY)  # nothing staged: the input itself, as rewrite_call gives it


def test_the_capacity_warning_gives_what_each_function_short_of_vtcm_needs():
    class Two(nn.Module):
        def __init__(self) -> None:
            self.a, self.b = nn.Linear(8, 8), nn.Linear(64, 64)

        def small(self, x: nn.Tensor) -> nn.Tensor:
            return self.a(x)

        def large(self, x: nn.Tensor) -> nn.Tensor:
            return self.b(x)

    spec = {"small": {"x": nn.spec.Tensor((1, 8), "float32")}, "large": {"x": nn.spec.Tensor((1, 64), "float32")}}
    lowered = LOWER(Two().export_tvm(spec=spec)[0])
    needed = {name: sum(_blocks(s) for s in sizes) for name, sizes in plan_vtcm(lowered).slots.items()}
    message = rf"would take {needed['large']} bytes in 'large', {needed['small']} bytes in 'small', beside"
    with pytest.warns(VTCMCapacityWarning, match=message):
        stage_in_vtcm(lowered, capacity=0)
    with pytest.warns(VTCMCapacityWarning, match=rf"would take {needed['large']} bytes in 'large', beside"):
        stage_in_vtcm(lowered, capacity=needed["small"])  # small fits: only large is short


@pytest.mark.parametrize(
    "target, capacity",
    [("qcom/hexagon-v68", 4 << 20), ("qcom/hexagon-v73", 8 << 20), ("qcom/hexagon-v75", 8 << 20), ("qcom/hexagon-v66", 256 << 10)],
)
def test_capacity_of_hexagon_targets(target, capacity):
    assert vtcm_capacity(target) == capacity
    assert vtcm_capacity(tvm.target.Target(target)) == capacity
    assert plan_vtcm(TINY, capacity=target).capacity == capacity


def test_capacity_defaults_to_the_current_target_then_v68():
    assert vtcm_capacity() == 4 << 20
    with tvm.target.Target("qcom/hexagon-v73"):
        assert plan_vtcm(TINY).capacity == 8 << 20
    with tvm.target.Target("llvm"):  # says nothing of VTCM
        assert plan_vtcm(TINY).capacity == 4 << 20


def test_capacity_errors_name_the_fix():
    with pytest.raises(ValueError, match="no 'vtcm-capacity' attribute; pass a Hexagon target"):
        vtcm_capacity("llvm")
    with pytest.raises(ValueError, match="bytes >= 0"):
        vtcm_capacity(-1)
    with pytest.raises(TypeError, match="number of bytes .int., a Hexagon target or its name, got float 1.5"):
        plan_vtcm(TINY, capacity=1.5)
    with pytest.raises(ValueError, match="capacity '36000' is not a target TVM knows"):
        plan_vtcm(TINY, capacity="36000")
    assert plan_vtcm(TINY, capacity=np.int64(36000)).capacity == 36000
    with pytest.raises(TypeError, match="needs the IRModule"):
        stage_in_vtcm(TINY["main"])


# -- what is chosen ----------------------------------------------------------------------


def test_select_chooses_among_the_inputs():
    seen = []

    def only_weights(call: relax.Call, index: int) -> bool:
        seen.append((call.op.name_hint, index))
        return var_name(call.args[index]) in ("y", "z")

    plan = plan_vtcm(TINY, select=only_weights)
    assert [t.argument for t in plan.tensors] == ["y", "z"]
    # asked only about inputs: never about the outputs alloc, alloc1, alloc2
    assert seen == [("add", 0), ("add", 1), ("multiply", 0), ("multiply", 1), ("concatenate", 0), ("concatenate", 1), ("concatenate", 2)]


def test_a_select_built_from_the_plans_argument_names_chooses_those_arguments():
    # The plan prints nn's `fc1.weight` as `fc1_weight`; `.argument` is the name select sees.
    lowered = LOWER(example.export()[0])
    weights = {t.argument for t in plan_vtcm(lowered).tensors if "weight" in t.argument}
    assert weights == {"fc1.weight", "fc2.weight"}
    plan = plan_vtcm(lowered, select=lambda call, i: var_name(call.args[i]) in weights)
    assert {t.argument for t in plan.staged} == weights
    assert "transpose argument fc1_weight" in str(plan)


@I.ir_module
class Dynamic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor((8,), "float32")):
        with R.dataflow():
            a = R.add(x, y)
            R.output(a)
        return a


def test_tensors_of_unknown_size_are_not_staged():
    plan = plan_vtcm(LOWER(Dynamic))
    assert [t.argument for t in plan.tensors] == ["y"]


@tvm.register_global_func("test_vtcm.double_into", override=True)
def _double_into(x, out):
    out.copyfrom(x.numpy() * 2)


@I.ir_module
class Packed:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        s = R.vm.alloc_storage(R.shape([128]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        out = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
        R.call_packed("test_vtcm.double_into", x, out, **VOID_TY_ARGS)
        return out


def test_call_packed_arguments_only_when_selected():
    # a packed function may write any argument: staging it (copy in only) could lose the write
    assert plan_vtcm(Packed).tensors == ()
    staged = _staged(Packed, select=lambda call, index: index == 0)
    assert "R.call_packed(\"test_vtcm.double_into\", x_vtcm, out, ty_args=(R.Tuple,))" in spelled_as_026(staged["main"].script())
    (x,) = [_tiny_inputs()[0]]
    with cpu_vtcm() as vtcm, cpu_dma() as dma:
        got = _run(copy_to_dma(staged), [x])
    np.testing.assert_array_equal(got, 2 * x)
    assert vtcm.allocations == [128] and dma.copies == dma.completed == 1


@I.ir_module
class Branchy:
    @R.function
    def main(c: R.Tensor((), "bool"), x: R.Tensor((4,), "float32")):
        y = R.add(x, x)
        if c:
            z = R.multiply(y, y)
        else:
            z = R.subtract(y, x)
        w = R.add(z, y)
        return w


def test_calls_inside_if_branches_are_left_alone():
    # a storage emitted inside a branch would not be visible to the rest of the function
    lowered = LOWER(Branchy)
    plan = plan_vtcm(lowered)
    assert [(t.kernel, t.argument) for t in plan.tensors] == [("add", "x"), ("add", "z"), ("add", "y")]
    staged = _staged(lowered)
    relax.analysis.well_formed(staged)
    text = staged["main"].script()
    assert "multiply(y, y, alloc1)" in text and "subtract(y, x, alloc2)" in text
    assert "add(z_vtcm, y_vtcm, alloc3)" in text


# -- running on the CPU ------------------------------------------------------------------


def test_vtcm_storage_needs_the_stand_in_on_the_cpu():
    staged = _staged(TINY)
    with pytest.raises(tvm.error.InternalError, match="This alloc should be implemented"):
        _run(staged, _tiny_inputs())
    with cpu_vtcm() as vtcm:
        with pytest.raises(RuntimeError, match="does not nest"):
            with cpu_vtcm():
                pass
        assert CPUVTCM.active() is vtcm
        got = _run(staged, _tiny_inputs())
    x, y, z = _tiny_inputs()
    b = (x + y) * (x + y)
    np.testing.assert_allclose(got, np.concatenate([b, z, b]), rtol=1e-6)
    assert vtcm.allocations == [512, 128]
    # left: TVM's allocator is back
    assert CPUVTCM.active() is None
    with pytest.raises(tvm.error.InternalError):
        _run(staged, _tiny_inputs())


# Two kernels that write their first parameter where TVM's region analysis sees no write of
# it: through a decl_buffer over its data, and through a pointer handed to an extern call.
@I.ir_module
class WritesThroughAnAlias:
    @T.prim_func(private=True, s_tir=True)
    def fill(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        alias = T.decl_buffer((4,), "float32", data=A.data)
        for i in range(4):
            with T.sblock("b"):
                vi = T.axis.spatial(4, i)
                alias[vi] = B[vi] + T.float32(1)

    @R.function
    def main(x: R.Tensor((4,), "float32"), out: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = WritesThroughAnAlias
        cls.fill(out, x)
        return out


@I.ir_module
class WritesThroughAPointer:
    @T.prim_func(private=True, s_tir=True)
    def fill(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("b"):
                vi = T.axis.spatial(4, i)
                T.evaluate(T.call_extern("int32", "memcpy", T.address_of(A[vi]), T.address_of(B[vi]), 4))

    @R.function
    def main(x: R.Tensor((4,), "float32"), out: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = WritesThroughAPointer
        cls.fill(out, x)
        return out


@pytest.mark.parametrize(
    "mod, expected",
    [(WritesThroughAnAlias, [1, 2, 3, 4]), (WritesThroughAPointer, [0, 1, 2, 3])],
    ids=["decl_buffer alias", "address_of in an extern call"],
)
def test_an_argument_the_kernel_writes_through_an_alias_or_a_pointer_is_not_staged(mod, expected):
    # Staged, the kernel would write the VTCM copy and `out` would keep what it held.
    x, out = np.arange(4, dtype="float32"), np.full(4, -7, "float32")
    staged = stage_in_vtcm(mod)
    assert "out" not in [t.argument for t in plan_vtcm(mod).tensors]
    with cpu_vtcm():
        got = _run(staged, [x, out])
    np.testing.assert_array_equal(got, np.array(expected, "float32"))
    np.testing.assert_array_equal(_run(mod, [x, out]), got)


@I.ir_module
class ScalarParam:
    @T.prim_func(private=True, s_tir=True)
    def scale(a: T.Buffer((8,), "float32"), n: T.int64, b: T.Buffer((8,), "float32")):
        for i in range(8):
            with T.sblock("b"):
                vi = T.axis.spatial(8, i)
                T.reads(a[vi])
                T.writes(b[vi])
                b[vi] = a[vi] * T.Cast("float32", n)

    @R.function
    def main(x: R.Tensor((8,), "float32")) -> R.Tensor((8,), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = ScalarParam
        storage = R.vm.alloc_storage(R.shape([32]), R.prim_value(0), R.dtype("uint8"))
        out = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([8]), R.dtype("float32"))
        cls.scale(x, R.prim_value(T.int64(3)), out)
        return out


def test_a_kernel_with_a_scalar_parameter_has_its_tensor_input_staged():
    # TVM passes symbolic dims to kernels as scalar parameters (`n: T.int64`); asking TVM
    # which parameters such a kernel writes raised a TypeError (found by the generated-IR test).
    assert [(t.argument, t.indices) for t in plan_vtcm(ScalarParam).staged] == [("x", (0,))]
    x = np.arange(8, dtype="float32")
    with cpu_vtcm(), cpu_dma() as dma:
        got = _run(copy_to_dma(stage_in_vtcm(ScalarParam)), [x])
    np.testing.assert_array_equal(got, 3 * x)
    assert dma.copies == 1


@I.ir_module
class ReadAndWrittenAtOnce:
    @T.prim_func(private=True, s_tir=True)
    def shift_add(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        for i in range(15):
            with T.sblock("c"):
                vi = T.axis.spatial(15, i)
                T.reads(a[vi])
                T.writes(b[vi + 1])
                b[vi + 1] = a[vi] + T.float32(1)

    @R.function
    def main(x: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = ReadAndWrittenAtOnce
        cls.shift_add(x, x)
        return x


def test_a_tensor_passed_as_an_input_and_as_an_output_of_one_call_is_not_staged():
    # (Found by an adversarial trial: the input position was staged, so the kernel read the
    # VTCM copy, never the values it had just written: [0 1 1 1 ...] for [0 1 2 3 ...].)
    assert plan_vtcm(ReadAndWrittenAtOnce).tensors == ()
    with cpu_vtcm():
        got = _run(stage_in_vtcm(ReadAndWrittenAtOnce), [np.zeros(16, "float32")])
    np.testing.assert_array_equal(got, np.arange(16, dtype="float32"))


def _read_and_written_through(alias: str) -> tvm.IRModule:
    """ReadAndWrittenAtOnce, the kernel writing what it reads through another var: ``alias``."""
    call = ReadAndWrittenAtOnce["main"].body.blocks[0].bindings[0].value
    x = relax.Var("x", TensorType((16,), "float32"))
    kernel = ReadAndWrittenAtOnce.get_global_var("shift_add")
    bb = relax.BlockBuilder(tvm.IRModule({kernel: ReadAndWrittenAtOnce[kernel]}))
    with bb.function("main", [x], {"relax.force_pure": True}):
        data = x
        if alias == "match_cast":
            out = bb.match_cast(x, TensorType((16,), "float32"))
        elif alias == "view":
            out = bb.emit(relax.op.memory.view(x, relax.ShapeExpr([16]), "float32"))
        elif alias == "tuple item":
            out = bb.emit(relax.TupleGetItem(bb.emit(relax.Tuple([x])), 0))
        else:  # two tensors at one offset of one storage
            storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([64]), 0, "uint8"))
            data, out = (bb.emit(relax.op.vm.alloc_tensor(storage, 0, relax.ShapeExpr([16]), "float32")) for _ in "ab")
            bb.emit(rewrite_ext.ops.copy_tensor(x, data))
        bb.emit(relax.Call(call.op, [data, out], call.attrs, ty_args(call)))
        bb.emit_func_output(data)
    return bb.get()


@pytest.mark.parametrize("alias", ["match_cast", "view", "tuple item", "one storage"])
def test_an_input_over_the_bytes_of_an_output_of_one_call_is_not_staged(alias):
    # The kernel writes through `out` the bytes it reads through `data`: a VTCM copy of `data`
    # would not see those writes ([0 1 1 1 ...] where the module gives [0 1 2 3 ...]).
    mod = _read_and_written_through(alias)
    relax.analysis.well_formed(mod)
    assert plan_vtcm(mod).tensors == ()
    assert stage_in_vtcm(mod).same_as(mod)
    expected = np.arange(16, dtype="float32")
    np.testing.assert_array_equal(_run(mod, [np.zeros(16, "float32")]), expected)


@pytest.mark.parametrize("prefetch", [False, True], ids=["shared", "prefetch"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("capacity", ["qcom/hexagon-v68", 36000], ids=["v68", "36000"])
def test_mlp_lowered_by_tvm_staged_and_dma_equals_the_model(capacity, overlap, prefetch):
    model, inputs = example.export()
    expected = _run(model, inputs, "forward")
    lowered = LOWER(model)
    plan = plan_vtcm(lowered, capacity=capacity, prefetch=prefetch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VTCMCapacityWarning)
        staged = copy_to_dma(stage_in_vtcm(lowered, capacity=capacity, prefetch=prefetch), overlap=overlap)
    relax.analysis.well_formed(staged)
    # relax.build runs these passes again: they must leave the staged IR as it is
    tvm.ir.assert_structural_equal(LOWER(staged), staged)
    with cpu_vtcm() as vtcm, cpu_dma() as dma:
        got = _run(staged, inputs, "forward")
    np.testing.assert_array_equal(got, expected)
    # every staged tensor went by DMA, nothing else did, and VTCM held the planned slots
    assert dma.copies == dma.completed == len(plan.staged) > 0
    assert dma.bytes_copied == sum(t.nbytes for t in plan.staged)
    assert sorted(vtcm.allocations) == sorted(plan.slots["forward"])
    assert sum(vtcm.allocations) <= plan.capacity
    assert (len(plan.left_in_place) > 0) == (capacity == 36000)
    if overlap:
        assert dma.peak_in_flight[0] >= 2  # a kernel's two inputs in flight together


def _kernels_during(func: relax.Function, src: str) -> list[str]:
    """The kernels called while the transfer from ``src`` is in flight (its copy to its wait)."""
    values = [b.value for block in func.body.blocks for b in block.bindings]

    def dma_of(value: relax.Expr, builtin: str) -> list:
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_builtin_with_ctx":
            if value.args[0].global_symbol == builtin:
                return [var_name(f) if isinstance(f, relax.Var) else f for f in value.args[1].fields]
        return [None] * 5

    copy = next(i for i, v in enumerate(values) if dma_of(v, DMA_COPY)[0] == src)
    wait = next(i for i, v in enumerate(values) if dma_of(v, DMA_WAIT)[3] == src)
    return [
        v.op.name_hint
        for v in values[copy + 1 : wait]
        if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar)
    ]


def test_in_the_staged_mlp_a_transfer_is_in_flight_while_a_kernel_runs():
    # relu_vtcm (slot 1) is allocated just before matmul1; its allocation moves up with the
    # transfer, which then runs while transpose1 works on slot 0.  x_vtcm's too, with slot 1's
    # storage (allocated at its first use, just before).
    lowered = LOWER(example.export()[0])
    func = copy_to_dma(stage_in_vtcm(lowered, capacity="qcom/hexagon-v68"), overlap=True)["forward"]
    assert _kernels_during(func, "relu") == ["transpose1"]
    assert _kernels_during(func, "x") == ["transpose"]  # slot 1's storage moves up with it too
    assert _kernels_during(func, "fc2.weight") == []  # slot 0, which relu reads


def test_prefetch_gives_consecutive_calls_other_slots_so_weights_load_during_the_call_before():
    plan = plan_vtcm(TINY, prefetch=True)
    slots = [[t.slot for t in plan.tensors if t.kernel == k] for k in ("add", "multiply", "concatenate")]
    for before, after in zip(slots, slots[1:]):
        assert not set(before) & set(after)
    assert sum(plan.slots["main"]) > sum(plan_vtcm(TINY).slots["main"])  # the price: more VTCM
    lowered = LOWER(example.export()[0])
    staged = stage_in_vtcm(lowered, capacity="qcom/hexagon-v68", prefetch=True)
    func = copy_to_dma(staged, overlap=True)["forward"]
    assert _kernels_during(func, "fc2.weight") == ["relu"]
    assert _kernels_during(func, "relu") == ["transpose1"]
    assert sorted(t.src for t in overlap_report(func) if t.kernels) == ["fc2_weight", "relu", "x"]  # as TVMScript prints it
    # On two queues a weight's copy need not wait behind the previous kernel's output's.
    func = copy_to_dma(staged, overlap=True, num_queues=2)["forward"]
    assert _kernels_during(func, "fc1.bias") == ["matmul"]


class Block(nn.Module):
    """A small GPT-style block: LayerNorm, single-head attention, residual, LayerNorm, MLP, residual."""

    def __init__(self, d: int = 32, hidden: int = 64) -> None:
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.scale = d**-0.5

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        q, k, v = nn.op.split(self.qkv(self.ln1(x)), 3, axis=-1)
        att = nn.op.softmax(nn.op.matmul(q, nn.op.permute_dims(k, [0, 2, 1])) * self.scale, axis=-1)
        x = x + self.proj(nn.op.matmul(att, v))
        return x + self.fc2(nn.relu(self.fc1(self.ln2(x))))


def test_gpt_block_staged_in_a_small_vtcm_over_two_queues_equals_the_model():
    model, params = Block().export_tvm(spec={"forward": {"x": nn.spec.Tensor((1, 8, 32), "float32")}})
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype("float32") for s in [(1, 8, 32)] + [tuple(p.shape) for _, p in params]]
    expected = _run(model, inputs, "forward")
    lowered = LOWER(model)
    plan = plan_vtcm(lowered, capacity=8192)
    # the 12 KiB and 8 KiB weights do not fit; everything else shares three slots
    assert {t.nbytes for t in plan.left_in_place} == {12288, 8192}
    assert len(plan.slots["forward"]) == 3
    with pytest.warns(VTCMCapacityWarning):
        staged = stage_in_vtcm(lowered, capacity=8192)
    with cpu_vtcm() as vtcm, cpu_dma() as dma:
        got = _run(copy_to_dma(staged, overlap=True, num_queues=2), inputs, "forward")
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == dma.completed == len(plan.staged)
    assert dma.bytes_copied == sum(t.nbytes for t in plan.staged)
    assert sorted(vtcm.allocations) == sorted(plan.slots["forward"])
    assert set(dma.peak_in_flight) == {0, 1}


def test_gpt_block_fused_by_tvms_zero_pipeline_staged_with_overlap_equals_the_model():
    # FuseOps and FuseTIR make kernels of several ops each (fused_matmul_add, ...): what a
    # Hexagon build runs.  The region analysis must tell their inputs from their outputs.
    model, params = Block().export_tvm(spec={"forward": {"x": nn.spec.Tensor((1, 8, 32), "float32")}})
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(s).astype("float32") for s in [(1, 8, 32)] + [tuple(p.shape) for _, p in params]]
    expected = _run(model, inputs, "forward")
    lowered = LOWER(relax.get_pipeline("zero")(model))
    plan = plan_vtcm(lowered)
    assert any(t.kernel.startswith("fused_") for t in plan.staged) and not plan.left_in_place
    with cpu_vtcm(), cpu_dma() as dma:
        got = _run(copy_to_dma(stage_in_vtcm(lowered), overlap=True), inputs, "forward")
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == dma.completed == len(plan.staged)
    assert dma.peak_in_flight[0] >= 2


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_a_model_with_a_symbolic_batch_has_its_weights_staged_and_equals_the_model(fuse):
    class MLP(nn.Module):
        def __init__(self) -> None:
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.fc2(nn.relu(self.fc1(x)))

    model, params = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor(("n", 16), "float32")}})
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s).astype("float32") for s in [(5, 16)] + [tuple(p.shape) for _, p in params]]
    expected = _run(model, inputs, "forward")
    lowered = LOWER(relax.get_pipeline("zero")(model) if fuse else model)
    plan = plan_vtcm(lowered)
    # the weights and biases (static), and the transposed weights; never x or what depends on n
    assert {t.argument for t in plan.staged} == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "permute_dims", "permute_dims1"}
    with cpu_vtcm(), cpu_dma() as dma:
        got = _run(copy_to_dma(stage_in_vtcm(lowered), overlap=True), inputs, "forward")
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == len(plan.staged)


def test_a_kernel_reading_a_parameter_does_not_hold_back_the_transfer_of_another():
    # A kernel writes only what TVM's region analysis says it writes.  Before, each kernel call
    # counted as writing all its arguments; parameters may alias each other, so `multiply(x,
    # w_vtcm, out)` "wrote" v's source, and v's transfer could not start before it.
    class ScaleShift(nn.Module):
        def __init__(self) -> None:
            self.w, self.v = nn.Parameter((64,), "float32"), nn.Parameter((64,), "float32")

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return x * self.w + self.v

    model, _ = ScaleShift().export_tvm(spec={"forward": {"x": nn.spec.Tensor(("n", 64), "float32")}})
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(s).astype("float32") for s in [(3, 64), (64,), (64,)]]
    scheduled = copy_to_dma(stage_in_vtcm(LOWER(model), prefetch=True), overlap=True)
    report = {t.src: t for t in overlap_report(scheduled)}
    assert report["v"].kernels == 1 and "multiply" not in report["v"].starts_after
    assert report["w"].stopped_by.endswith("(reads dst)")
    with cpu_vtcm(), cpu_dma() as dma:
        got = _run(scheduled, inputs, "forward")
    np.testing.assert_array_equal(got, _run(model, inputs, "forward"))
    assert dma.peak_in_flight[0] == 2


def test_the_example_runs_and_reports():
    with pytest.warns(VTCMCapacityWarning, match="matmul1 argument relu"):
        assert example.main(["--capacity", "36000", "--overlap"]) == 0


# -- planning, over random kernels -------------------------------------------------------


def _concat_module(calls: list[list[int]], lengths: list[int]) -> tvm.IRModule:
    """One kernel per call, reading exactly the 1-D params it lists."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", TensorType([n], "float32")) for i, n in enumerate(lengths)]
    with bb.function("main", params):
        with bb.dataflow():
            # concat of one tensor is legalized to no kernel at all: add it to itself instead
            outs = [
                bb.emit(relax.op.concat([params[i] for i in call]) if len(call) > 1 else relax.op.add(params[call[0]], params[call[0]]))
                for call in calls
            ]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return LOWER(bb.get())


def _blocks(nbytes: int) -> int:
    return -(-nbytes // VTCM_BLOCK_BYTES) * VTCM_BLOCK_BYTES


@given(
    lengths=st.lists(st.integers(1, 1600), min_size=1, max_size=5),
    picks=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3), min_size=1, max_size=5),
    capacity=st.integers(0, 8 * VTCM_BLOCK_BYTES),
)
def test_plan_stays_within_capacity_and_gives_live_tensors_their_own_slots(lengths, picks, capacity):
    calls = [[i % len(lengths) for i in pick] for pick in picks]
    mod = _concat_module(calls, lengths)
    plan = plan_vtcm(mod, capacity=capacity)
    slots = plan.slots.get("main", ())
    assert sum(_blocks(s) for s in slots) <= capacity  # as TVM's allocator hands it out
    # every input of every call was chosen once, staged or reported
    assert len(plan.tensors) == sum(len(set(call)) for call in calls)
    for tensor in plan.staged:
        assert tensor.nbytes <= slots[tensor.slot]
    # tensors of one call (consecutive in the plan, one per distinct param) never share a slot
    start = 0
    for call in calls:
        group = plan.tensors[start : start + len(set(call))]
        start += len(group)
        used = [t.slot for t in group if t.slot is not None]
        assert len(used) == len(set(used))
    # with room for everything, nothing is left in place
    if capacity >= sum(_blocks(4 * lengths[i]) for call in calls for i in set(call)):
        assert plan.left_in_place == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = stage_in_vtcm(mod, capacity=capacity)["main"].script()
    assert len(caught) == (1 if plan.left_in_place else 0)
    assert text.count(f'R.str("{VTCM_SCOPE}")') == len(slots)
    assert text.count("R.vm.copy_tensor(") == len(plan.staged)


def test_a_module_not_lowered_yet_gets_a_warning_that_nothing_was_staged():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class High:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                y = R.add(x, x)
                R.output(y)
            return y

    legalized = relax.transform.LegalizeOps()(High)
    for mod, holds in [(High, "R.add"), (legalized, "R.call_tir")]:
        with pytest.warns(UserWarning, match=f"still holds {holds}, so it is not lowered yet") as record:
            out = stage_in_vtcm(mod, capacity=4096)
        assert out.same_as(mod)
        assert any("rewrite_ext.hexagon.LowerToVMIR()(mod) runs them" in str(w.message) for w in record)
    with pytest.warns(VTCMCapacityWarning) as record:  # lowered, nothing fits: only that is said
        stage_in_vtcm(LowerToVMIR()(High), capacity=0)
    assert not [w for w in record if "not lowered" in str(w.message)]


def test_a_lowered_module_with_nothing_to_stage_gets_no_not_lowered_warning():
    # LowerToVMIR leaves R.reshape (RewriteDataflowReshape); every tensor here is symbolic, so
    # nothing is staged, and the module is lowered: no warning at all.
    class Reshaping(nn.Module):
        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return nn.op.relu(nn.op.reshape(x, (2, -1)))

    model, _ = Reshaping().export_tvm(spec={"forward": {"x": nn.spec.Tensor((2, "n", 4), "float32")}})
    lowered = LowerToVMIR()(model)
    assert "R.reshape" in lowered.script()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stage_in_vtcm(lowered).same_as(lowered)


def test_lower_to_vm_ir_gives_the_ir_staging_works_on_and_changes_nothing_on_its_own_output():
    model, inputs = example.export()
    lowered = LowerToVMIR()(model)
    tvm.ir.assert_structural_equal(LowerToVMIR()(lowered), lowered)  # relax.build runs it again
    func = lowered["forward"]
    assert func.attrs["relax.force_pure"] and not any(
        isinstance(block, relax.DataflowBlock) for block in func.body.blocks
    )
    assert len(plan_vtcm(lowered).staged) == 11  # every kernel input of the MLP
    np.testing.assert_array_equal(_run(lowered, inputs, "forward"), _run(model, inputs, "forward"))
