"""Cost of the overlap schedule: ``copy_to_dma(overlap=True)`` against plain ``copy_to_dma``.

The inputs are lowered, impure functions with N independent copies (1k and 10k):
``a_i = alloc_tensor(storage, offset)``, ``copy_tensor(x, a_i)``, a new storage every
16 copies.  Nothing reads the copies, so every transfer stays in flight to the end of
the function: the largest in-flight set the schedule can face.

Targets (issue 17):

- overlap/plain at 1k copies <= 1.5
- overlap/plain at 10k copies <= 1.5
- t(10k)/t(1k) of ``copy_to_dma(overlap=True)`` <= 11 (linear growth)

For reference it also times reading each binding of the rewritten function once from
Python (linear in the bindings): its t(10k)/t(1k) above 10 is this machine's memory
hierarchy (1k copies stay in cache, 10k do not), the floor of the scaling target.

Times are CPU seconds of this process (``time.process_time``), the median over
``--rounds`` rounds, plain and overlap interleaved in each round, so other load on the
machine skews both sides alike.  Run::

    python benchmarks/bench_overlap.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from tvm import relax

import rewrite_ext  # noqa: F401 - registers R.vm.copy_tensor
from rewrite_ext import ops
from rewrite_ext.hexagon import copy_to_dma, sink_dma_waits
from rewrite_ext.compat import TensorType
from bench_rewrite import read_every_value

SIZES = (1_000, 10_000)
RATIO_TARGET = 1.5
SCALING_TARGET = 11.0


def make_independent_copies(n: int) -> relax.Function:
    """``n`` copies of the parameter into tensors of their own, 16 per storage."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([32, 64], "int32"))
    nbytes = 32 * 64 * 4
    with bb.function("main", [x], pure=False):
        storage = last = None
        for i in range(n):
            if i % 16 == 0:
                storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([16 * nbytes]), 0, "uint8", "global"))
            last = bb.emit(relax.op.vm.alloc_tensor(storage, (i % 16) * nbytes, relax.ShapeExpr([32, 64]), "int32"))
            bb.emit(ops.copy_tensor(x, last))
        bb.emit_func_output(last)
    return bb.get()["main"]


def cpu_seconds(fn, *args, **kwargs) -> float:
    gc.collect()  # start each timing from the same heap, as bench_rewrite.py does
    start = time.process_time()
    fn(*args, **kwargs)
    return time.process_time() - start


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size (median taken)")
    args = parser.parse_args()

    medians: dict[int, dict[str, float]] = {}
    for n in SIZES:
        func = make_independent_copies(n)
        plain_out = copy_to_dma(func)
        copy_to_dma(func, overlap=True)  # warm-up: op tables, caches
        times: dict[str, list[float]] = {"plain": [], "overlap": [], "sink only": [], "read values": []}
        for _ in range(args.rounds):
            times["plain"].append(cpu_seconds(copy_to_dma, func))
            times["overlap"].append(cpu_seconds(copy_to_dma, func, overlap=True))
            times["sink only"].append(cpu_seconds(sink_dma_waits, plain_out))
            times["read values"].append(cpu_seconds(read_every_value, plain_out))
        medians[n] = {name: statistics.median(values) for name, values in times.items()}
        row = ", ".join(f"{name} {value:.3f} s" for name, value in medians[n].items())
        print(f"{n:>6} copies ({args.rounds} rounds, median CPU s): {row}", flush=True)

    print()
    print("targets:")
    for n in SIZES:
        ratio = medians[n]["overlap"] / medians[n]["plain"]
        print(f"  overlap/plain at {n // 1000}k copies: {ratio:.2f} (target <= {RATIO_TARGET}) "
              f"{verdict(ratio <= RATIO_TARGET)}")
    scaling = medians[SIZES[1]]["overlap"] / medians[SIZES[0]]["overlap"]
    plain_scaling = medians[SIZES[1]]["plain"] / medians[SIZES[0]]["plain"]
    print(f"  t(10k)/t(1k) of copy_to_dma(overlap=True): {scaling:.2f} (target <= {SCALING_TARGET}) "
          f"{verdict(scaling <= SCALING_TARGET)}")
    floor = medians[SIZES[1]]["read values"] / medians[SIZES[0]]["read values"]
    print(f"  for reference, t(10k)/t(1k) of plain copy_to_dma in this run: {plain_scaling:.2f}, "
          f"of reading each binding once: {floor:.2f}")


if __name__ == "__main__":
    main()
