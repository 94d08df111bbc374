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
import numbers
import warnings
from dataclasses import dataclass
from collections.abc import Callable, Iterator

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .. import _ir, ops
from ..report import RewriteReport
from ..rewrite import rewrite_call
from ..rule import Decline
from ..compat import TY_ARGS, TupleType, imm, ty
from ._memory import shared_bytes

__all__ = [
    "CHUNK_BYTES",
    "CopyToDMA",
    "DMAChunkWarning",
    "DMA_COPY",
    "DMA_WAIT",
    "MAX_DESCRIPTOR_BYTES",
    "USER_QUEUES",
    "copy_tensor_pattern",
    "copy_to_dma",
]

DMA_COPY = "vm.builtin.hexagon.dma_copy"
DMA_WAIT = "vm.builtin.hexagon.dma_wait"

_SRC = wildcard()
_DST = wildcard()
_VOID = TupleType([])


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
    return imm(int(value))


@functools.lru_cache(maxsize=None)
def _extern(name: str) -> relax.ExternFunc:
    return relax.ExternFunc(name)


def _builtin(name: str, args: list[relax.Expr]) -> relax.Call:
    # ty_args=[R.Tuple()]: a void call; an empty ty_args list does not survive a
    # TVMScript round trip in TVM 0.27.  Given a list, relax.op converts each argument
    # and the name again, which takes most of the time of a rewrite; an in-line Tuple of
    # what are already expressions builds the same call about 3x faster.
    return relax.op.call_builtin_with_ctx(_extern(name), relax.Tuple(args), **{TY_ARGS: [_VOID]})


#: User queues of the engine: the runtime keeps queue 9 (``SYNC_DMA_QUEUE``) for its own
#: synchronous copies (``hexagon_user_dma.h``: ``MAX_DMA_QUEUES`` 10).
USER_QUEUES = range(0, 9)
#: A descriptor's 24-bit length field: the most bytes one ``dma_copy`` may move.
MAX_DESCRIPTOR_BYTES = (1 << 24) - 1
#: Bytes per chunk of a larger copy: the largest multiple of 64 that fits a descriptor, so
#: every chunk keeps the 64-byte alignment of its tensor.
CHUNK_BYTES = MAX_DESCRIPTOR_BYTES - MAX_DESCRIPTOR_BYTES % 64


class DMAChunkWarning(UserWarning):
    """A copy larger than one descriptor was split into chunks at byte offsets, which TVM
    0.27's ``dma_copy`` on a device does not honour (see :func:`copy_to_dma`)."""


def _copy_nbytes(src: relax.Expr, dst: relax.Expr) -> int | None:
    """The bytes a copy moves when either side's type fixes them, else None."""
    for side in (src, dst):
        nbytes = _ir.static_nbytes(ty(side))
        if nbytes is not None:
            return nbytes
    return None


def _shown(tensor: relax.Expr) -> str:
    return _ir.shown_name(tensor) if isinstance(tensor, relax.Var) else f"a {type(tensor).__name__}"


def _chunk_views(
    builder: relax.BlockBuilder, tensor: relax.Expr, nbytes: int
) -> list[relax.Expr]:
    """Flat ``uint8`` views of ``tensor``, ``CHUNK_BYTES`` each (the last one shorter), named
    after it (``w_chunk0``, ...) so that reports and the printed IR say what each one moves."""
    views = []
    name = _ir.var_name(tensor) if isinstance(tensor, relax.Var) else "tensor"
    for index, offset in enumerate(range(0, nbytes, CHUNK_BYTES)):
        size = min(CHUNK_BYTES, nbytes - offset)
        view = relax.op.memory.view(tensor, relax.ShapeExpr([size]), "uint8", _imm(offset))
        views.append(builder.emit(view, name_hint=f"{name}_chunk{index}"))
    return views


@dataclass(slots=True)
class _DMA:
    """A DMA builtin's arguments; ``fields`` when read from IR (kept to rebuild a wait)."""

    queue: int | None
    bypass: int | None
    src: relax.Expr | None
    dst: relax.Expr | None
    inflight: int | None = 0
    fields: list | None = None


def _vars(*exprs: relax.Expr) -> tuple:
    return tuple(e for e in exprs if isinstance(e, relax.Var))


def _dma_rewriter(
    queues: Iterator[int],
    bypass_cache: bool,
    legacy_wait: bool,
    dropped: list[relax.Expr],
    chunked: list[str],
    known: dict | None,
) -> Callable[[relax.Expr, dict, relax.BlockBuilder], relax.Expr | None]:
    """The rewriter for :func:`copy_tensor_pattern`, the example to read."""

    def copy_to_dma_rewriter(orig: relax.Expr, matchings: dict, builder: relax.BlockBuilder) -> relax.Expr | None:
        # Vars, not their values: dst is the `a` of `a = R.vm.alloc_tensor(...)`.
        src, dst = matchings[_SRC], matchings[_DST]
        nbytes = _copy_nbytes(src, dst)
        if nbytes is None:
            # A symbolic size may exceed a descriptor, and a split needs static offsets:
            # declining keeps the synchronous copy, which is right for every size.
            raise Decline("the copy's size is not static: kept as the synchronous copy_tensor")
        overlap = "same" if src.same_as(dst) else shared_bytes(builder.lookup_binding, src, nbytes, dst, nbytes)
        if nbytes == 0 or overlap == "same":
            # A copy of nothing, or of bytes onto themselves (the engine's result would be
            # undefined for overlapping buffers), does nothing: dropped below, no binding.
            nothing = relax.Tuple([])
            dropped.append(nothing)
            return nothing
        if overlap == "partly":
            raise Decline("src and dst may share some bytes: kept as the synchronous copy_tensor")
        queue = next(queues)
        if known is not None and isinstance(dst, relax.Var):
            known[dst.__chandle__()] = nbytes  # spares the overlap pass reading dst's allocation
        pairs = [(src, dst)]
        if nbytes > MAX_DESCRIPTOR_BYTES:
            # One descriptor carries at most 2**24 - 1 bytes: one dma_copy per chunk, all on
            # one queue, covered by the single wait below.
            pairs = list(zip(_chunk_views(builder, src, nbytes), _chunk_views(builder, dst, nbytes)))
            chunked.append(f"{_shown(src)} -> {_shown(dst)} ({nbytes} bytes)")
        copies = [_builtin(DMA_COPY, [s, d, _imm(queue), _imm(bypass_cache)]) for s, d in pairs]
        if known is not None:
            # What the overlap pass would read back, so it need not: reading IR fields costs
            # far more than the scheduling itself.  (One copy: its record is its transfer's.)
            whole = (_DMA(queue, int(bypass_cache), src, dst), _vars(src, dst))
            for copy, (part_src, part_dst) in zip(copies, pairs):
                part = whole
                if len(pairs) > 1:
                    part = (_DMA(queue, int(bypass_cache), part_src, part_dst), _vars(part_src, part_dst))
                known[copy.__chandle__()] = ("copy",) + part
            if not legacy_wait:
                # The overlap schedule makes the wait where it lands, with its inflight_dma: the
                # last copy replaces the copy_tensor and carries what the wait will hold.  Half
                # the bindings through the builder, and no wait built only to be rebuilt.
                known[copies[-1].__chandle__()] += whole
                for copy in copies[:-1]:
                    builder.emit(copy)
                return copies[-1]
        for copy in copies:
            # Start the transfer: a void binding emitted just before the rewritten one.
            builder.emit(copy)
        if legacy_wait:  # runtimes older than apache/tvm#16706
            wait = _builtin(DMA_WAIT, [_imm(queue), _imm(0)])
            if known is not None:
                known[wait.__chandle__()] = ("wait", _DMA(queue, None, None, None), ())
            return wait
        # The wait replaces the copy.  inflight_dma=0: return once nothing is in flight on
        # this queue, so this copy has landed.  src and dst ride along so that
        # KillAfterLastUse cannot free them while the engine still reads or writes them.
        return _builtin(DMA_WAIT, [_imm(queue), _imm(0), _imm(bypass_cache), src, dst])

    return copy_to_dma_rewriter


def _check_arguments(queue_id: int, num_queues: int, bypass_cache: bool) -> None:
    """The arguments' types and the engine's queue range, checked when the rewrite is made."""
    for name, value in (("queue_id", queue_id), ("num_queues", num_queues)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"copy_to_dma: {name} must be an int, got {type(value).__name__} {value!r}")
    if not isinstance(bypass_cache, (bool, numbers.Integral)) or bypass_cache not in (0, 1):
        raise TypeError(f"copy_to_dma: bypass_cache must be a bool, got {type(bypass_cache).__name__} {bypass_cache!r}")
    if num_queues < 1:
        raise ValueError(f"copy_to_dma: num_queues must be at least 1, got {num_queues}")
    last = queue_id + num_queues - 1
    if queue_id not in USER_QUEUES or last not in USER_QUEUES:
        used = f"queue {queue_id}" if num_queues == 1 else f"queues {queue_id}..{last}"
        raise ValueError(
            f"copy_to_dma: {used} outside the user DMA queues 0..8 (the runtime keeps queue 9 for "
            "its own synchronous copies); pick queue_id and num_queues so that "
            "0 <= queue_id and queue_id + num_queues - 1 <= 8"
        )


def _drop_bindings_of(target: relax.Function | tvm.IRModule, values: list[relax.Expr]):
    """Remove the unused bindings whose value is one of ``values`` (by identity)."""
    wanted = set(values)

    def dead_vars(func: relax.Function) -> list[relax.Var]:
        found = []
        for binding in _bindings_under(func):
            if binding.value in wanted:
                found.append(binding.var)
        return found

    if isinstance(target, relax.Function):
        return _ir.drop_unused_bindings(target, dead_vars(target))
    functions = {}
    for gvar, func in target.functions_items():
        if isinstance(func, relax.Function):
            func = _ir.drop_unused_bindings(func, dead_vars(func))
        functions[gvar] = func
    return tvm.IRModule(functions, attrs=target.attrs, global_infos=target.global_infos)


def _bindings_under(expr: relax.Expr) -> Iterator[relax.Binding]:
    if isinstance(expr, relax.Function):
        yield from _bindings_under(expr.body)
    elif isinstance(expr, relax.If):
        yield from _bindings_under(expr.true_branch)
        yield from _bindings_under(expr.false_branch)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in _ir.bindings_of(block):
                yield binding
                yield from _bindings_under(binding.value)


def copy_to_dma(
    target: relax.Function | tvm.IRModule,
    *,
    queue_id: int = 0,
    bypass_cache: bool = True,
    legacy_wait: bool = False,
    overlap: bool = False,
    num_queues: int = 1,
    report: RewriteReport | None = None,
) -> relax.Function | tvm.IRModule:
    """Turn every ``R.vm.copy_tensor(src, dst)`` into a DMA copy and its wait.

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A lowered (impure) function, or a module of them.  A copy in a pure
        function or a DataflowBlock is reported by
        :class:`rewrite_ext.RewriteError`: the DMA builtins are impure.
    queue_id : int
        The DMA queue the transfers go to: a user queue, 0 to 8 (the
        runtime keeps queue 9 for its own synchronous copies).
    bypass_cache : bool
        Passed to both builtins (Hexagon's ``bypass_cache``).
    legacy_wait : bool
        Emit the two-argument ``dma_wait(queue_id, 0)`` of runtimes older
        than apache/tvm#16706, which does not carry src and dst.
    overlap : bool
        Schedule each block so compute overlaps the transfers: each
        ``dma_copy`` starts just after the last binding it depends on, each
        wait lands just before the first binding that conflicts with its
        transfer, with the exact ``inflight_dma``, and waits a later wait of
        their queue covers merge into it where no buffer dies early (see
        :func:`rewrite_ext.hexagon.overlap.sink_dma_waits`).  Rewrite the
        IRModule rather than one of its functions when it calls kernels:
        alone, each call of a GlobalVar waits for the transfers in flight.
    num_queues : int
        Spread the transfers round-robin over queue ids ``queue_id`` to
        ``queue_id + num_queues - 1`` (all of them user queues) so
        independent transfers can run side by side; inflight counts stay
        per queue.
    report : Optional[RewriteReport]
        Filled as by :func:`rewrite_ext.rewrite_call`: the copies rewritten
        and those kept as ``copy_tensor`` (a size that is not static), under
        the rule ``copy_to_dma_rewriter``.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The rewritten function or a new module; the input itself when it
        holds no copy to rewrite.

    Raises
    ------
    ValueError
        When ``queue_id`` or ``num_queues`` names a queue outside 0..8, or
        ``num_queues < 1``.

    Notes
    -----
    The engine's limits, checked when the rewrite is made:

    - A descriptor moves at most ``2**24 - 1`` bytes.  A larger copy of
      static size becomes one ``dma_copy`` per chunk of ``CHUNK_BYTES``
      (``2**24 - 64``), between flat ``uint8`` ``R.memory.view`` s of src and
      dst at the chunk's byte offset, all on one queue, followed by a single
      wait on the whole src and dst.  A :class:`DMAChunkWarning` says so:
      TVM 0.27's ``dma_copy`` on a device ignores a view's ``byte_offset``.
    - A copy of zero bytes (the builtin refuses one) is removed, and so is
      a copy of bytes onto themselves: ``copy_tensor(a, a)``, a copy between
      aliases of one tensor (``b = a``, or ``t[0]`` of a ``t = (a, ...)``
      bound in the function), or between two ``alloc_tensor`` s at one static
      offset of one storage.  It changes nothing, and the engine's result
      for overlapping buffers is undefined.  A src and dst that share only
      some bytes (two offsets of one storage closer than the copy's size)
      stay ``R.vm.copy_tensor``.  Aliases through ``R.match_cast`` (the
      builder's binding table does not hold them) or packed calls are not
      seen.
    - A copy whose byte size is not static is left as ``R.vm.copy_tensor``,
      a synchronous copy that is right for every size.

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
    _check_arguments(queue_id, num_queues, bypass_cache)
    queue_id, num_queues, bypass_cache = int(queue_id), int(num_queues), bool(bypass_cache)
    queues = itertools.cycle(range(queue_id, queue_id + num_queues))
    dropped: list[relax.Expr] = []
    chunked: list[str] = []
    known: dict | None = {} if overlap else None
    rewriter = _dma_rewriter(queues, bypass_cache, legacy_wait, dropped, chunked, known)
    # The output holds no copy_tensor it can rewrite: one pass, and no confirming one.
    result = rewrite_call(copy_tensor_pattern(), rewriter, target, max_iterations=1, report=report)
    if chunked:
        warnings.warn(
            f"copy_to_dma: {len(chunked)} copy(ies) larger than one descriptor ({MAX_DESCRIPTOR_BYTES} "
            f"bytes) became chunks, views of src and dst at byte offsets: {', '.join(chunked)}. TVM 0.27's "
            "vm.builtin.hexagon.dma_copy passes each tensor's data pointer without its byte_offset, "
            "so on a device every chunk but the first would move the wrong bytes (cpu_dma() honours "
            "byte_offset). Keep tensors copied by DMA within one descriptor, or use a runtime whose "
            "dma_copy adds byte_offset",
            DMAChunkWarning,
            stacklevel=2,
        )
    if dropped:
        result = _drop_bindings_of(result, dropped)
    if overlap:
        from .overlap import _schedule

        result = _schedule(result, known, check=False)
    return result


def CopyToDMA(  # noqa: N802 - TVM names passes in CamelCase
    *,
    queue_id: int = 0,
    bypass_cache: bool = True,
    legacy_wait: bool = False,
    overlap: bool = False,
    num_queues: int = 1,
    report: RewriteReport | None = None,
) -> tvm.ir.transform.Pass:
    """The module pass form of :func:`copy_to_dma`, for ``tvm.transform.Sequential``.

    Parameters
    ----------
    queue_id, bypass_cache, legacy_wait, overlap, num_queues, report
        As for :func:`copy_to_dma`.

    Returns
    -------
    pass : tvm.ir.transform.Pass
        A module pass named ``CopyToDMA``.
    """

    _check_arguments(queue_id, num_queues, bypass_cache)  # when the pass is made, not when it runs

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return copy_to_dma(
            mod,
            queue_id=queue_id,
            bypass_cache=bypass_cache,
            legacy_wait=legacy_wait,
            overlap=overlap,
            num_queues=num_queues,
            report=report,
        )

    return tvm.ir.transform.module_pass(transform, opt_level=0, name="CopyToDMA")
