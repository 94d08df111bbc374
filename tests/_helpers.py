"""Shared by the property tests: reading bindings, TVM's cleanups, running on the VM."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from rewrite_ext import _ir
from rewrite_ext.hexagon import cpu_dma
from rewrite_ext.compat import TYPES, dtype_name, ty

def spelled_as_026(text: str) -> str:
    """Printed IR as TVM 0.26+ prints it, whichever TVM printed it.

    The docs and tests show 0.26+'s printing; TVM 0.25 prints ``sinfo_args=``,
    ``out_sinfo=``, ``R.Object`` and ``R.prim_value(0)`` for its ``ty_args=``,
    ``out_ty=``, ``R.Any`` and ``0``.
    """
    if TYPES:
        return text
    for old, new in (("sinfo_args=", "ty_args="), ("out_sinfo=", "out_ty="), ("R.Object", "R.Any")):
        text = text.replace(old, new)
    return re.sub(r"R\.prim_value\((-?\d+)\)", r"\1", text)


_TO_025 = (
    ("ty_args=", "sinfo_args="),
    ("out_ty=", "out_sinfo="),
    ("relax.TensorType(", "relax.TensorStructInfo("),
    ("relax.TupleType(", "relax.TupleStructInfo("),
    ("relax.ShapeType(", "relax.ShapeStructInfo("),
    ("relax.AnyType(", "relax.ObjectStructInfo("),
    ("tvm.ir.PrimType(", "relax.PrimStructInfo("),
    (".ty_args", ".sinfo_args"),
    (".ret_ty", ".ret_struct_info"),
    (".has_ty(", ".has_struct_info("),
    (".var.name ", ".var.name_hint "),
)


def for_this_tvm(code: str) -> str:
    """Python written for TVM 0.26+ (as the docs are), in the installed TVM's spelling.

    On 0.25 this is the translation docs/tvm-versions.md tabulates, so the docs'
    examples are checked on 0.25 as a 0.25 user would write them.
    """
    if TYPES:
        return code
    for new, old in _TO_025:
        code = code.replace(new, old)
    return re.sub(r"\.ty\b(?!_)", ".struct_info", code)


# ---------------------------------------------------------------------------------------------
# Reading IR
# ---------------------------------------------------------------------------------------------


def all_bindings(func: relax.Function) -> list[relax.Binding]:
    """Every binding at any depth: top-level blocks, If branches, nested local functions."""
    return _ir.all_bindings(func)


def op_name(expr: relax.Expr) -> str | None:
    """``"add"`` for ``R.add(...)``, the builtin's name for ``call_builtin_with_ctx``, else None."""
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name = str(expr.op.name)
    if name == "relax.call_builtin_with_ctx":
        return str(expr.args[0].global_symbol)
    return name.removeprefix("relax.")


def binding_kinds(func: relax.Function) -> Counter:
    """How many bindings of each kind: op names, or the expression's class (If, Tuple, ...)."""
    kinds: Counter = Counter()
    for binding in all_bindings(func):
        kinds[op_name(binding.value) or type(binding.value).__name__] += 1
    return kinds


def dtype_of(expr: relax.Expr) -> str:
    return dtype_name(ty(expr))


def shape_of(expr: relax.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in ty(expr).shape.values)


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def equal(a, b) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


@dataclass(frozen=True)
class Snapshot:
    """What an object looked like: its structural hash and printed text.

    (``tvm.ir.save_json`` crashes on Relax functions in TVM 0.27, so no deep copy.)
    """

    hash: int
    text: str

    @classmethod
    def of(cls, obj) -> Snapshot:
        return cls(tvm_ffi.structural_hash(obj), obj.script(show_meta=False))

    def assert_unchanged(self, obj) -> None:
        assert tvm_ffi.structural_hash(obj) == self.hash and obj.script(show_meta=False) == self.text, (
            "the input changed"
        )


# ---------------------------------------------------------------------------------------------
# TVM's rewrite_call and what it runs after every round
# ---------------------------------------------------------------------------------------------


def tvm_cleanups(func: relax.Function) -> relax.Function:
    """CanonicalizeBindings, EliminateCommonSubexpr and remove_all_unused, repeated until they
    change nothing, as TVM's rewrite_call runs them (one round can leave a trivial binding that
    the next canonicalizes)."""
    while True:
        mod = tvm.IRModule({"f": func})
        mod = relax.transform.CanonicalizeBindings()(mod)
        mod = relax.transform.EliminateCommonSubexpr()(mod)
        cleaned = relax.analysis.remove_all_unused(mod["f"])
        if tvm_ffi.structural_equal(cleaned, func):
            return cleaned
        func = cleaned


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def random_inputs(func: relax.Function, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = []
    for param in func.params:
        shape, dtype = shape_of(param), dtype_of(param)
        if is_float(dtype):
            inputs.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            inputs.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            inputs.append(rng.integers(-100, 100, size=shape).astype(dtype))
    return inputs


def _numpy(result) -> list[np.ndarray]:
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [r.numpy() for r in result]


@tvm.instrument.pass_instrument
class _Skip:
    """Skips the pass named ``skip`` (a PassContext instrument)."""

    def __init__(self, skip: str) -> None:
        self.skip = skip

    def should_run(self, _mod, info) -> bool:
        return info.name != self.skip


def has_if(func: relax.Function) -> bool:
    return any(isinstance(b.value, relax.If) for b in all_bindings(func))


def run_together(functions: dict[str, relax.Function], inputs: list[np.ndarray], *, dma=False):
    """Build the functions into one module (one ``relax.build``) and run each on ``inputs``.

    Each keeps its name as its ``global_symbol``; local functions are lambda-lifted.
    A module with an ``If`` is built without ``StaticPlanBlockMemory``: in TVM 0.27 that pass
    puts the ``alloc_storage`` shared by both branches in the then-branch only, so taking the
    else-branch segfaults in ``StorageObj::AllocTensor`` (apache/tvm#17348; any If whose
    branches each compute an intermediate tensor; TVM's own bug, with or without a rewrite).
    With ``dma=True`` the VM is made and run inside ``cpu_dma()``, returned last.
    """
    lifted = {}
    for name, func in functions.items():
        # One LambdaLift per function: lifting two functions that share a local function
        # (an unchanged one, as both rewrites keep it) fails on a duplicate GlobalVar.
        one = relax.transform.LambdaLift()(tvm.IRModule({name: func.with_attr("global_symbol", name)}))
        lifted.update(one.functions_items())
    mod = tvm.IRModule(lifted)
    instruments = [_Skip("StaticPlanBlockMemory")] if any(has_if(f) for f in functions.values()) else []
    with tvm.transform.PassContext(opt_level=3, instruments=instruments):
        executable = relax.build(mod, target="llvm")
    args = [tvm.runtime.tensor(x) for x in inputs]
    if not dma:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return {name: _numpy(vm[name](*args)) for name in functions}
    with cpu_dma() as engine:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        results = {name: _numpy(vm[name](*args)) for name in functions}
    return results, engine


def assert_same_results(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, equal_nan=True)
