"""One spelling of TVM's Relax API for apache-tvm 0.25, 0.26 and 0.27.

TVM 0.26 renamed Relax's StructInfo to types: ``relax.TensorStructInfo``
became ``relax.TensorType``, ``expr.struct_info`` became ``expr.ty``, a call's
``sinfo_args`` became ``ty_args``, and so on (docs/tvm-versions.md has the
whole table).  Every version-dependent name rewrite_ext uses is defined here
once, from what the installed TVM has, so the rest of the code (and a user's
tests that must run on several TVMs) reads the same everywhere.

The names follow TVM 0.26+; on 0.25 they are TVM 0.25's StructInfo classes
and accessors.  Nothing in TVM is modified.

Examples
--------
>>> from rewrite_ext import compat
>>> x = relax.Var("x", compat.TensorType([4], "float32"))
>>> compat.ty(x)
R.Tensor((4,), dtype="float32")

In TVMScript, a void builtin call written once for every version::

    R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, 1, x, a), **compat.VOID_TY_ARGS)
"""

from __future__ import annotations

import operator

import tvm
import tvm_ffi
import tvm.relax.expr as _relax_expr
from tvm import relax
from tvm.relax.dpl import pattern as _pattern

__all__ = [
    "TYPES",
    "TY_ARGS",
    "OUT_TY",
    "VOID_TY_ARGS",
    "TensorType",
    "TupleType",
    "ShapeType",
    "ObjectType",
    "FuncType",
    "PrimType",
    "TypePattern",
    "INFER_TYPE_ATTR",
    "ty",
    "ty_args",
    "dtype_name",
    "var_name",
    "set_type",
    "has_ty",
    "with_type",
    "set_var_remap",
    "ret_ty",
    "imm",
    "imm_value",
    "data_ptr",
    "sblock_written_params",
    "Constant",
    "StringImm",
    "LITERALS",
    "void",
]

#: Whether the installed TVM has types (0.26 and later) rather than StructInfo (0.25).
TYPES: bool = hasattr(relax, "TensorStructInfo") is False

if TYPES:
    TensorType = relax.TensorType
    TupleType = relax.TupleType
    ShapeType = relax.ShapeType
    ObjectType = relax.AnyType  # R.Object; prints as R.Any
    FuncType = relax.FuncType
    PrimType = tvm.ir.PrimType  # R.Prim; there is no relax.PrimType
    TypePattern = _pattern.TypePattern
    INFER_TYPE_ATTR = "FInferType"
    TY_ARGS = "ty_args"
    OUT_TY = "out_ty"
    _TY = "ty"
    _TY_ARGS_ATTR = "ty_args"
    _update_type = _relax_expr._update_type
    _HAS_TY = "has_ty"
else:
    # TVM 0.25: relax.TensorType exists there too, but is the old DynTensorType.
    TensorType = relax.TensorStructInfo
    TupleType = relax.TupleStructInfo
    ShapeType = relax.ShapeStructInfo
    ObjectType = relax.ObjectStructInfo
    FuncType = relax.FuncStructInfo
    PrimType = relax.PrimStructInfo
    TypePattern = _pattern.StructInfoPattern
    INFER_TYPE_ATTR = "FInferStructInfo"
    TY_ARGS = "sinfo_args"
    OUT_TY = "out_sinfo"
    _TY = "struct_info"
    _TY_ARGS_ATTR = "sinfo_args"
    _update_type = _relax_expr._update_struct_info
    _HAS_TY = "has_struct_info"

_get_ty = operator.attrgetter(_TY)
_get_ty_args = operator.attrgetter(_TY_ARGS_ATTR)


def ty(expr: relax.Expr) -> relax.Type:
    """An expression's type: ``expr.ty`` (0.26+), ``expr.struct_info`` (0.25).

    Also a ``MatchCast`` binding's type, the type it casts to.
    """
    return _get_ty(expr)


def ty_args(call: relax.Call) -> list:
    """A call's type arguments: ``call.ty_args`` (0.26+), ``call.sinfo_args`` (0.25)."""
    return _get_ty_args(call)


def dtype_name(tensor_type: relax.Type) -> str:
    """A tensor type's dtype as a string (``"float32"``; ``""`` when unknown).

    ``TensorType.dtype`` is a ``PrimType`` in TVM 0.27 and a dtype elsewhere.
    """
    dtype = tensor_type.dtype
    return str(getattr(dtype, "dtype", dtype))

#: Keyword arguments that make a builtin call void (``R.Tuple()``), for
#: ``R.call_builtin_with_ctx``/``R.call_packed``/``relax.op.call_pure_packed``
#: in Python and in TVMScript: ``**VOID_TY_ARGS``.
VOID_TY_ARGS: dict = {TY_ARGS: [TupleType([])]}


def void() -> relax.Type:
    """The void type ``R.Tuple()``: what a call that returns nothing is typed."""
    return TupleType([])


def var_name(var: relax.Var) -> str:
    """A var's name: ``Var.name`` in TVM 0.27, ``Var.name_hint`` before."""
    name = getattr(var, "name_hint", None)
    return str(name if name is not None else var.name)


def set_type(expr: relax.Expr, type_: object) -> None:
    """Give a freshly built ``expr`` its type without normalizing it.

    TVM's Python API has this only as the private
    ``tvm.relax.expr._update_type`` (``_update_struct_info`` in 0.25).
    """
    _update_type(expr, type_)


def has_ty(pattern: _pattern.DFPattern, type_: object) -> _pattern.DFPattern:
    """``pattern.has_ty(type_)`` (0.26+), ``pattern.has_struct_info(type_)`` (0.25)."""
    return getattr(pattern, _HAS_TY)(type_)


def holding_the_gil(name: str) -> tvm_ffi.Function:
    """A handle of our own on the FFI function ``name`` that keeps the GIL while it runs.

    tvm_ffi releases the GIL around every call by default and takes it back
    after: locks, a condition variable and thread-local lookups that cost
    more than the calls made once per binding, which return at once and
    never wait.  The handle is ours, so TVM's own stays as it is.
    """
    func = tvm_ffi.get_global_func(name)
    try:
        func.release_gil = False
    except AttributeError:  # a tvm_ffi without the switch: calls as TVM's do
        pass
    return func


_WITH_TYPE_FUNC = holding_the_gil(
    "relax.PyExprMutatorWithType" if TYPES else "relax.PyExprMutatorWithStructInfo"
)


def with_type(mutator: relax.PyExprMutator, var: relax.Var, type_: object) -> relax.Var:
    """``mutator.with_type(var, type_)`` (0.26+), ``with_struct_info`` (0.25)."""
    return _WITH_TYPE_FUNC(mutator._outer(), var, type_)


def set_var_remap(mutator: relax.PyExprMutator, var: relax.Var, new_var: relax.Var) -> None:
    """Make ``mutator`` replace later uses of ``var`` by ``new_var``.

    ``set_var_remap`` takes the var in TVM 0.26+, its ``vid`` in 0.25.
    """
    mutator.set_var_remap(var if TYPES else var.vid, new_var)


def ret_ty(func: relax.Function) -> relax.Type:
    """A function's return type: ``func.ret_ty`` (0.26+), ``func.ret_struct_info`` (0.25)."""
    return func.ret_ty if TYPES else func.ret_struct_info


def imm(value: int | tvm.ir.PrimExpr, dtype: str = "int64") -> relax.Expr:
    """An integer (or any ``PrimExpr``, such as a symbolic var) as a Relax call argument.

    TVMScript parses ``0`` in a builtin's arguments as ``T.int64(0)`` (0.26+,
    printed ``0``) or ``R.prim_value(T.int64(0))`` (0.25); this builds the same.
    """
    if isinstance(value, int):
        value = tvm.tirx.IntImm(dtype, int(value))
    return value if TYPES else relax.PrimValue(value)


def imm_value(expr: object) -> int | None:
    """The integer of an immediate :func:`imm` builds (also a bare ``IntImm``), else None."""
    if not TYPES and isinstance(expr, relax.PrimValue):
        expr = expr.value
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def data_ptr(tensor: tvm.runtime.Tensor) -> int:
    """The address of a CPU tensor's data (``Tensor.data_ptr()`` from 0.26 on)."""
    if TYPES:
        return tensor.data_ptr()
    import numpy as np

    try:
        array = np.from_dlpack(tensor)
    except RuntimeError:  # a dtype numpy has not (int4): the address of its first byte
        array = np.from_dlpack(tensor._create_view((1,), "uint8"))
    return array.__array_interface__["data"][0]


def sblock_written_params(func: tvm.tirx.PrimFunc) -> set[int] | None:
    """The indices of ``func``'s parameters its root block may write.

    Opaque accesses count as writes, and so does a parameter the kernel reaches by pointer
    or through another buffer over its memory.  None when ``func``'s body is not one
    ``SBlockRealize`` (a scheduled or hand-written kernel): it may write any.
    ``SBlockRealize`` is in ``tvm.s_tir`` in 0.27, ``tvm.tirx`` before;
    ``get_sblock_read_write_region`` takes the parameters (0.26+) or the buffers
    by data var (0.25); a region names the parameter (0.27) or the buffer.
    """
    import tvm.s_tir
    from tvm.s_tir.analysis import get_sblock_read_write_region

    realize = getattr(tvm.s_tir, "SBlockRealize", None) or tvm.tirx.SBlockRealize
    if not isinstance(func.body, realize):
        return None
    params = list(func.params)
    buffer_map = func.buffer_map if hasattr(func, "buffer_map") else None  # 0.27 has none
    if TYPES:
        # Buffer parameters only: TVM rejects the map with a scalar one (`n: T.int64`).
        if buffer_map is None:
            access = {p: p for p in params if not isinstance(p.ty, tvm.ir.PrimType)}
        else:
            access = {p: p for p in params if p in buffer_map}
    else:
        access = {buffer.data: buffer for buffer in buffer_map.values()}
    _, writes = get_sblock_read_write_region(func.body.block, access)
    written = [region.source if hasattr(region, "source") else region.buffer for region in writes]

    def is_written(param: tvm.tirx.Var) -> bool:
        buffer = buffer_map.get(param) if buffer_map is not None else None
        return any(param.same_as(w) or (buffer is not None and buffer.same_as(w)) for w in written)

    return {i for i, p in enumerate(params) if is_written(p)} | _reached_by_pointer(func)


# TIR ops through which a kernel holds a parameter's memory by pointer: what it then does with
# it (a store through a decl_buffer alias, an extern memcpy) TVM's region analysis cannot see.
_POINTER_OPS = {"address_of", "buffer_data", "tvm_access_ptr", "tvm_stack_make_array"}


def _reached_by_pointer(func: tvm.tirx.PrimFunc) -> set[int]:
    """The indices of ``func``'s parameters whose memory the kernel takes a pointer to, or
    views through another buffer: it may write them.

    TVM 0.26+ names a parameter's buffer by the parameter itself and its data pointer
    ``buffer_data(A)``; 0.25 has a data var of the buffer, which appears bare where a pointer
    is taken and as the data of an alias buffer.
    """
    params = list(func.params)
    if TYPES:
        index = {p.__chandle__(): i for i, p in enumerate(params)}
        found: set[int] = set()

        def mark(node: object) -> None:
            i = index.get(node.__chandle__()) if hasattr(node, "__chandle__") else None
            if i is not None:
                found.add(i)

        def visit(node: object) -> None:
            if _takes_a_pointer(node):
                _walk_tir(node, mark)

        _walk_tir(func.body, visit)
        return found
    own = {func.buffer_map[p].data.__chandle__(): (i, func.buffer_map[p]) for i, p in enumerate(params) if p in func.buffer_map}
    found = set()

    def visit_025(node: object) -> None:
        if isinstance(node, tvm.tirx.Var) and node.__chandle__() in own:
            found.add(own[node.__chandle__()][0])  # the data pointer itself, as an argument
        buffer = getattr(node, "buffer", None)
        if isinstance(buffer, tvm.tirx.Buffer) and buffer.data.__chandle__() in own:
            i, mine = own[buffer.data.__chandle__()]
            if not buffer.same_as(mine):
                found.add(i)  # another buffer over its memory (a decl_buffer alias)
        if _takes_a_pointer(node):
            for arg in node.args:
                data = getattr(getattr(arg, "buffer", None), "data", None)
                if data is not None and data.__chandle__() in own:
                    found.add(own[data.__chandle__()][0])

    _walk_tir(func.body, visit_025)
    return found


def _takes_a_pointer(node: object) -> bool:
    """Whether ``node`` is a call of one of ``_POINTER_OPS`` (``tirx.`` or ``tir.`` prefixed)."""
    op = getattr(node, "op", None)
    return isinstance(op, tvm.ir.Op) and op.name.rsplit(".", 1)[-1] in _POINTER_OPS


def _walk_tir(root: object, visit) -> None:
    """Call ``visit`` on every node under ``root``: tvm-ffi's structural walk where it has one
    (0.27 has no other), else TIR's ``post_order_visit``."""
    walk = getattr(tvm_ffi, "structural_walk", None)
    if walk is not None:
        walk(root, ((object, visit),))
    else:
        tvm.tirx.stmt_functor.post_order_visit(root, visit)


#: A tensor constant's class: ``relax.Constant`` to 0.26, ``tvm.ir.expr.Constant`` in 0.27.
Constant = getattr(relax, "Constant", None) or tvm.ir.expr.Constant
#: A string literal (``R.str``): ``relax.StringImm`` to 0.26, ``tvm.ir.StringImm`` in 0.27.
StringImm = getattr(tvm.ir, "StringImm", None) or relax.StringImm
#: Every literal class (constants, ``R.prim_value``, ``R.str``, ``R.dtype``, shapes): 0.27
#: made them ``tvm.ir`` constants, before each had a relax class of its own.
LITERALS: tuple = tuple(
    t
    for t in (
        getattr(tvm.ir.expr, "Constant", None),
        getattr(tvm.ir.expr, "GenericConst", None),
        *(getattr(relax, n, None) for n in ("Constant", "PrimValue", "StringImm", "DataTypeImm")),
        relax.ShapeExpr,
    )
    if isinstance(t, type)
)
