"""rule_from_module: rules written in TVMScript, void and impure replacements included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import rewrite_ext
from rewrite_ext import RewriteError, RewriteReport, apply_rules, rewrite_call, rule_from_module
from rewrite_ext.hexagon import copy_to_dma, cpu_dma
from rewrite_ext.testing.strategies import lowered_copy_functions
from rewrite_ext.compat import TY_ARGS, VOID_TY_ARGS, var_name


@rule_from_module
@I.ir_module
class CopyToDMA:
    @R.function(pure=False)
    def pattern(src: R.Tensor, dst: R.Tensor):
        R.vm.copy_tensor(src, dst)
        return R.tuple()

    @R.function(pure=False)
    def replacement(src: R.Tensor, dst: R.Tensor):
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, dst, 0, True], **VOID_TY_ARGS)
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, src, dst], **VOID_TY_ARGS)
        return R.tuple()


@I.ir_module
class Copies:
    @R.function(pure=False)
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((8, 16), "float32")) -> R.Tensor((8, 16), "float32"):
        storage = R.vm.alloc_storage(R.shape([2048]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([8, 16]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        c = R.add(a, w)
        # offset 0 in a storage of its own: CPU kernels reject tensors at a non-zero byte offset
        storage2 = R.vm.alloc_storage(R.shape([512]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        b = R.vm.alloc_tensor(storage2, R.prim_value(0), R.shape([8, 16]), R.dtype("float32"))
        R.vm.copy_tensor(c, b)
        d = R.multiply(b, w)
        return d


@I.ir_module
class Lowered:
    """As TVM's pipeline leaves a function: pure, relax.force_pure, impure calls in plain blocks."""

    @R.function
    def main(x: R.Tensor((8, 16), "float32")) -> R.Tensor((8, 16), "float32"):
        R.func_attr({"relax.force_pure": True})
        storage = R.vm.alloc_storage(R.shape([1024]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([8, 16]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        return a


def bindings(func: relax.Function) -> list[relax.Binding]:
    return [b for block in func.body.blocks for b in block.bindings]


# -- the DMA rewrite written in TVMScript ------------------------------------------------------


@pytest.mark.parametrize("mod", [Copies, Lowered], ids=["impure", "force_pure"])
def test_dma_rule_gives_exactly_what_copy_to_dma_gives(mod):
    text = mod.script()
    ours = apply_rules([CopyToDMA], mod)
    theirs = copy_to_dma(mod)
    tvm.ir.assert_structural_equal(ours, theirs)
    assert ours.script() == theirs.script()
    relax.analysis.well_formed(ours)
    assert mod.script() == text


def test_dma_rule_output_runs_on_the_cpu_stand_in():
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((8, 16)).astype("float32") for _ in range(2))
    mod = apply_rules([CopyToDMA], Copies)
    with cpu_dma() as dma:
        vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(got, (x + w) * w, rtol=1e-6)
    assert dma.copies == dma.waits == 2


def test_rule_is_named_for_the_class_and_reported():
    report = RewriteReport()
    apply_rules([CopyToDMA], Copies, report=report)
    assert CopyToDMA.name == "CopyToDMA"
    assert len(report.rules["CopyToDMA"].rewritten) == 2
    assert rule_from_module(_module_of_add_rule()).name == "AddIntoMultiply"
    assert rule_from_module(name="double")(_module_of_add_rule()).name == "double"
    assert rule_from_module(_module(_pattern, _replacement)).name == "pattern->replacement"


def test_void_replacement_in_a_dataflow_block_is_reported_as_impure():
    @R.function
    def pure(x: R.Tensor((4,), "float32"), a: R.Tensor((4,), "float32")):
        with R.dataflow():
            y = R.add(x, a)
            R.output(y)
        return y

    @rule_from_module
    @I.ir_module
    class AddToBuiltin:
        @R.function(pure=False)
        def pattern(x: R.Tensor((4,), "float32"), a: R.Tensor((4,), "float32")):
            y = R.add(x, a)
            return y

        @R.function(pure=False)
        def replacement(x: R.Tensor((4,), "float32"), a: R.Tensor((4,), "float32")):
            R.call_builtin_with_ctx("some.builtin", [x, a], **VOID_TY_ARGS)
            y = R.multiply(x, a)
            return y

    with pytest.raises(RewriteError, match="rule 'AddToBuiltin'.*impure call.*DataflowBlock"):
        apply_rules([AddToBuiltin], pure)


# -- pure rules, as TVM's from_module -------------------------------------------------------------


def _module_of_add_rule() -> tvm.IRModule:
    @I.ir_module
    class AddIntoMultiply:
        @R.function
        def pattern(A: R.Tensor):
            B = A + A
            return B

        @R.function
        def replacement(A: R.Tensor):
            B = A * R.const(2, "float32")
            return B

    return AddIntoMultiply


@R.function(private=True)
def add_twice(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")):
    with R.dataflow():
        a = R.add(x, x)
        b = R.add(a, y)
        c = R.add(b, b)
        R.output(c)
    return c


def test_same_result_as_tvms_rewrite_call_with_the_same_rule():
    # TVM's from_module leaves match_cast bindings of each parameter in its output; the rule
    # is the one TVM's rewrite_call gives with add(x, x) -> multiply(x, 2).
    x = wildcard()
    theirs = relax.dpl.rewrite_call(
        is_op("relax.add")(x, x), lambda _, m: R.multiply(m[x], R.const(2, "float32")), add_twice
    )
    ours = apply_rules([rule_from_module(_module_of_add_rule())], add_twice, cleanup=True)
    tvm.ir.assert_structural_equal(ours, theirs)
    assert [str(b.value) for b in bindings(ours)] == [
        'R.multiply(x, R.const(2.0, "float32"))',
        "R.add(a, y)",
        'R.multiply(b, R.const(2.0, "float32"))',
    ]


def test_several_bindings_with_fresh_vars_at_every_match():
    @rule_from_module
    @I.ir_module
    class Expand:
        @R.function
        def pattern(A: R.Tensor((16,), "float32")):
            B = A + A
            return B

        @R.function
        def replacement(A: R.Tensor((16,), "float32")):
            doubled = R.multiply(A, R.const(2, "float32"))
            negated = R.negative(doubled)
            B = R.negative(negated)
            return B

    out = apply_rules([Expand], add_twice)
    relax.analysis.well_formed(out)
    values = [str(b.value) for b in bindings(out)]
    assert values == [
        'R.multiply(x, R.const(2.0, "float32"))',
        "R.negative(doubled)",
        "R.negative(negated)",
        "R.add(a, y)",
        'R.multiply(b, R.const(2.0, "float32"))',
        "R.negative(doubled1)",
        "R.negative(negated1)",
    ]
    # The matched bindings keep their vars (a, c) and get the last value; the others are new.
    names = [var_name(b.var) for b in bindings(out)]
    assert names[2] == "a" and names[-1] == "c"
    all_vars = [b.var for b in bindings(out)]
    assert all(not u.same_as(v) for i, u in enumerate(all_vars) for v in all_vars[i + 1 :])


def test_pattern_sees_through_bindings_and_a_param_used_twice_needs_the_same_value():
    @rule_from_module
    @I.ir_module
    class DoubleThenAdd:
        @R.function
        def pattern(A: R.Tensor((16,), "float32"), C: R.Tensor((16,), "float32")):
            B = R.add(A, A)
            D = R.add(B, C)
            return D

        @R.function
        def replacement(A: R.Tensor((16,), "float32"), C: R.Tensor((16,), "float32")):
            D = R.add(R.multiply(A, R.const(2, "float32")), C)
            return D

    out = apply_rules([DoubleThenAdd], add_twice, cleanup=True)
    # b = (x + x) + y is matched through a (then unused, so gone); c = b + b is not
    # (b + b) + something, since b + b is not A + A followed by an add.
    double, add, last = bindings(out)
    assert str(double.value) == 'R.multiply(x, R.const(2.0, "float32"))'
    assert var_name(add.var) == "b" and add.value.args[0].same_as(double.var) and add.value.args[1].same_as(add_twice.params[1])
    assert str(last.value) == "R.add(b, b)"


def test_param_types_constrain_the_match_and_symbolic_shapes_are_bound():
    @rule_from_module
    @I.ir_module
    class Flatten:
        @R.function
        def pattern(A: R.Tensor(("n", 2), "float32")):
            B = R.reshape(A, R.shape([2, 16]))
            return B

        @R.function
        def replacement(A: R.Tensor(("n", 2), "float32")):
            n = T.int64()
            flat = R.reshape(A, R.shape([n * 2]))
            B = R.reshape(flat, R.shape([2, 16]))
            return B

    @R.function(private=True)
    def before(x: R.Tensor((16, 2), "float32"), y: R.Tensor((8, 4), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([2, 16]))
            b = R.reshape(y, R.shape([2, 16]))
            c = R.add(a, b)
            R.output(c)
        return c

    out = apply_rules([Flatten], before)
    relax.analysis.well_formed(out)
    # x (16 x 2) matches R.Tensor((n, 2)) with n = 16; y (8 x 4) does not.
    assert [str(b.value) for b in bindings(out)] == [
        "R.reshape(x, R.shape([32]))",
        "R.reshape(flat, R.shape([2, 16]))",
        "R.reshape(y, R.shape([2, 16]))",
        "R.add(a, b)",
    ]


def test_call_attributes_must_equal_the_patterns_and_a_mismatch_is_declined_with_why():
    @rule_from_module
    @I.ir_module
    class Transpose2D:
        @R.function
        def pattern(A: R.Tensor((4, 4), "float32")):
            B = R.permute_dims(A, axes=[1, 0])
            return B

        @R.function
        def replacement(A: R.Tensor((4, 4), "float32")):
            B = R.permute_dims(A)
            return B

    @R.function(private=True)
    def before(x: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            a = R.permute_dims(x, axes=[1, 0])
            b = R.permute_dims(a, axes=[0, 1])
            R.output(b)
        return b

    report = RewriteReport()
    out = apply_rules([Transpose2D], tvm.IRModule({"before": before}), report=report)["before"]
    assert [str(b.value) for b in bindings(out)] == ["R.permute_dims(x, axes=None)", "R.permute_dims(a, axes=[0, 1])"]
    declined = report.rules["Transpose2D"].declined
    # b in every pass; a in the pass after its rewrite, whose axes=None is not [1, 0] either
    assert {d[:2] for d in declined} == {("before", "a"), ("before", "b")}
    assert all(reason.startswith("relax.permute_dims: attributes") and "(1, 0)" in reason for _, _, reason in declined)


def test_ty_args_must_equal_the_patterns():
    @rule_from_module
    @I.ir_module
    class Inline:
        @R.function
        def pattern(A: R.Tensor((4,), "float32")):
            B = R.call_pure_packed("my.double", A, **{TY_ARGS: R.Tensor((4,), "float32")})
            return B

        @R.function
        def replacement(A: R.Tensor((4,), "float32")):
            B = R.add(A, A)
            return B

    @R.function
    def before(x: R.Tensor((4,), "float32")):
        a = R.call_pure_packed("my.double", x, **{TY_ARGS: R.Tensor((4,), "float32")})
        b = R.call_pure_packed("my.double", x, **{TY_ARGS: R.Tensor((4,), "int32")})
        return (a, b)

    report = RewriteReport()
    out = apply_rules([Inline], before, report=report)
    assert str(bindings(out)[0].value) == "R.add(x, x)"
    assert "my.double" in str(bindings(out)[1].value)
    assert {(b, reason.split(":")[0]) for _, b, reason in report.rules["Inline"].declined} == {
        ("b", "relax.call_pure_packed")
    }
    assert all("ty_args" in reason for _, _, reason in report.rules["Inline"].declined)


def test_identity_replacement_with_cleanup_leaves_no_trivial_binding():
    @rule_from_module
    @I.ir_module
    class DropReshape:
        @R.function
        def pattern(A: R.Tensor((16,), "float32")):
            B = R.reshape(A, R.shape([16]))
            return B

        @R.function
        def replacement(A: R.Tensor((16,), "float32")):
            return A

    @R.function(private=True)
    def before(x: R.Tensor((16,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.reshape(a, R.shape([16]))
            c = R.add(b, x)
            R.output(c)
        return c

    out = rewrite_call(DropReshape.pattern, DropReshape.rewriter, before, cleanup=True)
    assert [str(b.value) for b in bindings(out)] == ["R.exp(x)", "R.add(a, x)"]


def test_a_replacement_with_an_if_is_copied_whole_at_every_match():
    @rule_from_module
    @I.ir_module
    class SquareIfPositive:
        @R.function
        def pattern(A: R.Tensor((4,), "float32")):
            B = R.exp(A)
            return B

        @R.function
        def replacement(A: R.Tensor((4,), "float32")):
            s = R.sum(A)
            c = R.greater(s, R.const(0.0, "float32"))
            if c:
                t = R.multiply(A, A)
                B = t
            else:
                B = A
            return B

    @R.function
    def twice(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        b = R.exp(a)
        return b

    out = apply_rules([SquareIfPositive], twice)
    relax.analysis.well_formed(out)  # the branches' vars are fresh at each match
    found = bindings(out)
    assert [type(b.value).__name__ for b in found] == ["Call", "Call", "If", "Call", "Call", "If"]
    assert [var_name(b.var) for b in found if isinstance(b.value, relax.If)] == ["a", "b"]
    first_t = found[2].value.true_branch.blocks[0].bindings[0].var
    second_t = found[5].value.true_branch.blocks[0].bindings[0].var
    assert not first_t.same_as(second_t)


# -- errors when the rule is made --------------------------------------------------------------


def _module(pattern, replacement, **others) -> tvm.IRModule:
    return tvm.IRModule({"pattern": pattern, "replacement": replacement, **others})


@R.function(private=True)
def _pattern(A: R.Tensor((4,), "float32")):
    B = R.add(A, A)
    return B


@R.function(private=True)
def _replacement(A: R.Tensor((4,), "float32")):
    B = R.multiply(A, R.const(2, "float32"))
    return B


def test_missing_or_extra_functions_are_errors():
    with pytest.raises(ValueError, match="no 'replacement' function"):
        rule_from_module(tvm.IRModule({"pattern": _pattern}))
    with pytest.raises(ValueError, match=r"other than 'pattern' and 'replacement' \(helper\)"):
        rule_from_module(_module(_pattern, _replacement, helper=_replacement))


def test_a_class_without_ir_module_is_an_error_saying_how_to_fix_it():
    class NotParsed:
        pass

    with pytest.raises(TypeError, match="put @I.ir_module under @rule_from_module"):
        rule_from_module(NotParsed)


def test_different_signatures_are_errors():
    @R.function(private=True)
    def two_params(A: R.Tensor((4,), "float32"), C: R.Tensor((4,), "float32")):
        return A

    @R.function(private=True)
    def other_type(A: R.Tensor((8,), "float32")):
        B = R.multiply(A, R.const(2, "float32"))
        return B

    @R.function(private=True)
    def other_result(A: R.Tensor((4,), "float32")):
        B = R.sum(A)
        return B

    with pytest.raises(ValueError, match="'pattern' takes 1 parameter.*'replacement' 2"):
        rule_from_module(_module(_pattern, two_params))
    with pytest.raises(ValueError, match=r"parameter 0 has type R.Tensor\(\(4,\).*but R.Tensor\(\(8,\)"):
        rule_from_module(_module(_pattern, other_type))
    with pytest.raises(ValueError, match="'pattern' returns .* but 'replacement' returns"):
        rule_from_module(_module(_pattern, other_result))


def test_a_replacement_not_well_formed_is_an_error_when_the_rule_is_made():
    # Impure builtins in a function not marked pure=False: TVM's well_formed refuses it.
    @I.ir_module(check_well_formed=False)
    class ForgotPureFalse:
        @R.function(pure=False)
        def pattern(src: R.Tensor, dst: R.Tensor):
            R.vm.copy_tensor(src, dst)
            return R.tuple()

        @R.function
        def replacement(src: R.Tensor, dst: R.Tensor):
            R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, dst, 0, True], **VOID_TY_ARGS)
            return R.tuple()

    with pytest.raises(ValueError, match="'replacement' is not well formed"):
        rule_from_module(ForgotPureFalse)


def test_pattern_bindings_outside_its_result_and_a_bare_param_are_errors():
    @R.function(private=True)
    def stray(A: R.Tensor((4,), "float32")):
        C = R.exp(A)
        B = R.add(A, A)
        return B

    @R.function(private=True)
    def bare(A: R.Tensor((4,), "float32")):
        return A

    with pytest.raises(ValueError, match="binding.*'C' of 'pattern' are not part of what it returns"):
        rule_from_module(_module(stray, _replacement))
    with pytest.raises(ValueError, match="would match any value"):
        rule_from_module(_module(bare, bare))


def test_rule_from_module_is_exported():
    assert rewrite_ext.rule_from_module is rule_from_module
    assert "rule_from_module" in rewrite_ext.__all__


# -- on random lowered functions ------------------------------------------------------------


@settings(max_examples=15)
@given(mod=lowered_copy_functions(max_copies=8))
def test_dma_rule_equals_copy_to_dma_on_random_lowered_functions(mod):
    tvm.ir.assert_structural_equal(apply_rules([CopyToDMA], mod), copy_to_dma(mod))
