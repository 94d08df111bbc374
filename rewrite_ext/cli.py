"""The ``rewrite-ext`` command line: the Hexagon DMA rewrite of a module in a file.

``rewrite-ext dma FILE`` reads an IRModule from TVMScript (read as text, never
run) or TVM's JSON, rewrites every ``R.vm.copy_tensor`` into the Hexagon DMA
builtins, and prints or writes the result; ``--run`` also runs original and
rewritten ``main`` (else the only public function, or ``--entry NAME``) on the
CPU and compares their outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import warnings
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import tvm

from . import _progress
from ._module_files import FileFormat, ModuleFileError, format_of, module_text, read_module, write_module
from .errors import RewriteError

if TYPE_CHECKING:
    from ._cpu_run import Inputs

__all__ = ["EXIT_DIFFERENT", "EXIT_ERROR", "EXIT_OK", "load_module", "main"]

EXIT_OK = 0
"""Done; with ``--run``, the outputs are equal."""
EXIT_DIFFERENT = 1
"""With ``--run``: the rewritten module computes something else, or fails where the original ran."""
EXIT_ERROR = 2
"""An error, reported in one line on stderr (none when stdout was closed early)."""

#: Queues of the Hexagon user DMA engine a rewrite may use; queue 9 is the runtime's own.
USER_QUEUES = range(0, 9)


class CLIError(Exception):
    """A one-line complaint about the command line's input; exit code 2."""


_DESCRIPTION = "TVM Relax rewrites from the command line. See rewrite-ext COMMAND --help."

_EXIT_CODES = """\
exit codes:
  0  done (with --run: the outputs are equal)
  1  with --run: the outputs differ, or the rewritten module fails where the
     original ran (e.g. a DMA stand-in error)
  2  an error, explained in one line on stderr (none when stdout is closed early,
     e.g. by | head)
"""

_DMA_DESCRIPTION = """\
Rewrite every R.vm.copy_tensor(src, dst) of FILE's IRModule into
vm.builtin.hexagon.dma_copy and its dma_wait, and print the result as TVMScript.

FILE is TVMScript (read as text: nothing in it runs, see docs/cli.md)
or TVM's JSON (tvm.ir.save_json), chosen by the extension (.json) or --format.
JSON is much faster for large modules: TVM's TVMScript parser needs minutes
from about 10,000 bindings on.
"""

_DMA_EPILOG = (
    _EXIT_CODES
    + """
environment:
  REWRITE_EXT_PROGRESS_AFTER  seconds after which a slow step is reported on
                              stderr (default 3; 0 reports every step, inf none)

examples:
  rewrite-ext dma examples/copy_to_vtcm.py --run
  rewrite-ext dma staged.json --run --entry forward
  rewrite-ext dma big.json -o big.dma.json
  rewrite-ext dma model.py --module Lowered --diff
"""
)


def load_module(path: str, name: str | None = None) -> tvm.IRModule:
    """The IRModule in a TVMScript or JSON file, read as ``rewrite-ext dma FILE`` reads it.

    Parameters
    ----------
    path : str
        A TVMScript file (read as text, not run) or a ``.json`` file of ``tvm.ir.save_json``.
    name : Optional[str]
        Which module, for a TVMScript file defining several.

    Returns
    -------
    mod : tvm.IRModule

    Raises
    ------
    rewrite_ext._module_files.ModuleFileError
        With the one-line message the command line prints.
    """
    return read_module(path, None, name)[1]


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _binding(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*(-?\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected NAME=INTEGER, got {text!r}")
    return match.group(1), int(match.group(2))


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="rewrite-ext", description=_DESCRIPTION, epilog=_EXIT_CODES, formatter_class=raw
    )
    parser.add_argument("--version", action="store_true", help="print the versions of rewrite_ext and TVM, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    dma = commands.add_parser(
        "dma",
        help="rewrite R.vm.copy_tensor into Hexagon dma_copy + dma_wait",
        description=_DMA_DESCRIPTION,
        epilog=_DMA_EPILOG,
        formatter_class=raw,
    )
    dma.add_argument("file", metavar="FILE", help="a TVMScript or JSON file holding an IRModule")
    source = dma.add_argument_group("input and output")
    source.add_argument(
        "--format",
        choices=[f.value for f in FileFormat],
        help="the format of FILE (default: json for a .json file, else tvmscript)",
    )
    source.add_argument("--module", metavar="NAME", help="which module of a file that defines several")
    source.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="write the rewritten module to OUT (JSON for a .json name, else TVMScript) instead of printing it",
    )
    source.add_argument(
        "--output-format", choices=[f.value for f in FileFormat], help="the format of OUT or of what is printed"
    )
    source.add_argument(
        "--diff", action="store_true", help="print a unified diff of the TVMScript before and after the rewrite"
    )
    rewrite = dma.add_argument_group("the rewrite")
    rewrite.add_argument(
        "--queue-id",
        type=int,
        default=0,
        metavar="N",
        help="the DMA queue, 0 to 8 (default 0; queue 9 is the runtime's)",
    )
    rewrite.add_argument(
        "--num-queues",
        type=int,
        default=1,
        metavar="K",
        help="spread the copies over queues N to N+K-1, round robin (default 1; at most queue 8)",
    )
    rewrite.add_argument(
        "--legacy-wait", action="store_true", help="emit the two-argument dma_wait(queue, 0) of older runtimes"
    )
    rewrite.add_argument(
        "--overlap", action="store_true", help="sink each wait to the first use and print the overlap report"
    )
    rewrite.add_argument(
        "--report",
        action="store_true",
        help="print the rewrite report after the module: copies offered, rewritten, kept as copy_tensor and why",
    )
    check = dma.add_argument_group("checking on the CPU")
    check.add_argument(
        "--run",
        action="store_true",
        help="run original and rewritten main (else the module's only public function) on the same random "
        "inputs and compare (rewritten under cpu_dma())",
    )
    check.add_argument(
        "--entry",
        metavar="NAME",
        help="with --run: the function to run (default: main, else the module's only public Relax function, "
        "such as nn.Module.export_tvm's forward)",
    )
    check.add_argument(
        "--bind",
        type=_binding,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --run: the value of a symbolic dim of the function's parameters (default 8 each)",
    )
    check.add_argument("--seed", type=int, default=0, help="with --run: the seed of the random inputs (default 0)")
    dma.set_defaults(handler=_dma)
    return parser


# -- the dma command -----------------------------------------------------------------------


def _output_format(args: argparse.Namespace) -> FileFormat:
    if args.output_format is not None:
        return FileFormat(args.output_format)
    return format_of(args.output) if args.output else FileFormat.TVMSCRIPT


def _check_arguments(args: argparse.Namespace) -> None:
    if args.queue_id not in USER_QUEUES:
        raise CLIError(
            f"--queue-id {args.queue_id} is not a user DMA queue: use 0 to 8 (queue 9 is the runtime's own)"
        )
    if args.num_queues < 1:
        raise CLIError(f"--num-queues {args.num_queues}: the copies need at least 1 queue")
    last = args.queue_id + args.num_queues - 1
    if last not in USER_QUEUES:
        most = 9 - args.queue_id
        fix = f"use --num-queues 1 to {most}" if most > 1 else "only --num-queues 1 fits"
        raise CLIError(
            f"--num-queues {args.num_queues} from --queue-id {args.queue_id} uses queues up to {last}, "
            f"past 8: {fix}, or a lower --queue-id (queue 9 is the runtime's own)"
        )
    if args.bind and not args.run:
        raise CLIError("--bind sets inputs of --run; add --run or drop --bind")
    if args.entry is not None and not args.run:
        raise CLIError("--entry chooses the function --run runs; add --run or drop --entry")
    if args.diff and _output_format(args) is FileFormat.JSON and not args.output:
        raise CLIError("--diff prints TVMScript: drop --output-format json, or write the JSON with -o OUT")


def _say(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# Set when the module itself goes to stdout as JSON: the `# ...` notes (run verdict, reports)
# then go to stderr, so that stdout stays valid JSON.
_NOTES_TO_STDERR = False


def _show_warning(message: Warning | str, category: type[Warning], *_args: object, **_kwargs: object) -> None:
    """A warning (``DMAChunkWarning``, say) as one line, as the CLI's errors are; no source line."""
    print(f"rewrite-ext: warning: {category.__name__}: {message}", file=sys.stderr)


def _note(text: str) -> None:
    """A `# ...` line for the reader: stdout, or stderr while stdout carries JSON."""
    if _NOTES_TO_STDERR:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    else:
        _say(text)


@dataclass
class _Run:
    """What --run runs: the function's name on the VM, and its inputs."""

    name: str
    inputs: Inputs


def _prepare_run(original: tvm.IRModule, args: argparse.Namespace) -> _Run:
    """The inputs of --run, made before the rewrite so that a hopeless --run fails fast."""
    from ._cpu_run import InputError, entry_function, make_inputs

    try:
        name, func = entry_function(original, args.entry, choose="choose one with --entry NAME")
    except ValueError as exc:
        raise CLIError(f"--run: {exc}") from None
    try:
        return _Run(name, make_inputs(func, dict(args.bind), seed=args.seed, name=name))
    except InputError as exc:
        raise CLIError(str(exc)) from None


def _run_and_compare(original: tvm.IRModule, rewritten: tvm.IRModule, run: _Run) -> bool:
    """Run both modules' entry function; print the verdict and the DMA stand-in's counters."""
    from ._cpu_run import compare_outputs, run_main
    from .hexagon.cpu_dma import calls_dma, cpu_dma
    from .hexagon.vtcm import allocates_vtcm, cpu_vtcm

    # VTCM storage (a staged module's) is allocated as global memory on the CPU.
    vtcm = cpu_vtcm if allocates_vtcm(original) or allocates_vtcm(rewritten) else contextlib.nullcontext

    inputs = run.inputs
    if inputs.bound:
        values = ", ".join(f"{name}={value}" for name, value in sorted(inputs.bound.items()))
        _note(f"# symbolic vars: {values} (set with --bind NAME=VALUE)")
    with _progress.step(f"building and running the original {run.name} on the CPU"):
        try:
            # A module that already holds DMA builtins (rewritten before) runs under the stand-in too.
            with cpu_dma() if calls_dma(original) else contextlib.nullcontext(), vtcm():
                expected = run_main(original, inputs, run.name)
        except Exception as exc:  # noqa: BLE001 - TVM's build or VM, about the input module
            raise CLIError(f"the original module does not run on the CPU: {_first_line(exc)}") from None
    with _progress.step(f"building and running the rewritten {run.name} under cpu_dma()"):
        try:
            with cpu_dma() as dma, vtcm():
                got = run_main(rewritten, inputs, run.name)
        except Exception as exc:  # noqa: BLE001 - e.g. DMAError: the rewrite broke the module
            # The original ran: a rewritten module that fails computes something else.
            _note("# outputs equal: False")
            _note(f"# the rewritten module fails under cpu_dma(): {type(exc).__name__}: {_first_line(exc)}")
            return False
    verdict = compare_outputs(expected, got)
    _note(f"# outputs equal: {verdict.equal}")
    if rewritten.same_as(original):
        # (A module rewritten before holds no copy_tensor: equal to itself, right or wrong.)
        _note(
            "# nothing was rewritten (no R.vm.copy_tensor to take): the module ran against itself, "
            "which shows only that it builds and runs; compare it with the module before its rewrite"
        )
    if not verdict.equal:
        _note(f"# {verdict.difference}")
    _note(f"# cpu_dma: {dma.summary()}")
    return verdict.equal


def _dma(args: argparse.Namespace) -> int:
    _check_arguments(args)
    input_format = FileFormat(args.format) if args.format else None
    with _progress.step(f"reading {args.file} ({format_of(args.file, input_format).value})"):
        _, original = read_module(args.file, input_format, args.module)
    run = _prepare_run(original, args) if args.run else None

    from .hexagon import copy_to_dma

    from .report import RewriteReport

    report = RewriteReport() if args.report else None
    with _progress.step("rewriting"):
        rewritten = copy_to_dma(
            original,
            queue_id=args.queue_id,
            num_queues=args.num_queues,
            legacy_wait=args.legacy_wait,
            overlap=args.overlap,
            report=report,
        )
    out_format = _output_format(args)
    if args.output:
        with _progress.step(f"writing {args.output} ({out_format.value})"):
            write_module(rewritten, args.output, out_format)
    if args.diff:
        with _progress.step("diffing"):
            before = (original.script(show_meta=False) + "\n").splitlines(keepends=True)
            after = (rewritten.script(show_meta=False) + "\n").splitlines(keepends=True)
            sys.stdout.writelines(difflib.unified_diff(before, after, f"{args.file} (before)", f"{args.file} (after)"))
    elif not args.output:
        global _NOTES_TO_STDERR
        _NOTES_TO_STDERR = out_format is not FileFormat.TVMSCRIPT
        with _progress.step(f"printing ({out_format.value})"):
            text = rewritten.script(show_meta=False) if out_format is FileFormat.TVMSCRIPT else module_text(
                rewritten, out_format
            )
            _say(text)
    if args.overlap:
        from .hexagon.overlap import format_overlap_report, overlap_report

        _note(format_overlap_report(overlap_report(rewritten)))
    if report is not None:
        _note("# rewrite report\n" + "\n".join(f"# {line}" for line in str(report).splitlines()))
    if run is not None:
        return EXIT_OK if _run_and_compare(original, rewritten, run) else EXIT_DIFFERENT
    return EXIT_OK


def _version() -> int:
    import importlib.metadata

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    _say(
        f"rewrite_ext {version('rewrite_ext')}, apache-tvm {version('apache-tvm')},"
        f" apache-tvm-ffi {version('apache-tvm-ffi')}"
    )
    return EXIT_OK


def _quiet_broken_pipe() -> None:
    # The reader went away (`| head`): nothing more can be shown, and Python's flush of
    # stdout at exit would complain a second time.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rewrite-ext`` console script; returns the exit code.

    Parameters
    ----------
    argv : Optional[Sequence[str]]
        The arguments after the program name; ``sys.argv[1:]`` by default.

    Returns
    -------
    code : int
        0 done (with ``--run``, outputs equal), 1 outputs differ, 2 an error.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        return _version()
    if args.command is None:
        parser.error("choose a command: dma (rewrite-ext dma --help tells more)")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # (restored on leaving the block)
            code = args.handler(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_broken_pipe()
        return EXIT_ERROR
    except (CLIError, ModuleFileError, RewriteError) as exc:
        message = _first_line(exc)
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as exc:  # noqa: BLE001 - never a traceback: one line, and how to see more
        if os.environ.get("REWRITE_EXT_TRACEBACK"):
            traceback.print_exc()
        message = f"{type(exc).__name__}: {_first_line(exc)} (REWRITE_EXT_TRACEBACK=1 shows the traceback)"
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    print(f"rewrite-ext: error: {message}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
