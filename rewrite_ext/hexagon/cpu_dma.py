"""A CPU stand-in for the Hexagon DMA builtins, strict enough to catch wrong rewrites.

``with cpu_dma() as dma:`` registers Python versions of
``vm.builtin.hexagon.dma_copy`` and ``vm.builtin.hexagon.dma_wait`` (the
Hexagon builtins of ``src/runtime/vm/hexagon/builtin.cc`` in TVM 0.27) so a
module holding them builds with ``relax.build(mod, target="llvm")`` and runs on
``tvm.cpu()``; leaving the context restores what was registered before.

The model of the DMA engine:

- each queue is a FIFO of transfers; ``dma_copy`` checks its arguments as the
  real builtin and engine do (equal, non-zero byte sizes of at most 2**24 - 1,
  a user queue 0 to 8: the runtime keeps queue 9 for its own synchronous
  copies) and enqueues the transfer **without** writing ``dst``:
  instead it fills ``dst`` with ``0xFF`` bytes (NaN for floats, -1 for signed
  integers), so reading ``dst`` before the wait that covers the transfer gives
  visibly wrong data;
- ``dma_wait(queue, n)`` completes the oldest transfers of ``queue`` until at
  most ``n`` remain, copying each one's data into its ``dst`` at that moment.
  The data is read from ``src`` at completion, not at ``dma_copy``: the real
  engine reads ``src`` asynchronously, so a write to ``src`` while the transfer
  is in flight is a bug, and this makes it show up as a wrong result;
- all queues share one ring of 100 descriptors: a ``dma_copy`` that finds it
  full, with only its own queue in flight, completes the oldest transfer, as
  the engine eventually would while the real builtin spins, and counts the
  stall in :attr:`CPUDMA.ring_stalls`.  With other queues in flight it raises
  :class:`DMAError`: TVM's ``QueuedRingBuffer`` records each retry as an entry
  of the copying queue, and then counts the other queues' transfers wrong,
  so that their waits may return early;
- leaving the context with transfers in flight raises :class:`DMAError`
  naming them (unless the context is left because of another exception, which
  then propagates unchanged).

Tensors are copied with TVM's ``runtime.TVMTensorCopyFromTo``, which honours
``byte_offset``: on the CPU a tensor made by ``R.vm.alloc_tensor(storage,
offset, ...)`` keeps its offset in ``byte_offset`` (on Hexagon the runtime
moves the data pointer instead, which is why the real builtin may ignore it).

Errors are :class:`DMAError`, registered with ``tvm_ffi`` so that they keep
their type when they cross the VM's C++ on their way back to Python.

The context is not reentrant and does not nest: the builtins are
process-global, and the VM binds them when it is constructed, so two live
stand-ins would make which one a VM talks to depend on when it was built.
Entering a second ``cpu_dma()`` while one is active raises :class:`DMAError`.
The stand-in is not thread-safe; run one VM at a time inside it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import numpy as np
import tvm
import tvm_ffi

from .._ir import data_size
from ..compat import data_ptr
from .dma import DMA_COPY, DMA_WAIT

__all__ = [
    "CPUDMA",
    "DMAError",
    "Transfer",
    "cpu_dma",
    "MAX_DMA_LENGTH",
    "MAX_DMA_QUEUES",
    "MAX_DMA_DESCRIPTORS",
    "SYNC_DMA_QUEUE",
]


def calls_dma(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of ``mod`` calls a Hexagon builtin, so runs on the CPU need
    :func:`cpu_dma` (a module rewritten by ``copy_to_dma`` before, say)."""
    from tvm import relax

    from .. import _ir

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for binding in _ir.all_bindings(func):
                value = binding.value
                if (
                    isinstance(value, relax.Call)
                    and isinstance(value.op, tvm.ir.Op)
                    and value.op.name == "relax.call_builtin_with_ctx"
                    and isinstance(value.args[0], relax.ExternFunc)
                    and str(value.args[0].global_symbol).startswith("vm.builtin.hexagon.")
                ):
                    return True
    return False

#: Queues of the Hexagon user DMA engine (hexagon_user_dma.h); ids must be below this.
MAX_DMA_QUEUES = 10
#: The queue the runtime keeps for its own synchronous copies (SYNC_DMA_QUEUE).
SYNC_DMA_QUEUE = MAX_DMA_QUEUES - 1
#: A descriptor's length field has 24 bits (DESC_LENGTH_MASK).
MAX_DMA_LENGTH = 0x00FFFFFF
#: The descriptors of the ring all queues share (MAX_DMA_DESCRIPTORS).
MAX_DMA_DESCRIPTORS = 100

# C++ copy that checks equal byte sizes and honours each tensor's byte_offset.
_copy_from_to = tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")


@tvm_ffi.register_error("rewrite_ext.DMAError")
class DMAError(Exception):
    """A DMA builtin was misused: bad arguments, transfers left in flight, nesting.

    Registered with ``tvm_ffi.register_error("rewrite_ext.DMAError")``, so it
    keeps its class when raised inside a builtin called by the VM.
    """


def _nbytes(tensor: tvm_ffi.Tensor) -> int:
    return data_size(int(np.prod(tensor.shape, dtype=np.int64)), str(tensor.dtype))


def _describe(tensor: tvm_ffi.Tensor) -> str:
    return f"{tensor.dtype}{tuple(tensor.shape)}"


@dataclass(frozen=True)
class Transfer:
    """One ``dma_copy`` in flight.

    Attributes
    ----------
    index : int
        Its rank among the context's ``dma_copy`` calls, from 0.
    queue : int
        The queue it was issued on.
    src, dst : tvm_ffi.Tensor
        Its source and destination.
    nbytes : int
        The number of bytes it moves.
    """

    index: int
    queue: int
    src: tvm_ffi.Tensor
    dst: tvm_ffi.Tensor
    nbytes: int

    def __str__(self) -> str:
        return (
            f"copy #{self.index} on queue {self.queue}: src {_describe(self.src)} -> "
            f"dst {_describe(self.dst)}, {self.nbytes} bytes"
        )


def _int_arg(builtin: str, name: str, value: Any) -> int:
    # The VM passes ints (True arrives as 1); anything else means the call was built wrong.
    if not isinstance(value, (int, np.integer)):
        raise DMAError(f"{builtin}: {name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _tensor_arg(builtin: str, name: str, value: Any) -> tvm_ffi.Tensor:
    if not isinstance(value, tvm_ffi.Tensor):
        raise DMAError(f"{builtin}: {name} must be a tensor, got {type(value).__name__}")
    return value


class CPUDMA:
    """The DMA engine stand-in; use it through :func:`cpu_dma`.

    Attributes
    ----------
    copies : int
        ``dma_copy`` calls accepted.
    waits : int
        ``dma_wait`` calls, both forms.
    legacy_waits : int
        Of those, three-argument ``dma_wait(ctx, queue_id, inflight_dma)`` calls.
    completed : int
        Transfers completed by a wait.
    bytes_copied : int
        Bytes moved by completed transfers.
    peak_in_flight : dict[int, int]
        Per queue, the most transfers in flight at once.
    peak_in_flight_total : int
        The most transfers in flight at once over all queues (at most
        ``MAX_DMA_DESCRIPTORS``).
    ring_stalls : int
        ``dma_copy`` calls that found the descriptor ring full and completed
        the oldest transfer first.

    Counters are reset when the context is entered and stay readable after it
    is left.
    """

    # The stand-in whose builtins are registered, if any (see "does not nest" above).
    _active: ClassVar[CPUDMA | None] = None

    def __init__(self) -> None:
        self._open = False
        self._saved: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self._queues: dict[int, deque[Transfer]] = {}
        self.copies = 0
        self.waits = 0
        self.legacy_waits = 0
        self.completed = 0
        self.bytes_copied = 0
        self.peak_in_flight: dict[int, int] = {}
        self.peak_in_flight_total = 0
        self.ring_stalls = 0
        self._in_flight_total = 0

    @classmethod
    def active(cls) -> CPUDMA | None:
        """The stand-in entered now, if any.

        The stand-ins do not nest, so a helper that needs one uses the active
        stand-in when its caller has entered one, and enters its own otherwise.

        Returns
        -------
        dma : CPUDMA or None
            The stand-in whose builtins are registered, or None outside every
            ``with cpu_dma()`` block.
        """
        return cls._active

    # -- inspection --------------------------------------------------------------------

    @property
    def in_flight(self) -> dict[int, int]:
        """Per queue with transfers in flight, how many there are now."""
        return {queue: len(fifo) for queue, fifo in sorted(self._queues.items()) if fifo}

    @property
    def pending(self) -> list[Transfer]:
        """The transfers in flight now, in issue order."""
        return sorted((t for fifo in self._queues.values() for t in fifo), key=lambda t: t.index)

    def summary(self) -> str:
        """A one-line account of the counters, e.g. for a command line report.

        Returns
        -------
        summary : str
            ``copies=N waits=N (legacy N) completed=N bytes=N ring_stalls=N peak_in_flight={queue: N}
            in_flight={queue: N}``.
        """
        return (
            f"copies={self.copies} waits={self.waits} (legacy {self.legacy_waits}) "
            f"completed={self.completed} bytes={self.bytes_copied} ring_stalls={self.ring_stalls} "
            f"peak_in_flight={dict(sorted(self.peak_in_flight.items()))} in_flight={self.in_flight}"
        )

    # -- context -----------------------------------------------------------------------

    def __enter__(self) -> CPUDMA:
        if CPUDMA._active is not None:
            raise DMAError(
                "cpu_dma() does not nest: a stand-in is already registered for "
                f"{DMA_COPY} and {DMA_WAIT}; leave it first"
            )
        self._reset()
        self._saved = {name: tvm_ffi.get_global_func(name, allow_missing=True) for name in (DMA_COPY, DMA_WAIT)}
        # Closures, not bound methods, so a VM that outlives the context holds
        # functions that can tell it has ended (see _check_open).
        tvm.register_global_func(DMA_COPY, lambda *args: self._dma_copy(*args), override=True)
        tvm.register_global_func(DMA_WAIT, lambda *args: self._dma_wait(*args), override=True)
        self._open = True
        CPUDMA._active = self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        CPUDMA._active = None
        for name, previous in self._saved.items():
            if previous is None:
                tvm_ffi.remove_global_func(name)
            else:
                tvm.register_global_func(name, previous, override=True)
        self._saved = {}
        if exc_type is None and self.pending:
            # Only when leaving normally: an exception already on its way out is the
            # better diagnosis and must not be replaced.
            pending = self.pending
            raise DMAError(
                f"{len(pending)} DMA transfer(s) still in flight when leaving cpu_dma() (no "
                f"dma_wait completed them, so their dst was never written): "
                + "; ".join(str(t) for t in pending)
            )

    def _check_open(self, builtin: str) -> None:
        if not self._open:
            raise DMAError(
                f"{builtin} called after its cpu_dma() context was left: the VM binds builtins when "
                "it is constructed; construct and run it inside the context"
            )

    # -- the builtins ------------------------------------------------------------------

    def _queue(self, builtin: str, value: Any) -> int:
        queue = _int_arg(builtin, "queue_id", value)
        if not 0 <= queue < SYNC_DMA_QUEUE:
            raise DMAError(
                f"{builtin}: queue_id {queue} is not a user queue: user queues are 0..{SYNC_DMA_QUEUE - 1}, "
                f"queue {SYNC_DMA_QUEUE} is the runtime's own"
            )
        return queue

    def _dma_copy(self, _ctx: Any, *args: Any) -> None:
        """``dma_copy(ctx, src, dst, queue_id: int, bypass_cache: bool)``."""
        self._check_open("dma_copy")
        if len(args) != 4:
            raise DMAError(f"dma_copy takes (ctx, src, dst, queue_id, bypass_cache), got {len(args) + 1} arguments")
        src = _tensor_arg("dma_copy", "src", args[0])
        dst = _tensor_arg("dma_copy", "dst", args[1])
        queue = self._queue("dma_copy", args[2])
        _int_arg("dma_copy", "bypass_cache", args[3])  # a cache hint: nothing to model on the CPU
        src_bytes, dst_bytes = _nbytes(src), _nbytes(dst)
        if src_bytes != dst_bytes:
            raise DMAError(
                f"dma_copy: src {_describe(src)} holds {src_bytes} bytes but dst {_describe(dst)} "
                f"holds {dst_bytes}; the sizes must match"
            )
        if src_bytes == 0:
            raise DMAError(f"dma_copy: empty transfer (src {_describe(src)})")
        if src_bytes > MAX_DMA_LENGTH:
            raise DMAError(
                f"dma_copy: {src_bytes} bytes exceed a descriptor's {MAX_DMA_LENGTH} (2**24 - 1); "
                "split the copy (copy_to_dma does)"
            )
        if src.device == dst.device and abs(data_ptr(src) - data_ptr(dst)) < src_bytes:
            # Poisoning dst would destroy src; on the engine the result is undefined.
            raise DMAError(f"dma_copy: src {_describe(src)} and dst {_describe(dst)} overlap")
        if self._in_flight_total == MAX_DMA_DESCRIPTORS:
            busy = sorted(q for q, fifo in self._queues.items() if fifo)
            if busy != [queue]:
                # TVM's QueuedRingBuffer::Next records the queue before it finds the ring full,
                # once per retry: another queue's InFlight then counts those phantom entries,
                # not its own transfers, and its next wait may return early.
                raise DMAError(
                    f"dma_copy on queue {queue} finds all {MAX_DMA_DESCRIPTORS} descriptors in flight, "
                    f"on queues {busy}: TVM's runtime then miscounts the other queues' transfers "
                    "(each retry of the full ring is recorded as one of this queue's), so a later "
                    "dma_wait may return early; wait for some before issuing more (copy_to_dma's "
                    "schedule keeps at most 100 in flight)"
                )
            # The real builtin spins until the engine frees a descriptor; the engine works
            # through its chain in order, so the oldest transfer is the one that frees it.
            self.ring_stalls += 1
            oldest = min((fifo[0] for fifo in self._queues.values() if fifo), key=lambda t: t.index)
            self._complete(self._queues[oldest.queue])
        transfer = Transfer(self.copies, queue, src, dst, src_bytes)
        poison = tvm.runtime.tensor(np.full(dst_bytes, 0xFF, dtype=np.uint8), device=dst.device)
        _copy_from_to(poison, dst)
        fifo = self._queues.setdefault(queue, deque())
        fifo.append(transfer)
        self.copies += 1
        self._in_flight_total += 1
        self.peak_in_flight[queue] = max(self.peak_in_flight.get(queue, 0), len(fifo))
        self.peak_in_flight_total = max(self.peak_in_flight_total, self._in_flight_total)

    def _dma_wait(self, _ctx: Any, *args: Any) -> None:
        """``dma_wait(ctx, queue_id, inflight_dma, bypass_cache, src, dst)``, or the legacy
        ``dma_wait(ctx, queue_id, inflight_dma)`` of runtimes before apache/tvm#16706."""
        self._check_open("dma_wait")
        if len(args) == 5:
            _int_arg("dma_wait", "bypass_cache", args[2])
            _tensor_arg("dma_wait", "src", args[3])
            _tensor_arg("dma_wait", "dst", args[4])
        elif len(args) == 2:
            self.legacy_waits += 1
        else:
            raise DMAError(
                "dma_wait takes (ctx, queue_id, inflight_dma, bypass_cache, src, dst) or the legacy "
                f"(ctx, queue_id, inflight_dma), got {len(args) + 1} arguments"
            )
        queue = self._queue("dma_wait", args[0])
        inflight = _int_arg("dma_wait", "inflight_dma", args[1])
        if inflight < 0:
            raise DMAError(f"dma_wait: inflight_dma must be >= 0, got {inflight}")
        self.waits += 1
        fifo = self._queues.get(queue, deque())
        while len(fifo) > inflight:
            self._complete(fifo)

    def _complete(self, fifo: deque[Transfer]) -> None:
        transfer = fifo.popleft()
        _copy_from_to(transfer.src, transfer.dst)  # src as it is now: see the module doc
        self.completed += 1
        self.bytes_copied += transfer.nbytes
        self._in_flight_total -= 1


def cpu_dma() -> CPUDMA:
    """Stand in for the Hexagon DMA builtins on the CPU, within a ``with`` block.

    Returns
    -------
    dma : CPUDMA
        A context manager; entering it registers ``vm.builtin.hexagon.dma_copy``
        and ``vm.builtin.hexagon.dma_wait``, leaving it restores the previous
        functions (or removes them) and raises :class:`DMAError` if transfers
        are still in flight.  Its counters stay readable afterwards.

    Examples
    --------
    Construct the VM inside the block: it binds builtins when constructed.

    .. code-block:: python

        executable = relax.build(mod, target="llvm")
        with cpu_dma() as dma:
            vm = relax.VirtualMachine(executable, tvm.cpu())
            out = vm["main"](x)
        assert dma.copies == dma.completed
    """
    return CPUDMA()
