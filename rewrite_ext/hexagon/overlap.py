"""Async overlap: start each Hexagon DMA transfer early and wait for it late, where it is safe.

:func:`~rewrite_ext.hexagon.copy_to_dma` puts every ``dma_wait`` right after its
``dma_copy`` with ``inflight_dma=0``: correct, but the engine never works while
the core computes.  :func:`sink_dma_waits` reschedules each block of that IR in
one forward pass:

Transfers
    A transfer is the ``dma_copy`` bindings (one, or one per chunk with the
    ``R.memory.view`` s that feed them) on one queue, followed by the
    five-argument ``dma_wait(queue, 0, bypass_cache, src, dst)`` on their whole
    src and dst.  Its ``dma_copy`` s move up to just after the last binding the
    transfer depends on: what defines src and dst, the last write of memory
    that may alias src, the last read or write of memory that may alias dst,
    the wait of an earlier transfer it conflicts with, and the previous
    transfer of its queue (so each queue keeps program order).  The
    ``alloc_tensor`` of dst, when it stands just before the copy (as
    ``stage_in_vtcm`` emits it), moves up with them: it touches no memory, and
    what the bytes it reuses held still orders the copy.  Its wait moves
    down to just before the first binding that conflicts with it, or to the
    end of the block.  Nothing leaves its block; compute keeps its order.
Conflicts
    A binding conflicts with a transfer ``src -> dst`` in flight when it writes
    memory that may alias src, or reads or writes memory that may alias dst.
    Reading src is fine.  Another transfer reads its src and writes its dst.
Waits
    A wait completes every older transfer of its queue too (FIFO), so the
    waits of one queue come in issue order: a conflict with a transfer also
    waits, right before, for the older transfers of its queue.  Of such a run
    of waits only the last is needed to synchronize; an earlier one is dropped
    (merged into it) when its src and dst stay alive past the run anyway (they
    are the last wait's, or a later binding uses them), since a wait's src and
    dst are what keeps ``KillAfterLastUse`` from freeing them early.
    ``inflight_dma`` of a wait is the number of ``dma_copy`` s of its queue
    issued after its transfer's last one: exact, as waits come in FIFO order.
The ring
    At most 100 ``dma_copy`` s (one descriptor ring serves every queue) are in
    flight at any point: before the 101st the oldest transfer is waited for,
    and a copy starts no earlier than the ring has room for it.  On a full
    ring TVM's runtime records each retry as an entry of the copying queue,
    and then miscounts the other queues' transfers.  An If, or a call of a
    function of the module or of a closure, that may issue ``dma_copy`` s of
    its own counts against the same ring, with as many as it likes: every
    transfer in flight is waited for before it, and none starts before it.
    A transfer of more than 100 chunks runs alone (its queue only stalls).
    Allocations moving with a transfer stay after a ``match_cast`` that may
    define a symbolic var of their shape.
Reads and writes
    An operator whose ``FPurity`` is true reads its arguments (a view, too:
    ``R.reshape`` is legalized to a copy outside dataflow) and writes none;
    allocations touch nothing; any other call (impure or in-place operators,
    ``kill_*``, packed calls, a lowered ``call_tir``, a closure) reads and
    writes its arguments, and a called closure what it captures.  An If or a
    local function touches whatever it uses, inside too.
Aliasing
    Memory is a root (an ``alloc_storage`` of the function, the result of a
    pure operator, memory not allocated in the function, or, for a local
    function's parameters, anything) and a byte range in it when constant.
    Parameters, constants and what packed calls return are the one root
    "external": they may alias each other.  ``alloc_tensor`` places a range in
    its storage; views keep their input's root.
Left alone
    A block holding another arrangement of DMA builtins (a copy without its
    wait, waits already moved, a non-zero ``inflight_dma``) is left as it is,
    which makes the pass idempotent.  Legacy two-argument waits and waits whose
    var is used stay with their copies; they bound their queue's other waits.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import itertools
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax

from .. import _ir
from .._gc import cyclic_gc_paused
from .cpu_dma import MAX_DMA_DESCRIPTORS as RING_DESCRIPTORS
from ._memory import VARS as _VARS
from ._memory import view_offset as _view_offset
from ._memory import written_params
from .dma import _DMA, DMA_COPY, DMA_WAIT, _extern, _imm
from ..compat import Constant, PrimType, ShapeType, TensorType, TupleType, imm, imm_value, ret_ty, set_type, ty, ty_args

__all__ = ["TransferOverlap", "format_overlap_report", "overlap_report", "sink_dma_waits"]

_CALL_BUILTIN = tvm.ir.Op.get("relax.call_builtin_with_ctx")
# TVM 0.27's registered constructors, (ret_ty, op, args, attrs, ty_args, span) and
# (fields, span): relax.Call's Python __init__ costs 4x the node.  Elsewhere: the classes.
_MAKE_CALL = tvm_ffi.get_global_func("ir.Call", allow_missing=True)
_MAKE_TUPLE = tvm_ffi.get_global_func("ir.Tuple", allow_missing=True)
if "ret_ty" not in inspect.signature(relax.Call.__init__).parameters:
    _MAKE_CALL = None
# Likewise (name, type, span), where relax.Var is tvm.ir.Var (0.27): relax.Var's __init__ costs
# 2.4 us, the node 0.4.  (Bindings: _ir.make_binding, on every version.)
_MAKE_VAR = relax.Var
if getattr(tvm.ir, "Var", None) is relax.Var:
    _MAKE_VAR = tvm_ffi.get_global_func("ir.Var", allow_missing=True) or relax.Var
_EXTERNAL, _ANYTHING = 0, -1  # roots; allocations get 1, 2, ...
_NOTHING: tuple = ()
_OUT = (_EXTERNAL, None, None)
_ANY = ((_ANYTHING, None, None),)
_INF = float("inf")

_SAME_RANGE_VIEWS = {
    "relax.reshape",
    "relax.memory.ensure_zero_offset",
    "relax.hint_on_device",
    "relax.to_vdevice",
    "relax.builtin.stop_lift_params",
}
# FPurity is true, yet they write in place or may return (part of) an argument.
_NOT_PLAINLY_PURE = {
    "relax.call_tir_inplace",
    "relax.call_inplace_packed",
    "relax.call_pure_packed",
    "relax.invoke_pure_closure",
    "relax.make_closure",
}


@functools.lru_cache(maxsize=None)
def _op_kind(name: str) -> str:
    if name in ("relax.vm.alloc_storage", "relax.memory.alloc_storage"):
        return "storage"
    if name in ("relax.vm.alloc_tensor", "relax.memory.alloc_tensor"):
        return "tensor"
    if name == "relax.memory.view":
        return "view"
    if name in _SAME_RANGE_VIEWS:
        return "same"
    if name == "relax.call_builtin_with_ctx":
        return "builtin"
    if name not in _NOT_PLAINLY_PURE and tvm.ir.Op.get(name).get_attr("FPurity"):
        return "pure"
    return "impure"


_KINDS: dict = {}  # Op -> kind; Ops are registry singletons, hashed by handle


def _kind(op: object) -> str:
    kind = _KINDS.get(op)
    if kind is None:
        kind = _op_kind(str(op.name)) if isinstance(op, tvm.ir.Op) else "impure"
        if isinstance(op, tvm.ir.Op):
            _KINDS[op] = kind
    return kind


_CLOSURE_CALLS = frozenset({"relax.invoke_closure", "relax.invoke_pure_closure"})
_NESTED = frozenset({relax.Tuple, relax.TupleGetItem, relax.Call, relax.If, relax.SeqExpr, relax.Function})
_VOID = TupleType([])


def _h(obj: object) -> int:
    """The address of an IR node: a dict key that costs nothing to compare, unlike the node
    (``Expr.__eq__`` is an FFI call), and stable while the IR being read is alive."""
    return obj.__chandle__()



def _overlap(a: tuple, b: tuple) -> bool:
    if a[0] == _ANYTHING or b[0] == _ANYTHING:
        return True
    if a[0] != b[0]:
        return False
    return a[1] is None or b[1] is None or (a[1] < b[2] and b[1] < a[2])


def _may_alias(x: tuple, y: tuple) -> bool:
    return any(_overlap(a, b) for a in x for b in y)


class _Ranges:
    """Values kept under regions; finds those of every region that may overlap a fact's.

    Per root, the distinct byte ranges stay sorted by start, so a lookup looks
    only at ranges starting less than the longest range's length before it.
    """

    def __init__(self) -> None:
        self.roots: dict[int, list] = {}  # root -> [sorted ranges, {range or None: value}, longest]

    def _key(self, region: tuple) -> tuple[dict, tuple | None]:
        entry = self.roots.get(region[0])
        if entry is None:
            entry = self.roots[region[0]] = [[], {}, 0]
        key = None if region[1] is None else (region[1], region[2])
        if key is not None and key not in entry[1]:
            bisect.insort(entry[0], key)
            entry[2] = max(entry[2], key[1] - key[0])
        return entry[1], key

    def get(self, region: tuple, make) -> object:
        """The value under exactly ``region``, ``make()`` when there is none yet."""
        values, key = self._key(region)
        value = values.get(key)
        if value is None:
            value = values[key] = make()
        return value

    def put(self, fact: tuple, slot: int) -> None:
        """Keep ``slot`` under each region of ``fact`` unless a later one is there."""
        for region in fact:
            values, key = self._key(region)
            if values.get(key, -1) < slot:
                values[key] = slot

    def find(self, fact: tuple) -> list:
        found: list = []
        anything = self.roots.get(_ANYTHING)
        for root, start, stop in fact:
            if root == _ANYTHING:
                for entry in self.roots.values():
                    found.extend(entry[1].values())
                continue
            if anything is not None:
                found.extend(anything[1].values())
            entry = self.roots.get(root)
            if entry is None:
                continue
            ranges, values, longest = entry
            if start is None:
                found.extend(values.values())
                continue
            if None in values:
                found.append(values[None])
            i = bisect.bisect_left(ranges, (start - longest + 1,))
            while i < len(ranges) and ranges[i][0] < stop:
                if ranges[i][1] > start:
                    found.append(values[ranges[i]])
                i += 1
        return found


# ---------------------------------------------------------------------------------------------
# Reading bindings
# ---------------------------------------------------------------------------------------------


class _Rec:
    """One binding as read: its kind, uses, effects, and a DMA builtin's arguments."""

    __slots__ = ("binding", "kind", "var", "uses", "reads", "writes", "dma", "new", "index")

    def __init__(self, binding, kind, var=None, uses=(), reads=_NOTHING, writes=_NOTHING, dma=None, new=None):
        self.binding, self.kind, self.var, self.uses = binding, kind, var, uses
        self.reads, self.writes, self.dma, self.new = reads, writes, dma, new
        self.index = 0  # position in its SeqExpr, over all its blocks


class _Reader:
    """Alias facts of vars and effects of bindings, scope by scope, planning nested blocks."""

    def __init__(self, known: dict, module: tvm.IRModule | None = None) -> None:
        self.facts: dict = {}
        self.known = known
        self.module = module
        # dma_copy s, and bindings that may issue some of their own, read so far: whether a
        # nested scope issues any.
        self.copies_read = 0
        self.closures: dict[int, bool] = {}  # local function var -> whether it issues dma_copy s
        self.callees: dict[str, bool] = {}  # the same of the module's functions, by name
        self.kernels: dict[str, frozenset[int] | None] = {}  # PrimFunc name -> what it may write
        self.storages: set[int] = set()
        self.roots = itertools.count(1)
        # Parameters: their caller holds them, so KillAfterLastUse never frees them here.
        self.params: set[int] = set()

    def leaf(self, expr: object) -> tuple:
        if type(expr) in _VARS:
            return self.facts.get(expr.__chandle__(), _ANY)  # unseen: a recursive local function's var
        if isinstance(expr, relax.Tuple):
            return tuple({r for field in _ir.elements(expr.fields) for r in self.leaf(field)})
        if isinstance(expr, relax.TupleGetItem):
            return self.leaf(expr.tuple_value)
        if isinstance(expr, (relax.Call, relax.If, relax.SeqExpr, relax.Function)):
            return _ANY
        if isinstance(expr, Constant) and isinstance(ty(expr), TensorType):
            # Constants are memory like any other, and a copy may write one.
            return (_OUT,)
        return _NOTHING  # immediates, shapes, strings, dtypes, callee names

    def union(self, exprs: Iterable) -> tuple:
        regions: set = set()
        for expr in exprs:
            regions.update(self.leaf(expr))
        return tuple(regions)

    def function(self, func: relax.Function, top: bool) -> relax.Function:
        outside = (_OUT,) if top else _ANY
        for param in func.params:
            # Types are read for parameters only (few): an int or a shape holds no memory.
            self.facts[_h(param)] = outside if _may_hold_memory(ty(param)) else _NOTHING
            self.params.add(_h(param))
        old = func.body  # each access makes a new wrapper: compare with this one
        body, _, _ = self.seq(old, outside)
        if body is old:
            return func
        return relax.Function(func.params, body, ret_ty(func), func.is_pure, func.attrs, func.span)

    def seq(self, seq: relax.Expr, outside: tuple) -> tuple[relax.Expr, tuple, tuple]:
        """``seq`` rescheduled, its result's fact, and all it may touch."""
        if not isinstance(seq, relax.SeqExpr):
            return seq, self.leaf(seq), self.leaf(seq)
        last_use: dict = {}
        blocks = []
        touched: set = set()
        index = 0
        read = self.read
        for block in seq.blocks:
            recs = []
            for binding in _ir.bindings_of(block):
                rec = read(binding, outside)
                if type(rec) is tuple:  # a copy, and the wait copy_to_dma left to this pass
                    copy, rec = rec
                    copy.index = index
                    for var in copy.uses:
                        last_use[var.__chandle__()] = index
                    recs.append(copy)
                    index += 1
                rec.index = index
                for var in rec.uses:
                    last_use[var.__chandle__()] = index
                if rec.reads:
                    touched.update(rec.reads)
                    touched.update(rec.writes)
                recs.append(rec)
                index += 1
            blocks.append((block, recs, index - len(recs)))
        for var in relax.analysis.free_vars(seq.body):
            last_use[_h(var)] = _INF
        new_blocks = []
        for block, recs, _ in blocks:
            planned = None
            if not isinstance(block, relax.DataflowBlock) and any(r.kind == "wait" for r in recs):
                planned = _plan_block(recs, last_use, self.leaf, self.params)
            if planned is None and any(r.new is not None or r.binding is None for r in recs):
                # Left alone: each wait this pass was to place goes right after its copy.
                planned = [r.new or r.binding or _wait_binding(r, 0) for r in recs]
            if planned is None:
                new_blocks.append(block)
            else:
                new_blocks.append(relax.BindingBlock(planned, block.span))
        if all(new is old for new, (old, _, _) in zip(new_blocks, blocks)):
            return seq, self.leaf(seq.body), tuple(touched)
        new_seq = relax.SeqExpr(new_blocks, seq.body, seq.span)
        set_type(new_seq, ty(seq))
        return new_seq, self.leaf(seq.body), tuple(touched)

    def read(self, binding: relax.Binding, outside: tuple) -> _Rec:
        value = binding.value
        known = self.known.get(value.__chandle__()) if self.known else None
        if type(known) is tuple:  # a DMA builtin copy_to_dma emitted: no need to read it back
            if len(known) == 5:  # a transfer's last copy, whose wait this pass makes
                _, dma, uses, wait, wait_uses = known
                self.copies_read += 1
                copy = _Rec(binding, "copy", None, uses, _NOTHING, _NOTHING, dma)
                # The var is the copy_tensor's (void: never used, so the transfer may move).
                return copy, _Rec(None, "wait", binding.var, wait_uses, _NOTHING, _NOTHING, wait)
            kind, dma, uses = known
            var = binding.var if kind != "copy" else None
            if kind == "copy":
                self.copies_read += 1
            return _Rec(binding, kind, var, uses, _NOTHING, _NOTHING, dma)
        var = binding.var
        if isinstance(value, relax.Call):
            return self.call(binding, var, value, outside)
        if isinstance(value, (relax.If, relax.SeqExpr, relax.Function)):
            return self.scope(binding, var, value)
        fact = self.leaf(value)
        self.facts[_h(var)] = fact
        return _Rec(binding, "compute", var, _arg_vars([value]))

    def scope(self, binding: relax.Binding, var: relax.Var, value: relax.Expr) -> _Rec:
        uses = tuple(relax.analysis.free_vars(value))
        captured = self.union(uses)
        copies_before = self.copies_read
        kind = "compute"
        # (A nested call that may issue DMA counts as one copy read: see `call`.)
        if isinstance(value, relax.Function):
            new = self.function(value, top=False)
            fact = touched = captured  # a closure holds what it captures; defining it is a use
            self.closures[_h(var)] = self.copies_read > copies_before
        elif isinstance(value, relax.If):
            old_true, old_false = value.true_branch, value.false_branch
            true, true_fact, true_touched = self.seq(old_true, _ANY)
            false, false_fact, false_touched = self.seq(old_false, _ANY)
            fact = tuple(set(true_fact) | set(false_fact))
            touched = tuple(set(captured) | set(true_touched) | set(false_touched))
            new = value
            if true is not old_true or false is not old_false:
                new = relax.If(value.cond, true, false, value.span)
                set_type(new, ty(value))
        else:
            new, fact, inner = self.seq(value, _ANY)
            touched = tuple(set(captured) | set(inner))
        if not isinstance(value, relax.Function) and self.copies_read > copies_before:
            kind = "issues dma"
        self.facts[_h(var)] = fact
        rebuilt = None
        if new is not value and isinstance(binding, relax.VarBinding):
            rebuilt = relax.VarBinding(var, new, binding.span)
        return _Rec(binding, kind, var, uses, touched, touched, None, rebuilt)

    def call(self, binding: relax.Binding, var: relax.Var, call: relax.Call, outside: tuple) -> _Rec:
        kind = _kind(call.op)
        if kind == "tensor" and self.known:
            size = self.known.get(var.__chandle__())
            if type(size) is int:  # a copy's dst, its size known to copy_to_dma: read 3 args, not 5
                args = call.args
                storage, offset, shape = _arg(args, 0), _arg(args, 1), _arg(args, 2)
                self.facts[_h(var)] = self._placed(self.leaf(storage), imm_value(offset), size)
                # (The shape may be a var, bound by a shape_of or a match_cast: moving the
                # allocation must not take it above that binding.)
                return _Rec(binding, "alloc", var, _arg_vars([storage, offset, shape]))
        args = _ir.elements(call.args)
        if kind == "builtin":
            dma = _read_dma(args)
            if dma is not None:
                if dma[0] == "copy":
                    self.copies_read += 1
                return _Rec(binding, dma[0], var, _arg_vars(args), _NOTHING, _NOTHING, dma[1])
            kind = "impure"
        uses = _arg_vars(args)
        if kind == "storage":
            root = next(self.roots)
            self.storages.add(root)
            self.facts[_h(var)] = ((root, None, None),)
            return _Rec(binding, "storage", var, uses)
        if kind == "tensor":
            self.facts[_h(var)] = self._placed(self.leaf(args[0]), imm_value(args[1]), _nbytes(args[2], args[3]))
            return _Rec(binding, "alloc", var, uses)
        first = self.leaf(args[0]) if args else _NOTHING
        if kind == "view":
            self.facts[_h(var)] = self._viewed(first, call)
            return _Rec(binding, "view", var, uses, first, _NOTHING, _DMA(None, None, args[0], None))
        if kind == "same":
            self.facts[_h(var)] = first
            return _Rec(binding, "compute", var, uses, first)
        reads = first if len(args) == 1 else self.union(args)
        if kind == "pure":
            self.facts[_h(var)] = ((next(self.roots), None, None),)
            return _Rec(binding, "compute", var, uses, reads)
        # Packed, in-place or impure: may touch and return any argument, what a called closure
        # holds, or anything not allocated here.
        touched = tuple(set(reads) | set(self.leaf(call.op)))
        self.facts[_h(var)] = tuple(set(touched) | set(outside))
        if isinstance(call.op, relax.Var):
            uses = list(uses) + [call.op]
        kind = "compute"
        if self._may_issue_dma(call):
            kind = "issues dma"
            self.copies_read += 1  # so that a scope holding this call issues DMA too
        writes = touched
        written = self._kernel_writes(call.op)
        if written is not None:
            # A PrimFunc writes only the parameters its body may write (TVM's region analysis,
            # as stage_in_vtcm asks it): reading a transfer's src, it need not wait for it.
            writes = self.union([args[i] for i in written if i < len(args)])
        return _Rec(binding, kind, var, uses, touched, writes)

    def _kernel_writes(self, op: object) -> frozenset[int] | None:
        """The arguments a call of ``op`` may write, if ``op`` names a PrimFunc of the module."""
        if type(op) is not relax.GlobalVar or self.module is None:
            return None
        name = op.name_hint
        if name not in self.kernels:
            func = _callee(self.module, name)
            self.kernels[name] = written_params(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        return self.kernels[name]

    def _may_issue_dma(self, call: relax.Call) -> bool:
        """Whether ``call`` may run ``dma_copy`` s of its own (kernels and packed functions
        are taken to issue none)."""
        op = call.op
        if isinstance(op, relax.GlobalVar):
            name = op.name_hint
            issues = self.callees.get(name)
            if issues is None:
                issues = self.callees[name] = _function_issues_dma(self.module, op, set())
            return issues
        if type(op) in _VARS:
            return self.closures.get(_h(op), True)  # a closure not defined here: it may
        return isinstance(op, tvm.ir.Op) and op.name in _CLOSURE_CALLS

    def _placed(self, storage: tuple, offset: int | None, nbytes: int | None) -> tuple:
        if offset is None or nbytes is None:
            return tuple((root, None, None) for root, _, _ in storage)
        storages = self.storages
        return tuple(
            (root, offset, offset + nbytes) if start is None and root in storages else (root, None, None)
            for root, start, _ in storage
        )

    def _viewed(self, base: tuple, call: relax.Call) -> tuple:
        offset = _view_offset(_ir.elements(call.args))
        nbytes = _ir.static_nbytes(ty(call))
        return tuple(
            (root, start + offset, start + offset + nbytes)
            if start is not None and offset is not None and nbytes is not None
            else (root, None, None)
            for root, start, _ in base
        )


def _nbytes(shape: object, dtype: object) -> int | None:
    """Bytes of ``alloc_tensor``'s static shape and dtype arguments, else None."""
    dtype = getattr(dtype, "value", None)  # R.dtype(...) holds a tvm_ffi.dtype
    if type(shape) is not relax.ShapeExpr or not isinstance(dtype, tvm_ffi.dtype):
        return None
    count = 1
    for dim in _ir.elements(shape.values):
        value = imm_value(dim)
        if value is None:
            return None
        count *= value
    return _ir.data_size(count, str(dtype))


def _may_hold_memory(ty: object) -> bool:
    if isinstance(ty, (ShapeType, PrimType)):
        return False
    if isinstance(ty, TupleType):
        return any(_may_hold_memory(field) for field in ty.fields)
    return True


_arg = _ir.array_item


def _arg_vars(args: Iterable) -> list:
    """The relax vars ``args`` use (shapes, immediates and names hold none)."""
    found = []
    for arg in args:
        if type(arg) in _VARS:
            found.append(arg)
        elif type(arg) in _NESTED:
            found.extend(relax.analysis.free_vars(arg))
    return found


def _read_dma(args: list) -> tuple[str, _DMA] | None:
    """A ``call_builtin_with_ctx`` of a DMA builtin read: ("copy" | "wait" | "bad", args)."""
    func = args[0]
    if not isinstance(func, relax.ExternFunc) or str(func.global_symbol) not in (DMA_COPY, DMA_WAIT):
        return None
    fields = _ir.elements(args[1].fields) if isinstance(args[1], relax.Tuple) else []
    if str(func.global_symbol) == DMA_COPY:
        if len(fields) != 4:
            return "bad", None
        return "copy", _DMA(imm_value(fields[2]), imm_value(fields[3]), fields[0], fields[1])
    if len(fields) == 5:
        return "wait", _DMA(imm_value(fields[0]), imm_value(fields[2]), fields[3], fields[4], imm_value(fields[1]), fields)
    if len(fields) == 2:  # legacy: no src, dst
        return "wait", _DMA(imm_value(fields[0]), None, None, None, imm_value(fields[1]), fields)
    return "bad", None


def _callee(module: tvm.IRModule, name: str) -> tvm.ir.BaseFunc | None:
    """The module's function ``name``, None if it has none."""
    try:
        return module[name]
    except Exception:  # noqa: BLE001 - TVM's error for a name the module lacks
        return None


def _function_issues_dma(module: tvm.IRModule | None, gvar: relax.GlobalVar, seen: set[str]) -> bool:
    """Whether calling ``gvar`` may run a ``dma_copy``, through the functions it calls too.

    ``seen``: the functions on the path here, whose answer their own bindings give.
    Without the module (a function scheduled alone), a callee may.
    """
    if module is None:
        return True
    name = gvar.name_hint
    if name in seen:
        return False
    func = _callee(module, name)
    if func is None:
        return True
    if not isinstance(func, relax.Function):
        return False  # a PrimFunc or an external function
    seen.add(name)
    for binding in _ir.all_bindings(func):
        value = binding.value
        if not isinstance(value, relax.Call):
            continue
        op = value.op
        if isinstance(op, tvm.ir.Op) and op.name == "relax.call_builtin_with_ctx":
            dma = _read_dma(_ir.elements(value.args))
            if dma is not None and dma[0] == "copy":
                return True
        elif isinstance(op, relax.GlobalVar):
            if _function_issues_dma(module, op, seen):
                return True
        elif type(op) in _VARS or (isinstance(op, tvm.ir.Op) and op.name in _CLOSURE_CALLS):
            return True  # a closure: what it runs is not known here
    return False


# ---------------------------------------------------------------------------------------------
# Scheduling one block
# ---------------------------------------------------------------------------------------------


class _Unit:
    """One transfer: its views, copies and wait; ``fixed`` when it must stay as it is."""

    __slots__ = ("seq", "queue", "allocs", "views", "copies", "wait", "fixed", "src", "dst", "src_fact",
                 "dst_fact", "deps", "index", "rank", "buckets")

    def __init__(self, seq, wait, views, copies, fixed, reader_facts):
        self.seq, self.wait, self.views, self.copies, self.fixed = seq, wait, views, copies, fixed
        self.index = wait.index
        self.queue = wait.dma.queue
        self.src, self.dst = wait.dma.src, wait.dma.dst
        if self.src is not None:
            self.src_fact, self.dst_fact = reader_facts(self.src), reader_facts(self.dst)
            self.deps = [e for e in (self.src, self.dst) if type(e) in _VARS]
        else:  # legacy: what its copies move
            self.src_fact = tuple({r for c in copies for r in reader_facts(c.dma.src)})
            self.dst_fact = tuple({r for c in copies for r in reader_facts(c.dma.dst)})
            self.deps = [v for r in views + copies for v in r.uses]
        # A view of the transfer (say, of a copy_tensor of a view) moves with it: what
        # defines the view's input must come first too.
        if views:
            self.deps += [v for r in views for v in r.uses]
        self.rank = 0
        self.buckets: list = []
        self.allocs: list[_Rec] = []

    def take_allocation(self, events: list) -> None:
        """Let the ``alloc_tensor`` of the transfer's dst move up with it, when it is the event
        just before, and the ``alloc_storage`` it places it in, when that is just before it (a
        storage's first use, as ``stage_in_vtcm`` emits it).  An allocation touches no memory,
        so the transfer may start as soon as what they use is defined; what the dst's memory
        held before still orders the copies."""
        if self.fixed or not events:
            return
        tensor = events[-1]
        if type(tensor) is not _Rec or tensor.kind != "alloc":
            return
        moved = {tensor.var.__chandle__()}
        if not (
            (type(self.dst) in _VARS and self.dst.__chandle__() in moved)
            or any(_h(view.dma.src) in moved for view in self.views)
        ):
            return
        self.allocs = [tensor]
        uses = list(tensor.uses)
        storage = events[-2] if len(events) > 1 else None
        if type(storage) is _Rec and storage.kind == "storage":
            handle = storage.var.__chandle__()
            if any(v.__chandle__() == handle for v in uses):
                self.allocs.insert(0, storage)
                moved.add(handle)
                uses += storage.uses
        self.deps = [v for v in self.deps + uses if v.__chandle__() not in moved]


def _same(a: object, b: object) -> bool:
    return a is b or (a is not None and b is not None and a.__chandle__() == b.__chandle__())


def _group(recs: list[_Rec], last_use: dict, leaf) -> list | None:
    """The block as events: compute records and transfers; None unless every DMA builtin
    belongs to a transfer of the recognized form."""
    events: list = []
    run: list[_Rec] = []  # views and copies since the last other binding
    seq = itertools.count()
    for rec in recs:
        if rec.kind in ("view", "copy"):
            run.append(rec)
            continue
        if rec.kind == "wait":
            dma = rec.dma
            if dma.queue is None or dma.inflight != 0:
                return None
            if len(run) == 1 and run[0].kind == "copy":  # the common case, quickly
                copy = run[0].dma
                if copy.queue == dma.queue and copy.bypass == dma.bypass and copy.src is dma.src and copy.dst is dma.dst:
                    fixed = rec.var.__chandle__() in last_use
                    unit = _Unit(next(seq), rec, [], run, fixed, leaf)
                    unit.take_allocation(events)
                    events.append(unit)
                    run = []
                    continue
            copies: list[_Rec] = []
            while run and run[-1].kind == "copy" and run[-1].dma.queue == dma.queue:
                copies.insert(0, run.pop())
            if not copies:
                return None
            views: list[_Rec] = []
            parts = [p for c in copies for p in (c.dma.src, c.dma.dst)]
            while run and run[-1].kind == "view" and any(_same(run[-1].var, p) for p in parts):
                views.insert(0, run.pop())
            if dma.src is not None:
                bases = {_h(view.var): view.dma.src for view in views}
                for c in copies:
                    if c.dma.bypass != dma.bypass:
                        return None
                    for part, whole in ((c.dma.src, dma.src), (c.dma.dst, dma.dst)):
                        if not (_same(part, whole) or _same(bases.get(_h(part)), whole)):
                            return None
            if any(r.kind == "copy" for r in run):
                return None
            events.extend(run)
            run = []
            fixed = dma.src is None or _h(rec.var) in last_use
            unit = _Unit(next(seq), rec, views, copies, fixed, leaf)
            unit.take_allocation(events)
            events.append(unit)
            continue
        if rec.kind == "bad":
            return None
        if run:
            if any(r.kind == "copy" for r in run):
                return None
            events.extend(run)
            run = []
        events.append(rec)
    if any(r.kind == "copy" for r in run):
        return None
    events.extend(run)
    return events


def _plan_block(recs: list[_Rec], last_use: dict, leaf, params: set[int]) -> list | None:
    """The block's bindings rescheduled; None when it is left alone or nothing moves."""
    events = _group(recs, last_use, leaf)
    if events is None:
        return None
    out: list = []  # compute bindings, waits (a _Unit) and fixed transfers (a tuple)
    after: dict[int, list[_Unit]] = defaultdict(list)  # transfers starting after out[slot]
    defined: dict = {}  # var -> slot
    read, written = _Ranges(), _Ranges()  # region -> last slot touching it
    src_busy, dst_busy = _Ranges(), _Ranges()  # region -> {seq: transfer in flight}
    pending: dict[int, deque[_Unit]] = defaultdict(deque)
    floor: dict[int, int] = {}  # queue -> the slot its next transfer starts after, at the earliest
    # The descriptor ring: dma_copy s not yet waited for stay at most RING_DESCRIPTORS over all
    # queues at every point.  A transfer started at slot s is in flight beside, at most, every
    # open one and every one completed after s: `completion_slots` (where each run of waits
    # stands) with `completed_copies` (the dma_copy s completed by then) bound it for any s.
    open_copies = 0
    completion_slots: list[int] = []
    completed_copies: list[int] = []
    barrier = -1  # the last binding that may issue dma_copy s of its own: nothing starts before
    last_cast = -1  # the last match_cast, which may define a symbolic var an allocation uses

    def alive(expr: object, last: _Unit, index: float) -> bool:
        if type(expr) not in _VARS or _same(expr, last.src) or _same(expr, last.dst):
            return True
        return _h(expr) in params or last_use.get(_h(expr), -1) >= index

    def complete(units: Iterable[_Unit], index: float) -> None:
        """Wait, before ``out``'s end, for ``units`` and every older transfer of their queues."""
        nonlocal open_copies
        newest: dict[int, _Unit] = {}
        for unit in units:
            if unit.queue not in newest or unit.seq > newest[unit.queue].seq:
                newest[unit.queue] = unit
        for target in sorted(newest.values(), key=lambda u: u.seq):
            fifo = pending[target.queue]
            run = []
            while not run or run[-1] is not target:
                run.append(fifo.popleft())
            kept = {}
            for unit in run:
                # Only the last wait of the run is needed to synchronize.  An earlier one stays
                # for its buffers, or when it cleans dst's cache (bypass_cache: the real wait
                # flushes its own dst only).
                if (
                    unit is target
                    or unit.wait.dma.bypass != 0
                    or not (alive(unit.src, target, index) and alive(unit.dst, target, index))
                ):
                    out.append(unit)
                    kept[unit.seq] = len(out) - 1
            if index == _INF:
                continue  # the end of the block: nothing after it conflicts or depends
            done = sum(len(unit.copies) for unit in run)
            open_copies -= done
            completed(len(out) - 1, done)  # (a kept wait of the run may be earlier)
            for unit in run:  # a merged transfer completes at the last wait of the run
                for bucket in unit.buckets:
                    del bucket[unit.seq]
                slot = kept.get(unit.seq, len(out) - 1)
                read.put(unit.src_fact, slot)
                written.put(unit.dst_fact, slot)

    def completed(slot: int, copies: int) -> None:
        """Note that ``copies`` dma_copy s are no longer in flight after ``slot``."""
        completion_slots.append(slot)
        completed_copies.append((completed_copies[-1] if completed_copies else 0) + copies)

    def make_room(copies: int) -> None:
        """Complete the oldest transfers until ``copies`` more fit in the ring."""
        while open_copies and open_copies + copies > RING_DESCRIPTORS:
            oldest = min((fifo[0] for fifo in pending.values() if fifo), key=lambda u: u.seq)
            complete([oldest], oldest.index)

    def ring_floor(start: int, copies: int) -> int:
        """The earliest slot from ``start`` on after which ``copies`` more fit in the ring."""
        done = completed_copies[-1] if completed_copies else 0
        room = RING_DESCRIPTORS - open_copies - copies  # >= 0 after make_room, but for
        if room < 0:  # a transfer of more chunks than the ring has: it starts after every other
            return max(start, completion_slots[-1]) if completion_slots else start
        if done <= room:
            return start  # even counting every completed transfer as in flight
        i = bisect.bisect_right(completion_slots, start) - 1
        if done - (completed_copies[i] if i >= 0 else 0) <= room:
            return start
        # The first run of waits after which few enough completed transfers remain.
        j = bisect.bisect_left(completed_copies, done - room)
        return max(start, completion_slots[j])

    def conflicts(reads: tuple, writes: tuple) -> list[_Unit]:
        hits: dict = {}
        for bucket in dst_busy.find(reads + writes):
            hits.update(bucket)
        for bucket in src_busy.find(writes):
            hits.update(bucket)
        return list(hits.values())

    for event in events:
        if type(event) is _Rec:
            if event.kind == "issues dma":
                # Its own dma_copy s share the ring with whatever is in flight here.
                if open_copies:
                    complete([fifo[-1] for fifo in pending.values() if fifo], event.index)
                barrier = len(out)
            elif type(event.binding) is relax.MatchCast:
                last_cast = len(out)
            slot = len(out)
            if event.reads:  # (an allocation touches nothing: the common case is quick)
                busy = conflicts(event.reads, event.writes)
                if busy:
                    complete(busy, event.index)
                    slot = len(out)
                read.put(event.reads, slot)
                written.put(event.writes, slot)
            out.append(event.binding if event.new is None else event.new)
            if event.var is not None:
                defined[event.var.__chandle__()] = slot
            continue
        unit = event
        busy = conflicts(unit.src_fact, unit.dst_fact)
        if unit.fixed:  # its wait completes everything before it on its queue
            busy += list(pending[unit.queue])
        if busy:
            complete(busy, unit.index)
        make_room(len(unit.copies))
        if unit.fixed:
            out.append((unit,))
            slot = len(out) - 1
            # In flight here, beside whatever a later transfer starting earlier is.
            completed(slot, len(unit.copies))
            for view in unit.views:
                defined[_h(view.var)] = slot
            read.put(unit.src_fact, slot)
            written.put(unit.dst_fact, slot)
            floor[unit.queue] = slot
            continue
        # Start right after the last binding the transfer depends on.
        start = max(floor.get(unit.queue, -1), barrier)
        for var in unit.deps:
            slot = defined.get(var.__chandle__(), -1)
            if slot > start:
                start = slot
        for slot in written.find(unit.src_fact + unit.dst_fact) + read.find(unit.dst_fact):
            if slot > start:
                start = slot
        if last_cast > start and any(
            len(relax.analysis.free_symbolic_vars(alloc.binding.value)) for alloc in unit.allocs
        ):
            start = last_cast
        start = ring_floor(start, len(unit.copies))
        open_copies += len(unit.copies)
        if unit.allocs:
            # An allocation the transfer starts before is emitted with it; the rest stay.
            moving = []
            for alloc in unit.allocs:
                alloc_slot = defined[_h(alloc.var)]
                if start < alloc_slot:
                    out[alloc_slot] = None
                    defined[_h(alloc.var)] = start
                    moving.append(alloc)
            unit.allocs = moving
        after[start].append(unit)
        floor[unit.queue] = start
        for view in unit.views:
            defined[_h(view.var)] = start
        pending[unit.queue].append(unit)
        for ranges, fact in ((src_busy, unit.src_fact), (dst_busy, unit.dst_fact)):
            for region in fact:
                bucket = ranges.get(region, dict)
                bucket[unit.seq] = unit
                unit.buckets.append(bucket)
    complete([fifo[-1] for fifo in pending.values() if fifo], _INF)
    return _emit(out, after, recs)


def _emit(out: list, after: dict, recs: list[_Rec]) -> list | None:
    """The bindings in their new order, each wait with its exact ``inflight_dma``."""
    issued: dict[int, int] = defaultdict(int)  # dma_copy bindings so far, per queue
    result: list = []

    def start(units: list[_Unit]) -> None:
        for unit in units:
            if unit.allocs:
                result.extend(r.binding for r in unit.allocs)
            if unit.views:
                result.extend(r.binding for r in unit.views)
            result.extend(r.binding for r in unit.copies)
            issued[unit.queue] += len(unit.copies)
            unit.rank = issued[unit.queue]

    if -1 in after:
        start(after[-1])
    for slot, entry in enumerate(out):
        if isinstance(entry, _Unit):
            result.append(_wait_binding(entry.wait, issued[entry.queue] - entry.rank))
        elif isinstance(entry, tuple):  # a fixed transfer, as it was
            unit = entry[0]
            result.extend(r.binding for r in unit.views + unit.copies)
            result.append(_wait_binding(unit.wait, 0))
            issued[unit.queue] += len(unit.copies)
        elif entry is not None:  # (None: an allocation that moved up with its transfer)
            result.append(entry)
        if slot in after:
            start(after[slot])
    if len(result) == len(recs) and all(new is rec.binding for new, rec in zip(result, recs)):
        return None
    return result


def _wait_binding(wait: _Rec, inflight: int) -> relax.VarBinding:
    """The wait binding with ``inflight_dma``: the one read, when the count is its own, else
    rebuilt keeping its var (and its immediates' dtype when read from IR); made with a new var
    when copy_to_dma left it to this pass."""
    if wait.binding is not None and inflight == wait.dma.inflight:
        return wait.binding
    dma = wait.dma
    if dma.fields is None:  # emitted by copy_to_dma: int64 immediates, void
        fields = [_imm(dma.queue), _imm(inflight), _imm(dma.bypass), dma.src, dma.dst]
        if _MAKE_CALL is not None and _MAKE_TUPLE is not None:
            call = _MAKE_CALL(_VOID, _CALL_BUILTIN, [_extern(DMA_WAIT), _MAKE_TUPLE(fields, None)], None, [_VOID], None)
        else:
            call = relax.Call(_CALL_BUILTIN, [_extern(DMA_WAIT), relax.Tuple(fields)], None, [_VOID])
            set_type(call, _VOID)
    else:
        old = wait.binding.value
        fields = list(dma.fields)
        fields[1] = imm(inflight, str(ty(fields[1]).dtype))
        call = relax.Call(old.op, [old.args[0], relax.Tuple(fields)], old.attrs, ty_args(old), old.span)
        set_type(call, ty(old) if ty(old) is not None else _VOID)
    var = _MAKE_VAR("gv", _VOID, None) if wait.binding is None else wait.binding.var
    return _ir.make_binding(var, call, None)


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------


def _schedule(
    target: relax.Function | tvm.IRModule, known: dict, check: bool = True
) -> relax.Function | tvm.IRModule:
    """:func:`sink_dma_waits`; ``known`` maps (the addresses of) DMA calls copy_to_dma emitted
    to what they hold; a transfer's last ``dma_copy`` also holds the wait this pass makes for
    it (copy_to_dma with ``overlap=True`` emits none).  ``check=False`` skips the final ``well_formed``, for copy_to_dma, whose
    input was checked: the schedule only reorders a block's bindings, each after what it
    uses, and changes immediates (the tests check every output)."""
    if isinstance(target, relax.Function):
        with cyclic_gc_paused():
            result = _Reader(known).function(target, top=True)
        if check and result is not target:
            relax.analysis.well_formed(result)
        return result
    if isinstance(target, tvm.IRModule):
        functions = dict(target.functions_items())
        changed = False
        for gvar, func in target.functions_items():
            if isinstance(func, relax.Function):
                with cyclic_gc_paused():
                    new_func = _Reader(known, target).function(func, top=True)
                changed = changed or new_func is not func
                functions[gvar] = new_func
        if not changed:
            return target
        result_mod = tvm.IRModule(functions, attrs=target.attrs, global_infos=target.global_infos)
        if check:
            relax.analysis.well_formed(result_mod)
        return result_mod
    raise TypeError(f"target must be a relax.Function or an IRModule, got {type(target).__name__}")


def sink_dma_waits(target: relax.Function | tvm.IRModule) -> relax.Function | tvm.IRModule:
    """Start each DMA transfer as early, and wait for it as late, as is safe.

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A function, or a module whose Relax functions are all processed,
        holding the DMA builtins as :func:`~rewrite_ext.hexagon.copy_to_dma`
        emits them: each transfer's ``dma_copy`` s (one per chunk) right
        before its ``dma_wait`` with ``inflight_dma=0``, on one queue or
        several.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The same kind of object: a new function or module, or the input
        itself when nothing moves.  The input is never modified; the result
        passes ``relax.analysis.well_formed``.

    Raises
    ------
    TypeError
        When ``target`` is neither a Relax function nor an IRModule.

    Notes
    -----
    The rules are those of the module docstring: in each block, a transfer's
    ``dma_copy`` s move up to just after the last binding they depend on, its
    wait moves down to just before the first binding that conflicts with it,
    waits of one queue stay in issue order with the exact ``inflight_dma``,
    and a wait that a later wait of its queue covers is dropped where its
    buffers stay alive anyway.  One forward pass: linear in the bindings.

    Pass the IRModule rather than one of its functions when the function calls
    kernels: alone, a GlobalVar's callee may be a Relax function issuing DMA
    of its own (which shares the descriptor ring), so each such call waits
    for every transfer in flight.

    Examples
    --------
    .. code-block:: python

        a = R.vm.alloc_tensor(storage, 0, R.shape([16]), R.dtype("float32"))
        c = R.add(x, y)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, 1), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, x, a), ty_args=(R.Tuple,))
        d = R.multiply(c, c)
        e = R.add(a, d)

    becomes::

        a = R.vm.alloc_tensor(storage, 0, R.shape([16]), R.dtype("float32"))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, 1), ty_args=(R.Tuple,))
        c = R.add(x, y)
        d = R.multiply(c, c)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, x, a), ty_args=(R.Tuple,))
        e = R.add(a, d)
    """
    return _schedule(target, {})


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferOverlap:
    """How much one ``dma_copy`` overlaps, as read from IR, and what bounds it.

    Attributes
    ----------
    function : str
        The function holding the transfer (a local function reports its
        top-level function's name).
    queue : Optional[int]
        The DMA queue, None when not a constant.
    src, dst : str
        The copy's source and destination (var names).
    overlapped : Optional[int]
        Bindings other than DMA builtins (allocations included) between the ``dma_copy`` and
        the wait that completes it; None when no wait of its block does.
    inflight : Optional[int]
        That wait's ``inflight_dma``.
    legacy : bool
        Whether that wait is the legacy two-argument form.
    merged : bool
        Whether that wait is another transfer's (it completes this one too).
    starts_after : str
        What the copy comes right after: the binding it depends on, the wait
        of a transfer it conflicts with, its queue's previous transfer, or
        the start of its block.
    stopped_by : str
        What comes right after the wait: a binding that conflicts with the
        transfer, one that needs a later transfer of the queue, or the end of
        the block.
    kernels : Optional[int]
        How many of the ``overlapped`` bindings call a kernel: a PrimFunc or
        Relax function by its GlobalVar, an extern (packed) function, or
        ``call_tir``/``call_dps_packed``.  None as for ``overlapped``.
    """

    function: str
    queue: int | None
    src: str
    dst: str
    overlapped: int | None
    inflight: int | None
    legacy: bool = False
    merged: bool = False
    starts_after: str = ""
    stopped_by: str = ""
    kernels: int | None = None


def _name(expr: object) -> str:
    return _ir.shown_name(expr) if isinstance(expr, relax.Var) else "?" if expr is None else str(expr)


_KERNEL_OPS = frozenset({"relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed", "relax.call_packed"})


def _is_kernel(rec: _Rec) -> bool:
    """Whether ``rec`` calls a kernel: a function, ``call_tir`` or a packed call, given a tensor.

    (A call given no tensor, such as a trace ``R.call_packed("trace", "name")``, computes nothing
    a transfer could overlap.)
    """
    if rec.kind in ("copy", "wait") or rec.binding is None:
        return False
    value = rec.binding.value
    if not isinstance(value, relax.Call):
        return False
    op = value.op
    if not (isinstance(op, (relax.GlobalVar, relax.ExternFunc)) or (isinstance(op, tvm.ir.Op) and op.name in _KERNEL_OPS)):
        return False
    return any(_holds_tensor(ty(arg)) for arg in value.args)


def _holds_tensor(arg_ty: object) -> bool:
    if isinstance(arg_ty, TupleType):
        return any(_holds_tensor(field) for field in arg_ty.fields)
    return isinstance(arg_ty, TensorType)


def _what(rec: _Rec) -> str:
    value = rec.binding.value
    if isinstance(value, relax.Var):  # an alias, as TVM's lowering binds outputs
        return f"`{_name(rec.var)} = {_name(value)}`"
    if rec.kind == "wait":
        return f"the wait for {_name(rec.dma.src)} -> {_name(rec.dma.dst)}" if rec.dma.src is not None else "a legacy wait"
    if rec.kind == "copy":
        return f"the copy {_name(rec.dma.src)} -> {_name(rec.dma.dst)}"
    op = type(value).__name__
    if isinstance(value, relax.Call):
        callee = value.op
        op = (
            _ir.shown_op(callee)
            if isinstance(callee, tvm.ir.Op)
            else getattr(callee, "name_hint", None) or getattr(callee, "global_symbol", None) or _name(callee)
        )
    if rec.var is None:
        return f"`{op}`"
    if isinstance(value, relax.Call) and _ir.is_void(ty(rec.var)):
        return f"`{op}(...)`"  # TVMScript prints a void call as a bare statement, with no `_ =`
    return f"`{_name(rec.var)} = {op}`"


def _why(rec: _Rec, src: tuple, dst: tuple, defines: tuple, leaf) -> str | None:
    """How ``rec`` conflicts with a transfer of ``src -> dst``, None when it does not.

    Another transfer's copy or wait counts as that transfer: it reads its
    src and writes its dst.
    """
    if rec.var is not None and any(_same(rec.var, d) for d in defines):
        return "defines " + ("src" if _same(rec.var, defines[0]) else "dst")
    if rec.kind == "issues dma":
        return "may issue dma_copy s of its own, which share the descriptor ring"
    read_regions, written_regions = rec.reads, rec.writes
    if rec.kind in ("copy", "wait"):
        if rec.dma.src is None:
            return None  # a legacy wait names no buffers
        read_regions, written_regions = leaf(rec.dma.src), leaf(rec.dma.dst)
    if _may_alias(written_regions, src):
        return "writes src"
    reads_dst = _may_alias(read_regions, dst)
    if _may_alias(written_regions, dst):
        # A packed call is taken to write every argument it may read.
        return "reads or writes dst" if reads_dst else "writes dst"
    return "reads dst" if reads_dst else None


def _block_report(function: str, recs: list[_Rec], leaf) -> list[TransferOverlap]:
    compute = list(itertools.accumulate((r.kind not in ("copy", "wait") for r in recs), initial=0))
    kernels = list(itertools.accumulate((_is_kernel(r) for r in recs), initial=0))
    pending: dict = defaultdict(deque)
    covered: dict[int, tuple[int, _Rec]] = {}  # copy position -> (wait position, wait)
    copies = []
    for position, rec in enumerate(recs):
        if rec.kind == "copy":
            copies.append(position)
            pending[rec.dma.queue].append(position)
        elif rec.kind == "wait" and rec.dma.inflight is not None:
            fifo = pending[rec.dma.queue]
            while len(fifo) > rec.dma.inflight:
                covered[fifo.popleft()] = (position, rec)
    views = {_h(r.var): r.dma.src for r in recs if r.kind == "view"}
    report = []
    for position in copies:
        copy = recs[position].dma
        src, dst = views.get(_h(copy.src), copy.src), views.get(_h(copy.dst), copy.dst)
        src_fact, dst_fact = leaf(src), leaf(dst)
        before = position - 1
        # Copies starting together, with the views and allocations of their dsts, which move
        # with them: what is before those counts.
        storage: list = []  # what this transfer's dst allocation uses
        dsts = [dst]
        while before >= 0:
            rec = recs[before]
            if rec.kind == "alloc" and any(_same(rec.var, d) for d in dsts):
                if not storage and _same(rec.var, dst):
                    storage = list(rec.uses)
            elif rec.kind == "copy":
                dsts.append(views.get(_h(rec.dma.dst), rec.dma.dst))
            elif rec.kind != "view":
                break
            before -= 1
        starts = "the start of its block"
        if before >= 0:
            prev = recs[before]
            why = _why(prev, src_fact, dst_fact, (src, dst), leaf)
            if why is None and any(_same(prev.var, v) for v in storage):
                why = "defines dst's storage"
            starts = _what(prev) + (f" ({why})" if why else "")
        wait_position, wait = covered.get(position, (None, None))
        stopped = "no wait in its block completes it"
        if wait is not None:
            after = wait_position + 1
            while after < len(recs) and recs[after].kind == "wait":
                after += 1
            later = any(r.dma.queue == copy.queue for r in recs[wait_position + 1 : after])
            if after == len(recs):
                stopped = "the end of its block"
            else:
                why = _why(recs[after], src_fact, dst_fact, (), leaf)
                if why is None and later:
                    why = f"waits with a later transfer of queue {copy.queue}"
                stopped = _what(recs[after]) + (f" ({why})" if why else "")
        report.append(
            TransferOverlap(
                function=function,
                queue=copy.queue,
                src=_name(copy.src),
                dst=_name(copy.dst),
                overlapped=None if wait is None else compute[wait_position] - compute[position + 1],
                kernels=None if wait is None else kernels[wait_position] - kernels[position + 1],
                inflight=None if wait is None else wait.dma.inflight,
                legacy=wait is not None and wait.dma.src is None,
                merged=wait is not None and wait.dma.src is not None and not (_same(wait.dma.src, src) and _same(wait.dma.dst, dst)),
                starts_after=starts,
                stopped_by=stopped,
            )
        )
    return report


class _Recorder(_Reader):
    """A reader that keeps the records of every block instead of planning it."""

    def __init__(self, module: tvm.IRModule | None) -> None:
        super().__init__({}, module)
        self.blocks: list[list[_Rec]] = []

    def seq(self, seq: relax.Expr, outside: tuple) -> tuple[relax.Expr, tuple, tuple]:
        if isinstance(seq, relax.SeqExpr):
            for block in seq.blocks:
                recs = [self.read(binding, outside) for binding in _ir.bindings_of(block)]
                self.blocks.append(recs)
        return seq, self.leaf(seq), _NOTHING


def overlap_report(target: relax.Function | tvm.IRModule) -> list[TransferOverlap]:
    """One :class:`TransferOverlap` per ``dma_copy``, read from IR (scheduled or not).

    Parameters
    ----------
    target : Union[relax.Function, tvm.IRModule]
        A function or module holding the DMA builtins.

    Returns
    -------
    report : list[TransferOverlap]
        In program order, functions of a module by name.  A copy is completed
        by the first later wait of its block and queue that leaves fewer
        transfers in flight than were issued after it (FIFO), as the engine
        does.
    """
    module = target if isinstance(target, tvm.IRModule) else None
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
        recorder = _Recorder(module)
        recorder.function(func, top=True)
        for recs in recorder.blocks:
            report.extend(_block_report(name, recs, recorder.leaf))
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
        A header line (the ``dma_copy`` s, one per chunk of a split copy, how
        many overlap compute, the total) and one line per ``dma_copy``, e.g.::

            # DMA overlap: 2 dma_copy; 1 overlap other bindings, 3 bindings (not DMA builtins) in all; 0 overlap a kernel call
            #   main: x -> a on queue 0, 3 bindings overlapped, 0 kernel calls (wait inflight 1); starts after `storage = relax.vm.alloc_storage` (defines dst's storage); waited before `d = relax.add` (reads dst)

        Lines start with ``#`` so the text can follow printed TVMScript.
    """
    overlapping = sum(1 for t in report if t.overlapped)
    total = sum(t.overlapped or 0 for t in report)
    with_kernels = sum(1 for t in report if t.kernels)
    lines = [
        f"# DMA overlap: {len(report)} dma_copy; {overlapping} overlap other "
        f"bindings, {total} binding{'' if total == 1 else 's'} (not DMA builtins) in all; "
        f"{with_kernels} overlap a kernel call"
    ]
    for t in report:
        queue = "?" if t.queue is None else str(t.queue)
        where = f"#   {t.function}: {t.src} -> {t.dst} on queue {queue}, "
        if t.overlapped is None:
            lines.append(where + f"no wait in its block completes it; starts after {t.starts_after}")
            continue
        plural = "" if t.overlapped == 1 else "s"
        notes = ", legacy wait" if t.legacy else ", merged wait" if t.merged else ""
        lines.append(
            where + f"{t.overlapped} binding{plural} overlapped, {t.kernels} kernel call{'' if t.kernels == 1 else 's'} "
            f"(wait inflight {t.inflight}{notes}); "
            f"starts after {t.starts_after}; waited before {t.stopped_by}"
        )
    return "\n".join(lines)
