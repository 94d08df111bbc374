"""Run one side of bench_rewrite's scaling figure K times, for an instruction counter.

Timings on a shared machine move by tens of percent; instructions and simulated
cache misses counted by valgrind do not.  Count a run with K repeats and one
with none (building the chain and importing TVM cost the same in both), and
divide the difference by N * K::

    valgrind --tool=cachegrind --cache-sim=yes --LL=4194304,16,64 \\
        python benchmarks/run_chain.py rewrite_ext 10000 10 --rate 10%
    valgrind --tool=cachegrind --cache-sim=yes --LL=4194304,16,64 \\
        python benchmarks/run_chain.py rewrite_ext 10000 0 --rate 10%

``SIDE`` is ``rewrite_ext`` (the add -> subtract rewrite of the chain) or
``mutator`` (the hand-written PyExprMutator doing the same); ``--rate`` the
share of the chain's bindings that match (1%, 10% or 100%).
"""

from __future__ import annotations

import argparse
import gc
import sys

from tvm import relax

import bench_rewrite as bench

SIDES = ("rewrite_ext", "mutator")


def run(side: str, rate: str, n: int, repeats: int) -> relax.Function | None:
    """Build a chain of ``n`` bindings and run ``side`` on it ``repeats`` times; the last output."""
    once = bench.chain_workload(rate, n).sides()[side]
    gc.collect()
    out = None
    for _ in range(repeats):
        out = None  # freed before the next run, as in bench_rewrite
        out = once()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("n", type=int, help="bindings in the chain")
    parser.add_argument("repeats", type=int, help="runs (0: only build the chain)")
    parser.add_argument(
        "--rate", choices=list(bench.MATCH_RATES), default="10%", help="share of bindings that match"
    )
    args = parser.parse_args(argv)
    run(args.side, args.rate, args.n, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
