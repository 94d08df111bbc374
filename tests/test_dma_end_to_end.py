"""End to end: original and copy_to_dma output build for llvm and agree on the CPU VM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R

import rewrite_ext  # noqa: F401 - registers R.vm.copy_tensor
from rewrite_ext.cli import load_module
from rewrite_ext.hexagon import CopyToDMA, copy_to_dma, cpu_dma, overlap_report, sink_dma_waits
from rewrite_ext.hexagon.dma import CHUNK_BYTES
from rewrite_ext.ops import copy_tensor
from rewrite_ext.compat import VOID_TY_ARGS, TensorType, dtype_name, imm_value, set_var_remap, ty


# The thread's module, as the README's main job runs it.
Seed = load_module(str(Path(__file__).resolve().parent.parent / "examples" / "copy_to_vtcm.py"))


@I.ir_module
class CopiesAndCompute:
    @R.function(pure=False)
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((8, 16), "float32")) -> R.Tensor((8, 16), "float32"):
        storage = R.vm.alloc_storage(R.shape([2048]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([8, 16]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        c = R.add(a, w)
        b = R.vm.alloc_tensor(storage, R.prim_value(512), R.shape([8, 16]), R.dtype("float32"))
        R.vm.copy_tensor(c, b)
        scratch = R.builtin.alloc_tensor(R.shape([8, 16]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(b, scratch)
        d = R.multiply(scratch, w)
        R.vm.copy_tensor(d, a)
        e = R.subtract(a, x)
        return e


def _inputs(func: relax.Function, seed: int) -> list[tvm.runtime.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for param in func.params:
        shape = [int(d) for d in ty(param).shape.values]
        dtype = dtype_name(ty(param))
        data = rng.standard_normal(shape) if dtype.startswith("float") else rng.integers(-99, 99, shape)
        out.append(tvm.runtime.tensor(data.astype(dtype)))
    return out


def _run(mod: tvm.IRModule, inputs, exec_mode: str) -> np.ndarray:
    ex = relax.build(mod, target="llvm", exec_mode=exec_mode)
    vm = relax.VirtualMachine(ex, tvm.cpu())  # inside cpu_dma() where DMA builtins are used
    return vm["main"](*inputs).numpy()


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
@pytest.mark.parametrize("mod, copies", [(Seed, 3), (CopiesAndCompute, 4)], ids=["seed", "copies_and_compute"])
def test_original_and_rewritten_agree_on_random_inputs(mod, copies, exec_mode):
    inputs = _inputs(mod["main"], seed=copies)
    expected = _run(mod, inputs, exec_mode)
    rewritten = copy_to_dma(mod)
    with cpu_dma() as dma:
        got = _run(rewritten, inputs, exec_mode)
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == dma.waits == copies
    assert dma.peak_in_flight == {0: 1}


def test_compute_module_matches_numpy():
    x, w = (t.numpy() for t in _inputs(CopiesAndCompute["main"], seed=7))
    with cpu_dma():
        got = _run(copy_to_dma(CopiesAndCompute), [tvm.runtime.tensor(x), tvm.runtime.tensor(w)], "bytecode")
    np.testing.assert_allclose(got, (x + w) * w - x, rtol=1e-6)


def test_legacy_wait_output_runs_too():
    inputs = _inputs(CopiesAndCompute["main"], seed=3)
    expected = _run(CopiesAndCompute, inputs, "bytecode")
    with cpu_dma() as dma:
        got = _run(copy_to_dma(CopiesAndCompute, legacy_wait=True), inputs, "bytecode")
    np.testing.assert_array_equal(got, expected)
    assert dma.legacy_waits == 4


@I.ir_module
class SeedRace:
    """The forum post's `dma_wait [q, 1]` after a lone copy: returns before the copy lands."""

    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        storage = R.vm.alloc_storage(R.shape([128]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 1, True, x, a], **VOID_TY_ARGS)
        y = R.add(a, a)
        return y


def test_the_stand_in_catches_the_seed_posts_early_wait():
    (x,) = _inputs(SeedRace["main"], seed=1)
    results = {}
    with pytest.raises(rewrite_ext.hexagon.DMAError, match="in flight"):
        with cpu_dma():
            results["y"] = _run(SeedRace, [x], "bytecode")
    # the kernel read dst before the transfer landed: poison, not 2 * x
    assert not np.allclose(results["y"], 2 * x.numpy())


@pytest.mark.parametrize("num_queues", [1, 2])
def test_overlap_output_runs_equal_with_waits_moved_later(num_queues):
    inputs = _inputs(CopiesAndCompute["main"], seed=11)
    expected = _run(CopiesAndCompute, inputs, "bytecode")
    rewritten = copy_to_dma(CopiesAndCompute, overlap=True, num_queues=num_queues)
    with cpu_dma() as dma:
        got = _run(rewritten, inputs, "bytecode")
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == dma.waits == 4
    queues = sorted(dma.peak_in_flight)
    assert queues == list(range(num_queues))
    # at least one wait no longer follows its copy at once
    names = [str(b.value.args[0]) if isinstance(b.value, relax.Call) else "" for b in rewritten["main"].body.blocks[0].bindings]
    pairs = [i for i, n in enumerate(names) if "dma_copy" in n]
    assert any("dma_wait" not in names[i + 1] for i in pairs)


def test_copy_to_dma_rejects_zero_queues():
    with pytest.raises(ValueError, match="num_queues"):
        copy_to_dma(CopiesAndCompute, num_queues=0)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"queue_id": True}, "queue_id must be an int, got bool True"),
        ({"num_queues": 2.0}, "num_queues must be an int, got float 2.0"),
        ({"bypass_cache": 2}, "bypass_cache must be a bool, got int 2"),
    ],
)
def test_copy_to_dma_rejects_arguments_of_the_wrong_type(arguments, message):
    # True is an int to Python and would be emitted as queue 1; 2 as a bypass_cache flag.
    with pytest.raises(TypeError, match=message):
        copy_to_dma(CopiesAndCompute, **arguments)
    with pytest.raises(TypeError, match=message):
        CopyToDMA(**arguments)
    out = copy_to_dma(CopiesAndCompute, queue_id=np.int64(3), bypass_cache=0)  # numpy ints are ints
    first = next(b.value for b in out["main"].body.blocks[0].bindings if "dma_copy" in str(b.value))
    assert [imm_value(f) for f in first.args[1].fields[2:]] == [3, 0]


def _big_copy_with_compute() -> tvm.IRModule:
    """17 MiB of float32 (more than one descriptor) copied, compute on y meanwhile."""
    n = 17 * 2**20 // 4
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([n], "float32"))
    y = relax.Var("y", TensorType([16], "float32"))
    with bb.function("main", [x, y], pure=False):
        out = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([n]), "float32", 0))
        bb.emit(copy_tensor(x, out))
        z = bb.emit(relax.op.multiply(y, y))
        bb.emit_func_output(relax.Tuple([out, z]))
    return bb.get()


@pytest.mark.filterwarnings("ignore::rewrite_ext.hexagon.DMAChunkWarning")  # the CPU stand-in honours byte_offset
@pytest.mark.parametrize("overlap", [False, True])
def test_a_copy_larger_than_a_descriptor_runs_chunked_under_the_stand_in(overlap):
    mod = _big_copy_with_compute()
    rng = np.random.default_rng(5)
    x = rng.standard_normal(17 * 2**20 // 4).astype("float32")
    y = rng.standard_normal(16).astype("float32")
    rewritten = copy_to_dma(mod, overlap=overlap)
    executable = relax.build(rewritten, target="llvm")
    with cpu_dma() as dma:  # refuses any dma_copy of more than 2**24 - 1 bytes
        vm = relax.VirtualMachine(executable, tvm.cpu())
        out, z = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y))
        out, z = out.numpy(), z.numpy()
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(z, y * y)
    assert dma.copies == 2 and dma.waits == 1 and dma.bytes_copied == x.nbytes
    assert dma.peak_in_flight == {0: 2}
    if overlap:  # both chunks in flight while the multiply runs
        tvm.ir.assert_structural_equal(rewritten, sink_dma_waits(copy_to_dma(mod)))
        (first, second) = overlap_report(rewritten)
        assert first.overlapped == second.overlapped == 1


@pytest.mark.filterwarnings("ignore::rewrite_ext.hexagon.DMAChunkWarning")  # the CPU stand-in honours byte_offset
def test_a_transfer_of_more_chunks_than_the_ring_holds_runs_beside_another_queue():
    # 101 chunks (1.6 GiB): more descriptors than the ring's 100.  On its own queue the engine
    # only stalls; with y's transfer in flight on queue 0 the runtime would miscount queue 0
    # (cpu_dma raises), so the schedule completes y's first.
    n = 100 * CHUNK_BYTES + 5
    bb = relax.BlockBuilder()
    x, y = relax.Var("x", TensorType([n], "uint8")), relax.Var("y", TensorType([64], "uint8"))
    with bb.function("main", [x, y], pure=False):
        a = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([n]), "uint8", 0))
        b = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([64]), "uint8", 0))
        bb.emit(copy_tensor(y, b))
        bb.emit(copy_tensor(x, a))
        bb.emit_func_output(relax.Tuple([a, b]))
    rewritten = copy_to_dma(bb.get(), overlap=True, num_queues=2)
    x_in = np.zeros(n, dtype="uint8")
    x_in[::4093] = np.arange(len(x_in[::4093])) % 251 + 1  # a byte in every page, no two chunks alike
    y_in = np.arange(64, dtype="uint8")
    executable = relax.build(rewritten, target="llvm")
    with cpu_dma() as dma:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        a_out, b_out = vm["main"](tvm.runtime.tensor(x_in), tvm.runtime.tensor(y_in))
        assert np.array_equal(a_out.numpy(), x_in) and np.array_equal(b_out.numpy(), y_in)
    assert dma.copies == dma.completed == 102 and dma.bytes_copied == n + 64
    assert dma.peak_in_flight == {0: 1, 1: 100} and dma.ring_stalls == 1


def _int4_copy(n: int) -> tvm.IRModule:
    """``n`` int4s copied from a view of the bytes ``x`` into ``y``, whose bytes come back
    through another view.  The runtime stores int4 packed, two a byte (tvm-ffi's
    ``GetDataSize``, which the Hexagon builtins use too); Relax's type inference counts a byte
    an element, so ``x`` is sized for that."""
    nbytes = (n + 1) // 2
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([n], "uint8"))
    y = relax.Var("y", TensorType([n], "int4"))
    with bb.function("main", [x, y], pure=False):
        packed = bb.emit(relax.op.memory.view(x, relax.ShapeExpr([n]), "int4"))
        bb.emit(copy_tensor(packed, y))
        bb.emit_func_output(bb.emit(relax.op.memory.view(y, relax.ShapeExpr([nbytes]), "uint8")))
    return bb.get()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("n", [7, 2**24 + 2], ids=["7 int4s", "2**24+2 int4s"])
def test_a_sub_byte_copy_moves_its_packed_bytes(n, overlap):
    # 2**24 + 2 int4s take 8 MiB + 1 byte: one descriptor (a byte an element would be two).
    nbytes = (n + 1) // 2
    rewritten = copy_to_dma(_int4_copy(n), overlap=overlap)
    executable = relax.build(rewritten, target="llvm")
    x = np.random.default_rng(7).integers(0, 256, n, dtype="uint8")
    with cpu_dma() as dma:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.empty((n,), "int4")).numpy()
    np.testing.assert_array_equal(out, x[:nbytes])
    assert dma.copies == 1 and dma.waits == 1 and dma.bytes_copied == nbytes


# ---------------------------------------------------------------------------------------------
# A model: an nn MLP lowered by TVM's own passes, with copies staged in by hand
# ---------------------------------------------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self) -> None:
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.relu(self.fc1(x)))


@mutator
class _StageCopies(PyExprMutator):
    """Copy the input, and each kernel's output after the kernel, into a tensor of a storage of
    its own, and use the copy from then on: the copies a VTCM staging pass would add."""

    def __init__(self, mod: tvm.IRModule, x: relax.Var) -> None:
        super().__init__(mod)
        self.pending_x: relax.Var | None = x

    def _stage(self, var: relax.Var) -> None:
        var_type = ty(var)
        nbytes = int(np.prod([int(d) for d in var_type.shape.values])) * 4
        storage = self.builder_.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([nbytes]), 0, "uint8", "global"))
        staged = self.builder_.emit(relax.op.vm.alloc_tensor(storage, 0, var_type.shape, "float32"))
        self.builder_.emit(copy_tensor(var, staged))
        set_var_remap(self, var, staged)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if self.pending_x is not None:
            x, self.pending_x = self.pending_x, None
            self._stage(x)
        super().visit_var_binding_(binding)
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            self._stage(value.args[-1])  # destination-passing: the output is the last argument


def _lowered_mlp_with_copies() -> tvm.IRModule:
    mod, _ = _MLP().export_tvm({"forward": {"x": nn.spec.Tensor((4, 16), "float32")}})
    lowered = tvm.transform.Sequential(
        [
            relax.get_pipeline("zero"),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
        ]
    )(mod)
    func = lowered["forward"]
    staged = _StageCopies(lowered, func.params[0]).visit_expr(func)
    out = tvm.IRModule(dict(lowered.functions_items()), attrs=lowered.attrs)
    out["forward"] = staged
    return out


@pytest.mark.parametrize("num_queues", [1, 2])
def test_a_lowered_mlp_with_staging_copies_runs_equal_under_the_overlap_schedule(num_queues):
    mod = _lowered_mlp_with_copies()
    assert mod.script().count("R.vm.copy_tensor") == 5  # the input and four kernel outputs
    rng = np.random.default_rng(7)
    args = [rng.standard_normal([int(d) for d in ty(p).shape.values]).astype("float32") for p in mod["forward"].params]

    def run(m: tvm.IRModule) -> np.ndarray:
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        return vm["forward"](*(tvm.runtime.tensor(a) for a in args)).numpy()

    expected = run(mod)
    scheduled = copy_to_dma(mod, overlap=True, num_queues=num_queues)
    relax.analysis.well_formed(scheduled)
    with cpu_dma() as dma:  # poisons each dst until its covering wait; reads src at completion
        got = run(scheduled)
    np.testing.assert_array_equal(got, expected)
    assert dma.copies == dma.completed == 5
    report = overlap_report(scheduled)
    assert len(report) == 5 and all(t.overlapped for t in report)
