"""Running an IRModule's entry function on the CPU on random inputs, and comparing outputs.

What the CLI's ``--run`` and ``rewrite_ext.testing`` need: the function to run
(``main``, else the module's only public Relax function), inputs for every
parameter it can take
(tensors, shapes, prim values, tuples of them; symbolic dims bound to values),
a build and a run on ``relax.VirtualMachine``, and a comparison of two runs'
outputs in which NaN equals NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from . import _ir
from .compat import PrimType, ShapeType, TensorType, TupleType, dtype_name, ty

__all__ = ["Inputs", "InputError", "Outputs", "compare_outputs", "entry_function", "make_inputs", "run_main"]

#: The value a symbolic dim or prim parameter gets unless ``--bind NAME=VALUE`` says otherwise.
DEFAULT_SYMBOLIC_VALUE = 8


class InputError(Exception):
    """The function takes a parameter for which no input can be made; the message is one line."""


def entry_function(
    mod: tvm.IRModule, entry: str | None = None, choose: str = "pass entry='name' to choose"
) -> tuple[str, relax.Function]:
    """The function to run: its name on the VM (its ``global_symbol``) and the function.

    ``entry`` None: ``main``, else the module's only public Relax function
    (``nn.Module.export_tvm`` names it ``forward``).  ``choose``: how the
    caller names a function, for the ValueError raised when there is none.
    """
    functions = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    public = sorted(name for name, f in functions.items() if _ir.function_name(f, None) is not None)
    if entry is None:
        if "main" in functions:
            entry = "main"
        elif len(public) == 1:
            entry = public[0]
        else:
            found = f"public Relax functions {', '.join(public)}" if public else (
                f"no public Relax function (Relax functions: {', '.join(sorted(functions)) or 'none'})"
            )
            raise ValueError(f"the module has no function 'main' and {found}; {choose}")
    elif entry not in functions:
        raise ValueError(
            f"the module has no Relax function '{entry}' to run "
            f"(it has {', '.join(sorted(functions)) or 'none'})"
        )
    func = functions[entry]
    # relax.build names a public function by its global_symbol, which IRModule({"main": f})
    # leaves as f's own name.
    return _ir.function_name(func, None) or entry, func


@dataclass
class Inputs:
    """Random inputs of a function, and the values its symbolic vars were given."""

    values: list[Any]
    """One argument per parameter: ``tvm.runtime.Tensor``, ``tvm_ffi.Shape``, int, float,
    bool, or a list of those for a tuple parameter."""
    bound: dict[str, int] = field(default_factory=dict)
    """Symbolic var name to the value chosen, for those the function's parameters use."""




def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # TVM's own dependency: bfloat16, float8_*

        if hasattr(ml_dtypes, name):
            return np.dtype(getattr(ml_dtypes, name))
        raise


_ARITHMETIC = {
    tvm.tirx.Add: lambda a, b: a + b,
    tvm.tirx.Sub: lambda a, b: a - b,
    tvm.tirx.Mul: lambda a, b: a * b,
    tvm.tirx.FloorDiv: lambda a, b: a // b,
    tvm.tirx.FloorMod: lambda a, b: a % b,
    tvm.tirx.Div: lambda a, b: int(a / b),
    tvm.tirx.Min: min,
    tvm.tirx.Max: max,
}
_DIVISIONS = {_ARITHMETIC[tvm.tirx.FloorDiv], _ARITHMETIC[tvm.tirx.FloorMod], _ARITHMETIC[tvm.tirx.Div]}


class _InputMaker:
    def __init__(self, bindings: Mapping[str, int], rng: np.random.Generator) -> None:
        self.bindings = dict(bindings)
        self.rng = rng
        self.bound: dict[str, int] = {}

    def value_of(self, expr: tvm.ir.PrimExpr, where: str) -> int:
        """A concrete value of a dim or prim value: symbolic vars get --bind's value or the default."""
        value = self._evaluate(expr)
        if value is None:
            raise InputError(f"{where}: cannot compute {expr} for an input")
        return value

    def _evaluate(self, expr: tvm.ir.PrimExpr) -> int | None:
        if isinstance(expr, tvm.tirx.IntImm):
            return int(expr.value)
        if isinstance(expr, tvm.tirx.Var):
            value = self.bindings.get(expr.name, DEFAULT_SYMBOLIC_VALUE)
            self.bound[expr.name] = value
            return value
        if isinstance(expr, tvm.tirx.Cast):
            return self._evaluate(expr.value)
        operation = _ARITHMETIC.get(type(expr))
        if operation is None:
            return None
        a, b = self._evaluate(expr.a), self._evaluate(expr.b)
        if a is None or b is None or (b == 0 and operation in _DIVISIONS):
            return None
        return operation(a, b)

    def dims(self, values: Any, ty: Any, where: str) -> list[int]:
        """The concrete dims of a tensor's or shape's ``values``, each at least 0."""
        dims = [self.value_of(v, where) for v in values]
        if any(dim < 0 for dim in dims):
            raise InputError(f"{where} is {ty}: its dims come out as {dims}, and a dim must be at least 0")
        return dims

    def make(self, ty: Any, where: str) -> Any:
        if isinstance(ty, TensorType):
            return self.tensor(ty, where)
        if isinstance(ty, ShapeType):
            if ty.values is None:
                raise InputError(f"{where} is {ty} with unknown dims: --run cannot make a shape for it")
            return tvm_ffi.Shape(self.dims(ty.values, ty, where))
        if isinstance(ty, PrimType):
            return self.prim(dtype_name(ty), where)
        if isinstance(ty, TupleType):
            return [self.make(field_ty, f"{where}[{i}]") for i, field_ty in enumerate(ty.fields)]
        raise InputError(
            f"{where} is {ty}: --run makes random inputs only for tensors, shapes, prim values"
            " and tuples of them"
        )

    def prim(self, dtype: str, where: str) -> int | float | bool:
        if dtype == "bool":
            return bool(self.rng.integers(0, 2))
        if dtype.startswith(("int", "uint")):
            return int(self.rng.integers(1, 16))
        if dtype.startswith(("float", "bfloat")):
            return float(self.rng.standard_normal())
        raise InputError(f"{where} is a prim value of dtype {dtype}: --run cannot make one")

    def tensor(self, ty: TensorType, where: str) -> tvm.runtime.Tensor:
        if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
            raise InputError(f"{where} is {ty} with unknown shape: --run needs its dims (static or symbolic)")
        shape = self.dims(ty.shape.values, ty, where)
        dtype = dtype_name(ty)
        try:
            np_dtype = _numpy_dtype(dtype)
        except TypeError:
            raise InputError(f"{where} has dtype {dtype!r}, for which --run cannot make data") from None
        if np_dtype == np.bool_:
            data = self.rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(np_dtype, np.unsignedinteger):
            data = self.rng.integers(0, 100, size=shape).astype(np_dtype)
        elif np.issubdtype(np_dtype, np.integer):
            data = self.rng.integers(-100, 100, size=shape).astype(np_dtype)
        else:
            data = self.rng.standard_normal(shape).astype(np_dtype)
        return tvm.runtime.tensor(data)


def make_inputs(func: relax.Function, bindings: Mapping[str, int], seed: int = 0, name: str = "main") -> Inputs:
    """Random inputs for every parameter of ``func``.

    Parameters
    ----------
    func : relax.Function
        The function to call.
    bindings : Mapping[str, int]
        Values for symbolic vars by name; others get ``DEFAULT_SYMBOLIC_VALUE``.
    seed : int
        The seed of the random data.
    name : str
        The function's name, for messages.

    Raises
    ------
    InputError
        A parameter no input can be made for (``R.Object``, a callable, a tensor of
        unknown rank), naming it.
    """
    maker = _InputMaker(bindings, np.random.default_rng(seed))
    values = [maker.make(ty(param), f"{name}'s parameter '{_ir.shown_name(param)}'") for param in func.params]
    unknown = sorted(set(bindings) - set(maker.bound))
    if unknown:
        names = ", ".join(sorted(maker.bound)) or "none"
        raise InputError(
            f"--bind {', '.join(unknown)}: {name}'s parameters have no symbolic var of that name "
            f"(theirs: {names}; names are case-sensitive)"
        )
    return Inputs(values, maker.bound)


def _to_ffi(value: Any) -> Any:
    if isinstance(value, list):
        return [_to_ffi(item) for item in value]
    return value


def run_main(mod: tvm.IRModule, inputs: Inputs, entry: str = "main") -> list[tuple[str, Any]]:
    """Build ``mod`` for the CPU and run its function ``entry`` (a name on the VM) on ``inputs``.

    Returns
    -------
    leaves : list[tuple[str, Any]]
        The output's leaves with their place (``output``, ``output[1][0]``): numpy arrays
        for tensors (so the VM may go), tuples of ints for shapes, Python scalars; a tuple
        is itself a leaf ``("tuple", length)`` so that structure counts in a comparison.
    """
    executable = relax.build(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return _flatten(vm[entry](*[_to_ffi(value) for value in inputs.values]), "output")


def _flatten(value: Any, place: str) -> list[tuple[str, Any]]:
    if isinstance(value, tvm.runtime.Tensor):
        return [(place, value.numpy())]
    if isinstance(value, tvm_ffi.Shape):
        return [(place, tuple(int(dim) for dim in value))]
    if isinstance(value, tvm_ffi.Array | list | tuple):
        leaves: list[tuple[str, Any]] = [(place, ("tuple", len(value)))]
        for index, item in enumerate(value):
            leaves.extend(_flatten(item, f"{place}[{index}]"))
        return leaves
    return [(place, value)]


@dataclass
class Outputs:
    """The verdict of comparing two runs' outputs."""

    equal: bool
    """Same structure, shapes, dtypes and values (NaN equal to NaN)."""
    difference: str = ""
    """Where they first differ, in one line; empty when equal."""


def _leaf_difference(place: str, expected: Any, got: Any) -> str:
    if isinstance(expected, np.ndarray) and isinstance(got, np.ndarray):
        if expected.shape != got.shape or expected.dtype != got.dtype:
            return f"{place} is {got.dtype}{list(got.shape)}, expected {expected.dtype}{list(expected.shape)}"
        floating = np.issubdtype(expected.dtype, np.inexact)
        if np.array_equal(expected, got, equal_nan=floating):
            return ""
        unequal = expected != got
        if floating:
            unequal &= ~(np.isnan(expected) & np.isnan(got))
        first = tuple(int(i) for i in np.argwhere(unequal)[0])
        return (
            f"{place}: {int(unequal.sum())} of {expected.size} elements differ,"
            f" first at {first}: {got[first]!r}, expected {expected[first]!r}"
        )
    if type(expected) is not type(got):
        return f"{place} is a {type(got).__name__}, expected a {type(expected).__name__}"
    same = expected == got or (isinstance(expected, float) and np.isnan(expected) and np.isnan(got))
    return "" if same else f"{place} is {got!r}, expected {expected!r}"


def compare_outputs(expected: list[tuple[str, Any]], got: list[tuple[str, Any]]) -> Outputs:
    """Compare two outputs of :func:`run_main`; NaN equals NaN."""
    for (place, left), (_, right) in zip(expected, got, strict=False):
        difference = _leaf_difference(place, left, right)
        if difference:
            return Outputs(False, difference)
    if len(expected) != len(got):  # pragma: no cover - a tuple leaf differs first
        return Outputs(False, f"{len(got)} output leaves, expected {len(expected)}")
    return Outputs(True)
