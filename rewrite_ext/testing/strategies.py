"""Hypothesis strategies that generate well-formed Relax IR for property tests.

Four strategies are public:

* :func:`relax_functions` draws pure Relax functions: a chain of ops chosen
  from ``ops`` (see :mod:`rewrite_ext.testing.opspecs`: elementwise,
  layout, comparisons and ``where``, casts, reductions, ``softmax``,
  ``matmul``, ``concat``/``split``, ``conv2d``), tuples, an optional
  DataflowBlock, ``If`` and a nested local function, for testing a rewriter
  on arbitrary programs.  Symbolic shapes with ``match_cast``, ``R.Prim`` /
  ``R.Shape`` / ``R.Object`` / tuple parameters, mixed blocks and nested
  ``If`` are opt-in.
* :func:`relax_modules` draws modules of several such functions calling each
  other through GlobalVars, every feature on by default, and optionally
  legalized (``R.call_tir`` into the PrimFuncs ``LegalizeOps`` generates).
* :func:`lowered_functions` draws what TVM's own build pipeline makes of a
  generated module just before VM code generation: ``R.vm.alloc_storage``,
  ``R.vm.alloc_tensor``, direct calls of PrimFuncs, ``R.vm.kill_object``.
* :func:`lowered_copy_functions` draws impure, lowered functions in the
  style of memory-planned VM code built around ``R.vm.copy_tensor``,
  always buildable for ``llvm`` and runnable on the VM.

How the draws are structured, so that shrinking works: every example is a
list of small "steps" drawn with ``st.lists``.  A step never names a value
directly: it holds integer references that are resolved *modulo* the pool
of values available at that point, counted from the most recent one.
Deleting any step therefore leaves every other step valid (a step that
cannot apply is skipped), and shrinking a reference towards 0 makes the
step read the value just computed, so a failing example shrinks to a short
chain.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Union

import tvm
import tvm_ffi
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op as rop
from tvm.relax.op import memory as _memory
from tvm.relax.op import vm as _vm

from .opspecs import DEFAULT_OPS, OpSpec, dims, resolve_ops, same_dim
from ..compat import ObjectType, PrimType, ShapeType, TensorType, TupleType, dtype_name, ret_ty, ty, ty_args, var_name
from .._ir import data_size

__all__ = ["lowered_copy_functions", "lowered_functions", "relax_functions", "relax_modules"]

# ---------------------------------------------------------------------------
# Shapes and references
# ---------------------------------------------------------------------------

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _TensorT:
    shape: Shape
    dtype: str

    def relax_type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)


@dataclass(frozen=True)
class _TupleT:
    fields: tuple[_TensorT, ...]


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


def _same_type(a: relax.Type, b: relax.Type) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


# ---------------------------------------------------------------------------
# Drawn steps: what hypothesis generates and shrinks
# ---------------------------------------------------------------------------
# Not part of the API; named without an underscore because hypothesis prints
# them in its failure reports ("Apply(op=0, src=0, ...)" reads better).


@dataclass(frozen=True)
class Apply:
    """One op of ``ops``: operands chosen by reference, ``choice`` its variant."""

    op: int
    src: int
    partner: int
    choice: int


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


@dataclass(frozen=True)
class CallGlobal:
    callee: int
    args: tuple[int, ...]


_Step = Union[Apply, MakeTuple, GetItem, CallLocal, CallGlobal]


@dataclass(frozen=True)
class _ParamSpec:
    variant: int  # 0: the base shape, 1: a suffix of it, 2: some dims 1, 3: fresh, 4: a scalar
    drop: int
    ones: tuple[bool, ...]
    fresh: Shape
    dtype: str

    def shape(self, base: tuple) -> tuple:
        if self.variant == 1:
            return base[min(self.drop, len(base) - 1) :]
        if self.variant == 2:
            return tuple(1 if one else d for d, one in zip(base, self.ones + (False,) * len(base)))
        if self.variant == 3:
            return self.fresh
        if self.variant == 4:
            return ()
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
    nested: _IfSpec | None = None  # an If inside the then-branch


# Extra parameters: R.Prim("int64"), R.Shape(ndim=k), R.Object, a tuple of tensors.
_EXTRA_KINDS = 4


@dataclass(frozen=True)
class _ProgramSpec:
    params: tuple[_ParamSpec, ...]
    dataflow: tuple[bool, ...]  # one per segment of the main chain
    cuts: tuple[int, ...]  # where the segments end (references into the chain)
    local: _LocalSpec | None
    steps: tuple[_Step, ...]
    branch: _IfSpec | None
    outputs: tuple[int, ...]
    symbolic: bool  # the leading dim of the base shape is a symbolic "n"
    cast: bool  # an extra parameter of unknown shape, match_cast to the base shape
    extras: tuple[int, ...]
    prim_cond: bool  # the If condition is an R.Prim("bool"), not an R.Tensor((), "bool")


@dataclass(frozen=True)
class _ModuleSpec:
    base: Shape
    helpers: tuple[_ProgramSpec, ...]
    main: _ProgramSpec
    legalize: bool


_REF = st.integers(min_value=0, max_value=63)
_CHOICE = st.integers(min_value=0, max_value=31)


def _shapes(max_rank: int, max_dim: int) -> st.SearchStrategy[Shape]:
    return st.lists(st.integers(1, max_dim), min_size=1, max_size=max_rank).map(tuple)


def _apply_steps(n_ops: int) -> st.SearchStrategy[Apply]:
    return st.builds(Apply, st.integers(0, n_ops - 1), _REF, _REF, _CHOICE)


@dataclass(frozen=True)
class _Features:
    """What a generated function may hold (the strategies' ``allow_*`` arguments)."""

    max_params: int
    min_bindings: int
    max_bindings: int
    dtypes: tuple[str, ...]
    max_rank: int
    max_dim: int
    max_branch_bindings: int
    max_outputs: int
    dataflow: bool
    if_: bool
    nested: bool
    tuples: bool
    symbolic: bool = False
    other_params: bool = False
    mixed_blocks: bool = False
    nested_if: bool = False
    calls: bool = False
    n_ops: int = 1


def _steps(features: _Features, allow_nested: bool) -> st.SearchStrategy[_Step]:
    # Apply first: hypothesis shrinks one_of towards its first branch.
    options = [_apply_steps(features.n_ops)]
    if features.tuples:
        options += [
            st.builds(MakeTuple, st.lists(_REF, min_size=1, max_size=3).map(tuple)),
            st.builds(GetItem, _REF, _CHOICE),
        ]
    if allow_nested:
        options.append(st.builds(CallLocal, st.lists(_REF, min_size=0, max_size=2).map(tuple)))
    if features.calls:
        options.append(st.builds(CallGlobal, _REF, st.lists(_REF, max_size=3).map(tuple)))
    return st.one_of(options)


def _param_specs(dtypes: tuple[str, ...], max_rank: int, max_dim: int, scalars: bool) -> st.SearchStrategy[_ParamSpec]:
    return st.builds(
        _ParamSpec,
        st.integers(0, 4 if scalars else 3),
        st.integers(0, max_rank),
        st.lists(st.booleans(), max_size=max_rank).map(tuple),
        _shapes(max_rank, max_dim),
        st.sampled_from(dtypes),
    )


def _if_specs(body: st.SearchStrategy, nested: bool) -> st.SearchStrategy[_IfSpec]:
    inner = st.none()
    if nested:
        inner |= st.builds(_IfSpec, _REF, body, body)
    return st.builds(_IfSpec, _REF, body, body, inner)


def _program_specs(features: _Features, *, entry: bool) -> st.SearchStrategy[_ProgramSpec]:
    """One function; ``entry``: it may have an If, a local function and non-tensor params.

    Sub-strategies are built once here, not inside the draw: hypothesis validates
    a strategy on first use, which would otherwise dominate the cost of a draw.
    """
    f = features
    params = st.lists(
        _param_specs(f.dtypes, f.max_rank, f.max_dim, f.other_params), min_size=1, max_size=f.max_params
    ).map(tuple)
    flag = st.booleans()
    segments = st.integers(1, 3 if f.mixed_blocks else 1)
    dataflow = segments.flatmap(lambda n: st.tuples(*[flag if f.dataflow else st.just(False)] * n))
    body = st.lists(_apply_steps(f.n_ops), max_size=f.max_branch_bindings).map(tuple)
    nested = f.nested and entry
    local = st.none()
    if nested:
        local |= st.builds(_LocalSpec, st.lists(_REF, min_size=1, max_size=2).map(tuple), body)
    steps = st.lists(_steps(f, nested), min_size=f.min_bindings, max_size=f.max_bindings).map(tuple)
    branch = st.none()
    if f.if_ and entry:
        branch |= _if_specs(body, f.nested_if)
    outputs = st.lists(_REF, min_size=1, max_size=f.max_outputs).map(tuple)
    maybe = flag if f.symbolic else st.just(False)
    other = f.other_params and entry
    extras = st.lists(st.integers(0, _EXTRA_KINDS - 1), max_size=3).map(tuple) if other else st.just(())
    return st.builds(
        _ProgramSpec,
        params=params,
        dataflow=dataflow,
        cuts=st.lists(_REF, min_size=2, max_size=2).map(tuple),
        local=local,
        steps=steps,
        branch=branch,
        outputs=outputs,
        symbolic=maybe,
        # Only an entry function casts a parameter of unknown shape: a caller could not tell
        # which tensors pass the cast.
        cast=maybe if entry else st.just(False),
        extras=extras,
        prim_cond=flag if other else st.just(False),
    )


# ---------------------------------------------------------------------------
# Planning: resolve references against typed pools
# ---------------------------------------------------------------------------


class _Value:
    """A value of the program being planned; identity is what links ops together.

    ``ty`` is the value's Relax type; ``placeholder()`` is a typed ``relax.Var``
    standing for it while TVM infers the types of the calls that read it.
    """

    __slots__ = ("ty", "name", "_placeholder")

    def __init__(self, ty, name: str = "") -> None:
        self.ty = ty
        self.name = name
        self._placeholder = None

    def placeholder(self) -> relax.Var:
        if self._placeholder is None:
            self._placeholder = relax.Var(self.name or "v", self.ty)
        return self._placeholder


@dataclass
class _Op:
    """One binding: ``result = make(*operands)``, with nested scopes for If and functions."""

    result: _Value
    make: Callable[..., relax.Expr]
    operands: tuple[_Value, ...]

    def reads(self) -> list[_Value]:
        return list(self.operands)


@dataclass
class _MatchCastOp(_Op):
    """``result = R.match_cast(operand, result.ty)``."""


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


@dataclass
class _Callee:
    """A function already built into the module: calls of it are planned against its params."""

    gv: tvm.ir.GlobalVar
    params: tuple[relax.Type, ...]


@dataclass
class _Scope:
    """The values a run of steps may read, and the ops that it planned."""

    tensors: list[_Value]
    tuples: list[_Value] = field(default_factory=list)
    local: _LocalFuncOp | None = None
    ops: list[_Op] = field(default_factory=list)
    new_param: Callable[[TensorType], _Value] | None = None  # weights; None in closed scopes

    def add(self, op: _Op) -> None:
        self.ops.append(op)
        self.pool(op.result)

    def pool(self, value: _Value) -> None:
        if isinstance(value.ty, TensorType) and value.ty.shape is not None:
            self.tensors.append(value)
        elif isinstance(value.ty, TupleType):
            self.tuples.append(value)


def _binds(param: relax.Type, arg: relax.Type, symbols: dict) -> bool:
    """Whether ``arg`` fits ``param``, binding ``param``'s symbolic dims in ``symbols``."""
    if not (isinstance(param, TensorType) and isinstance(arg, TensorType)):
        return False
    if param.ndim != arg.ndim or str(param.dtype) != str(arg.dtype) or arg.shape is None:
        return False
    if param.shape is None:
        return True
    for p, a in zip(dims(param), dims(arg)):
        if isinstance(p, tvm.tirx.Var):
            key = p
            if key in symbols:
                if not same_dim(symbols[key], a):
                    return False
            else:
                symbols[key] = a
        elif not same_dim(p, a):
            return False
    return True


class _Planner:
    """Plans one function's ops from its spec; TVM infers every call's type."""

    def __init__(self, ops: Sequence[OpSpec], callees: Sequence[_Callee]) -> None:
        self.ops = tuple(ops)
        self.callees = list(callees)
        self.scratch = relax.BlockBuilder()
        self.weights: list[_Value] = []

    def infer(self, expr: relax.Expr, what: str) -> relax.Type:
        try:
            return ty(self.scratch.normalize(expr))
        except Exception as exc:  # noqa: BLE001 - TVM raises several kinds
            raise ValueError(f"{what} made a call TVM rejects: {exc}") from exc

    def new_weight(self, ty: TensorType) -> _Value:
        value = _Value(ty, f"w{len(self.weights)}")
        self.weights.append(value)
        return value

    # -- steps -------------------------------------------------------------

    def apply(self, scope: _Scope, step: Apply) -> _Op | None:
        n = len(self.ops)
        for k in range(n):  # the drawn op, else the next one that applies here
            op = self._try(scope, self.ops[(step.op + k) % n], step)
            if op is not None:
                return op
        return None

    def _try(self, scope: _Scope, spec: OpSpec, step: Apply) -> _Op | None:
        firsts = [v for v in scope.tensors if spec.accepts(v.ty)]
        if not firsts:
            return None
        chosen = [_pick(firsts, step.src)]
        for i in range(spec.operands - 1):
            types = [v.ty for v in chosen]
            partners = [v for v in scope.tensors if spec.fits(types, v.ty, step.choice)]
            if partners:
                chosen.append(_pick(partners, step.partner + i))
            elif spec.weight is not None and scope.new_param is not None:
                chosen.append(scope.new_param(spec.weight(types, step.choice)))
            else:
                return None
        choice = step.choice

        def make(*xs: relax.Expr) -> relax.Expr:
            return spec.make(*xs, choice)

        ty = self.infer(make(*(v.placeholder() for v in chosen)), f"OpSpec {spec.name!r}")
        return _Op(_Value(ty), make, tuple(chosen))

    def make_tuple(self, scope: _Scope, srcs: Sequence[int]) -> _Op:
        fields = tuple(_pick(scope.tensors, ref) for ref in srcs)
        ty = TupleType([f.ty for f in fields])
        return _Op(_Value(ty), lambda *xs: relax.Tuple(list(xs)), fields)

    def get_item(self, scope: _Scope, step: GetItem) -> _Op:
        if not scope.tuples:
            # Nothing to index yet (e.g. the MakeTuple step was shrunk away): still one binding.
            return self.make_tuple(scope, (step.src,))
        tup = _pick(scope.tuples, step.src)
        index = step.index % len(tup.ty.fields)
        return _Op(_Value(tup.ty.fields[index]), lambda t: relax.TupleGetItem(t, index), (tup,))

    def call_local(self, scope: _Scope, step: CallLocal) -> _Op | None:
        local = scope.local
        if local is None:
            return self.apply(scope, Apply(0, step.args[0] if step.args else 0, 0, 0))
        refs = step.args + (0,) * len(local.params)
        # The outer parameter each local parameter was typed after always matches, so never empty.
        args = tuple(
            _pick([v for v in scope.tensors if _same_type(v.ty, p.ty)], ref) for p, ref in zip(local.params, refs)
        )
        return _Op(_Value(local.body_result.ty), lambda f, *xs: relax.Call(f, list(xs)), (local.result, *args))

    def call_global(self, scope: _Scope, step: CallGlobal) -> _Op | None:
        if not self.callees:
            return self.apply(scope, Apply(0, step.callee, 0, 0))
        callee = _pick(self.callees, step.callee)
        refs = step.args + (0,) * len(callee.params)
        symbols: dict = {}
        args = []
        for param, ref in zip(callee.params, refs):
            fits = [v for v in scope.tensors if _binds(param, v.ty, dict(symbols))]
            if not fits:
                return None
            arg = _pick(fits, ref)
            _binds(param, arg.ty, symbols)
            args.append(arg)
        gv = callee.gv
        ty = self.infer(relax.Call(gv, [a.placeholder() for a in args]), f"the call of {gv.name_hint}")
        return _Op(_Value(ty), lambda *xs: relax.Call(gv, list(xs)), tuple(args))

    def steps(self, scope: _Scope, steps: Sequence[_Step]) -> None:
        for step in steps:
            if isinstance(step, Apply):
                op = self.apply(scope, step)
            elif isinstance(step, MakeTuple):
                op = self.make_tuple(scope, step.srcs)
            elif isinstance(step, GetItem):
                op = self.get_item(scope, step)
            elif isinstance(step, CallLocal):
                op = self.call_local(scope, step)
            else:
                op = self.call_global(scope, step)
            if op is not None:  # a step that cannot apply here is skipped
                scope.add(op)

    # -- nested scopes -------------------------------------------------------

    def local(self, spec: _LocalSpec, outer_params: Sequence[_Value]) -> _LocalFuncOp:
        params = tuple(_Value(_pick(outer_params, ref).ty, f"p{i}") for i, ref in enumerate(spec.params))
        body = _Scope(list(params))
        self.steps(body, spec.body)
        result = body.tensors[-1]
        return _LocalFuncOp(_Value(None), None, (), params, body.ops, result)

    def branch(self, spec: _IfSpec, outer: _Scope, cond: _Value, ty: relax.Type | None = None) -> _IfOp:
        # A nested If returns the type of the If it ends a branch of (``ty``).
        candidates = [v for v in outer.tensors if ty is None or _same_type(v.ty, ty)]
        target = _pick(candidates, spec.result)

        def arm(steps: Sequence[_Step], nested: _IfSpec | None) -> tuple[list[_Op], _Value]:
            # The branch starts from ``target`` so a shrunk reference (0) chains off it.
            scope = _Scope([*outer.tensors, target], list(outer.tuples), new_param=outer.new_param)
            self.steps(scope, steps)
            if nested is not None:
                inner = self.branch(nested, scope, cond, target.ty)
                scope.ops.append(inner)
                return scope.ops, inner.result
            # The most recent value of the target's type: both branches then agree on the type.
            result = next(v for v in reversed(scope.tensors) if _same_type(v.ty, target.ty))
            return scope.ops, result

        then_ops, then_result = arm(spec.then_steps, spec.nested)
        else_ops, else_result = arm(spec.else_steps, None)
        return _IfOp(_Value(target.ty), None, (cond,), then_ops, then_result, else_ops, else_result)


@dataclass
class _Plan:
    name: str
    params: list[_Value]
    casts: list[_Op]  # match_cast bindings, in a plain block of their own at the top
    segments: list[tuple[bool, list[_Op]]]  # (dataflow, ops) of the main chain
    after: list[_Op]  # ops after the main chain (the If)
    outputs: list[_Value]
    private: bool

    def exported(self, index: int) -> set[int]:
        """Ids of values of segment ``index`` read after it: its DataflowBlock outputs."""
        later = [op for _, ops in self.segments[index + 1 :] for op in ops] + self.after
        read = [v for op in later for v in op.reads()] + self.outputs
        mine = {id(op.result) for op in self.segments[index][1]}
        return {id(v) for v in read} & mine


def _symbolic_base(base: Shape, symbolic: bool) -> tuple:
    if not symbolic:
        return base
    return (tvm.tirx.Var("n", "int64"), *base[1:])


def _extra_param(kind: int, index: int, base: tuple, dtype: str) -> _Value:
    name = f"e{index}"
    if kind == 0:
        return _Value(PrimType("int64"), name)
    if kind == 1:
        return _Value(ShapeType(ndim=len(base)), name)
    if kind == 2:
        return _Value(ObjectType(), name)
    field_ty = TensorType(list(base), dtype)
    return _Value(TupleType([field_ty, field_ty]), name)


def _plan_program(
    spec: _ProgramSpec, base: Shape, planner: _Planner, name: str = "main", private: bool = False
) -> _Plan:
    shape = _symbolic_base(base, spec.symbolic)
    params = [_Value(TensorType(list(p.shape(shape)), p.dtype), f"x{i}") for i, p in enumerate(spec.params)]
    scope = _Scope(list(params), new_param=planner.new_weight)
    casts: list[_Op] = []
    declared: list[_Value] = []
    if spec.cast:
        dtype = spec.params[0].dtype
        unknown = _Value(TensorType(None, dtype, ndim=len(shape)), "y")
        declared.append(unknown)
        cast = _MatchCastOp(_Value(TensorType(list(shape), dtype), "y1"), None, (unknown,))
        casts.append(cast)
        scope.pool(cast.result)
    extras = [_extra_param(k, i, shape, spec.params[0].dtype) for i, k in enumerate(spec.extras)]
    for extra in extras:
        scope.pool(extra)  # a tuple parameter's fields are read with TupleGetItem
    if spec.local is not None:
        local_op = planner.local(spec.local, params)
        scope.ops.append(local_op)
        scope.local = local_op
    planner.steps(scope, spec.steps)
    # Segments: the chain cut at up to two drawn points, each a plain or a dataflow block.
    ops = scope.ops
    cuts = sorted(c % (len(ops) + 1) for c in spec.cuts[: len(spec.dataflow) - 1])
    bounds = [0, *cuts, len(ops)]
    segments = [(df, ops[a:b]) for df, a, b in zip(spec.dataflow, bounds, bounds[1:])]
    after: list[_Op] = []
    cond_params: list[_Value] = []
    if spec.branch is not None:
        cond_ty = PrimType("bool") if spec.prim_cond else TensorType([], "bool")
        cond = _Value(cond_ty, "cond")
        cond_params.append(cond)
        if_op = planner.branch(spec.branch, scope, cond)
        after.append(if_op)
        scope.tensors.append(if_op.result)
    outputs = [_pick(scope.tensors, ref) for ref in spec.outputs]
    all_params = params + declared + planner.weights + extras + cond_params
    return _Plan(name, all_params, casts, segments, after, outputs, private)


# ---------------------------------------------------------------------------
# Emission: plan -> relax.Function through a BlockBuilder
# ---------------------------------------------------------------------------

_Env = dict[int, relax.Expr]


def _expr(op: _Op, env: _Env, bb: relax.BlockBuilder) -> relax.Expr:
    if isinstance(op, _LocalFuncOp):
        inner = dict(env)
        params = [relax.Var(p.name, p.ty) for p in op.params]
        inner.update({id(p): v for p, v in zip(op.params, params)})
        body = _seq_expr(op.body, op.body_result, inner, bb)
        return relax.Function(params, body, op.body_result.ty, is_pure=True)
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
        var = relax.Var(bb.get_unique_name("v"), ty(value))
        bindings.append(relax.VarBinding(var, value))
        env[id(op.result)] = var
    blocks = [relax.BindingBlock(bindings)] if bindings else []
    return bb.normalize(relax.SeqExpr(blocks, env[id(result)]))


def _emit_ops(bb: relax.BlockBuilder, ops: Sequence[_Op], env: _Env, outputs: set[int]) -> None:
    for op in ops:
        value = _expr(op, env, bb)
        env[id(op.result)] = bb.emit_output(value) if id(op.result) in outputs else bb.emit(value)


def _emit_function(bb: relax.BlockBuilder, plan: _Plan) -> tvm.ir.GlobalVar | None:
    """Emit the planned function; its GlobalVar, or None when BlockBuilder found it a
    duplicate of a function already in the module (it then keeps only the first)."""
    before = {gv.name_hint for gv in bb.get().get_global_vars()}
    params = [relax.Var(p.name, p.ty) for p in plan.params]
    env: _Env = {id(p): v for p, v in zip(plan.params, params)}
    attrs = None if plan.private else {"global_symbol": plan.name}
    with bb.function(plan.name, params, attrs=attrs, pure=True, private=plan.private):
        for cast in plan.casts:
            env[id(cast.result)] = bb.match_cast(env[id(cast.operands[0])], cast.result.ty, cast.result.name)
        for index, (dataflow, ops) in enumerate(plan.segments):
            if dataflow and ops:
                with bb.dataflow():
                    _emit_ops(bb, ops, env, plan.exported(index))
            else:
                _emit_ops(bb, ops, env, set())
        _emit_ops(bb, plan.after, env, set())
        outputs = [env[id(v)] for v in plan.outputs]
        bb.emit_func_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
    added = [gv for gv in bb.get().get_global_vars() if gv.name_hint not in before]
    return added[0] if added else None


def _build_function(spec: _ProgramSpec, base: Shape, ops: Sequence[OpSpec]) -> relax.Function:
    bb = relax.BlockBuilder()
    gv = _emit_function(bb, _plan_program(spec, base, _Planner(ops, ())))
    return bb.get()[gv]


def _build_module(spec: _ModuleSpec, ops: Sequence[OpSpec]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    callees: list[_Callee] = []
    for i, helper in enumerate(spec.helpers):
        # Each helper may call the ones before it; main may call any.
        plan = _plan_program(helper, spec.base, _Planner(ops, callees), f"f{i + 1}", private=True)
        gv = _emit_function(bb, plan)
        if gv is not None:
            callees.append(_Callee(gv, tuple(p.ty for p in plan.params)))
    _emit_function(bb, _plan_program(spec.main, spec.base, _Planner(ops, callees)))
    mod = bb.get()
    return relax.transform.LegalizeOps()(mod) if spec.legalize else mod


def _check_bounds(max_params: int, min_bindings: int, max_bindings: int, max_rank: int, max_dim: int,
                  max_outputs: int, max_branch_bindings: int) -> None:  # fmt: skip
    if not 1 <= max_params:
        raise ValueError("max_params must be at least 1")
    if not 0 <= min_bindings <= max_bindings:
        raise ValueError("need 0 <= min_bindings <= max_bindings")
    if max_rank < 1 or max_dim < 1 or max_outputs < 1 or max_branch_bindings < 0:
        raise ValueError("max_rank, max_dim and max_outputs must be >= 1, max_branch_bindings >= 0")


def relax_functions(
    *,
    ops: Sequence[str | OpSpec] = DEFAULT_OPS,
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
    allow_symbolic: bool = False,
    allow_other_params: bool = False,
    allow_mixed_blocks: bool = False,
    allow_nested_if: bool = False,
) -> st.SearchStrategy[relax.Function]:
    """Random well-formed, pure Relax functions named ``main``.

    Each function takes 1 to ``max_params`` tensor parameters (``x0``,
    ``x1``, ...; shapes often equal or broadcast-compatible so binary ops
    mix them) and runs a chain of bindings over them: ops drawn from
    ``ops`` (by default every built-in op of
    :mod:`rewrite_ext.testing.opspecs`: unary and binary elementwise ops
    per dtype, ``reshape``, ``permute_dims``, comparisons and ``where``,
    ``astype``, ``sum``/``max``/``mean``, ``softmax``, ``matmul``,
    ``concat``/``split``, ``conv2d``), tuple creation and
    ``TupleGetItem``, and calls of a nested local function.  A ``matmul``
    or ``conv2d`` whose second operand no computed tensor fits reads a new
    weight parameter (``w0``, ``w1``, ...; not counted in ``max_params``).
    Optionally the chain is a DataflowBlock (then only values read after
    it are ``emit_output``-ed), and optionally an ``If`` on a trailing
    ``cond: R.Tensor((), "bool")`` parameter follows, each branch a
    SeqExpr with its own bindings and results of one type.  Some bindings
    are left unused.  The function is built through
    ``relax.BlockBuilder``, so every binding carries its inferred type, and
    it prints as TVMScript that parses back to the same function.  To build
    one, lift the local function first: ``relax.transform.LambdaLift()``
    on ``tvm.IRModule({"main": func})``, then ``relax.build(..., "llvm")``
    (:func:`rewrite_ext.testing.run` does both).

    Parameters
    ----------
    ops : sequence of str or OpSpec
        The ops to draw from: names of built-in ops
        (:data:`rewrite_ext.testing.opspecs.OP_NAMES`) or your own
        :class:`~rewrite_ext.testing.opspecs.OpSpec`.  A step whose op
        applies to no tensor computed so far takes the next op that does,
        or is skipped.  ``opspecs.ELEMENTWISE_OPS`` is what this strategy
        generated before ops were a parameter.
    max_params : int
        Most tensor parameters (at least one is drawn); ``cond``, weights
        and the parameters of ``allow_symbolic`` / ``allow_other_params``
        are extra.
    min_bindings, max_bindings : int
        Bounds on the steps of the main chain.  Each step is one binding
        of the function's top-level blocks (a step no op applies to is
        skipped); the local function definition and the ``If`` add one
        binding each, plus their own bodies.
    dtypes : sequence of str
        Parameter dtypes to draw from (``float*`` and ``int*`` dtypes);
        comparisons make ``bool`` tensors and ``astype`` others.
    max_rank, max_dim : int
        Parameters have rank 1 to ``max_rank`` and dims 1 to ``max_dim``.
    max_branch_bindings : int
        Most bindings in each ``If`` branch and in the local function body.
    max_outputs : int
        Most returned tensors; more than one are returned as a tuple.
    allow_dataflow, allow_if, allow_nested, allow_tuples : bool
        Whether DataflowBlocks, ``If``, nested local functions and tuples
        may be generated.
    allow_symbolic : bool
        Whether the leading dim of the parameters' shape may be a symbolic
        ``n`` (``R.Tensor(("n", 4))``), and a parameter ``y`` of unknown shape
        (``R.Tensor(ndim=k)``) may be bound to it by ``R.match_cast``.
    allow_other_params : bool
        Whether ``R.Prim("int64")``, ``R.Shape(ndim=k)``, ``R.Object`` and
        tuple-of-tensor parameters (``e0``, ``e1``, ...) may be added, and the
        ``If`` condition may be an ``R.Prim("bool")``.
    allow_mixed_blocks : bool
        Whether the chain may be cut into up to three blocks, each plain or
        dataflow (a ``match_cast`` always sits in a plain block of its own).
    allow_nested_if : bool
        Whether the then-branch of the ``If`` may end in another ``If``.

    Returns
    -------
    SearchStrategy[relax.Function]
        Functions with attribute ``global_symbol = "main"``; wrap one with
        ``tvm.IRModule({"main": func})`` for a module.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> from tvm import relax
    >>> from rewrite_ext.testing.strategies import relax_functions
    >>> @settings(max_examples=5)
    ... @given(relax_functions(ops=["matmul", "add"], max_bindings=10, allow_if=False))
    ... def test_my_rewrite_keeps_functions_well_formed(func):
    ...     relax.analysis.well_formed(func)  # returns None, raises when not well formed
    >>> test_my_rewrite_keeps_functions_well_formed()
    """
    _check_bounds(max_params, min_bindings, max_bindings, max_rank, max_dim, max_outputs, max_branch_bindings)
    resolved = resolve_ops(ops)
    features = _Features(
        max_params, min_bindings, max_bindings, _check_dtypes(dtypes), max_rank, max_dim,
        max_branch_bindings, max_outputs, allow_dataflow, allow_if, allow_nested, allow_tuples,
        allow_symbolic, allow_other_params, allow_mixed_blocks, allow_nested_if, n_ops=len(resolved),
    )  # fmt: skip
    specs = st.tuples(_shapes(max_rank, max_dim), _program_specs(features, entry=True))
    return specs.map(lambda s: _build_function(s[1], s[0], resolved))


def relax_modules(
    *,
    ops: Sequence[str | OpSpec] = DEFAULT_OPS,
    max_functions: int = 3,
    max_params: int = 3,
    min_bindings: int = 1,
    max_bindings: int = 20,
    dtypes: Sequence[str] = ("float32", "float16", "int32", "int8"),
    max_rank: int = 4,
    max_dim: int = 6,
    max_branch_bindings: int = 4,
    max_outputs: int = 3,
    allow_dataflow: bool = True,
    allow_if: bool = True,
    allow_nested: bool = True,
    allow_tuples: bool = True,
    allow_symbolic: bool = True,
    allow_other_params: bool = True,
    allow_mixed_blocks: bool = True,
    allow_nested_if: bool = True,
    legalize: bool | None = None,
) -> st.SearchStrategy[tvm.IRModule]:
    """Random well-formed modules of pure Relax functions calling each other.

    ``main`` (``global_symbol = "main"``) is a function of
    :func:`relax_functions` with every feature on: symbolic shapes and
    ``match_cast``, ``R.Prim``/``R.Shape``/``R.Object``/tuple parameters,
    mixed plain and dataflow blocks, an ``If`` (possibly nested) and a local
    function.  Before it come 0 to ``max_functions - 1`` private helpers
    ``f1``, ``f2``, ... (tensor parameters, possibly symbolic, no ``If``); each
    function may call the helpers before it through their GlobalVar
    (``R.call``-style ``relax.Call(gv, args)``) when its tensors fit their
    parameters.  With ``legalize`` (drawn when ``None``) the module went
    through ``relax.transform.LegalizeOps``, so the ops are ``R.call_tir`` of
    the PrimFuncs it generated.  Every module builds with ``relax.build`` for
    ``llvm`` and runs on the VM (:func:`rewrite_ext.testing.run` does both,
    choosing sizes for the symbolic dims and inputs for every parameter).

    Parameters
    ----------
    ops, max_params, min_bindings, max_bindings, dtypes, max_rank, max_dim, \
max_branch_bindings, max_outputs, allow_* : see :func:`relax_functions`
        Here per function.
    max_functions : int
        Most Relax functions in the module, ``main`` included.
    legalize : bool or None
        Whether to apply ``LegalizeOps``; ``None``: drawn.

    Returns
    -------
    SearchStrategy[tvm.IRModule]
    """
    _check_bounds(max_params, min_bindings, max_bindings, max_rank, max_dim, max_outputs, max_branch_bindings)
    if max_functions < 1:
        raise ValueError("max_functions must be at least 1")
    resolved = resolve_ops(ops)
    features = _Features(
        max_params, min_bindings, max_bindings, _check_dtypes(dtypes), max_rank, max_dim,
        max_branch_bindings, max_outputs, allow_dataflow, allow_if, allow_nested, allow_tuples,
        allow_symbolic, allow_other_params, allow_mixed_blocks, allow_nested_if, calls=max_functions > 1,
        n_ops=len(resolved),
    )  # fmt: skip
    helper = _program_specs(features, entry=False)
    specs = st.builds(
        _ModuleSpec,
        _shapes(max_rank, max_dim),
        st.lists(helper, max_size=max_functions - 1).map(tuple),
        _program_specs(features, entry=True),
        st.booleans() if legalize is None else st.just(legalize),
    )
    return specs.map(lambda spec: _build_module(spec, resolved))


# Passes of relax.build's default pipeline that lowered_functions applies: up to the
# VM-level builtins, before VMShapeLower turns shapes into VM instructions.
_LOWERING = (
    "LegalizeOps", "RewriteDataflowReshape", "ToNonDataflow", "RemovePurityChecking",
    "CallTIRRewrite", "StaticPlanBlockMemory", "LowerAllocTensor", "KillAfterLastUse",
    "LowerRuntimeBuiltin",
)  # fmt: skip


def _lower(mod: tvm.IRModule) -> tvm.IRModule:
    from .running import _has_if

    passes = []
    for name in _LOWERING:
        if name == "StaticPlanBlockMemory" and any(_has_if(f) for f in _relax_functions(mod)):
            continue  # apache/tvm#17348: planning across If branches crashes at run time
        passes.append(getattr(relax.transform, name)())
    mod = relax.transform.LambdaLift()(mod)
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def _relax_functions(mod: tvm.IRModule) -> list[relax.Function]:
    return [f for _, f in mod.functions_items() if isinstance(f, relax.Function)]


def _staged(func: relax.Function, scratch: relax.BlockBuilder, primfuncs: set) -> relax.Function:
    """``func`` with each PrimFunc call writing a fresh tensor that is then copied to its output.

    ``cls.f(args..., out)`` with ``out`` a static-shaped ``R.vm.alloc_tensor`` becomes
    ``staged = R.vm.alloc_tensor(<a storage of its own>, ...)``, ``cls.f(args..., staged)``,
    ``R.vm.copy_tensor(staged, out)``: the same results, and copies in TVM's own lowered code.
    """
    allocated: set = set()
    blocks = []
    for block in func.body.blocks:
        bindings: list[relax.Binding] = []
        for binding in block.bindings:
            value = binding.value
            calls = isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call)
            if calls and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.vm.alloc_tensor":
                allocated.add(binding.var)
            # A PrimFunc call's last argument is an output (CallTIRRewrite appends them); a Relax
            # function's arguments are inputs.
            writes = calls and isinstance(value.op, tvm.ir.GlobalVar) and value.op.name_hint in primfuncs
            out = value.args[-1] if writes and value.args else None
            out_type = ty(out) if out is not None else None
            static = (
                isinstance(out_type, TensorType)
                and out_type.shape is not None
                and all(isinstance(d, int) for d in dims(out_type))
            )
            if out is None or out not in allocated or not static:
                bindings.append(binding)
                continue
            shape, dtype = [int(d) for d in dims(out_type)], dtype_name(out_type)
            nbytes = max(data_size(math.prod(shape), dtype), 1)
            name = var_name(out)

            def bind(name_: str, expr: relax.Expr) -> relax.Var:
                expr = scratch.normalize(expr)
                var = relax.Var(name_, ty(expr))
                bindings.append(relax.VarBinding(var, expr))
                return var

            storage = bind(f"{name}_stage", _vm.alloc_storage(relax.ShapeExpr([nbytes]), 0, "uint8", "global"))
            staged = bind(f"{name}_staged", _vm.alloc_tensor(storage, 0, relax.ShapeExpr(shape), dtype))
            call = scratch.normalize(relax.Call(value.op, [*value.args[:-1], staged], value.attrs, ty_args(value)))
            bindings.append(relax.VarBinding(binding.var, call))
            bind("_", _copy_tensor()(staged, out))
        blocks.append(relax.BindingBlock(bindings))
    body = scratch.normalize(relax.SeqExpr(blocks, func.body.body))
    return relax.Function(func.params, body, ret_ty(func), func.is_pure, func.attrs)


def _with_copies(mod: tvm.IRModule) -> tvm.IRModule:
    scratch = relax.BlockBuilder()
    primfuncs = {gv.name_hint for gv, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc)}
    functions = {}
    for gv, func in mod.functions_items():
        functions[gv] = _staged(func, scratch, primfuncs) if isinstance(func, relax.Function) else func
    return tvm.IRModule(functions, attrs=mod.attrs)


def lowered_functions(*, copies: bool = False, **kwargs) -> st.SearchStrategy[tvm.IRModule]:
    """Modules of :func:`relax_modules` lowered by TVM's build pipeline to VM-level code.

    The passes of ``relax.build``'s default pipeline up to
    ``LowerRuntimeBuiltin`` (``LegalizeOps``, ``ToNonDataflow``,
    ``CallTIRRewrite``, ``StaticPlanBlockMemory``, ``LowerAllocTensor``,
    ``KillAfterLastUse``, ...), after ``LambdaLift``: impure-looking but
    ``relax.force_pure`` functions of ``R.vm.alloc_storage``,
    ``R.vm.alloc_tensor``, direct calls of PrimFuncs with their outputs as
    arguments, and ``R.vm.kill_object``, as TVM hands them to its VM code
    generator.  ``StaticPlanBlockMemory`` is left out for modules with an
    ``If`` (apache/tvm#17348).  They build with ``relax.build`` and run on the
    VM like the modules they come from.  For memory-planned functions built
    around ``R.vm.copy_tensor``, see :func:`lowered_copy_functions`.

    With ``copies``, each PrimFunc call writing a static-shaped tensor writes
    a fresh one instead (in a storage of its own), which
    ``R.vm.copy_tensor(staged, out)`` then copies to the original output: the
    same results, with the copies a DMA rewrite looks for.

    Parameters
    ----------
    copies : bool
        Stage PrimFunc outputs through ``R.vm.copy_tensor``.
    **kwargs
        Passed to :func:`relax_modules` (``legalize`` is ignored: lowering
        legalizes).

    Returns
    -------
    SearchStrategy[tvm.IRModule]
    """
    kwargs["legalize"] = False
    lowered = relax_modules(**kwargs).map(_lower)
    return lowered.map(_with_copies) if copies else lowered


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
        st.lists(_param_specs(dtypes, max_rank, max_dim, False), min_size=1, max_size=max_params).map(tuple),
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
        return data_size(math.prod(self.ty.shape), self.ty.dtype)


def _itemsize(dtype: str) -> int:
    """The alignment of a tensor of ``dtype``: its element's bytes, a byte for sub-byte types."""
    return max(tvm.DataType(dtype).bits // 8, 1)


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
    >>> from hypothesis import given, settings
    >>> from tvm import relax
    >>> from rewrite_ext.hexagon import copy_to_dma
    >>> from rewrite_ext.testing.strategies import lowered_copy_functions
    >>> @settings(max_examples=3, deadline=None)
    ... @given(lowered_copy_functions(max_copies=5))
    ... def test_my_copy_rewrite_builds(mod):
    ...     relax.build(copy_to_dma(mod), target="llvm")
    >>> test_my_copy_rewrite_builds()
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
