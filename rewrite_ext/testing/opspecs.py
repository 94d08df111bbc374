"""The ops the strategies generate, one :class:`OpSpec` each, and how to add your own.

``relax_functions(ops=...)`` and ``relax_modules(ops=...)`` take a list whose
items are names of the built-in specs (:data:`OP_NAMES`) or :class:`OpSpec`
objects.  An ``OpSpec`` says which tensors the op may read and how to build the
call; the result type comes from TVM's own type inference, so a spec never
states it::

    from tvm import relax
    from rewrite_ext.testing.opspecs import OpSpec, is_float

    relu = OpSpec("relu", lambda x, choice: relax.op.nn.relu(x), accepts=is_float)
    strategy = relax_functions(ops=["matmul", "add", relu])

A generated step picks the op, then the first operand among the tensors
computed so far that ``accepts`` it, then each further operand among those
for which ``partner`` holds; when none does and the spec has ``weight``, a new
parameter of that type is added to the function (as the weights of a matmul or
a conv2d are).  ``make`` receives the operands (typed ``relax.Var``, so
``ty(x).shape`` and ``ty(x).dtype`` can be read) and ``choice``, a drawn integer
from 0 to 31 for the op's variants (an axis, a target dtype, a kernel size),
which shrinks towards 0.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import op as rop
from ..compat import TensorType, dtype_name, ty

__all__ = [
    "DEFAULT_OPS",
    "ELEMENTWISE_OPS",
    "OP_NAMES",
    "OpSpec",
    "broadcastable",
    "dims",
    "dtype",
    "is_float",
    "is_int",
    "is_numeric",
    "resolve_ops",
    "same_dim",
]

def dims(ty: TensorType) -> tuple:
    """The shape of a tensor type: ints where static, ``PrimExpr`` where symbolic."""
    values = []
    for d in ty.shape.values:
        values.append(int(d) if isinstance(d, tvm.tirx.IntImm) else d)
    return tuple(values)


def dtype(ty: TensorType) -> str:
    """The dtype of a tensor type, as a string."""
    return dtype_name(ty)


def is_float(ty: TensorType) -> bool:
    """Whether the tensor type has a float dtype."""
    return dtype(ty).startswith(("float", "bfloat"))


def is_int(ty: TensorType) -> bool:
    """Whether the tensor type has a (signed or unsigned) integer dtype."""
    return dtype(ty).startswith(("int", "uint"))


def is_numeric(ty: TensorType) -> bool:
    """Whether the tensor type has a float or integer dtype (not bool)."""
    return is_float(ty) or is_int(ty)


def same_dim(a, b) -> bool:
    """Whether two dims are the same: equal ints, or structurally equal expressions."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) or isinstance(b, int):
        return False
    return bool(tvm_ffi.structural_equal(a, b))


def broadcastable(*types: TensorType) -> bool:
    """Whether tensors of these types broadcast together (numpy rules, symbolic dims exact)."""
    shapes = [dims(t) for t in types]
    rank = max(len(s) for s in shapes)
    for i in range(1, rank + 1):
        present = [s[-i] for s in shapes if len(s) >= i]
        sized = [d for d in present if not (isinstance(d, int) and d == 1)]
        if any(not same_dim(sized[0], d) for d in sized[1:]):
            return False
    return True


@dataclass(frozen=True)
class OpSpec:
    """One op the strategies may generate.

    Parameters
    ----------
    name : str
        How ``ops=[...]`` names it and how reports print it.
    make : Callable
        ``make(*operands, choice)``: the call, over typed ``relax.Var`` operands;
        ``choice`` (0 to 31) selects a variant.  Its type is inferred by TVM; a
        call TVM rejects is a bug of the spec.
    operands : int
        How many tensor operands ``make`` takes.
    accepts : Callable
        ``accepts(ty)``: whether a tensor of type ``ty`` may be the first operand.
    partner : Callable, optional
        ``partner(chosen, ty, choice)``: whether a tensor of type ``ty`` may be the
        next operand after the types ``chosen`` so far.  The default: numeric,
        the first operand's dtype, and broadcastable with every chosen operand.
    weight : Callable, optional
        ``weight(chosen, choice)``: the ``TensorType`` of a new function
        parameter to use as the next operand when no computed tensor fits
        ``partner``; ``None`` (the default): the op is then not generated there.
    """

    name: str
    make: Callable[..., relax.Expr]
    operands: int = 1
    accepts: Callable[[TensorType], bool] = is_numeric
    partner: Callable[[Sequence[TensorType], TensorType, int], bool] | None = None
    weight: Callable[[Sequence[TensorType], int], TensorType] | None = None

    def fits(self, chosen: Sequence[TensorType], ty: TensorType, choice: int) -> bool:
        """Whether ``ty`` may be the next operand after ``chosen``."""
        if self.partner is not None:
            return self.partner(chosen, ty, choice)
        return is_numeric(ty) and dtype(ty) == dtype(chosen[0]) and broadcastable(*chosen, ty)


# ---------------------------------------------------------------------------
# The built-in specs
# ---------------------------------------------------------------------------


def _unary(name: str, fn: Callable, accepts: Callable = is_numeric) -> OpSpec:
    return OpSpec(name, lambda x, choice: fn(x), 1, accepts)


def _binary(name: str, fn: Callable, accepts: Callable = is_numeric) -> OpSpec:
    return OpSpec(name, lambda x, y, choice: fn(x, y), 2, accepts)


def _static(d) -> bool:
    return isinstance(d, int)


def _flat(shape: tuple) -> object:
    return functools.reduce(operator.mul, shape, 1)


def _reshape_targets(shape: tuple) -> list[tuple]:
    """Shapes with the same element count: flat, every two-factor split, some 4-d ones."""
    if not all(_static(d) for d in shape):
        flat = (_flat(shape),)
        return [flat] if len(shape) > 1 else [shape]
    n = math.prod(shape)
    targets: list[tuple] = [(n,)]
    targets += [(d, n // d) for d in range(1, n + 1) if n % d == 0]
    # (1, C, H, W) views, so a conv2d has an input of rank 4 to read.
    targets += [(1, 1, d, n // d) for d in range(2, n) if n % d == 0]
    return [t for t in targets if t != shape] or [shape]


def _reshape(x: relax.Expr, choice: int) -> relax.Expr:
    targets = _reshape_targets(dims(ty(x)))
    return rop.reshape(x, list(targets[choice % len(targets)]))


def _permute(x: relax.Expr, choice: int) -> relax.Expr:
    perms = list(itertools.permutations(range(ty(x).ndim)))
    # A non-identity permutation first, so a shrunk choice (0) still transposes.
    perms = perms[1:] + perms[:1]
    return rop.permute_dims(x, list(perms[choice % len(perms)]))


def _axis(x: relax.Expr, choice: int) -> int:
    return choice % max(ty(x).ndim, 1)


def _reduce(fn: Callable) -> Callable:
    def make(x: relax.Expr, choice: int) -> relax.Expr:
        if ty(x).ndim == 0:
            return fn(x)
        return fn(x, axis=[_axis(x, choice)], keepdims=bool(choice // max(ty(x).ndim, 1) % 2))

    return make


def _matmul_partner(chosen, ty, choice) -> bool:
    (a,) = chosen
    if dtype(ty) != dtype(a) or ty.ndim not in (1, 2):
        return False
    return same_dim(dims(a)[-1], dims(ty)[0])


def _matmul_weight(chosen, choice) -> TensorType:
    (a,) = chosen
    return TensorType([dims(a)[-1], choice % 4 + 1], dtype(a))


def _concat_partner(chosen, ty, choice) -> bool:
    (a,) = chosen
    if dtype(ty) != dtype(a) or ty.ndim != a.ndim or a.ndim == 0:
        return False
    axis = choice % a.ndim
    return all(same_dim(x, y) for i, (x, y) in enumerate(zip(dims(a), dims(ty))) if i != axis)


def _concat(x: relax.Expr, y: relax.Expr, choice: int) -> relax.Expr:
    return rop.concat([x, y], axis=_axis(x, choice))


def _splittable(ty: TensorType) -> bool:
    return ty.ndim > 0 and any(_static(d) and d >= 2 for d in dims(ty))


def _split(x: relax.Expr, choice: int) -> relax.Expr:
    axes = [i for i, d in enumerate(dims(ty(x))) if _static(d) and d >= 2]
    axis = axes[choice % len(axes)]
    size = dims(ty(x))[axis]
    if choice // len(axes) % 2 and size % 2 == 0:
        return rop.split(x, 2, axis=axis)
    return rop.split(x, [size // 2], axis=axis)


def _where_partner(chosen, ty, choice) -> bool:
    if not is_numeric(ty) or not broadcastable(*chosen, ty):
        return False
    return len(chosen) == 1 or dtype(ty) == dtype(chosen[1])


def _is_bool(ty: TensorType) -> bool:
    return dtype(ty) == "bool"


# Casts between dtypes whose conversion is defined for every value: never float -> int
# (NaN and out-of-range floats convert to an unspecified integer, which would make two
# builds of one program disagree).
_CASTS = {
    "float32": ("float16", "float64"),
    "float16": ("float32",),
    "float64": ("float32",),
    "int32": ("float32", "int8", "int64"),
    "int64": ("int32", "float32"),
    "int8": ("int32", "float32"),
    "bool": ("float32", "int32"),
}


def _castable(ty: TensorType) -> bool:
    return dtype(ty) in _CASTS


def _astype(x: relax.Expr, choice: int) -> relax.Expr:
    targets = _CASTS[dtype(ty(x))]
    return rop.astype(x, targets[choice % len(targets)])


def _conv_input(ty: TensorType) -> bool:
    return is_float(ty) and ty.ndim == 4 and all(_static(d) for d in dims(ty))


def _conv_weight(chosen, choice) -> TensorType:
    (x,) = chosen
    _, channels, height, width = dims(x)
    kh, kw = choice % min(height, 3) + 1, choice // 3 % min(width, 3) + 1
    return TensorType([choice % 3 + 1, channels, kh, kw], dtype(x))


def _never(chosen, ty, choice) -> bool:
    return False


_SPECS: list[OpSpec] = [
    # Unary elementwise: exp, sqrt... are float-only in Relax; bitwise_not is integer-only.
    _unary("exp", rop.exp, is_float),
    _unary("negative", rop.negative),
    _unary("abs", rop.abs),
    _unary("tanh", rop.tanh, is_float),
    _unary("sigmoid", rop.sigmoid, is_float),
    _unary("sin", rop.sin, is_float),
    _unary("floor", rop.floor, is_float),
    _unary("square", rop.square),
    _unary("sqrt", rop.sqrt, is_float),
    _unary("bitwise_not", rop.bitwise_not, is_int),
    # Binary elementwise, broadcasting.
    _binary("add", rop.add),
    _binary("subtract", rop.subtract),
    _binary("multiply", rop.multiply),
    _binary("maximum", rop.maximum),
    _binary("minimum", rop.minimum),
    _binary("divide", rop.divide, is_float),
    _binary("bitwise_and", rop.bitwise_and, is_int),
    _binary("bitwise_xor", rop.bitwise_xor, is_int),
    # Layout.
    OpSpec("reshape", _reshape, 1, lambda ty: ty.ndim > 0),
    OpSpec("permute_dims", _permute, 1, lambda ty: ty.ndim > 0),
    # Comparisons (bool results) and where.
    _binary("less", rop.less),
    _binary("greater", rop.greater),
    _binary("equal", rop.equal),
    OpSpec("where", lambda c, x, y, choice: rop.where(c, x, y), 3, _is_bool, _where_partner),
    # Casts.
    OpSpec("astype", _astype, 1, _castable),
    # Reductions and softmax.
    OpSpec("sum", _reduce(rop.sum), 1, is_numeric),
    OpSpec("max", _reduce(rop.max), 1, is_numeric),
    OpSpec("mean", _reduce(rop.mean), 1, is_float),
    OpSpec("softmax", lambda x, choice: rop.nn.softmax(x, axis=_axis(x, choice)), 1, lambda t: is_float(t) and t.ndim > 0),
    # Matmul: of two computed tensors when their shapes fit, else of a weight parameter.
    OpSpec("matmul", lambda x, w, choice: rop.matmul(x, w), 2, lambda t: is_numeric(t) and t.ndim > 0, _matmul_partner, _matmul_weight),
    # Concat and split.
    OpSpec("concat", _concat, 2, lambda t: t.ndim > 0, _concat_partner),
    OpSpec("split", _split, 1, _splittable),
    # A small conv2d (NCHW input of rank 4, a weight parameter OIHW).
    OpSpec("conv2d", lambda x, w, choice: rop.nn.conv2d(x, w), 2, _conv_input, _never, _conv_weight),
]  # fmt: skip

_BY_NAME = {spec.name: spec for spec in _SPECS}

OP_NAMES: tuple[str, ...] = tuple(_BY_NAME)
"""The names of the built-in specs, in their default order."""

ELEMENTWISE_OPS: tuple[str, ...] = (
    *("exp", "negative", "abs", "tanh", "sigmoid", "sin", "floor", "square", "sqrt", "bitwise_not"),
    *("add", "subtract", "multiply", "maximum", "minimum", "divide", "bitwise_and", "bitwise_xor"),
    "reshape",
    "permute_dims",
)
"""What ``relax_functions`` generated before ops were a parameter: elementwise ops and layout."""

DEFAULT_OPS: tuple[str, ...] = OP_NAMES
"""Every built-in op: elementwise, layout, comparisons and ``where``, ``astype``,
``sum``/``max``/``mean``, ``softmax``, ``matmul``, ``concat``/``split``, ``conv2d``."""


def resolve_ops(ops: Sequence[str | OpSpec]) -> tuple[OpSpec, ...]:
    """The specs for ``ops``: built-in names looked up, ``OpSpec`` objects kept.

    Raises
    ------
    ValueError
        When ``ops`` is empty or names an op that is not built in.
    """
    if isinstance(ops, (str, OpSpec)):
        ops = [ops]
    resolved = []
    for op in ops:
        if isinstance(op, OpSpec):
            resolved.append(op)
        elif isinstance(op, str) and op in _BY_NAME:
            resolved.append(_BY_NAME[op])
        else:
            raise ValueError(
                f"unknown op {op!r}: use one of {', '.join(OP_NAMES)}, or an OpSpec "
                "(see rewrite_ext.testing.opspecs)"
            )
    if not resolved:
        raise ValueError("ops must name at least one op")
    return tuple(resolved)
