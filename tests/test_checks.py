"""check_rewrite passes good rewriters and reports each broken property readably."""

from __future__ import annotations

import itertools

import pytest
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import relax as R

from rewrite_ext.testing.checks import RewriteCheckFailure, check_rewrite

X, Y = wildcard(), wildcard()
ADD = is_op("relax.add")(X, Y)


@R.function
def func(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
    with R.dataflow():
        a = R.add(x, y)
        b = R.multiply(a, y)
        R.output(b)
    return b


def test_a_good_two_argument_rewriter_passes_and_the_report_counts_the_match():
    report = check_rewrite(ADD, lambda orig, m: relax.op.subtract(m[X], m[Y]), func)
    assert report.calls == 1 and report.rewrites == 1 and not report.output_matches
    assert "R.subtract(x, y)" in report.output.script()


def test_a_good_three_argument_rewriter_passes():
    def rewriter(orig, m, builder):
        return relax.op.subtract(m[X], builder.emit(relax.op.negative(m[Y])))

    report = check_rewrite(ADD, rewriter, func)
    assert report.rewrites == 1 and "R.negative(y)" in report.output.script()


def test_a_declining_rewriter_passes_with_the_input_as_output():
    report = check_rewrite(ADD, lambda orig, m: None, func)
    assert report.calls == 1 and report.rewrites == 0
    assert report.output.same_as(func)


def test_a_nondeterministic_rewriter_fails_with_a_diff():
    ops = itertools.cycle([relax.op.subtract, relax.op.multiply])

    def flaky(orig, m):
        return next(ops)(m[X], m[Y])

    with pytest.raises(RewriteCheckFailure, match="deterministic") as info:
        check_rewrite(ADD, flaky, func)
    assert "R.subtract" in str(info.value) and "R.multiply" in str(info.value)


def test_a_rewriter_whose_output_matches_again_is_reported_as_such():
    # add -> add(y, x): every application changes the order back; rewrite_call stops it
    from rewrite_ext import RewriteError

    with pytest.raises(RewriteError, match="did not converge"):
        check_rewrite(ADD, lambda orig, m: relax.op.add(m[Y], m[X]), func)
