"""The benchmark compares like with like: its inputs and comparators, at small sizes.

Nothing here times anything; these keep ``benchmarks/bench_rewrite.py`` honest
when the library or TVM changes (a comparator that drifted from rewrite_ext's
output would make every ratio it prints meaningless).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import rewrite_call as tvm_rewrite_call

import rewrite_ext
from rewrite_ext.hexagon import dma

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_rewrite as bench  # noqa: E402


@pytest.mark.parametrize("n", [1, 10, 57])
def test_the_chain_rewrite_equals_tvms_and_the_hand_written_one(n):
    func = bench.make_chain(n)
    assert bench.count_bindings(func) == n
    ours = rewrite_ext.rewrite_call(bench.ADD_PATTERN, bench.add_to_subtract, func)
    tvm.ir.assert_structural_equal(ours, tvm_rewrite_call(bench.ADD_PATTERN, bench.add_to_subtract, func))
    tvm.ir.assert_structural_equal(ours, bench.add_to_subtract_by_hand(func))
    text = ours.script()
    assert "R.add" not in text and text.count("R.subtract") == (n + 9) // 10
    relax.analysis.well_formed(ours)


def test_the_never_matching_pattern_leaves_the_chain_as_the_identity_mutator_does():
    func = bench.make_chain(30)
    tvm.ir.assert_structural_equal(rewrite_ext.rewrite_call(bench.NEVER_PATTERN, bench.add_to_subtract, func), func)
    tvm.ir.assert_structural_equal(bench.Identity().visit_expr(func), func)


def test_copy_to_dma_equals_the_forum_threads_hand_written_mutator():
    func = bench.make_copies(20)
    assert bench.count_bindings(func) == 3 * 20 + 2  # two storages, one per 16 copies
    ours = dma.copy_to_dma(func)
    tvm.ir.assert_structural_equal(ours, bench.HandWrittenDMA().visit_expr(func))
    assert bench.count_bindings(ours) == bench.count_bindings(func) + 20
    assert ours.script().count("dma_wait") == 20


def test_the_benchmark_refuses_fewer_than_five_runs(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "3"])
    assert "at least 5" in capsys.readouterr().err


def test_the_instruction_count_runner_does_the_work_of_the_scaling_figure():
    import run_chain

    rewritten = run_chain.run("rewrite_ext", 25, 2)
    tvm.ir.assert_structural_equal(rewritten, bench.add_to_subtract_by_hand(bench.make_chain(25)))
    tvm.ir.assert_structural_equal(run_chain.run("identity", 25, 1), bench.make_chain(25))
    assert run_chain.run("rewrite_ext", 25, 0) is None  # the baseline run only builds the chain
    with pytest.raises(SystemExit):
        run_chain.main(["tvm", "25", "1"])  # only the two sides of the scaling figure


def test_the_scaling_figure_pairs_the_two_sizes_round_by_round(monkeypatch):
    monkeypatch.setattr(bench, "SCALING_SIZES", (20, 200))
    monkeypatch.setattr(bench, "SMALL_RUNS_PER_ROUND", 2)
    figure = bench.measure_scaling(3)
    assert set(figure) == {"ext", "identity", "never"}
    for side in figure.values():
        assert len(side["ratios"]) == 3  # one ratio per round, not one of two medians
        assert side["ratio"] == sorted(side["ratios"])[1]
        assert side[20] > 0 and side[200] > 0


def test_the_scaling_figure_checks_what_it_times(monkeypatch):
    monkeypatch.setattr(bench, "SCALING_SIZES", (20, 200))
    monkeypatch.setattr(bench, "add_to_subtract_by_hand", lambda func: func)  # expects no rewrite
    with pytest.raises(AssertionError, match="rewrite_ext on the 20 chain"):
        bench.measure_scaling(1)


def test_the_scaling_figure_checks_the_sides_that_should_change_nothing(monkeypatch):
    monkeypatch.setattr(bench, "SCALING_SIZES", (20, 200))
    sides = bench.scaling_sides

    def never_rewrites_anyway(func):
        # The never-matching side wrongly rewriting: a new function, not the input handed back.
        return {**sides(func), "never": sides(func)["rewrite_ext"]}

    monkeypatch.setattr(bench, "scaling_sides", never_rewrites_anyway)
    with pytest.raises(AssertionError, match="never on the 20 chain"):
        bench.measure_scaling(1)
