"""What rewrite_call hands back is well formed, typed as TVM types it, or a RewriteError naming the fault.

1. What the result keeps: the function's attributes and return type, re-typed vars typed as
   TVM's mutator types them, parameter shapes that are expressions; a rewrite whose output
   matches again runs to the fixed point.
2. Every way a rewriter can produce ill-formed IR is a RewriteError naming the function, the
   binding, the pattern and the var at fault, and leaves the input as it was; what is well
   formed though the rewrite cannot vouch for it locally (a symbolic var defined by an earlier
   ``match_cast``, a var of the input the match did not hand over) passes.
3. What a match may see: for generated functions and nested patterns, the bindings offered to
   the rewriter are exactly those TVM's matcher matches when given every earlier pure,
   non-``match_cast`` binding of the same block since the last impure binding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from hypothesis import event, given
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.dpl import WildcardPattern, is_const, is_op, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from _helpers import Snapshot, all_bindings, equal, op_name
from rewrite_ext import RewriteError, rewrite_call
from rewrite_ext.testing.strategies import relax_functions
from test_properties import BINARY, MORE_EXAMPLES, UNARY, elementwise_ops
from rewrite_ext.compat import TY_ARGS, TensorType, TupleType, ret_ty, set_var_remap, ty, ty_args, var_name

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)
ADD_DESCRIBED = "relax.add(*, *)"
CONSTANT = getattr(relax, "Constant", None) or tvm.ir.expr.Constant  # moved to tvm.ir in TVM 0.27
VOID = TupleType([])
INSERTS = ["none", "none", "impure", "cast"]
"""What comes before each binding in with_impure_and_casts, drawn per binding."""
NOT_NAMING_WRONG = "the message quotes TVM's verdict, which names the types but not the var 'wrong'"


def to_multiply(orig, m):
    return relax.op.multiply(m[X], m[Y])


def values(func: relax.Function, block: int = 0) -> list[str]:
    return [str(b.value) for b in func.body.blocks[block].bindings]


def assert_names(message: str, function: str, binding: str, *vars_: str) -> None:
    """The message names the function, the binding, the pattern and each var."""
    assert f"function '{function}'" in message, message
    assert f"'{binding}'" in message, message
    assert ADD_DESCRIBED in message, message
    for var in vars_:  # quoted by rewrite_ext, bare in TVM's own messages ("Var k is not defined")
        assert re.search(rf"\b{re.escape(var)}\b", message), (var, message)


# ---------------------------------------------------------------------------------------------
# 1. What the result keeps
# ---------------------------------------------------------------------------------------------


def test_the_result_keeps_the_functions_attributes_and_its_return_type_as_tvm_derives_it():
    @R.function
    def f(x: R.Tensor((4,), "float32")) -> R.Tensor(ndim=1, dtype="float32"):
        R.func_attr({"global_symbol": "f", "custom": 7})
        a = R.add(x, x)
        return a

    out = rewrite_call(ADD, to_multiply, f)
    relax.analysis.well_formed(out)
    assert int(out.attrs["custom"]) == 7 and str(out.attrs["global_symbol"]) == "f"
    # TVM's rewrite_call runs TVM's mutator over the function: the return type is its own.
    theirs = tvm.relax.dpl.rewrite_call(ADD, to_multiply, f)
    assert equal(ret_ty(out), ret_ty(theirs)), (ret_ty(out), ret_ty(theirs))
    assert values(out) == ["R.multiply(x, x)"]


def test_a_re_typed_output_var_is_typed_as_tvms_mutator_types_it():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        b = R.add(a, x)
        return b

    def reshape(orig, m):  # the output binding b changes type: (4,) -> (2, 2)
        return relax.op.reshape(m[X], relax.ShapeExpr([2, 2]))

    @R.function
    def expected(x: R.Tensor((4,), "float32")) -> R.Tensor((2, 2), "float32"):
        a = R.exp(x)
        b = R.reshape(a, R.shape([2, 2]))
        return b

    out = rewrite_call(ADD, reshape, f)
    relax.analysis.well_formed(out)
    tvm.ir.assert_structural_equal(out, expected.with_attr("global_symbol", "f"))
    assert str(ty(out.body)) == str(TensorType([2, 2], "float32"))


@mutator
class _Swap(PyExprMutator):
    """TVM's own mutator doing a rewrite: each call of ``old`` becomes ``new(*args)``."""

    def __init__(self, old: str, new) -> None:
        super().__init__()
        self.old, self.new = tvm.ir.Op.get(old), new

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op.same_as(self.old):
            return self.new(*call.args)
        return call


def tvm_mutator_rewrite(func: relax.Function, old: str, new) -> relax.Function:
    return _Swap(old, new).visit_expr(func)


def test_a_re_typed_output_whose_shape_a_match_cast_defines_is_erased_from_the_return_type():
    @R.function
    def f(x: R.Tensor(dtype="float32", ndim=1), y: R.Tensor(("k",), "float32")):
        m = T.int64()
        a = R.match_cast(x, R.Tensor((m,), "float32"))
        b = R.add(a, a)
        c = R.add(y, y)
        return (b, c)

    def expand(orig, m):  # both outputs re-typed: (m,) -> (1, m), (k,) -> (1, k)
        return relax.op.expand_dims(m[X], [0])

    out = rewrite_call(ADD, expand, f)
    relax.analysis.well_formed(out)
    # m is defined inside the body, k by a parameter: the return type keeps k only.
    assert str(ret_ty(out)) == str(
        TupleType([TensorType(None, "float32", ndim=2), TensorType([1, ty(f.params[1]).shape[0]], "float32")])
    ), ret_ty(out)
    theirs = tvm_mutator_rewrite(f, "relax.add", lambda a, b: relax.op.expand_dims(a, [0]))
    tvm.ir.assert_structural_equal(out, theirs)


def test_a_return_type_that_no_longer_covers_the_re_typed_output_is_derived_not_kept():
    @R.function
    def f(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        a = R.add(x, x)
        return a

    def opaque(a, b):  # typed R.Tensor(ndim=1): (4,) no longer covers it
        return relax.call_pure_packed("ext.add", a, b, **{TY_ARGS: TensorType(None, "float32", ndim=1)})

    out = rewrite_call(ADD, lambda orig, m: opaque(m[X], m[Y]), f)
    relax.analysis.well_formed(out)
    assert str(ty(out.body)) == str(TensorType(None, "float32", ndim=1))
    # TVM's mutator keeps (4,), which the VM would check against what ext.add returns.
    assert str(ret_ty(out)) == str(TensorType(None, "float32", ndim=1))


def test_a_return_type_an_if_re_typed_in_one_branch_no_longer_covers_is_derived_and_runs():
    @R.function
    def f(a: R.Tensor((4,), "float32"), cond: R.Tensor((), "bool")) -> R.Tensor((4,), "float32"):
        if cond:
            r = R.add(a, a)
        else:
            r = R.multiply(a, a)
        return r

    out = rewrite_call(ADD, lambda orig, m: relax.op.expand_dims(m[X], [0]), f)
    relax.analysis.well_formed(out)
    assert ret_ty(out).is_base_of(TensorType([1, 4], "float32"))  # covers the taken branch
    vm = relax.VirtualMachine(relax.build(tvm.IRModule({"main": out}), target="llvm"), tvm.cpu())
    a = tvm.runtime.tensor(np.arange(4, dtype="float32"))
    taken = vm["f"](a, tvm.runtime.tensor(np.array(True)))
    np.testing.assert_array_equal(taken.numpy(), np.arange(4).reshape(1, 4))  # expand_dims(a)
    other = vm["f"](a, tvm.runtime.tensor(np.array(False)))
    np.testing.assert_array_equal(other.numpy(), np.arange(4) ** 2)


@MORE_EXAMPLES
@given(
    relax_functions(
        ops=("add", "multiply", "exp", "reshape", "sum", "concat", "split", "where", "astype"),
        max_bindings=25, allow_symbolic=True, allow_other_params=True, allow_mixed_blocks=True,
        allow_nested_if=True,
    )
)
def test_the_result_is_what_tvms_mutator_builds_for_the_same_rewrite(func):
    """Types, return type, blocks and attributes as TVM's mutator makes them, on generated
    functions with symbolic shapes, match_cast, Ifs, local functions and mixed blocks."""
    ours = rewrite_call(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), func)
    theirs = tvm_mutator_rewrite(func, "relax.add", relax.op.subtract)
    event(f"rewritten: {not ours.same_as(func)}")
    relax.analysis.well_formed(ours)
    tvm.ir.assert_structural_equal(ours, theirs, map_free_vars=True)


def test_a_function_whose_parameter_shapes_are_expressions_is_rewritten():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", TensorType([n], "float32"))
    y = relax.Var("y", TensorType([n * 2], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("f", [x, y]):
        a = bb.emit(relax.op.add(y, y))
        bb.emit_func_output(a)
    f = bb.get()["f"]

    out = rewrite_call(ADD, to_multiply, f)
    relax.analysis.well_formed(out)
    assert values(out) == ["R.multiply(y, y)"]
    assert str(ty(out.params[1])) == str(ty(y))


def test_a_rewrite_whose_output_matches_again_runs_to_the_fixed_point():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        return a

    pattern = is_op("relax.exp")(X) | is_op("relax.add")(X, X)

    def rewriter(orig, m):  # exp -> add, which the same rule then turns into multiply
        if is_op("relax.exp")(X).match(orig):
            return relax.op.add(m[X], m[X])
        return relax.op.multiply(m[X], m[X])

    out = rewrite_call(pattern, rewriter, f, max_iterations=2)
    assert values(out) == ["R.multiply(x, x)"]
    with pytest.raises(RewriteError, match="did not converge"):
        rewrite_call(pattern, rewriter, f, max_iterations=1)


# ---------------------------------------------------------------------------------------------
# 2. Well formed, or a RewriteError naming the fault
# ---------------------------------------------------------------------------------------------


def test_a_symbolic_var_defined_by_an_earlier_match_cast_may_be_read():
    @R.function
    def f(x: R.Tensor(ndim=1, dtype="float32"), y: R.Tensor(ndim=1, dtype="float32")):
        n = T.int64()
        a = R.match_cast(x, R.Tensor((n,), "float32"))
        b = R.add(y, y)
        return (a, b)

    n = ty(f.body.blocks[0].bindings[0]).shape.values[0]

    def rewriter(orig, m):  # reads n, which only the match_cast of a defines
        return relax.op.reshape(m[X], relax.ShapeExpr([n]))

    out = rewrite_call(ADD, rewriter, f)
    relax.analysis.well_formed(out)
    assert values(out)[1] == "R.reshape(y, R.shape([n]))"


def test_a_symbolic_var_defined_nowhere_is_an_error_naming_it():
    k = tvm.tirx.Var("k", "int64")

    @R.function
    def f(y: R.Tensor(ndim=1, dtype="float32")):
        b = R.add(y, y)
        return b

    before = Snapshot.of(f)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.reshape(m[X], relax.ShapeExpr([k])), f)
    assert_names(str(info.value), "f", "b", "k")
    before.assert_unchanged(f)


@R.function(pure=False)
def impure(x: R.Tensor((4,), "float32")):
    a = R.add(x, x)
    b = R.multiply(a, x)
    return b


def wrongly_annotated(orig, m, builder):
    wrong = relax.Var("wrong", TensorType([9, 9], "float32"))
    builder.emit_normalized(relax.VarBinding(wrong, builder.normalize(relax.op.exp(m[X]))))
    return relax.op.multiply(m[X], m[Y])  # wrong stays unused: its annotation is the only fault


def test_an_emitted_binding_with_a_wrong_type_annotation_is_an_error_naming_the_binding():

    before = Snapshot.of(impure)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, wrongly_annotated, impure)
    assert_names(str(info.value), "impure", "a")
    assert "R.Tensor((9, 9)" in str(info.value), str(info.value)
    before.assert_unchanged(impure)


def test_an_emitted_binding_with_a_wrong_type_annotation_is_an_error_naming_the_var():
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, wrongly_annotated, impure)
    assert_names(str(info.value), "impure", "a", "wrong")


def test_an_emitted_dataflow_var_outside_a_dataflow_block_is_an_error_naming_the_binding():
    def rewriter(orig, m, builder):
        dvar = relax.DataflowVar("d", ty(m[X]))
        builder.emit_normalized(relax.VarBinding(dvar, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(dvar, m[Y])

    before = Snapshot.of(impure)
    # TVM's BlockBuilder refuses it before any well-formedness check sees it.
    with pytest.raises(RewriteError, match="dataflow var in non-dataflow block") as info:
        rewrite_call(ADD, rewriter, impure)
    assert_names(str(info.value), "impure", "a")
    before.assert_unchanged(impure)


def test_an_emitted_binding_of_a_var_defined_elsewhere_names_the_var():
    later = impure.body.blocks[0].bindings[1].var  # b, bound after the match

    def rebinds_a_later_var(orig, m, builder):
        builder.emit_normalized(relax.VarBinding(later, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(m[X], m[Y])

    with pytest.raises(RewriteError, match="not well formed.*'b', which is already defined") as info:
        rewrite_call(ADD, rebinds_a_later_var, impure)
    assert_names(str(info.value), "impure", "a", "b")

    param = impure.params[0]

    def rebinds_a_parameter(orig, m, builder):
        builder.emit_normalized(relax.VarBinding(param, builder.normalize(relax.op.exp(m[X]))))
        return relax.op.multiply(m[X], m[Y])

    with pytest.raises(RewriteError, match="'x', which is already defined") as info:
        rewrite_call(ADD, rebinds_a_parameter, impure)
    assert_names(str(info.value), "impure", "a", "x")


def test_a_dataflow_var_of_another_block_is_an_error_naming_it():
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

    before = Snapshot.of(f)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.multiply(stray, m[Y]), f)
    assert_names(str(info.value), "f", "c", "a")
    before.assert_unchanged(f)


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
    assert values(out["main"]) == ["helper(x)"]

    stranger = Elsewhere.get_global_var("stranger")  # a function this module does not have
    before = Snapshot.of(TwoFunctions)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.Call(stranger, [m[X]]), TwoFunctions)
    assert_names(str(info.value), "main", "a", "stranger")
    before.assert_unchanged(TwoFunctions)


def test_a_module_ill_formed_elsewhere_is_rewritten_and_its_rewritten_functions_checked():
    # IRModule({"main": f}) keeps f's global_symbol 'impure': TVM finds the module ill formed,
    # whatever the rewrite does; the rewritten function is judged on its own.
    mod = tvm.IRModule({"main": impure})
    with pytest.raises(Exception, match="GlobalVar"):
        relax.analysis.well_formed(mod)
    out = rewrite_call(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), mod)
    relax.analysis.well_formed(out["main"])
    assert values(out["main"])[0] == "R.subtract(x, x)"

    own = impure.body.blocks[0].bindings[0].var  # a, read before it is bound
    before = Snapshot.of(mod)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.multiply(own, m[Y]), mod)
    assert_names(str(info.value), "main", "a", "a")
    before.assert_unchanged(mod)

    stranger = Elsewhere.get_global_var("stranger")  # a function this module does not have
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.Call(stranger, [m[X]]), mod)
    assert_names(str(info.value), "main", "a", "stranger")
    before.assert_unchanged(mod)


def chain_of_adds(count: int) -> relax.Function:
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([4], "float32"))
    with bb.function("chain", [x]):
        with bb.dataflow():
            cur = x
            for _ in range(count):
                cur = bb.emit(relax.op.exp(bb.emit(relax.op.add(cur, x))))
            out = bb.emit_output(cur)
        bb.emit_func_output(out)
    return bb.get()["chain"]


def reads_the_first_match(faulty: int | None):
    """A rewriter whose every replacement reads what the first match emitted."""
    emitted: list[relax.Var] = []

    def rewriter(orig, m, builder):
        if len(emitted) == faulty:  # this match's binding is annotated with a wrong type
            wrong = relax.DataflowVar("wrong", TensorType([9, 9], "float32"))
            builder.emit_normalized(relax.VarBinding(wrong, builder.normalize(relax.op.exp(m[X]))))
        emitted.append(builder.emit(relax.op.exp(m[X])))
        return relax.op.multiply(emitted[-1], emitted[0])

    return rewriter


def test_new_bindings_reading_what_an_earlier_match_emitted_are_well_formed():
    out = rewrite_call(ADD, reads_the_first_match(None), chain_of_adds(12))
    relax.analysis.well_formed(out)
    ops = [op_name(b.value) for b in out.body.blocks[0].bindings]
    assert ops[:4] == ["exp", "multiply", "exp", "exp"] and ops.count("multiply") == 12


def faulty_binding(faulty: int) -> str:
    """The var of the ``faulty``-th add of chain_of_adds: lv, lv2, lv4, ..."""
    return "lv" if faulty == 0 else f"lv{2 * faulty}"


@pytest.mark.parametrize("faulty", [0, 5, 11])
def test_a_fault_at_any_match_of_a_long_block_is_found(faulty):
    func = chain_of_adds(12)
    before = Snapshot.of(func)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, reads_the_first_match(faulty), func)
    assert_names(str(info.value), "chain", faulty_binding(faulty))
    before.assert_unchanged(func)


def test_a_fault_in_a_long_block_is_an_error_naming_the_var():
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, reads_the_first_match(5), chain_of_adds(12))
    assert_names(str(info.value), "chain", faulty_binding(5), "wrong")


def test_a_var_handed_over_through_a_binding_seen_through_may_be_read():
    inner = wildcard()
    exp_then_add = is_op("relax.add")(is_op("relax.exp")(inner), Y)
    # m[inner] is read by the exp binding the pattern sees through, not by the add itself.
    out = rewrite_call(exp_then_add, lambda orig, m: relax.op.multiply(m[inner], m[Y]), chain_of_adds(8))
    relax.analysis.well_formed(out)
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("multiply") == 7


def test_an_earlier_var_of_the_input_the_match_did_not_hand_over_may_be_read():
    func = chain_of_adds(6)
    first_exp = func.body.blocks[0].bindings[1].var  # bound after the first add, before the rest
    x = func.params[0]

    def rewriter(orig, m):
        if m[X].same_as(x):
            return None  # the first add comes before first_exp
        return relax.op.multiply(m[X], first_exp)

    out = rewrite_call(ADD, rewriter, func)
    relax.analysis.well_formed(out)
    assert [op_name(b.value) for b in out.body.blocks[0].bindings].count("multiply") == 5


def test_a_new_binding_reading_the_var_it_replaces_is_an_error_naming_it():
    own = impure.body.blocks[0].bindings[0].var  # a, the binding being rewritten

    def rewriter(orig, m, builder):
        builder.emit(relax.op.exp(own))
        return relax.op.multiply(m[X], m[Y])

    before = Snapshot.of(impure)
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, rewriter, impure)
    assert_names(str(info.value), "impure", "a", "a")
    before.assert_unchanged(impure)


def test_an_input_binding_a_var_twice_is_an_error():
    tensor = TensorType([4], "float32")
    x, a, b = (relax.Var(name, tensor) for name in "xab")
    bb = relax.BlockBuilder()
    exp, add = bb.normalize(relax.op.exp(x)), bb.normalize(relax.op.add(x, x))
    twice = relax.BindingBlock([relax.VarBinding(a, exp), relax.VarBinding(b, add), relax.VarBinding(a, exp)])
    func = bb.normalize(relax.Function([x], relax.SeqExpr([twice], b), tensor, is_pure=False))
    with pytest.raises(Exception, match="defined more than once"):
        relax.analysis.well_formed(func)

    with pytest.raises(RewriteError, match="not well formed.*defined more than once") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.multiply(m[X], a), func)
    assert_names(str(info.value), "<anonymous function>", "b", "a")


# ---------------------------------------------------------------------------------------------
# 3. What a match may see
# ---------------------------------------------------------------------------------------------


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
    assert values(out)[-1] == "R.multiply(x, x)"


def matches_offered(pattern, func) -> list[tuple[relax.Expr, dict[int, relax.Expr]]]:
    """Every match offered to a rewriter that declines them all: (value, its matchings)."""
    seen = []

    def rewriter(orig, m):
        seen.append((orig, {hash(p): value for p, value in m.items()}))
        return None

    assert rewrite_call(pattern, rewriter, func).same_as(func)
    return seen


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
    [(orig, matched)] = matches_offered(pattern, f)
    assert str(orig) == "R.add(e, x)"
    # As TVM's matcher gives it: the constant bound to c.
    assert matched[hash(deepest)].same_as(f.body.blocks[0].bindings[0].value)


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


@st.composite
def patterns_from(draw, func: relax.Function, depth: int = 3):
    """A pattern of one of ``func``'s elementwise calls, seen through its vars to ``depth`` levels.

    Vars are looked through every binding of the function (match_casts and bindings before an
    impure one included), so the pattern often matches only if a match may see everything.
    """
    bound: dict[relax.Var, relax.Expr] = {b.var: b.value for b in all_bindings(func)}
    calls = [b.value for b in all_bindings(func) if op_name(b.value) in UNARY + BINARY]
    if not calls:
        return draw(nested_patterns(func))

    def resolve(expr: relax.Expr) -> relax.Expr:
        while isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        return expr

    def of(expr: relax.Expr, level: int):
        expr = resolve(expr)
        if op_name(expr) in UNARY + BINARY and level <= depth and draw(st.integers(0, 3)) > 0:
            return is_op(f"relax.{op_name(expr)}")(*[of(arg, level + 1) for arg in expr.args])
        if isinstance(expr, CONSTANT) and draw(st.booleans()):
            return is_const()
        return wildcard()

    # Mostly a call that reads another call's var: its pattern has a level to see through.
    reading = [c for c in calls if any(op_name(resolve(arg)) in UNARY + BINARY for arg in c.args)]
    root = draw(st.sampled_from(reading if reading and draw(st.integers(0, 4)) else calls))
    return is_op(f"relax.{op_name(root)}")(*[of(arg, 2) for arg in root.args])


def blocks_of(func: relax.Function) -> list[relax.BindingBlock]:
    """Every binding block at any depth: the function's, If branches', local functions'."""
    found: list[relax.BindingBlock] = []

    def walk(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Function):
            walk(expr.body)
        elif isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                found.append(block)
                for binding in block.bindings:
                    walk(binding.value)
            walk(expr.body)
        elif isinstance(expr, relax.If):
            walk(expr.true_branch)
            walk(expr.false_branch)

    walk(func)
    return found


def is_impure(value: relax.Expr) -> bool:
    """Whether TVM deems evaluating ``value`` impure."""
    return bool(relax.analysis.contains_impure_call(value))


@dataclass
class Seen:
    """A binding TVM's matcher matches: its value, the matchings, the var-to-value map it had."""

    value: relax.Expr
    matched: dict[int, relax.Expr]
    var2val: dict[relax.Var, relax.Expr]


def matches_tvm_sees(
    pattern, func: relax.Function, *, var_values: bool = False, whole: bool = False
) -> list[Seen]:
    """Every binding TVM's matcher matches, given what a match may see.

    Each binding's value is matched with every earlier pure, non-match_cast binding of its
    block since the last impure binding as the var-to-value map (``whole``: every earlier
    binding of the block, as TVM's rewrite_call hands it).  Bindings whose value is a
    bare var (an alias, a match_cast of a var) are left out unless ``var_values``: see
    test_a_binding_whose_value_is_a_var_is_offered_as_tvms_matcher_matches_it.
    """
    found = []
    for block in blocks_of(func):
        var2val: dict[relax.Var, relax.Expr] = {}
        for binding in block.bindings:
            value = binding.value
            if var_values or not isinstance(value, relax.Var):
                matched = pattern.extract_matched_expr(value, dict(var2val))
                if matched is not None:
                    found.append(Seen(value, {hash(p): e for p, e in matched.items()}, dict(var2val)))
            if whole:
                var2val[binding.var] = value
            elif is_impure(value):
                var2val.clear()
            elif isinstance(binding, relax.VarBinding):
                var2val[binding.var] = value
    return found


def resolves_to(expr: relax.Expr, want: relax.Expr, var2val: dict[relax.Var, relax.Expr]) -> bool:
    """Whether ``expr`` is ``want``, or a var whose chain of bound values reaches it."""
    while not expr.same_as(want):
        if not isinstance(expr, relax.Var) or expr not in var2val:
            return False
        expr = var2val[expr]
    return True


@st.composite
def with_impure_and_casts(draw, func: relax.Function) -> relax.Function:
    """``func`` made impure, with void impure calls and re-casts inserted in its top-level blocks.

    Before a binding may come a void ``R.call_packed``, or a re-cast
    ``v' = R.match_cast(v, type of v)`` of its first argument, which the binding then reads in
    place of ``v``: TVM's matcher would see through it to ``v``'s value, were it handed it.
    (DataflowBlocks become plain blocks, which impure calls need; local functions stay pure.)
    """
    choices = iter(
        draw(st.lists(st.sampled_from(INSERTS), min_size=64, max_size=64), label="inserts")
    )

    @relax.expr_functor.mutator
    class Insert(relax.PyExprMutator):
        def visit_binding_block_(self, block):
            return self._rebuild(block)

        def visit_dataflow_block_(self, block):
            return self._rebuild(block)

        def visit_function_(self, func):
            return func  # a local function: pure, left as it is

        def _rebuild(self, block):
            bb = self.builder_
            bb._begin_binding_block()
            for binding in block.bindings:
                kind = next(choices, "none")
                value = self.visit_expr(binding.value)
                if kind == "impure":
                    bb.emit(relax.Call(relax.ExternFunc("coretests.touch"), [], **{TY_ARGS: [VOID]}))
                elif kind == "cast" and isinstance(value, relax.Call) and value.args:
                    first = value.args[0]
                    if isinstance(first, relax.Var) and isinstance(ty(first), TensorType):
                        cast = bb.match_cast(first, ty(first), "cast")
                        value = relax.Call(value.op, [cast, *value.args[1:]], value.attrs, ty_args(value))
                name = var_name(binding.var)
                if isinstance(binding, relax.MatchCast):
                    new_var = bb.match_cast(value, ty(binding), name)
                else:
                    new_var = bb.emit(value, name)
                set_var_remap(self, binding.var, new_var)
            return bb._end_block()

    body = Insert().visit_expr(func.body)
    out = relax.Function(func.params, body, ret_ty(func), is_pure=False, attrs=func.attrs)
    out = relax.BlockBuilder().normalize(out)
    relax.analysis.well_formed(out)
    return out


@MORE_EXAMPLES
@given(relax_functions(max_bindings=20), st.data())
def test_the_bindings_offered_are_those_tvms_matcher_matches_on_what_a_match_may_see(func, data):
    if data.draw(st.integers(0, 3), label="impure_and_casts") > 0:
        func = data.draw(with_impure_and_casts(func), label="func")
    patterns = st.one_of(nested_patterns(func), patterns_from(func), patterns_from(func))
    pattern = data.draw(patterns, label="pattern")
    offered = matches_offered(pattern, func)
    expected = matches_tvm_sees(pattern, func)
    more = len(matches_tvm_sees(pattern, func, whole=True)) > len(expected)
    event(f"TVM's matcher matches more given the whole block: {more}")

    event(f"matches offered: {min(len(offered), 3)}{'+' if len(offered) >= 3 else ''}")
    event(f"impure bindings: {sum(is_impure(b.value) for b in all_bindings(func)) > 0}")
    event(f"match_cast bindings: {any(isinstance(b, relax.MatchCast) for b in all_bindings(func))}")
    assert sorted(hash(value) for value, _ in offered) == sorted(hash(seen.value) for seen in expected)
    wildcards = {hash(p) for p in _sub_patterns(pattern) if isinstance(p, WildcardPattern)}
    by_value = {hash(seen.value): seen for seen in expected}
    for value, matched in offered:
        seen = by_value[hash(value)]
        assert matched.keys() == seen.matched.keys()
        for key, expr in matched.items():
            want = seen.matched[key]
            if key in wildcards:
                # A wildcard's var may be handed over as the var (rewrite_call's documented form)
                # where TVM hands the value bound to it.
                assert resolves_to(expr, want, seen.var2val), (expr, want)
            else:
                assert expr.same_as(want), (expr, want)


def _sub_patterns(pattern) -> list:
    found = [pattern]
    for arg in getattr(pattern, "args", None) or []:
        found.extend(_sub_patterns(arg))
    return found


@R.function(pure=False)
def aliases(x: R.Tensor((4,), "float32")):
    a = R.exp(x)
    b = a
    c = R.match_cast(a, R.Tensor((4,), "float32"))
    d = R.add(b, c)
    return d


def test_a_binding_whose_value_is_a_var_is_not_offered_though_tvms_matcher_would_match_it():
    # TVM's matcher also matches b = a and c = match_cast(a) through a's binding; rewriting those
    # aliases would compute the replacement once per alias.  Only a itself is offered.
    pattern = is_op("relax.exp")(wildcard())
    offered = [value for value, _ in matches_offered(pattern, aliases)]
    expected = [seen.value for seen in matches_tvm_sees(pattern, aliases, var_values=True)]
    assert len(expected) == 3  # TVM: a, b and c
    a = aliases.body.blocks[0].bindings[0]
    assert len(offered) == 1 and offered[0].same_as(a.value)


@R.function
def exp_twice(x: R.Tensor((4,), "float32")):
    with R.dataflow():
        e = R.exp(x)
        d = R.add(e, e)
        R.output(d)
    return d


def test_matchings_are_what_tvms_matcher_gives_and_a_returned_bound_value_becomes_its_var():
    inner, other = wildcard(), wildcard()
    pattern = is_op("relax.add")(is_op("relax.exp")(inner), other)
    [(orig, matched)] = matches_offered(pattern, exp_twice)
    e = exp_twice.body.blocks[0].bindings[0]
    # TVM's memo: the exp sub-pattern saw through e, so `other`, matched against the same e,
    # is handed the value bound to e, exactly as tvm.relax.dpl.rewrite_call hands it over.
    tvm_memo = pattern.extract_matched_expr(orig, {e.var: e.value})
    assert matched[hash(inner)].same_as(tvm_memo[inner]) and matched[hash(inner)].same_as(exp_twice.params[0])
    assert matched[hash(other)].same_as(tvm_memo[other]) and matched[hash(other)].same_as(e.value)
    # Returned as is, that value refers to e: nothing is computed twice.
    out = rewrite_call(pattern, lambda orig, m: relax.op.multiply(m[other], m[other]), exp_twice)
    assert [str(b.value) for b in out.body.blocks[0].bindings] == ["R.exp(x)", "R.multiply(e, e)"]


# ---------------------------------------------------------------------------------------------
# Found by trying the library as a new user
# ---------------------------------------------------------------------------------------------


def test_an_undefined_var_in_a_rewrite_that_keeps_matching_is_reported_as_not_well_formed():
    @R.function
    def f(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            R.output(a)
        return a

    ghost = relax.Var("ghost", TensorType((4,), "float32"))
    with pytest.raises(RewriteError, match="not well formed") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.add(m[X], ghost), f)
    assert_names(str(info.value), "f", "a", "ghost")


def test_a_return_type_change_of_a_function_other_functions_call_is_an_error_naming_them():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            y = R.add(x, x)
            return y

        @R.function
        def caller(a: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            cls = Mod
            r: R.Tensor((4,), "float32") = cls.main(a)
            return r

    def broadcast(orig, m):
        return relax.op.broadcast_to(m[X], (3, 4))

    with pytest.raises(RewriteError, match="changed its return type") as info:
        rewrite_call(ADD, broadcast, Mod)
    assert "'main'" in str(info.value) and "caller" in str(info.value)
    # a lone function may change its own return type: nothing else sees it
    out = rewrite_call(ADD, broadcast, Mod["main"])
    assert [int(d) for d in ret_ty(out).shape.values] == [3, 4]


def test_a_return_type_change_of_a_recursive_function_is_an_error():
    # Its recursive call's binding would keep the old type: float16 arrives where the VM
    # checks for float32.
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4,), "float32"), n: R.Tensor((), "int64")) -> R.Tensor((4,), "float32"):
            cls = Mod
            if R.less(n, R.const(1, "int64")):
                r = R.add(x, x)
            else:
                r0 = cls.main(x, R.subtract(n, R.const(1, "int64")))
                r = R.multiply(r0, x)
            return r

    before = Mod.script()
    with pytest.raises(RewriteError, match="changed its return type") as info:
        rewrite_call(ADD, lambda orig, m: relax.op.astype(relax.op.multiply(m[X], relax.const(2.0, "float32")), "float16"), Mod)
    assert "main itself (a recursive call)" in str(info.value)
    assert Mod.script() == before
