"""Hypothesis strategies that generate well-formed Relax IR for property tests.

Two strategies are public:

* :func:`relax_functions` draws pure Relax functions (elementwise ops,
  reshape / permute_dims, tuples, an optional DataflowBlock, ``If`` and
  nested local function) for testing a rewriter on arbitrary programs.
* :func:`lowered_copy_functions` draws impure, lowered functions in the
  style of memory-planned VM code: ``R.vm.alloc_storage`` /
  ``R.vm.alloc_tensor`` and ``R.vm.copy_tensor`` between them, with
  compute in between, always buildable for ``llvm`` and runnable on the VM.

How the draws are structured, so that shrinking works: every example is a
list of small "steps" drawn with ``st.lists``.  A step never names a value
directly: it holds integer references that are resolved *modulo* the pool
of values available at that point, counted from the most recent one.
Deleting any step therefore leaves every other step valid, and shrinking
a reference towards 0 makes the step read the value just computed, so a
failing example shrinks to a short chain.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Union

import tvm
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op as rop
from tvm.relax.op import memory as _memory
from tvm.relax.op import vm as _vm

__all__ = ["lowered_copy_functions", "relax_functions"]

# ---------------------------------------------------------------------------
# Types and op tables
# ---------------------------------------------------------------------------

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _TensorT:
    shape: Shape
    dtype: str

    def relax_type(self) -> relax.TensorType:
        return relax.TensorType(self.shape, self.dtype)


@dataclass(frozen=True)
class _TupleT:
    fields: tuple[_TensorT, ...]


@dataclass(frozen=True)
class _FuncT:
    result: _TensorT


_Type = Union[_TensorT, _TupleT, _FuncT]

# exp, sqrt, sigmoid... are float-only in Relax; bitwise_not is integer-only.
_FLOAT_UNARY: dict[str, Callable[[relax.Expr], relax.Expr]] = {
    "exp": rop.exp,
    "negative": rop.negative,
    "abs": rop.abs,
    "tanh": rop.tanh,
    "sigmoid": rop.sigmoid,
    "sin": rop.sin,
    "floor": rop.floor,
    "square": rop.square,
    "sqrt": rop.sqrt,
}
_INT_UNARY: dict[str, Callable[[relax.Expr], relax.Expr]] = {
    "negative": rop.negative,
    "abs": rop.abs,
    "square": rop.square,
    "bitwise_not": rop.bitwise_not,
}
_FLOAT_BINARY: dict[str, Callable[[relax.Expr, relax.Expr], relax.Expr]] = {
    "add": rop.add,
    "subtract": rop.subtract,
    "multiply": rop.multiply,
    "maximum": rop.maximum,
    "minimum": rop.minimum,
    "divide": rop.divide,
}
_INT_BINARY: dict[str, Callable[[relax.Expr, relax.Expr], relax.Expr]] = {
    "add": rop.add,
    "subtract": rop.subtract,
    "multiply": rop.multiply,
    "maximum": rop.maximum,
    "minimum": rop.minimum,
    "bitwise_and": rop.bitwise_and,
    "bitwise_xor": rop.bitwise_xor,
}


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def _check_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    dtypes = tuple(dtypes)
    if not dtypes:
        raise ValueError("dtypes must name at least one dtype")
    for dtype in dtypes:
        if not (_is_float(dtype) or dtype.startswith("int")):
            raise ValueError(f"unsupported dtype {dtype!r}: use float* or int* dtypes")
    return dtypes


def _unary_table(dtype: str) -> dict[str, Callable[[relax.Expr], relax.Expr]]:
    return _FLOAT_UNARY if _is_float(dtype) else _INT_UNARY


def _binary_table(dtype: str) -> dict[str, Callable[[relax.Expr, relax.Expr], relax.Expr]]:
    return _FLOAT_BINARY if _is_float(dtype) else _INT_BINARY


def _pick(seq: Sequence, ref: int):
    """The element ``ref`` places back from the most recent one, wrapping around."""
    return seq[len(seq) - 1 - ref % len(seq)]


def _nth(seq: Sequence, choice: int):
    return seq[choice % len(seq)]


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    """The numpy broadcast of two shapes, or None when they do not broadcast."""
    out = []
    for x, y in itertools.zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _reshape_targets(shape: Shape) -> list[Shape]:
    """Shapes with the same element count: flat, and every two-factor split."""
    n = math.prod(shape)
    targets: list[Shape] = [(n,)]
    targets += [(d, n // d) for d in range(1, n + 1) if n % d == 0]
    return [t for t in targets if t != shape] or [shape]


def _permutations(rank: int) -> list[tuple[int, ...]]:
    perms = list(itertools.permutations(range(rank)))
    # Put a non-identity permutation first so a shrunk choice (0) still transposes.
    return perms[1:] + perms[:1]


# ---------------------------------------------------------------------------
# Drawn steps: what hypothesis generates and shrinks
# ---------------------------------------------------------------------------
# Not part of the API; named without an underscore because hypothesis prints
# them in its failure reports ("Unary(src=0, op=0)" reads better).


@dataclass(frozen=True)
class Unary:
    src: int
    op: int


@dataclass(frozen=True)
class Binary:
    lhs: int
    rhs: int
    op: int


@dataclass(frozen=True)
class Reshape:
    src: int
    target: int


@dataclass(frozen=True)
class Permute:
    src: int
    perm: int


@dataclass(frozen=True)
class MakeTuple:
    srcs: tuple[int, ...]


@dataclass(frozen=True)
class GetItem:
    src: int
    index: int


@dataclass(frozen=True)
class CallLocal:
    args: tuple[int, ...]


_Step = Union[Unary, Binary, Reshape, Permute, MakeTuple, GetItem, CallLocal]


@dataclass(frozen=True)
class _ParamSpec:
    variant: int  # 0: the base shape, 1: a suffix of it, 2: some dims 1, 3: fresh
    drop: int
    ones: tuple[bool, ...]
    fresh: Shape
    dtype: str

    def shape(self, base: Shape) -> Shape:
        if self.variant == 1:
            return base[min(self.drop, len(base) - 1) :]
        if self.variant == 2:
            return tuple(1 if one else d for d, one in zip(base, self.ones + (False,) * len(base)))
        if self.variant == 3:
            return self.fresh
        return base


@dataclass(frozen=True)
class _LocalSpec:
    params: tuple[int, ...]  # references into the outer function's tensor parameters
    body: tuple[_Step, ...]


@dataclass(frozen=True)
class _IfSpec:
    result: int  # the value whose type both branches return
    then_steps: tuple[_Step, ...]
    else_steps: tuple[_Step, ...]


@dataclass(frozen=True)
class _ProgramSpec:
    base: Shape
    params: tuple[_ParamSpec, ...]
    dataflow: bool
    local: _LocalSpec | None
    steps: tuple[_Step, ...]
    branch: _IfSpec | None
    outputs: tuple[int, ...]


_REF = st.integers(min_value=0, max_value=63)
_CHOICE = st.integers(min_value=0, max_value=31)


def _shapes(max_rank: int, max_dim: int) -> st.SearchStrategy[Shape]:
    return st.lists(st.integers(1, max_dim), min_size=1, max_size=max_rank).map(tuple)


def _elementwise_steps() -> st.SearchStrategy[_Step]:
    # Unary first: hypothesis shrinks one_of towards its first branch.
    return st.one_of(st.builds(Unary, _REF, _CHOICE), st.builds(Binary, _REF, _REF, _CHOICE))


def _steps(allow_tuples: bool, allow_nested: bool) -> st.SearchStrategy[_Step]:
    options = [
        st.builds(Unary, _REF, _CHOICE),
        st.builds(Binary, _REF, _REF, _CHOICE),
        st.builds(Reshape, _REF, _CHOICE),
        st.builds(Permute, _REF, _CHOICE),
    ]
    if allow_tuples:
        options += [
            st.builds(MakeTuple, st.lists(_REF, min_size=1, max_size=3).map(tuple)),
            st.builds(GetItem, _REF, _CHOICE),
        ]
    if allow_nested:
        options.append(st.builds(CallLocal, st.lists(_REF, min_size=0, max_size=2).map(tuple)))
    return st.one_of(options)


def _param_specs(dtypes: tuple[str, ...], max_rank: int, max_dim: int) -> st.SearchStrategy[_ParamSpec]:
    return st.builds(
        _ParamSpec,
        st.integers(0, 3),
        st.integers(0, max_rank),
        st.lists(st.booleans(), max_size=max_rank).map(tuple),
        _shapes(max_rank, max_dim),
        st.sampled_from(dtypes),
    )


def _program_specs(
    *,
    max_params: int,
    min_bindings: int,
    max_bindings: int,
    dtypes: tuple[str, ...],
    max_rank: int,
    max_dim: int,
    max_branch_bindings: int,
    max_outputs: int,
    allow_dataflow: bool,
    allow_if: bool,
    allow_nested: bool,
    allow_tuples: bool,
) -> st.SearchStrategy[_ProgramSpec]:
    # Sub-strategies are built once here, not inside the draw: hypothesis validates
    # a strategy on first use, which would otherwise dominate the cost of a draw.
    base = _shapes(max_rank, max_dim)
    params = st.lists(_param_specs(dtypes, max_rank, max_dim), min_size=1, max_size=max_params).map(tuple)
    dataflow = st.booleans() if allow_dataflow else st.just(False)
    body = st.lists(_elementwise_steps(), max_size=max_branch_bindings).map(tuple)
    local = st.none()
    if allow_nested:
        local |= st.builds(_LocalSpec, st.lists(_REF, min_size=1, max_size=2).map(tuple), body)
    steps = st.lists(_steps(allow_tuples, allow_nested), min_size=min_bindings, max_size=max_bindings).map(tuple)
    branch = st.none()
    if allow_if:
        branch |= st.builds(_IfSpec, _REF, body, body)
    outputs = st.lists(_REF, min_size=1, max_size=max_outputs).map(tuple)
    return st.builds(_ProgramSpec, base, params, dataflow, local, steps, branch, outputs)


# ---------------------------------------------------------------------------
# Planning: resolve references against typed pools (no TVM involved yet)
# ---------------------------------------------------------------------------


class _Value:
    """A value of the program being planned; identity is what links ops together."""

    __slots__ = ("ty", "name")

    def __init__(self, ty: _Type, name: str = "") -> None:
        self.ty = ty
        self.name = name


@dataclass
class _Op:
    """One binding: ``result = make(*operands)``, with nested scopes for If and functions."""

    result: _Value
    make: Callable[..., relax.Expr]
    operands: tuple[_Value, ...]

    def reads(self) -> list[_Value]:
        return list(self.operands)


@dataclass
class _Scope:
    """The values a run of steps may read, and the ops that it planned."""

    tensors: list[_Value]
    tuples: list[_Value] = field(default_factory=list)
    local: _Value | None = None
    ops: list[_Op] = field(default_factory=list)

    def add(self, op: _Op) -> None:
        self.ops.append(op)
        if isinstance(op.result.ty, _TensorT):
            self.tensors.append(op.result)
        elif isinstance(op.result.ty, _TupleT):
            self.tuples.append(op.result)


@dataclass
class _LocalFuncOp(_Op):
    params: tuple[_Value, ...] = ()
    body: list[_Op] = field(default_factory=list)
    body_result: _Value | None = None

    def reads(self) -> list[_Value]:
        return []  # a closed function: reads nothing of the outer scope


@dataclass
class _IfOp(_Op):
    then_ops: list[_Op] = field(default_factory=list)
    then_result: _Value | None = None
    else_ops: list[_Op] = field(default_factory=list)
    else_result: _Value | None = None

    def reads(self) -> list[_Value]:
        inner = [v for o in self.then_ops + self.else_ops for v in o.reads()]
        return [*self.operands, *inner, self.then_result, self.else_result]


def _plan_unary(scope: _Scope, step: Unary) -> _Op:
    src = _pick(scope.tensors, step.src)
    fn = _nth(list(_unary_table(src.ty.dtype).values()), step.op)
    return _Op(_Value(src.ty), fn, (src,))


def _plan_binary(scope: _Scope, step: Binary) -> _Op:
    lhs = _pick(scope.tensors, step.lhs)
    # Only same-dtype, broadcast-compatible partners; lhs itself always qualifies.
    partners = [
        v for v in scope.tensors if v.ty.dtype == lhs.ty.dtype and _broadcast(v.ty.shape, lhs.ty.shape) is not None
    ]
    rhs = _pick(partners, step.rhs)
    fn = _nth(list(_binary_table(lhs.ty.dtype).values()), step.op)
    shape = _broadcast(lhs.ty.shape, rhs.ty.shape)
    return _Op(_Value(_TensorT(shape, lhs.ty.dtype)), fn, (lhs, rhs))


def _plan_reshape(scope: _Scope, step: Reshape) -> _Op:
    src = _pick(scope.tensors, step.src)
    target = _nth(_reshape_targets(src.ty.shape), step.target)
    return _Op(_Value(_TensorT(target, src.ty.dtype)), lambda x: rop.reshape(x, target), (src,))


def _plan_permute(scope: _Scope, step: Permute) -> _Op:
    src = _pick(scope.tensors, step.src)
    axes = _nth(_permutations(len(src.ty.shape)), step.perm)
    shape = tuple(src.ty.shape[a] for a in axes)
    return _Op(_Value(_TensorT(shape, src.ty.dtype)), lambda x: rop.permute_dims(x, list(axes)), (src,))


def _plan_tuple(scope: _Scope, srcs: Sequence[int]) -> _Op:
    fields = tuple(_pick(scope.tensors, ref) for ref in srcs)
    return _Op(_Value(_TupleT(tuple(f.ty for f in fields))), lambda *xs: relax.Tuple(list(xs)), fields)


def _plan_getitem(scope: _Scope, step: GetItem) -> _Op:
    if not scope.tuples:
        # Nothing to index yet (e.g. the MakeTuple step was shrunk away): still one binding.
        return _plan_tuple(scope, (step.src,))
    tup = _pick(scope.tuples, step.src)
    index = step.index % len(tup.ty.fields)
    return _Op(_Value(tup.ty.fields[index]), lambda t: relax.TupleGetItem(t, index), (tup,))


def _plan_call(scope: _Scope, step: CallLocal, local_params: Sequence[_Value]) -> _Op:
    if scope.local is None:
        return _plan_unary(scope, Unary(step.args[0] if step.args else 0, 0))
    refs = step.args + (0,) * len(local_params)
    # The outer parameter each local parameter was typed after always matches, so never empty.
    args = tuple(_pick([v for v in scope.tensors if v.ty == p.ty], ref) for p, ref in zip(local_params, refs))
    return _Op(_Value(scope.local.ty.result), lambda f, *xs: relax.Call(f, list(xs)), (scope.local, *args))


def _plan_steps(scope: _Scope, steps: Sequence[_Step], local_params: Sequence[_Value] = ()) -> None:
    for step in steps:
        if isinstance(step, Unary):
            op = _plan_unary(scope, step)
        elif isinstance(step, Binary):
            op = _plan_binary(scope, step)
        elif isinstance(step, Reshape):
            op = _plan_reshape(scope, step)
        elif isinstance(step, Permute):
            op = _plan_permute(scope, step)
        elif isinstance(step, MakeTuple):
            op = _plan_tuple(scope, step.srcs)
        elif isinstance(step, GetItem):
            op = _plan_getitem(scope, step)
        else:
            op = _plan_call(scope, step, local_params)
        scope.add(op)


def _plan_local(spec: _LocalSpec, outer_params: Sequence[_Value]) -> _LocalFuncOp:
    params = tuple(_Value(_pick(outer_params, ref).ty, f"p{i}") for i, ref in enumerate(spec.params))
    body = _Scope(list(params))
    _plan_steps(body, spec.body)
    result = body.tensors[-1]
    return _LocalFuncOp(_Value(_FuncT(result.ty)), None, (), params, body.ops, result)


def _plan_branch(spec: _IfSpec, outer: _Scope, cond: _Value) -> _IfOp:
    target = _pick(outer.tensors, spec.result)

    def branch(steps: Sequence[_Step]) -> tuple[list[_Op], _Value]:
        # The branch starts from ``target`` so a shrunk reference (0) chains off it.
        scope = _Scope([*outer.tensors, target])
        _plan_steps(scope, steps)
        # The most recent value of the target's type: both branches then agree on the type.
        result = next(v for v in reversed(scope.tensors) if v.ty == target.ty)
        return scope.ops, result

    then_ops, then_result = branch(spec.then_steps)
    else_ops, else_result = branch(spec.else_steps)
    return _IfOp(_Value(target.ty), None, (cond,), then_ops, then_result, else_ops, else_result)


@dataclass
class _Plan:
    params: list[_Value]
    dataflow: bool
    main: list[_Op]
    after: list[_Op]  # ops outside the dataflow block (the If)
    outputs: list[_Value]

    def exported(self) -> set[int]:
        """Ids of main-block values read after the block: DataflowBlock outputs."""
        read = [v for op in self.after for v in op.reads()] + self.outputs
        mine = {id(op.result) for op in self.main}
        return {id(v) for v in read} & mine


def _plan_program(spec: _ProgramSpec) -> _Plan:
    params = [_Value(_TensorT(p.shape(spec.base), p.dtype), f"x{i}") for i, p in enumerate(spec.params)]
    scope = _Scope(list(params))
    local_params: tuple[_Value, ...] = ()
    if spec.local is not None:
        local_op = _plan_local(spec.local, params)
        scope.ops.append(local_op)
        scope.local = local_op.result
        local_params = local_op.params
    _plan_steps(scope, spec.steps, local_params)
    after: list[_Op] = []
    if spec.branch is not None:
        cond = _Value(_TensorT((), "bool"), "cond")
        params.append(cond)
        if_op = _plan_branch(spec.branch, scope, cond)
        after.append(if_op)
        scope.tensors.append(if_op.result)
    outputs = [_pick(scope.tensors, ref) for ref in spec.outputs]
    return _Plan(params, spec.dataflow, scope.ops, after, outputs)


# ---------------------------------------------------------------------------
# Emission: plan -> relax.Function through a BlockBuilder
# ---------------------------------------------------------------------------

_Env = dict[int, relax.Expr]


def _expr(op: _Op, env: _Env, bb: relax.BlockBuilder) -> relax.Expr:
    if isinstance(op, _LocalFuncOp):
        inner = dict(env)
        params = [relax.Var(p.name, p.ty.relax_type()) for p in op.params]
        inner.update({id(p): v for p, v in zip(op.params, params)})
        body = _seq_expr(op.body, op.body_result, inner, bb)
        return relax.Function(params, body, op.body_result.ty.relax_type(), is_pure=True)
    if isinstance(op, _IfOp):
        then_branch = _seq_expr(op.then_ops, op.then_result, dict(env), bb)
        else_branch = _seq_expr(op.else_ops, op.else_result, dict(env), bb)
        return relax.If(env[id(op.operands[0])], then_branch, else_branch)
    return op.make(*(env[id(v)] for v in op.operands))


def _seq_expr(ops: Sequence[_Op], result: _Value, env: _Env, bb: relax.BlockBuilder) -> relax.SeqExpr:
    """A nested scope (If branch, function body): bound by hand, since BlockBuilder
    emits only into the function it is building."""
    bindings = []
    for op in ops:
        value = bb.normalize(_expr(op, env, bb))
        var = relax.Var(bb.get_unique_name("v"), value.ty)
        bindings.append(relax.VarBinding(var, value))
        env[id(op.result)] = var
    blocks = [relax.BindingBlock(bindings)] if bindings else []
    return bb.normalize(relax.SeqExpr(blocks, env[id(result)]))


def _emit_ops(bb: relax.BlockBuilder, ops: Sequence[_Op], env: _Env, outputs: set[int]) -> None:
    for op in ops:
        value = _expr(op, env, bb)
        env[id(op.result)] = bb.emit_output(value) if id(op.result) in outputs else bb.emit(value)


def _build_function(plan: _Plan) -> relax.Function:
    bb = relax.BlockBuilder()
    params = [relax.Var(p.name, p.ty.relax_type()) for p in plan.params]
    env: _Env = {id(p): v for p, v in zip(plan.params, params)}
    with bb.function("main", params, attrs={"global_symbol": "main"}, pure=True):
        if plan.dataflow:
            with bb.dataflow():
                _emit_ops(bb, plan.main, env, plan.exported())
        else:
            _emit_ops(bb, plan.main, env, set())
        _emit_ops(bb, plan.after, env, set())
        outputs = [env[id(v)] for v in plan.outputs]
        bb.emit_func_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
    return bb.get()["main"]


def relax_functions(
    *,
    max_params: int = 4,
    min_bindings: int = 1,
    max_bindings: int = 60,
    dtypes: Sequence[str] = ("float32", "int32"),
    max_rank: int = 3,
    max_dim: int = 8,
    max_branch_bindings: int = 4,
    max_outputs: int = 3,
    allow_dataflow: bool = True,
    allow_if: bool = True,
    allow_nested: bool = True,
    allow_tuples: bool = True,
) -> st.SearchStrategy[relax.Function]:
    """Random well-formed, pure Relax functions named ``main``.

    Each function takes 1 to ``max_params`` tensor parameters (``x0``,
    ``x1``, ...; shapes often equal or broadcast-compatible so binary ops
    mix them) and runs a chain of bindings over them: unary elementwise
    ops chosen per dtype (``exp``/``sqrt``/... only on floats,
    ``bitwise_not`` only on integers), binary elementwise ops between
    tensors of one dtype and broadcastable shapes, ``reshape``,
    ``permute_dims``, tuple creation and ``TupleGetItem``, and calls of a
    nested local function.  Optionally the chain is a DataflowBlock (then
    only values read after it are ``emit_output``-ed), and optionally an
    ``If`` on a trailing ``cond: R.Tensor((), "bool")`` parameter follows,
    each branch a SeqExpr with its own bindings and results of one type.
    Some bindings are left unused.  The function is built through
    ``relax.BlockBuilder``, so every binding carries its inferred type, and
    it prints as TVMScript that parses back to the same function.  To build
    one, lift the local function first: ``relax.transform.LambdaLift()``
    on ``tvm.IRModule({"main": func})``, then ``relax.build(..., "llvm")``.

    Parameters
    ----------
    max_params : int
        Most tensor parameters (at least one is drawn); ``cond`` is extra.
    min_bindings, max_bindings : int
        Bounds on the steps of the main chain.  Each step is one binding
        of the function's top-level blocks; the local function definition
        and the ``If`` add one binding each, plus their own bodies.
    dtypes : sequence of str
        Tensor dtypes to draw from (``float*`` and ``int*`` dtypes).
    max_rank, max_dim : int
        Parameters have rank 1 to ``max_rank`` and dims 1 to ``max_dim``.
    max_branch_bindings : int
        Most bindings in each ``If`` branch and in the local function body.
    max_outputs : int
        Most returned tensors; more than one are returned as a tuple.
    allow_dataflow, allow_if, allow_nested, allow_tuples : bool
        Whether DataflowBlocks, ``If``, nested local functions and tuples
        may be generated.

    Returns
    -------
    SearchStrategy[relax.Function]
        Functions with attribute ``global_symbol = "main"``; wrap one with
        ``tvm.IRModule({"main": func})`` for a module.

    Examples
    --------
    >>> from hypothesis import given
    >>> from rewrite_ext.testing.strategies import relax_functions
    >>> @given(relax_functions(max_bindings=10, allow_if=False))
    ... def test_my_rewrite_keeps_functions_well_formed(func):
    ...     assert relax.analysis.well_formed(my_rewrite(func))
    """
    if not 1 <= max_params:
        raise ValueError("max_params must be at least 1")
    if not 0 <= min_bindings <= max_bindings:
        raise ValueError("need 0 <= min_bindings <= max_bindings")
    if max_rank < 1 or max_dim < 1 or max_outputs < 1 or max_branch_bindings < 0:
        raise ValueError("max_rank, max_dim and max_outputs must be >= 1, max_branch_bindings >= 0")
    specs = _program_specs(
        max_params=max_params,
        min_bindings=min_bindings,
        max_bindings=max_bindings,
        dtypes=_check_dtypes(dtypes),
        max_rank=max_rank,
        max_dim=max_dim,
        max_branch_bindings=max_branch_bindings,
        max_outputs=max_outputs,
        allow_dataflow=allow_dataflow,
        allow_if=allow_if,
        allow_nested=allow_nested,
        allow_tuples=allow_tuples,
    )
    return specs.map(lambda spec: _build_function(_plan_program(spec)))


# ---------------------------------------------------------------------------
# Lowered, impure functions: storages, tensors in them, copies, compute
# ---------------------------------------------------------------------------

# Only ops whose result is bit-exact on every backend (no transcendental rounding, no
# integer overflow from multiply chains), so a generated program has one right answer.
_EXACT_UNARY: dict[str, Callable[[relax.Expr], relax.Expr]] = {"negative": rop.negative, "abs": rop.abs}
_EXACT_BINARY_FLOAT: dict[str, Callable[[relax.Expr, relax.Expr], relax.Expr]] = {
    "add": rop.add,
    "subtract": rop.subtract,
    "multiply": rop.multiply,
    "maximum": rop.maximum,
    "minimum": rop.minimum,
}
_EXACT_BINARY_INT = {k: v for k, v in _EXACT_BINARY_FLOAT.items() if k != "multiply"}

#: Byte offsets inside a storage are multiples of the element size; extra padding is
#: drawn in elements so some offsets are 64-byte aligned and some are not (the two
#: code paths of ``ensure_zero_offset``: a zero-copy view or a copy).
_MAX_PAD_ELEMENTS = 16


@dataclass(frozen=True)
class Compute:
    op: int
    lhs: int
    rhs: int


@dataclass(frozen=True)
class Copy:
    compute: Compute | None  # computed just before the copy; its result may be the source
    src: int
    into: int | None  # None: a fresh destination; else an earlier one, overwritten
    storage: int
    shape: int
    pad: int


@dataclass(frozen=True)
class _LoweredSpec:
    base: Shape
    params: tuple[_ParamSpec, ...]
    storages: int
    steps: tuple[Copy, ...]
    outputs: tuple[int, ...]


def _lowered_specs(
    *,
    max_params: int,
    min_copies: int,
    max_copies: int,
    max_storages: int,
    dtypes: tuple[str, ...],
    max_rank: int,
    max_dim: int,
    max_outputs: int,
    allow_overwrite: bool,
) -> st.SearchStrategy[_LoweredSpec]:
    compute = st.none() | st.builds(Compute, _CHOICE, _REF, _REF)
    into = st.none() | _REF if allow_overwrite else st.none()
    copy = st.builds(Copy, compute, _REF, into, _CHOICE, _CHOICE, st.integers(0, _MAX_PAD_ELEMENTS))
    return st.builds(
        _LoweredSpec,
        _shapes(max_rank, max_dim),
        st.lists(_param_specs(dtypes, max_rank, max_dim), min_size=1, max_size=max_params).map(tuple),
        st.integers(1, max_storages),
        st.lists(copy, min_size=min_copies, max_size=max_copies).map(tuple),
        st.lists(_REF, min_size=1, max_size=max_outputs).map(tuple),
    )


class _Tensor(_Value):
    """A tensor of a lowered function; ``offset`` is set for ``alloc_tensor`` results."""

    __slots__ = ("storage", "offset")

    def __init__(self, ty: _TensorT, name: str, storage: _Value | None = None, offset: int = 0) -> None:
        super().__init__(ty, name)
        self.storage = storage
        self.offset = offset

    @property
    def nbytes(self) -> int:
        return math.prod(self.ty.shape) * _itemsize(self.ty.dtype)


def _itemsize(dtype: str) -> int:
    return tvm.DataType(dtype).bits // 8


class _LoweredPlanner:
    """Bump-allocates tensors in storages and plans the copies and compute between them."""

    def __init__(self, spec: _LoweredSpec) -> None:
        self.params = [_Tensor(_TensorT(p.shape(spec.base), p.dtype), f"x{i}") for i, p in enumerate(spec.params)]
        self.storages = [_Value(None, f"storage{i}") for i in range(spec.storages)]
        self.cursor = [0] * spec.storages  # next free byte of each storage
        self.allocated: list[_Tensor] = []
        self.computed: list[_Tensor] = []
        self.pool: list[_Tensor] = list(self.params)  # every tensor, in order of definition
        self.ops: list[_Op] = []

    def _bind(self, result: _Value, make: Callable[..., relax.Expr], *operands: _Value) -> None:
        self.ops.append(_Op(result, make, operands))

    def _zero_offset(self, value: _Tensor) -> _Value:
        # Compiled CPU kernels reject a tensor at a non-zero byte offset in its storage;
        # ensure_zero_offset hands them a view (64-byte-aligned offset) or a copy.
        if value.offset == 0:
            return value
        fixed = _Value(value.ty, f"{value.name}_z")
        self._bind(fixed, _memory.ensure_zero_offset, value)
        return fixed

    def compute(self, step: Compute) -> None:
        lhs = _pick(self.pool, step.lhs)
        table = _EXACT_BINARY_FLOAT if _is_float(lhs.ty.dtype) else _EXACT_BINARY_INT
        ops = list(_EXACT_UNARY.values()) + list(table.values())
        fn = _nth(ops, step.op)
        if fn in _EXACT_UNARY.values():
            operands: tuple[_Tensor, ...] = (lhs,)
            shape = lhs.ty.shape
        else:
            partners = [
                v for v in self.pool if v.ty.dtype == lhs.ty.dtype and _broadcast(v.ty.shape, lhs.ty.shape) is not None
            ]
            rhs = _pick(partners, step.rhs)
            operands, shape = (lhs, rhs), _broadcast(lhs.ty.shape, rhs.ty.shape)
        result = _Tensor(_TensorT(shape, lhs.ty.dtype), f"t{len(self.computed)}")
        fixed: dict[int, _Value] = {}
        for v in operands:  # add(a, a): one ensure_zero_offset, not two
            if id(v) not in fixed:
                fixed[id(v)] = self._zero_offset(v)
        self._bind(result, fn, *(fixed[id(v)] for v in operands))
        self.computed.append(result)
        self.pool.append(result)

    def _allocate(self, src: _Tensor, step: Copy) -> _Tensor:
        index = step.storage % len(self.storages)
        itemsize = _itemsize(src.ty.dtype)
        start = -(-self.cursor[index] // itemsize) * itemsize + step.pad * itemsize
        shape = _nth([src.ty.shape, *_reshape_targets(src.ty.shape)], step.shape)
        dst = _Tensor(_TensorT(shape, src.ty.dtype), f"a{len(self.allocated)}", self.storages[index], start)
        self.cursor[index] = start + dst.nbytes
        self._bind(
            dst,
            lambda storage: _vm.alloc_tensor(storage, start, relax.ShapeExpr(list(shape)), src.ty.dtype),
            self.storages[index],
        )
        self.allocated.append(dst)
        self.pool.append(dst)
        return dst

    def copy(self, step: Copy) -> None:
        if step.compute is not None:
            self.compute(step.compute)
        src = _pick(self.pool, step.src)
        # Overwrite only a same-dtype, same-size, different tensor: regions never overlap.
        targets = [a for a in self.allocated if a is not src and a.ty.dtype == src.ty.dtype and a.nbytes == src.nbytes]
        if step.into is not None and targets:
            dst = _pick(targets, step.into)
        else:
            dst = self._allocate(src, step)
        self._bind(_Value(_TupleT(()), "_"), _copy_tensor(), src, dst)

    def storage_ops(self) -> list[_Op]:
        ops = []
        for storage, size in zip(self.storages, self.cursor):
            # An empty storage still gets a few bytes: a zero-byte allocation is legal but odd.
            nbytes = max(size, 64)
            make = lambda nbytes=nbytes: _vm.alloc_storage(relax.ShapeExpr([nbytes]), 0, "uint8", "global")
            ops.append(_Op(storage, make, ()))
        return ops


def _copy_tensor() -> Callable[[relax.Expr, relax.Expr], relax.Call]:
    # Imported late: rewrite_ext.ops registers the op with TVM on import.
    from ..ops import copy_tensor

    return copy_tensor


def _build_lowered(spec: _LoweredSpec, legalize: bool) -> tvm.IRModule:
    planner = _LoweredPlanner(spec)
    for step in spec.steps:
        planner.copy(step)
    # The first output is always a copy destination, so the result depends on the copies.
    others = planner.allocated + planner.computed
    outputs = [_pick(planner.allocated, spec.outputs[0])] + [_pick(others, ref) for ref in spec.outputs[1:]]
    bb = relax.BlockBuilder()
    params = [relax.Var(p.name, p.ty.relax_type()) for p in planner.params]
    env: _Env = {id(p): v for p, v in zip(planner.params, params)}
    with bb.function("main", params, attrs={"global_symbol": "main"}, pure=False):
        for op in planner.storage_ops() + planner.ops:
            env[id(op.result)] = bb.emit(op.make(*(env[id(v)] for v in op.operands)), op.result.name)
        results = [env[id(v)] for v in outputs]
        bb.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    mod = bb.get()
    return relax.transform.LegalizeOps()(mod) if legalize else mod


def lowered_copy_functions(
    *,
    max_copies: int = 20,
    min_copies: int = 1,
    dtypes: Sequence[str] = ("float32", "int32"),
    max_params: int = 3,
    max_storages: int = 2,
    max_rank: int = 3,
    max_dim: int = 8,
    max_outputs: int = 3,
    allow_overwrite: bool = True,
    legalize: bool = False,
) -> st.SearchStrategy[tvm.IRModule]:
    """Random impure, memory-planned ("lowered") Relax functions built around copies.

    The generated ``main`` (``pure=False``, plain binding blocks) looks like
    VM code after memory planning; a shrunk example::

        @R.function(pure=False)
        def main(x0: R.Tensor((1,), dtype="float32"), x1: R.Tensor((1,), dtype="float32")) -> R.Tensor((1,), dtype="float32"):
            storage0: R.Any = R.vm.alloc_storage(R.shape([68]), 0, R.dtype("uint8"), R.str("global"))
            storage1: R.Any = R.vm.alloc_storage(R.shape([64]), 0, R.dtype("uint8"), R.str("global"))
            a0: R.Tensor((1,), dtype="float32") = R.vm.alloc_tensor(storage0, 0, R.shape([1]), R.dtype("float32"), 0)
            R.vm.copy_tensor(x1, a0)
            a1: R.Tensor((1,), dtype="float32") = R.vm.alloc_tensor(storage0, 60, R.shape([1]), R.dtype("float32"), 0)
            R.vm.copy_tensor(a0, a1)
            R.vm.copy_tensor(a1, a0)
            a1_z: R.Tensor((1,), dtype="float32") = R.memory.ensure_zero_offset(a1)
            t0: R.Tensor((1,), dtype="float32") = R.multiply(a1_z, a1_z)
            a2: R.Tensor((1,), dtype="float32") = R.vm.alloc_tensor(storage0, 64, R.shape([1]), R.dtype("float32"), 0)
            R.vm.copy_tensor(t0, a2)
            return a2

    It allocates 1 to ``max_storages`` storages (scope ``"global"``) at the top,
    places tensors in them at non-overlapping offsets (a multiple of the element
    size, sometimes 64-byte aligned, sometimes not), and runs ``min_copies`` to
    ``max_copies`` ``R.vm.copy_tensor(src, dst)`` from parameters, copy
    destinations or computed tensors into copy destinations (fresh ones, possibly
    reshaped, or earlier ones overwritten) of equal dtype and byte size.  Between
    copies it computes with elementwise ops that are bit-exact (``negative``,
    ``abs``, ``add``, ``subtract``, ``maximum``, ``minimum``, and ``multiply`` on
    floats only, so integer chains cannot overflow); an operand at a non-zero
    offset goes through ``R.memory.ensure_zero_offset`` first, since TVM's CPU
    kernels reject such tensors.  The first returned value is always a copy
    destination.  Every module builds with ``relax.build(mod, target="llvm")`` and
    runs on ``relax.VirtualMachine(ex, tvm.cpu())``.

    Parameters
    ----------
    max_copies, min_copies : int
        Bounds on the number of ``copy_tensor`` calls (``min_copies >= 1``).
    dtypes : sequence of str
        Parameter dtypes to draw from (``float*`` and ``int*`` dtypes).
    max_params : int
        Most tensor parameters ``x0``, ``x1``, ... (at least one).
    max_storages : int
        Most ``alloc_storage`` calls (at least one).
    max_rank, max_dim : int
        Parameters have rank 1 to ``max_rank`` and dims 1 to ``max_dim``.
    max_outputs : int
        Most returned tensors; more than one are returned as a tuple.
    allow_overwrite : bool
        Whether a copy may overwrite an earlier copy destination.
    legalize : bool
        Apply ``relax.transform.LegalizeOps`` so the compute is already lowered
        to ``R.call_tir`` of PrimFuncs in the module.  Either way ``relax.build``
        legalizes what is left.

    Returns
    -------
    SearchStrategy[tvm.IRModule]
        Modules whose only Relax function is ``main`` (``global_symbol``
        ``"main"``), plus the PrimFuncs of the compute when ``legalize``.

    Examples
    --------
    >>> from hypothesis import given
    >>> from rewrite_ext.testing.strategies import lowered_copy_functions
    >>> @given(lowered_copy_functions(max_copies=5))
    ... def test_my_copy_rewrite_runs(mod):
    ...     relax.build(my_copy_rewrite(mod), target="llvm")
    """
    if not 1 <= min_copies <= max_copies:
        raise ValueError("need 1 <= min_copies <= max_copies")
    if max_params < 1 or max_storages < 1 or max_rank < 1 or max_dim < 1 or max_outputs < 1:
        raise ValueError("max_params, max_storages, max_rank, max_dim and max_outputs must be >= 1")
    specs = _lowered_specs(
        max_params=max_params,
        min_copies=min_copies,
        max_copies=max_copies,
        max_storages=max_storages,
        dtypes=_check_dtypes(dtypes),
        max_rank=max_rank,
        max_dim=max_dim,
        max_outputs=max_outputs,
        allow_overwrite=allow_overwrite,
    )
    return specs.map(lambda spec: _build_lowered(spec, legalize))
