"""The CPU stand-in for the Hexagon DMA builtins, run through relax.build and the VM."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from rewrite_ext.hexagon.cpu_dma import DMA_COPY, DMA_WAIT, CPUDMA, DMAError, cpu_dma
from rewrite_ext.compat import VOID_TY_ARGS, TensorType, imm

SHAPE = (4, 8)


def _build(mod: tvm.IRModule, exec_mode: str = "bytecode") -> tvm.runtime.Executable:
    return relax.build(mod, target="llvm", exec_mode=exec_mode)


def _run(executable, *inputs: np.ndarray):
    # The VM binds builtins when constructed: build it inside the context.
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(x) for x in inputs))


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE, dtype="float32")


# x -> a (offset 0) -> b (offset 128, right after a), each copy waited for, then b + 1.
@I.ir_module
class CopyWait:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        storage = R.vm.alloc_storage(R.shape([256]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, x, a], **VOID_TY_ARGS)
        b = R.vm.alloc_tensor(storage, R.prim_value(128), R.shape([4, 8]), R.dtype("float32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [a, b, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, a, b], **VOID_TY_ARGS)
        # Kernels reject a non-zero byte offset: see tests/test_ops.py.
        out = R.add(R.memory.ensure_zero_offset(b), R.const(1, "float32"))
        return out


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_copy_then_wait_gives_the_data_and_counts(exec_mode):
    executable = _build(CopyWait, exec_mode)
    x = _x()
    with cpu_dma() as dma:
        out = _run(executable, x)
    np.testing.assert_array_equal(out.numpy(), x + 1)
    assert (dma.copies, dma.waits, dma.legacy_waits, dma.completed) == (2, 2, 0, 2)
    assert dma.bytes_copied == 2 * x.nbytes
    assert dma.peak_in_flight == {0: 1} and dma.peak_in_flight_total == 1
    assert dma.in_flight == {} and dma.pending == []
    assert dma.summary().startswith("copies=2 waits=2 (legacy 0) completed=2 bytes=256")


# Two copies in flight on queue 0, then on queue 3, with pipelined waits.
@I.ir_module
class Pipelined:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
        a = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        b = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [y, b, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 1, True, x, a], **VOID_TY_ARGS)
        s = R.multiply(a, R.const(2, "float32"))  # a has landed; b may not have
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, y, b], **VOID_TY_ARGS)
        c = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        d = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [s, c, 3, False], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [b, d, 3, False], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [3, 0, False, b, d], **VOID_TY_ARGS)
        out = R.add(c, d)
        return out


def test_pipelined_waits_complete_the_oldest_transfers_first():
    executable = _build(Pipelined)
    x, y = _x(1), _x(2)
    with cpu_dma() as dma:
        out = _run(executable, x, y)
    np.testing.assert_array_equal(out.numpy(), 2 * x + y)
    assert (dma.copies, dma.waits, dma.completed) == (4, 3, 4)
    assert dma.peak_in_flight == {0: 2, 3: 2}


# The seed forum post's wait: inflight_dma=1 after a lone copy, which waits for nothing.
@I.ir_module
class SeedWait:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        a = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 1, True, x, a], **VOID_TY_ARGS)
        out = R.add(a, R.const(1, "float32"))
        return out


def test_a_wait_that_leaves_the_copy_in_flight_gives_poison_and_an_error_naming_it():
    executable = _build(SeedWait)
    x = _x()
    with pytest.raises(DMAError, match=r"1 DMA transfer\(s\) still in flight") as info:
        with cpu_dma() as dma:
            out = _run(executable, x)
            # a was read before any wait covered the copy: the poison (NaN), not x.
            assert np.isnan(out.numpy()).all()
    message = str(info.value)
    assert "queue 0" in message and "src float32(4, 8) -> dst float32(4, 8)" in message and "128 bytes" in message
    assert dma.completed == 0 and dma.in_flight == {0: 1}


# The wait comes after a write to src: the engine reads src asynchronously.
@I.ir_module
class WriteSrcInFlight:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        src = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        _ = R.call_packed("runtime.TVMTensorCopyFromTo", x, src, **VOID_TY_ARGS)
        a = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, a, 0, True], **VOID_TY_ARGS)
        zeros = R.zeros(R.shape([4, 8]), "float32")
        _1 = R.call_packed("runtime.TVMTensorCopyFromTo", zeros, src, **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, src, a], **VOID_TY_ARGS)
        return a


def test_the_source_is_read_when_the_transfer_completes():
    executable = _build(WriteSrcInFlight)
    with cpu_dma():
        out = _run(executable, _x())
    # Not x: the write to src during flight is visible, as on the engine.
    np.testing.assert_array_equal(out.numpy(), np.zeros(SHAPE, "float32"))


@I.ir_module
class Mismatch:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        a = R.builtin.alloc_tensor(R.shape([4, 4]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, x, a], **VOID_TY_ARGS)
        return a


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_mismatched_sizes_raise_dma_error_through_the_vm(exec_mode):
    executable = _build(Mismatch, exec_mode)
    with cpu_dma() as dma:
        with pytest.raises(DMAError, match=r"128 bytes but dst float32\(4, 4\) holds 64"):
            _run(executable, _x())
    assert dma.copies == 0


def _copy_on_queue(queue: int) -> tvm.IRModule:
    @I.ir_module
    class BadQueue:
        @R.function(pure=False)
        def main(x: R.Tensor((4, 8), "float32")):
            a = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
            R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, queue, True], **VOID_TY_ARGS)
            return a

    return BadQueue


@I.ir_module
class NegativeInflight:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, -1, True, x, x], **VOID_TY_ARGS)
        return x


@I.ir_module
class Overlap:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, x, 0, True], **VOID_TY_ARGS)
        return x


@I.ir_module
class WrongArity:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True], **VOID_TY_ARGS)
        return x


@pytest.mark.parametrize(
    ("mod", "message"),
    [
        (_copy_on_queue(9), r"queue_id 9 is not a user queue: user queues are 0..8, queue 9 is the runtime's own"),
        (_copy_on_queue(10), r"queue_id 10 is not a user queue"),
        (_copy_on_queue(-1), r"queue_id -1 is not a user queue"),
        (NegativeInflight, "inflight_dma must be >= 0, got -1"),
        (Overlap, "overlap"),
        (WrongArity, "got 4 arguments"),
    ],
    ids=["queue-9-is-the-runtimes", "queue-10", "queue-negative", "negative-inflight", "overlap", "wait-arity"],
)
def test_invalid_calls_raise_dma_error(mod, message):
    executable = _build(mod)
    with cpu_dma():
        with pytest.raises(DMAError, match=message):
            _run(executable, _x())


@I.ir_module
class LegacyWait:
    @R.function(pure=False)
    def main(x: R.Tensor((4, 8), "float32")):
        a = R.builtin.alloc_tensor(R.shape([4, 8]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 2, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [2, 0], **VOID_TY_ARGS)
        return a


@pytest.mark.parametrize("exec_mode", ["bytecode", "compiled"])
def test_legacy_three_argument_wait(exec_mode):
    executable = _build(LegacyWait, exec_mode)
    x = _x()
    with cpu_dma() as dma:
        out = _run(executable, x)
    np.testing.assert_array_equal(out.numpy(), x)
    assert (dma.waits, dma.legacy_waits, dma.completed) == (1, 1, 1)


def test_previous_functions_are_restored_or_removed():
    assert tvm_ffi.get_global_func(DMA_COPY, allow_missing=True) is None  # PyPI TVM has no Hexagon runtime
    assert tvm_ffi.get_global_func(DMA_WAIT, allow_missing=True) is None
    with cpu_dma():
        assert tvm_ffi.get_global_func(DMA_COPY, allow_missing=True) is not None
    assert tvm_ffi.get_global_func(DMA_COPY, allow_missing=True) is None
    assert tvm_ffi.get_global_func(DMA_WAIT, allow_missing=True) is None

    tvm.register_global_func(DMA_COPY, lambda *args: "previous copy", override=True)
    try:
        with cpu_dma():
            with pytest.raises(DMAError):
                tvm_ffi.get_global_func(DMA_COPY)(None, 1, 2, 3, 4)
        assert tvm_ffi.get_global_func(DMA_COPY)() == "previous copy"
        assert tvm_ffi.get_global_func(DMA_WAIT, allow_missing=True) is None
    finally:
        tvm_ffi.remove_global_func(DMA_COPY)


def test_another_exception_is_not_masked_and_functions_are_restored():
    executable = _build(SeedWait)
    with pytest.raises(ZeroDivisionError):
        with cpu_dma() as dma:
            _run(executable, _x())
            1 / 0  # noqa: B018 - leaves with a transfer in flight and another error
    assert dma.in_flight == {0: 1}
    assert tvm_ffi.get_global_func(DMA_COPY, allow_missing=True) is None


def test_nesting_raises_and_leaves_the_outer_context_working():
    executable = _build(CopyWait)
    x = _x()
    assert CPUDMA.active() is None
    with cpu_dma() as outer:
        with pytest.raises(DMAError, match="does not nest"):
            with cpu_dma():
                pass
        assert CPUDMA.active() is outer
        out = _run(executable, x)
    np.testing.assert_array_equal(out.numpy(), x + 1)
    assert outer.completed == 2 and CPUDMA.active() is None


def test_a_vm_used_after_the_context_raises():
    executable = _build(CopyWait)
    with cpu_dma():
        vm = relax.VirtualMachine(executable, tvm.cpu())
    with pytest.raises(DMAError, match="after its cpu_dma\\(\\) context was left"):
        vm["main"](tvm.runtime.tensor(_x()))


def test_a_context_can_be_reentered_with_fresh_counters():
    executable = _build(CopyWait)
    dma = cpu_dma()
    for _ in range(2):
        with dma:
            _run(executable, _x())
        assert dma.copies == 2


# 17 MiB of float32: more than one descriptor's 2**24 - 1 bytes.
_BIG = 17 * 2**20 // 4


@I.ir_module
class TooBig:
    @R.function(pure=False)
    def main(x: R.Tensor((_BIG,), "float32")):
        a = R.builtin.alloc_tensor(R.shape([_BIG]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, x, a], **VOID_TY_ARGS)
        return a


@I.ir_module
class Empty:
    @R.function(pure=False)
    def main(x: R.Tensor((0,), "float32")):
        a = R.builtin.alloc_tensor(R.shape([0]), R.dtype("float32"), R.prim_value(0))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [x, a, 0, True], **VOID_TY_ARGS)
        return a


def test_a_copy_larger_than_a_descriptor_is_refused():
    executable = _build(TooBig)
    with cpu_dma() as dma:
        with pytest.raises(DMAError, match=r"17825792 bytes exceed a descriptor's 16777215 \(2\*\*24 - 1\)"):
            _run(executable, np.zeros(_BIG, dtype="float32"))
    assert dma.copies == 0


def test_a_copy_of_zero_bytes_is_refused():
    executable = _build(Empty)
    with cpu_dma() as dma:
        with pytest.raises(DMAError, match="empty transfer"):
            _run(executable, np.zeros(0, dtype="float32"))
    assert dma.copies == 0


def _many_copies(count: int, queues: int) -> tvm.IRModule:
    """``count`` copies of x into the rows of one output, round-robin over ``queues`` queues,
    none waited for until the end, where one wait per queue (inflight 0) completes them all."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([8], "float32"))
    with bb.function("main", [x], pure=False):
        out = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([count, 8]), "float32", 0))
        for i in range(count):
            row = bb.emit(relax.op.memory.view(out, relax.ShapeExpr([8]), "float32", imm(32 * i)))
            bb.emit(relax.op.call_builtin_with_ctx(DMA_COPY, [x, row, i % queues, True], **VOID_TY_ARGS))
        for queue in range(queues):
            bb.emit(relax.op.call_builtin_with_ctx(DMA_WAIT, [queue, 0, True, x, out], **VOID_TY_ARGS))
        bb.emit_func_output(out)
    return bb.get()


def test_a_full_descriptor_ring_on_one_queue_completes_the_oldest_transfer_and_counts_a_stall():
    # 250 transfers in flight at once would need 250 descriptors; the ring has 100.  The rows
    # still all arrive, in the order the engine finishes them.
    executable = _build(_many_copies(250, 1))
    x = _x().reshape(-1)[:8].copy()
    with cpu_dma() as dma:
        out = _run(executable, x).numpy()
    np.testing.assert_array_equal(out, np.tile(x, (250, 1)))
    assert dma.ring_stalls == 150
    assert dma.peak_in_flight_total == 100
    assert dma.completed == dma.copies == 250
    assert "ring_stalls=150" in dma.summary()


def test_a_full_descriptor_ring_with_other_queues_in_flight_is_an_error():
    # TVM's QueuedRingBuffer records every retry on a full ring as an entry of the copying
    # queue: the other queues' in-flight counts go wrong and their waits may return early.
    executable = _build(_many_copies(250, 3))
    with pytest.raises(DMAError, match=r"finds all 100 descriptors in flight, on queues \[0, 1, 2\]"):
        with cpu_dma():  # left by the error: the transfers in flight are not reported again
            _run(executable, _x().reshape(-1)[:8].copy())


def test_a_ring_with_room_never_stalls():
    executable = _build(_many_copies(100, 2))
    with cpu_dma() as dma:
        _run(executable, _x().reshape(-1)[:8].copy())
    assert dma.ring_stalls == 0 and dma.peak_in_flight_total == 100
