"""The work rewrite_call skips for speed must never change a result or let a bad one through.

Three shortcuts (docs/performance.md):

1. A flat top-level function is rebuilt from Python rather than by TVM's mutator, which
   normalizes the whole body a second time.  Property: the result is structurally equal to the
   mutator's (``_ir.is_flat`` patched to say no), on generated functions and rewriters.
2. The confirming scan is skipped when a pass cannot have made new matches.  Covered where
   it matters by the multi-pass cases of test_tvm_compat.py and the pass-2 counts of
   test_properties.py; here: a rewrite whose output feeds another match still converges.
3. Well-formedness is checked on a probe holding only the new bindings.  A probe that fails
   sends the result to TVM's full check, whose verdict stands: a result the probe cannot judge
   (a symbolic var defined by an earlier ``match_cast``) still passes, and every way of
   producing ill-formed IR below is still a RewriteError naming the binding or the problem.
"""

from __future__ import annotations

import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext._ir
import rewrite_ext._patterns
import rewrite_ext._wellformed
from _helpers import Snapshot, equal, op_name
from rewrite_ext import RewriteError, rewrite_call
from test_properties import BINARY, FUNCTIONS, MORE_EXAMPLES, UNARY, elementwise_ops, recipes

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)


def rewrite_with_mutator_only(pattern, rewriter, target):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rewrite_ext._ir, "is_flat", lambda func: False)
        return rewrite_call(pattern, rewriter, target)


def outcome(pattern, rewriter, target):
    try:
        return rewrite_call(pattern, rewriter, target)
    except RewriteError as exc:
        return type(exc)


# -- 1. flat functions rebuilt from Python -------------------------------------------------


@MORE_EXAMPLES
@given(FUNCTIONS, st.data())
def test_the_python_rebuild_of_a_flat_function_equals_tvms_mutator(func, data):
    recipe = data.draw(recipes(func), label="recipe")
    pattern, wildcards = recipe.pattern_and_wildcards()
    before = Snapshot.of(func)

    fast = outcome(pattern, recipe.rewriter(wildcards), func)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rewrite_ext._ir, "is_flat", lambda func: False)
        slow = outcome(pattern, recipe.rewriter(wildcards), func)

    before.assert_unchanged(func)
    if isinstance(fast, type):
        assert fast is slow
    else:
        assert equal(fast, slow), fast.script()
        relax.analysis.well_formed(fast)


def test_the_rebuilt_function_keeps_its_return_type_and_attributes():
    @R.function
    def f(x: R.Tensor((4,), "float32")) -> R.Tensor(ndim=1, dtype="float32"):
        R.func_attr({"global_symbol": "f", "custom": 7})
        a = R.add(x, x)
        return a

    out = rewrite_call(ADD, lambda orig, m: relax.op.multiply(m[X], m[Y]), f)
    assert "custom" in out.attrs and int(out.attrs["custom"]) == 7
    # TVM's mutator keeps a less specific return type only when the body type is the base of it
    # (here the body is more specific, so it re-derives it); the Python rebuild does the same.
    assert equal(out, rewrite_with_mutator_only(ADD, lambda orig, m: relax.op.multiply(m[X], m[Y]), f))


def test_a_re_typed_output_var_is_typed_as_tvms_mutator_types_it():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        b = R.add(a, x)
        return b

    def reshape(orig, m):  # the output binding b changes type: (4,) -> (2, 2)
        return relax.op.reshape(m[X], relax.ShapeExpr([2, 2]))

    out = rewrite_call(ADD, reshape, f)
    assert equal(out, rewrite_with_mutator_only(ADD, reshape, f))
    assert str(out.body.ty) == str(relax.TensorType([2, 2], "float32"))
    relax.analysis.well_formed(out)


def test_a_function_whose_parameter_shapes_are_expressions_goes_through_tvms_mutator():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n], "float32"))
    y = relax.Var("y", relax.TensorType([n * 2], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("f", [x, y]):
        a = bb.emit(relax.op.add(y, y))
        bb.emit_func_output(a)
    f = bb.get()["f"]

    assert not rewrite_ext._ir.is_flat(f)
    out = rewrite_call(ADD, lambda orig, m: relax.op.multiply(m[X], m[Y]), f)
    assert str(out.body.blocks[0].bindings[0].value) == "R.multiply(y, y)"


# -- 2. the confirming scan ----------------------------------------------------------------


def test_a_rewrite_whose_output_matches_again_still_runs_to_the_fixed_point():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        return a

    def exp_to_add(orig, m):  # add is then rewritten by the same rule... via the Or below
        return relax.op.add(m[X], m[X])

    pattern = is_op("relax.exp")(X) | is_op("relax.add")(X, X)

    def rewriter(orig, m):
        if is_op("relax.exp")(X).match(orig):
            return exp_to_add(orig, m)
        return relax.op.multiply(m[X], m[X])

    out = rewrite_call(pattern, rewriter, f, max_iterations=2)
    assert str(out.body.blocks[0].bindings[0].value) == "R.multiply(x, x)"
    with pytest.raises(RewriteError, match="did not converge"):
        rewrite_call(pattern, rewriter, f, max_iterations=1)


# -- 3. the well-formedness probe -----------------------------------------------------------


def test_a_symbolic_var_the_probe_does_not_know_sends_the_result_to_the_full_check():
    @R.function
    def f(x: R.Tensor(ndim=1, dtype="float32"), y: R.Tensor(ndim=1, dtype="float32")):
        n = T.int64()
        a = R.match_cast(x, R.Tensor((n,), "float32"))
        b = R.add(y, y)
        return (a, b)

    n = f.body.blocks[0].bindings[0].ty.shape.values[0]

    def rewriter(orig, m):  # reads n, which only the match_cast of a (not stubbed) defines
        return relax.op.reshape(m[X], relax.ShapeExpr([n]))

    out = rewrite_call(ADD, rewriter, f)
    relax.analysis.well_formed(out)
    assert "R.reshape(y, R.shape([n]))" in str(out.body.blocks[0].bindings[1].value)


def test_a_symbolic_var_defined_nowhere_is_not_well_formed():
    k = tvm.tirx.Var("k", "int64")

    @R.function
    def f(y: R.Tensor(ndim=1, dtype="float32")):
        b = R.add(y, y)
        return b

    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.reshape(m[X], relax.ShapeExpr([k])), f)
    assert "'f'" in str(info.value)


@R.function(pure=False)
def impure(x: R.Tensor((4,), "float32")):
    a = R.add(x, x)
    b = R.multiply(a, x)
    return b


def test_an_emitted_binding_with_a_wrong_type_annotation_is_not_well_formed():
    def rewriter(orig, m, builder):
        wrong = relax.Var("wrong", relax.TensorType([9, 9], "float32"))
        builder.emit_normalized(relax.VarBinding(wrong, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(m[X], m[Y])  # wrong stays unused: its annotation is the only fault

    before = Snapshot.of(impure)
    with pytest.raises(RewriteError, match="not well formed"):
        rewrite_call(ADD, rewriter, impure)
    before.assert_unchanged(impure)


def test_an_emitted_dataflow_var_outside_a_dataflow_block_is_an_error_naming_the_binding():
    def rewriter(orig, m, builder):
        dvar = relax.DataflowVar("d", m[X].ty)
        builder.emit_normalized(relax.VarBinding(dvar, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(dvar, m[Y])

    # TVM's BlockBuilder refuses it before any well-formedness check sees it.
    with pytest.raises(RewriteError, match="dataflow var in non-dataflow block") as info:
        rewrite_call(ADD, rewriter, impure)
    assert "binding 'a'" in str(info.value)


def test_an_emitted_binding_of_a_var_defined_elsewhere_names_the_var():
    later = impure.body.blocks[0].bindings[1].var  # b, bound after the match

    def rewriter(orig, m, builder):
        builder.emit_normalized(relax.VarBinding(later, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(m[X], m[Y])

    # b is bound again later, by the input itself: found in the input's definitions.
    with pytest.raises(RewriteError, match="not well formed.*'b', which is already defined") as info:
        rewrite_call(ADD, rewriter, impure)
    assert "binding 'a'" in str(info.value)

    param = impure.params[0]

    def rebinds_a_parameter(orig, m, builder):
        builder.emit_normalized(relax.VarBinding(param, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(m[X], m[Y])

    with pytest.raises(RewriteError, match="'x', which is already defined") as info:
        rewrite_call(ADD, rebinds_a_parameter, impure)
    assert "binding 'a'" in str(info.value)


def test_a_dataflow_var_of_another_block_is_not_defined_in_this_one():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(a)
            R.output(b)
        y = R.exp(b)  # keeps the two DataflowBlocks apart (TVM merges adjacent ones)
        with R.dataflow():
            c = R.add(y, y)
            R.output(c)
        return c

    assert len(f.body.blocks) == 3
    stray = f.body.blocks[0].bindings[0].var  # the DataflowVar a of the first block

    with pytest.raises(RewriteError, match="in the same DataflowBlock") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.multiply(stray, m[Y]), f)
    assert "binding 'c'" in str(info.value) and "'a'" in str(info.value)


@I.ir_module
class TwoFunctions:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        a = R.add(x, x)
        return a

    @R.function
    def helper(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        return x


@I.ir_module
class Elsewhere:
    @R.function
    def stranger(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        return x


def test_a_global_var_in_a_new_binding_is_checked_against_the_module():
    helper = TwoFunctions.get_global_var("helper")
    out = rewrite_call(ADD, lambda orig, m: relax.Call(helper, [m[X]]), TwoFunctions)
    relax.analysis.well_formed(out)
    assert str(out["main"].body.blocks[0].bindings[0].value) == "helper(x)"

    stranger = Elsewhere.get_global_var("stranger")  # a function this module does not have
    with pytest.raises(RewriteError, match="not well formed"):
        rewrite_call(ADD, lambda orig, m: relax.Call(stranger, [m[X]]), TwoFunctions)


# Probes are split every PROBE_BINDINGS bindings (well_formed costs more per binding on a big
# function); 2 here puts each match below in a probe of its own.
def chain_of_adds(count: int) -> relax.Function:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("chain", [x]):
        with bb.dataflow():
            cur = x
            for _ in range(count):
                cur = bb.emit(relax.op.exp(bb.emit(relax.op.add(cur, x))))
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    return bb.get()["chain"]


def reads_the_first_match(faulty: int | None):
    """A rewriter whose every replacement reads what the first match emitted (another probe's)."""
    emitted: list[relax.Var] = []

    def rewriter(orig, m, builder):
        if len(emitted) == faulty:  # this match's binding is annotated with a wrong type
            wrong = relax.DataflowVar("wrong", relax.TensorType([9, 9], "float32"))
            builder.emit_normalized(relax.VarBinding(wrong, builder.normalize(relax.op.exp(m[X]))))
        emitted.append(builder.emit(relax.op.exp(m[X])))
        return relax.op.multiply(emitted[-1], emitted[0])

    return rewriter


def test_split_probes_vouch_for_a_well_formed_result_without_the_full_check(monkeypatch):
    func = chain_of_adds(12)
    monkeypatch.setattr(rewrite_ext._wellformed, "PROBE_BINDINGS", 2)
    checked = spy_on_well_formed(monkeypatch)
    out = rewrite_call(ADD, reads_the_first_match(None), func)

    stub_params = [len(f.params) for f in checked]
    assert len(checked) >= 12 and stub_params == [2] * len(checked)  # probes only: x and the stub
    relax.analysis.well_formed(out)
    assert [op_name(b.value) for b in out.body.blocks[0].bindings[:4]] == [
        "exp", "multiply", "exp", "exp"
    ]


def log_probes(monkeypatch) -> list[str]:
    """A log that gets "probe" at each probe checked, probes of 2 bindings (a match each)."""
    monkeypatch.setattr(rewrite_ext._wellformed, "PROBE_BINDINGS", 2)
    calls: list[str] = []
    real = rewrite_ext._wellformed.probe_is_well_formed

    def spy(func, blocks):
        calls.append("probe")
        return real(func, blocks)

    monkeypatch.setattr(rewrite_ext._wellformed, "probe_is_well_formed", spy)
    return calls


def test_probes_are_checked_during_a_pass_that_cannot_match_again(monkeypatch):
    """Each probe is checked as soon as it is full, while its bindings are still cached."""
    calls = log_probes(monkeypatch)

    def rewriter(orig, m):
        calls.append("rewrite")
        return relax.op.subtract(m[X], m[Y])

    rewrite_call(ADD, rewriter, chain_of_adds(12))
    assert calls.count("rewrite") == 12 and calls.count("probe") >= 6
    assert calls.index("probe") < calls.index("rewrite", 4)  # interleaved, not all after the pass


def test_probes_of_a_pass_that_may_be_followed_by_another_wait_for_it(monkeypatch):
    """A declined match may be accepted in a later pass: the probes wait for the last one."""
    calls = log_probes(monkeypatch)

    def rewriter(orig, m):
        calls.append("rewrite")
        if len(calls) == 1:
            return None  # declines the first add, once
        return relax.op.subtract(m[X], m[Y])

    out = rewrite_call(ADD, rewriter, chain_of_adds(12))
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("subtract") == 12
    # Pass 2 rewrote the declined add, so pass 1's probes were never worth checking.
    assert "probe" not in calls


@pytest.mark.parametrize("faulty", [0, 5, 11])
def test_a_fault_in_any_probe_of_a_split_check_is_found(monkeypatch, faulty):
    monkeypatch.setattr(rewrite_ext._wellformed, "PROBE_BINDINGS", 2)
    func = chain_of_adds(12)
    before = Snapshot.of(func)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, reads_the_first_match(faulty), func)
    assert "'chain'" in str(info.value)
    before.assert_unchanged(func)


# Where the input defines each var is indexed only when a new binding reads a var the match did
# not hand over (or defines a var that may exist already); the index is exact, so what it
# accepts is well formed and what it refuses names the var.


def counting_index_builds(monkeypatch) -> list[int]:
    builds: list[int] = []
    real = rewrite_ext._wellformed.InputDefinitions._build

    def spy(self):
        builds.append(1)
        real(self)

    monkeypatch.setattr(rewrite_ext._wellformed.InputDefinitions, "_build", spy)
    return builds


def spy_on_well_formed(monkeypatch) -> list[relax.Function]:
    checked: list[relax.Function] = []
    real = relax.analysis.well_formed

    def spy(obj, *args, **kwargs):
        checked.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(relax.analysis, "well_formed", spy)
    return checked


def test_a_rewrite_reading_only_what_the_match_handed_over_indexes_nothing(monkeypatch):
    builds = counting_index_builds(monkeypatch)
    checked = spy_on_well_formed(monkeypatch)
    out = rewrite_call(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), chain_of_adds(20))
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("subtract") == 20
    assert builds == []
    assert checked and all(len(f.params) == 2 for f in checked)  # probes only, vouched locally
    relax.analysis.well_formed(out)


def test_a_var_handed_over_through_a_binding_seen_through_indexes_nothing(monkeypatch):
    inner = wildcard()
    exp_then_add = is_op("relax.add")(is_op("relax.exp")(inner), Y)
    builds = counting_index_builds(monkeypatch)
    # m[inner] is read by the exp binding the pattern sees through, not by the add itself.
    out = rewrite_call(exp_then_add, lambda orig, m: relax.op.multiply(m[inner], m[Y]), chain_of_adds(8))
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("multiply") == 7
    assert builds == []
    relax.analysis.well_formed(out)


def test_an_earlier_var_the_match_did_not_hand_over_is_found_in_the_input(monkeypatch):
    func = chain_of_adds(6)
    first_exp = func.body.blocks[0].bindings[1].var  # bound after the first add, before the rest
    x = func.params[0]

    def rewriter(orig, m):
        if m[X].same_as(x):
            return None  # the first add comes before first_exp
        return relax.op.multiply(m[X], first_exp)

    builds = counting_index_builds(monkeypatch)
    checked = spy_on_well_formed(monkeypatch)
    out = rewrite_call(ADD, rewriter, func)
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("multiply") == 5
    assert builds == [1]
    assert checked and all(len(f.params) == 2 for f in checked)
    relax.analysis.well_formed(out)


def test_a_new_binding_reading_the_var_it_replaces_is_an_error_naming_it():
    own = impure.body.blocks[0].bindings[0].var  # a, the binding being rewritten

    def rewriter(orig, m, builder):
        builder.emit(relax.op.exp(own))
        return relax.op.multiply(m[X], m[Y])

    with pytest.raises(RewriteError, match="'a', which is not defined before this binding") as info:
        rewrite_call(ADD, rewriter, impure)
    assert "binding 'a'" in str(info.value)


def test_an_input_binding_a_var_twice_is_left_to_the_full_check():
    tensor = relax.TensorType([4], "float32")
    x, a, b = (relax.Var(name, tensor) for name in "xab")
    bb = relax.BlockBuilder()
    exp, add = bb.normalize(relax.op.exp(x)), bb.normalize(relax.op.add(x, x))
    twice = relax.BindingBlock(
        [relax.VarBinding(a, exp), relax.VarBinding(b, add), relax.VarBinding(a, exp)]
    )
    func = bb.normalize(relax.Function([x], relax.SeqExpr([twice], b), tensor, is_pure=False))
    with pytest.raises(Exception, match="defined more than once"):
        relax.analysis.well_formed(func)

    # Reading a, which the match did not hand over, consults the index, which finds the fault.
    with pytest.raises(RewriteError, match="not well formed.*defined more than once"):
        rewrite_call(ADD, lambda orig, m: relax.op.multiply(m[X], a), func)


def test_the_per_binding_ffi_handles_keep_the_gil_and_leave_tvms_own_alone():
    from tvm.relax import _ffi_api as relax_ffi
    from tvm_ffi import _ffi_api as ffi_api

    assert rewrite_ext._ir.emit_normalized.release_gil is False
    assert rewrite_ext._ir._ARRAY_GET_ITEM.release_gil is False
    # TVM's handles on the same functions still release it, for everyone else.
    assert relax_ffi.BlockBuilderEmitNormalized.release_gil is True
    assert ffi_api.ArrayGetItem.release_gil is True


# -- 4. what the matcher may look through ----------------------------------------------------
# TVM converts the var-to-value map it is handed at every match, so each match is handed only
# the bindings its pattern can reach (_patterns.lookup_depth levels down); with the whole block
# every match cost as much as the block so far.  Property: the matcher sees exactly what it
# sees with the whole block.


@st.composite
def nested_patterns(draw, func: relax.Function, depth: int = 3):
    present = elementwise_ops(func) or list(UNARY + BINARY)

    def call(level: int):
        op = draw(st.sampled_from(present))
        args = [sub(level + 1) for _ in range(1 if op in UNARY else 2)]
        return is_op(f"relax.{op}")(*args)

    def sub(level: int):
        kinds = ["wildcard", "const", "call"] if level < depth else ["wildcard", "const"]
        kind = draw(st.sampled_from(kinds))
        return wildcard() if kind == "wildcard" else is_const() if kind == "const" else call(level)

    return call(1)


def matches_seen(pattern, func):
    """Every match offered to a rewriter that declines them all: (value, its matchings)."""
    seen = []

    def rewriter(orig, m):
        seen.append((orig, {hash(pattern): value for pattern, value in m.items()}))
        return None

    rewrite_call(pattern, rewriter, func)
    return seen


@MORE_EXAMPLES
@given(FUNCTIONS, st.data())
def test_the_bindings_handed_to_the_matcher_are_all_it_can_reach(func, data):
    pattern = data.draw(nested_patterns(func), label="pattern")
    limited = matches_seen(pattern, func)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rewrite_ext._patterns, "lookup_depth", lambda pattern: None)
        whole = matches_seen(pattern, func)
    assert len(limited) == len(whole)
    for (orig, matched), (orig_whole, matched_whole) in zip(limited, whole):
        assert orig.same_as(orig_whole)
        assert matched.keys() == matched_whole.keys()
        assert all(value.same_as(matched_whole[key]) for key, value in matched.items())


def test_each_match_is_handed_a_few_bindings_however_long_the_block(monkeypatch):
    sizes: list[int] = []
    real = tvm.relax.dpl.DFPattern.extract_matched_expr

    def spy(self, expr, var2val=None):
        sizes.append(len(var2val or {}))
        return real(self, expr, var2val)

    monkeypatch.setattr(tvm.relax.dpl.DFPattern, "extract_matched_expr", spy)
    inner = wildcard()
    pattern = is_op("relax.add")(is_op("relax.exp")(inner), Y)
    out = rewrite_call(pattern, lambda orig, m: relax.op.multiply(m[inner], m[Y]), chain_of_adds(300))
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("multiply") == 299
    # add(exp(lv), x): the exp binding and, one level further down, the add it reads (left out
    # once rewritten); a second pass offers the first add again.
    assert len(sizes) == 301 and max(sizes) <= 2


def test_var_to_var_chains_are_looked_through_to_their_end():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = a
            c = b
            d = R.add(c, x)
            R.output(d)
        return d

    inner = wildcard()
    out = rewrite_call(
        is_op("relax.add")(is_op("relax.exp")(inner), Y),
        lambda orig, m: relax.op.multiply(m[inner], m[Y]),
        f,
    )
    assert op_name(out.body.blocks[0].bindings[-1].value) == "multiply"
    assert "R.multiply(x, x)" in str(out.body.blocks[0].bindings[-1].value)


def test_the_deepest_level_of_a_pattern_still_looks_through_a_var():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            c = R.const(1.0, "float32")  # a var bound to a constant, four levels down
            n = R.negative(c)
            e = R.exp(n)
            d = R.add(e, x)
            R.output(d)
        return d

    deepest = is_const()
    pattern = is_op("relax.add")(is_op("relax.exp")(is_op("relax.negative")(deepest)), Y)
    assert rewrite_ext._patterns.lookup_depth(pattern) == 4
    [(orig, matched)] = matches_seen(pattern, f)
    assert isinstance(matched[hash(deepest)], relax.Var)  # c, handed over as its var
    assert str(matched[hash(deepest)]) == "c"


def test_lookup_depth_counts_the_levels_of_a_pattern():
    depth = rewrite_ext._patterns.lookup_depth
    assert depth(wildcard()) == 1 and depth(is_const()) == 1
    assert depth(ADD) == 2
    assert depth(is_op("relax.add")(is_op("relax.exp")(is_const()), Y)) == 3
    assert depth(is_op("relax.exp")(X) | is_op("relax.add")(is_op("relax.exp")(X), Y)) == 3
    assert depth(is_op("relax.exp")(X).has_dtype("float32")) == 2
    unknown = tvm.relax.dpl.FunctionPattern([wildcard()], wildcard())
    assert depth(is_op("relax.add")(unknown, Y)) is None  # then the whole block is handed over
