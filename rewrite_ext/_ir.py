"""Small stateless helpers over Relax IR used by the traversal and the Hexagon rewrites."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor
from .compat import TensorType, TupleType, dtype_name, ty, ty_args
from .compat import holding_the_gil
from .compat import Constant, StringImm, set_type, var_name  # noqa: F401 (StringImm, set_type, var_name re-exported as _ir.*)


_NOT_IN_A_NAME = re.compile(r"[^0-9A-Za-z_]")


def shown_name(var: relax.Var) -> str:
    """A var's name as TVMScript prints it, for messages and reports.

    TVM's printer makes every character other than a letter, a digit or
    ``_`` an ``_``: the parameter ``nn.Module`` exports as ``fc1.weight``
    prints as ``fc1_weight``.  (It also numbers a name repeated in one
    function, ``lv_1``; that needs the whole function and is not done here.)
    """
    return spelled(var_name(var))


def spelled(name: str) -> str:
    """A var name as TVMScript prints it (see :func:`shown_name`)."""
    return _NOT_IN_A_NAME.sub("_", name)


def shown_op(op: tvm.ir.Op) -> str:
    """An operator as TVMScript spells it, for messages and reports: ``R.add``, ``R.vm.alloc_tensor``."""
    return f"R.{op.name.removeprefix('relax.')}"


def binding_label(binding: relax.Binding) -> str:
    """The binding's var name for messages; for a void binding, which TVMScript prints with no
    var (its var is named ``_``), with its callee: ``_ (relax.vm.copy_tensor)``."""
    name = shown_name(binding.var)
    if not is_void(ty(binding.var)):
        return name
    value = binding.value
    callee = ""
    if isinstance(value, relax.Call):
        op = value.op
        callee = getattr(op, "name", "") or getattr(op, "global_symbol", "") or getattr(op, "name_hint", "")
        args = elements(value.args)
        if args and isinstance(args[0], relax.ExternFunc):
            callee = f"{callee} {args[0].global_symbol}"
    return f"{name} ({callee})" if callee else name


def is_void(ty: object) -> bool:
    """Whether ``ty`` is the empty tuple type ``R.Tuple()``, the type of a void call."""
    return type(ty) is TupleType and len(ty.fields) == 0


# isinstance against TVM's classes goes through ABCMeta (~0.15 us a check); values are told
# apart by their exact class, each class looked up once.
_HOLDS_BLOCKS: dict[type, bool] = {}
_IS_EXPR: dict[type, bool] = {}


def holds_blocks(value: object) -> bool:
    """Whether ``value`` has binding blocks of its own (an If, a Function, a SeqExpr)."""
    cls = type(value)
    found = _HOLDS_BLOCKS.get(cls)
    if found is None:
        found = _HOLDS_BLOCKS[cls] = issubclass(cls, (relax.If, relax.Function, relax.SeqExpr))
    return found


def is_expr(value: object) -> bool:
    """Whether ``value`` is a ``relax.Expr``."""
    cls = type(value)
    found = _IS_EXPR.get(cls)
    if found is None:
        found = _IS_EXPR[cls] = issubclass(cls, relax.Expr)
    return found


def static_nbytes(ty: object) -> int | None:
    """The bytes of a tensor type of static shape and dtype (see :func:`data_size`), else None."""
    if not isinstance(ty, TensorType) or ty.dtype is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    count = 1
    for dim in ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        count *= int(dim)
    return data_size(count, dtype_name(ty))


@functools.lru_cache(maxsize=None)
def _element_bits(dtype: str) -> tuple[int, bool]:
    """(bits an element, stored one byte an element) of ``dtype``."""
    dt = tvm.DataType(dtype)
    bits = dt.bits * dt.lanes
    return bits, bits == 1 and dt.type_code == _UINT and _uint1_unpacked()


@functools.lru_cache(maxsize=None)
def _uint1_unpacked() -> bool:
    # tvm-ffi 0.1.12 (TVM 0.25's) stores uint1 a byte an element; later ones pack it.  Asked
    # of the runtime itself: a byte view of 8 uint1 elements fits only if they take 8 bytes.
    try:
        tvm.runtime.empty((8,), "uint1")._create_view((8,), "uint8")
    except Exception:  # noqa: BLE001 - the runtime's size check
        return False
    return True


_UINT = 1  # DLPack's kDLUInt


def data_size(count: int, dtype: str) -> int:
    """The bytes ``count`` elements of ``dtype`` take in a runtime tensor: tvm-ffi's
    ``GetDataSize``, where sub-byte types are packed (8 ``int4`` s in 4 bytes) and the total
    rounded up to a byte."""
    bits, unpacked = _element_bits(dtype)
    return count if unpacked else (count * bits + 7) // 8


def used_vars(expr: relax.Expr) -> set[relax.Var]:
    """The set of vars that ``expr`` reads anywhere (definitions do not count)."""
    return set(relax.analysis.used_vars(expr))


array_item = holding_the_gil("ffi.ArrayGetItem")
"""``array[i]`` of a TVM Array as ``array_item(array, i)``, without the Python wrapper's checks."""
emit_normalized = holding_the_gil("relax.BlockBuilderEmitNormalized")
"""``builder.emit_normalized(binding)`` as ``emit_normalized(builder, binding)``."""
extract_matched_expr = holding_the_gil("relax.dpl.extract_matched_expr")
"""``pattern.extract_matched_expr(expr, var2val)`` as ``extract_matched_expr(pattern, expr, var2val)``."""
normalize = holding_the_gil("relax.BlockBuilderNormalize")
"""``relax.BlockBuilder.normalize(builder, expr)`` as ``normalize(builder, expr)``."""
begin_dataflow_block = holding_the_gil("relax.BlockBuilderBeginDataflowBlock")
begin_binding_block = holding_the_gil("relax.BlockBuilderBeginBindingBlock")
end_block = holding_the_gil("relax.BlockBuilderEndBlock")
make_binding = holding_the_gil("relax.VarBinding")
"""``relax.VarBinding(var, value, span)`` without its Python ``__init__`` (0.3 of its 0.9 us)."""

_CHUNK = 512


def elements(array: Iterable) -> list:
    """The elements of a short TVM Array (call args, tuple fields) as a list, fast."""
    get = array_item
    return [get(array, i) for i in range(len(array))]


def bindings_of(block: relax.BindingBlock) -> Iterator[relax.Binding]:
    """The bindings of ``block``, fast.

    Iterating a TVM Array asks for its length and bounds-checks in Python at
    every element; converting a run of elements in one comprehension is
    about 3x faster.  Doing it in chunks rather than all at once keeps few
    wrappers alive at a time: a list of 100k of them would survive into the
    cyclic GC's oldest generation and be rescanned at every full collection.
    """
    bindings = block.bindings
    get = array_item
    size = len(bindings)
    for start in range(0, size, _CHUNK):
        yield from [get(bindings, i) for i in range(start, min(start + _CHUNK, size))]


def replace_bound(expr: relax.Expr, bound: dict[int, relax.Var]) -> relax.Expr:
    """``expr`` with each sub-expression that *is* a key of ``bound`` replaced by its var.

    ``bound`` maps ``hash(value)`` (the object's handle) to the var bound to
    that very value earlier in the block.  Only calls, tuples and tuple
    projections are looked into: normalized Relax keeps nested values there.
    """
    var = bound.get(hash(expr))
    if var is not None:
        return var
    cls = type(expr)
    if cls is relax.Call:
        args = elements(expr.args)
        new_args = [replace_bound(arg, bound) for arg in args]
        if any(not new.same_as(old) for new, old in zip(new_args, args)):
            return relax.Call(expr.op, new_args, expr.attrs, ty_args(expr), expr.span)
    elif cls is relax.Tuple:
        fields = elements(expr.fields)
        new_fields = [replace_bound(field, bound) for field in fields]
        if any(not new.same_as(old) for new, old in zip(new_fields, fields)):
            return relax.Tuple(new_fields, expr.span)
    elif cls is relax.TupleGetItem:
        inner = replace_bound(expr.tuple_value, bound)
        if not inner.same_as(expr.tuple_value):
            return relax.TupleGetItem(inner, expr.index, expr.span)
    return expr


def bindings_normalize_emitted(
    builder: relax.BlockBuilder, before: relax.Expr, after: relax.Expr
) -> list[relax.Binding]:
    """The bindings that normalizing ``before`` into ``after`` emitted (its nested parts).

    They are the vars ``after`` reads and ``before`` did not, and, through
    the builder's bindings, the new vars their values read; in the order
    they were emitted.
    """
    known = {hash(var) for var in relax.analysis.free_vars(before)}
    found: list[relax.Binding] = []

    def collect(expr: relax.Expr) -> None:
        for var in relax.analysis.free_vars(expr):
            if hash(var) in known:
                continue
            known.add(hash(var))
            value = builder.lookup_binding(var)
            if value is not None:
                collect(value)
                found.append(relax.VarBinding(var, value))

    collect(after)
    return found


_CONTAINS_IMPURE = relax.analysis.contains_impure_call
_LEAVES = (relax.Var, Constant)
_OP = tvm.ir.Op
# Pure by FPurity, yet they overwrite an argument (TVM's contract: one not used after them).
_IN_PLACE = frozenset({"relax.call_tir_inplace", "relax.call_inplace_packed"})
_OP_FLAGS: dict[int, tuple[bool, bool]] = {}  # hash(op) -> (FPurity, writes in place)


def _op_flags(op: tvm.ir.Op) -> tuple[bool, bool]:
    key = hash(op)
    flags = _OP_FLAGS.get(key)
    if flags is None:
        flags = _OP_FLAGS[key] = (bool(op.get_attr("FPurity")), op.name in _IN_PLACE)
    return flags


def is_impure(value: relax.Expr) -> bool:
    """Whether evaluating ``value`` may have a side effect (TVM's ``contains_impure_call``).

    A call of an op, the common case, is judged by the op's ``FPurity``,
    looked up once per op; anything else asks TVM.
    """
    if type(value) is relax.Call:
        op = value.op
        if type(op) is _OP and (_OP_FLAGS.get(hash(op)) or _op_flags(op))[0]:
            return False
    elif isinstance(value, _LEAVES):
        return False
    return bool(_CONTAINS_IMPURE(value))


def is_barrier(value: relax.Expr) -> bool:
    """Whether a match must not see through the bindings before ``value``: it may have a side
    effect, or write an argument in place, so that a value computed before it differs from
    the same expression after it."""
    if type(value) is relax.Call:
        op = value.op
        if type(op) is _OP and (_OP_FLAGS.get(hash(op)) or _op_flags(op))[1]:
            return True
    elif holds_blocks(value) and any(is_barrier(binding.value) for binding in all_bindings(value)):
        return True
    return is_impure(value)


def checks_purity(func: relax.Function) -> bool:
    """Whether ``func`` is pure and TVM checks it: ``is_pure`` without ``relax.force_pure``.

    TVM's lowering passes leave functions ``is_pure`` with the attribute
    ``relax.force_pure``; ``relax.analysis.well_formed`` accepts impure calls
    in such a function's plain blocks.
    """
    if not func.is_pure:
        return False
    attrs = func.attrs
    return not (attrs is not None and "relax.force_pure" in attrs and bool(attrs["relax.force_pure"]))


def function_name(func: relax.Function, default: str | None = "<anonymous function>") -> str | None:
    """The function's ``global_symbol``, or ``default`` when it has none."""
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return default


@visitor
class _BindingCollector(PyExprVisitor):
    def __init__(self) -> None:
        self.found: list[relax.Binding] = []

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.found.append(binding)
        super().visit_var_binding_(binding)

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        self.found.append(binding)
        super().visit_match_cast_(binding)


def all_bindings(expr: relax.Expr) -> list[relax.Binding]:
    """Every binding of ``expr`` at any depth: blocks, If branches, local functions."""
    collector = _BindingCollector()
    collector.visit_expr(expr)
    return collector.found


@mutator
class _BindingDropper(PyExprMutator):
    """Re-emits every binding except those whose var is in ``dead``."""

    def __init__(self, dead: set[relax.Var]) -> None:
        super().__init__()
        self.dead = dead

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.dead:
            super().visit_var_binding_(binding)


def drop_unused_bindings(func: relax.Function, candidates: Iterable[relax.Var]) -> relax.Function:
    """Remove the bindings of ``candidates`` that nothing reads any more.

    Dropping one binding can make another candidate unused (a chain of
    interior bindings), so this repeats until nothing more can go.  Only
    the candidates are considered: every other binding stays, used or not.
    """
    remaining = set(candidates)
    while remaining:
        dead = remaining - used_vars(func)
        if not dead:
            break
        func = _BindingDropper(dead).visit_expr(func)
        remaining -= dead
    return func
