"""Benchmark: the cost of many rules in one traversal against one rule.

Run from the repository root::

    python benchmarks/bench_rules.py              # ~30 s on 2 cores
    python benchmarks/bench_rules.py --runs 21    # more runs per figure

On a pure chain of 10k bindings in one DataflowBlock (every 10th an
``R.add``, the rest ``R.multiply`` / ``R.exp``, each using the previous one),
``rewrite_ext.apply_rules`` rewrites add -> subtract with:

* ``1 rule``: that rule alone (what ``rewrite_call`` does);
* ``20 rules``: the same rule, first, then 19 rooted at ops absent from the
  chain (``R.nn.relu``, ``R.sigmoid``, ...), as most rules of a lowering
  pass's list are for any one function.  Target: at most 2x the time of
  ``1 rule`` (the rules' root ops index the bindings, so no rule's matcher
  runs on a binding whose op it cannot match).
* ``20 rules, 2 on chain ops`` (no target): as ``20 rules``, but 2 of the 19
  are rooted at ops of the chain and fail deeper (``R.multiply(x, <const>)``,
  ``R.exp(R.add(...))``): their matchers run, and fail, on 9 bindings in 10.
* ``20 rules, one op`` (no target; the worst case of the index): 19 never-
  rewriting rules all rooted at ``R.multiply``, half the chain's bindings, so
  every one of their matchers runs on each of those.

Both rule lists give an output structurally equal to ``1 rule``'s; that is
checked before anything is timed.  The sides run alternately (a load change on
the machine hits both) and each figure is the median of ``--runs`` runs,
in microseconds per binding of the input.  Nothing asserts on a time: the
target is printed as MET / MISSED, in the last line
``RULES 20/1 at 10k: <x> (target <= 2): MET``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from rewrite_ext import Rule, apply_rules
from rewrite_ext.compat import TensorType

N = 10_000
TARGET = 2.0

_A, _B = wildcard(), wildcard()

ABSENT_OPS = (
    "relax.nn.relu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.sqrt",
    "relax.log",
    "relax.negative",
    "relax.abs",
    "relax.divide",
    "relax.power",
    "relax.maximum",
    "relax.minimum",
    "relax.matmul",
    "relax.nn.softmax",
    "relax.reshape",
    "relax.permute_dims",
    "relax.sum",
    "relax.nn.gelu",
    "relax.floor",
    "relax.ceil",
)


def make_chain(n: int) -> relax.Function:
    """``n`` bindings in one DataflowBlock, each using the previous one; every 10th an add."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([4, 4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            cur = x
            for i in range(n):
                if i % 10 == 0:
                    call = relax.op.add(cur, x)
                elif i % 2:
                    call = relax.op.multiply(cur, cur)
                else:
                    call = relax.op.exp(cur)
                cur = bb.emit_output(call) if i == n - 1 else bb.emit(call)
        bb.emit_func_output(cur)
    return bb.get()["main"]


def add_to_subtract(orig: relax.Expr, m) -> relax.Expr:
    return relax.op.subtract(m[_A], m[_B])


def never(orig: relax.Expr, m) -> None:
    """A rewriter that is never reached, or declines: its pattern fails first."""
    return None


def one_rule() -> list[Rule]:
    return [Rule(is_op("relax.add")(_A, _B), add_to_subtract)]


def twenty_rules() -> list[Rule]:
    rules = one_rule() + [Rule(is_op(op)(wildcard()), never, name=op) for op in ABSENT_OPS]
    assert len(rules) == 20
    return rules


def twenty_rules_two_on_chain_ops() -> list[Rule]:
    rules = one_rule()
    rules.append(Rule(is_op("relax.multiply")(wildcard(), is_const()), never, name="mul_by_const"))
    rules.append(Rule(is_op("relax.exp")(is_op("relax.add")(wildcard(), wildcard())), never, name="exp_of_add"))
    rules += [Rule(is_op(op)(wildcard()), never, name=op) for op in ABSENT_OPS[:17]]
    assert len(rules) == 20
    return rules


def twenty_rules_one_op() -> list[Rule]:
    rules = one_rule()
    for i in range(19):
        # R.multiply(x, x) in the chain: each pattern's matcher runs on each multiply, and fails.
        rules.append(Rule(is_op("relax.multiply")(wildcard(), is_const()), never, name=f"mul_{i}"))
    return rules


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="runs per figure (default 11)")
    args = parser.parse_args(argv)

    func = make_chain(N)
    bindings = sum(len(block.bindings) for block in func.body.blocks)
    sides = {
        "1 rule": one_rule(),
        "20 rules": twenty_rules(),
        "20 rules, 2 on chain ops": twenty_rules_two_on_chain_ops(),
        "20 rules, one op": twenty_rules_one_op(),
    }
    fns = {name: (lambda rules=rules: apply_rules(rules, func)) for name, rules in sides.items()}

    times: dict[str, list[float]] = {name: [] for name in fns}
    reference = None
    for name, fn in fns.items():  # the first run of each side: its output is checked
        seconds, out = timed(fn)
        if reference is None:
            reference = out
        elif not tvm_ffi.structural_equal(out, reference):
            print(f"{name}: output differs from '1 rule''s", file=sys.stderr)
            return 1
        times[name].append(seconds)
    for _ in range(args.runs - 1):
        for name, fn in fns.items():
            times[name].append(timed(fn)[0])

    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["1 rule"]
    print(f"# tvm={tvm.__version__}; chain of {bindings} bindings; median of {args.runs} runs per figure")
    print(f"{'rules':<26} {'us/binding':>11} {'x 1 rule':>9}")
    for name, seconds in medians.items():
        print(f"{name:<26} {seconds * 1e6 / bindings:11.2f} {seconds / base:9.2f}")
    ratio = medians["20 rules"] / base
    verdict = "MET" if ratio <= TARGET else "MISSED"
    print(f"RULES 20/1 at 10k: {ratio:.2f} (target <= {TARGET:g}): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
