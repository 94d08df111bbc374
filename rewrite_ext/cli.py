"""``rewrite-ext``: the DMA rewrite from the command line.

``rewrite-ext dma FILE [--run] [--legacy-wait] [--queue-id N] [--overlap]`` loads
the IRModule from a TVMScript file, prints the rewritten TVMScript, and with
``--run`` runs original and rewritten on the CPU.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from .errors import RewriteError

__all__ = ["main"]


class CLIError(Exception):
    """A one-line complaint about the command line's input; exit code 2."""


def load_module(path: str) -> tvm.IRModule:
    """The IRModule defined in a TVMScript file.

    The file is run as Python with ``I``, ``R`` and ``T`` predefined, so both a
    script with its imports and the text ``IRModule.script()`` prints (imports
    commented out) load.  The first IRModule it defines, by preference one
    named ``Module``, is returned.
    """
    file = Path(path)
    if not file.is_file():
        raise CLIError(f"no such file: {path}")
    from . import ops  # noqa: F401 - R.vm.copy_tensor must parse

    try:
        names = runpy.run_path(str(file), init_globals={"I": I, "R": R, "T": T}, run_name="__tvmscript__")
    except Exception as exc:  # noqa: BLE001 - any failure to parse is the user's input
        raise CLIError(f"{path} does not parse as TVMScript: {_first_line(exc)}") from exc
    modules = {name: value for name, value in names.items() if isinstance(value, tvm.IRModule)}
    if not modules:
        raise CLIError(f"{path} defines no IRModule (expected e.g. `@I.ir_module class Module: ...`)")
    return modules.get("Module", next(iter(modules.values())))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _random_inputs(func: tvm.relax.Function, rng: np.random.Generator) -> list[tvm.runtime.Tensor]:
    inputs = []
    for param in func.params:
        ty = param.ty
        shape = [int(dim) for dim in ty.shape.values]
        dtype = str(getattr(ty.dtype, "dtype", ty.dtype))  # a PrimType in TVM 0.27, a str before
        if dtype.startswith("float"):
            data = rng.standard_normal(shape).astype(dtype)
        else:
            data = rng.integers(-100, 100, size=shape).astype(dtype)
        inputs.append(tvm.runtime.tensor(data))
    return inputs


def _run(mod: tvm.IRModule, inputs: list[tvm.runtime.Tensor]) -> np.ndarray:
    executable = tvm.relax.build(mod, target="llvm")
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*inputs).numpy()


def run_and_compare(original: tvm.IRModule, rewritten: tvm.IRModule, seed: int = 0) -> bool:
    """Run both modules' ``main`` on the same random inputs; print the verdict and counters."""
    from .hexagon.cpu_dma import cpu_dma

    inputs = _random_inputs(original["main"], np.random.default_rng(seed))
    expected = _run(original, inputs)
    with cpu_dma() as dma:
        got = _run(rewritten, inputs)
    equal = bool(np.array_equal(expected, got))
    print(f"# outputs equal: {equal}")
    print(f"# cpu_dma: {dma.summary()}")
    return equal


def _dma(args: argparse.Namespace) -> int:
    from .hexagon import copy_to_dma

    original = load_module(args.file)
    options = {"queue_id": args.queue_id, "legacy_wait": args.legacy_wait}
    if args.overlap:
        options["overlap"] = True
    rewritten = copy_to_dma(original, **options)
    print(rewritten.script(show_meta=False))
    if args.overlap:
        from .hexagon.overlap import format_overlap_report, overlap_report

        print(format_overlap_report(overlap_report(rewritten)))
    if args.run:
        return 0 if run_and_compare(original, rewritten) else 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewrite-ext", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    dma = commands.add_parser("dma", help="rewrite R.vm.copy_tensor into Hexagon dma_copy + dma_wait")
    dma.add_argument("file", help="a TVMScript file defining an IRModule")
    dma.add_argument("--run", action="store_true", help="run original and rewritten on the CPU and compare")
    dma.add_argument("--legacy-wait", action="store_true", help="emit the two-argument dma_wait [queue, 0]")
    dma.add_argument("--queue-id", type=int, default=0, help="the DMA queue (default 0)")
    dma.add_argument("--overlap", action="store_true", help="sink each wait to the first use and report overlap")
    dma.set_defaults(handler=_dma)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rewrite-ext`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (CLIError, RewriteError) as exc:
        print(f"rewrite-ext: error: {_first_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
