"""How long ``rewrite-ext dma`` takes on a 50k-binding module stored as TVM JSON.

    python benchmarks/bench_cli.py                  # 50,000 bindings, target 30 s
    python benchmarks/bench_cli.py --bindings 10000

Builds a lowered, impure ``main`` of about ``--bindings`` bindings (per copy: an
``alloc_tensor`` in a shared storage, ``R.vm.copy_tensor(prev, a)``, ``add(a, a)``;
a new ``alloc_storage`` every 16 copies), saves it with ``tvm.ir.save_json``, and
times the command a user runs, as a subprocess, start to exit:

    rewrite-ext dma IN.json -o OUT.json

That is Python and TVM starting, ``load_json``, the rewrite, its well-formedness
check and ``save_json``.  The output is then checked (one ``dma_copy`` and one
``dma_wait`` per copy, no copy left, equal to ``copy_to_dma`` of the input).
Prints the time and ``MET`` or ``MISSED`` against the target; asserts nothing about
time.  (TVM's TVMScript parser needs minutes for such a module; JSON is the way
in for large ones.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tvm
from tvm import relax

from rewrite_ext import ops
from rewrite_ext.hexagon import DMA_COPY, DMA_WAIT, copy_to_dma
from rewrite_ext.compat import TensorType

TARGET_SECONDS = 30.0
NBYTES = 32 * 64 * 4


def make_copies_module(bindings: int) -> tuple[tvm.IRModule, int]:
    """A lowered module of about ``bindings`` bindings; returns it and its number of copies."""
    copies = max(1, round(bindings / (3 + 1 / 16)))
    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType([32, 64], "int32"))
    with bb.function("main", [x], pure=False):
        prev, storage = x, None
        for i in range(copies):
            if i % 16 == 0:
                storage = bb.emit(relax.op.vm.alloc_storage(relax.ShapeExpr([16 * NBYTES]), 0, "uint8", "global"))
            a = bb.emit(relax.op.vm.alloc_tensor(storage, (i % 16) * NBYTES, relax.ShapeExpr([32, 64]), "int32"))
            bb.emit(ops.copy_tensor(prev, a))
            prev = bb.emit(relax.op.add(a, a))
        bb.emit_func_output(prev)
    return bb.get(), copies


def count_bindings(mod: tvm.IRModule) -> int:
    return sum(len(block.bindings) for block in mod["main"].body.blocks)


def count_calls(mod: tvm.IRModule) -> dict[str, int]:
    """Bindings per callee name (op name or extern function), in ``main``'s top-level blocks."""
    counts: dict[str, int] = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            name = value.op.name if isinstance(value.op, tvm.ir.Op) else None
            if name == "relax.call_builtin_with_ctx":
                name = value.args[0].global_symbol
            counts[name] = counts.get(name, 0) + 1
    return counts


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=50_000, help="size of the module (default 50000)")
    parser.add_argument("--target", type=float, default=TARGET_SECONDS, help="seconds (default 30)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        source, output = Path(tmp) / "in.json", Path(tmp) / "out.json"
        say(f"# building a module of ~{args.bindings} bindings ...")
        mod, copies = make_copies_module(args.bindings)
        bindings = count_bindings(mod)
        source.write_text(tvm.ir.save_json(mod))
        say(f"# {bindings} bindings, {copies} copies, {source.stat().st_size / 1e6:.1f} MB of JSON")

        command = [sys.executable, "-m", "rewrite_ext", "dma", str(source), "-o", str(output)]
        say(f"# timing: rewrite-ext dma {source.name} -o {output.name}")
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            say(f"FAILED: exit code {done.returncode}: {done.stderr.strip()}")
            return 1

        say("# checking the output ...")
        result = tvm.ir.load_json(output.read_text())
        counts = count_calls(result)
        correct = (
            counts.get(DMA_COPY) == copies
            and counts.get(DMA_WAIT) == copies
            and ops.COPY_TENSOR_OP not in counts
        )
        tvm.ir.assert_structural_equal(result, copy_to_dma(mod))

    verdict = "MET" if seconds < args.target else "MISSED"
    say(f"rewrite-ext dma, {bindings} bindings, JSON in and out: {seconds:.1f} s (target < {args.target:.0f} s) {verdict}")
    say(f"output checked: {copies} dma_copy + {copies} dma_wait, no copy_tensor, equal to copy_to_dma: {correct}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
