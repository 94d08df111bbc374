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
reads from another is a stub there like any other.  The driver checks
each probe as soon as it is full when the pass is likely the only one,
while the probe's bindings are still in the CPU's caches.

The probe can only be stricter than the real function (a symbolic var
defined by an earlier ``match_cast`` of the original is unknown to it), so
a probe that fails is not an error by itself: the caller then runs the
full check, whose verdict stands.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from tvm import relax

from . import _ir


PROBE_BINDINGS = 256
"""Bindings (new ones and stubs) after which the driver starts a new probe."""


class InputDefinitions:
    """Where each var of a flat function is bound, indexed on first use.

    The driver needs it only when a new binding reads a var that neither
    the match, the parameters nor an earlier new binding accounts for, or
    defines a var that might exist already; most rewrites never ask, and
    then no pass pays for a map of every binding of a big function (on
    this project's benchmark that map cost 5% of the instructions and 15%
    of the cache misses at 100k bindings).

    Parameters
    ----------
    func : relax.Function
        The function as it was before the pass; it must outlive this index,
        which is keyed by ``hash(var)`` (the object's address) so that a big
        index holds no Python wrapper objects for the cyclic GC to rescan.
    """

    def __init__(self, func: relax.Function):
        self._func = func
        self._where: dict[int, int] | None = None
        self._block_starts: list[int] = []
        self.defined_twice = False
        """Whether some var is bound more than once (known once the index is built)."""

    def position(self, var: relax.Var) -> int | None:
        """The var's binding, numbered over all top-level blocks in order; None if unbound."""
        if self._where is None:
            self._build()
        return self._where.get(hash(var))

    def block_of(self, position: int) -> int:
        """The top-level block holding the binding at ``position``."""
        return bisect_right(self._block_starts, position) - 1

    def _build(self) -> None:
        where: dict[int, int] = {}
        position = 0
        for block in self._func.body.blocks:
            self._block_starts.append(position)
            for binding in _ir.bindings_of(block):
                key = hash(binding.var)
                if key in where:
                    self.defined_twice = True
                where[key] = position
                position += 1
        self._where = where


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
