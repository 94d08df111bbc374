"""The reference rewrite: ``R.vm.copy_tensor`` into Hexagon DMA builtins.

Each ``R.vm.copy_tensor(src, dst)`` becomes, in place::

    R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (src, dst, queue_id, bypass_cache),
                            ty_args=(R.Tuple,))
    R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (queue_id, 0, bypass_cache, src, dst),
                            ty_args=(R.Tuple,))

The builtins' signatures are those TVM 0.27 registers in
``src/runtime/vm/hexagon/builtin.cc``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .. import ops
from ..rewrite import rewrite_call

__all__ = ["CopyToDMA", "copy_tensor_pattern", "copy_to_dma", "DMA_COPY", "DMA_WAIT"]

DMA_COPY = "vm.builtin.hexagon.dma_copy"
DMA_WAIT = "vm.builtin.hexagon.dma_wait"

_SRC = wildcard()
_DST = wildcard()
_VOID = relax.TupleType([])


def copy_tensor_pattern() -> DFPattern:
    """The pattern of ``R.vm.copy_tensor(src, dst)``.

    Returns
    -------
    pattern : DFPattern
        A call of the op ``relax.vm.copy_tensor`` with any source and
        destination.
    """
    return is_op(ops.COPY_TENSOR_OP)(_SRC, _DST)


@functools.lru_cache(maxsize=None)
def _imm(value: int | bool) -> tvm.ir.PrimExpr:
    # TVMScript parses `0` and `True` in builtin args as int64 immediates; emitting the
    # same keeps the printed IR parseable back to an equal module.  IR nodes are immutable,
    # so one object per value serves every call.
    return tvm.tirx.IntImm("int64", int(value))


@functools.lru_cache(maxsize=None)
def _extern(name: str) -> relax.ExternFunc:
    return relax.ExternFunc(name)


def _builtin(name: str, args: list[relax.Expr]) -> relax.Call:
    # ty_args=[R.Tuple()]: a void call; an empty ty_args list does not survive a
    # TVMScript round trip in TVM 0.27.  Given a list, relax.op converts each argument
    # and the name again, which takes most of the time of a rewrite; an in-line Tuple of
    # what are already expressions builds the same call about 3x faster.
    return relax.op.call_builtin_with_ctx(_extern(name), relax.Tuple(args), ty_args=[_VOID])


def _dma_rewriter(
    queues: Iterator[int], bypass_cache: bool, legacy_wait: bool
) -> Callable[[relax.Expr, dict, relax.BlockBuilder], relax.Expr]:
    """The rewriter for :func:`copy_tensor_pattern`, the example to read."""

    def copy_to_dma_rewriter(orig: relax.Expr, matchings: dict, builder: relax.BlockBuilder) -> relax.Expr:
        # Vars, not their values: dst is the `a` of `a = R.vm.alloc_tensor(...)`.
        src, dst = matchings[_SRC], matchings[_DST]
        queue = next(queues)
        # Start the transfer: a void binding emitted just before the rewritten one.
        builder.emit(_builtin(DMA_COPY, [src, dst, _imm(queue), _imm(bypass_cache)]))
        if legacy_wait:  # runtimes older than apache/tvm#16706
            return _builtin(DMA_WAIT, [_imm(queue), _imm(0)])
        # The wait replaces the copy.  inflight_dma=0: return once nothing is in flight on
        # this queue, so this copy has landed.  src and dst ride along so that
        # KillAfterLastUse cannot free them while the engine still reads or writes them.
        return _builtin(DMA_WAIT, [_imm(queue), _imm(0), _imm(bypass_cache), src, dst])

    return copy_to_dma_rewriter


def copy_to_dma(
    target: relax.Function | tvm.IRModule,
    *,
    queue_id: int = 0,
    bypass_cache: bool = True,
    legacy_wait: bool = False,
    overlap: bool = False,
    num_queues: int = 1,
) -> relax.Function | tvm.IRModule:
    """Turn every ``R.vm.copy_tensor(src, dst)`` into a DMA copy and its wait.

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A lowered (impure) function, or a module of them.  A copy in a pure
        function or a DataflowBlock is reported by
        :class:`rewrite_ext.RewriteError`: the DMA builtins are impure.
    queue_id : int
        The DMA queue the transfers go to.
    bypass_cache : bool
        Passed to both builtins (Hexagon's ``bypass_cache``).
    legacy_wait : bool
        Emit the two-argument ``dma_wait(queue_id, 0)`` of runtimes older
        than apache/tvm#16706, which does not carry src and dst.
    overlap : bool
        Move each wait down to just before the first later binding of its
        block that conflicts with the transfer, with the ``inflight_dma``
        that waits for exactly that transfer, so compute overlaps the copy
        (see :func:`rewrite_ext.hexagon.overlap.sink_dma_waits`).
    num_queues : int
        Spread the transfers round-robin over queue ids ``queue_id`` to
        ``queue_id + num_queues - 1`` so independent transfers can run side
        by side; inflight counts stay per queue.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The rewritten function or a new module.

    Examples
    --------
    .. code-block:: python

        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
        R.vm.copy_tensor(x, a)

    becomes::

        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, x, a), ty_args=(R.Tuple,))
    """
    if num_queues < 1:
        raise ValueError(f"num_queues must be at least 1, got {num_queues}")
    queues = itertools.cycle(range(queue_id, queue_id + num_queues))
    rewriter = _dma_rewriter(queues, bypass_cache, legacy_wait)
    # The output holds no copy_tensor, so one pass (and the confirming scan) suffices.
    result = rewrite_call(copy_tensor_pattern(), rewriter, target, max_iterations=1)
    if overlap:
        from .overlap import sink_dma_waits

        result = sink_dma_waits(result)
    return result


def CopyToDMA(  # noqa: N802 - TVM names passes in CamelCase
    *,
    queue_id: int = 0,
    bypass_cache: bool = True,
    legacy_wait: bool = False,
    overlap: bool = False,
    num_queues: int = 1,
) -> tvm.ir.transform.Pass:
    """The module pass form of :func:`copy_to_dma`, for ``tvm.transform.Sequential``.

    Parameters
    ----------
    queue_id, bypass_cache, legacy_wait, overlap, num_queues
        As for :func:`copy_to_dma`.

    Returns
    -------
    pass : tvm.ir.transform.Pass
        A module pass named ``CopyToDMA``.
    """

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return copy_to_dma(
            mod,
            queue_id=queue_id,
            bypass_cache=bypass_cache,
            legacy_wait=legacy_wait,
            overlap=overlap,
            num_queues=num_queues,
        )

    return tvm.ir.transform.module_pass(transform, opt_level=0, name="CopyToDMA")
