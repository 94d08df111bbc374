"""Async overlap: sink each Hexagon ``dma_wait`` to the first binding that needs it.

:func:`~rewrite_ext.hexagon.copy_to_dma` puts every ``dma_wait`` right after its
``dma_copy`` with ``inflight_dma=0``: correct, but the engine never works while
the core computes.  :func:`sink_dma_waits` is a post-pass over that IR: each
``dma_copy`` stays where it is and its ``dma_wait`` moves down its block to just
before the first binding that conflicts with the transfer, with ``inflight_dma``
set so that the wait completes its own transfer and no more.

The rules (see also ``docs/hexagon-overlap-notes.md``):

Conflicts
    A later binding of the same block conflicts with a transfer ``src -> dst``
    when it writes anything that may alias ``src``, reads or writes anything
    that may alias ``dst``, frees any of them or their storage, or is an If (or
    another nested SeqExpr, or a local function) that uses any of them.  Reading
    ``src`` is not a conflict.  Without a conflict the wait goes to the end of
    its block.  A wait never leaves its block.
Reads and writes
    A call of an operator whose ``FPurity`` is true reads its arguments and
    writes none; allocations (``alloc_tensor`` in a storage) read nothing.
    Any other call (impure operators, ``kill_*``, packed calls, a lowered
    ``call_tir`` of a PrimFunc, a Relax function) may read and write every
    argument, through tuples, and a called local function also what it
    captures.  Another ``dma_copy`` reads its src and writes its dst; a
    ``dma_wait`` touches nothing.  A called function is assumed to touch only
    what it is passed (and, for a closure, what it captures).
Results
    A pure operator returns a fresh tensor, except the views ``reshape``,
    ``R.memory.view`` and ``R.memory.ensure_zero_offset``, which alias their
    input.  Making a view counts as reading its input: outside dataflow blocks
    ``R.reshape`` is legalized to a copying ``call_tir``.  Packed, in-place and impure calls may return any argument or
    anything not allocated in the function.
Aliasing
    Tensors alias when they come from the same storage with byte ranges that
    overlap or are not constant, or when one is a view of the other.  A
    parameter may alias any other parameter and anything not allocated in the
    function, never a tensor placed in a storage the function allocates.
Inflight counts and order
    ``inflight_dma`` of a wait is the number of transfers on its queue issued
    after its own and not yet waited for (FIFO per queue).  Waits landing at
    the same point come in issue order, and a wait never moves below a later
    transfer's wait on the same queue (that wait completes it anyway, FIFO),
    so every wait is the first to complete its transfer.
What is left alone
    A block is rewritten only when each of its DMA builtins is a ``dma_copy``
    immediately followed by its ``dma_wait`` with ``inflight_dma=0``.  Legacy
    two-argument waits ``dma_wait(queue, 0)`` stay next to their copy (they do
    not carry src and dst, so moving them would let ``KillAfterLastUse`` free
    the buffers while the engine uses them), as do waits whose var is used;
    they still count in the inflight arithmetic and bound other waits of their
    queue.  Any other arrangement (e.g. already sunk waits) leaves the block
    unchanged, which makes the pass idempotent.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .. import _ir
from .dma import DMA_COPY, DMA_WAIT

__all__ = [
    "ANYTHING",
    "EXTERNAL",
    "AliasFact",
    "Region",
    "Root",
    "alias_facts",
    "TransferOverlap",
    "format_overlap_report",
    "overlap_report",
    "sink_dma_waits",
]

_BUILTIN_WITH_CTX = "relax.call_builtin_with_ctx"
_ALLOC_STORAGE_OPS = frozenset({"relax.vm.alloc_storage", "relax.memory.alloc_storage"})
_ALLOC_TENSOR_OPS = frozenset({"relax.vm.alloc_tensor", "relax.memory.alloc_tensor"})
# Results alias the first argument over the same bytes.  The last three are identities
# that do not survive to lowered code but would alias their input if they did.
_SAME_RANGE_VIEW_OPS = frozenset(
    {
        "relax.reshape",
        "relax.memory.ensure_zero_offset",
        "relax.hint_on_device",
        "relax.to_vdevice",
        "relax.builtin.stop_lift_params",
    }
)
_MEMORY_VIEW_OP = "relax.memory.view"
# FPurity is true, but the result may be (part of) an argument or something external.
_ALIASING_PURE_OPS = frozenset({"relax.call_pure_packed", "relax.invoke_pure_closure", "relax.make_closure"})
# FPurity is true because their in-place arguments must be dead afterwards; they still
# write those arguments, so they are treated like impure calls.
_IN_PLACE_OPS = frozenset({"relax.call_tir_inplace", "relax.call_inplace_packed"})


# ---------------------------------------------------------------------------------------------
# Alias facts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Root:
    """Where memory comes from: one allocation, or memory this function did not allocate.

    Attributes
    ----------
    kind : str
        ``"storage"`` (an ``alloc_storage`` of the function), ``"fresh"`` (a
        tensor a pure operator allocated), ``"external"``
        (anything not allocated in the function: parameters, what packed calls
        return) or ``"anything"`` (may be any memory at all: the parameters of a
        local function, which may be given the outer function's tensors).
    ident : int
        Tells apart roots of one kind; 0 for ``external`` and ``anything``.
    name : str
        The var that made it, for messages.
    """

    kind: str
    ident: int = 0
    name: str = ""


EXTERNAL = Root("external")
ANYTHING = Root("anything")


@dataclass(frozen=True)
class Region:
    """The bytes ``[start, stop)`` of a root that a value may refer to; None: not known.

    Attributes
    ----------
    root : Root
        The allocation.
    start, stop : Optional[int]
        Constant byte offsets inside the root, or None when not constant.
    """

    root: Root
    start: int | None = None
    stop: int | None = None

    def may_overlap(self, other: Region) -> bool:
        """Whether the two regions may share a byte.

        Parameters
        ----------
        other : Region
            The other region.

        Returns
        -------
        overlap : bool
            False only when provably disjoint: different roots (neither of
            them ``anything``), or constant byte ranges of one root that do not
            intersect.
        """
        if self.root.kind == "anything" or other.root.kind == "anything":
            return True
        if self.root != other.root:
            return False
        if None in (self.start, self.stop, other.start, other.stop):
            return True
        return self.start < other.stop and other.start < self.stop


@dataclass(frozen=True)
class AliasFact:
    """What memory a value may refer to: a set of regions (empty for shapes, ints, ...).

    Attributes
    ----------
    regions : frozenset[Region]
        Every region the value, or any tensor inside it (a tuple's fields, a
        closure's captures), may refer to.
    """

    regions: frozenset[Region] = frozenset()

    def may_alias(self, other: AliasFact) -> bool:
        """Whether some region of one may overlap some region of the other."""
        return any(a.may_overlap(b) for a in self.regions for b in other.regions)

    def __or__(self, other: AliasFact) -> AliasFact:
        return AliasFact(self.regions | other.regions)


_NOTHING = AliasFact()


def _fact(*regions: Region) -> AliasFact:
    return AliasFact(frozenset(regions))


def _union(facts: Iterable[AliasFact]) -> AliasFact:
    regions: set[Region] = set()
    for fact in facts:
        regions |= fact.regions
    return AliasFact(frozenset(regions))


def _may_hold_memory(ty: object) -> bool:
    """Whether a value of type ``ty`` may be or contain a tensor, a storage or a closure."""
    if isinstance(ty, (relax.ShapeType, tvm.ir.PrimType)):
        return False
    if isinstance(ty, relax.TupleType):
        return any(_may_hold_memory(field) for field in _ir.elements(ty.fields))
    return True


def _const_int(expr: object) -> int | None:
    """The value of an integer immediate, else None.

    TVM 0.27 has no ``relax.PrimValue``: ``R.prim_value(0)`` and ``0`` in
    builtin arguments both parse to an ``IntImm``.
    """
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    return None


def _op_name(call: relax.Call) -> str | None:
    return str(call.op.name) if isinstance(call.op, tvm.ir.Op) else None


def _is_pure_op(name: str) -> bool:
    return bool(tvm.ir.Op.get(name).get_attr("FPurity"))


def _leaf_fact(expr: relax.Expr, facts: dict[relax.Var, AliasFact]) -> AliasFact:
    """The fact of a var, a tuple of them or an immediate, from the facts of vars."""
    if isinstance(expr, relax.Var):
        # A var not seen yet (a local function calling itself) may be anything.
        return facts.get(expr, _fact(Region(ANYTHING)))
    if isinstance(expr, relax.Tuple):
        return _union(_leaf_fact(field, facts) for field in _ir.elements(expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        return _leaf_fact(expr.tuple_value, facts)  # any field: conservative
    if isinstance(expr, (relax.Call, relax.If, relax.SeqExpr, relax.Function)):
        return _fact(Region(ANYTHING))  # not in normal form: assume the worst
    # Constants are never written; immediates, shapes, strings, dtypes and callee names
    # (ExternFunc, GlobalVar) hold no memory.
    return _NOTHING


class _FactWalker:
    """Computes the :class:`AliasFact` of every var of a function, nested ones included."""

    def __init__(self) -> None:
        self.facts: dict[relax.Var, AliasFact] = {}
        self._serial = itertools.count(1)
        # Per enclosing function, what "not allocated in this function" may be: EXTERNAL at
        # the top level; inside a local function also the outer function's memory, which it
        # can be handed, hence ANYTHING.
        self._outside: list[AliasFact] = []

    def _new_root(self, kind: str, name: str) -> Root:
        return Root(kind, next(self._serial), name)

    def function(self, func: relax.Function, top: bool) -> None:
        outside = _fact(Region(EXTERNAL)) if top else _fact(Region(ANYTHING))
        self._outside.append(outside)
        try:
            for param in func.params:
                self.facts[param] = outside if _may_hold_memory(param.ty) else _NOTHING
            self.seq(func.body)
        finally:
            self._outside.pop()

    def seq(self, seq: relax.Expr) -> AliasFact:
        if not isinstance(seq, relax.SeqExpr):
            return self.of(seq)
        for block in seq.blocks:
            for binding in _ir.bindings_of(block):
                fact = self.value(binding.var, binding.value)
                self.facts[binding.var] = fact if _may_hold_memory(binding.var.ty) else _NOTHING
        return self.of(seq.body)

    def of(self, expr: relax.Expr) -> AliasFact:
        """The fact of a leaf expression (an argument, a tuple, a SeqExpr body)."""
        return _leaf_fact(expr, self.facts)

    def value(self, var: relax.Var, value: relax.Expr) -> AliasFact:
        """The fact of the value bound to ``var``."""
        if isinstance(value, relax.If):
            return self.seq(value.true_branch) | self.seq(value.false_branch)
        if isinstance(value, relax.SeqExpr):
            return self.seq(value)
        if isinstance(value, relax.Function):
            self.function(value, top=False)
            # A closure holds what it captures.
            return _union(self.of(v) for v in relax.analysis.free_vars(value))
        if isinstance(value, relax.Call):
            return self.call(var, value)
        return self.of(value)

    def call(self, var: relax.Var, call: relax.Call) -> AliasFact:
        name = _op_name(call)
        args = [self.of(arg) for arg in _ir.elements(call.args)]
        if name in _ALLOC_STORAGE_OPS:
            return _fact(Region(self._new_root("storage", _ir.var_name(var))))
        if name in _ALLOC_TENSOR_OPS:
            return _placed(args[0], _const_int(call.args[1]), _ir.static_nbytes(var.ty))
        if name in _SAME_RANGE_VIEW_OPS:
            return args[0]
        if name == _MEMORY_VIEW_OP:
            return _viewed(args[0], _relative_offset(call), _ir.static_nbytes(var.ty))
        if name is not None and name not in _ALIASING_PURE_OPS | _IN_PLACE_OPS and _is_pure_op(name):
            return _fact(Region(self._new_root("fresh", _ir.var_name(var))))
        # Packed, in-place or impure: any argument (or what a called closure holds), or
        # anything not allocated in this function.
        return _union(args) | self.of(call.op) | self._outside[-1]


def _placed(storage: AliasFact, offset: int | None, nbytes: int | None) -> AliasFact:
    """The fact of ``alloc_tensor(storage, offset, ...)`` of ``nbytes`` bytes."""
    regions = set()
    for region in storage.regions:
        if region.root.kind == "storage" and region.start is None and offset is not None and nbytes is not None:
            regions.add(Region(region.root, offset, offset + nbytes))
        else:
            regions.add(Region(region.root))
    return AliasFact(frozenset(regions))


def _relative_offset(call: relax.Call) -> int | None:
    """``R.memory.view``'s relative byte offset: 0 when omitted (an empty tuple)."""
    if len(call.args) < 4:
        return 0
    offset = call.args[3]
    if isinstance(offset, relax.Tuple) and len(offset.fields) == 0:
        return 0
    return _const_int(offset)


def _viewed(base: AliasFact, offset: int | None, nbytes: int | None) -> AliasFact:
    """The fact of ``R.memory.view(base, ...)`` at ``offset`` bytes from base, ``nbytes`` long."""
    regions = set()
    for region in base.regions:
        if region.start is not None and offset is not None and nbytes is not None:
            regions.add(Region(region.root, region.start + offset, region.start + offset + nbytes))
        else:
            regions.add(Region(region.root))
    return AliasFact(frozenset(regions))


def alias_facts(func: relax.Function) -> dict[relax.Var, AliasFact]:
    """The :class:`AliasFact` of every var of ``func``, nested scopes included.

    Parameters
    ----------
    func : relax.Function
        A top-level function: its parameters may be anything not allocated in it.

    Returns
    -------
    facts : dict[relax.Var, AliasFact]
        Per parameter and binding var.
    """
    walker = _FactWalker()
    walker.function(func, top=True)
    return walker.facts


# ---------------------------------------------------------------------------------------------
# Effects of a binding
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Effect:
    """What a binding may read and write."""

    reads: AliasFact = _NOTHING
    writes: AliasFact = _NOTHING

    def __or__(self, other: _Effect) -> _Effect:
        return _Effect(self.reads | other.reads, self.writes | other.writes)


@dataclass(frozen=True)
class _DMACall:
    """A ``call_builtin_with_ctx`` of ``dma_copy`` or ``dma_wait``, its arguments read."""

    kind: str  # "copy" or "wait"
    queue: int | None
    inflight: int | None = None  # waits only
    bypass_cache: int | None = None
    src: relax.Expr | None = None
    dst: relax.Expr | None = None
    well_formed: bool = True  # arity as the builtin expects

    @property
    def legacy(self) -> bool:
        return self.kind == "wait" and self.src is None


def _dma_call(value: relax.Expr) -> _DMACall | None:
    """Read a DMA builtin call; None for anything else."""
    if not isinstance(value, relax.Call) or _op_name(value) != _BUILTIN_WITH_CTX:
        return None
    func, args = value.args[0], value.args[1]
    if not isinstance(func, relax.ExternFunc) or str(func.global_symbol) not in (DMA_COPY, DMA_WAIT):
        return None
    fields = list(args.fields) if isinstance(args, relax.Tuple) else []
    if str(func.global_symbol) == DMA_COPY:
        if len(fields) != 4:
            return _DMACall("copy", None, well_formed=False)
        src, dst, queue, bypass = fields
        return _DMACall("copy", _const_int(queue), bypass_cache=_const_int(bypass), src=src, dst=dst)
    if len(fields) == 5:
        queue, inflight, bypass, src, dst = fields
        return _DMACall("wait", _const_int(queue), _const_int(inflight), _const_int(bypass), src, dst)
    if len(fields) == 2:
        return _DMACall("wait", _const_int(fields[0]), _const_int(fields[1]))
    return _DMACall("wait", None, well_formed=False)


def _effect(value: relax.Expr, facts: dict[relax.Var, AliasFact]) -> _Effect:
    """What evaluating ``value`` (a binding's value) may read and write."""
    of = functools.partial(_leaf_fact, facts=facts)
    if isinstance(value, (relax.If, relax.SeqExpr, relax.Function)):
        # A nested scope that uses any tensor conflicts with it (reads count as writes).
        used = _union(of(v) for v in relax.analysis.free_vars(value))
        inner = _Effect()
        if not isinstance(value, relax.Function):  # a function's body does not run here
            for binding in _nested_bindings(value):
                inner = inner | _effect(binding.value, facts)
        touched = used | inner.reads | inner.writes
        return _Effect(touched, touched)
    if not isinstance(value, relax.Call):
        return _Effect()  # vars, tuples, constants: no memory is accessed
    dma = _dma_call(value)
    if dma is not None and dma.well_formed:
        if dma.kind == "wait":
            return _Effect()  # completes a transfer; reads and writes nothing itself
        return _Effect(reads=of(dma.src), writes=of(dma.dst))
    name = _op_name(value)
    args = _union(of(arg) for arg in _ir.elements(value.args))
    if name is not None and name not in _IN_PLACE_OPS and _is_pure_op(name):
        if name in _ALLOC_TENSOR_OPS or name in _ALLOC_STORAGE_OPS:
            return _Effect()  # placing a tensor in a storage does not touch its bytes
        return _Effect(reads=args)
    touched = args | of(value.op)  # a called closure may touch what it captured
    return _Effect(touched, touched)


def _nested_bindings(expr: relax.Expr) -> Iterator[relax.Binding]:
    """Every binding inside an If's branches or a SeqExpr, at any depth (not in functions)."""
    if isinstance(expr, relax.If):
        yield from _nested_bindings(expr.true_branch)
        yield from _nested_bindings(expr.false_branch)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            for binding in _ir.bindings_of(block):
                yield binding
                yield from _nested_bindings(binding.value)


# ---------------------------------------------------------------------------------------------
# Planning one block
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Transfer:
    """One ``dma_copy`` and its wait, as found in a conforming block."""

    issue: int  # rank among the block's copies
    queue: int
    copy: int  # index of the dma_copy binding in the block
    wait: int  # index of its dma_wait binding (copy + 1)
    movable: bool
    src: relax.Expr | None
    dst: relax.Expr | None


def _same(a: relax.Expr | None, b: relax.Expr | None) -> bool:
    return a is not None and b is not None and bool(tvm_ffi.structural_equal(a, b))


def _block_transfers(bindings: list[relax.Binding], used: set[relax.Var]) -> list[_Transfer] | None:
    """The transfers of a block in issue order; None unless each copy is followed by its wait.

    A transfer is movable when its wait is the five-argument form with the copy's
    queue, bypass_cache, src and dst, ``inflight_dma=0``, and a var nothing uses.
    """
    transfers: list[_Transfer] = []
    index = 0
    while index < len(bindings):
        dma = _dma_call(bindings[index].value)
        if dma is None:
            index += 1
            continue
        if dma.kind != "copy" or not dma.well_formed or dma.queue is None or index + 1 == len(bindings):
            return None
        wait = _dma_call(bindings[index + 1].value)
        if wait is None or wait.kind != "wait" or not wait.well_formed or wait.queue != dma.queue or wait.inflight != 0:
            return None
        if not wait.legacy and not (
            wait.bypass_cache == dma.bypass_cache and _same(wait.src, dma.src) and _same(wait.dst, dma.dst)
        ):
            return None
        movable = not wait.legacy and bindings[index + 1].var not in used
        transfers.append(_Transfer(len(transfers), dma.queue, index, index + 1, movable, dma.src, dma.dst))
        index += 2
    return transfers


def _conflicts(effect: _Effect, src: AliasFact, dst: AliasFact) -> bool:
    """Whether a binding of ``effect`` must not run while ``src -> dst`` is in flight."""
    return effect.writes.may_alias(src | dst) or effect.reads.may_alias(dst)


def _with_inflight(binding: relax.VarBinding, inflight: int) -> relax.VarBinding:
    """The wait binding with ``inflight_dma`` replaced, keeping its var and the immediate's dtype."""
    call = binding.value
    fields = list(call.args[1].fields)
    fields[1] = tvm.tirx.IntImm(str(fields[1].ty.dtype), inflight)
    new_call = relax.Call(call.op, [call.args[0], relax.Tuple(fields)], call.attrs, call.ty_args, call.span)
    return relax.VarBinding(binding.var, new_call)


def _plan_block(
    bindings: list[relax.Binding], facts: dict[relax.Var, AliasFact], used: set[relax.Var]
) -> list[relax.Binding] | None:
    """The block's bindings with each movable wait sunk; None when nothing moves."""
    transfers = _block_transfers(bindings, used)
    if not transfers or not any(t.movable for t in transfers):
        return None
    moved = {t.wait: t for t in transfers if t.movable}
    # The block without the movable waits; `rest_index` maps old indices into it.
    rest = [i for i in range(len(bindings)) if i not in moved]
    rest_index = {old: new for new, old in enumerate(rest)}
    fixed_waits = {rest_index[t.wait]: t for t in transfers if not t.movable}
    effects = [_effect(bindings[i].value, facts) for i in rest]

    # Each wait's landing point: an index into `rest` (land just before it), or len(rest).
    land: dict[int, int] = {}
    for t in transfers:
        if not t.movable:
            continue
        src, dst = _leaf_fact(t.src, facts), _leaf_fact(t.dst, facts)
        point = rest_index[t.copy] + 1
        while point < len(rest):
            fixed = fixed_waits.get(point)
            if fixed is not None and fixed.queue == t.queue:
                break  # a later wait of this queue completes this transfer too (FIFO)
            if _conflicts(effects[point], src, dst):
                break
            point += 1
        land[t.issue] = point
    # Never below a later transfer's wait on the same queue: it would complete this one.
    earliest_later: dict[int, int] = {}
    for t in reversed(transfers):
        if t.movable:
            land[t.issue] = min(land[t.issue], earliest_later.get(t.queue, land[t.issue]))
            earliest_later[t.queue] = land[t.issue]
    if all(land[t.issue] == rest_index[t.copy] + 1 for t in transfers if t.movable):
        return None  # every wait stays right after its copy

    waits_at: dict[int, list[_Transfer]] = defaultdict(list)
    for t in transfers:  # issue order, so waits landing together stay in issue order
        if t.movable:
            waits_at[land[t.issue]].append(t)
    copies = {rest_index[t.copy]: t for t in transfers}
    pending: dict[int, list[int]] = defaultdict(list)  # per queue, issued and not waited
    planned: list[relax.Binding] = []
    for point in range(len(rest) + 1):
        for t in waits_at.get(point, []):
            queue = pending[t.queue]
            inflight = sum(1 for issue in queue if issue > t.issue)
            queue.remove(t.issue)
            wait = bindings[t.wait]
            planned.append(wait if inflight == 0 else _with_inflight(wait, inflight))
        if point == len(rest):
            break
        if point in copies:
            pending[copies[point].queue].append(copies[point].issue)
        elif point in fixed_waits:
            pending[fixed_waits[point].queue].remove(fixed_waits[point].issue)
        planned.append(bindings[rest[point]])
    return planned


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------


@mutator
class _SinkWaits(PyExprMutator):
    """Rebuilds the blocks whose waits move; every other block is re-emitted as is."""

    def __init__(self, facts: dict[relax.Var, AliasFact], used: set[relax.Var]) -> None:
        super().__init__()
        self.facts = facts
        self.used = used
        self.changed = False

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        planned = _plan_block(list(_ir.bindings_of(block)), self.facts, self.used)
        if planned is None:
            return super().visit_binding_block_(block)
        self.changed = True
        self.builder_._begin_binding_block()
        for binding in planned:
            self.visit_binding(binding)  # nested blocks (If branches) are planned too
        return self.builder_._end_block()


def _sink_function(func: relax.Function) -> relax.Function:
    mutator_ = _SinkWaits(alias_facts(func), _ir.used_vars(func))
    result = mutator_.visit_expr(func)
    return result if mutator_.changed else func


def sink_dma_waits(target: relax.Function | tvm.IRModule) -> relax.Function | tvm.IRModule:
    """Move each ``dma_wait`` down its block to the first binding that conflicts with its transfer.

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A function, or a module whose Relax functions are all processed,
        holding the DMA builtins as :func:`~rewrite_ext.hexagon.copy_to_dma`
        emits them: each ``dma_copy`` immediately followed by its ``dma_wait``
        with ``inflight_dma=0``, on one queue or several.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The same kind of object: the function (the input itself when no wait
        moves) or a new module.  The input is never modified; the result
        passes ``relax.analysis.well_formed``.

    Raises
    ------
    TypeError
        When ``target`` is neither a Relax function nor an IRModule.

    Notes
    -----
    The rules are those of the module docstring.  Each ``dma_copy`` stays
    where it is; its wait lands just before the first later binding of the
    same block that conflicts with the transfer, or at the end of the block,
    and gets ``inflight_dma`` = the number of transfers on its queue issued
    after it and not yet waited for there.  Waits landing at one point come in
    issue order; a wait never moves below a later transfer's wait on its
    queue.  The wait bindings keep their (unused, ``R.Tuple()``) vars.

    Examples
    --------
    .. code-block:: python

        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, x, a), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (y, b, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, y, b), ty_args=(R.Tuple,))
        c = R.add(a, a)

    becomes::

        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (y, b, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 1, 1, x, a), ty_args=(R.Tuple,))
        c = R.add(a, a)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, y, b), ty_args=(R.Tuple,))
    """
    if isinstance(target, relax.Function):
        result = _sink_function(target)
        if not result.same_as(target):
            relax.analysis.well_formed(result)
        return result
    if isinstance(target, tvm.IRModule):
        functions = dict(target.functions_items())
        changed = False
        for gvar, func in target.functions_items():
            if isinstance(func, relax.Function):
                new_func = _sink_function(func)
                if not new_func.same_as(func):
                    functions[gvar] = new_func
                    changed = True
        result_mod = tvm.IRModule(functions, attrs=target.attrs, global_infos=target.global_infos)
        if changed:
            relax.analysis.well_formed(result_mod)
        return result_mod
    raise TypeError(f"target must be a relax.Function or an IRModule, got {type(target).__name__}")


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferOverlap:
    """How much one DMA transfer overlaps, as read from IR.

    Attributes
    ----------
    function : str
        The function holding the transfer (a local function reports its
        top-level function's name).
    queue : Optional[int]
        The DMA queue, None when not a constant.
    src, dst : str
        The transfer's source and destination (var names).
    overlapped : Optional[int]
        Bindings strictly between the ``dma_copy`` and its ``dma_wait`` (other
        transfers' builtins included); None when its block holds no wait for it.
    inflight : Optional[int]
        The wait's ``inflight_dma``; None without a wait or when not constant.
    legacy : bool
        Whether the wait is the legacy two-argument form (paired by order).
    """

    function: str
    queue: int | None
    src: str
    dst: str
    overlapped: int | None
    inflight: int | None
    legacy: bool = False


def _expr_name(expr: relax.Expr | None) -> str:
    if isinstance(expr, relax.Var):
        return _ir.var_name(expr)
    return "?" if expr is None else str(expr)


def _all_blocks(expr: relax.Expr) -> Iterator[relax.BindingBlock]:
    """Every binding block under ``expr`` in program order: If branches, local functions."""
    if isinstance(expr, relax.Function):
        yield from _all_blocks(expr.body)
    elif isinstance(expr, relax.If):
        yield from _all_blocks(expr.true_branch)
        yield from _all_blocks(expr.false_branch)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            yield block
            for binding in _ir.bindings_of(block):
                yield from _all_blocks(binding.value)


def _block_report(function: str, bindings: list[relax.Binding]) -> list[TransferOverlap]:
    """Pair each wait of a block with the oldest unpaired copy it can belong to."""
    copies: list[tuple[int, _DMACall]] = []  # issue order
    # Per queue, the copies not paired yet, oldest first: a wait usually pairs with the first,
    # so pairing stays linear in the block however many copies it holds.
    unpaired: dict[int | None, deque[tuple[int, _DMACall]]] = defaultdict(deque)
    paired: dict[int, tuple[int, _DMACall]] = {}  # copy index -> (wait index, wait)
    for index, binding in enumerate(bindings):
        dma = _dma_call(binding.value)
        if dma is None or not dma.well_formed:
            continue
        if dma.kind == "copy":
            copies.append((index, dma))
            unpaired[dma.queue].append((index, dma))
            continue
        waiting = unpaired[dma.queue]
        for position, (copy_index, copy) in enumerate(waiting):
            if dma.legacy or (_same(copy.src, dma.src) and _same(copy.dst, dma.dst)):
                paired[copy_index] = (index, dma)
                del waiting[position]
                break
    report = []
    for copy_index, copy in copies:
        wait_index, wait = paired.get(copy_index, (None, None))
        report.append(
            TransferOverlap(
                function=function,
                queue=copy.queue,
                src=_expr_name(copy.src),
                dst=_expr_name(copy.dst),
                overlapped=None if wait_index is None else wait_index - copy_index - 1,
                inflight=None if wait is None else wait.inflight,
                legacy=wait is not None and wait.legacy,
            )
        )
    return report


def overlap_report(target: relax.Function | tvm.IRModule) -> list[TransferOverlap]:
    """One :class:`TransferOverlap` per ``dma_copy``, read from IR (sunk or not).

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A function or module holding the DMA builtins.

    Returns
    -------
    report : list[TransferOverlap]
        In program order, functions of a module by name.  A five-argument wait
        is paired with the oldest unpaired copy of its block with the same
        queue, src and dst; a legacy two-argument wait with the oldest unpaired
        copy of its queue.
    """
    if isinstance(target, relax.Function):
        functions = [(_ir.function_name(target), target)]
    elif isinstance(target, tvm.IRModule):
        functions = sorted(
            ((gvar.name_hint, func) for gvar, func in target.functions_items() if isinstance(func, relax.Function)),
            key=lambda item: item[0],
        )
    else:
        raise TypeError(f"target must be a relax.Function or an IRModule, got {type(target).__name__}")
    report: list[TransferOverlap] = []
    for name, func in functions:
        for block in _all_blocks(func):
            report.extend(_block_report(name, list(_ir.bindings_of(block))))
    return report


def format_overlap_report(report: list[TransferOverlap]) -> str:
    """A readable summary of :func:`overlap_report`, one ``#`` comment line per transfer.

    Parameters
    ----------
    report : list[TransferOverlap]
        What :func:`overlap_report` returned.

    Returns
    -------
    text : str
        A header line (transfers, how many overlap at least one binding, the
        total) and one line per transfer, e.g.::

            # DMA overlap: 2 transfers, 1 overlapping, 3 bindings overlapped in total
            #   main: x -> a on queue 0, 3 bindings overlapped (wait inflight 1)
            #   main: a -> b on queue 0, 0 bindings overlapped (wait inflight 0)

        Lines start with ``#`` so the text can follow printed TVMScript.
    """
    overlapping = sum(1 for t in report if t.overlapped)
    total = sum(t.overlapped or 0 for t in report)
    lines = [
        f"# DMA overlap: {len(report)} transfer{'' if len(report) == 1 else 's'}, {overlapping} overlapping, "
        f"{total} binding{'' if total == 1 else 's'} overlapped in total"
    ]
    for t in report:
        queue = "?" if t.queue is None else str(t.queue)
        where = f"#   {t.function}: {t.src} -> {t.dst} on queue {queue}, "
        if t.overlapped is None:
            lines.append(where + "no wait in its block")
            continue
        plural = "" if t.overlapped == 1 else "s"
        inflight = "?" if t.inflight is None else str(t.inflight)
        legacy = ", legacy wait" if t.legacy else ""
        lines.append(where + f"{t.overlapped} binding{plural} overlapped (wait inflight {inflight}{legacy})")
    return "\n".join(lines)
