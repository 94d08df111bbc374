"""Checking that a rewrite left a function well formed, without re-walking all of it.

``relax.analysis.well_formed`` walks a whole function; on a function of
100k bindings that walk costs more than the rewrite.  When the driver
rebuilt a top-level function itself (flat functions, see ``rewrite.py``)
it already knows which bindings are new and has checked, binding by
binding, the rules that depend on where a binding stands: each var a new
binding reads is defined before it (a DataflowVar in the same block), and
each var it defines is defined nowhere else.  What is left are the rules
about the new bindings themselves (normal form, types that can be
inferred and agree with their annotation, purity, DataflowVars only in
DataflowBlocks, symbolic vars in scope, ...).  Those are checked by
TVM's own ``well_formed`` on a *probe*: a function with the same
parameters, purity and attributes whose blocks hold only the new
bindings, each var they read from the rest of the function defined by a
``match_cast`` of one opaque parameter.

The new bindings are split into probes of about ``PROBE_BINDINGS``
bindings each: ``well_formed``'s cost per binding grows with the size of
the function it walks (on this project's benchmark, one probe of 20k
bindings cost 1.3x as much per binding as twenty of 1k), so small probes
keep the check linear in the number of new bindings.  A var one probe
reads from another is a stub there like any other.

The probe can only be stricter than the real function (a symbolic var
defined by an earlier ``match_cast`` of the original is unknown to it), so
a probe that fails is not an error by itself: the caller then runs the
full check, whose verdict stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tvm import relax

from . import _ir


PROBE_BINDINGS = 1000
"""Bindings (new ones and stubs) after which the driver starts a new probe."""


@dataclass
class NewBindings:
    """The bindings one rewriting pass put into one top-level block of a function."""

    is_dataflow: bool
    bindings: list[relax.Binding] = field(default_factory=list)
    reads: list[relax.Var] = field(default_factory=list)
    """Vars these bindings read that neither the parameters nor earlier new bindings define."""


def probe_is_well_formed(func: relax.Function, blocks: Sequence[NewBindings]) -> bool:
    """Whether the new bindings of ``func`` pass ``relax.analysis.well_formed`` on their own.

    Parameters
    ----------
    func : relax.Function
        The rewritten function (its parameters, purity and attributes are used).
    blocks : Sequence[NewBindings]
        The new bindings of each top-level block that has any, in order, with
        the vars they read from the rest of the function.

    Returns
    -------
    ok : bool
        True when the probe is well formed; False when it is not, and only
        the full check can tell.
    """
    stub = relax.Var("rewrite_ext_stub", relax.ObjectType())
    probe_blocks = []
    for block in blocks:
        stubs: list[relax.Binding] = [relax.MatchCast(var, stub, var.ty) for var in block.reads]
        make = relax.DataflowBlock if block.is_dataflow else relax.BindingBlock
        probe_blocks.append(make(stubs + block.bindings))
    body = relax.SeqExpr(probe_blocks, stub)
    _ir.set_type(body, stub.ty)
    probe = relax.Function([*func.params, stub], body, stub.ty, func.is_pure, func.attrs)
    try:
        relax.analysis.well_formed(probe)
    except Exception:  # noqa: BLE001 - any failure sends the caller to the full check
        return False
    return True
