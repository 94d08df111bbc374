"""check_rewrite, check_pass and assert_same_results: good rewrites pass, each broken property
is reported readably, results are compared on the VM (NaN-aware, tuples, DMA under cpu_dma)."""

from __future__ import annotations

import doctest
import itertools
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from rewrite_ext import RewriteCall, RewriteError
from rewrite_ext.hexagon import CopyToDMA
from rewrite_ext.testing import (
    ResultMismatch,
    RewriteCheckFailure,
    RunError,
    assert_same_results,
    check_pass,
    check_rewrite,
    random_inputs,
    run,
)
from rewrite_ext.compat import TensorType, ret_ty, ty
from _helpers import for_this_tvm

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)
MATMUL = is_op("relax.matmul")(X, Y)


@R.function
def func(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.add(x, y)
        b = R.multiply(a, y)
        R.output(b)
    return b


def add_to_subtract_of_negative(orig, m, builder):
    # x + y == x - (-y), exactly, for floats and wrapping ints
    return relax.op.subtract(m[X], builder.emit(relax.op.negative(m[Y])))


def test_a_good_two_argument_rewriter_passes_and_the_report_counts_the_match():
    report = check_rewrite(ADD, lambda orig, m: relax.op.subtract(m[X], relax.op.negative(m[Y])), func)
    assert report.calls == 1 and report.rewrites == 1 and not report.output_matches and report.ran
    assert "R.negative(y)" in report.output.script()


def test_a_good_three_argument_rewriter_passes_and_is_run():
    report = check_rewrite(ADD, add_to_subtract_of_negative, func)
    assert report.rewrites == 1 and report.ran and "R.negative(y)" in report.output.script()


def test_a_declining_rewriter_passes_with_the_input_as_output_and_nothing_is_run():
    report = check_rewrite(ADD, lambda orig, m: None, func)
    assert report.calls == 1 and report.rewrites == 0 and not report.ran
    assert report.output.same_as(func)


def test_run_false_checks_structure_only():
    # add -> subtract is well formed and deterministic; only running it shows it is wrong.
    report = check_rewrite(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), func, run=False)
    assert report.rewrites == 1 and not report.ran


def test_a_well_formed_rewrite_that_computes_something_else_is_caught_with_its_input():
    with pytest.raises(RewriteCheckFailure) as info:
        check_rewrite(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), func, seed=7)
    message = str(info.value)
    assert message.startswith("check_rewrite: the output computes what the input computes")
    assert "output 0 differs at index (" in message and "of 4 elements differ" in message
    # The inputs that show it, as random_inputs(seed=7) makes them, and the output IR.
    x, y = random_inputs(func, 7)
    assert "random_inputs, seed 7" in message and f"x: float32[4] = {np.array2string(x)[:12]}" in message
    assert "R.subtract(x, y)" in message


@R.function
def two_matmuls(x: R.Tensor((3, 4), "float32"), w: R.Tensor((4, 6), "float32")):
    with R.dataflow():
        a = R.matmul(x, w)
        b = R.nn.softmax(a)
        R.output(a, b)
    return (a, b)


def split_columns(swap: bool):
    """matmul(x, w) -> concat(matmul(x, w[:, :h]), matmul(x, w[:, h:])); swapped halves if ``swap``."""

    def rewriter(orig, m, builder):
        w = m[Y]
        cols = ty(w).shape.values[-1] if ty(w).ndim == 2 else None
        if not isinstance(cols, tvm.tirx.IntImm) or cols.value < 2:
            return None
        parts = builder.emit(relax.op.split(w, [cols.value // 2], axis=1))
        left = builder.emit(relax.op.matmul(m[X], builder.emit(relax.TupleGetItem(parts, 0))))
        right = builder.emit(relax.op.matmul(m[X], builder.emit(relax.TupleGetItem(parts, 1))))
        return relax.op.concat([right, left] if swap else [left, right], axis=-1)

    return rewriter


def test_a_matmul_split_is_checked_on_every_output_of_a_tuple():
    report = check_rewrite(MATMUL, split_columns(swap=False), two_matmuls)
    assert report.ran and report.rewrites >= 1
    with pytest.raises(RewriteCheckFailure, match="output 0 differs at index"):
        check_rewrite(MATMUL, split_columns(swap=True), two_matmuls)


@R.function
def tuple_out(x: R.Tensor((2, 3), "float32")):
    a = R.sqrt(x)  # NaN for negative x: equal NaNs are equal
    b = R.add(x, x)
    return (a, (b, x))


def test_outputs_are_compared_nan_aware_and_through_nested_tuples():
    inputs = [np.array([[-1, 4, 9], [-4, 0, 1]], "float32")]
    comparison = assert_same_results(tuple_out, tuple_out, inputs=inputs)
    assert len(comparison.before) == 3 and np.isnan(comparison.before[0][0, 0])

    # b = x + x becomes x * 3: the second output (the first field of the nested tuple) differs.
    def times_three(orig, m):
        return relax.op.multiply(m[X], relax.const(3.0, "float32"))

    wrong = relax.dpl.rewrite_call(ADD, times_three, tuple_out)
    with pytest.raises(ResultMismatch) as info:
        assert_same_results(tuple_out, wrong, inputs=inputs)
    assert "output 1 differs at index (0, 0): before -2.0, after -3.0" in str(info.value)
    assert "inputs (given):" in str(info.value)


def test_a_result_mismatch_names_the_inputs_as_tvmscript_prints_them():
    # nn.Module exports parameters as `fc1.weight`; errors and reports say `fc1_weight`.
    weight = relax.Var("fc1.weight", TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [weight]):
        bb.emit_func_output(bb.emit(relax.op.add(weight, weight)))
    func = bb.get()["main"]
    wrong = relax.dpl.rewrite_call(ADD, lambda orig, m: relax.op.multiply(m[X], relax.const(3.0, "float32")), func)
    with pytest.raises(ResultMismatch, match=r"(?m)^  fc1_weight: float32\[4\]"):
        assert_same_results(func, wrong)


@R.function(pure=False)
def reads_at_an_offset(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    storage = R.vm.alloc_storage(R.shape([64]), 0, "uint8")
    a = R.vm.alloc_tensor(storage, 0, R.shape([4]), "float32")
    R.vm.copy_tensor(x, a)
    b = R.vm.alloc_tensor(storage, 32, R.shape([4]), "float32")
    R.vm.copy_tensor(y, b)
    c = R.add(a, b)  # the add kernel reads b at byte offset 32
    return c


def test_a_program_that_does_not_run_is_a_run_error_that_says_why():
    inputs = [np.ones(4, "float32"), np.ones(4, "float32")]
    with pytest.raises(RunError, match="running main on the VM failed") as info:
        run(reads_at_an_offset, inputs)
    assert "R.memory.ensure_zero_offset" in str(info.value)
    assert info.value.__cause__ is not None  # TVM's own error
    with pytest.raises(RunError, match=r"the first program \(before\) does not run"):
        assert_same_results(reads_at_an_offset, reads_at_an_offset, inputs=inputs)


def test_a_rewrite_that_breaks_running_is_a_failed_check_not_a_crash():
    @R.function(pure=False)
    def zero_offset(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        storage = R.vm.alloc_storage(R.shape([64]), 0, "uint8")
        a = R.vm.alloc_tensor(storage, 0, R.shape([4]), "float32")
        R.vm.copy_tensor(x, a)
        b = R.vm.alloc_tensor(storage, 32, R.shape([4]), "float32")
        R.vm.copy_tensor(y, b)
        b0 = R.memory.ensure_zero_offset(b)
        c = R.add(a, b0)
        return c

    # A "simplification" that drops ensure_zero_offset: well formed, but no longer runs.
    def drop_it(orig, m):
        return m[X]

    pattern = is_op("relax.memory.ensure_zero_offset")(X)
    with pytest.raises(RewriteCheckFailure, match=r"the second program \(after\) does not run, the first does"):
        check_rewrite(pattern, drop_it, zero_offset, run=True)


def test_tolerances_are_the_callers_to_set():
    @R.function
    def one(x: R.Tensor((2,), "float32")):
        return R.add(x, R.const(1.0, "float32"))

    @R.function
    def almost(x: R.Tensor((2,), "float32")):
        return R.add(x, R.const(1.001, "float32"))

    with pytest.raises(ResultMismatch, match=r"rtol=1e-05, atol=1e-05"):
        assert_same_results(one, almost)
    assert_same_results(one, almost, rtol=0, atol=1e-2)


@R.function
def symbolic(x: R.Tensor(("n", 4), "float32"), y: R.Tensor(dtype="float32", ndim=2), p: R.Prim("int64"),
             s: R.Shape(ndim=2), o: R.Object, t: R.Tuple(R.Tensor((4,), "float32"), R.Tensor((4,), "float32"))):  # fmt: skip
    n = T.int64()
    y1 = R.match_cast(y, R.Tensor((n, 4), "float32"))
    z = R.add(x, y1)
    return R.add(z, t[0])


def test_inputs_cover_symbolic_shapes_match_cast_and_every_parameter_kind():
    x, y, p, s, o, t = random_inputs(symbolic, 3, sizes={"n": 5})
    assert x.shape == y.shape == (5, 4) and isinstance(p, int)
    assert len(s) == 2 and isinstance(t, tuple) and t[0].shape == (4,)
    (out,) = run(symbolic, [x, y, p, s, o, t])
    np.testing.assert_allclose(out, x + y + t[0], rtol=1e-6)


@R.function
def shape_param(a: R.Tensor((4,), "float32"), s: R.Shape(["m"]), u: R.Shape(["m", 2])):
    m = T.int64()
    return (R.add(a, a), s, u)


def test_a_symbolic_var_only_an_r_shape_parameter_defines_is_drawn_or_taken_from_sizes():
    a, s, u = random_inputs(shape_param, 1)
    assert len(s) == 1 and 1 <= s[0] <= 4 and tuple(u) == (s[0], 2)
    assert tuple(random_inputs(shape_param, sizes={"m": 7})[1]) == (7,)
    doubled, s_out, _ = run(shape_param, [a, s, u])
    np.testing.assert_allclose(doubled, a + a)
    assert tuple(s_out) == tuple(s)


@R.function
def symbolic_wrong(x: R.Tensor(("n", 4), "float32"), y: R.Tensor(dtype="float32", ndim=2), p: R.Prim("int64"),
                   s: R.Shape(ndim=2), o: R.Object, t: R.Tuple(R.Tensor((4,), "float32"), R.Tensor((4,), "float32"))):  # fmt: skip
    n = T.int64()
    y1 = R.match_cast(y, R.Tensor((n, 4), "float32"))
    z = R.add(x, y1)
    return R.add(z, t[1])


def test_a_difference_names_the_symbolic_sizes_of_its_inputs():
    with pytest.raises(ResultMismatch, match=r"inputs \(random_inputs, seed 0, n=5\):"):
        assert_same_results(symbolic, symbolic_wrong, sizes={"n": 5})


def test_a_nondeterministic_rewriter_fails_with_a_diff():
    ops = itertools.cycle([relax.op.subtract, relax.op.multiply])

    def flaky(orig, m):
        return next(ops)(m[X], m[Y])

    with pytest.raises(RewriteCheckFailure, match="deterministic") as info:
        check_rewrite(ADD, flaky, func)
    assert "R.subtract" in str(info.value) and "R.multiply" in str(info.value)


def test_a_rewriter_whose_output_matches_again_is_reported_as_such():
    # add -> add(y, x): every application changes the order back; rewrite_call stops it
    with pytest.raises(RewriteError, match="did not converge"):
        check_rewrite(ADD, lambda orig, m: relax.op.add(m[Y], m[X]), func)


@I.ir_module
class Copies:
    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        storage = R.vm.alloc_storage(R.shape([64]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        b = R.vm.alloc_tensor(storage, R.prim_value(16), R.shape([4]), R.dtype("float32"))
        R.vm.copy_tensor(a, b)
        return b


def test_check_pass_runs_copy_to_dma_under_cpu_dma():
    report = check_pass(CopyToDMA(), Copies)
    assert report.changed and report.ran
    assert "vm.builtin.hexagon.dma_copy" in report.output.script()


@I.ir_module
class VTCMCopies:
    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        storage = R.vm.alloc_storage(R.shape([64]), R.prim_value(0), R.dtype("uint8"), R.str("global.vtcm"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        b = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(a, b)
        return b


def test_a_module_allocating_vtcm_runs_under_cpu_vtcm_by_itself_or_under_the_callers():
    # TVM's CPU allocator refuses global.vtcm ("This alloc should be implemented").
    from rewrite_ext.hexagon import cpu_vtcm

    report = check_pass(CopyToDMA(overlap=True), VTCMCopies)
    assert report.changed and report.ran
    x = np.arange(4, dtype="float32")
    np.testing.assert_array_equal(run(VTCMCopies, [x])[0], x)
    with cpu_vtcm() as vtcm:  # one the caller entered serves: the stand-ins do not nest
        np.testing.assert_array_equal(run(VTCMCopies, [x])[0], x)
    assert vtcm.allocations == [64]


def test_check_pass_reports_a_pass_that_computes_something_else():
    wrong = RewriteCall(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]))
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with pytest.raises(RewriteCheckFailure, match="check_pass: the output computes what the input computes"):
        check_pass(wrong, mod)
    assert check_pass(wrong, mod, run=False).changed


def test_check_pass_reports_an_ill_formed_output():
    def break_it(mod):
        f = mod["main"]
        stray = relax.Var("stray", TensorType((4,), "float32"))  # free: defined nowhere
        return tvm.IRModule({"main": relax.Function(f.params, relax.SeqExpr([], stray), ret_ty(f), True)})

    with pytest.raises(RewriteCheckFailure, match="check_pass: output is well formed") as info:
        check_pass(break_it, tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    assert "--- output ---" in str(info.value) and "stray" in str(info.value)


def test_a_module_keyed_by_another_name_than_its_global_symbol_is_checked_function_by_function():
    # IRModule({"main": f}) keeps f's global_symbol "func": TVM rejects the module, before and
    # after, so each function is judged alone, as rewrite_call judges it.
    mod = tvm.IRModule({"main": func})
    report = check_rewrite(ADD, add_to_subtract_of_negative, mod)
    assert report.rewrites == 1 and report.ran

    def break_it(m):
        f = m["main"]
        stray = relax.Var("stray", TensorType((4,), "float32"))
        return tvm.IRModule({"main": relax.Function(f.params, relax.SeqExpr([], stray), ret_ty(f), True)})

    with pytest.raises(RewriteCheckFailure, match="input module is not well formed either; its function 'main' alone"):
        check_pass(break_it, mod)


def test_running_a_module_without_main_names_the_fix():
    mod = tvm.IRModule({"f": func.with_attr("global_symbol", "f"), "g": func.with_attr("global_symbol", "g")})
    with pytest.raises(ValueError, match="no function 'main' and public Relax functions f, g; pass entry="):
        run(mod)
    with pytest.raises(ValueError, match="no Relax function 'h' to run .it has f, g"):
        run(mod, entry="h")
    inputs = [np.arange(4, dtype="float32"), np.full(4, 2, dtype="float32")]
    np.testing.assert_array_equal(run(mod, inputs, entry="g")[0], np.array([4, 6, 8, 10], dtype="float32"))


def test_an_nn_model_is_run_by_its_only_public_function_forward():
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            return self.down(nn.relu(self.up(x)))

    mod, _ = MLP().export_tvm({"forward": {"x": nn.spec.Tensor((2, 8), "float32")}})
    assert "main" not in [gv.name_hint for gv in mod.get_global_vars()]
    report = check_rewrite(ADD, add_to_subtract_of_negative, mod)
    assert report.rewrites >= 2 and report.ran
    legalized = relax.transform.LegalizeOps()(mod)
    assert len(random_inputs(legalized)) == 5  # x and the two layers' weights and biases
    assert run(legalized)[0].shape == (2, 4)


def test_a_module_keyed_by_another_name_than_its_global_symbol_runs():
    # IRModule({"main": f}) keeps f's global_symbol, the name relax.build gives it.
    mod = tvm.IRModule({"main": func})
    inputs = [np.arange(4, dtype="float32"), np.ones(4, dtype="float32")]
    np.testing.assert_array_equal(run(mod, inputs)[0], np.arange(1, 5, dtype="float32"))


# ---------------------------------------------------------------------------
# The examples of docs/testing.md and of the strategies' docstrings run
# ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(markdown: str) -> list[str]:
    """The ```python blocks that start a line (indented ones belong to a list item)."""
    return re.findall(r"(?m)^```python\n(.*?)^```", markdown, flags=re.S)


def test_every_python_block_of_the_testing_guide_runs(tmp_path):
    blocks = python_blocks((ROOT / "docs" / "testing.md").read_text())
    assert len(blocks) == 5
    ran: list[str] = []
    for index, block in enumerate(blocks):
        # A file of its own: TVMScript reads a decorated function's source back from it.
        path = tmp_path / f"testing_md_{index}.py"
        path.write_text(for_this_tvm(block))
        if "load_profile" in block:
            # The conftest.py for a reader's project: run apart, so this session's profile stays.
            done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stderr
            continue
        namespace = runpy.run_path(str(path))
        for name, test in namespace.items():
            if name.startswith("test_") and callable(test):
                test()  # with the block's own @settings
                ran.append(name)
    assert sorted(ran) == [
        "test_copy_to_dma_runs_like_the_copies",
        "test_split_columns_at_chosen_sizes",
        "test_split_columns_computes_what_matmul_computes",
        "test_subtract_to_add",
        "test_swapped_halves_are_caught",
    ]


def test_the_strategies_docstring_examples_run():
    from rewrite_ext.testing import strategies

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    examples = [t for t in doctest.DocTestFinder().find(strategies) if t.examples]
    assert {t.name.rsplit(".", 1)[-1] for t in examples} == {"relax_functions", "lowered_copy_functions"}
    for test in examples:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted >= 10


@tvm.register_global_func("test.checks_trace", override=True)
def _checks_trace(name):
    return None


def test_check_rewrite_counts_a_binding_kept_after_emitting_as_kept_not_as_a_rewrite():
    # The guide's instrumentation: emit a void trace call, return orig to keep the kernel call.
    @R.function
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        R.func_attr({"relax.force_pure": True})
        y = R.exp(x)
        return y

    from rewrite_ext.compat import VOID_TY_ARGS, StringImm

    mod = relax.transform.LegalizeOps()(tvm.IRModule({"main": main}))

    def trace(orig, m, builder):
        builder.emit(relax.Call(relax.ExternFunc("test.checks_trace"), [StringImm("k")], **VOID_TY_ARGS))
        return orig

    report = check_rewrite(is_op("relax.call_tir")(varg_default_wildcard=True), trace, mod)
    assert (report.rewrites, report.kept) == (0, 1) and report.ran  # as RewriteReport counts it
    assert "test.checks_trace" in report.output.script()
