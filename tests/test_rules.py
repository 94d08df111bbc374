"""Several rules in one traversal, Decline, RewriteReport, the logger, dry_run and cleanup=True."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext
from rewrite_ext import (
    Decline,
    RewriteCall,
    RewriteError,
    RewriteReport,
    RewriteRules,
    Rule,
    apply_rules,
    rewrite_call,
)
from rewrite_ext.hexagon import copy_to_dma
from rewrite_ext.testing import assert_same_results
from rewrite_ext.testing.strategies import lowered_copy_functions
from rewrite_ext.compat import VOID_TY_ARGS, imm, ty, var_name
from _helpers import for_this_tvm, spelled_as_026

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)
MUL = is_op("relax.multiply")(X, Y)
EXP = is_op("relax.exp")(X)


def add_to_subtract(orig, m):
    return relax.op.subtract(m[X], m[Y])


def add_to_multiply(orig, m):
    return relax.op.multiply(m[X], m[Y])


def mul_to_add(orig, m):
    return relax.op.add(m[X], m[Y])


def exp_to_abs(orig, m):
    return relax.op.abs(m[X])


@R.function
def chain(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.exp(x)
        b = R.add(a, y)
        c = R.multiply(b, b)
        d = R.add(c, a)
        R.output(d)
    return d


def values(func: relax.Function) -> list[str]:
    return [str(b.value) for block in func.body.blocks for b in block.bindings]


# -- Rule ------------------------------------------------------------------------------------


def test_rule_is_named_for_its_rewriter_unless_named():
    assert Rule(ADD, add_to_subtract).name == "add_to_subtract"
    assert Rule(ADD, add_to_subtract, name="sub").name == "sub"
    assert "rule 'sub'" in repr(Rule(ADD, add_to_subtract, name="sub"))


def test_rule_rejects_what_is_not_a_pattern_or_a_rewriter():
    with pytest.raises(TypeError, match="pattern must be a relax.dpl.DFPattern"):
        Rule("relax.add", add_to_subtract)
    with pytest.raises(TypeError, match="rewriter must be callable"):
        Rule(ADD, 3)
    with pytest.raises(TypeError, match="rules must be rewrite_ext.Rule objects"):
        apply_rules([(ADD, add_to_subtract)], chain)
    with pytest.raises(TypeError, match="rules must be rewrite_ext.Rule objects"):
        RewriteRules([ADD])


# -- several rules, one traversal ------------------------------------------------------------


def test_rules_on_different_ops_rewrite_in_one_pass():
    text = chain.script()
    report = RewriteReport()
    out = apply_rules([Rule(ADD, add_to_subtract), Rule(EXP, exp_to_abs)], chain, report=report)
    assert values(out) == ["R.abs(x)", "R.subtract(a, y)", "R.multiply(b, b)", "R.subtract(c, a)"]
    # one pass rewrote all three; nothing it made can match, so no second pass looks
    assert report.passes == {"chain": 1}
    tvm.ir.assert_structural_equal(
        apply_rules([Rule(ADD, add_to_subtract), Rule(EXP, exp_to_abs)], chain, max_iterations=1), out
    )
    relax.analysis.well_formed(out)
    assert chain.script() == text


def test_a_nested_value_a_rule_returns_is_matched_in_the_next_pass():
    # exp -> abs(add(x, x)): normalizing it binds the nested add, which the add rule takes
    # in a second pass; nothing the second pass made can match, so there is no third.
    def exp_to_abs_of_add(orig, m):
        return relax.op.abs(relax.op.add(m[X], m[X]))

    report = RewriteReport()
    out = apply_rules([Rule(EXP, exp_to_abs_of_add), Rule(ADD, add_to_subtract)], chain, report=report)
    assert values(out)[:2] == ["R.subtract(x, x)", "R.abs(lv)"]
    assert not any("R.add" in v for v in values(out))
    assert report.passes == {"chain": 2}
    relax.analysis.well_formed(out)


def test_bindings_inside_an_if_a_rule_returns_are_matched_in_the_next_pass():
    @R.function
    def f(x: R.Tensor((4,), "float32"), c: R.Tensor((), "bool")):
        b = R.exp(x)
        return b

    cond = f.params[1]

    def exp_to_if(orig, m):
        return relax.If(cond, relax.SeqExpr([], relax.op.add(m[X], m[X])), relax.SeqExpr([], m[X]))

    report = RewriteReport()
    out = apply_rules([Rule(EXP, exp_to_if), Rule(ADD, add_to_subtract)], f, report=report)
    text = out.script()
    assert "R.subtract(x, x)" in text and "R.add" not in text
    assert report.passes == {"f": 2}
    relax.analysis.well_formed(out)


def test_a_var_re_typed_by_a_rewrite_is_matched_again_with_its_new_type():
    # The add becomes float16, so the multiply reading it is re-typed float16: only then
    # does the float16-only rule match it, in the pass after.
    @R.function
    def f(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            b = R.add(x, y)
            c = R.multiply(b, b)
            R.output(c)
        return c

    def add_to_half(orig, m):
        return relax.op.astype(relax.op.subtract(m[X], m[Y]), "float16")

    def mul_to_divide(orig, m):
        return relax.op.divide(m[X], m[Y])

    half_mul = is_op("relax.multiply")(X, Y).has_dtype("float16")
    report = RewriteReport()
    out = apply_rules([Rule(ADD, add_to_half), Rule(half_mul, mul_to_divide)], f, report=report)
    assert values(out)[-1] == "R.divide(b, b)"
    assert report.passes == {"f": 2}
    relax.analysis.well_formed(out)


def test_a_kept_binding_is_offered_to_the_next_rule_in_the_next_pass():
    def trace(orig, m, builder):
        builder.emit(relax.op.call_pure_packed("my.trace", m[X], **VOID_TY_ARGS))
        return orig

    out = apply_rules([Rule(ADD, trace), Rule(ADD, add_to_subtract)], chain)
    assert "my.trace" in values(out)[1] and values(out)[2] == "R.subtract(a, y)"
    relax.analysis.well_formed(out)


def test_first_rule_that_matches_and_does_not_decline_wins():
    out = apply_rules([Rule(ADD, add_to_subtract), Rule(ADD, add_to_multiply)], chain)
    assert values(out)[1] == "R.subtract(a, y)"
    out = apply_rules([Rule(ADD, add_to_multiply), Rule(ADD, add_to_subtract)], chain, max_iterations=1)
    assert values(out)[1] == "R.multiply(a, y)"

    def decline(orig, m):
        raise Decline("not this one")

    def returns_none(orig, m):
        return None

    for first in (decline, returns_none):
        out = apply_rules([Rule(ADD, first), Rule(ADD, add_to_multiply)], chain, max_iterations=1)
        assert values(out)[1] == "R.multiply(a, y)"


def test_rules_matching_any_value_keep_their_place_among_op_rules():
    def any_add_to_multiply(orig, m):
        if isinstance(orig, relax.Call) and getattr(orig.op, "name", "") == "relax.add":
            return relax.op.multiply(*orig.args)
        return None

    anything = Rule(wildcard(), any_add_to_multiply)
    out = apply_rules([anything, Rule(ADD, add_to_subtract)], chain, max_iterations=1)
    assert values(out)[1] == "R.multiply(a, y)"
    out = apply_rules([Rule(ADD, add_to_subtract), anything], chain, max_iterations=1)
    assert values(out)[1] == "R.subtract(a, y)"


def test_a_rule_is_offered_only_bindings_its_root_op_can_match():
    report = RewriteReport()
    apply_rules([Rule(EXP, exp_to_abs), Rule(MUL, lambda o, m: None, name="mul")], chain, report=report)
    # exp: the one exp binding; mul: the one multiply binding.  The pass made an abs, which
    # neither rule can match, so no second pass offers the multiply again.
    assert report.rules["exp_to_abs"].offered == 1
    assert report.rules["mul"].offered == 1
    assert report.rules["mul"].declined == [("chain", "c", "returned None")]
    assert report.passes == {"chain": 1}


def test_output_of_one_rule_is_matched_by_another_in_the_next_pass():
    def exp_to_add(orig, m):
        return relax.op.add(m[X], m[X])

    report = RewriteReport()
    out = apply_rules([Rule(ADD, add_to_subtract), Rule(EXP, exp_to_add)], chain, report=report)
    assert values(out)[0] == "R.subtract(x, x)"
    # the first pass made an add, which the second rewrote; a subtract matches nothing
    assert report.passes == {"chain": 2}
    with pytest.raises(RewriteError, match="did not converge after max_iterations=1") as info:
        apply_rules([Rule(ADD, add_to_subtract), Rule(EXP, exp_to_add)], chain, max_iterations=1)
    assert "match no rule's pattern (its own or another's)" in str(info.value)


def test_rules_that_undo_each_other_are_bounded_and_the_error_names_both():
    rules = [Rule(ADD, add_to_multiply, name="add->mul"), Rule(MUL, mul_to_add, name="mul->add")]
    with pytest.raises(RewriteError, match=r"rule 'add->mul'\) or .*rule 'mul->add'\): did not converge"):
        apply_rules(rules, chain, max_iterations=3)


def test_an_error_names_the_rule():
    def broken(orig, m):
        raise KeyError("oops")

    with pytest.raises(RewriteError, match=r"binding 'a', pattern relax.exp\(\*\) \(rule 'broken'\).*KeyError"):
        apply_rules([Rule(ADD, add_to_subtract), Rule(EXP, broken)], chain)


def test_rewrite_call_is_apply_rules_of_one_rule():
    for func in (chain, tvm.IRModule({"main": chain})):
        tvm.ir.assert_structural_equal(
            rewrite_call(ADD, add_to_subtract, func), apply_rules([Rule(ADD, add_to_subtract)], func)
        )


def test_rewrite_rules_pass_composes_and_its_report_accumulates():
    report = RewriteReport()
    rules_pass = RewriteRules([Rule(ADD, add_to_subtract), Rule(EXP, exp_to_abs)], name="MyRules", report=report)
    assert rules_pass.info.name == "MyRules"
    mod = tvm.IRModule({"main": chain})
    out = tvm.transform.Sequential([rules_pass, relax.transform.ToNonDataflow()])(mod)
    assert values(out["main"]) == ["R.abs(x)", "R.subtract(a, y)", "R.multiply(b, b)", "R.subtract(c, a)"]
    rules_pass(mod)
    assert len(report.rules["add_to_subtract"].rewritten) == 4  # two runs of two bindings
    assert RewriteRules([Rule(ADD, add_to_subtract)]).info.name == "RewriteRules"


def test_rewrite_call_pass_takes_a_report():
    report = RewriteReport()
    RewriteCall(ADD, add_to_subtract, report=report)(tvm.IRModule({"main": chain}))
    assert report.rules["add_to_subtract"].rewritten == [("main", "b"), ("main", "d")]


# -- Decline and the report ------------------------------------------------------------------


@I.ir_module
class Staged:
    @R.function(pure=False)
    def main(x: R.Tensor((8,), "float32")) -> R.Tensor((8,), "float32"):
        vtcm = R.vm.alloc_storage(R.shape([32]), R.prim_value(0), R.dtype("uint8"), R.str("global.vtcm"))
        a = R.vm.alloc_tensor(vtcm, R.prim_value(0), R.shape([8]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        host = R.vm.alloc_storage(R.shape([32]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        b = R.vm.alloc_tensor(host, R.prim_value(0), R.shape([8]), R.dtype("float32"))
        R.vm.copy_tensor(a, b)
        return b


SRC, DST = wildcard(), wildcard()
COPY = is_op("relax.vm.copy_tensor")(SRC, DST)


def vtcm_tensors(func: relax.Function) -> set[relax.Var]:
    """Vars of tensors allocated in storage of scope global.vtcm."""
    scope = {}
    found = set()
    for b in bindings(func):
        op = getattr(b.value, "op", None)
        if op is not None and getattr(op, "name", "") == "relax.vm.alloc_storage":
            scope[b.var] = b.value.args[3].value
        elif op is not None and getattr(op, "name", "") == "relax.vm.alloc_tensor":
            if scope.get(b.value.args[0]) == "global.vtcm":
                found.add(b.var)
    return found


def test_decline_with_a_reason_as_a_lowering_rule_does():
    in_vtcm = vtcm_tensors(Staged["main"])

    def copy_into_vtcm(orig, m, builder):
        if m[DST] not in in_vtcm:
            raise Decline("dst is not in VTCM")
        args = relax.Tuple([m[SRC], m[DST], imm(0), imm(1)])
        builder.emit(relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", args, **VOID_TY_ARGS))
        return relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", args, **VOID_TY_ARGS)

    report = RewriteReport()
    out = rewrite_call(COPY, copy_into_vtcm, Staged, report=report)
    rule = report.rules["copy_into_vtcm"]
    # a void binding is named by its callee: TVMScript names every one of them `_`
    assert [b for _, b in rule.rewritten] == ["_ (relax.vm.copy_tensor)"]
    assert [reason for _, _, reason in rule.declined] == ["dst is not in VTCM"]
    assert "dst is not in VTCM (1)" in str(report)
    calls = [str(b.value) for b in bindings(out["main"])]
    assert sum("dma_copy" in c for c in calls) == 1 and sum("copy_tensor(a, b)" in c for c in calls) == 1


def test_decline_leaves_the_binding_records_the_reason_and_drops_what_was_emitted():
    def emit_then_decline(orig, m, builder):
        builder.emit(relax.op.negative(m[X]))
        raise Decline("changed my mind")

    report = RewriteReport()
    out = apply_rules([Rule(ADD, emit_then_decline)], chain, report=report)
    assert out.same_as(chain)
    assert report.rules["emit_then_decline"].declined == [
        ("chain", "b", "changed my mind"),
        ("chain", "d", "changed my mind"),
    ]


def test_report_counts_offered_rewritten_kept_and_declined_per_rule():
    def keep_with_a_check(orig, m, builder):
        builder.emit(relax.op.call_pure_packed("my.check", m[X], **VOID_TY_ARGS))
        return orig

    def no_change(orig, m):
        return orig

    report = RewriteReport()
    apply_rules(
        [Rule(EXP, keep_with_a_check), Rule(MUL, no_change), Rule(ADD, add_to_subtract), Rule(is_tuple([X]), no_change)],
        tvm.IRModule({"main": chain}),
        report=report,
    )
    keep, mul, add, unused = (report.rules[n] for n in ("keep_with_a_check", "no_change", "add_to_subtract", "no_change#2"))
    assert (keep.offered, keep.kept, keep.rewritten, keep.declined) == (1, [("main", "a")], [], [])
    assert (mul.offered, mul.rewritten) == (2, [])
    assert mul.declined == [("main", "c", "no change")] * 2
    assert (add.offered, add.rewritten) == (2, [("main", "b"), ("main", "d")])
    assert (unused.offered, unused.rewritten, unused.declined) == (0, [], [])
    assert report.passes == {"main": 2}


def test_report_table_and_dict():
    report = RewriteReport()
    apply_rules(
        [Rule(ADD, add_to_subtract), Rule(MUL, lambda o, m: (_ for _ in ()).throw(Decline("square")), name="mul")],
        tvm.IRModule({"main": chain}),
        report=report,
    )
    lines = str(report).splitlines()
    assert lines[0].split() == ["rule", "offered", "rewritten", "kept", "declined", "reasons", "declined"]
    assert lines[1].split() == ["add_to_subtract", "2", "2", "0", "0"]
    assert lines[2].split()[:5] == ["mul", "1", "0", "0", "1"] and lines[2].endswith("square (1)")
    assert lines[-1] == "passes per function: main: 1"
    as_dict = json.loads(json.dumps(report.to_dict()))
    assert as_dict["passes"] == {"main": 1}
    assert as_dict["rules"][0] == {
        "name": "add_to_subtract",
        "pattern": "relax.add(*, *)",
        "offered": 2,
        "rewritten": [["main", "b"], ["main", "d"]],
        "kept": [],
        "declined": [],
    }
    assert as_dict["rules"][1]["declined"] == [["main", "c", "square"]]


def test_report_must_be_a_rewrite_report():
    with pytest.raises(TypeError, match="report must be a rewrite_ext.RewriteReport"):
        rewrite_call(ADD, add_to_subtract, chain, report={})


# -- dry_run and logging ---------------------------------------------------------------------


def test_dry_run_fills_the_report_and_returns_the_input():
    report = RewriteReport()
    out = rewrite_call(ADD, add_to_subtract, chain, report=report, dry_run=True)
    assert out is chain
    assert report.rules["add_to_subtract"].rewritten == [("chain", "b"), ("chain", "d")]
    mod = tvm.IRModule({"main": chain})
    assert apply_rules([Rule(ADD, add_to_subtract)], mod, dry_run=True) is mod


def test_dry_run_still_raises_what_the_rewrite_would_raise():
    def void_for_a_used_var(orig, m):
        return relax.op.call_pure_packed("my.f", m[X], **VOID_TY_ARGS)

    with pytest.raises(RewriteError, match="void value"):
        rewrite_call(ADD, void_for_a_used_var, chain, dry_run=True)


def test_logger_shows_each_rewrite_and_decline_at_debug(caplog):
    def decline_c(orig, m):
        raise Decline("square")

    with caplog.at_level(logging.DEBUG, logger="rewrite_ext"):
        apply_rules([Rule(ADD, add_to_subtract), Rule(MUL, decline_c)], chain)
    messages = [r.getMessage() for r in caplog.records if r.name == "rewrite_ext"]
    assert "chain: binding 'b' rewritten by rule 'add_to_subtract'" in messages
    assert "chain: binding 'd' rewritten by rule 'add_to_subtract'" in messages
    assert "chain: binding 'c' declined by rule 'decline_c': square" in messages
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "rewrite_ext")


def test_logger_is_silent_above_debug(caplog):
    with caplog.at_level(logging.INFO, logger="rewrite_ext"):
        rewrite_call(ADD, add_to_subtract, chain)
    assert not [r for r in caplog.records if r.name == "rewrite_ext"]


# -- cleanup=True ----------------------------------------------------------------------------


def bindings(func: relax.Function) -> list[relax.Binding]:
    return [b for block in func.body.blocks for b in block.bindings]


def test_cleanup_keeps_void_and_impure_bindings_of_a_lowered_function():
    @I.ir_module
    class Lowered:
        @R.function
        def main(x: R.Tensor((8,), "float32")) -> R.Tensor((8,), "float32"):
            R.func_attr({"relax.force_pure": True})
            s = R.vm.alloc_storage(R.shape([32]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
            a = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([8]), R.dtype("float32"))
            R.vm.copy_tensor(x, a)
            R.vm.copy_tensor(x, a)  # the same copy twice: impure, so never merged
            unused = R.vm.alloc_tensor(s, R.prim_value(0), R.shape([8]), R.dtype("float32"))  # pure in TVM
            return a

    def to_dma(orig, m, builder):
        args = [m[SRC], m[DST], imm(0), imm(1)]
        builder.emit(relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", relax.Tuple(args), **VOID_TY_ARGS))
        return relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", relax.Tuple(args), **VOID_TY_ARGS)

    plain = rewrite_call(COPY, to_dma, Lowered)
    cleaned = rewrite_call(COPY, to_dma, Lowered, cleanup=True)
    assert len(bindings(plain["main"])) == 7
    # all four DMA calls stay, void and impure; the unused allocation goes, as with TVM:
    # TVM declares R.vm.alloc_tensor pure
    assert [var_name(b.var) for b in bindings(cleaned["main"])] == [var_name(b.var) for b in bindings(plain["main"])][:-1]
    tvm.ir.assert_structural_equal(cleaned["main"].body.blocks[0].bindings, plain["main"].body.blocks[0].bindings[:-1])
    relax.analysis.well_formed(cleaned)


def test_cleanup_never_merges_a_value_computed_before_a_copy_with_the_same_one_after_it():
    # TVM's EliminateCommonSubexpr merges the two R.negative(a) below although the second
    # copy wrote a in between: the rewritten function would return |x| twice.
    @R.function(pure=False)
    def f(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        storage = R.vm.alloc_storage(R.shape([16]), 0, "uint8")
        a = R.vm.alloc_tensor(storage, 0, R.shape([4]), "float32")
        R.vm.copy_tensor(x, a)
        t0 = R.abs(a)
        R.vm.copy_tensor(y, a)
        t1 = R.abs(a)
        return (t0, t1)

    def abs_as_max(orig, m, builder):
        negated = builder.emit(relax.op.negative(m[X]))
        return relax.op.maximum(m[X], negated)

    cleaned = rewrite_call(is_op("relax.abs")(X), abs_as_max, f, cleanup=True)
    relax.analysis.well_formed(cleaned)
    assert str(cleaned).count("R.negative(a)") == 2
    inputs = [np.array([-1, 2, -3, 4], "float32"), np.array([5, -6, 7, -8], "float32")]
    assert_same_results(f, cleaned, inputs=inputs)


def test_cleanup_never_merges_equal_pure_void_calls():
    def two_checks(orig, m, builder):
        for _ in range(2):
            builder.emit(relax.op.call_pure_packed("my.check", m[X], **VOID_TY_ARGS))
        return relax.op.subtract(m[X], m[Y])

    @R.function(pure=False)
    def impure(x: R.Tensor((4,), "float32")):
        a = R.add(x, x)
        return a

    # CSE would make the second check an alias of the first (in a DataflowBlock) or R.tuple()
    # (in a plain block); either way the call would be gone.
    for func, n in ((chain, 4), (impure, 2)):
        out = rewrite_call(ADD, two_checks, func, cleanup=True)
        checks = [b for b in bindings(out) if "my.check" in str(b.value)]
        assert len(checks) == n and all(isinstance(b.value, relax.Call) for b in checks)
        relax.analysis.well_formed(out)


def test_cleanup_removes_unused_pure_bindings_and_trivial_ones_only_in_rewritten_functions():
    @I.ir_module
    class Two:
        @R.function
        def rewritten(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                dead = R.exp(x)
                a = R.add(x, x)
                b = R.reshape(a, R.shape([4]))
                c = R.multiply(b, x)
                R.output(c)
            return c

        @R.function
        def untouched(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                dead = R.exp(x)
                c = R.multiply(x, x)
                R.output(c)
            return c

    def drop_reshape(orig, m):
        return m[X]

    out = rewrite_call(is_op("relax.reshape")(X, Y), drop_reshape, Two, cleanup=True)
    assert values(out["rewritten"]) == ["R.add(x, x)", "R.multiply(a, x)"]
    assert out["untouched"].same_as(Two["untouched"])
    plain = rewrite_call(is_op("relax.reshape")(X, Y), drop_reshape, Two)
    assert values(plain["rewritten"]) == ["R.exp(x)", "R.add(x, x)", "a", "R.multiply(b, x)"]


def test_cleanup_keeps_a_match_cast_that_defines_a_symbolic_var():
    @R.function
    def dyn(x: R.Tensor("float32", ndim=1)):
        m = T.int64()
        with R.dataflow():
            y = R.match_cast(x, R.Tensor((m,), "float32"))  # unused, but it defines m
            a = R.add(x, x)
            b = R.reshape(a, R.shape([m]))
            R.output(b)
        return b

    out = rewrite_call(ADD, add_to_subtract, dyn, cleanup=True)
    assert isinstance(bindings(out)[0], relax.MatchCast)
    relax.analysis.well_formed(out)


def test_cleanup_off_by_default_behaves_as_before():
    @R.function
    def before(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.add(x, x)
            c = R.multiply(a, b)
            R.output(c)
        return c

    out = rewrite_call(ADD, add_to_subtract, before)
    assert values(out) == ["R.subtract(x, x)", "R.subtract(x, x)", "R.multiply(a, b)"]
    out = rewrite_call(ADD, add_to_subtract, before, cleanup=True)
    assert values(out) == ["R.subtract(x, x)", "R.multiply(a, a)"]


def test_cleanup_does_not_offer_a_kept_binding_again_after_canonicalization_renames_it():
    @R.function
    def out_var(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            lv = R.add(x, x)
            gv = lv
            R.output(gv)
        return gv

    def keep_with_a_check(orig, m, builder):
        builder.emit(relax.op.call_pure_packed("my.check", m[X], **VOID_TY_ARGS))
        return orig

    report = RewriteReport()
    out = rewrite_call(ADD, keep_with_a_check, out_var, cleanup=True, report=report)
    assert len(report.rules["keep_with_a_check"].kept) == 1
    assert sum("my.check" in v for v in values(out)) == 1


def test_cleanup_on_the_passes():
    mod = tvm.IRModule({"main": chain})
    out = RewriteRules([Rule(EXP, lambda o, m: m[X], name="drop_exp")], cleanup=True)(mod)
    assert values(out["main"]) == ["R.add(x, y)", "R.multiply(b, b)", "R.add(c, x)"]
    out = RewriteCall(EXP, lambda o, m: m[X], cleanup=True)(mod)
    assert values(out["main"]) == ["R.add(x, y)", "R.multiply(b, b)", "R.add(c, x)"]


def test_public_names_are_exported():
    for name in ("Decline", "RewriteReport", "RewriteRules", "Rule", "RuleReport", "apply_rules", "rule_from_module"):
        assert name in rewrite_ext.__all__ and hasattr(rewrite_ext, name)


# -- docs/rules.md -----------------------------------------------------------------------------


def test_docs_examples_run_and_print_what_the_docs_show(tmp_path, capsys, caplog):
    import re
    import runpy
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    script = tmp_path / "rules_md.py"  # TVMScript reads the decorated source back from its file
    script.write_text(for_this_tvm("\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))))
    with caplog.at_level(logging.DEBUG, logger="rewrite_ext"):
        runpy.run_path(str(script))
    printed = spelled_as_026(capsys.readouterr().out)
    shown = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    report_table = next(block for block in shown if block.startswith("rule "))
    assert report_table.strip() in printed
    log_lines = next(block for block in shown if block.startswith("rewrite_ext main"))
    logged = [f"rewrite_ext {r.getMessage()}" for r in caplog.records if r.name == "rewrite_ext"]
    expected = log_lines.strip().splitlines()
    assert logged[: len(expected)] == expected


# -- cleanup on random functions -----------------------------------------------------------


def _effects(func: relax.Function) -> list[str]:
    """The void and impure bindings' values, in order, nested blocks included."""
    from rewrite_ext._ir import is_impure, is_void

    found = []

    @relax.expr_functor.visitor
    class Collect(relax.expr_functor.PyExprVisitor):
        def visit_var_binding_(self, binding):
            if is_void(ty(binding.var)) or is_impure(binding.value):
                found.append(str(binding.value))
            super().visit_var_binding_(binding)

    Collect().visit_expr(func)
    return found


@settings(max_examples=20)
@given(mod=lowered_copy_functions(max_copies=6))
def test_cleanup_keeps_every_void_and_impure_binding_of_random_lowered_functions(mod):
    def to_dma_with_a_check(orig, m, builder):
        builder.emit(relax.op.call_pure_packed("my.check", m[SRC], **VOID_TY_ARGS))
        builder.emit(relax.op.call_pure_packed("my.check", m[SRC], **VOID_TY_ARGS))
        args = relax.Tuple([m[SRC], m[DST], imm(0), imm(1)])
        builder.emit(relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", args, **VOID_TY_ARGS))
        return relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", args, **VOID_TY_ARGS)

    plain = rewrite_call(COPY, to_dma_with_a_check, mod)
    cleaned = rewrite_call(COPY, to_dma_with_a_check, mod, cleanup=True)
    relax.analysis.well_formed(cleaned)
    assert _effects(cleaned["main"]) == _effects(plain["main"])


def test_cleanup_lets_a_rewriter_that_rebuilds_an_equal_computation_converge_as_tvm_does():
    # TVM's rewrite_call converges here: its cleanups merge the rebuilt exp with the old one and
    # the function comes out equal to what the pass started from.
    @R.function
    def f(x: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            e = R.exp(x)
            s = R.sum(e, axis=[1])
            R.output(s)
        return s

    y = wildcard()
    pattern = is_op("relax.sum")(is_op("relax.exp")(y))

    def same_again(orig, m):
        return relax.op.sum(relax.op.exp(m[y]), axis=orig.attrs.axis, keepdims=orig.attrs.keepdims)

    out = rewrite_call(pattern, same_again, f, cleanup=True)
    tvm.ir.assert_structural_equal(out, relax.dpl.rewrite_call(pattern, same_again, f))
    with pytest.raises(RewriteError, match="did not converge"):
        rewrite_call(pattern, same_again, f)  # without the cleanups each pass adds an exp
