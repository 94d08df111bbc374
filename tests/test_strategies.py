"""The hypothesis strategies: well-formed output, every feature generated, shrinking, running."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
import tvm
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.expr_functor import PyExprVisitor, visitor

from _helpers import run_together
from rewrite_ext.testing import random_inputs as vm_inputs
from rewrite_ext.testing import run
from rewrite_ext.testing.opspecs import ELEMENTWISE_OPS, OP_NAMES, OpSpec, dims, is_float
from rewrite_ext.testing.strategies import lowered_copy_functions, lowered_functions, relax_functions, relax_modules
from rewrite_ext.compat import ObjectType, PrimType, ShapeType, TensorType, TupleType, dtype_name, ty, var_name

# Feature runs and find() only need generation (+ shrinking); hypothesis' explain phase
# replays each shrunk example many times, which dominates the cost of a find().
COLLECT = settings(max_examples=150, database=None, phases=[Phase.generate], deadline=None)
FIND = settings(max_examples=300, database=None, phases=[Phase.generate, Phase.shrink], deadline=None)


# ---------------------------------------------------------------------------
# Reading generated IR
# ---------------------------------------------------------------------------


@dataclass
class Summary:
    bindings: list[relax.VarBinding] = field(default_factory=list)
    used: set = field(default_factory=set)
    ops: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    broadcast: bool = False

    @property
    def unused(self) -> list[relax.Var]:
        return [b.var for b in self.bindings if b.var not in self.used]


def summarize(func: relax.Function) -> Summary:
    """Every binding at any depth, every var read, and op / expression kinds seen."""
    summary = Summary()

    @visitor
    class Walk(PyExprVisitor):
        def visit_var_binding_(self, binding):
            summary.bindings.append(binding)
            summary.kinds[type(binding.value).__name__] += 1
            super().visit_var_binding_(binding)

        def visit_var_(self, var):
            summary.used.add(var)

        def visit_dataflow_var_(self, var):
            summary.used.add(var)

        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op):
                summary.ops[call.op.name] += 1
                shapes = {tuple(ty(a).shape.values) for a in call.args if isinstance(ty(a), TensorType)}
                summary.broadcast |= len(call.args) == 2 and len(shapes) == 2 and "reshape" not in call.op.name
            else:
                summary.kinds["CallLocal"] += 1
            super().visit_call_(call)

    Walk().visit_expr(func)
    return summary


def present(seen: Counter) -> set[str]:
    return {key for key, count in seen.items() if count}


def dtype_of(var: relax.Var) -> str:
    return dtype_name(ty(var))


def shape_of(var: relax.Var) -> tuple[int, ...]:
    return tuple(int(d) for d in ty(var).shape.values)


# ---------------------------------------------------------------------------
# relax_functions
# ---------------------------------------------------------------------------


@settings(max_examples=40)
@given(relax_functions())
def test_relax_functions_are_well_formed_pure_and_named_main(func):
    relax.analysis.well_formed(func)
    assert func.is_pure
    assert str(func.attrs["global_symbol"]) == "main"
    tensors = [p for p in func.params if str(var_name(p)).startswith("x")]
    assert 1 <= len(tensors) <= 4
    for param in tensors:
        shape = shape_of(param)
        assert 1 <= len(shape) <= 3 and all(1 <= d <= 8 for d in shape)
    for param in func.params:
        # The others: the If condition, and weights of matmul / conv2d, read by those ops.
        name = str(var_name(param))
        assert name.startswith("x") or (name == "cond" and shape_of(param) == ()) or name.startswith("w"), name


@settings(max_examples=25)
@given(relax_functions(max_bindings=12))
def test_relax_functions_round_trip_through_tvmscript(func):
    # A user pastes a printed failing example into a test: it must parse back to the same IR.
    tvm.ir.assert_structural_equal(tvm.script.from_source(func.script()), func)


@settings(max_examples=5, deadline=None)
@given(relax_functions(max_bindings=15))
def test_relax_functions_build_after_lambda_lift(func):
    # What the docstring promises users who want to run a generated function.
    # run_together works around apache/tvm#17348 (StaticPlanBlockMemory and If branches).
    got = run_together({"main": func}, random_inputs(func, 0))["main"]
    body = func.body.body
    declared = [ty(f) for f in body.fields] if isinstance(body, relax.Tuple) else [ty(body)]
    assert [(g.shape, str(g.dtype)) for g in got] == [
        (tuple(int(d) for d in ty.shape.values), dtype_name(ty)) for ty in declared
    ]


@settings(max_examples=30)
@given(
    relax_functions(
        max_params=2,
        min_bindings=3,
        max_bindings=6,
        dtypes=("int32",),
        max_rank=2,
        max_dim=3,
        allow_dataflow=False,
        allow_if=False,
        allow_nested=False,
        allow_tuples=False,
    )
)
def test_relax_functions_respect_their_bounds(func):
    summary = summarize(func)
    tensors = [p for p in func.params if not str(var_name(p)).startswith("w")]  # w*: matmul weights
    assert 1 <= len(tensors) <= 2
    assert 3 <= len(summary.bindings) <= 6
    assert all(dtype_of(p) == "int32" and len(shape_of(p)) <= 2 and max(shape_of(p)) <= 3 for p in tensors)
    assert all(not isinstance(block, relax.DataflowBlock) for block in func.body.blocks)
    assert not {"If", "Function", "Tuple", "TupleGetItem"} & set(summary.kinds)


def test_relax_functions_generate_every_feature():
    seen: Counter = Counter()

    @COLLECT
    @given(relax_functions())
    def collect(func):
        summary = summarize(func)
        seen.update(summary.kinds)
        seen.update(summary.ops)
        seen.update(dtype_of(p) for p in func.params)
        seen["dataflow"] += any(isinstance(b, relax.DataflowBlock) for b in func.body.blocks)
        seen["unused binding"] += bool(summary.unused)
        seen["broadcast"] += summary.broadcast
        seen["tuple output"] += isinstance(func.body.body, relax.Tuple)
        seen["several params"] += len(func.params) > 1
        seen["long chain"] += len(summary.bindings) >= 10
        seen["integer-only op"] += bool({"relax.bitwise_not", "relax.bitwise_and", "relax.bitwise_xor"} & set(summary.ops))

    collect()
    wanted = {
        "dataflow", "If", "Function", "CallLocal", "Tuple", "TupleGetItem", "unused binding",
        "broadcast", "tuple output", "several params", "long chain", "float32", "int32", "bool",
        "relax.reshape", "relax.permute_dims", "relax.exp", "integer-only op", "relax.add",
    }  # fmt: skip
    assert wanted <= present(seen), f"never generated: {wanted - present(seen)}"


def test_relax_functions_shrink_to_a_small_function():
    minimal = find(relax_functions(), lambda f: len(summarize(f).bindings) >= 5, settings=FIND)
    summary = summarize(minimal)
    assert len(summary.bindings) == 5
    assert len(minimal.params) <= 2  # one tensor, and the If condition if the If survived
    assert len(minimal.script().splitlines()) <= 16, minimal.script()


def test_relax_functions_shrink_a_feature_to_its_smallest_form():
    has_if = find(relax_functions(), lambda f: "If" in summarize(f).kinds, settings=FIND)
    summary = summarize(has_if)
    # The If binding, its two branch results... and the one binding of the main chain.
    assert summary.kinds["If"] == 1 and len(summary.bindings) <= 2, has_if.script()
    assert [shape_of(p) for p in has_if.params] == [(1,), ()]


def test_relax_functions_reject_bad_bounds():
    with pytest.raises(ValueError):
        relax_functions(min_bindings=5, max_bindings=2)
    with pytest.raises(ValueError):
        relax_functions(dtypes=("bool",))
    with pytest.raises(ValueError):
        lowered_copy_functions(min_copies=0)


# ---------------------------------------------------------------------------
# lowered_copy_functions: a numpy interpreter of the generated IR as the reference
# ---------------------------------------------------------------------------

NUMPY_OPS = {
    "negative": np.negative,
    "abs": np.abs,
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}


@dataclass(frozen=True)
class View:
    """A tensor living in a storage (a uint8 numpy array) at a byte offset."""

    storage: np.ndarray
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def read(self) -> np.ndarray:
        data = self.storage[self.offset : self.offset + self.nbytes].copy()
        return data.view(self.dtype).reshape(self.shape)

    def write(self, value: np.ndarray) -> None:
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        assert raw.size == self.nbytes, "copy_tensor between different byte sizes"
        self.storage[self.offset : self.offset + self.nbytes] = raw


class NumpyInterpreter:
    """Runs a generated lowered ``main`` on numpy, storages as byte arrays.

    Written against the IR, not against the strategy's internals: it reads
    ``alloc_storage``/``alloc_tensor`` offsets, models copies as byte writes into
    the storage and so models overwrites and aliasing as the VM does.  It also
    records every tensor's region to check that none overlap.
    """

    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self.regions: list[tuple[int, int, int, int]] = []  # (storage id, start, end, storage size)
        self.calls: Counter = Counter()

    def value(self, env: dict, expr: relax.Expr) -> np.ndarray:
        got = env[expr]
        return got.read() if isinstance(got, View) else got

    def run(self, *args: np.ndarray) -> list[np.ndarray]:
        func = self.mod["main"]
        env: dict = dict(zip(func.params, args))
        for block in func.body.blocks:
            for binding in block.bindings:
                env[binding.var] = self.step(env, binding)
        body = func.body.body
        outputs = body.fields if isinstance(body, relax.Tuple) else [body]
        return [self.value(env, out) for out in outputs]

    def step(self, env: dict, binding: relax.VarBinding):
        call = binding.value
        if isinstance(call, relax.Var):
            return env[call]
        name = call.op.name
        self.calls[name] += 1
        if name == "relax.vm.alloc_storage":
            assert str(call.args[3].value) == "global"
            return np.zeros(int(call.args[0].values[0]), dtype=np.uint8)
        if name == "relax.vm.alloc_tensor":
            storage = env[call.args[0]]
            view = View(storage, int(call.args[1].value), shape_of(binding.var), dtype_of(binding.var))
            self.regions.append((id(storage), view.offset, view.offset + view.nbytes, storage.size))
            return view
        if name == "relax.vm.copy_tensor":
            src, dst = call.args
            assert isinstance(env[dst], View), "a copy writes only into allocated tensors"
            env[dst].write(self.value(env, src))
            return None
        if name == "relax.memory.ensure_zero_offset":
            return self.value(env, call.args[0])
        if name == "relax.call_tir":  # legalize=True: PrimFuncs are named after their op
            op_name = re.sub(r"^tir_|\d+$", "", str(call.args[0].name_hint))
            args = call.args[1].fields
        else:
            op_name, args = name.removeprefix("relax."), call.args
        return NUMPY_OPS[op_name](*(self.value(env, a) for a in args))

    def assert_no_overlap(self) -> None:
        by_storage: dict[int, list[tuple[int, int, int]]] = {}
        for storage, start, end, size in self.regions:
            assert 0 <= start and end <= size, "a tensor reaches past its storage"
            by_storage.setdefault(storage, []).append((start, end, size))
        for regions in by_storage.values():
            regions.sort()
            for (_, end, _), (start, _, _) in zip(regions, regions[1:]):
                assert end <= start, f"overlapping tensors in one storage: {regions}"


def random_inputs(func: relax.Function, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = []
    for param in func.params:
        shape, dtype = shape_of(param), dtype_of(param)
        if dtype.startswith("float"):
            inputs.append(rng.standard_normal(shape).astype(dtype))
        else:
            inputs.append(rng.integers(-100, 100, size=shape).astype(dtype))
    return inputs


def run_on_vm(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    executable = relax.build(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    result = vm["main"](*(tvm.runtime.tensor(x) for x in inputs))
    results = [result] if isinstance(result, tvm.runtime.Tensor) else list(result)
    return [r.numpy() for r in results]


def copies_of(mod: tvm.IRModule) -> int:
    return summarize(mod["main"]).ops["relax.vm.copy_tensor"]


@settings(max_examples=40)
@given(lowered_copy_functions())
def test_lowered_copy_functions_are_well_formed_impure_and_plausible(mod):
    func = mod["main"]
    relax.analysis.well_formed(mod)
    assert not func.is_pure and str(func.attrs["global_symbol"]) == "main"
    assert [str(gv.name_hint) for gv in mod.get_global_vars()] == ["main"]
    assert all(not isinstance(block, relax.DataflowBlock) for block in func.body.blocks)
    assert 1 <= copies_of(mod) <= 20
    interpreter = NumpyInterpreter(mod)
    interpreter.run(*random_inputs(func, 0))
    interpreter.assert_no_overlap()
    # The first result is a copy destination: the result depends on the copies.
    first = func.body.body.fields[0] if isinstance(func.body.body, relax.Tuple) else func.body.body
    definition = next(b.value for blk in func.body.blocks for b in blk.bindings if b.var.same_as(first))
    assert definition.op.name == "relax.vm.alloc_tensor"


@settings(max_examples=10, deadline=None)
@given(lowered_copy_functions(), st.integers(0, 2**16))
def test_lowered_copy_functions_run_on_the_vm_like_numpy(mod, seed):
    inputs = random_inputs(mod["main"], seed)
    expected = NumpyInterpreter(mod).run(*inputs)
    got = run_on_vm(mod, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)


@settings(max_examples=4, deadline=None)
@given(lowered_copy_functions(max_copies=8, legalize=True), st.integers(0, 2**16))
def test_legalized_lowered_copy_functions_hold_primfuncs_and_run(mod, seed):
    relax.analysis.well_formed(mod)
    summary = summarize(mod["main"])
    assert not {op for op in summary.ops if op.removeprefix("relax.") in NUMPY_OPS}
    primfuncs = {str(gv.name_hint) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    callees = {
        str(b.value.args[0].name_hint)
        for b in summary.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == "relax.call_tir"
    }
    assert callees == primfuncs
    inputs = random_inputs(mod["main"], seed)
    for g, e in zip(run_on_vm(mod, inputs), NumpyInterpreter(mod).run(*inputs)):
        np.testing.assert_array_equal(g, e)


@settings(max_examples=30)
@given(lowered_copy_functions(max_copies=3, min_copies=2, dtypes=("int32",), max_params=1, max_storages=1))
def test_lowered_copy_functions_respect_their_bounds(mod):
    func = mod["main"]
    assert 2 <= copies_of(mod) <= 3
    assert len(func.params) == 1 and dtype_of(func.params[0]) == "int32"
    assert summarize(func).ops["relax.vm.alloc_storage"] == 1


def test_lowered_copy_functions_generate_every_feature():
    seen: Counter = Counter()

    @COLLECT
    @given(lowered_copy_functions())
    def collect(mod):
        func = mod["main"]
        interpreter = NumpyInterpreter(mod)
        interpreter.run(*random_inputs(func, 0))
        seen.update(interpreter.calls)
        seen.update(dtype_of(p) for p in func.params)
        offsets = [start for _, start, _, _ in interpreter.regions]
        seen["aligned offset"] += any(o and o % 64 == 0 for o in offsets)
        seen["unaligned offset"] += any(o % 64 for o in offsets)
        seen["several storages"] += interpreter.calls["relax.vm.alloc_storage"] > 1
        seen["overwrite"] += interpreter.calls["relax.vm.copy_tensor"] > interpreter.calls["relax.vm.alloc_tensor"]
        seen["many copies"] += interpreter.calls["relax.vm.copy_tensor"] >= 6
        summary = summarize(func)
        seen["broadcast"] += summary.broadcast
        seen["reshaped copy"] += any(
            isinstance(b.value, relax.Call) and b.value.op.name == "relax.vm.copy_tensor"
            and shape_of(b.value.args[0]) != shape_of(b.value.args[1])
            for b in summary.bindings
        )  # fmt: skip

    collect()
    wanted = {
        "relax.memory.ensure_zero_offset", "relax.add", "relax.multiply", "relax.negative",
        "aligned offset", "unaligned offset", "several storages", "overwrite", "many copies",
        "broadcast", "reshaped copy", "float32", "int32",
    }  # fmt: skip
    assert wanted <= present(seen), f"never generated: {wanted - present(seen)}"


def test_lowered_copy_functions_shrink_to_a_small_module():
    minimal = find(lowered_copy_functions(), lambda m: copies_of(m) >= 3, settings=FIND)
    func = minimal["main"]
    summary = summarize(func)
    assert copies_of(minimal) == 3
    assert len(func.params) == 1
    assert summary.ops["relax.vm.alloc_storage"] == 1
    assert not {op for op in summary.ops if op.removeprefix("relax.") in NUMPY_OPS}, minimal.script()


# ---------------------------------------------------------------------------
# ops=: which ops, and your own
# ---------------------------------------------------------------------------


def ops_in(func_or_mod) -> set[str]:
    funcs = func_or_mod.functions_items() if isinstance(func_or_mod, tvm.IRModule) else [(None, func_or_mod)]
    found: set[str] = set()
    for _, f in funcs:
        if isinstance(f, relax.Function):
            found |= present(summarize(f).ops)
    return found


def test_relax_functions_generate_every_default_op():
    seen: Counter = Counter()

    # 33 ops, a few bindings per function: more examples than the other feature runs.
    @settings(COLLECT, max_examples=400)
    @given(relax_functions(max_bindings=30, max_rank=4))  # conv2d reads rank-4 tensors
    def collect(func):
        seen.update(summarize(func).ops)

    collect()
    wanted = {f"relax.{name}" for name in OP_NAMES} - {"relax.softmax", "relax.conv2d"}
    wanted |= {"relax.nn.softmax", "relax.nn.conv2d"}
    assert wanted <= present(seen), f"never generated: {wanted - present(seen)}"


@settings(max_examples=30)
@given(relax_functions(ops=["matmul", "sum"], max_bindings=8, allow_if=False, allow_nested=False, allow_tuples=False))
def test_ops_choose_the_ops(func):
    assert ops_in(func) <= {"relax.matmul", "relax.sum"}
    assert ops_in(func)  # every step found one of them to apply


RELU = OpSpec("relu", lambda x, choice: relax.op.nn.relu(x), accepts=is_float)


def test_a_users_op_spec_is_generated_and_a_bad_one_is_named():
    func = find(relax_functions(ops=[RELU, "add"], dtypes=("float32",)), lambda f: "relax.nn.relu" in ops_in(f), settings=FIND)
    assert "R.nn.relu" in func.script()
    bad = OpSpec("bad", lambda x, choice: relax.op.matmul(x, x), accepts=lambda t: t.ndim == 2 and dims(t)[0] != dims(t)[1])
    with pytest.raises(ValueError, match="OpSpec 'bad' made a call TVM rejects"):
        find(relax_functions(ops=[bad], dtypes=("float32",), max_rank=2), lambda f: False, settings=FIND)


def test_unknown_ops_are_rejected_with_the_known_names():
    with pytest.raises(ValueError, match="unknown op 'matmull': use one of exp, negative"):
        relax_functions(ops=["matmull"])
    with pytest.raises(ValueError, match="at least one op"):
        relax_modules(ops=[])


def test_elementwise_ops_are_what_relax_functions_generated_before():
    seen: Counter = Counter()

    @COLLECT
    @given(relax_functions(ops=ELEMENTWISE_OPS))
    def collect(func):
        seen.update(summarize(func).ops)

    collect()
    assert present(seen) <= {f"relax.{name}" for name in ELEMENTWISE_OPS}


# ---------------------------------------------------------------------------
# relax_modules: every feature, well formed, and running on the VM
# ---------------------------------------------------------------------------


def module_features(mod: tvm.IRModule) -> Counter:
    seen: Counter = Counter()
    relax_funcs = {str(gv.name_hint): f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    seen["several functions"] += len(relax_funcs) > 1
    seen["PrimFunc"] += any(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
    for name, func in relax_funcs.items():
        summary = summarize(func)
        seen.update(summary.kinds)
        seen.update(summary.ops)
        kinds = {type(b).__name__ for b in func.body.blocks}
        seen["mixed blocks"] += kinds == {"DataflowBlock", "BindingBlock"}
        seen["GlobalVar call"] += any(
            isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)
            and isinstance(mod[b.value.op], relax.Function) for b in summary.bindings
        )  # fmt: skip
        seen["nested If"] += any(
            isinstance(b.value, relax.If) and any(isinstance(i.value, relax.If) for i in summarize(b.value.true_branch).bindings)
            for b in summary.bindings
        )  # fmt: skip
        for param in func.params:
            param_type = ty(param)
            if isinstance(param_type, TensorType):
                seen[dtype_name(param_type)] += 1
                seen["symbolic shape"] += param_type.shape is not None and any(
                    isinstance(d, tvm.tirx.Var) for d in param_type.shape.values
                )
                seen["unknown shape"] += param_type.shape is None
                seen["scalar"] += (
                    param_type.shape is not None and len(param_type.shape.values) == 0 and var_name(param) != "cond"
                )
            else:
                seen[type(param_type).__name__] += 1
            seen["Prim condition"] += var_name(param) == "cond" and isinstance(param_type, PrimType)
        seen["match_cast"] += any(isinstance(b, relax.MatchCast) for blk in func.body.blocks for b in blk.bindings)
    return seen


def test_relax_modules_generate_every_feature():
    seen: Counter = Counter()

    @COLLECT
    @given(relax_modules())
    def collect(mod):
        seen.update(module_features(mod))

    collect()
    wanted = {
        "several functions", "GlobalVar call", "PrimFunc", "relax.call_tir", "mixed blocks", "nested If",
        "If", "Function", "CallLocal", "match_cast", "symbolic shape", "unknown shape", "scalar",
        PrimType.__name__, ShapeType.__name__, ObjectType.__name__, TupleType.__name__, "Prim condition",
        "float32", "float16", "int32", "int8", "relax.matmul", "relax.nn.softmax",
    }  # fmt: skip
    assert wanted <= present(seen), f"never generated: {wanted - present(seen)}"


@settings(max_examples=40)
@given(relax_modules())
def test_relax_modules_are_well_formed_with_a_main_and_private_helpers(mod):
    relax.analysis.well_formed(mod)
    relax_funcs = {str(gv.name_hint): f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    assert str(relax_funcs["main"].attrs["global_symbol"]) == "main"
    assert set(relax_funcs) <= {"main", "f1", "f2"}
    for name, func in relax_funcs.items():
        assert func.is_pure
        if name != "main":
            assert func.attrs is None or "global_symbol" not in func.attrs


def run_kinds():
    yield "relax_functions, every option", relax_functions(
        max_bindings=12, allow_symbolic=True, allow_other_params=True, allow_mixed_blocks=True, allow_nested_if=True
    )
    yield "relax_modules", relax_modules(max_bindings=10, legalize=False)
    yield "relax_modules, legalized", relax_modules(max_bindings=10, legalize=True)
    yield "lowered_functions", lowered_functions(max_bindings=10)
    yield "lowered_functions, copies", lowered_functions(copies=True, max_bindings=10)


@pytest.mark.parametrize("kind,strategy", list(run_kinds()), ids=[k for k, _ in run_kinds()])
def test_every_kind_builds_and_runs_on_the_vm(kind, strategy):
    @settings(max_examples=4, deadline=None)  # each example builds twice: ~1 s
    @given(strategy, st.integers(0, 2**16))
    def builds_and_runs(program, seed):
        relax.analysis.well_formed(program)
        inputs = vm_inputs(program, seed)
        outputs = run(program, inputs)
        assert len(outputs) >= 1
        assert all(isinstance(o, np.ndarray) for o in outputs), [type(o) for o in outputs]
        # Running twice gives the same results: nothing in the generated IR is nondeterministic.
        for again, first in zip(run(program, inputs), outputs, strict=True):
            np.testing.assert_array_equal(again, first)

    builds_and_runs()


@settings(max_examples=15)
@given(lowered_functions(max_bindings=8))
def test_lowered_functions_hold_vm_level_code(mod):
    relax.analysis.well_formed(mod)
    main = mod["main"]
    ops = present(summarize(main).ops)
    assert not {"relax.call_tir", "relax.builtin.alloc_tensor"} & ops, ops
    assert str(main.attrs["relax.force_pure"]) in ("1", "True")


@settings(max_examples=15)
@given(lowered_functions(copies=True, max_bindings=8))
def test_lowered_functions_with_copies_stage_every_static_primfunc_output(mod):
    relax.analysis.well_formed(mod)
    main = summarize(mod["main"])
    calls = [b.value for b in main.bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)
             and isinstance(mod[b.value.op], tvm.tirx.PrimFunc)]  # fmt: skip
    copies = [b.value for b in main.bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
              and b.value.op.name == "relax.vm.copy_tensor"]  # fmt: skip
    staged = [c for c in calls if str(var_name(c.args[-1])).endswith("_staged")]
    assert len(copies) == len(staged)
    assert [str(var_name(c.args[0])) for c in copies] == [str(var_name(c.args[-1])) for c in staged]


def test_relax_modules_shrink_to_a_small_module():
    # A property failing on every module with a matmul shrinks to the matmul and little else.
    minimal = find(relax_modules(), lambda m: "relax.matmul" in ops_in(m), settings=FIND)
    relax_funcs = [f for _, f in minimal.functions_items() if isinstance(f, relax.Function)]
    assert len(relax_funcs) == 1
    bindings = summarize(relax_funcs[0]).bindings
    # One tensor parameter, the matmul and at most a few bindings before it; no helper, If,
    # local function or extra parameter survives.
    assert len(bindings) <= 4 and len(relax_funcs[0].params) == 1, minimal.script()
    assert len(minimal.script().splitlines()) <= 12, minimal.script()
