"""The benchmark compares like with like: its inputs and comparators, at small sizes.

Nothing here times anything.  These keep ``benchmarks/bench_rewrite.py``
honest when the library or TVM changes: a comparator that drifted from
rewrite_ext's output, or a rewrite that broke the model, would make every
ratio it prints meaningless.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import rewrite_ext

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_overlap  # noqa: E402
import bench_rewrite as bench  # noqa: E402
import run_chain  # noqa: E402
from rewrite_ext.compat import ty

LAYERS = 2


@pytest.fixture(scope="module")
def stages():
    return bench.model_stages(layers=LAYERS)


def _bound_values(func: relax.Function) -> list[relax.Expr]:
    return [binding.value for block in func.body.blocks for binding in block.bindings]


def _ops(func: relax.Function) -> list[str]:
    """The callee of every bound call: an op's name, an ExternFunc's symbol or a GlobalVar's name."""
    callees = [value.op for value in _bound_values(func) if isinstance(value, relax.Call)]
    return [
        getattr(op, "name", None) or getattr(op, "global_symbol", None) or op.name_hint for op in callees
    ]


@pytest.mark.parametrize("rate", list(bench.MATCH_RATES))
@pytest.mark.parametrize("n", [1, 57, 300])
def test_the_chain_rewrite_is_the_same_done_every_way(rate, n):
    workload = bench.chain_workload(rate, n)
    assert workload.bindings == n
    adds = _ops(workload.func).count("relax.add")
    assert adds == (n + bench.MATCH_RATES[rate] - 1) // bench.MATCH_RATES[rate]
    bench.check(workload)  # TVM's and rewrite_ext's outputs equal the hand-written mutator's
    ours = workload.ours(workload.func)
    assert _ops(ours).count("relax.subtract") == adds and "relax.add" not in _ops(ours)
    relax.analysis.well_formed(ours)


def test_the_model_is_a_24_layer_gpt_at_three_stages():
    high = bench.model_stages()["high"]
    names = _ops(high)
    assert names.count("relax.nn.layer_norm") == 2 * 24 + 1
    assert names.count("relax.nn.softmax") == 24 and names.count("relax.nn.gelu") == 24
    assert names.count("relax.matmul") == 6 * 24  # four Linear layers and two in attention


def test_each_stage_is_what_its_name_says(stages):
    assert "relax.call_tir" not in _ops(stages["high"])
    assert set(_ops(stages["legalized"])) == {"relax.call_tir"}
    vm = stages["vm"]
    assert vm.attrs["relax.force_pure"] and "relax.call_tir" not in _ops(vm)
    kernels = [
        v for v in _bound_values(vm) if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar)
    ]
    assert "relax.vm.alloc_tensor" in _ops(vm) and len(kernels) > 20 * LAYERS


def _model_workload(stages, key: str) -> bench.Workload:
    return {w.key: w for w in bench.model_workloads(stages)}[key]


@pytest.mark.parametrize("key", ["legalized", "high", "vm"])
def test_each_model_rewrite_is_the_same_done_every_way(stages, key):
    workload = _model_workload(stages, key)
    bench.check(workload)  # raises if any side's output differs from the mutator's
    relax.analysis.well_formed(workload.ours(workload.func))


def test_the_never_matching_pattern_changes_nothing_anywhere(stages):
    workload = _model_workload(stages, "high")
    for run in workload.sides().values():
        tvm.ir.assert_structural_equal(run(), stages["high"])


def test_the_check_refuses_a_side_that_does_a_different_rewrite(stages):
    workload = _model_workload(stages, "legalized")
    workload.ours = lambda f: f  # declines every match
    with pytest.raises(AssertionError, match="rewrite_ext's output differs"):
        bench.check(workload)


def _run_model(mod: tvm.IRModule, pipeline, args):
    vm = relax.VirtualMachine(relax.build(mod, target="llvm", relax_pipeline=pipeline), tvm.cpu())
    return vm["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_the_timed_model_rewrites_are_real_ones_that_run():
    # Modules rather than the stages' functions: the kernels must be built with them.
    mod = bench.gpt_module(LAYERS)
    rng = np.random.default_rng(0)
    args = [
        rng.standard_normal([int(d) for d in ty(p).shape], dtype="float32") for p in mod["forward"].params
    ]
    expected = _run_model(mod, "default", args)

    legalized = rewrite_ext.rewrite_call(
        bench.CALL_TIR_PATTERN, bench.call_tir_to_packed, relax.transform.LegalizeOps()(mod)
    )
    assert "relax.call_tir" not in _ops(legalized["forward"])
    np.testing.assert_array_equal(_run_model(legalized, "default", args), expected)

    with tvm.target.Target("llvm"):
        vm_level = relax.pipeline.default_build_pipeline()(mod)
    kernels = [
        v.op.name_hint
        for v in _bound_values(vm_level["forward"])
        if isinstance(getattr(v, "op", None), tvm.ir.GlobalVar)
    ]
    traced = []
    tvm.register_global_func(bench.TRACE, lambda name: traced.append(str(name)), override=True)
    traced_mod = rewrite_ext.rewrite_call(bench.KERNEL_PATTERN, bench.trace_kernel, vm_level)
    np.testing.assert_array_equal(_run_model(traced_mod, None, args), expected)
    assert traced == kernels  # one trace per kernel, in order


def test_copy_to_dma_equals_the_forum_threads_hand_written_mutator():
    workload = bench.copies_workload(20)
    assert workload.bindings == 3 * 20 + 2  # two storages, one per 16 copies
    bench.check(workload)
    ours = workload.ours(workload.func)
    assert bench.count_bindings(ours) == workload.bindings + 20
    assert ours.script().count("dma_wait") == 20


def test_the_overlap_benchmark_keeps_every_transfer_in_flight_to_the_end_and_runs():
    from rewrite_ext.hexagon import copy_to_dma, cpu_dma

    n = 40
    mod = tvm.IRModule({"main": bench_overlap.make_independent_copies(n)})
    x = np.arange(32 * 64, dtype="int32").reshape(32, 64)
    executable = relax.build(copy_to_dma(mod, overlap=True), target="llvm")
    with cpu_dma() as engine:
        out = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x))
    np.testing.assert_array_equal(out.numpy(), x)
    assert engine.copies == n and engine.peak_in_flight == {0: n}


def test_a_figure_is_the_median_of_runs_whose_sides_take_turns_starting_with_each():
    order = []
    sides = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    # A first call of 1 s makes a run of one call; a shorter one, as many as last MIN_RUN_SECONDS.
    short = bench.MIN_RUN_SECONDS / 4
    figures = bench.measure(sides, 5, {"a": 1.0, "b": 1.0, "c": short})
    assert set(figures) == {"a", "b", "c"} and all(t >= 0 for t in figures.values())
    assert order.count("a") == order.count("b") == 5 and order.count("c") == 5 * 4
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    assert [runs[i] for i in range(0, 15, 3)] == ["a", "b", "c", "a", "b"]  # each round's first


def test_the_scaling_figure_is_one_ratio_per_round_and_their_median():
    figure = bench.measure_scaling("10%", 3, sizes=(20, 200))
    assert set(figure.ratios) == {"rewrite_ext", "mutator", *bench.FLOOR_SIDES}
    for side in ("rewrite_ext", "mutator", *bench.FLOOR_SIDES):
        assert len(figure.ratios[side]) == 3
        assert figure.ratio(side) == sorted(figure.ratios[side])[1]
        assert figure.per_binding[side, 20] > 0 and figure.per_binding[side, 200] > 0
    assert set(bench.measure_scaling("1%", 1, sizes=(20, 200), sides=("rewrite_ext",)).ratios) == {
        "rewrite_ext"
    }


def test_a_target_is_met_at_its_limit_and_missed_above_it():
    assert bench.Target("x", 1.5, 1.5).line().endswith("MET")
    assert bench.Target("x", 1.51, 1.5).line().endswith("MISSED")
    assert "not measured" in bench.Target("x", None, 1.5).line()


def test_a_missed_target_against_tvm_says_what_it_asks_of_the_hand_written_mutator():
    workload = bench.chain_workload("100%", n=20)
    label = "chain 10k 100%: rewrite_ext / TVM rewrite_call"

    def line() -> str:
        return next(t.line() for t in bench.targets({"100%": workload}, []) if t.label == label)

    workload.figures = {"rewrite_ext": 3.0, "mutator": 2.0, "tvm": 5.0}
    assert line().endswith("MISSED (mutator / TVM 0.40: asks for 1.25x the mutator)")
    workload.figures["rewrite_ext"] = 2.5
    assert line().endswith("MET")


def test_every_target_of_the_issue_is_reported_even_unmeasured():
    labels = [t.label for t in bench.targets({}, [])]
    assert len(labels) == 6 + 4 + len(
        bench.COPIES
    )  # chains, model, copies; scaling comes with its figures
    assert all(t.value is None for t in bench.targets({}, []))


def test_the_benchmark_refuses_fewer_than_five_runs(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "3"])
    assert "at least 5" in capsys.readouterr().err


def test_the_instruction_count_runner_does_the_work_of_the_scaling_figure():
    rewritten = run_chain.run("rewrite_ext", "100%", 25, 2)
    tvm.ir.assert_structural_equal(rewritten, bench.AddToSubtract().visit_expr(bench.make_chain(25, 1)))
    assert run_chain.run("rewrite_ext", "100%", 25, 0) is None  # the baseline run only builds the chain
    with pytest.raises(SystemExit):
        run_chain.main(["tvm", "25", "1"])
