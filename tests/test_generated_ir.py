"""rewrite_call and the DMA rewrite over generated IR that looks like users': results checked on the VM.

The inputs come from the strategies users get (rewrite_ext.testing.strategies): modules of
several functions calling each other through GlobalVars, symbolic shapes bound by
``match_cast``, plain and dataflow blocks mixed, nested ``If``, local functions, ``call_tir``
into PrimFuncs (``relax_modules``), TVM's own VM-level lowering of them
(``lowered_functions``), and memory-planned copies (``lowered_copy_functions``).

1. Semantics-preserving rewriters (an identity each: ``x - y -> x + (-y)``, ``-x -> 0 - x``, a
   matmul split into column halves, softmax spelled out) pass ``check_rewrite``: structurally,
   and, built and run on the VM, the output computes what the input computes.
2. ``CopyToDMA`` passes ``check_pass`` on lowered modules (``lowered_copy_functions``, and
   TVM-lowered ones with PrimFunc outputs staged through copies): under ``cpu_dma()`` the
   rewritten module computes what the copies computed; TVM-lowered modules without copies come
   back unchanged. ``stage_in_vtcm`` then ``copy_to_dma`` on TVM-lowered modules does too.
3. Modules with ``R.Prim``, ``R.Shape``, ``R.Object`` and tuple parameters (every one crashed the
   core before its rebuild, issue 16).

Example counts follow the loaded profile (tests/conftest.py), as in tests/test_properties.py:
four times the profile's examples for rewriting only, half of them for building and running.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import tvm
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import relax as R

from _helpers import Snapshot, binding_kinds, op_name
from rewrite_ext import rewrite_call
from rewrite_ext.hexagon import DMA_COPY, DMA_WAIT, CopyToDMA, VTCMCapacityWarning, copy_to_dma, plan_vtcm, stage_in_vtcm
from rewrite_ext.testing import check_pass, check_rewrite
from rewrite_ext.testing.strategies import (
    lowered_copy_functions,
    lowered_functions,
    relax_functions,
    relax_modules,
)
from rewrite_ext.compat import ty

PROFILE_EXAMPLES = settings().max_examples
MORE_EXAMPLES = settings(max_examples=4 * PROFILE_EXAMPLES)
VM_EXAMPLES = settings(max_examples=max(3, PROFILE_EXAMPLES // 2))


# ---------------------------------------------------------------------------------------------
# Identities: rewriters that change the program, not what it computes
# ---------------------------------------------------------------------------------------------

X, Y = wildcard(), wildcard()


def _subtract(orig, m, builder):
    return relax.op.add(m[X], builder.emit(relax.op.negative(m[Y])))


def _negative(orig, m, builder):
    return relax.op.subtract(builder.emit(relax.op.zeros_like(m[X])), m[X])


def _matmul_halves(orig, m, builder):
    w = m[Y]
    cols = ty(w).shape.values[-1] if ty(w).ndim == 2 and ty(w).shape is not None else None
    if not isinstance(cols, tvm.tirx.IntImm) or cols.value < 2:
        return None  # declined: nothing to split
    parts = builder.emit(relax.op.split(w, [cols.value // 2], axis=1))
    left = builder.emit(relax.op.matmul(m[X], builder.emit(relax.TupleGetItem(parts, 0))))
    right = builder.emit(relax.op.matmul(m[X], builder.emit(relax.TupleGetItem(parts, 1))))
    return relax.op.concat([left, right], axis=-1)


def _softmax(orig, m, builder):
    axis = int(orig.attrs.axis)
    x = m[X]
    shifted = builder.emit(relax.op.subtract(x, builder.emit(relax.op.max(x, axis=[axis], keepdims=True))))
    e = builder.emit(relax.op.exp(shifted))
    return relax.op.divide(e, builder.emit(relax.op.sum(e, axis=[axis], keepdims=True)))


@dataclass(frozen=True)
class Identity:
    """A rewriter of ``op`` that keeps what the program computes; ``declines``: it may decline."""

    op: str
    rewriter: Callable
    declines: bool = False

    @property
    def pattern(self):
        args = (X, Y) if self.op in ("subtract", "matmul") else (X,)
        name = f"relax.nn.{self.op}" if self.op == "softmax" else f"relax.{self.op}"
        return is_op(name)(*args)

    @property
    def kind(self) -> str:
        return f"nn.{self.op}" if self.op == "softmax" else self.op


IDENTITIES = (
    Identity("subtract", _subtract),
    Identity("negative", _negative),
    Identity("matmul", _matmul_halves, declines=True),
    Identity("softmax", _softmax),
)


@st.composite
def identities(draw, mod: tvm.IRModule) -> Identity:
    """An identity whose op the module binds (any, when it binds none of them)."""
    kinds = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            kinds |= set(binding_kinds(func))
    present = [i for i in IDENTITIES if i.kind in kinds]
    return draw(st.sampled_from(present or IDENTITIES))


def matches(mod: tvm.IRModule, identity: Identity) -> int:
    return sum(
        binding_kinds(f)[identity.kind] for _, f in mod.functions_items() if isinstance(f, relax.Function)
    )


# What the current core takes: every feature but R.Prim / R.Object parameters (see section 3).
MODULES = relax_modules(max_bindings=12, allow_other_params=False)


@MORE_EXAMPLES
@given(MODULES, st.data())
def test_identities_rewrite_every_match_of_generated_modules(mod, data):
    identity = data.draw(identities(mod), label="identity")
    before = Snapshot.of(mod)
    count = matches(mod, identity)
    event(f"{identity.op}: {min(count, 3)}{'+' if count >= 3 else ''} match(es)")
    report = check_rewrite(identity.pattern, identity.rewriter, mod, run=False)
    before.assert_unchanged(mod)
    relax.analysis.well_formed(report.output)
    if not identity.declines:
        assert report.rewrites == count
        assert sum(binding_kinds(f)[identity.kind] for _, f in report.output.functions_items()
                   if isinstance(f, relax.Function)) == 0  # fmt: skip
    # Every function is still there, PrimFuncs untouched.
    assert {gv.name_hint for gv in report.output.get_global_vars()} == {gv.name_hint for gv in mod.get_global_vars()}


@VM_EXAMPLES
@given(MODULES, st.data(), st.integers(0, 2**16))
def test_identities_compute_what_the_input_computed_on_the_vm(mod, data, seed):
    identity = data.draw(identities(mod), label="identity")
    report = check_rewrite(identity.pattern, identity.rewriter, mod, seed=seed)
    event("ran" if report.ran else "nothing rewritten")


@VM_EXAMPLES
@given(
    relax_functions(max_bindings=12, allow_symbolic=True, allow_mixed_blocks=True, allow_nested_if=True),
    st.data(),
    st.integers(0, 2**16),
)
def test_identities_on_single_functions_with_symbolic_shapes_and_nested_ifs(func, data, seed):
    identity = data.draw(identities(tvm.IRModule({"main": func})), label="identity")
    check_rewrite(identity.pattern, identity.rewriter, func, seed=seed)


@MORE_EXAMPLES
@given(lowered_functions(max_bindings=10, allow_other_params=False), st.data())
def test_identities_leave_tvm_lowered_modules_well_formed(mod, data):
    # TVM's VM-level code (alloc_storage, kill_object, PrimFunc calls, force_pure): the ops are
    # gone, so nothing matches, and rewriting must leave the module as it was.
    identity = data.draw(st.sampled_from(IDENTITIES), label="identity")
    report = check_rewrite(identity.pattern, identity.rewriter, mod, run=False)
    assert report.rewrites == 0
    tvm.ir.assert_structural_equal(report.output, mod)


# ---------------------------------------------------------------------------------------------
# 2. CopyToDMA
# ---------------------------------------------------------------------------------------------


@VM_EXAMPLES
@given(lowered_copy_functions(max_copies=8, legalize=False) | lowered_copy_functions(max_copies=8, legalize=True),
       st.integers(0, 2**16))  # fmt: skip
def test_copy_to_dma_passes_check_pass_under_cpu_dma(mod, seed):
    copies = binding_kinds(mod["main"])["vm.copy_tensor"]
    report = check_pass(CopyToDMA(), mod, seed=seed)
    assert report.changed and report.ran
    kinds = binding_kinds(report.output["main"])
    assert [kinds["vm.copy_tensor"], kinds[DMA_COPY], kinds[DMA_WAIT]] == [0, copies, copies]


@VM_EXAMPLES
@given(lowered_functions(copies=True, max_bindings=10, allow_other_params=False), st.integers(0, 2**16))
def test_copy_to_dma_on_tvm_lowered_modules_with_staged_copies(mod, seed):
    # TVM's own VM-level code (kill_object, PrimFunc calls writing into alloc_tensor, force_pure
    # functions), each PrimFunc output staged through a copy.
    copies = sum(binding_kinds(f)["vm.copy_tensor"] for _, f in mod.functions_items() if isinstance(f, relax.Function))
    event(f"copies: {min(copies, 3)}{'+' if copies >= 3 else ''}")
    report = check_pass(CopyToDMA(), mod, seed=seed)
    assert report.changed == (copies > 0) and report.ran == (copies > 0)
    kinds = binding_kinds(report.output["main"])
    assert kinds["vm.copy_tensor"] == 0 and kinds[DMA_COPY] == kinds[DMA_WAIT] == binding_kinds(mod["main"])["vm.copy_tensor"]


@VM_EXAMPLES
@given(
    lowered_functions(max_bindings=10, allow_other_params=False),
    st.sampled_from([0, 256, 4096, 1 << 22]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_staging_then_dma_on_tvm_lowered_modules_computes_what_they_compute(mod, capacity, overlap, seed):
    # The second reference rewrite on TVM's own lowering of generated programs: kernel inputs
    # staged into VTCM (all, some or none of them fitting), then DMA, run under the stand-ins.
    plan = plan_vtcm(mod, capacity=capacity)
    event(f"staged: {'some' if plan.staged else 'none'}, left in place: {'some' if plan.left_in_place else 'none'}")

    def stage_then_dma(m: tvm.IRModule) -> tvm.IRModule:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VTCMCapacityWarning)
            return copy_to_dma(stage_in_vtcm(m, capacity=capacity), overlap=overlap)

    report = check_pass(stage_then_dma, mod, seed=seed)
    assert report.changed == bool(plan.staged)
    kinds = binding_kinds(report.output["main"])
    staged = sum(t.function == "main" for t in plan.staged)
    assert kinds[DMA_COPY] == staged and (0 < kinds[DMA_WAIT] <= staged or staged == 0)  # waits may merge


@MORE_EXAMPLES
@given(lowered_functions(max_bindings=10, allow_other_params=False))
def test_copy_to_dma_leaves_tvm_lowered_modules_without_copies_unchanged(mod):
    report = check_pass(CopyToDMA(), mod)
    assert not report.changed and not report.ran
    assert not any(op_name(b.value) == DMA_COPY for _, f in report.output.functions_items()
                   if isinstance(f, relax.Function) for blk in f.body.blocks for b in blk.bindings)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# 3. Every kind of parameter
# ---------------------------------------------------------------------------------------------


@settings(max_examples=4 * PROFILE_EXAMPLES)
@given(relax_modules(max_bindings=12), st.data())
def test_identities_on_modules_with_prim_shape_object_and_tuple_parameters(mod, data):
    identity = data.draw(identities(mod), label="identity")
    check_rewrite(identity.pattern, identity.rewriter, mod, run=False)


@R.function
def with_prim(x: R.Tensor((1,), "float32"), p: R.Prim("int64")):
    y = R.subtract(x, x)
    return y


@R.function
def with_object(x: R.Tensor((1,), "float32"), o: R.Object):
    y = R.exp(x)  # nothing to rewrite: the parameter alone is enough
    return y


@pytest.mark.parametrize("func", [with_prim, with_object], ids=["R.Prim", "R.Object"])
def test_a_prim_or_object_parameter(func):
    out = rewrite_call(is_op("relax.subtract")(X, Y), lambda orig, m: None, func)
    assert out.same_as(func)
