"""Build, run and compare Relax programs on the VM: the semantic half of the checks.

:func:`random_inputs` makes seeded inputs for every parameter of a function
(tensors of any dtype and of symbolic shape, ``R.Prim``, ``R.Shape``,
``R.Object``, tuples), :func:`run` builds a function or module for ``llvm``
and runs its ``main`` on the VM (under :func:`rewrite_ext.hexagon.cpu_dma`
when it calls the Hexagon DMA builtins), and :func:`assert_same_results`
runs two programs on the same inputs and reports the first output that
differs, with the inputs that show it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .. import _ir
from .._cpu_run import entry_function
from ..compat import PrimType, ShapeType, TensorType, TupleType, dtype_name, ty

__all__ = ["Comparison", "ResultMismatch", "RunError", "assert_same_results", "random_inputs", "run"]


class ResultMismatch(AssertionError):
    """Two programs computed different results; the message shows where and on what input."""


class RunError(RuntimeError):
    """A program could not be built or run on the VM; the message says which step and why.

    TVM's own error is its ``__cause__``.  A ``DMAError`` of the CPU stand-in is
    not wrapped: it is raised as it is.
    """


# What a TVM error means when it names a known pitfall (docs/hexagon-dma.md).
_HINTS = {
    "byte_offset": (
        "CPU kernels reject a tensor at a non-zero byte offset (such as R.vm.alloc_tensor(storage, 512, ...)): "
        "read it through R.memory.ensure_zero_offset first (docs/hexagon-dma.md, 'Tensors at a non-zero offset')"
    ),
}


def _run_error(step: str, exc: Exception) -> RunError:
    message = f"run: {step} failed: {type(exc).__name__}: {exc}"
    hints = [hint for key, hint in _HINTS.items() if key in str(exc)]
    return RunError("\n".join([message, *hints]))


@dataclass(frozen=True)
class Comparison:
    """What :func:`assert_same_results` ran and saw."""

    inputs: list[Any]
    """The inputs both programs ran on (numpy arrays, ints, bools, shapes, tuples)."""
    before: list[Any]
    """The first program's outputs, flattened (a tuple output gives one entry per field)."""
    after: list[Any]
    """The second program's outputs, flattened the same way."""


# ---------------------------------------------------------------------------
# Programs as modules
# ---------------------------------------------------------------------------


def _as_module(program: relax.Function | tvm.IRModule) -> tvm.IRModule:
    if isinstance(program, tvm.IRModule):
        return program
    if not isinstance(program, relax.Function):
        raise TypeError(f"expected a relax.Function or a tvm.IRModule, got {type(program).__name__}")
    return tvm.IRModule({"main": program.with_attr("global_symbol", "main")})


def _has_if(func: relax.Function) -> bool:
    return any(isinstance(b.value, relax.If) for b in _ir.all_bindings(func))


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def _eval_dim(dim: Any, sizes: Mapping[str, int]) -> int:
    """The value of a shape dimension given sizes for its symbolic variables."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim.value)
    if isinstance(dim, tvm.tirx.Var):
        return int(sizes[str(dim.name)])
    ops = {
        tvm.tirx.Add: lambda a, b: a + b,
        tvm.tirx.Sub: lambda a, b: a - b,
        tvm.tirx.Mul: lambda a, b: a * b,
        tvm.tirx.FloorDiv: lambda a, b: a // b,
        tvm.tirx.Div: lambda a, b: a // b,
        tvm.tirx.FloorMod: lambda a, b: a % b,
        tvm.tirx.Max: max,
        tvm.tirx.Min: min,
    }
    for cls, fn in ops.items():
        if isinstance(dim, cls):
            return fn(_eval_dim(dim.a, sizes), _eval_dim(dim.b, sizes))
    raise ValueError(f"cannot evaluate the shape dimension {dim}: give the input with inputs=[...]")


def _dim_vars(dim: Any) -> list[str]:
    if isinstance(dim, tvm.tirx.Var):
        return [str(dim.name)]
    if hasattr(dim, "a") and hasattr(dim, "b"):
        return _dim_vars(dim.a) + _dim_vars(dim.b)
    return []


def _symbols(func: relax.Function) -> list[str]:
    """Names of the symbolic variables of ``func``'s signature (tensor shapes, ``R.Shape``,
    ``R.Prim(value=...)``) and match_casts, in order."""
    names: list[str] = []

    def add(dims: Any) -> None:
        for dim in dims:
            for name in _dim_vars(dim):
                if name not in names:
                    names.append(name)

    def visit(ty: Any) -> None:
        if isinstance(ty, TensorType) and ty.shape is not None and hasattr(ty.shape, "values"):
            add(ty.shape.values)
        elif isinstance(ty, ShapeType) and ty.values is not None:
            add(ty.values)
        elif isinstance(ty, PrimType) and getattr(ty, "value", None) is not None:
            add([ty.value])  # R.Prim(value="n")
        elif isinstance(ty, TupleType):
            for f in ty.fields:
                visit(f)

    for param in func.params:
        visit(ty(param))
    for binding in _ir.all_bindings(func):
        if isinstance(binding, relax.MatchCast):
            visit(ty(binding.var))
    return names


def _cast_types(func: relax.Function) -> dict[relax.Var, relax.Type]:
    """For parameters bound by a top-level ``match_cast``, the type cast to."""
    casts: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.MatchCast) and isinstance(binding.value, relax.Var):
                casts.setdefault(binding.value, ty(binding.var))
    return casts


def _random_value(ty: Any, rng: np.random.Generator, sizes: Mapping[str, int]) -> Any:
    if isinstance(ty, TensorType):
        dtype = dtype_name(ty)
        if ty.shape is not None and hasattr(ty.shape, "values"):
            shape = [_eval_dim(d, sizes) for d in ty.shape.values]
        else:
            shape = [int(rng.integers(1, 5)) for _ in range(max(ty.ndim, 0))]
        if dtype == "bool":
            return rng.integers(0, 2, size=shape).astype(bool)
        if dtype.startswith(("float", "bfloat")):
            return rng.standard_normal(shape).astype(dtype)
        low, high = (0, 100) if dtype.startswith("uint") else (-100, 100)
        return rng.integers(low, high, size=shape).astype(dtype)
    if isinstance(ty, PrimType):
        if getattr(ty, "value", None) is not None:
            return _eval_dim(ty.value, sizes)
        dtype = str(ty.dtype)
        if dtype == "bool":
            return bool(rng.integers(0, 2))
        if dtype.startswith("float"):
            return float(rng.standard_normal())
        return int(rng.integers(0, 8))
    if isinstance(ty, ShapeType):
        if ty.values is not None:
            return tvm.runtime.ShapeTuple([_eval_dim(d, sizes) for d in ty.values])
        return tvm.runtime.ShapeTuple([int(rng.integers(1, 5)) for _ in range(max(ty.ndim, 0))])
    if isinstance(ty, TupleType):
        return tuple(_random_value(f, rng, sizes) for f in ty.fields)
    # R.Object: any object will do; a small tensor.
    return np.zeros((1,), "float32")


def random_inputs(
    program: relax.Function | tvm.IRModule,
    seed: int = 0,
    *,
    sizes: Mapping[str, int] | None = None,
    entry: str | None = None,
) -> list[Any]:
    """Seeded random inputs for every parameter of ``program``'s ``main``.

    Floats are standard normal, integers in [-100, 100), bools either;
    ``R.Prim`` parameters get a Python scalar, ``R.Shape`` a
    ``ShapeTuple``, ``R.Object`` a small tensor, tuples a tuple of inputs.
    Symbolic dims take ``sizes[name]`` (others drawn from 1 to 4), and a
    parameter of unknown shape that ``main`` binds with a top-level
    ``R.match_cast`` takes the shape it is cast to.

    Parameters
    ----------
    program : Union[relax.Function, tvm.IRModule]
        A function or a module with a ``main``.
    seed : int
        The seed of the numpy generator.
    sizes : Mapping[str, int], optional
        Values of symbolic shape variables by name.
    entry : str, optional
        The module's function to run instead of ``main``; by default
        ``main``, or the module's only public Relax function (``forward``
        of a module from ``nn.Module.export_tvm``).

    Returns
    -------
    inputs : list
        One input per parameter of ``main``, numpy arrays for tensors.
    """
    func = entry_function(_as_module(program), entry)[1]
    rng = np.random.default_rng(seed)
    chosen = dict(sizes or {})
    for name in _symbols(func):
        chosen.setdefault(name, int(rng.integers(1, 5)))
    casts = _cast_types(func)
    return [_random_value(casts.get(p, ty(p)), rng, chosen) for p in func.params]


# ---------------------------------------------------------------------------
# Building and running
# ---------------------------------------------------------------------------


@tvm.instrument.pass_instrument
class _Skip:
    """Skips the pass named ``skip`` (a PassContext instrument)."""

    def __init__(self, skip: str) -> None:
        self.skip = skip

    def should_run(self, _mod, info) -> bool:
        return info.name != self.skip


def _build(mod: tvm.IRModule) -> tvm.runtime.Executable:
    mod = relax.transform.LambdaLift()(mod)
    functions = [f for _, f in mod.functions_items() if isinstance(f, relax.Function)]
    # StaticPlanBlockMemory puts the storage both If branches share in the then-branch only,
    # so taking the else-branch crashes the VM (apache/tvm#17348): build Ifs without it.
    instruments = [_Skip("StaticPlanBlockMemory")] if any(_has_if(f) for f in functions) else []
    with tvm.transform.PassContext(opt_level=3, instruments=instruments):
        return relax.build(mod, target="llvm")


def _vm_arg(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return tvm.runtime.tensor(value)
    if isinstance(value, tvm.runtime.ShapeTuple):
        return value
    if isinstance(value, (tuple, list)):
        return [_vm_arg(v) for v in value]
    return value


def _flatten(result: Any) -> list[Any]:
    """Outputs as a flat list: tensors as numpy arrays, nested tuples unrolled."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    if isinstance(result, tvm.runtime.ShapeTuple):
        return [tuple(int(d) for d in result)]
    if isinstance(result, (bool, int, float, str)):
        return [result]
    try:
        items = list(result)
    except TypeError:
        return [result]
    return [leaf for item in items for leaf in _flatten(item)]


def run(
    program: relax.Function | tvm.IRModule,
    inputs: Sequence[Any] | None = None,
    *,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    dma: bool | None = None,
    entry: str | None = None,
) -> list[Any]:
    """Build ``program`` for ``llvm`` and run its ``main`` on the VM.

    Local functions are lambda-lifted first, and a module with an ``If`` is
    built without ``StaticPlanBlockMemory`` (apache/tvm#17348).

    Parameters
    ----------
    program : Union[relax.Function, tvm.IRModule]
        A function, or a module with a ``main``.
    inputs : sequence, optional
        One value per parameter; by default :func:`random_inputs` with
        ``seed`` and ``sizes``.
    seed : int
        Seed of the default inputs.
    sizes : Mapping[str, int], optional
        Symbolic shape sizes of the default inputs.
    dma : bool, optional
        Run under :func:`rewrite_ext.hexagon.cpu_dma`; by default when the
        program calls a ``vm.builtin.hexagon.*`` builtin.  A program that
        allocates ``global.vtcm`` storage runs under
        :func:`rewrite_ext.hexagon.cpu_vtcm`.  A stand-in the caller entered
        already is used as it is.
    entry : str, optional
        The function to run, as for :func:`random_inputs`.

    Returns
    -------
    outputs : list
        The outputs, flattened: numpy arrays for tensors, a tuple of ints for a
        shape, Python scalars for ``R.Prim``; a tuple result gives one entry per
        field, nested tuples unrolled in order.

    Raises
    ------
    RunError
        Building or running failed; TVM's error is the cause, and the message
        names the step and, for a known pitfall (a tensor at a non-zero byte
        offset), what to do.  A ``DMAError`` of the stand-in is raised as is.
    """
    mod = _as_module(program)
    vm_name, _ = entry_function(mod, entry)
    if inputs is None:
        inputs = random_inputs(mod, seed, sizes=sizes, entry=entry)
    from ..hexagon.cpu_dma import CPUDMA, DMAError, calls_dma, cpu_dma
    from ..hexagon.vtcm import CPUVTCM, allocates_vtcm, cpu_vtcm

    try:
        executable = _build(mod)
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        raise _run_error("relax.build(target='llvm')", exc) from exc
    if dma is None:
        dma = calls_dma(mod)
    with contextlib.ExitStack() as stands_in:
        # The stand-ins do not nest: one the caller entered already serves.
        if dma and CPUDMA.active() is None:
            stands_in.enter_context(cpu_dma())
        if CPUVTCM.active() is None and allocates_vtcm(mod):
            stands_in.enter_context(cpu_vtcm())
        try:
            # Made inside cpu_dma(): the VM binds the builtins when it is constructed.
            vm = relax.VirtualMachine(executable, tvm.cpu())
            return _flatten(vm[vm_name](*[_vm_arg(x) for x in inputs]))
        except DMAError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _run_error(f"running {vm_name} on the VM", exc) from exc


# ---------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------

# Default tolerances per float dtype: (rtol, atol).  A rewrite may reorder float arithmetic
# (a split matmul sums in another order), so equal values are equal up to rounding.
_TOLERANCE = {"float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float32": (1e-5, 1e-5), "float64": (1e-10, 1e-12)}


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        body = np.array2string(value, threshold=20, edgeitems=2, max_line_width=100)
        return f"{value.dtype}{list(value.shape)} = {body}"
    return repr(value)


def _first_difference(before: Any, after: Any, rtol: float | None, atol: float | None) -> str | None:
    """A sentence on how ``after`` differs from ``before``, or None when they agree."""
    if isinstance(before, np.ndarray) != isinstance(after, np.ndarray):
        return f"before {_describe(before)}, after {_describe(after)}"
    if not isinstance(before, np.ndarray):
        same = before == after or (isinstance(before, float) and np.isnan(before) and np.isnan(after))
        return None if same else f"before {before!r}, after {after!r}"
    if before.dtype != after.dtype or before.shape != after.shape:
        return f"before {before.dtype}{list(before.shape)}, after {after.dtype}{list(after.shape)}"
    if before.dtype.kind == "f":
        default = _TOLERANCE.get(str(before.dtype), (1e-5, 1e-5))
        r, a = default[0] if rtol is None else rtol, default[1] if atol is None else atol
        close = np.isclose(after, before, rtol=r, atol=a, equal_nan=True)
        tolerance = f" (rtol={r}, atol={a})"
    else:
        close = before == after
        tolerance = ""
    if bool(np.all(close)):
        return None
    bad = np.argwhere(~close)
    where = tuple(int(i) for i in bad[0])
    return (
        f"at index {where}: before {before[where].item()!r}, after {after[where].item()!r}{tolerance}; "
        f"{len(bad)} of {before.size} elements differ"
    )


def _sizes_of(params: Sequence[relax.Var], inputs: Sequence[Any]) -> dict[str, int]:
    """The sizes the inputs give the symbolic dims of the parameters' shapes."""
    sizes: dict[str, int] = {}
    for param, value in zip(params, inputs):
        type_ = ty(param)
        if isinstance(type_, TensorType) and type_.shape is not None and isinstance(value, np.ndarray):
            for dim, size in zip(type_.shape.values, value.shape):
                if isinstance(dim, tvm.tirx.Var):
                    sizes.setdefault(str(dim.name), int(size))
    return sizes


def assert_same_results(
    before: relax.Function | tvm.IRModule,
    after: relax.Function | tvm.IRModule,
    *,
    inputs: Sequence[Any] | None = None,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    entry: str | None = None,
) -> Comparison:
    """Run two programs on the same inputs and assert every output agrees.

    Both are built for ``llvm`` and run on the VM (:func:`run`: under
    ``cpu_dma()`` when a program calls the Hexagon DMA builtins).  Outputs are
    compared in order, tuples flattened: the same dtype and shape, integers
    and bools exactly, floats up to ``rtol``/``atol`` with NaN equal to NaN.

    Parameters
    ----------
    before, after : Union[relax.Function, tvm.IRModule]
        The programs (a module runs its ``main``); their ``main`` takes the same
        parameters.
    inputs : sequence, optional
        One value per parameter; by default :func:`random_inputs` of ``before``
        with ``seed`` and ``sizes``.
    seed : int
        Seed of the default inputs.
    sizes : Mapping[str, int], optional
        Values of symbolic shape variables for the default inputs.
    rtol, atol : float, optional
        Float tolerances; by default per dtype (``float32``: 1e-5 and 1e-5,
        ``float16``: 1e-2 and 1e-2).
    entry : str, optional
        The function of both to run, as for :func:`random_inputs`.

    Returns
    -------
    comparison : Comparison
        The inputs and both programs' outputs.

    Raises
    ------
    ResultMismatch
        An ``AssertionError`` naming the first output that differs, where
        and by how much, and showing the inputs; also when ``after`` fails
        to build or run (``cpu_dma()`` included) where ``before`` runs.
    RunError
        ``before`` itself fails to build or run.
    """
    given = inputs is not None
    if inputs is None:
        inputs = random_inputs(before, seed, sizes=sizes, entry=entry)
    inputs = list(inputs)
    from ..hexagon.cpu_dma import DMAError

    try:
        got_before = run(before, inputs, entry=entry)
    except (RunError, DMAError) as exc:
        raise RunError(f"assert_same_results: the first program (before) does not run: {exc}") from exc
    problem = None
    try:
        got_after = run(after, inputs, entry=entry)
    except (RunError, DMAError) as exc:
        # the first one ran: whatever broke the second broke the program
        problem = f"the second program (after) does not run, the first does: {exc}"
    else:
        if len(got_before) != len(got_after):
            problem = f"before has {len(got_before)} output(s), after {len(got_after)}"
        else:
            for index, (b, a) in enumerate(zip(got_before, got_after)):
                difference = _first_difference(b, a, rtol, atol)
                if difference is not None:
                    problem = f"output {index} differs {difference}"
                    break
    if problem is not None:
        params = entry_function(_as_module(before), entry)[1].params
        shown = "\n".join(f"  {_ir.shown_name(p)}: {_describe(value)}" for p, value in zip(params, inputs))
        origin = "given" if given else f"random_inputs, seed {seed}"
        sizes_seen = _sizes_of(params, inputs)
        if sizes_seen:
            origin += ", " + ", ".join(f"{name}={size}" for name, size in sizes_seen.items())
        raise ResultMismatch(f"assert_same_results: {problem}\ninputs ({origin}):\n{shown}")
    return Comparison(inputs, got_before, got_after)
