"""``rewrite_call`` whose rewriter may emit bindings through a BlockBuilder.

The traversal is a ``PyExprMutator``: TVM's C++ mutator walks functions,
If branches and nested functions, and re-emits every binding block that
cannot match without calling back into Python.  A block that holds a
candidate binding is rebuilt here, binding by binding, through the same
``BlockBuilder`` (``self.builder_``) that emits the block, which is how
a rewriter's ``builder.emit(...)`` lands just before the rewritten binding.
TVM's pattern language does the matching itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern
from tvm.relax.dpl import pattern as P
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _ir, _patterns, _wellformed
from .errors import RewriteError

__all__ = ["rewrite_call", "RewriteCall", "Rewriter"]

Rewriter = Union[
    Callable[[relax.Expr, Mapping[DFPattern, relax.Expr]], Union[relax.Expr, None]],
    Callable[[relax.Expr, Mapping[DFPattern, relax.Expr], relax.BlockBuilder], Union[relax.Expr, None]],
]
"""A rewriter: ``(orig, matchings)`` or ``(orig, matchings, builder)`` to a new expression."""


def _structurally_equal(a: relax.Expr, b: relax.Expr) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


def _takes_builder(rewriter: Callable[..., Any]) -> bool:
    """Whether ``rewriter`` is the three-argument form, read from its signature once."""
    try:
        params = inspect.signature(rewriter).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: TVM's form
        return False
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    return len(positional) >= 3


@dataclass(frozen=True)
class _Rule:
    """A pattern, its rewriter and what is known of the pattern in advance."""

    pattern: DFPattern
    rewriter: Callable[..., Any]
    takes_builder: bool
    root_ops: frozenset | None
    needs_bindings: bool
    lookup_depth: int | None
    description: str
    alternatives: tuple[tuple[DFPattern, tuple[DFPattern, ...]], ...]
    """Each alternative of a top-level OrPattern, with the Or nodes that enclose it."""

    @classmethod
    def make(cls, pattern: DFPattern, rewriter: Callable[..., Any]) -> _Rule:
        if not isinstance(pattern, DFPattern):
            raise TypeError(f"pattern must be a relax.dpl.DFPattern, got {type(pattern).__name__}")
        if not callable(rewriter):
            raise TypeError(f"rewriter must be callable, got {type(rewriter).__name__}")
        return cls(
            pattern,
            rewriter,
            _takes_builder(rewriter),
            _patterns.root_ops(pattern),
            _patterns.needs_bindings(pattern),
            _patterns.lookup_depth(pattern),
            _patterns.describe(pattern),
            tuple(_patterns.alternatives(pattern)),
        )


@dataclass
class _PassResult:
    """What one rewriting pass over a function did."""

    func: relax.Function
    rewritten: int = 0
    """How many bindings had their value replaced by the rewriter."""
    first_rewritten: list[str] = field(default_factory=list)
    """The names of the first few of those bindings' vars, for messages."""
    interior: list[relax.Var] = field(default_factory=list)
    """Pure bindings seen through by a match, to drop if nothing reads them."""
    may_rematch: bool = True
    """False when nothing this pass produced can match, so no further pass can rewrite."""
    new_bindings: list[list[_wellformed.NewBindings]] | None = None
    """The bindings added, as probes (each per top-level block), when the local check can vouch."""


_NAMES_SHOWN = 10
"""Bindings a non-convergence message names."""


@dataclass
class _Scope:
    name: str
    is_pure: bool


_NESTED = (relax.If, relax.Function, relax.SeqExpr)
"""Values holding blocks of their own: only TVM's mutator walks into them."""

_OTHER, _CALL, _HAS_BLOCKS = 0, 1, 2
# isinstance against TVM's expression classes goes through ABCMeta (~0.5 us a check, several
# per binding); a binding's value is classified by its exact class, each class once.
_KINDS: dict[type, int] = {}


def _kind_of(cls: type) -> int:
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = (
            _HAS_BLOCKS if issubclass(cls, _NESTED) else _CALL if issubclass(cls, relax.Call) else _OTHER
        )
    return kind


@mutator
class _RewriteMutator(PyExprMutator):
    """One rewriting pass over one top-level function."""

    def __init__(
        self,
        rule: _Rule,
        func: relax.Function,
        name: str,
        mod: tvm.IRModule | None,
        check_locally: bool = True,
    ):
        super().__init__(mod)
        self.rule = rule
        self.top = func
        self.top_name = name
        self.scopes: list[_Scope] = []
        # >0 while re-emitting what a rewriter produced: that is not matched again this pass.
        self.suspended = 0
        self.result = _PassResult(func, may_rematch=rule.root_ops is None or rule.needs_bindings)
        self.error: BaseException | None = None
        self._used: set[relax.Var] | None = None
        # Set once a rewritten var was re-typed: from then on every binding must go through
        # the mutator, which substitutes the new var; before, a binding can be re-emitted as is.
        self.remapped = False
        # Only while rewrite_top drives a flat function, for the local well-formedness check
        # (check_locally: only the first pass, as a later one that rewrites voids it):
        # - block_index: the top-level block being rebuilt (-1: none, or inside a nested one);
        # - params, input_defs: where the vars of the input are defined (indexed on demand);
        #   new_defined: each var a new binding defines -> its top-level block;
        # - new_bindings: per top-level block, what the pass added to the current probe (None:
        #   the full check only); probes: the filled probes left for after the pass;
        # - probed: each var -> the last probe (numbered by probe_number) that defines it or
        #   stubs it (the parameters are in every probe); probe_size: the current probe's
        #   bindings.  One dict for the whole pass: a fresh set per probe would be resized
        #   past 1 KB several times per probe, and each such allocation makes glibc
        #   consolidate its free lists.
        # Vars are kept as hash(var), the object's address (unique while the IR holds it):
        # membership of a var object runs TVM's Python-level Expr.__eq__ on every hit.
        self.check_locally = check_locally
        self.block_index = -1
        self.params: set[int] = set()
        self.input_defs = _wellformed.InputDefinitions(func)
        self.new_defined: dict[int, int] = {}
        self.new_bindings: dict[int, _wellformed.NewBindings] | None = None
        self.probes: list[list[_wellformed.NewBindings]] = []
        self.probed: dict[int, int] = {}
        self.probe_number = 0
        self.probe_size = 0
        self.in_module = mod is not None

    # -- traversal -----------------------------------------------------------------

    def rewrite_top(self, func: relax.Function) -> relax.Function:
        """Rewrite the top-level function, driving its blocks from Python when it is flat.

        TVM's mutator ends every function by normalizing the whole rebuilt
        body again, a second walk over every binding.  A flat function (see
        ``_ir.is_flat``: its body ends in a leaf, its parameter shapes are
        plain) is put together here instead, from the blocks
        ``_rewrite_block`` returns; a binding holding an If or a local
        function still goes through the mutator.  Anything else is visited
        by the mutator whole.
        """
        if not _ir.is_flat(func):
            return self.visit_expr(func)
        builder = self.builder_
        self.scopes.append(_Scope(self.top_name, _ir.checks_purity(func)))
        self.params = {hash(param) for param in func.params}
        self.probes = []
        self._start_probe()
        if not self.check_locally:
            self.new_bindings = None
        builder.begin_scope(func.params)
        try:
            blocks = []
            for index, block in enumerate(func.body.blocks):
                self.block_index = index
                new_block = self._rewrite_block(block, isinstance(block, relax.DataflowBlock))
                if len(new_block.bindings):
                    blocks.append(new_block)
            self.block_index = -1
            old_body = func.body.body
            body = self.visit_expr(old_body)
            seq = relax.SeqExpr(blocks, body)
            if body.same_as(old_body):
                _ir.set_type(seq, func.body.ty)
            else:  # the output var was re-typed: let TVM type the body, as its mutator does
                seq = builder.normalize(seq)
        finally:
            builder.end_scope()
            self.scopes.pop()
        if not self.result.rewritten:
            return func
        if self.new_bindings is not None and not self.remapped:
            self._start_probe()
            if self.new_bindings is not None:
                self.result.new_bindings = self.probes
        ret_ty = func.ret_ty if seq.ty.is_base_of(func.ret_ty) else None
        return relax.Function(func.params, seq, ret_ty, func.is_pure, func.attrs)

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        name = self.top_name if not self.scopes else f"{self.top_name} (local function)"
        self.scopes.append(_Scope(name, _ir.checks_purity(func)))
        try:
            return super().visit_function_(func)
        finally:
            self.scopes.pop()

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        if self.suspended or not self._has_candidate(block):
            return super().visit_binding_block_(block)
        return self._rewrite_block(block, is_dataflow=False)

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        if self.suspended or not self._has_candidate(block):
            return super().visit_dataflow_block_(block)
        return self._rewrite_block(block, is_dataflow=True)

    def _is_candidate(self, value: relax.Expr) -> bool:
        ops = self.rule.root_ops
        return ops is None or (isinstance(value, relax.Call) and value.op in ops)

    def _has_candidate(self, block: relax.BindingBlock) -> bool:
        if self.rule.root_ops is None:
            return True
        is_candidate = self._is_candidate
        return any(is_candidate(binding.value) for binding in _ir.bindings_of(block))

    def _rewrite_block(self, block: relax.BindingBlock, is_dataflow: bool) -> relax.BindingBlock:
        builder = self.builder_
        if is_dataflow:
            builder._begin_dataflow_block()
        else:
            builder._begin_binding_block()
        # The matcher sees through earlier bindings of this block, as TVM's does; a binding
        # already rewritten in this pass is left out, since its old value no longer exists.
        # Both keyed by hash (the object's address): a hit on a TVM object key runs its
        # Python-level __eq__.
        bound: dict[int, tuple[relax.Var, relax.Expr]] | None = (
            {} if self.rule.needs_bindings else None
        )
        # The inverse, kept alongside so each match maps values back to vars in O(match).
        var_of: dict[int, relax.Var] = {}
        root_ops = self.rule.root_ops
        emit_normalized = _ir.emit_normalized
        kinds = _KINDS
        try:
            for binding in _ir.bindings_of(block):
                value = binding.value
                cls = type(value)
                kind = kinds.get(cls)
                if kind is None:
                    kind = _kind_of(cls)
                if (
                    root_ops is None or (kind == _CALL and value.op in root_ops)
                ) and self._try_rewrite(binding, value, bound, var_of, is_dataflow):
                    continue
                if kind == _HAS_BLOCKS:
                    self._visit_nested(binding)
                elif self.remapped:
                    self.visit_binding(binding)
                else:
                    # What visit_binding would do for a binding it leaves unchanged, minus the walk.
                    emit_normalized(builder, binding)
                # Impure bindings are not seen through (TVM's matcher stops at them too): a
                # rewriter rebuilding their value would repeat a side effect.
                if bound is not None and not relax.analysis.contains_impure_call(value):
                    var = binding.var
                    bound[hash(var)] = (var, value)
                    var_of[hash(value)] = var
        except BaseException:
            builder._end_block()  # leave the builder balanced for whoever unwinds it
            raise
        return builder._end_block()

    def _visit_nested(self, binding: relax.Binding) -> None:
        """Let TVM's mutator walk a value with blocks of its own (it calls back for those)."""
        if self.block_index < 0:
            self.visit_binding(binding)
            return
        # Vars defined in there are not tracked, so only the full check can vouch.
        self.new_bindings = None
        index, self.block_index = self.block_index, -1
        try:
            self.visit_binding(binding)
        finally:
            self.block_index = index

    # -- one match -----------------------------------------------------------------

    def _try_rewrite(
        self,
        binding: relax.Binding,
        value: relax.Expr,
        bound: dict[int, tuple[relax.Var, relax.Expr]] | None,
        var_of: dict[int, relax.Var],
        is_dataflow: bool,
    ) -> bool:
        var2val = None if bound is None else self._bindings_for(value, bound)
        # A top-level OrPattern is tried one alternative at a time, as TVM's OrRewriter
        # does, so a rewriter that declines one alternative is offered the next.
        for alternative, enclosing in self.rule.alternatives:
            matched = alternative.extract_matched_expr(value, var2val)
            if matched is None:
                continue
            matchings, interior = self._as_vars(matched, value, var_of)
            for pattern in enclosing:
                matchings[pattern] = value
            emitted, new_value = self._call_rewriter(binding, value, matchings, is_dataflow)
            if new_value is not None and not emitted and _structurally_equal(new_value, value):
                new_value = None  # an equal rebuild changes nothing; counting it would never converge
            if new_value is not None:
                break
            if emitted:
                self._fail(
                    binding,
                    f"the rewriter emitted {len(emitted)} binding(s) and then declined the match "
                    "(returned the original call or None); return the replacement expression, "
                    "or decline before emitting anything",
                )
            # A declined match may be accepted in a later pass (TVM offers it again).
            self.result.may_rematch = True
        else:
            return False
        self.result.interior.extend(interior)
        self._check_result(binding, emitted, new_value, is_dataflow)
        if not self.result.may_rematch and any(
            self._is_candidate(v) or isinstance(v, _NESTED)
            for v in (new_value, *(extra.value for extra in emitted))
        ):
            self.result.may_rematch = True  # the next pass has something new to look at
        self.suspended += 1
        try:
            for extra in emitted:
                self.visit_binding(extra)
            replacement = self._emit_replacement(binding, new_value)
        finally:
            self.suspended -= 1
        if self.block_index >= 0 and self.new_bindings is not None:
            self._note_new_bindings(binding, value, matchings, [*emitted, replacement], is_dataflow)
        result = self.result
        result.rewritten += 1
        if result.rewritten <= _NAMES_SHOWN:
            result.first_rewritten.append(_ir.var_name(binding.var))
        return True

    def _note_new_bindings(
        self,
        binding: relax.Binding,
        value: relax.Expr,
        matchings: Mapping[DFPattern, relax.Expr],
        new: list[relax.Binding],
        is_dataflow: bool,
    ) -> None:
        """Check where the new bindings stand, and keep them for the probe of ``_wellformed``.

        A var read by a new binding must be defined before it (a DataflowVar
        in the same block); a var it defines must be new.  Where the rewrite
        did not touch it, the input is taken to be well formed, as for every
        binding the pass keeps: a var the match handed over, or that the
        original value read, is defined where the original binding could
        read it.  Any other var is looked up in the input's definitions.
        """
        if self.probe_size >= _wellformed.PROBE_BINDINGS:
            self._start_probe()
            if self.new_bindings is None:
                return
        index = self.block_index
        entry = self.new_bindings.get(index)
        if entry is None:
            entry = self.new_bindings[index] = _wellformed.NewBindings(is_dataflow)
        probed, probe_number = self.probed, self.probe_number
        handed: set[int] | None = None
        original: set[int] | None = None
        for new_binding in new:
            new_value = new_binding.value
            if self.in_module and len(relax.analysis.all_global_vars(new_value)):
                # Whether a GlobalVar is defined depends on the module: only the full check knows.
                self.new_bindings = None
                return
            symbolic = None
            for var in _ir.elements(relax.analysis.free_vars(new_value)):
                key = hash(var)
                where = self.new_defined.get(key)
                if where is None and key in self.params:
                    where = -1
                if where is None:
                    if handed is None:
                        handed = {hash(matched) for matched in matchings.values()}
                    if key in handed:
                        where = index
                if where is None:
                    # TVM 0.27's free_vars also lists symbolic (shape) vars; whether those are
                    # defined is for well_formed to say, on the probe or the whole function.
                    if symbolic is None:
                        free_symbolic = relax.analysis.free_symbolic_vars(new_value)
                        symbolic = {hash(v) for v in _ir.elements(free_symbolic)}
                    if key in symbolic:
                        continue
                    if original is None:
                        original = {hash(v) for v in _ir.elements(relax.analysis.free_vars(value))}
                    where = index if key in original else self._input_block_before(binding, var)
                    if where is None and self.new_bindings is None:
                        return  # the input binds some var twice: only the full check can tell
                if where is None or (where != index and isinstance(var, relax.DataflowVar)):
                    self._fail(
                        binding,
                        "the result is not well formed: the rewriter used the var "
                        f"'{_ir.var_name(var)}', which is not defined before this binding"
                        + (" in the same DataflowBlock" if where is not None else "")
                        + "; use the vars in matchings, or what builder.emit returned",
                    )
                if key not in self.params and probed.get(key) != probe_number:
                    probed[key] = probe_number
                    entry.reads.append(var)
                    self.probe_size += 1
            var = new_binding.var
            if not var.same_as(binding.var):
                known = (
                    hash(var) in self.new_defined
                    or hash(var) in self.params
                    or self.input_defs.position(var) is not None
                )
                if self.input_defs.defined_twice:
                    self.new_bindings = None  # only the full check can judge such an input
                    return
                if known:
                    self._fail(
                        binding,
                        "the result is not well formed: the rewriter emitted a binding of the "
                        f"var '{_ir.var_name(var)}', which is already defined; builder.emit "
                        "makes a fresh var",
                    )
                self.new_defined[hash(var)] = index
            probed[hash(var)] = probe_number
        entry.bindings.extend(new)
        self.probe_size += len(new)

    def _input_block_before(self, binding: relax.Binding, var: relax.Var) -> int | None:
        """The top-level block where the input binds ``var`` before ``binding``, or None.

        None also when the input binds some var twice; then ``new_bindings``
        is dropped, as only the full check can judge such a function.
        """
        defs = self.input_defs
        position = defs.position(var)
        if defs.defined_twice:
            self.new_bindings = None
            return None
        if position is None or position >= defs.position(binding.var):
            return None
        return defs.block_of(position)

    def _start_probe(self) -> None:
        """Check or keep the current probe's bindings, if any, and start a new, empty probe.

        While nothing this pass did can match again, the pass is most likely
        the only one, so the probe is checked at once, while its bindings are
        still in the CPU's caches (checked after the pass, the probes of a
        100k-binding function cost three times the cache misses).  A probe
        that fails ends the local check: only the full check can judge.
        Otherwise another pass may follow, which would make the check moot,
        so the probe is kept for after the last pass.
        """
        if self.new_bindings:
            probe = [self.new_bindings[i] for i in sorted(self.new_bindings)]
            if self.result.may_rematch:
                self.probes.append(probe)
            elif not _wellformed.probe_is_well_formed(self.top, probe):
                self.new_bindings = None
                return
        self.new_bindings = {}
        self.probe_number += 1
        self.probe_size = 0

    def _emit_replacement(self, binding: relax.Binding, new_value: relax.Expr) -> relax.Binding:
        """Bind the rewritten value to the binding's var, re-typed if its type changed.

        ``visit_binding`` would take TVM's fast path here (value and var both
        unchanged by the visit) and keep a stale type annotation, so the var is
        re-typed by hand; later uses follow through the mutator's var remap.
        """
        value = self.visit_expr(new_value)
        var = self.visit_var_def(binding.var)
        if isinstance(binding, relax.MatchCast):
            new_binding = relax.MatchCast(var, value, binding.ty)
        else:
            new_var = self.with_type(var, value.ty)
            if not new_var.same_as(binding.var):
                self.set_var_remap(binding.var, new_var)
                self.remapped = True
                self.result.may_rematch = True  # later values now read a var of a new type
            new_binding = relax.VarBinding(new_var, value)
        self.builder_.emit_normalized(new_binding)
        return new_binding

    def _bindings_for(
        self, value: relax.Expr, bound: dict[int, tuple[relax.Var, relax.Expr]]
    ) -> dict[relax.Var, relax.Expr]:
        """The bindings of the block so far that matching ``value`` can look through.

        TVM turns the var-to-value map it is handed into a Map of its own at
        every match: handing it the whole block would make each match cost
        as much as the block so far, quadratic in the block's size.  A
        pattern ``lookup_depth`` levels deep reaches vars only that many
        levels of values down from ``value`` (``_patterns.lookup_depth``);
        var-to-var chains are followed to their end, as the matcher does.
        """
        depth = self.rule.lookup_depth
        if depth is None:
            return {var: val for var, val in bound.values()}
        found: dict[int, tuple[relax.Var, relax.Expr]] = {}
        frontier: list[relax.Expr] = [value]
        for level in range(depth):
            deeper: list[relax.Expr] = []
            for expr in frontier:
                key = hash(expr)
                if key in found:
                    continue  # looked through at this level or a shallower one already
                while key in bound and key not in found:
                    found[key] = bound[key]
                    expr = bound[key][1]
                    key = hash(expr)
                if level + 1 < depth:
                    deeper.extend(_ir.elements(relax.analysis.free_vars(expr)))
            frontier = deeper
        return {var: val for var, val in found.values()}

    def _as_vars(
        self,
        matched: Mapping[DFPattern, relax.Expr],
        root: relax.Expr,
        var_of: dict[int, relax.Var],
    ) -> tuple[dict[DFPattern, relax.Expr], list[relax.Var]]:
        """Give each match as the var that binds it, never its bound value.

        TVM's matcher hands out the value behind a var (``m[dst]`` of
        ``copy_tensor(x, a)`` is ``a``'s ``alloc_tensor(...)`` call); using
        it would compute it a second time.  Values matched by a non-leaf
        sub-pattern are interior to the match: if they are pure and end up
        unused they are dropped after the pass.
        """
        matchings = dict(matched.items())
        interior: list[relax.Var] = []
        if not var_of:
            return matchings, interior
        # Objects hash by handle, so var_of finds the binding of the very value matched.
        for pat, expr in matchings.items():
            if expr.same_as(root):
                continue
            var = var_of.get(hash(expr))
            if var is None:
                continue
            matchings[pat] = var
            if not isinstance(pat, P.WildcardPattern):
                interior.append(var)
        return matchings, interior

    def _call_rewriter(
        self,
        binding: relax.Binding,
        value: relax.Expr,
        matchings: dict[DFPattern, relax.Expr],
        is_dataflow: bool,
    ) -> tuple[list[relax.Binding], relax.Expr | None]:
        """Run the rewriter in a block frame of its own, so what it emits can be checked."""
        builder = self.builder_
        if is_dataflow:
            builder._begin_dataflow_block()
        else:
            builder._begin_binding_block()
        try:
            try:
                if self.rule.takes_builder:
                    new_value = self.rule.rewriter(value, matchings, builder)
                else:
                    new_value = self.rule.rewriter(value, matchings)
            except Exception as exc:  # noqa: BLE001 - any failure of user code is reported
                self._fail(binding, f"the rewriter raised {type(exc).__name__}: {exc}", cause=exc)
            if new_value is not None and not isinstance(new_value, relax.Expr):
                self._fail(
                    binding,
                    f"the rewriter returned a {type(new_value).__name__}, not a relax.Expr "
                    "(return a relax expression, or the original call / None to decline)",
                )
            if new_value is not None and not new_value.same_as(value):
                try:
                    new_value = builder.normalize(new_value)
                except Exception as exc:  # noqa: BLE001
                    self._fail(
                        binding,
                        f"the rewriter returned an expression TVM cannot normalize: {exc}",
                        cause=exc,
                    )
            else:
                new_value = None
        finally:
            emitted = _ir.elements(builder._end_block().bindings)
        return emitted, new_value

    def _check_result(
        self,
        binding: relax.Binding,
        emitted: list[relax.Binding],
        new_value: relax.Expr,
        is_dataflow: bool,
    ) -> None:
        scope = self.scopes[-1]
        if is_dataflow or scope.is_pure:
            where = "a DataflowBlock" if is_dataflow else "a pure function"
            fix = (
                "rewrite after leaving dataflow (e.g. after relax.transform.ToNonDataflow, or on "
                "the lowered function)"
                if is_dataflow
                else "mark the function impure with @R.function(pure=False)"
            )
            for extra in emitted:
                if relax.analysis.contains_impure_call(extra.value):
                    self._fail(
                        binding,
                        f"the rewriter emitted the impure call `{extra.value}` into {where}; {fix}",
                    )
            if relax.analysis.contains_impure_call(new_value):
                self._fail(binding, f"the rewriter returned the impure call `{new_value}` into {where}; {fix}")
        if _ir.is_void(new_value.ty) and not _ir.is_void(binding.var.ty):
            if binding.var in self._used_vars():
                self._fail(
                    binding,
                    "the rewriter returned a void value (type R.Tuple()) but the binding's var "
                    "is used later; only a binding whose var is unused may become void",
                )

    def _used_vars(self) -> set[relax.Var]:
        if self._used is None:
            self._used = _ir.used_vars(self.top)
        return self._used

    def _fail(self, binding: relax.Binding, what: str, cause: BaseException | None = None) -> None:
        scope = self.scopes[-1].name if self.scopes else self.top_name
        error = RewriteError(
            f"rewrite_ext: in function '{scope}', binding '{_ir.var_name(binding.var)}', "
            f"pattern {self.rule.description}: {what}"
        )
        error.__cause__ = cause
        # Kept so the caller can re-raise this very object once TVM's C++ has unwound.
        self.error = error
        raise error


def _one_pass(
    rule: _Rule,
    func: relax.Function,
    name: str,
    mod: tvm.IRModule | None,
    check_locally: bool,
) -> _PassResult:
    rewriter = _RewriteMutator(rule, func, name, mod, check_locally)
    try:
        new_func = rewriter.rewrite_top(func)
    except Exception:
        if rewriter.error is not None:
            raise rewriter.error from rewriter.error.__cause__
        raise
    rewriter.result.func = new_func if rewriter.result.rewritten else func
    return rewriter.result


def _rewrite_function(
    rule: _Rule, func: relax.Function, name: str, mod: tvm.IRModule | None, max_iterations: int
) -> tuple[relax.Function, list[list[_wellformed.NewBindings]] | None]:
    """Rewrite to a fixed point; also return what the local well-formedness check needs.

    The second item is None when only the full check can vouch for the
    result (more than one pass rewrote, a var was re-typed, a block held an
    If or a local function, ...).
    """
    interior: list[relax.Var] = []
    current = func
    new_bindings = None
    for count in range(max_iterations):
        result = _one_pass(rule, current, name, mod, check_locally=count == 0)
        if not result.rewritten:
            break
        current = result.func
        interior.extend(result.interior)
        new_bindings = result.new_bindings if count == 0 else None
        if not result.may_rematch:
            # Nothing this pass produced can match and nothing it left can match now if it
            # could not before: the next pass, or the confirming scan, would find nothing.
            break
    else:
        # Every allowed pass rewrote something: one more scan tells converged from not.
        scan = _one_pass(rule, current, name, mod, check_locally=False)
        if scan.rewritten:
            shown = ", ".join(f"'{v}'" for v in scan.first_rewritten)
            more = f" and {scan.rewritten - _NAMES_SHOWN} more" if scan.rewritten > _NAMES_SHOWN else ""
            raise RewriteError(
                f"rewrite_ext: in function '{name}', pattern {rule.description}: did not converge "
                f"after max_iterations={max_iterations} passes; bindings still matching: "
                f"{shown}{more}. Make the rewriter's output not match its own pattern, or raise "
                "max_iterations"
            )
    if interior:
        # Only what the pass added is in new_bindings; dropping unused pure bindings
        # cannot make it ill-formed.
        current = _ir.drop_unused_bindings(current, interior)
    return current, new_bindings


def _check_well_formed(
    obj: relax.Function | tvm.IRModule,
    name: str,
    rule: _Rule,
    new_bindings: list[tuple[relax.Function, list[list[_wellformed.NewBindings]] | None]],
) -> None:
    """Raise RewriteError unless ``obj`` passes ``relax.analysis.well_formed``.

    ``new_bindings`` holds each rewritten function with what its pass added
    (or None).  When every function has it and each probe passes, the result is
    well formed without walking it all (see ``_wellformed``); otherwise TVM
    checks the whole of ``obj``.
    """
    if all(
        probes is not None and all(_wellformed.probe_is_well_formed(func, p) for p in probes)
        for func, probes in new_bindings
    ):
        return
    try:
        relax.analysis.well_formed(obj)
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        raise RewriteError(
            f"rewrite_ext: in function '{name}', pattern {rule.description}: the rewritten IR is "
            f"not well formed: {exc}"
        ) from exc


def rewrite_call(
    pattern: DFPattern,
    rewriter: Rewriter,
    target: relax.Function | tvm.IRModule,
    *,
    max_iterations: int = 10,
) -> relax.Function | tvm.IRModule:
    """Rewrite every binding whose value matches ``pattern``.

    A drop-in extension of ``tvm.relax.dpl.rewrite_call``: the rewriter may
    also take a ``relax.BlockBuilder`` and emit bindings, void ones
    included, that land just before the rewritten binding.

    Matching rules:

    * Every binding's value is offered, wherever a binding can stand:
      DataflowBlocks and plain BindingBlocks, pure and impure functions,
      If branches, nested local functions.  (TVM's rewrite_call never
      offers impure calls in plain blocks.)
    * Patterns see through earlier bindings of the same block, as TVM's
      matcher does.  ``matchings[p]`` is the *var* that binds what ``p``
      matched, never the bound value (TVM gives the value), so using it
      never recomputes anything.  Pure bindings seen through by a
      non-wildcard sub-pattern and unused after the rewrite are removed.
    * Nothing else changes: no re-sorting, dead-code elimination, CSE or
      canonicalization.  A function where nothing matches comes back
      structurally equal to the input, which is never modified.

    Parameters
    ----------
    pattern : DFPattern
        The pattern to match against each binding's value.
    rewriter : Callable
        ``rewriter(orig, matchings)`` (TVM's form) or
        ``rewriter(orig, matchings, builder)``, chosen once from its
        signature.  It returns the expression that replaces ``orig``;
        returning ``orig`` itself or None declines the match.  Whatever it
        emits through ``builder`` lands just before the rewritten binding,
        in order; a void call emitted is bound to a fresh ``R.Tuple()`` var.
    target : Union[relax.Function, tvm.IRModule]
        A function, or a module whose Relax functions are all rewritten
        (everything else in it is kept as is).
    max_iterations : int
        The most rewriting passes.  One more scan then checks that nothing
        matches any more; bindings a rewriter emitted are not matched
        again within the pass that emitted them.

    Returns
    -------
    result : Union[relax.Function, tvm.IRModule]
        The rewritten function or a new module.  It passes
        ``relax.analysis.well_formed``.

    Raises
    ------
    RewriteError
        When the rewriter raises, returns a non-expression, emits and then
        declines, returns a void value for a binding whose var is used
        later, puts an impure call in a DataflowBlock or a pure function,
        or keeps matching after ``max_iterations``; or when the result is
        not well formed.  The message names the function, the binding and
        the pattern.

    Examples
    --------
    .. code-block:: python

        def to_dma(orig, m, builder):
            src, dst = m[src_pat], m[dst_pat]
            builder.emit(R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy",
                         [src, dst, 0, True], ty_args=[R.Tuple()]))
            return R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait",
                         [0, 0, True, src, dst], ty_args=[R.Tuple()])

        func = rewrite_call(is_op("relax.vm.copy_tensor")(src_pat, dst_pat), to_dma, func)

    turns ``R.vm.copy_tensor(x, a)`` into::

        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", (x, a, 0, True), ty_args=(R.Tuple,))
        R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", (0, 0, True, x, a), ty_args=(R.Tuple,))
    """
    if not isinstance(max_iterations, int) or max_iterations < 1:
        raise ValueError(f"max_iterations must be a positive int, got {max_iterations!r}")
    rule = _Rule.make(pattern, rewriter)
    if isinstance(target, relax.Function):
        name = _ir.function_name(target)
        result, added = _rewrite_function(rule, target, name, None, max_iterations)
        if not result.same_as(target):
            _check_well_formed(result, name, rule, [(result, added)])
        return result
    if isinstance(target, tvm.IRModule):
        return _rewrite_module(rule, target, max_iterations)
    raise TypeError(f"target must be a relax.Function or an IRModule, got {type(target).__name__}")


def _rewrite_module(rule: _Rule, mod: tvm.IRModule, max_iterations: int) -> tvm.IRModule:
    functions = dict(mod.functions_items())
    changed = []
    added = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new_func, new_bindings = _rewrite_function(rule, func, gvar.name_hint, mod, max_iterations)
            if not new_func.same_as(func):
                functions[gvar] = new_func
                changed.append(gvar.name_hint)
                added.append((new_func, new_bindings))
    new_mod = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    if changed:
        _check_well_formed(new_mod, ", ".join(changed), rule, added)
    return new_mod


def RewriteCall(  # noqa: N802 - TVM names passes in CamelCase
    pattern: DFPattern,
    rewriter: Rewriter,
    *,
    name: str | None = None,
    max_iterations: int = 10,
) -> tvm.ir.transform.Pass:
    """A module pass applying :func:`rewrite_call` to every Relax function.

    Parameters
    ----------
    pattern : DFPattern
        The pattern to match.
    rewriter : Callable
        As for :func:`rewrite_call`.
    name : Optional[str]
        The pass name (default ``"RewriteCall"``), as shown by pass
        instrumentation and ``PassContext`` options.
    max_iterations : int
        As for :func:`rewrite_call`.

    Returns
    -------
    pass : tvm.ir.transform.Pass
        A module-level pass, composable in ``tvm.transform.Sequential``.
        A failure raises :class:`RewriteError` through TVM's pass
        infrastructure with its type and message intact.
    """
    _Rule.make(pattern, rewriter)  # fail at construction, not at the first run

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_call(pattern, rewriter, mod, max_iterations=max_iterations)

    return tvm.ir.transform.module_pass(transform, opt_level=0, name=name or "RewriteCall")
