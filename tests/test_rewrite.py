"""The semantic rules of rewrite_ext.rewrite_call, one test (or a few) per rule."""

from __future__ import annotations

import functools

import pytest
import tvm
import tvm_ffi
from tvm import relax, topi
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from rewrite_ext import Decline, RewriteCall, RewriteError, Rule, apply_rules, rewrite_call
from rewrite_ext.testing import assert_same_results
from rewrite_ext.compat import OUT_TY, TY_ARGS, VOID_TY_ARGS, TensorType, TupleType, ty, var_name

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)


def to_multiply(orig, m):
    return relax.op.multiply(m[X], m[Y])


def values(func: relax.Function, block: int = 0) -> list[str]:
    """The bound values of one block, as TVMScript text, to check bindings one by one."""
    return [str(b.value) for b in func.body.blocks[block].bindings]


def names(func: relax.Function, block: int = 0) -> list[str]:
    return [var_name(b.var) for b in func.body.blocks[block].bindings]


@R.function
def add_chain(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.exp(x)
        b = R.add(a, y)
        c = R.add(b, b)
        R.output(c)
    return c


# -- the builder ----------------------------------------------------------------------------


def test_emitted_bindings_land_before_the_rewritten_binding_in_emission_order():
    def rewriter(orig, m, builder):
        first = builder.emit(relax.op.negative(m[X]))
        second = builder.emit(relax.op.abs(first))
        return relax.op.multiply(second, m[Y])

    out = rewrite_call(ADD, rewriter, add_chain)
    assert values(out) == [
        "R.exp(x)",
        "R.negative(a)",
        "R.abs(lv)",
        "R.multiply(lv1, y)",
        "R.negative(b)",
        "R.abs(lv2)",
        "R.multiply(lv3, b)",
    ]
    assert names(out)[3] == "b" and names(out)[-1] == "c"
    relax.analysis.well_formed(out)


def test_emit_normalized_and_match_cast_through_the_builder_land_in_order():
    def rewriter(orig, m, builder):
        var = relax.DataflowVar("pre", TensorType((4,), "float32"))
        builder.emit_normalized(relax.VarBinding(var, builder.normalize(relax.op.negative(m[X]))))
        cast = builder.match_cast(var, TensorType((4,), "float32"))
        return relax.op.multiply(cast, m[Y])

    out = rewrite_call(ADD, rewriter, add_chain, max_iterations=1)
    bindings = out.body.blocks[0].bindings
    assert [type(b).__name__ for b in bindings[:4]] == ["VarBinding", "VarBinding", "MatchCast", "VarBinding"]
    assert str(bindings[3].value) == f"R.multiply({var_name(bindings[2].var)}, y)"
    relax.analysis.well_formed(out)


def test_rewriter_emitting_nested_calls_gets_them_normalized_before_the_binding():
    def rewriter(orig, m, builder):
        return relax.op.multiply(relax.op.negative(m[X]), m[Y])

    out = rewrite_call(ADD, rewriter, add_chain, max_iterations=1)
    assert values(out)[1:3] == ["R.negative(a)", "R.multiply(lv, y)"]


# -- declining ------------------------------------------------------------------------------


@pytest.mark.parametrize("decline", [lambda orig, m: orig, lambda orig, m: None])
def test_declining_every_match_returns_the_input_itself(decline):
    out = rewrite_call(ADD, decline, add_chain)
    assert out.same_as(add_chain)


@pytest.mark.parametrize(
    "rewriter", [to_multiply, lambda orig, m: orig, lambda orig, m: None], ids=["no match", "orig", "None"]
)
def test_a_module_nothing_in_which_is_rewritten_comes_back_itself(rewriter):
    mod = tvm.IRModule({"main": add_chain.with_attr("global_symbol", "main")})
    pattern = is_op("relax.nn.conv2d")(wildcard(), wildcard()) if rewriter is to_multiply else ADD
    assert rewrite_call(pattern, rewriter, mod).same_as(mod)


def test_function_where_nothing_matches_comes_back_structurally_equal():
    pattern = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    out = rewrite_call(pattern, to_multiply, add_chain)
    tvm.ir.assert_structural_equal(out, add_chain)


def test_emitting_and_then_returning_none_is_an_error_naming_function_binding_and_pattern():
    before = add_chain.script()

    def rewriter(orig, m, builder):
        builder.emit(relax.op.negative(m[X]))
        return None

    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, rewriter, add_chain.with_attr("global_symbol", "main"))
    message = str(info.value)
    assert "'main'" in message and "'b'" in message and "relax.add(*, *)" in message
    assert "returned None" in message and "return orig" in message
    assert add_chain.script() == before


# -- errors ---------------------------------------------------------------------------------


def test_rewriter_that_raises_is_reported_with_the_original_exception_chained():
    boom = KeyError("missing")

    def rewriter(orig, m):
        raise boom

    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, rewriter, add_chain)
    assert info.value.__cause__ is boom
    message = str(info.value)
    assert "KeyError" in message and "'b'" in message and "relax.add" in message


def test_an_error_names_a_void_binding_by_its_callee_and_a_var_as_tvmscript_spells_it():
    # TVMScript prints a void binding with no var (they are all `_` when parsed), and the
    # parameter exported as `fc1.weight` as `fc1_weight`.
    from rewrite_ext.hexagon import copy_tensor_pattern
    from rewrite_ext.ops import copy_tensor

    x = relax.Var("fc1.weight", TensorType((16,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        a = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([16]), "float32", 0))
        bb.emit(copy_tensor(x, a), "_")
        b = bb.emit(relax.op.add(x, x), "fc1.out")
        bb.emit_func_output(relax.Tuple([a, b]))
    mod = bb.get()
    assert "fc1_weight" in mod.script() and "fc1_out" in mod.script()

    def rewriter(orig, m):
        raise KeyError("boom")

    with pytest.raises(RewriteError, match=r"binding '_ \(relax\.vm\.copy_tensor\)'"):
        rewrite_call(copy_tensor_pattern(), rewriter, mod)
    with pytest.raises(RewriteError, match="binding 'fc1_out'.*returned a void value"):
        rewrite_call(ADD, lambda orig, m: copy_tensor(m[X], m[Y]), mod)


@pytest.mark.parametrize(
    "returned, what", [(42, "an int"), ("R.add(a, b)", "a str"), ([relax.const(1.0)], "a list")]
)
def test_rewriter_returning_a_non_expression_is_an_error(returned, what):
    with pytest.raises(RewriteError, match=f"returned {what}, not a relax.Expr") as info:
        rewrite_call(ADD, lambda orig, m: returned, add_chain)
    assert "'b'" in str(info.value)


def test_rewriter_returning_an_invalid_expression_is_an_error_naming_the_binding():
    bad = relax.Var("z", TensorType((7, 3), "float32"))

    def rewriter(orig, m):
        return relax.op.add(m[X], bad)  # shapes (4,) and (7, 3) do not broadcast

    with pytest.raises(RewriteError, match="normalize") as info:
        rewrite_call(ADD, rewriter, add_chain)
    assert "'b'" in str(info.value)
    # TVM's complaint, with the op named, not printed whole with its arguments' docs
    assert "In relax.add," in str(info.value) and "ArgumentInfo" not in str(info.value)


def test_result_that_is_not_well_formed_is_an_error():
    stranger = relax.Var("stranger", TensorType((4,), "float32"))

    def rewriter(orig, m):
        return relax.op.multiply(m[X], stranger)  # a var bound nowhere in the function

    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, rewriter, add_chain)
    assert "'b'" in str(info.value) and "'stranger'" in str(info.value)


def test_rule_that_never_converges_is_an_error_naming_the_bindings_that_keep_matching():
    def swap(orig, m):
        return relax.op.add(m[Y], m[X])

    with pytest.raises(RewriteError, match="did not converge") as info:
        rewrite_call(ADD, swap, add_chain, max_iterations=3)
    message = str(info.value)
    # c = add(b, b) swaps into an equal expression: that is no change, so only b keeps matching
    assert "'b'" in message and "'c'" not in message and "max_iterations=3" in message


def test_a_rewrite_holding_the_matched_call_itself_is_named_as_why_it_never_converges():
    with pytest.raises(RewriteError, match="did not converge") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.astype(orig, "float16"), add_chain, max_iterations=2)
    assert "holds the very call that matched (as in R.astype(orig, ...))" in str(info.value)
    with pytest.raises(RewriteError, match="did not converge") as info:  # a swap holds no such call
        rewrite_call(ADD, lambda orig, m: relax.op.add(m[Y], m[X]), add_chain, max_iterations=2)
    assert "holds the very call" not in str(info.value)


def test_a_non_convergence_message_names_the_first_ten_bindings_and_counts_the_rest():
    builder = relax.BlockBuilder()
    x = relax.Var("x", TensorType((4,), "float32"))
    y = relax.Var("y", TensorType((4,), "float32"))
    with builder.function("many_adds", [x, y]):
        with builder.dataflow():
            out = x
            for i in range(13):
                out = builder.emit(relax.op.add(out, y), name_hint=f"s{i}")
            out = builder.emit_output(out)
        builder.emit_func_output(out)
    func = builder.get()["many_adds"]

    def swap(orig, m):
        return relax.op.add(m[Y], m[X])

    with pytest.raises(RewriteError, match="did not converge") as info:
        rewrite_call(ADD, swap, func, max_iterations=2)
    message = str(info.value)
    assert all(f"'s{i}'" in message for i in range(10)), message
    assert "'s10'" not in message and "and 3 more" in message, message


def test_a_structurally_equal_rebuild_counts_as_no_change_and_converges():
    def sort_operands(orig, m):
        lhs, rhs = sorted([m[X], m[Y]], key=lambda v: var_name(v))
        return relax.op.add(lhs, rhs)

    @R.function
    def f(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        a = R.add(y, x)
        b = R.add(a, x)
        return b

    out = rewrite_call(ADD, sort_operands, f)
    assert values(out, 0) == ["R.add(x, y)", "R.add(a, x)"]


def test_or_pattern_offers_the_next_alternative_when_the_rewriter_declines_one():
    first = is_op("relax.add")(X, Y)
    second = is_op("relax.add")(X, is_op("relax.negative")(wildcard()))
    pattern = first | second
    offered = []

    def rewriter(orig, m):
        offered.append("second" if second in m else "first")
        assert m[pattern].same_as(orig)  # the Or node itself is looked up as in TVM
        return None if second not in m else relax.op.multiply(m[X], m[X])

    @R.function
    def f(x: R.Tensor((4,), "float32")):
        n = R.negative(x)
        b = R.add(x, n)
        return b

    out = rewrite_call(pattern, rewriter, f)
    assert offered[:2] == ["first", "second"]
    # n was seen through by the second alternative and is unused now: dropped
    assert values(out) == ["R.multiply(x, x)"]


def test_impure_bindings_are_not_seen_through():
    pattern = is_op("relax.add")(is_op("relax.call_builtin_with_ctx")(wildcard(), wildcard()), Y)

    @R.function(pure=False)
    def f(x: R.Tensor((4,), "float32")):
        a = R.call_builtin_with_ctx("test.effect", (x,), **{TY_ARGS: [R.Tensor((4,), "float32")]})
        b = R.add(a, x)
        return b

    out = rewrite_call(pattern, lambda orig, m: relax.op.multiply(m[Y], m[Y]), f)
    assert out.same_as(f)


@I.ir_module
class InPlace:
    @T.prim_func(private=True)
    def fill5(A: T.Buffer((4,), "float32")):
        for i in range(4):
            A[i] = T.float32(5)

    @R.function
    def main(x0: R.Tensor((4,), "float32")):
        cls = InPlace
        with R.dataflow():
            x = R.add(x0, x0)
            a = R.add(x, x)  # reads x before fill5 overwrites it
            t = R.call_tir_inplace(cls.fill5, (x,), inplace_indices=[0], **{OUT_TY: R.Tensor((4,), "float32")})
            b = R.exp(a)
            R.output(b, t)
        return (b, t)


def test_in_place_calls_are_not_seen_through():
    # call_tir_inplace is pure by FPurity, yet it overwrites x: exp(x * 2) rebuilt after it
    # would read 5s (e^10 where the program computes e^1 for x0 = 0.25).
    pattern = is_op("relax.exp")(is_op("relax.add")(X, X))
    before = InPlace.script()
    out = rewrite_call(pattern, lambda orig, m: relax.op.exp(relax.op.multiply(m[X], relax.const(2.0, "float32"))), InPlace)
    assert out["main"].same_as(InPlace["main"])
    assert InPlace.script() == before
    # The same expression after nothing in place is still seen through.
    pure = rewrite_call(pattern, lambda orig, m: relax.op.exp(relax.op.multiply(m[X], relax.const(2.0, "float32"))), add_exp)
    assert not pure.same_as(add_exp)


@R.function
def add_exp(x: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.add(x, x)
        b = R.exp(a)
        R.output(b)
    return b


def test_patterns_naming_a_global_var_are_described_in_errors():
    from tvm.relax.dpl import is_call_tir

    pattern = is_call_tir("add_one", [X])

    def rewriter(orig, m):
        raise RuntimeError("boom")

    with pytest.raises(RewriteError, match="boom") as info:
        rewrite_call(pattern, rewriter, Module)
    assert "pattern relax.call_tir(@add_one, (*))" in str(info.value)  # not @*: any GlobalVar


def test_one_iteration_suffices_for_a_rewrite_whose_output_does_not_match():
    out = rewrite_call(ADD, to_multiply, add_chain, max_iterations=1)
    assert values(out) == ["R.exp(x)", "R.multiply(a, y)", "R.multiply(b, b)"]


ADD_OR_SUB = is_op("relax.add")(X, Y) | is_op("relax.subtract")(X, Y)


def _add_to_sub_to_mul(orig, m):
    # add -> subtract in one pass, subtract -> multiply in the next: two passes to converge
    if orig.op.name == "relax.add":
        return relax.op.subtract(m[X], m[Y])
    return relax.op.multiply(m[X], m[Y])


def test_a_rewrite_that_needs_two_passes_converges_with_max_iterations_two():
    out = rewrite_call(ADD_OR_SUB, _add_to_sub_to_mul, add_chain, max_iterations=2)
    assert values(out) == ["R.exp(x)", "R.multiply(a, y)", "R.multiply(b, b)"]


def test_a_rewrite_that_needs_two_passes_does_not_converge_in_one():
    with pytest.raises(RewriteError, match="max_iterations=1"):
        rewrite_call(ADD_OR_SUB, _add_to_sub_to_mul, add_chain, max_iterations=1)


def test_bindings_the_rewriter_emitted_are_not_matched_again_in_the_same_pass():
    seen = []

    def rewriter(orig, m, builder):
        seen.append(str(orig))
        if len(seen) <= 2:
            builder.emit(relax.op.add(m[X], m[X]))  # would match ADD if it were re-matched
            return relax.op.multiply(m[X], m[Y])
        return None

    rewrite_call(ADD, rewriter, add_chain)
    # pass 1 saw the two original adds; pass 2 saw the two emitted ones; nothing in between
    assert seen[:2] == ["R.add(a, y)", "R.add(b, b)"]
    assert len(seen) == 4


# -- void -----------------------------------------------------------------------------------


@R.function(pure=False)
def impure_with_unused(x: R.Tensor((4,), "float32")):
    a = R.exp(x)
    b = R.add(a, a)
    return x


def test_void_value_for_an_unused_binding_retypes_its_var_as_empty_tuple():
    def rewriter(orig, m, builder):
        return relax.op.call_builtin_with_ctx("test.sink", [m[X]], **VOID_TY_ARGS)

    out = rewrite_call(ADD, rewriter, impure_with_unused)
    binding = out.body.blocks[0].bindings[1]
    assert isinstance(ty(binding.var), TupleType) and len(ty(binding.var).fields) == 0
    relax.analysis.well_formed(out)


def test_void_value_for_a_binding_whose_var_is_used_later_is_an_error():
    @R.function(pure=False)
    def f(x: R.Tensor((4,), "float32")):
        a = R.add(x, x)
        b = R.multiply(a, x)
        return b

    def rewriter(orig, m):
        return relax.op.call_builtin_with_ctx("test.sink", [m[X]], **VOID_TY_ARGS)

    with pytest.raises(RewriteError, match="used later") as info:
        rewrite_call(ADD, rewriter, f)
    assert "'a'" in str(info.value)


def test_void_value_for_a_void_binding_keeps_the_var_and_emitted_void_calls_get_fresh_vars():
    sink = is_op("relax.call_builtin_with_ctx")(wildcard(), wildcard())

    @R.function(pure=False)
    def f(x: R.Tensor((4,), "float32")):
        R.call_builtin_with_ctx("test.first", (x,), **VOID_TY_ARGS)
        return x

    def rewriter(orig, m, builder):
        if str(orig.args[0]) != 'R.ExternFunc("test.first")':
            return None
        builder.emit(relax.op.call_builtin_with_ctx("test.before", [f.params[0]], **VOID_TY_ARGS))
        return relax.op.call_builtin_with_ctx("test.after", [f.params[0]], **VOID_TY_ARGS)

    out = rewrite_call(sink, rewriter, f)
    old = f.body.blocks[0].bindings[0].var
    new = out.body.blocks[0].bindings
    assert len(new) == 2
    assert new[1].var.same_as(old)
    assert not new[0].var.same_as(old)
    assert all(isinstance(ty(b.var), TupleType) and len(ty(b.var).fields) == 0 for b in new)
    assert 'test.before' in str(new[0].value) and 'test.after' in str(new[1].value)


# -- types ----------------------------------------------------------------------------------


def test_incompatible_type_retypes_the_var_and_updates_every_later_use():
    f = add_exp

    def rewriter(orig, m):
        return relax.op.astype(m[X], "float16")

    out = rewrite_call(ADD, rewriter, f)
    relax.analysis.well_formed(out)
    a, b = out.body.blocks[0].bindings
    assert ty(a.var).dtype == "float16"
    assert b.value.args[0].same_as(a.var)
    assert ty(b.var).dtype == "float16"  # exp of a float16 is float16: no stale annotation


@R.function
def exp_reshape_add(x: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.exp(x)
        b = R.reshape(a, R.shape([4]))  # a no-op until `a` becomes a matrix
        c = R.add(b, b)
        R.output(c)
    return c


_EXP = is_op("relax.exp")(X)
_RESHAPE = is_op("relax.reshape")(Y, wildcard())


def _exp_to_matrix(orig, m):
    return relax.op.reshape(relax.op.sqrt(m[X]), (2, 2))


def _drop_noop_reshape(orig, m):
    shape = orig.args[1]
    return m[Y] if tvm_ffi.structural_equal(ty(m[Y]).shape, shape) else orig


@pytest.mark.parametrize("form", ["rules", "one or-pattern"])
def test_a_later_match_reads_the_var_as_re_typed_earlier_in_the_same_pass(form):
    # `a` becomes (2, 2): the reshape of `a` to (4,) is no longer a no-op, and its rewriter
    # must see `a` typed (2, 2), as running the two rules one after the other does.
    seen = []

    def drop(orig, m):
        seen.append(tuple(int(d) for d in ty(m[Y]).shape))
        return _drop_noop_reshape(orig, m)

    if form == "rules":
        out = apply_rules([Rule(_EXP, _exp_to_matrix), Rule(_RESHAPE, drop)], exp_reshape_add)
    else:
        out = rewrite_call(
            _EXP | _RESHAPE, lambda orig, m: _exp_to_matrix(orig, m) if _EXP in m else drop(orig, m), exp_reshape_add
        )
    relax.analysis.well_formed(out)
    assert (2, 2) in seen and (4,) not in seen[: seen.index((2, 2)) + 1]
    b = out.body.blocks[0].bindings[2]
    assert b.value.op.name == "relax.reshape" and [int(d) for d in ty(b.var).shape] == [4]
    assert [int(d) for d in ty(out.body.body).shape] == [4]
    first = rewrite_call(_EXP, _exp_to_matrix, exp_reshape_add)
    one_after_the_other = apply_rules([Rule(_RESHAPE, _drop_noop_reshape)], first)
    assert_same_results(one_after_the_other, out)


def test_a_pattern_sees_through_a_binding_as_it_reads_after_an_earlier_re_type():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.exp(a)
            c = R.multiply(b, b)
            R.output(c)
        return c

    def to_half(orig, m):
        return relax.op.astype(relax.op.multiply(m[X], relax.const(2.0, "float32")), "float16")

    exp_f32 = is_op("relax.exp")(wildcard()).has_dtype("float32")
    rules = [
        Rule(is_op("relax.add")(X, X), to_half),
        Rule(is_op("relax.multiply")(exp_f32, exp_f32), lambda orig, m: relax.op.zeros_like(orig)),
    ]
    out = apply_rules(rules, f)
    relax.analysis.well_formed(out)
    # `b` is exp of a float16 value now: float16, so the float32-only pattern must not match it.
    assert "zeros_like" not in out.script()
    assert ty(out.body.body).dtype == "float16"
    assert_same_results(apply_rules(rules[1:], apply_rules(rules[:1], f)), out)


def test_a_later_binding_tvm_cannot_type_against_a_re_typed_var_names_both_bindings():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            b = R.add(x, x)
            c = R.add(b, x)
            R.output(c)
        return c

    def to_half(orig, m):
        if ty(m[X]).dtype != "float32" or ty(m[Y]).dtype != "float32":
            raise Decline("only float32 adds")
        return relax.op.astype(relax.op.subtract(m[X], relax.op.negative(m[Y])), "float16")

    before = f.script()
    with pytest.raises(RewriteError, match="binding 'c'.*the rewrite of binding 'b' changed its var's type"):
        rewrite_call(is_op("relax.add")(X, Y), to_half, f)
    assert f.script() == before


def test_a_pattern_nested_deeper_than_python_recurses_works_as_under_tvm():
    depth = 400  # (Python's recursion limit is 1000; TVM's matcher recurses in C++)
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for _ in range(depth):
                v = bb.emit(relax.op.exp(v))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    func = bb.get()["main"]
    pattern = w = wildcard()
    for _ in range(depth):
        pattern = is_op("relax.exp")(pattern)
    got = rewrite_call(pattern, lambda orig, m: relax.op.sqrt(m[w]), func)
    relax.analysis.well_formed(got)
    assert "R.sqrt(x)" in got.script() and "R.exp" not in got.script()


def test_a_pattern_of_more_alternatives_than_python_recurses_works_as_under_tvm():
    pattern = is_op("relax.exp")(wildcard())
    for _ in range(1500):  # a left-nested Or, 1500 deep
        pattern = pattern | is_op("relax.add")(wildcard(), wildcard())

    def exp_to_sqrt(orig, m):
        return relax.op.sqrt(orig.args[0]) if orig.op.name == "relax.exp" else orig

    got = rewrite_call(pattern, exp_to_sqrt, add_exp)
    relax.analysis.well_formed(got)
    assert "R.sqrt(a)" in got.script() and "R.add(x, x)" in got.script()


@R.function
def dense(x: R.Tensor((4, 16), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((32,), "float32")):
    with R.dataflow():
        p = R.permute_dims(w)
        m = R.matmul(x, p)
        a = R.add(m, b)
        R.output(a)
    return a


def test_a_rewriter_rebuilding_what_it_matched_converges_with_cleanup_and_is_told_so_without():
    transpose = is_op("relax.permute_dims")(wildcard())
    mm = is_op("relax.matmul")(wildcard(), transpose)
    bias = wildcard()
    pattern = is_op("relax.add")(mm, bias)

    def rebuild(orig, m):  # TVM style: new calls from the matched sub-calls' args and attrs
        again = relax.op.permute_dims(m[transpose].args[0], m[transpose].attrs.axes)
        return relax.op.add(relax.op.matmul(m[mm].args[0], again), m[bias])

    tvm.ir.assert_structural_equal(rewrite_call(pattern, rebuild, dense, cleanup=True), dense)
    with pytest.raises(RewriteError, match="did not converge.*return orig instead, or run with cleanup=True"):
        rewrite_call(pattern, rebuild, dense)


def test_an_if_var_annotated_looser_than_its_branches_stays_defined_after_a_rewrite_inside():
    # TVM's mutator re-binds the If to a var of the branches' tighter type; the returned tuple
    # must follow it (relax_modules generates such annotations; the parser would tighten them).
    t4, loose = TensorType([4], "float32"), TensorType(dtype="float32", ndim=1)
    x, cond, v, y = relax.Var("x", t4), relax.Var("cond", TensorType([], "bool")), relax.Var("v", t4), relax.Var("y", loose)
    else_ = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(v, relax.op.exp(x))])], v)
    body = relax.SeqExpr(
        [relax.BindingBlock([relax.VarBinding(y, relax.If(cond, relax.SeqExpr([], x), else_))])], relax.Tuple([y, x])
    )
    func = relax.Function([x, cond], relax.BlockBuilder().normalize(body), TupleType([loose, t4]))
    relax.analysis.well_formed(func)

    def trace(orig, m, builder):
        builder.emit(relax.op.negative(m[X]))
        return orig

    out = rewrite_call(is_op("relax.exp")(X), trace, func)
    relax.analysis.well_formed(out)
    assert "R.negative(x)" in out.script()
    assert_same_results(func.with_attr("global_symbol", "main"), out.with_attr("global_symbol", "main"))


def test_compatible_type_keeps_the_binding_var():
    out = rewrite_call(ADD, to_multiply, add_chain)
    for old, new in zip(add_chain.body.blocks[0].bindings, out.body.blocks[0].bindings):
        assert old.var.same_as(new.var)


# -- matchings ------------------------------------------------------------------------------


def test_matchings_give_leaf_matches_as_the_vars_themselves():
    got = {}

    def rewriter(orig, m):
        got.update(x=m[X], y=m[Y])
        return None

    rewrite_call(ADD, rewriter, add_chain)
    # last match: c = add(b, b)
    assert got["x"].same_as(add_chain.body.blocks[0].bindings[1].var)


def test_matchings_give_values_seen_through_as_tvm_does_and_a_returned_value_becomes_its_var():
    exp_x = is_op("relax.exp")(X)
    pattern = is_op("relax.add")(exp_x, Y)
    got = {}

    def rewriter(orig, m):
        got.update(exp=m[exp_x], x=m[X])
        assert m[exp_x].op.name == "relax.exp"  # a TVM rewriter may read the matched call
        return relax.op.subtract(m[exp_x], m[Y])  # the bound value itself, not a copy

    out = rewrite_call(pattern, rewriter, add_chain)
    a = add_chain.body.blocks[0].bindings[0]
    assert got["exp"].same_as(a.value)
    assert got["x"].same_as(add_chain.params[0])
    # the value bound to a is referred to through a: exp(x) is computed once
    assert values(out) == ["R.exp(x)", "R.subtract(a, y)", "R.add(b, b)"]


def test_matchings_see_through_bindings_and_drop_interior_bindings_left_unused():
    exp_x = is_op("relax.exp")(X)
    pattern = is_op("relax.add")(exp_x, Y)

    def rewriter(orig, m):
        return relax.op.subtract(m[X], m[Y])

    out = rewrite_call(pattern, rewriter, add_chain)
    # the interior binding a = exp(x) is pure and no longer used: it is gone
    assert values(out) == ["R.subtract(x, y)", "R.add(b, b)"]


def test_interior_binding_still_used_elsewhere_is_kept():
    @R.function
    def f(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, y)
            c = R.multiply(a, b)
            R.output(c)
        return c

    pattern = is_op("relax.add")(is_op("relax.exp")(X), Y)
    out = rewrite_call(pattern, lambda orig, m: relax.op.subtract(m[X], m[Y]), f)
    assert values(out) == ["R.exp(x)", "R.subtract(x, y)", "R.multiply(a, b)"]


def test_unused_bindings_that_were_not_part_of_a_match_are_kept():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        unused = R.exp(x)
        b = R.add(x, x)
        also_unused = R.negative(b)
        return b

    out = rewrite_call(ADD, to_multiply, f)
    assert values(out) == ["R.exp(x)", "R.multiply(x, x)", "R.negative(b)"]


# -- where matching happens -----------------------------------------------------------------


def test_matches_in_plain_blocks_of_pure_and_impure_functions():
    @R.function
    def pure(x: R.Tensor((4,), "float32")):
        b = R.add(x, x)
        return b

    @R.function(pure=False)
    def impure(x: R.Tensor((4,), "float32")):
        R.print(x, format="{}")
        b = R.add(x, x)
        R.print(b, format="{}")
        return b

    assert values(rewrite_call(ADD, to_multiply, pure)) == ["R.multiply(x, x)"]
    out = values(rewrite_call(ADD, to_multiply, impure))
    assert out[1] == "R.multiply(x, x)" and out[0].startswith("R.print") and out[2].startswith("R.print")


def test_matches_in_both_if_branches():
    @R.function
    def f(cond: R.Tensor((), "bool"), x: R.Tensor((4,), "float32")):
        if cond:
            a = R.add(x, x)
            r = a
        else:
            b = R.add(x, R.exp(x))
            r = b
        return r

    out = rewrite_call(ADD, to_multiply, f)
    text = out.script()
    assert "R.add" not in text and text.count("R.multiply") == 2
    relax.analysis.well_formed(out)


def test_matches_inside_nested_local_functions():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        @R.function
        def inner(y: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            z = R.add(y, y)
            return z

        out = inner(x)
        return out

    out = rewrite_call(ADD, to_multiply, f)
    text = out.script()
    assert "R.add" not in text and "R.multiply(y, y)" in text
    relax.analysis.well_formed(out)


# -- purity ---------------------------------------------------------------------------------


def _emit_impure(orig, m, builder):
    builder.emit(relax.op.call_builtin_with_ctx("test.effect", [m[X]], **VOID_TY_ARGS))
    return relax.op.multiply(m[X], m[Y])


def test_impure_call_emitted_into_a_dataflow_block_is_an_error_that_says_how_to_fix_it():
    with pytest.raises(RewriteError, match="DataflowBlock") as info:
        rewrite_call(ADD, _emit_impure, add_chain)
    assert "leaving dataflow" in str(info.value) and "'b'" in str(info.value)


def test_impure_call_nested_in_the_returned_value_of_a_dataflow_block_is_an_error():
    # Normalizing the returned value binds its nested impure call in the block: checked too.
    def nested_impure(orig, m):
        effect = relax.op.call_builtin_with_ctx("test.effect", [m[X]], **{TY_ARGS: [TensorType((4,), "float32")]})
        return relax.op.multiply(effect, m[Y])

    text = add_chain.script()
    with pytest.raises(RewriteError, match="DataflowBlock") as info:
        rewrite_call(ADD, nested_impure, add_chain)
    assert "test.effect" in str(info.value) and "'b'" in str(info.value)
    assert "returned (nested in the value it returned)" in str(info.value)
    assert add_chain.script() == text


def test_impure_call_in_a_pure_function_is_an_error_that_says_how_to_fix_it():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        b = R.add(x, x)
        return b

    with pytest.raises(RewriteError, match="pure=False"):
        rewrite_call(ADD, _emit_impure, f)

    def return_impure(orig, m):
        return relax.op.call_builtin_with_ctx("test.effect", [m[X]], **{TY_ARGS: [TensorType((4,), "float32")]})

    with pytest.raises(RewriteError, match="returned the impure call"):
        rewrite_call(ADD, return_impure, f)


def test_impure_call_in_a_plain_block_of_an_impure_function_is_allowed():
    out = rewrite_call(ADD, _emit_impure, impure_with_unused)
    assert "test.effect" in values(out)[1]
    relax.analysis.well_formed(out)


# -- the input is never changed -------------------------------------------------------------


def test_input_function_is_unchanged_after_success_and_after_failure():
    before = add_chain.script()
    rewrite_call(ADD, to_multiply, add_chain)
    with pytest.raises(RewriteError):
        rewrite_call(ADD, lambda orig, m: 1, add_chain)
    assert add_chain.script() == before


# -- rewriter signatures --------------------------------------------------------------------


class _CallableRewriter:
    def __call__(self, orig, m, builder):
        return relax.op.multiply(builder.emit(relax.op.negative(m[X])), m[Y])


def _three(orig, m, builder, scale=1):
    return relax.op.multiply(builder.emit(relax.op.negative(m[X])), m[Y])


def _tvm_style_with_option(orig, m, verbose=False):
    # Written for TVM's rewrite_call, which calls it with two arguments.
    if verbose is not False:
        raise AssertionError(f"verbose got {verbose!r}")
    return relax.op.multiply(m[X], m[Y])


@pytest.mark.parametrize(
    "rewriter, emits",
    [
        (to_multiply, False),
        (lambda orig, m: relax.op.multiply(m[X], m[Y]), False),
        (lambda orig, m, b: relax.op.multiply(b.emit(relax.op.negative(m[X])), m[Y]), True),
        (_CallableRewriter(), True),
        (functools.partial(_three, scale=2), True),
        (lambda *args: relax.op.multiply(args[2].emit(relax.op.negative(args[1][X])), args[1][Y]), True),
        (_tvm_style_with_option, False),
    ],
)
def test_rewriter_form_is_read_from_its_signature(rewriter, emits):
    out = rewrite_call(ADD, rewriter, add_chain, max_iterations=1)
    assert ("R.negative" in out.script()) == emits


def test_an_optional_third_parameter_keeps_its_default_as_under_tvm():
    ours = rewrite_call(ADD, _tvm_style_with_option, add_chain)
    theirs = relax.dpl.rewrite_call(ADD, _tvm_style_with_option, add_chain)
    assert tvm_ffi.structural_equal(ours, theirs)


# -- modules and passes ---------------------------------------------------------------------


@I.ir_module
class Module:
    @T.prim_func(private=True)
    def add_one(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i] + T.float32(1)

    @R.function
    def main(x: R.Tensor((4,), "float32")):
        cls = Module
        with R.dataflow():
            a = R.call_tir(cls.add_one, (x,), **{OUT_TY: R.Tensor((4,), "float32")})
            b = R.add(a, a)
            R.output(b)
        return b

    @R.function
    def other(x: R.Tensor((4,), "float32")):
        b = R.add(x, x)
        return b


def test_module_target_rewrites_every_relax_function_and_keeps_the_rest():
    before = Module.script()
    out = rewrite_call(ADD, to_multiply, Module)
    assert isinstance(out, tvm.IRModule) and not out.same_as(Module)
    assert "R.add" not in out.script()
    tvm.ir.assert_structural_equal(out["add_one"], Module["add_one"])
    assert Module.script() == before
    relax.analysis.well_formed(out)


def _add_by_emit_te(orig, m, builder):
    # A kernel of TE's, named like the module's own add_one to see that neither is lost.
    return builder.emit_te(topi.add, m[X], m[Y], primfunc_name_hint="add_one")


def _module_with_kernel() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit_te(topi.exp, x, primfunc_name_hint="add_one")
            b = bb.emit(relax.op.add(a, x))
            c = bb.emit_output(relax.op.add(b, a))
        bb.emit_func_output(c)
    return bb.get()


def test_kernels_a_rewriter_adds_with_emit_te_are_added_to_the_module():
    mod = _module_with_kernel()
    before = mod.script()
    out = rewrite_call(ADD, _add_by_emit_te, mod)
    relax.analysis.well_formed(out)
    prim_funcs = {gv.name_hint for gv, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(prim_funcs) == 2 and "add_one" in prim_funcs  # the module's kernel and TE's, added once
    tvm.ir.assert_structural_equal(out["add_one"], mod["add_one"])
    assert "R.add" not in out.script() and out.script().count("R.call_tir") == 3
    assert mod.script() == before
    assert_same_results(mod, out)


def test_a_kernel_added_for_a_declined_match_is_not_added_to_the_module():
    def declines_after_emit_te(orig, m, builder):
        builder.emit_te(topi.add, m[X], m[Y])
        raise Decline("changed my mind")

    out = rewrite_call(ADD, lambda o, m: relax.op.multiply(m[X], m[Y]), Module)
    both = apply_rules([Rule(ADD, declines_after_emit_te), Rule(ADD, lambda o, m: relax.op.multiply(m[X], m[Y]))], Module)
    tvm.ir.assert_structural_equal(both, out)


def test_a_function_target_cannot_carry_a_kernel_added_with_emit_te():
    before = Module["main"].script()
    with pytest.raises(RewriteError) as info:
        rewrite_call(ADD, _add_by_emit_te, Module["main"])
    message = str(info.value)
    assert "'main'" in message and "binding 'b'" in message and "relax.add" in message
    assert "emit_te" in message and "IRModule" in message
    assert Module["main"].script() == before


def test_rewrite_call_pass_composes_in_sequential():
    seq = tvm.transform.Sequential([RewriteCall(ADD, to_multiply, name="AddToMul"), relax.transform.FoldConstant()])
    out = seq(Module)
    tvm.ir.assert_structural_equal(out, rewrite_call(ADD, to_multiply, Module))
    assert RewriteCall(ADD, to_multiply, name="AddToMul").info.name == "AddToMul"


def test_rewrite_error_keeps_its_type_and_message_through_sequential():
    def rewriter(orig, m):
        raise ValueError("no good")

    seq = tvm.transform.Sequential([RewriteCall(ADD, rewriter)])
    with pytest.raises(RewriteError) as info:
        seq(Module)
    message = str(info.value)
    assert "no good" in message and "'main'" in message and "'b'" in message and "relax.add" in message


def test_rewrite_error_is_registered_with_tvm_ffi():
    import tvm_ffi

    converted = tvm_ffi.convert(RewriteError("kept")).py_error()
    assert isinstance(converted, RewriteError) and "kept" in str(converted)


def test_bad_arguments_fail_at_once():
    with pytest.raises(TypeError):
        rewrite_call("relax.add", to_multiply, add_chain)
    with pytest.raises(TypeError):
        RewriteCall(ADD, "not callable")
    with pytest.raises(ValueError):
        rewrite_call(ADD, to_multiply, add_chain, max_iterations=0)
    with pytest.raises(TypeError):
        rewrite_call(ADD, to_multiply, relax.const(1.0))


# -- the garbage collector ---------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cyclic_gc_is_paused_while_rewriters_run_and_left_as_it_was(enabled):
    """Rewrites pause Python's cyclic GC (docs/performance.md); it comes back as the caller had
    it, after a result and after an error alike."""
    import gc

    seen = []

    def rewriter(orig, m):
        seen.append(gc.isenabled())
        return relax.op.multiply(m[X], m[Y])

    def failing(orig, m):
        raise KeyError("missing")

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        rewrite_call(ADD, rewriter, add_chain)
        assert gc.isenabled() is enabled
        with pytest.raises(RewriteError):
            rewrite_call(ADD, failing, add_chain)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [False, False]
