"""The second reference rewrite: stage kernel inputs into VTCM.

For each kernel call of a lowered (VM-level) function, each input argument
chosen is copied into VTCM just before the call, and the call reads the copy::

    matmul(x, w, out)

becomes::

    vtcm_storage = R.vm.alloc_storage(R.shape([N0]), 0, R.dtype("uint8"), R.str("global.vtcm"))
    x_vtcm = R.vm.alloc_tensor(vtcm_storage, 0, R.shape([4, 16]), R.dtype("float32"))
    R.vm.copy_tensor(x, x_vtcm)
    vtcm_storage1 = R.vm.alloc_storage(R.shape([N1]), 0, R.dtype("uint8"), R.str("global.vtcm"))
    w_vtcm = R.vm.alloc_tensor(vtcm_storage1, 0, R.shape([16, 32]), R.dtype("float32"))
    R.vm.copy_tensor(w, w_vtcm)
    matmul(x_vtcm, w_vtcm, out)

:func:`rewrite_ext.hexagon.copy_to_dma` then turns the copies into DMA
transfers.  VTCM is planned before anything is emitted (:func:`plan_vtcm`):
a staged tensor lives from its copy to the end of its kernel call, so the
tensors of different calls share space, and every tensor sits at offset 0
of a storage of its own *slot* (TVM's CPU kernels reject tensors at a
non-zero byte offset); a slot's storage is emitted at its first use and
serves the later calls.  The slots together stay within the VTCM capacity;
a tensor that cannot fit is left in place and reported.

:func:`cpu_vtcm` lets such a module run on the CPU, where the allocator
knows no ``global.vtcm`` scope.
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, NamedTuple

import tvm
import tvm.relax.op.vm as relax_vm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import ExternFuncPattern, is_gv

from .. import ops
from .._ir import StringImm, all_bindings, function_name, shown_op, spelled, static_nbytes
from ..rewrite import rewrite_call
from ..compat import imm_value, ty, ty_args, var_name
from ._memory import ALLOC_TENSOR, shared_bytes, written_params

__all__ = [
    "VTCM_BLOCK_BYTES",
    "VTCM_SCOPE",
    "CPUVTCM",
    "LowerToVMIR",
    "StagedTensor",
    "VTCMCapacityWarning",
    "VTCMPlan",
    "cpu_vtcm",
    "plan_vtcm",
    "stage_in_vtcm",
    "vtcm_capacity",
]

#: The storage scope of Hexagon's VTCM.
VTCM_SCOPE = "global.vtcm"

#: The target whose capacity applies when none is given or current: 4 MiB.
DEFAULT_TARGET = "qcom/hexagon-v68"

Select = Callable[[relax.Call, int], bool]
"""``select(call, index)``: whether to stage argument ``index`` of kernel call ``call``."""


class VTCMCapacityWarning(UserWarning):
    """Some tensors chosen for staging did not fit in VTCM and were left in place."""


def vtcm_capacity(target: int | str | tvm.target.Target | None = None) -> int:
    """The VTCM bytes of a target.

    Parameters
    ----------
    target : Union[int, str, tvm.target.Target, None]
        Bytes, or a Hexagon target (``"qcom/hexagon-v68"``: 4 MiB,
        ``"qcom/hexagon-v73"``: 8 MiB, ...) whose attribute ``vtcm-capacity``
        is read.  None: the current target if it has that attribute, else
        ``qcom/hexagon-v68``.

    Returns
    -------
    capacity : int
        The capacity in bytes.
    """
    if isinstance(target, numbers.Integral) and not isinstance(target, bool):
        if target < 0:
            raise ValueError(f"capacity must be a number of bytes >= 0, got {target!r}")
        return int(target)  # numpy's integers too
    if not isinstance(target, (str, tvm.target.Target, type(None))):
        raise TypeError(
            "capacity must be a number of bytes (int), a Hexagon target or its name, "
            f"got {type(target).__name__} {target!r}"
        )
    if target is None:
        current = tvm.target.Target.current(allow_none=True)
        target = current if current is not None and "vtcm-capacity" in current.attrs else DEFAULT_TARGET
    if isinstance(target, str):
        try:
            target = tvm.target.Target(target)
        except Exception as exc:  # noqa: BLE001 - TVM's own error types
            raise ValueError(
                f"capacity {target!r} is not a target TVM knows ({exc}); pass a Hexagon target "
                f"such as '{DEFAULT_TARGET}', or the bytes as an int"
            ) from exc
    capacity = target.attrs.get("vtcm-capacity")
    if capacity is None:
        raise ValueError(
            f"target {target} has no 'vtcm-capacity' attribute; pass a Hexagon target such as "
            f"'{DEFAULT_TARGET}' or the capacity in bytes"
        )
    return int(capacity)


@dataclass(frozen=True)
class StagedTensor:
    """One kernel argument chosen for staging.

    Attributes
    ----------
    function : str
        The Relax function holding the call.
    kernel : str
        The callee: a PrimFunc's name or a packed function's symbol.
    argument : str
        The argument's var name, as ``select`` sees it
        (``rewrite_ext.compat.var_name(call.args[i])``: ``fc1.weight`` for an
        ``nn.Module`` parameter); printed as TVMScript spells it (``fc1_weight``).
    indices : tuple[int, ...]
        Its positions among the call's arguments (more than one when the
        same tensor is passed twice; it is staged once).
    nbytes : int
        Its size.
    slot : Optional[int]
        The VTCM slot it is copied into, or None when it was left in place.
    """

    function: str
    kernel: str
    argument: str
    indices: tuple[int, ...]
    nbytes: int
    slot: int | None

    def __str__(self) -> str:
        where = f"slot {self.slot}" if self.slot is not None else "left in place"
        return f"{self.function}: {self.kernel} argument {spelled(self.argument)} ({self.nbytes} bytes): {where}"


@dataclass(frozen=True)
class VTCMPlan:
    """Where each staged tensor goes, per function.

    Attributes
    ----------
    capacity : int
        The VTCM bytes planned for.
    tensors : tuple[StagedTensor, ...]
        Every argument chosen, in program order, staged or left in place.
    slots : dict[str, tuple[int, ...]]
        Per function with staged tensors, the bytes of each slot (one
        ``global.vtcm`` storage each); their sum is at most ``capacity``.
    """

    capacity: int
    tensors: tuple[StagedTensor, ...]
    slots: dict[str, tuple[int, ...]]
    # The staged arguments of each call, keyed by the call itself (identity).
    _by_call: dict[relax.Call, list[StagedTensor]] = field(repr=False, compare=False)

    @property
    def staged(self) -> list[StagedTensor]:
        """The tensors copied into VTCM."""
        return [t for t in self.tensors if t.slot is not None]

    @property
    def left_in_place(self) -> list[StagedTensor]:
        """The tensors that did not fit."""
        return [t for t in self.tensors if t.slot is None]

    def __str__(self) -> str:
        used = ", ".join(
            f"{name}: {sum(sizes)} bytes in {len(sizes)} slot(s), {_vtcm_bytes(sizes)} in {VTCM_BLOCK_BYTES}-byte blocks"
            for name, sizes in self.slots.items()
        )
        lines = [
            f"# VTCM plan: capacity {self.capacity} bytes; {len(self.staged)} tensor(s) staged, "
            f"{len(self.left_in_place)} left in place" + (f"; {used}" if used else "")
        ]
        lines += [f"#   {t}" for t in self.tensors]
        return "\n".join(lines)


# -- planning ----------------------------------------------------------------------------


def _scope_of(call: relax.Call) -> str | None:
    """The storage scope of an ``alloc_storage`` call (``R.vm`` or ``R.memory``)."""
    if isinstance(call.op, tvm.ir.Op) and call.op.name in ("relax.vm.alloc_storage", "relax.memory.alloc_storage"):
        return next((str(a.value) for a in call.args if isinstance(a, StringImm)), None)
    return None


def _kernel(call: relax.Call, mod: tvm.IRModule) -> tuple[str, frozenset[int] | None] | None:
    """The callee's name and the arguments it may write (None: unknown), if a kernel call."""
    if isinstance(call.op, relax.GlobalVar) and isinstance(mod[call.op], tvm.tirx.PrimFunc):
        return call.op.name_hint, written_params(mod[call.op])
    if isinstance(call.op, relax.ExternFunc):  # R.call_packed: what it writes is unknown
        return str(call.op.global_symbol), None
    return None


def _default_select(call: relax.Call, _index: int) -> bool:
    # PrimFunc inputs only: a packed function may write any argument, and a
    # staged argument is copied in, never back out.
    return isinstance(call.op, relax.GlobalVar)


def _assign_slots(
    calls: list[list[int]], capacity: int, prefetch: bool = False
) -> tuple[list[int], list[list[int | None]]]:
    """Slots for tensors that live together per call: best fit, else grow, else a new slot.

    Tensors of one call need distinct slots; tensors of different calls never
    overlap in time, so they share.  With ``prefetch`` a call's tensors live
    from the call before it on, so they take none of that call's slots.
    Larger tensors are placed first.
    """
    sizes: list[int] = []
    placed: list[list[int | None]] = []
    busy: set[int] = set()  # the previous call's slots, with prefetch
    for needs in calls:
        free = set(range(len(sizes))) - busy
        where: list[int | None] = [None] * len(needs)
        for i in sorted(range(len(needs)), key=lambda i: -needs[i]):
            need = needs[i]
            fitting = [s for s in sorted(free) if sizes[s] >= need]
            largest = max(sorted(free), key=sizes.__getitem__, default=None)
            used = _vtcm_bytes(sizes)
            if fitting:
                slot = min(fitting, key=sizes.__getitem__)
            elif largest is not None and used + _blocks(need) - _blocks(sizes[largest]) <= capacity:
                slot, sizes[largest] = largest, need
            elif used + _blocks(need) <= capacity:
                slot = len(sizes)
                sizes.append(need)
            else:
                continue
            free.discard(slot)
            where[i] = slot
        placed.append(where)
        if prefetch:
            busy = {slot for slot in where if slot is not None}
    return sizes, placed


#: TVM's VTCM allocator hands out storage in blocks of this many bytes
#: (``kHexagonAllocAlignment``; ``VTCMAllocation`` in ``hexagon_buffer.cc`` rounds every
#: size up to a multiple of it), so a plan counts each slot in whole blocks.
VTCM_BLOCK_BYTES = 2048


def _blocks(nbytes: int) -> int:
    """``nbytes`` rounded up to whole blocks, as TVM's allocator hands VTCM out."""
    return -(-nbytes // VTCM_BLOCK_BYTES) * VTCM_BLOCK_BYTES


def _vtcm_bytes(sizes: Iterable[int]) -> int:
    """The VTCM storages of ``sizes`` bytes take."""
    return sum(_blocks(size) for size in sizes)


def _vtcm_storages(func: relax.Function) -> Iterator[relax.Call]:
    """The ``global.vtcm`` storage allocations of ``func``, at any depth."""
    for binding in all_bindings(func):
        value = binding.value
        if isinstance(value, relax.Call) and _scope_of(value) == VTCM_SCOPE:
            yield value


def _vtcm_in_use(func: relax.Function, capacity: int) -> int:
    """The VTCM the function's own ``global.vtcm`` storages take already (a size that is not
    static: all of it), so that staging again, or after another pass, stays within capacity."""
    sizes = []
    for storage in _vtcm_storages(func):
        size = storage.args[0]
        dims = [imm_value(d) for d in size.values] if isinstance(size, relax.ShapeExpr) else [None]
        if None in dims:
            return capacity
        sizes.append(math.prod(dims))
    return _vtcm_bytes(sizes)


class _Choice(NamedTuple):
    argument: str
    indices: tuple[int, ...]
    nbytes: int


def _plan_function(
    func: relax.Function, name: str, mod: tvm.IRModule, select: Select, capacity: int, prefetch: bool
) -> tuple[list[tuple[relax.Call, list[_Choice]]], list[int], list[list[int | None]]]:
    """The kernel calls with arguments chosen, the slot sizes, and each choice's slot."""
    # Only the function's own blocks: VTCM storages emitted there stay visible to
    # every later block.  Calls inside If branches or local functions are not staged.
    in_vtcm: set[relax.Var] = set()
    values: dict[relax.Var, relax.Expr] = {}  # what an argument may be an alias or a view of
    calls = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            values[binding.var] = value
            if isinstance(value, relax.Var) and value in in_vtcm:
                in_vtcm.add(binding.var)
            if not isinstance(value, relax.Call):
                continue
            if _scope_of(value) == VTCM_SCOPE or (
                isinstance(value.op, tvm.ir.Op) and value.op.name in ALLOC_TENSOR and value.args[0] in in_vtcm
            ):
                in_vtcm.add(binding.var)  # a VTCM storage, or a tensor allocated in one
            kernel = _kernel(value, mod)
            if kernel is None:
                continue
            chosen: dict[relax.Expr, list[int]] = {}
            written = kernel[1] or ()
            outputs = [value.args[index] for index in written if index < len(value.args)]
            for index, arg in enumerate(value.args):
                nbytes = static_nbytes(ty(arg))
                if arg in in_vtcm or nbytes in (None, 0):
                    continue
                if any(_shares_bytes(values, arg, nbytes, out) for out in outputs):
                    # An output, here or at another position of the same call, or bytes of one:
                    # copying it in would lose what the kernel writes (or what it reads after
                    # writing it).
                    continue
                if select(value, index):
                    chosen.setdefault(arg, []).append(index)
            if chosen:
                calls.append((value, [_Choice(_arg_name(a), tuple(ix), static_nbytes(ty(a))) for a, ix in chosen.items()]))
    available = max(0, capacity - _vtcm_in_use(func, capacity))
    sizes, placed = _assign_slots([[c.nbytes for c in choices] for _, choices in calls], available, prefetch)
    return calls, sizes, placed


def _shares_bytes(values: dict[relax.Var, relax.Expr], arg: relax.Expr, nbytes: int, out: relax.Expr) -> bool:
    """Whether ``arg`` may share bytes with ``out``, a tensor the kernel writes."""
    out_nbytes = static_nbytes(ty(out)) or sys.maxsize  # (a size not static: it may reach anywhere)
    return shared_bytes(values.get, arg, nbytes, out, out_nbytes) is not None


def _arg_name(arg: relax.Expr) -> str:
    return var_name(arg) if isinstance(arg, relax.Var) else type(arg).__name__


def plan_vtcm(
    target: tvm.IRModule,
    *,
    select: Select | None = None,
    capacity: int | str | tvm.target.Target | None = None,
    prefetch: bool = False,
) -> VTCMPlan:
    """Plan which kernel arguments :func:`stage_in_vtcm` stages and where.

    Parameters
    ----------
    target, select, capacity, prefetch
        As for :func:`stage_in_vtcm`.

    Returns
    -------
    plan : VTCMPlan
        Every argument chosen, its slot or None, and each function's slots.
    """
    if not isinstance(target, tvm.IRModule):
        raise TypeError(
            f"stage_in_vtcm needs the IRModule (its PrimFuncs tell kernel inputs from outputs), "
            f"got {type(target).__name__}"
        )
    select = select or _default_select
    total = vtcm_capacity(capacity)
    tensors: list[StagedTensor] = []
    slots: dict[str, tuple[int, ...]] = {}
    by_call: dict[relax.Call, list[StagedTensor]] = {}
    for gvar, func in target.functions_items():
        if not isinstance(func, relax.Function):
            continue
        name = function_name(func, gvar.name_hint)
        calls, sizes, placed = _plan_function(func, name, target, select, total, prefetch)
        if sizes:
            slots[name] = tuple(sizes)
        for (call, args), where in zip(calls, placed):
            kernel = _kernel(call, target)[0]
            staged = [StagedTensor(name, kernel, *choice, slot) for choice, slot in zip(args, where)]
            tensors += staged
            by_call[call] = [t for t in staged if t.slot is not None]
    return VTCMPlan(total, tuple(tensors), slots, by_call)


# -- the rewrite -------------------------------------------------------------------------


def _staging_rewriter(plan: VTCMPlan) -> Callable[[relax.Expr, dict, relax.BlockBuilder], relax.Expr | None]:
    """The rewriter for kernel calls, the example to read."""
    storages: dict[tuple[str, int], relax.Var] = {}  # one storage per slot, emitted at first use

    def stage_rewriter(orig: relax.Call, _matchings: dict, builder: relax.BlockBuilder) -> relax.Expr | None:
        staged = plan._by_call.get(orig)
        if not staged:
            return None  # nothing chosen, nothing fits, or a call staged already
        args = list(orig.args)  # the call's own args: robust whatever `matchings` holds
        for tensor in staged:
            key = (tensor.function, tensor.slot)
            if key not in storages:
                size = relax.ShapeExpr([plan.slots[tensor.function][tensor.slot]])
                storages[key] = builder.emit(
                    relax_vm.alloc_storage(size, 0, "uint8", VTCM_SCOPE), name_hint="vtcm_storage"
                )
            arg = args[tensor.indices[0]]
            # Offset 0: TVM's CPU kernels reject tensors at a non-zero byte offset.
            copy = builder.emit(
                relax_vm.alloc_tensor(storages[key], 0, ty(arg).shape, str(ty(arg).dtype)),
                name_hint=f"{tensor.argument}_vtcm",
            )
            builder.emit(ops.copy_tensor(arg, copy))
            for index in tensor.indices:
                args[index] = copy
        return relax.Call(orig.op, args, orig.attrs, ty_args(orig), orig.span)

    return stage_rewriter


def LowerToVMIR() -> tvm.transform.Pass:  # noqa: N802 - TVM names passes in CamelCase
    """TVM's passes that lower a model to the IR :func:`stage_in_vtcm` works on.

    The first passes of TVM's default build pipeline, up to memory planning:
    ``LegalizeOps``, ``RewriteDataflowReshape``, ``ToNonDataflow``,
    ``RemovePurityChecking``, ``CallTIRRewrite``, ``StaticPlanBlockMemory``
    and ``LowerAllocTensor``, in that order.  Their output calls each kernel
    with its outputs passed last, holds memory as ``alloc_storage`` /
    ``alloc_tensor`` and leaves functions ``relax.force_pure``.
    ``relax.build`` runs them again, and they change nothing on their own
    output.

    Returns
    -------
    ret : tvm.transform.Pass
        The passes as one ``tvm.transform.Sequential``.

    Examples
    --------
    .. code-block:: python

        mod, params = model.export_tvm(spec)
        staged = stage_in_vtcm(LowerToVMIR()(mod), capacity="qcom/hexagon-v68")
    """
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
        ],
        name="LowerToVMIR",
    )


# RewriteDataflowReshape turns reshape kernels back into R.reshape, which the VM's builtin
# lowering takes at build time: LowerToVMIR's output holds it.
_LOWERED_LEAVES = frozenset({"relax.reshape"})


def _not_lowered(target: relax.Function | tvm.IRModule) -> str | None:
    """What shows ``target`` is not lowered to VM-level IR yet (an ``R.call_tir``, or an
    operator LegalizeOps would legalize that LowerToVMIR does not leave), else None."""
    functions = [target] if isinstance(target, relax.Function) else [
        f for _, f in target.functions_items() if isinstance(f, relax.Function)
    ]
    for f in functions:
        for b in all_bindings(f):
            op = b.value.op if isinstance(b.value, relax.Call) else None
            if not isinstance(op, tvm.ir.Op) or op.name in _LOWERED_LEAVES:
                continue
            if op.name == "relax.call_tir" or op.get_attr("FLegalize") is not None:
                return shown_op(op)
    return None


def stage_in_vtcm(
    target: tvm.IRModule,
    *,
    select: Select | None = None,
    capacity: int | str | tvm.target.Target | None = None,
    prefetch: bool = False,
) -> tvm.IRModule:
    """Copy kernel inputs into VTCM just before each kernel call.

    Works on VM-level IR: functions lowered by TVM's passes up to memory
    planning (``CallTIRRewrite``, ``StaticPlanBlockMemory``,
    ``LowerAllocTensor``), where a ``call_tir`` is a call of its PrimFunc
    with the outputs passed last, and ``call_packed`` a call of an
    ``ExternFunc``.  Only calls in a function's own binding blocks are
    staged, not those inside If branches or local functions.

    Parameters
    ----------
    target : tvm.IRModule
        The lowered module; its PrimFuncs tell inputs from outputs.
    select : Optional[Callable[[relax.Call, int], bool]]
        ``select(call, index)``: whether to stage argument ``index`` of a
        kernel call.  It is asked only about tensor arguments of static size
        that are not in VTCM already and that share no bytes the function
        shows with what the kernel writes (a staged tensor is copied in,
        never back, and would not see those writes).  Default: every such
        argument of a PrimFunc call; none of a ``call_packed``, which may
        write any argument (choose those you know it only reads).
    capacity : Union[int, str, tvm.target.Target, None]
        VTCM bytes per function, or a Hexagon target whose
        ``vtcm-capacity`` is used (see :func:`vtcm_capacity`).  Default: the
        current target's when it carries ``vtcm-capacity`` (a Hexagon
        target), else ``qcom/hexagon-v68``'s 4 MiB (also under ``Target("llvm")``).
    prefetch : bool
        Plan for double buffering: a call's tensors take no slot of the call
        before it, so with ``copy_to_dma(..., overlap=True)`` their copies
        can run while that call does (when their sources are ready).  It
        takes more VTCM; what does not fit is left in place as usual.
        Default False: a tensor lives from its copy, just before its call,
        to the end of the call, and consecutive calls share slots.

    Returns
    -------
    result : tvm.IRModule
        A new module, or the input itself when nothing is staged.  If some
        chosen tensors did not fit, they are left in place and a
        :class:`VTCMCapacityWarning` names them; :func:`plan_vtcm` gives the
        same plan as data.

    Examples
    --------
    .. code-block:: python

        mod = stage_in_vtcm(mod, capacity="qcom/hexagon-v68")
        mod = copy_to_dma(mod, overlap=True)
    """
    plan = plan_vtcm(target, select=select, capacity=capacity, prefetch=prefetch)
    if plan.left_in_place:
        every = plan_vtcm(target, select=select, capacity=2**62, prefetch=prefetch)
        # VTCM is planned per function: what each function with a tensor left in place needs.
        short = sorted({t.function for t in plan.left_in_place})
        if len(every.slots) == 1:
            needed = f"{_vtcm_bytes(every.slots[short[0]])} bytes"
        else:
            needed = ", ".join(f"{_vtcm_bytes(every.slots[name])} bytes in '{name}'" for name in short)
        warnings.warn(
            f"stage_in_vtcm: {len(plan.left_in_place)} tensor(s) do not fit in {plan.capacity} bytes of "
            "VTCM beside the slots already planned (a call's tensors take slots of their own, each "
            f"slot as large as its largest tensor and counted in whole {VTCM_BLOCK_BYTES}-byte blocks, "
            f"as TVM's VTCM allocator hands it out; staging all of them would take {needed}, "
            "beside any VTCM the function allocates itself) and stay where they are: "
            + "; ".join(str(t) for t in plan.left_in_place),
            VTCMCapacityWarning,
            stacklevel=2,
        )
    unlowered = _not_lowered(target) if not plan.tensors else None
    if unlowered is not None:
        warnings.warn(
            f"stage_in_vtcm: nothing staged: the module still holds {unlowered}, so it is not "
            "lowered yet; stage after TVM's LegalizeOps, RewriteDataflowReshape, ToNonDataflow, "
            "RemovePurityChecking, CallTIRRewrite, StaticPlanBlockMemory and LowerAllocTensor, in "
            "that order: rewrite_ext.hexagon.LowerToVMIR()(mod) runs them",
            UserWarning,
            stacklevel=2,
        )
    kernel_call = is_gv()(varg_default_wildcard=True) | ExternFuncPattern("")(varg_default_wildcard=True)
    # A staged call still matches the pattern; the rewriter declines it, so one pass suffices.
    return rewrite_call(kernel_call, _staging_rewriter(plan), target, max_iterations=1)


# -- running on the CPU ------------------------------------------------------------------


def allocates_vtcm(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of ``mod`` allocates ``global.vtcm`` storage, so runs on the
    CPU need :func:`cpu_vtcm` (a module ``stage_in_vtcm`` staged, say)."""
    return any(
        next(_vtcm_storages(func), None) is not None
        for _, func in mod.functions_items()
        if isinstance(func, relax.Function)
    )

_ALLOC_STORAGE = "vm.builtin.alloc_storage"


class CPUVTCM:
    """The VTCM allocator stand-in; use it through :func:`cpu_vtcm`.

    Attributes
    ----------
    allocations : list[int]
        The bytes of each ``global.vtcm`` storage allocated, in order.
    """

    _active: ClassVar[CPUVTCM | None] = None

    def __init__(self) -> None:
        self.allocations: list[int] = []
        self._saved: Any = None

    @classmethod
    def active(cls) -> CPUVTCM | None:
        """The stand-in entered now, if any (see :meth:`CPUDMA.active`).

        Returns
        -------
        vtcm : CPUVTCM or None
            The stand-in registered for ``vm.builtin.alloc_storage``, or None
            outside every ``with cpu_vtcm()`` block.
        """
        return cls._active

    def __enter__(self) -> CPUVTCM:
        if CPUVTCM._active is not None:
            raise RuntimeError("cpu_vtcm() does not nest: leave the active one first")
        self.allocations = []
        self._saved = tvm_ffi.get_global_func(_ALLOC_STORAGE)
        saved = self._saved

        def alloc_storage(ctx: Any, shape: Any, device_index: int, dtype: Any, scope: str) -> Any:
            if str(scope) == VTCM_SCOPE:
                self.allocations.append(int(shape[0]))
                scope = "global"
            return saved(ctx, shape, device_index, dtype, scope)

        tvm.register_global_func(_ALLOC_STORAGE, alloc_storage, override=True)
        CPUVTCM._active = self
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tvm.register_global_func(_ALLOC_STORAGE, self._saved, override=True)
        CPUVTCM._active = None


def cpu_vtcm() -> CPUVTCM:
    """Let ``global.vtcm`` storage be allocated on the CPU, within a ``with`` block.

    TVM's CPU allocator rejects the scope at run time ("This alloc should be
    implemented").  Inside the block, ``vm.builtin.alloc_storage`` allocates
    ``global.vtcm`` storage as ``global`` and records its size; leaving the
    block restores TVM's builtin.  The VM binds builtins when it is
    constructed: construct it inside the block.

    Returns
    -------
    vtcm : CPUVTCM
        A context manager whose ``allocations`` list the VTCM storages made.

    Examples
    --------
    .. code-block:: python

        with cpu_vtcm() as vtcm, cpu_dma() as dma:
            vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
            out = vm["main"](x)
        assert sum(vtcm.allocations) <= vtcm_capacity("qcom/hexagon-v68")
    """
    return CPUVTCM()
