"""rewrite_ext.rewrite_call against TVM's own ``relax.dpl.rewrite_call``.

Part 1: for two-argument rewriters on pure dataflow functions where every
binding is used and TVM's cleanups (CanonicalizeBindings,
EliminateCommonSubexpr, RemoveAllUnused) change nothing, the result is
structurally equal to TVM's.  The cases are modelled on TVM's
tests/python/relax/test_dataflow_rewriter.py and test_dataflow_pattern.py.

Part 2: one test per documented difference (docs/index.md, docs/guide.md),
asserting both exact outputs, so the documentation's claims about TVM are
checked against the installed TVM.
"""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import (
    ExternFuncPattern,
    is_const,
    is_expr,
    is_op,
    is_tuple,
    is_tuple_get_item,
    wildcard,
)
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext
from rewrite_ext import RewriteError
from rewrite_ext.compat import OUT_TY, TY_ARGS, VOID_TY_ARGS, TupleType, has_ty, ty


def _const_data(const):
    """A relax.Constant's array: ``.value`` in TVM 0.27, ``.data`` before."""
    data = getattr(const, "value", None)
    return (data if data is not None else const.data).numpy()


def tvm_rewrite(pattern, rewriter, target):
    """TVM's rewrite: ``rewrite_call`` for a function, its PatternMatchingRewriter for a module."""
    if isinstance(target, tvm.IRModule):
        return relax.dpl.PatternMatchingRewriter.from_pattern(pattern, rewriter)(target)
    return relax.dpl.rewrite_call(pattern, rewriter, target)


def tvm_cleanups(target):
    """What TVM runs after every rewriting round, applied once to ``target``."""
    mod = target if isinstance(target, tvm.IRModule) else tvm.IRModule({"f": target})
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.EliminateCommonSubexpr()(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mod[gvar] = relax.analysis.remove_all_unused(func)
    return mod if isinstance(target, tvm.IRModule) else mod["f"]


# ==========================================================================================
# Part 1: the same result as TVM
# ==========================================================================================

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)


def to_multiply(orig, m):
    return relax.op.multiply(m[X], m[Y])


# -- add -> multiply ------------------------------------------------------------------------


@R.function
def add_chain(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.exp(x)
        b = R.add(a, y)
        c = R.add(b, b)
        R.output(c)
    return c


# -- across two bindings: add(matmul(x, w), b) -> one fused call; lv0 becomes unused ---------

MM_X, MM_W, BIAS = wildcard(), wildcard(), wildcard()
MATMUL_ADD = is_op("relax.add")(is_op("relax.matmul")(MM_X, MM_W), BIAS)


def to_fused_call(orig, m):
    return relax.op.call_pure_packed("fused_matmul_add", m[MM_X], m[MM_W], m[BIAS], **{TY_ARGS: ty(orig)})


@R.function
def matmul_add_relu(
    x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 4), "float32"), b: R.Tensor((4,), "float32")
):
    with R.dataflow():
        lv0 = R.matmul(x, w)
        lv1 = R.add(lv0, b)
        out = R.nn.relu(lv1)
        R.output(out)
    return out


# -- across two bindings, the interior binding still used: relu(matmul) -> gelu(matmul) ------

MATMUL = is_op("relax.matmul")(MM_X, MM_W)
RELU_OF_MATMUL = is_op("relax.nn.relu")(MATMUL)


def relu_to_gelu(orig, m):
    return relax.op.nn.gelu(m[MATMUL])


@R.function
def matmul_used_twice(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 4), "float32")):
    with R.dataflow():
        lv0 = R.matmul(x, w)
        lv1 = R.nn.relu(lv0)
        out = R.add(lv0, lv1)
        R.output(out)
    return out


# -- TVM's test_rewrite_simple: add(x, x) -> x * 2, and add(add(x, x), add(x, x)) -> x * 4 ---

SELF = wildcard()
ADD_SELF = is_op("relax.add")(SELF, SELF)
ADD_OF_ADDS = is_op("relax.add")(ADD_SELF, ADD_SELF)


@R.function
def doubling(x: R.Tensor((16, 16), "float32")) -> R.Tensor((16, 16), "float32"):
    with R.dataflow():
        x2 = R.add(x, x)
        x4 = R.add(x2, x2)
        R.output(x4)
    return x4


def times_two(orig, m):
    return relax.op.multiply(m[SELF], relax.const(2, "float32"))


def times_four(orig, m):
    return relax.op.multiply(m[SELF], relax.const(4, "float32"))


# -- a rewrite whose output feeds another match: add -> subtract -> multiply -----------------

ADD_OR_SUB = is_op("relax.add")(X, Y) | is_op("relax.subtract")(X, Y)


def add_to_sub_to_mul(orig, m):
    if orig.op.name == "relax.add":
        return relax.op.subtract(m[X], m[Y])
    return relax.op.multiply(m[X], m[Y])


# -- TVM's test_repeated_pattern_match: (a + b) * c -> a * c + b * c, to a fixed point --------

LHS, RHS, SCALE = wildcard(), wildcard(), is_const()
SUM = is_op("relax.add")(LHS, RHS)
SCALED_SUM = is_op("relax.multiply")(SUM, SCALE)


def distribute(orig, m):
    return relax.op.add(
        relax.op.multiply(m[LHS], m[SCALE]), relax.op.multiply(m[RHS], m[SCALE])
    )


@R.function(private=True)
def scaled_sum(x: R.Tensor((1024,)), y: R.Tensor((1024,)), z: R.Tensor((1024,))):
    with R.dataflow():
        a = R.add(x, y)
        b = R.add(a, z)
        out = R.multiply(b, R.const(5.0))
        R.output(out)
    return out


# -- TupleGetItem: add(t[0], t[1]) -> subtract ------------------------------------------------

TUPLE = wildcard()
FIRST, SECOND = is_tuple_get_item(TUPLE, 0), is_tuple_get_item(TUPLE, 1)
ADD_HALVES = is_op("relax.add")(FIRST, SECOND)


def halves_to_subtract(orig, m):
    return relax.op.subtract(m[FIRST], m[SECOND])


@R.function
def split_add(x: R.Tensor((8,), "float32")):
    with R.dataflow():
        s = R.split(x, 2)
        lo = s[0]
        hi = s[1]
        c = R.add(lo, hi)
        R.output(c)
    return c


# -- TVM's test_rewrite_of_explicit_relax_tuple: (A @ s, B @ s) -> split(concat(A, B) @ s) -----

LHS_A, LHS_B, STATE = wildcard(), wildcard(), wildcard()
PROJ_TUPLE = is_tuple([is_op("relax.matmul")(LHS_A, STATE), is_op("relax.matmul")(LHS_B, STATE)])


def concat_projections(orig, m):
    lhs = relax.op.concat([m[LHS_A], m[LHS_B]])
    return relax.op.split(relax.op.matmul(lhs, m[STATE]), 2)


# The tuple is the function's output.  (TVM's test reads it back with proj_tuple[0], which
# CanonicalizeBindings would already rewrite in the input: out of this file's scope.)
@R.function
def projections(
    state: R.Tensor([16], "float32"), A: R.Tensor([16, 16], "float32"), B: R.Tensor([16, 16], "float32")
):
    with R.dataflow():
        proj_A = R.matmul(A, state)
        proj_B = R.matmul(B, state)
        proj_tuple = (proj_A, proj_B)
        R.output(proj_tuple)
    return proj_tuple


# -- a rewrite to another tuple-valued call, read through TupleGetItem -----------------------

SPLIT_ARG = wildcard()
SPLIT = is_op("relax.split")(SPLIT_ARG)


def sections_to_indices(orig, m):
    if isinstance(orig.attrs.indices_or_sections, tvm.tirx.IntImm):  # split(x, 2)
        return relax.op.split(m[SPLIT_ARG], [4])
    return None


@R.function
def split_multiply(x: R.Tensor((8,), "float32")):
    with R.dataflow():
        s = R.split(x, 2)
        lo = s[0]
        hi = s[1]
        c = R.multiply(lo, hi)
        R.output(c)
    return c


# -- both If branches (the If stands in a plain block) ---------------------------------------


@R.function
def branches(cond: R.Tensor((), "bool"), x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    if cond:
        a = R.add(x, y)
        r = R.exp(a)
    else:
        b = R.exp(x)
        r = R.add(b, y)
    return r


# -- a nested local function ---------------------------------------------------------------


@R.function
def nested(x: R.Tensor((4,), "float32")):
    @R.function
    def inner(y: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        z = R.add(y, y)
        return z

    out = inner(x)
    return out


# -- type constraints: has_dtype / has_shape on an argument, has_dtype on the root, has_ty ---

F32_2x3 = wildcard().has_dtype("float32").has_shape([2, 3])
ADD_F32_2x3 = is_op("relax.add")(F32_2x3, Y)
ADD_INT32 = is_op("relax.add")(X, Y).has_dtype("int32")


def constrained_to_multiply(orig, m):
    return relax.op.multiply(m[F32_2x3], m[Y])


@R.function
def mixed_types(
    a: R.Tensor((2, 3), "float32"),
    b: R.Tensor((2, 3), "float32"),
    c: R.Tensor((2, 3), "int32"),
    d: R.Tensor((4, 3), "float32"),
):
    with R.dataflow():
        e = R.add(a, b)
        f = R.add(c, c)
        g = R.add(d, d)
        h = R.astype(f, "float32")
        i = R.add(e, h)
        j = R.concat([i, g])
        R.output(j)
    return j


# TVM's test_wildcard_ty_with_symbolic_vars: only the elementwise add matches
_m, _n = tvm.tirx.Var("m", "int64"), tvm.tirx.Var("n", "int64")
ELEMENTWISE_L, ELEMENTWISE_R = has_ty(wildcard(), R.Tensor([_m, _n])), has_ty(wildcard(), R.Tensor([_m, _n]))
ELEMENTWISE_ADD = is_op("relax.add")(ELEMENTWISE_L, ELEMENTWISE_R)


def elementwise_to_multiply(orig, m):
    return relax.op.multiply(m[ELEMENTWISE_L], m[ELEMENTWISE_R])


@R.function(private=True)
def broadcast_or_not():
    with R.dataflow():
        A = R.zeros([64, 128], "int32")
        B = R.ones([64, 128], "int32")
        C = R.add(A, B)
        D = R.zeros([64, 128], "float32")
        E = R.ones([1, 128], "float32")
        F = R.add(D, E)
        output = (C, F)
        R.output(output)
    return output


# -- an OrPattern of two calls ---------------------------------------------------------------

RELU_OR_SIGMOID = is_op("relax.nn.relu")(X) | is_op("relax.sigmoid")(X)


def activation_swap(orig, m):
    if orig.op.name == "relax.nn.relu":
        return relax.op.nn.gelu(m[X])
    return relax.op.tanh(m[X])


@R.function
def activations(x: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.nn.relu(x)
        b = R.sigmoid(a)
        c = R.add(a, b)
        R.output(c)
    return c


# -- TVM's test_commutative_pattern_match: an OrPattern op, is_const, declining ------------

ADD_OR_MUL_OP = is_op("relax.add") | is_op("relax.multiply")
CONST_ARG, CONST = wildcard(), is_const()
OP_WITH_CONST = ADD_OR_MUL_OP(CONST_ARG, CONST)


def one_to_two(orig, m):
    value = _const_data(m[CONST])
    if value.shape == () and value[()] == 1.0:
        return relax.Call(m[ADD_OR_MUL_OP], [m[CONST_ARG], relax.const(2.0)])
    return orig


@R.function(private=True)
def const_first(x: R.Tensor((1024,))):
    with R.dataflow():
        y = R.add(x, x)
        out = R.add(R.const(1.0), y)
        R.output(out)
    return out


# -- declining some matches (returning orig, returning None) -------------------------------


@R.function
def three_adds(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.add(x, y)
        b = R.add(a, y)
        c = R.add(a, b)
        R.output(c)
    return c


def multiply_unless_first_arg_is_local(orig, m):
    # decides on orig, which both implementations pass as the bound value
    if isinstance(orig.args[0], relax.DataflowVar):
        return orig
    return relax.op.multiply(m[X], m[Y])


def subtract_unless_second_arg_is_local(orig, m):
    if isinstance(orig.args[1], relax.DataflowVar):
        return None
    return relax.op.subtract(m[X], m[Y])


# -- is_const args ---------------------------------------------------------------------------

TIMES_CONST = is_op("relax.multiply")(X, CONST)


def times_two_to_add(orig, m):
    if float(_const_data(m[CONST])) == 2.0:
        return relax.op.add(m[X], m[X])
    return None


@R.function
def scalings(x: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.multiply(x, R.const(2.0, "float32"))
        b = R.multiply(a, R.const(3.0, "float32"))
        c = R.multiply(b, x)
        R.output(c)
    return c


# -- call_tir in a module --------------------------------------------------------------------


@I.ir_module
class TirModule:
    @T.prim_func(private=True)
    def add_one(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i] + T.float32(1)

    @T.prim_func(private=True)
    def add_two(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i] + T.float32(2)

    @R.function
    def main(x: R.Tensor((4,), "float32")):
        cls = TirModule
        with R.dataflow():
            a = R.call_tir(cls.add_one, (x,), **{OUT_TY: R.Tensor((4,), "float32")})
            b = R.call_tir(cls.add_one, (a,), **{OUT_TY: R.Tensor((4,), "float32")})
            c = R.add(a, b)
            R.output(c)
        return c


# is_call_tir("add_one", ...) would build a GlobalVarPattern; the callee is matched as an expr.
ADD_ONE = is_expr(TirModule.get_global_var("add_one"))
CALL_ADD_ONE = is_op("relax.call_tir")(ADD_ONE, is_tuple([X]))
CALL_ADD_ONE_TWICE = is_op("relax.call_tir")(ADD_ONE, is_tuple([CALL_ADD_ONE]))


def to_add_two(orig, m):
    return relax.op.call_tir(TirModule.get_global_var("add_two"), [m[X]], **{OUT_TY: ty(orig)})


# -- the cases -------------------------------------------------------------------------------

SAME_AS_TVM = [
    pytest.param(add_chain, ADD, to_multiply, id="add-to-multiply"),
    pytest.param(matmul_add_relu, MATMUL_ADD, to_fused_call, id="matmul-add-fused-interior-dropped"),
    pytest.param(matmul_used_twice, RELU_OF_MATMUL, relu_to_gelu, id="two-bindings-interior-kept"),
    pytest.param(doubling, ADD_SELF, times_two, id="add-self-to-times-two"),
    pytest.param(doubling, ADD_OF_ADDS, times_four, id="add-of-adds-to-times-four"),
    pytest.param(add_chain, ADD_OR_SUB, add_to_sub_to_mul, id="output-feeds-next-match"),
    pytest.param(scaled_sum, SCALED_SUM, distribute, id="distribute-to-fixed-point"),
    pytest.param(split_add, ADD_HALVES, halves_to_subtract, id="tuple-get-item"),
    pytest.param(projections, PROJ_TUPLE, concat_projections, id="tuple-pattern-to-split"),
    pytest.param(split_multiply, SPLIT, sections_to_indices, id="tuple-valued-call"),
    pytest.param(branches, ADD, to_multiply, id="both-if-branches"),
    pytest.param(nested, ADD, to_multiply, id="nested-local-function"),
    pytest.param(mixed_types, ADD_F32_2x3, constrained_to_multiply, id="has-dtype-has-shape"),
    pytest.param(mixed_types, ADD_INT32, to_multiply, id="has-dtype-on-root"),
    pytest.param(broadcast_or_not, ELEMENTWISE_ADD, elementwise_to_multiply, id="has-ty-symbolic"),
    pytest.param(activations, RELU_OR_SIGMOID, activation_swap, id="or-pattern"),
    pytest.param(const_first, OP_WITH_CONST, one_to_two, id="or-op-is-const-declining"),
    pytest.param(three_adds, ADD, multiply_unless_first_arg_is_local, id="declines-with-orig"),
    pytest.param(three_adds, ADD, subtract_unless_second_arg_is_local, id="declines-with-none"),
    pytest.param(scalings, TIMES_CONST, times_two_to_add, id="is-const"),
    pytest.param(TirModule, CALL_ADD_ONE, to_add_two, id="call-tir-module"),
    pytest.param(TirModule, CALL_ADD_ONE_TWICE, to_add_two, id="call-tir-module-nested"),
]

NEEDS_MORE_THAN_ONE_PASS = {"output-feeds-next-match", "distribute-to-fixed-point"}


@pytest.mark.parametrize("target, pattern, rewriter", SAME_AS_TVM)
def test_same_result_as_tvm(target, pattern, rewriter):
    # the case is in scope: TVM's cleanups leave the input as it is
    tvm.ir.assert_structural_equal(tvm_cleanups(target), target)

    ours = rewrite_ext.rewrite_call(pattern, rewriter, target)
    tvm.ir.assert_structural_equal(ours, tvm_rewrite(pattern, rewriter, target))
    assert not tvm_ffi.structural_equal(ours, target), "the rewrite changed nothing"


@pytest.mark.parametrize(
    "target, pattern, rewriter",
    [case for case in SAME_AS_TVM if case.id in NEEDS_MORE_THAN_ONE_PASS],
)
def test_cases_whose_output_feeds_another_match_need_more_than_one_pass(target, pattern, rewriter):
    with pytest.raises(RewriteError, match="did not converge"):
        rewrite_ext.rewrite_call(pattern, rewriter, target, max_iterations=1)
    rewrite_ext.rewrite_call(pattern, rewriter, target, max_iterations=2)


# ==========================================================================================
# Part 2: the documented differences, both outputs exact
# ==========================================================================================


def test_matchings_are_vars_where_tvm_gives_the_bound_values():
    """docs/index.md 4, guide "Matchings are vars, not values"."""
    seen = {}

    def record(name):
        def rewriter(orig, m):
            seen.setdefault(name, m[X])
            return None

        return rewriter

    relax.dpl.rewrite_call(ADD, record("tvm"), add_chain)
    rewrite_ext.rewrite_call(ADD, record("ext"), add_chain)

    a = add_chain.body.blocks[0].bindings[0]  # a = R.exp(x); first match: b = R.add(a, y)
    assert isinstance(seen["tvm"], relax.Call)
    tvm.ir.assert_structural_equal(seen["tvm"], a.value)
    assert seen["ext"].same_as(a.var)


@R.function(private=True)
def with_dead_binding(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        unused = R.exp(x)
        b = R.add(x, y)
        R.output(b)
    return b


def test_unused_binding_tvm_removes_is_kept():
    """docs/index.md 2: RemoveAllUnused deletes unused pure bindings even where nothing matched."""

    @R.function(private=True)
    def tvm_result(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            b = R.multiply(x, y)
            R.output(b)
        return b

    @R.function(private=True)
    def ext_result(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            unused = R.exp(x)
            b = R.multiply(x, y)
            R.output(b)
        return b

    tvm.ir.assert_structural_equal(relax.dpl.rewrite_call(ADD, to_multiply, with_dead_binding), tvm_result)
    tvm.ir.assert_structural_equal(rewrite_ext.rewrite_call(ADD, to_multiply, with_dead_binding), ext_result)


def test_common_subexpression_tvm_merges_is_kept():
    """docs/index.md 2: EliminateCommonSubexpr runs after every round in TVM."""

    @R.function(private=True)
    def before(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.multiply(x, x)
            b = R.add(x, x)
            c = R.subtract(a, b)
            R.output(c)
        return c

    @R.function(private=True)
    def tvm_result(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.multiply(x, x)
            c = R.subtract(a, a)
            R.output(c)
        return c

    @R.function(private=True)
    def ext_result(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.multiply(x, x)
            b = R.multiply(x, x)
            c = R.subtract(a, b)
            R.output(c)
        return c

    tvm.ir.assert_structural_equal(relax.dpl.rewrite_call(ADD, to_multiply, before), tvm_result)
    tvm.ir.assert_structural_equal(rewrite_ext.rewrite_call(ADD, to_multiply, before), ext_result)


def test_trivial_binding_tvm_canonicalizes_is_kept():
    """docs/index.md 2: CanonicalizeBindings runs after every round in TVM."""

    @R.function(private=True)
    def before(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.multiply(a, R.const(1.0, "float32"))
            c = R.add(b, a)
            R.output(c)
        return c

    @R.function(private=True)
    def tvm_result(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            c = R.add(a, a)
            R.output(c)
        return c

    @R.function(private=True)
    def ext_result(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = a
            c = R.add(b, a)
            R.output(c)
        return c

    def drop_times_one(orig, m):  # x * 1 -> x
        return m[X]

    pattern = is_op("relax.multiply")(X, is_const())
    tvm.ir.assert_structural_equal(relax.dpl.rewrite_call(pattern, drop_times_one, before), tvm_result)
    tvm.ir.assert_structural_equal(rewrite_ext.rewrite_call(pattern, drop_times_one, before), ext_result)


def test_bindings_are_not_re_sorted():
    """docs/index.md 2: TVM re-sorts bindings topologically; rewrite_ext keeps them in place."""

    @R.function(private=True)
    def before(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.add(x, y)
            b = R.exp(x)
            c = R.multiply(a, b)
            R.output(c)
        return c

    @R.function(private=True)
    def tvm_result(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            b = R.exp(x)
            a = R.multiply(b, y)
            c = R.multiply(a, b)
            R.output(c)
        return c

    later = before.body.blocks[0].bindings[1].var  # b, bound after the matched binding a

    def use_later_var(orig, m):
        return relax.op.multiply(later, m[Y])

    tvm.ir.assert_structural_equal(relax.dpl.rewrite_call(ADD, use_later_var, before), tvm_result)
    # kept in place, `a` would read `b` before its binding: rewrite_ext reports it instead
    with pytest.raises(RewriteError, match="not well formed"):
        rewrite_ext.rewrite_call(ADD, use_later_var, before)


def test_impure_call_in_a_plain_block_is_offered_where_tvm_never_offers_it():
    """docs/index.md 1: TVM calls the rewriter zero times on an impure call in a plain block."""

    @R.function(pure=False, private=True)
    def before(x: R.Tensor((4,), "float32")):
        R.call_builtin_with_ctx("test.effect", (x,), **VOID_TY_ARGS)
        return x

    @R.function(pure=False, private=True)
    def ext_result(x: R.Tensor((4,), "float32")):
        R.call_builtin_with_ctx("test.other", (x,), **VOID_TY_ARGS)
        return x

    args = wildcard()
    pattern = is_op("relax.call_builtin_with_ctx")(ExternFuncPattern("test.effect"), args)
    calls = []

    def rewriter(orig, m):
        calls.append(orig)
        return relax.op.call_builtin_with_ctx("test.other", m[args], **VOID_TY_ARGS)

    tvm.ir.assert_structural_equal(relax.dpl.rewrite_call(pattern, rewriter, before), before)
    assert calls == []
    tvm.ir.assert_structural_equal(rewrite_ext.rewrite_call(pattern, rewriter, before), ext_result)
    assert len(calls) == 1


def test_tvm_rewriter_cannot_reach_a_builder_and_rewrite_ext_passes_one():
    """docs/index.md 5: BlockBuilder.current() is None in TVM's callback."""
    current = []

    def look(orig, m):
        current.append(relax.BlockBuilder.current())
        return None

    relax.dpl.rewrite_call(ADD, look, add_chain)
    assert current and all(bb is None for bb in current)

    def emit_then_multiply(orig, m, builder):
        neg = builder.emit(relax.op.negative(m[Y]))
        return relax.op.multiply(m[X], neg)

    @R.function
    def add_chain_after(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            lv = R.negative(y)
            b = R.multiply(a, lv)
            lv1 = R.negative(b)
            c = R.multiply(b, lv1)
            R.output(c)
        return c

    out = rewrite_ext.rewrite_call(ADD, emit_then_multiply, add_chain, max_iterations=1)
    tvm.ir.assert_structural_equal(out, add_chain_after.with_attr("global_symbol", "add_chain"))


def test_changed_type_is_propagated_where_tvm_keeps_the_stale_annotation():
    """guide.md "Types": the var is re-typed; TVM keeps its old type and is not well formed."""

    @R.function(private=True)
    def before(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.exp(a)
            R.output(b)
        return b

    @R.function(private=True)
    def ext_result(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.astype(x, "float16")
            b = R.exp(a)
            R.output(b)
        return b

    def to_half(orig, m):
        return relax.op.astype(m[X], "float16")

    ours = rewrite_ext.rewrite_call(ADD, to_half, before)
    tvm.ir.assert_structural_equal(ours, ext_result)
    assert ty(ours.body.blocks[0].bindings[0].var).dtype == "float16"
    relax.analysis.well_formed(ours)

    theirs = relax.dpl.rewrite_call(ADD, to_half, before)
    a = theirs.body.blocks[0].bindings[0]
    tvm.ir.assert_structural_equal(
        a.value, ext_result.body.blocks[0].bindings[0].value, map_free_vars=True
    )
    assert ty(a.var).dtype == "float32" and ty(a.value).dtype == "float16"
    with pytest.raises(TypeError, match="cannot be assigned"):
        relax.analysis.well_formed(theirs)
