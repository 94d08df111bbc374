"""rewrite_call on the IR people actually rewrite: lowered, impure, TVM's own, TVM's rewriters.

Each section is one of the faults issue 16 lists under "What is wrong today", and states what
the rewrite must do instead.  On the engine before it (1e01fc3) every section fails; what
passed there already is kept as regression cover: the controls (a match after the last impure
binding, an exception in a rewriter), copy_to_dma on lowered IR, the R.Shape, symbolic-shape
and packed-call functions (R.Prim, R.Object, R.Callable and tuples of them failed), and TVM's
RemoveRedundantReshape.

1. Impure calls: a match never sees through a binding computed before an impure binding
   (memory written in place makes the same expression differ after it); the VM agrees.
2. TVM's own lowered IR (a ``tvm.relax.frontend.nn`` model through TVM's lowering passes):
   a rewriter emitting impure calls, and ``copy_to_dma``, work on it, and the result runs.
3. Parameters of every kind (``R.Prim``, ``R.Object``, ``R.Callable``, ``R.Shape``, tuples,
   symbolic shapes) and packed calls do not stop a rewrite.
4. Rewriters written for ``tvm.relax.dpl.rewrite_call`` that read matched sub-calls
   (``.attrs``, ``.op``, ``.args``), TVM's in-tree ones included, give TVM's results.
5. A ``match_cast`` binding is not seen through.
6. A rewriter may emit before a binding and keep it.
7. A misbehaving rewriter is a RewriteError naming function, binding and pattern (or its own
   KeyboardInterrupt / SystemExit), the input is untouched and the next rewrite works.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_gv, is_op, wildcard
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext
from _helpers import Snapshot, all_bindings, assert_same_results, binding_kinds, op_name, run_together, spelled_as_026
from rewrite_ext import RewriteCall, RewriteError, rewrite_call
from rewrite_ext.hexagon import CopyToDMA, copy_to_dma, cpu_dma
from rewrite_ext.ops import copy_tensor
from rewrite_ext.compat import TY_ARGS, VOID_TY_ARGS, ObjectType, TupleType, ret_ty, ty

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)
P, Q, W = wildcard(), wildcard(), wildcard()
MUL = is_op("relax.multiply")(P, Q)
ADD_OF_MUL = is_op("relax.add")(MUL, W)

VOID = TupleType([])


def subtract_of_multiply(orig, m):
    """add(multiply(p, q), w) -> subtract(multiply(p, q), negative(w)), multiply rebuilt."""
    return relax.op.subtract(relax.op.multiply(m[P], m[Q]), relax.op.negative(m[W]))


def to_subtract(orig, m):
    return relax.op.subtract(m[X], m[Y])


def packed_call(name: str, *args: relax.Expr) -> relax.Call:
    """A void ``R.call_packed(name, *args)``: impure, as TVM types every call_packed."""
    return relax.Call(relax.ExternFunc(name), list(args), **{TY_ARGS: [VOID]})


class Trace:
    """A packed function ``coretests.trace`` that counts its calls (registered while in use)."""

    name = "coretests.trace"

    def __init__(self) -> None:
        self.calls = 0

    def __enter__(self) -> Trace:
        def trace(*args):
            self.calls += 1

        tvm.register_global_func(self.name, trace, override=True)
        return self

    def __exit__(self, *exc) -> None:
        tvm_ffi.remove_global_func(self.name)


def offered(pattern, func) -> list[relax.Expr]:
    """The values rewrite_call offers a rewriter that declines them all."""
    seen: list[relax.Expr] = []

    def rewriter(orig, m):
        seen.append(orig)
        return None

    assert rewrite_call(pattern, rewriter, func).same_as(func)
    return seen


# ---------------------------------------------------------------------------------------------
# 1. Impure calls: nothing computed before one is seen through from after it
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def copies_impure(x: R.Tensor((4,), "int32"), y: R.Tensor((4,), "int32"), a: R.Tensor((4,), "int32")):
    R.vm.copy_tensor(x, a)
    lv0 = R.multiply(a, a)
    R.vm.copy_tensor(y, a)
    lv1 = R.add(lv0, y)
    return lv1


@R.function
def copies_force_pure(x: R.Tensor((4,), "int32"), y: R.Tensor((4,), "int32"), a: R.Tensor((4,), "int32")):
    R.func_attr({"relax.force_pure": True})
    R.vm.copy_tensor(x, a)
    lv0 = R.multiply(a, a)
    R.vm.copy_tensor(y, a)
    lv1 = R.add(lv0, y)
    return lv1


@pytest.mark.parametrize("func", [copies_impure, copies_force_pure], ids=["pure_false", "force_pure"])
def test_a_rewrite_across_an_in_place_copy_computes_what_the_original_computes(func):
    out = rewrite_call(ADD_OF_MUL, subtract_of_multiply, func)
    relax.analysis.well_formed(out)

    x, y = np.arange(4, dtype="int32"), np.full(4, 10, dtype="int32")
    results = run_together({"original": func, "rewritten": out}, [x, y, np.zeros(4, "int32")])
    # lv0 is x * x (a held x then), whatever a holds when lv1 is computed.
    np.testing.assert_array_equal(results["original"][0], x * x + y)
    np.testing.assert_array_equal(results["rewritten"][0], results["original"][0])


@R.function(pure=False)
def packed_between(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    lv0 = R.multiply(x, x)
    R.call_packed("coretests.touch", x, **VOID_TY_ARGS)
    lv1 = R.add(lv0, y)
    return lv1


@R.function(pure=False)
def impure_value_between(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    lv0 = R.multiply(x, x)
    z = R.call_packed("coretests.fresh", x, **{TY_ARGS: R.Tensor((4,), "float32")})
    lv1 = R.add(lv0, z)
    return lv1


@R.function(pure=False)
def impure_deeper_down(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    e = R.exp(x)
    R.call_packed("coretests.touch", x, **VOID_TY_ARGS)
    m = R.multiply(e, e)
    lv1 = R.add(m, y)
    return lv1


@pytest.mark.parametrize(
    "func",
    [copies_impure, copies_force_pure, packed_between, impure_value_between],
    ids=["copy_tensor", "copy_tensor_force_pure", "void_call_packed", "call_packed_with_a_value"],
)
def test_a_match_never_sees_through_a_binding_before_an_impure_one(func):
    assert offered(ADD_OF_MUL, func) == []


def test_an_impure_binding_between_two_levels_of_a_pattern_stops_the_deeper_level():
    deep = is_op("relax.add")(is_op("relax.multiply")(is_op("relax.exp")(P), Q), W)
    assert offered(deep, impure_deeper_down) == []
    # The level above the impure binding is still seen through.
    [value] = offered(ADD_OF_MUL, impure_deeper_down)
    assert str(value) == "R.add(m, y)"


def test_a_match_sees_through_bindings_after_the_last_impure_one():
    @R.function(pure=False)
    def f(x: R.Tensor((4,), "int32"), y: R.Tensor((4,), "int32"), a: R.Tensor((4,), "int32")):
        R.vm.copy_tensor(x, a)
        R.vm.copy_tensor(y, a)
        lv0 = R.multiply(a, a)
        lv1 = R.add(lv0, y)
        return lv1

    [value] = offered(ADD_OF_MUL, f)
    assert str(value) == "R.add(lv0, y)"
    out = rewrite_call(ADD_OF_MUL, subtract_of_multiply, f)
    relax.analysis.well_formed(out)
    x, y = np.arange(4, dtype="int32"), np.full(4, 10, dtype="int32")
    results = run_together({"original": f, "rewritten": out}, [x, y, np.zeros(4, "int32")])
    np.testing.assert_array_equal(results["rewritten"][0], results["original"][0])


# ---------------------------------------------------------------------------------------------
# 2. TVM's own lowered IR
# ---------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.relu(self.fc1(x)))


# TVM's default build pipeline (relax/pipeline.py) up to the end of memory planning, and all of it.
MEMORY_PLANNED = [
    relax.transform.LegalizeOps(),
    relax.transform.RewriteDataflowReshape(),
    relax.transform.ToNonDataflow(),
    relax.transform.RemovePurityChecking(),
    relax.transform.CallTIRRewrite(),
    relax.transform.StaticPlanBlockMemory(),
    relax.transform.LowerAllocTensor(),
    relax.transform.KillAfterLastUse(),
]


def lowered_mlp(stage: str) -> tvm.IRModule:
    mod, _ = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((1, 4), "float32")}})
    with tvm.target.Target("llvm"):
        if stage == "memory_planned":
            return tvm.transform.Sequential(MEMORY_PLANNED)(mod)
        return relax.get_pipeline("default")(mod)


@pytest.fixture(scope="module", params=["memory_planned", "vm_lowered"])
def lowered(request) -> tuple[str, tvm.IRModule]:
    mod = lowered_mlp(request.param)
    forward = mod["forward"]
    # What the test relies on: TVM's lowering leaves a force_pure function with impure calls.
    assert forward.is_pure and bool(forward.attrs["relax.force_pure"])
    assert any(op_name(b.value) in ("memory.kill_tensor", "vm.kill_object") for b in all_bindings(forward))
    return request.param, mod


def run_forward(mod: tvm.IRModule, stage: str, *, dma: bool = False):
    """Build ``mod`` (a fully lowered one without re-running the pipeline) and run forward."""
    pipeline = None if stage == "vm_lowered" else "default"
    executable = relax.build(mod, target="llvm", relax_pipeline=pipeline)
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in ty(p).shape.values]).astype("float32"))
        for p in mod["forward"].params
    ]
    if not dma:
        return relax.VirtualMachine(executable, tvm.cpu())["forward"](*args).numpy()
    with cpu_dma() as engine:
        out = relax.VirtualMachine(executable, tvm.cpu())["forward"](*args).numpy()
    return out, engine


KERNEL_CALL = is_gv()(varg_default_wildcard=True)
"""A call of a PrimFunc by its GlobalVar: what CallTIRRewrite makes of each call_tir."""


def trace_each_kernel(orig, m, builder):
    builder.emit(packed_call(Trace.name, orig.args[0]))
    return orig


def is_trace(value: relax.Expr) -> bool:
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, relax.ExternFunc)
        and value.op.global_symbol == Trace.name
    )


def kernel_calls(func: relax.Function) -> list[relax.Binding]:
    return [b for b in all_bindings(func) if is_kernel_call(b.value)]


def is_kernel_call(value: relax.Expr, names: tuple[str, ...] | None = None) -> bool:
    """Whether ``value`` calls a PrimFunc by its GlobalVar (one of ``names``, if given)."""
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, relax.GlobalVar)
        and (names is None or value.op.name_hint in names)
    )


def test_a_rewriter_emitting_impure_calls_into_tvms_lowered_ir_builds_and_runs(lowered):
    stage, mod = lowered
    before = Snapshot.of(mod)
    out = rewrite_call(KERNEL_CALL, trace_each_kernel, mod)
    before.assert_unchanged(mod)
    relax.analysis.well_formed(out)

    kernels = kernel_calls(mod["forward"])
    bindings = out["forward"].body.blocks[0].bindings
    traced = [i for i, b in enumerate(bindings) if is_trace(b.value)]
    assert len(traced) == len(kernels) > 0
    assert all(isinstance(bindings[i + 1].value.op, relax.GlobalVar) for i in traced)

    expected = run_forward(mod, stage)
    with Trace() as trace:
        got = run_forward(out, stage)
    assert trace.calls == len(kernels)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def with_copies(mod: tvm.IRModule, stage: str, kernels: tuple[str, ...] = ("relu", "add1")) -> tvm.IRModule:
    """``mod`` with each named kernel reading a copy of its first argument, made by copy_tensor.

    The copy goes to a tensor of its own storage, allocated as TVM's lowering allocates at
    ``stage`` (``R.memory.*`` after memory planning, ``R.vm.*`` after VM lowering).
    """
    vm_lowered = stage == "vm_lowered"
    func = mod["forward"]
    bb = relax.BlockBuilder(mod)
    bindings: list[relax.Binding] = []
    for binding in func.body.blocks[0].bindings:
        value = binding.value
        if not is_kernel_call(value, kernels):
            bindings.append(binding)
            continue
        src = value.args[0]
        shape = [int(d) for d in ty(src).shape.values]
        storage = relax.Var("copy_storage", ObjectType())
        size = relax.ShapeExpr([4 * int(np.prod(shape))])
        dst = relax.Var("copy_dst", ty(src))
        if vm_lowered:
            alloc = relax.op.vm.alloc_storage(size, 0, "uint8")
            tensor = relax.op.vm.alloc_tensor(storage, 0, relax.ShapeExpr(shape), "float32")
        else:
            alloc = relax.op.memory.alloc_storage(size, 0, "global", "uint8")
            tensor = relax.op.memory.alloc_tensor(storage, 0, relax.ShapeExpr(shape), "float32")
        bindings += [
            relax.VarBinding(storage, bb.normalize(alloc)),
            relax.VarBinding(dst, bb.normalize(tensor)),
            relax.VarBinding(relax.Var("_", VOID), bb.normalize(copy_tensor(src, dst))),
            relax.VarBinding(binding.var, bb.normalize(relax.Call(value.op, [dst, *value.args[1:]]))),
        ]
    body = relax.SeqExpr([relax.BindingBlock(bindings)], func.body.body)
    new = bb.normalize(relax.Function(func.params, body, ret_ty(func), func.is_pure, func.attrs))
    functions = dict(mod.functions_items())
    functions[mod.get_global_var("forward")] = new
    out = tvm.IRModule(functions, attrs=mod.attrs)
    relax.analysis.well_formed(out)
    return out


def test_copy_to_dma_on_tvms_lowered_ir_builds_and_runs_under_cpu_dma(lowered):
    stage, mod = lowered
    copied = with_copies(mod, stage)
    before = Snapshot.of(copied)
    out = copy_to_dma(copied)
    before.assert_unchanged(copied)
    relax.analysis.well_formed(out)
    assert binding_kinds(out["forward"])["copy_tensor"] == 0

    expected = run_forward(mod, stage)
    got, engine = run_forward(out, stage, dma=True)
    assert engine.copies == engine.completed == 2
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_tracing_then_copy_to_dma_in_one_sequential_on_tvms_lowered_ir_runs(lowered):
    stage, mod = lowered
    copied = with_copies(mod, stage)
    out = tvm.transform.Sequential([RewriteCall(KERNEL_CALL, trace_each_kernel), CopyToDMA()])(copied)
    relax.analysis.well_formed(out)

    expected = run_forward(mod, stage)
    with Trace() as trace:
        got, engine = run_forward(out, stage, dma=True)
    assert trace.calls == len(kernel_calls(mod["forward"]))
    assert engine.copies == engine.completed == 2
    np.testing.assert_allclose(got, expected, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 3. Parameters of every kind, symbolic shapes, packed calls
# ---------------------------------------------------------------------------------------------


@R.function
def prim_param(x: R.Tensor((4,), "float32"), k: R.Prim("int64")):
    a = R.add(x, x)
    return a


@R.function
def object_param(x: R.Tensor((4,), "float32"), o: R.Object):
    a = R.add(x, x)
    return a


@R.function
def callable_param(
    x: R.Tensor((4,), "float32"), cb: R.Callable([R.Tensor((4,), "float32")], R.Tensor((4,), "float32"))
):
    a = R.add(x, x)
    b = cb(a)
    return b


@R.function
def shape_param(x: R.Tensor((4,), "float32"), s: R.Shape([2, 2])):
    a = R.add(x, x)
    b = R.reshape(a, s)
    return b


@R.function
def tuple_param(t: R.Tuple(R.Tensor((4,), "float32"), R.Prim("float32"))):
    x = t[0]
    a = R.add(x, x)
    return a


@R.function
def symbolic_shapes(x: R.Tensor(("n", 4), "float32"), y: R.Tensor(("n * 2", 4), "float32")):
    n = T.int64()
    with R.dataflow():
        a = R.add(x, x)
        b = R.reshape(y, R.shape([n, 8]))
        R.output(a, b)
    return (a, b)


@R.function
def packed_calls(x: R.Tensor((4,), "float32")):
    y = R.call_pure_packed("coretests.ident", x, **{TY_ARGS: R.Tensor((4,), "float32")})
    a = R.add(y, x)
    return a


@R.function(pure=False)
def every_kind(
    x: R.Tensor(("n", 4), "float32"),
    k: R.Prim("int64"),
    o: R.Object,
    cb: R.Callable([R.Tensor(("n", 4), "float32")], R.Tensor(("n", 4), "float32")),
    s: R.Shape(["n", 4]),
    t: R.Tuple(R.Tensor(("n", 4), "float32"), R.Prim("float32")),
):
    n = T.int64()
    a = R.add(x, x)
    t0 = t[0]
    b = R.multiply(a, t0)
    c = cb(b)
    R.call_packed("coretests.touch", o, k, **VOID_TY_ARGS)
    d = R.call_pure_packed("coretests.ident", c, **{TY_ARGS: R.Tensor((n, 4), "float32")})
    r = R.reshape(d, s)
    e = R.add(r, x)
    return (e, k, s)


KINDS = {
    "prim": prim_param,
    "object": object_param,
    "callable": callable_param,
    "shape": shape_param,
    "tuple": tuple_param,
    "symbolic": symbolic_shapes,
    "packed": packed_calls,
    "every_kind": every_kind,
}


@pytest.mark.parametrize("func", KINDS.values(), ids=KINDS.keys())
def test_a_rewrite_that_never_matches_returns_the_function_itself(func):
    assert rewrite_call(is_op("relax.nn.conv2d")(X, Y), to_subtract, func).same_as(func)
    assert rewrite_call(ADD, lambda orig, m: None, func).same_as(func)


@pytest.mark.parametrize("func", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("form", [2, 3])
def test_a_matching_rewrite_of_a_function_with_any_parameters_is_well_formed(func, form):
    def emitting(orig, m, builder):
        return relax.op.subtract(m[X], builder.emit(relax.op.negative(m[Y])))

    before = Snapshot.of(func)
    out = rewrite_call(ADD, to_subtract if form == 2 else emitting, func)
    before.assert_unchanged(func)
    relax.analysis.well_formed(out)
    kinds, old = binding_kinds(out), binding_kinds(func)
    assert kinds["add"] == 0 and kinds["subtract"] == old["add"] > 0
    assert kinds["negative"] == (old["add"] if form == 3 else 0)
    assert [str(ty(p)) for p in out.params] == [str(ty(p)) for p in func.params]


# ---------------------------------------------------------------------------------------------
# 4. Rewriters written for TVM's rewrite_call, reading the matched sub-calls
# ---------------------------------------------------------------------------------------------

CONV = is_op("relax.nn.conv2d")(wildcard(), wildcard())
SCALE = wildcard()
CONV_TIMES_SCALE = is_op("relax.multiply")(CONV, SCALE)


def fold_scale_into_weight(orig, matchings):
    """conv2d(x, w) * s -> conv2d(x, w * s'), the conv rebuilt from its matched call."""
    conv = matchings[CONV]
    if conv.attrs.kernel_layout != "OIHW" or conv.attrs.out_layout != "NCHW":
        return orig
    data, weight = conv.args
    channels = ty(weight).shape[0]
    scale = relax.op.reshape(matchings[SCALE], relax.ShapeExpr([channels, 1, 1, 1]))
    return relax.Call(conv.op, [data, relax.op.multiply(weight, scale)], conv.attrs)


@R.function
def conv_then_scale(
    x: R.Tensor((1, 3, 8, 8), "float32"),
    w: R.Tensor((4, 3, 3, 3), "float32"),
    s: R.Tensor((1, 4, 1, 1), "float32"),
):
    with R.dataflow():
        c = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1])
        r = R.multiply(c, s)
        R.output(r)
    return r


def random_args(func: relax.Function, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in ty(p).shape.values]).astype("float32") for p in func.params]


def test_a_tvm_rewriter_reading_matched_call_attrs_gives_tvms_results():
    ours = rewrite_call(CONV_TIMES_SCALE, fold_scale_into_weight, conv_then_scale)
    theirs = tvm.relax.dpl.rewrite_call(CONV_TIMES_SCALE, fold_scale_into_weight, conv_then_scale)
    relax.analysis.well_formed(ours)
    assert binding_kinds(ours)["nn.conv2d"] == 1 and binding_kinds(ours)["multiply"] == 1
    assert 'padding=[1, 1, 1, 1]' in str(ours.body.blocks[0].bindings[-1].value)

    functions = {"original": conv_then_scale, "ours": ours, "theirs": theirs}
    results = run_together(functions, random_args(conv_then_scale))
    assert_same_results(results["ours"], results["theirs"])
    np.testing.assert_allclose(results["ours"][0], results["original"][0], rtol=1e-4, atol=1e-5)


@I.ir_module
class ConvBatchNorm:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
             gamma: R.Tensor((4,), "float32"), beta: R.Tensor((4,), "float32"),
             mean: R.Tensor((4,), "float32"), var: R.Tensor((4,), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            bn = R.nn.batch_norm(c, gamma, beta, mean, var, axis=1, training=False)
            r = bn[0]
            R.output(r)
        return r


@I.ir_module
class Reshapes:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([2, 8]))
            b = R.reshape(a, R.shape([16]))
            c = R.reshape(x, R.shape([4, 4]))
            d = R.add(c, c)
            R.output(b, d)
        return (b, d)


def batch_norm_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "w": rng.standard_normal((4, 3, 3, 3)).astype("float32"),
        "gamma": rng.uniform(0.5, 1.5, 4).astype("float32"),
        "beta": rng.standard_normal(4).astype("float32"),
        "mean": rng.standard_normal(4).astype("float32"),
        "var": rng.uniform(0.5, 1.5, 4).astype("float32"),
    }


def run_main(mod: tvm.IRModule, *inputs: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [o.numpy() for o in out]


@pytest.mark.parametrize(
    "case",
    [
        "fold_batch_norm_to_conv2d_for_inference.FoldBatchnormToConv2D",
        "remove_redundant_reshape.RemoveRedundantReshape",
    ],
)
def test_tvms_in_tree_rewriters_pointed_at_rewrite_ext_give_tvms_results(case, monkeypatch):
    import importlib

    module_name, pass_name = case.split(".")
    module = importlib.import_module(f"tvm.relax.transform.{module_name}")
    if pass_name == "FoldBatchnormToConv2D":
        params = batch_norm_params()
        bound = {name: tvm.runtime.tensor(value) for name, value in params.items()}
        mod = relax.transform.BindParams("main", bound)(ConvBatchNorm)
        inputs = [np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")]
    else:
        mod = Reshapes
        inputs = [np.arange(16, dtype="float32").reshape(4, 4)]

    theirs = getattr(module, pass_name)()(mod)
    # The very pass, with its module's rewrite_call swapped for ours (drop-in, same signature).
    monkeypatch.setattr(module, "rewrite_call", rewrite_ext.rewrite_call)
    before = Snapshot.of(mod)
    ours = getattr(module, pass_name)()(mod)
    before.assert_unchanged(mod)

    relax.analysis.well_formed(ours)
    changed = binding_kinds(ours["main"]) != binding_kinds(mod["main"])
    assert changed, ours.script()
    expected = run_main(mod, *inputs)
    assert_same_results(run_main(ours, *inputs), run_main(theirs, *inputs))
    for got, want in zip(run_main(ours, *inputs), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@R.function
def mul_then_add(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        lv0 = R.multiply(x, x)
        lv1 = R.add(lv0, y)
        R.output(lv1)
    return lv1


def test_a_returned_value_bound_earlier_is_replaced_by_its_var():
    handed: list[relax.Expr] = []

    def reuse(orig, m):
        handed.append(m[MUL])
        return relax.op.subtract(m[MUL], relax.op.negative(m[W]))

    out = rewrite_call(ADD_OF_MUL, reuse, mul_then_add)
    relax.analysis.well_formed(out)
    # As TVM hands it: the call bound to lv0 (the very object), not lv0.
    assert handed and all(h.same_as(mul_then_add.body.blocks[0].bindings[0].value) for h in handed)
    assert binding_kinds(out)["multiply"] == 1
    assert str(out.body.blocks[0].bindings[-1].value) == "R.subtract(lv0, lv)"


def test_an_emitted_value_bound_earlier_is_replaced_by_its_var():
    def reuse(orig, m, builder):
        assert m[MUL].same_as(mul_then_add.body.blocks[0].bindings[0].value)  # as TVM hands it
        again = builder.emit(m[MUL])
        doubled = builder.emit(relax.op.maximum(m[MUL], m[MUL]))
        return relax.op.subtract(again, doubled)

    out = rewrite_call(ADD_OF_MUL, reuse, mul_then_add)
    relax.analysis.well_formed(out)
    assert binding_kinds(out)["multiply"] == 1
    assert "R.maximum(lv0, lv0)" in [str(b.value) for b in out.body.blocks[0].bindings]
    results = run_together({"rewritten": out}, random_args(mul_then_add))
    np.testing.assert_array_equal(results["rewritten"][0], np.zeros(4, "float32"))


# ---------------------------------------------------------------------------------------------
# 5. match_cast
# ---------------------------------------------------------------------------------------------


@R.function
def cast_between(x: R.Tensor(("n",), "float32"), y: R.Tensor((4,), "float32")):
    m = R.multiply(x, x)
    c = R.match_cast(m, R.Tensor((4,), "float32"))
    a = R.add(c, y)
    return a


def test_a_match_cast_binding_is_not_seen_through_and_the_result_builds():
    assert offered(ADD_OF_MUL, cast_between) == []
    out = rewrite_call(ADD_OF_MUL, subtract_of_multiply, cast_between)
    relax.analysis.well_formed(out)
    x, y = np.arange(4, dtype="float32"), np.full(4, 10, dtype="float32")
    results = run_together({"original": cast_between, "rewritten": out}, [x, y])
    np.testing.assert_array_equal(results["rewritten"][0], x * x + y)
    # The cast var itself still matches a wildcard, and the match builds.
    out = rewrite_call(ADD, to_subtract, cast_between)
    results = run_together({"rewritten": out}, [x, y])
    np.testing.assert_array_equal(results["rewritten"][0], x * x - y)


# ---------------------------------------------------------------------------------------------
# 6. Emitting before a binding while keeping it
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def two_adds(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    a = R.add(x, y)
    b = R.multiply(a, y)
    c = R.add(b, x)
    return c


def trace_and_keep(orig, m, builder):
    builder.emit(packed_call(Trace.name, m[X]))
    return orig


@pytest.mark.parametrize("force_pure", [False, True], ids=["pure_false", "force_pure"])
def test_a_rewriter_may_emit_before_a_binding_and_keep_it(force_pure):
    func = two_adds
    if force_pure:
        func = relax.Function(func.params, func.body, ret_ty(func), True, func.attrs)
        func = func.with_attr("relax.force_pure", True)
    before = Snapshot.of(func)
    out = rewrite_call(ADD, trace_and_keep, func, max_iterations=1)  # kept: not offered again
    before.assert_unchanged(func)
    relax.analysis.well_formed(out)

    bindings = out.body.blocks[0].bindings
    shown = [spelled_as_026(str(b.value)) for b in bindings]
    assert shown == [
        'R.call_packed("coretests.trace", x, ty_args=(R.Tuple,))',
        "R.add(x, y)",
        "R.multiply(a, y)",
        'R.call_packed("coretests.trace", b, ty_args=(R.Tuple,))',
        "R.add(b, x)",
    ]
    # The kept bindings are the input's own.
    assert bindings[1].same_as(func.body.blocks[0].bindings[0])
    assert bindings[4].same_as(func.body.blocks[0].bindings[2])

    inputs = random_args(func)
    with Trace() as trace:
        results = run_together({"original": func, "rewritten": out}, inputs)
    assert trace.calls == 2
    assert_same_results(results["rewritten"], results["original"])


# ---------------------------------------------------------------------------------------------
# 7. A misbehaving rewriter
# ---------------------------------------------------------------------------------------------


@R.function(pure=False)
def flat(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    a = R.add(x, y)
    b = R.multiply(a, y)
    return b


@R.function
def branches(cond: R.Tensor((), "bool"), x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    if cond:
        a = R.add(x, y)
        r = R.multiply(a, y)
    else:
        a2 = R.add(y, x)
        r = R.multiply(a2, x)
    return r


def foreign_var(orig, m):
    stranger = relax.Var("stranger", ty(m[X]))
    m = dict(m.items())  # TVM's Map is immutable (mutating it is an error): a copy takes anything
    m[wildcard()] = stranger
    return relax.op.subtract(m[X], stranger)


def mutates_matchings(orig, m):
    m[wildcard()] = relax.Var("stranger", ty(m[X]))
    return relax.op.subtract(m[X], m[Y])


def opens_a_block(orig, m, builder):
    builder._begin_binding_block()
    return relax.op.subtract(m[X], m[Y])


def opens_a_function(orig, m, builder):
    builder.function("g", [relax.Var("z", ty(m[X]))])  # never entered, never left
    return relax.op.subtract(m[X], m[Y])


def ends_a_scope(orig, m, builder):
    builder.end_scope()
    return relax.op.subtract(m[X], m[Y])


def returns_a_seq_expr(orig, m):
    inner = relax.Var("inner", ty(m[X]))
    return relax.SeqExpr([relax.BindingBlock([relax.VarBinding(inner, relax.op.negative(m[X]))])], inner)


def adds_an_ill_formed_function(orig, m, builder):
    p, stray = relax.Var("p", ty(m[X])), relax.Var("stray", ty(m[X]))
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(relax.Var("o", ty(m[X])), relax.op.add(p, stray))])], p)
    helper = builder.add_func(relax.Function([p], body, ty(m[X])), "helper")
    return relax.Call(helper, [m[X]])


def updates_a_function(orig, m, builder):
    p = relax.Var("p", ty(m[X]))
    builder.update_func(relax.GlobalVar("main"), relax.Function([p], relax.SeqExpr([], p), ty(m[X])))
    return relax.op.subtract(m[X], m[Y])


MISBEHAVIOURS = {
    "returns_seq_expr": (returns_a_seq_expr, "returned a relax.SeqExpr"),
    "add_func_ill_formed": (adds_an_ill_formed_function, "added a function as 'helper'"),
    "update_func": (updates_a_function, "update_func"),
    "foreign_var": (foreign_var, "stranger"),
    "mutates_matchings": (mutates_matchings, "does not support item assignment"),
    "begin_binding_block": (opens_a_block, "_begin_binding_block"),
    "function_without_exit": (opens_a_function, "function"),
    "end_scope": (ends_a_scope, "end_scope"),
}


def assert_next_rewrite_works(func: relax.Function) -> None:
    out = rewrite_call(ADD, to_subtract, func)
    relax.analysis.well_formed(out)
    assert binding_kinds(out)["subtract"] == binding_kinds(func)["add"] > 0


@pytest.mark.parametrize("func", [flat, branches], ids=["flat", "if_branches"])
@pytest.mark.parametrize("name", MISBEHAVIOURS)
def test_a_misbehaving_rewriter_is_an_error_naming_function_binding_and_pattern(func, name):
    rewriter, named = MISBEHAVIOURS[name]
    before = Snapshot.of(func)
    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, rewriter, func)
    message = str(info.value)
    binding = "binding 'a'"
    assert ("'flat'" if func is flat else "'branches'") in message, message
    assert binding in message and "relax.add(*, *)" in message and named in message, message
    before.assert_unchanged(func)
    assert_next_rewrite_works(func)


def test_a_replacement_a_later_binding_cannot_be_typed_against_is_an_error_naming_the_pattern():
    before = Snapshot.of(flat)
    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, lambda orig, m: relax.Tuple([m[X], m[Y]]), flat)
    message = str(info.value)
    before.assert_unchanged(flat)
    assert_next_rewrite_works(flat)
    assert "'flat'" in message and "'a'" in message and "'b'" in message, message
    assert "relax.add(*, *)" in message, message


def test_a_replacement_a_later_binding_cannot_be_typed_against_leaves_everything_usable():
    before = Snapshot.of(flat)
    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, lambda orig, m: relax.Tuple([m[X], m[Y]]), flat)
    assert "'flat'" in str(info.value) and "binding 'b'" in str(info.value)
    before.assert_unchanged(flat)
    assert_next_rewrite_works(flat)


def raising(exc: BaseException):
    def rewriter(orig, m):
        raise exc

    return rewriter


def as_module(func: relax.Function) -> tvm.IRModule:
    return tvm.IRModule({str(func.attrs["global_symbol"]): func})


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("where", ["if_branch", "pass_in_sequential", "if_branch_pass_in_sequential"])
def test_keyboard_interrupt_and_system_exit_in_a_rewriter_come_out_as_themselves(exc_type, where):
    raised = exc_type(3) if exc_type is SystemExit else exc_type()
    func = flat if where == "pass_in_sequential" else branches
    target = func if where == "if_branch" else as_module(func)
    before = Snapshot.of(target)
    with pytest.raises(exc_type) as info:
        if where == "if_branch":
            rewrite_call(ADD, raising(raised), target)
        else:
            tvm.transform.Sequential([RewriteCall(ADD, raising(raised))])(target)
    assert type(info.value) is exc_type and info.value is raised
    if exc_type is SystemExit:
        assert info.value.code == 3
    before.assert_unchanged(target)
    assert_next_rewrite_works(func)
    # The pass too is usable again.
    out = tvm.transform.Sequential([RewriteCall(ADD, to_subtract)])(as_module(func))
    relax.analysis.well_formed(out)


@pytest.mark.parametrize("where", ["if_branch", "pass_in_sequential"])
def test_an_exception_in_a_rewriter_is_a_rewrite_error_naming_function_binding_and_pattern(where):
    func = branches
    target = func if where == "if_branch" else as_module(func)
    before = Snapshot.of(target)
    with pytest.raises(RewriteError) as info:
        if where == "if_branch":
            rewrite_call(ADD, raising(ValueError("boom")), target)
        else:
            tvm.transform.Sequential([RewriteCall(ADD, raising(ValueError("boom")))])(target)
    message = str(info.value)
    assert "binding 'a'" in message and "relax.add(*, *)" in message and "boom" in message, message
    assert "'branches'" in message or "'main'" in message, message
    before.assert_unchanged(target)
    assert_next_rewrite_works(func)
