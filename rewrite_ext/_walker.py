"""One rewriting pass over one function: the traversal.

TVM's C++ mutator walks the function, its If branches and local functions;
a binding block that holds a binding some rule may match is rebuilt here,
binding by binding, through the builder that emits the block.  That is how
what a rewriter emits through ``builder`` lands just before the rewritten
binding.  TVM's pattern language does the matching.

What a match may see: earlier bindings of the same block, as TVM's matcher
sees them, except a ``match_cast`` (its value is not the cast value), a
binding already rewritten in this pass, and anything before an impure
binding or an in-place call (``call_tir_inplace``, ``call_inplace_packed``:
memory written in place there makes a value computed before it differ from
the same expression after it).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, WildcardPattern
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _ir
from ._builder import BuilderMisuse, RewriterBuilder
from ._patterns import ANY_GLOBAL_VAR
from ._wellformed import Verdict
from .errors import RewriteError, remember
from .report import Recorder
from .rule import Decline, Rule
from .compat import ret_ty, set_type, set_var_remap, ty, with_type

NAMES_SHOWN = 10
"""Bindings a non-convergence message names."""


class RuleSet:
    """Rules in order, indexed by the ops at their roots."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self.any_value = [(i, r) for i, r in enumerate(self.rules) if r.root_ops is None]
        """Rules that may match any value, with their positions."""
        by_op: dict[int | str, list[tuple[int, Rule]]] = {}
        for i, rule in enumerate(self.rules):
            for op in rule.root_ops or ():
                by_op.setdefault(op if op == ANY_GLOBAL_VAR else hash(op), []).append((i, rule))
        # Merged with the any-value rules once per op, so rules keep their order.
        self.by_op = {
            key: sorted(found + self.any_value, key=lambda item: item[0]) for key, found in by_op.items()
        }
        self.sees_through = any(rule.lookup_depth != 0 for rule in self.rules)
        self.description = " or ".join(rule.description for rule in self.rules)
        """The rules' patterns, for messages that name no single rule."""

    def candidates(self, value: relax.Expr) -> list[tuple[int, Rule]]:
        """The rules that may match ``value``, in order."""
        if type(value) is relax.Call:
            op = value.op
            found = self.by_op.get(hash(op))
            if found is None and type(op) is relax.GlobalVar:
                found = self.by_op.get(ANY_GLOBAL_VAR)
            if found is not None:
                return found
        return self.any_value

    def block_has_candidate(self, block: relax.BindingBlock) -> bool:
        """Whether a binding of ``block`` may match."""
        return self._scan(block, nested=False)

    def function_may_match(self, func: relax.Function) -> bool:
        """Whether any binding of ``func`` may match; True also when it holds nested blocks.

        A function where nothing can match is left alone without a walk of
        TVM's mutator, which would cost more than this scan.
        """
        body = func.body
        if self.any_value or type(body) is not relax.SeqExpr:
            return True
        return any(self._scan(block, nested=True) for block in body.blocks)

    def _scan(self, block: relax.BindingBlock, nested: bool) -> bool:
        if self.any_value:
            return True
        by_op = self.by_op
        call = relax.Call
        global_var = relax.GlobalVar if ANY_GLOBAL_VAR in by_op else None
        for binding in _ir.bindings_of(block):
            value = binding.value
            if type(value) is call:
                op = value.op
                if hash(op) in by_op or type(op) is global_var:
                    return True
            elif nested and _ir.holds_blocks(value):
                return True
        return False


@dataclass
class PassResult:
    """What one pass over a function did."""

    func: relax.Function
    changes: int = 0
    """Bindings rewritten or kept with new bindings before them."""
    changed_names: list[str] = field(default_factory=list)
    """The first ``NAMES_SHOWN`` of those bindings' vars, for messages."""
    kept_the_match: list[str] = field(default_factory=list)
    """Of those, the bindings whose rewrite holds the very value that matched (``astype(orig)``)."""
    interior: list[relax.Var] = field(default_factory=list)
    """Pure bindings seen through by a match, to drop if nothing reads them any more."""
    may_rematch: bool = False
    """Whether a binding may match now that did not in this pass, so another pass must look."""


@dataclass
class _Scope:
    name: str
    checks_purity: bool


@dataclass
class _Block:
    """The block being rebuilt."""

    bindings: relax.BindingBlock
    is_dataflow: bool
    lookup: dict[int, tuple[relax.Var, relax.Expr]] | None
    """hash(var) -> (var, value) of the bindings a match may see through; None if no rule looks."""


@mutator
class FunctionPass(PyExprMutator):
    """One rewriting pass of ``rules`` over one function.

    ``builder`` is shared by the passes of one rewrite: what rewriters add to
    its module (``emit_te``'s kernels) is added to the result.  ``kept``
    holds ``(rule index, hash(value))`` of each binding a rule kept
    (returned ``orig`` after emitting): that rule is not offered the binding
    again, in this pass or a later one.  The value, not the var, names the
    binding: TVM's cleanups may rename the var, never rebuild the value.
    """

    def __init__(
        self,
        rules: RuleSet,
        name: str,
        builder: RewriterBuilder,
        kept: set[tuple[int, int]],
        check: Verdict,
        recorder: Recorder | None = None,
    ) -> None:
        super().__init__()
        self.recorder = recorder
        self.builder_ = builder
        self.rules = rules
        self.top_name = name
        self.kept = kept
        self.check = check
        self.scopes: list[_Scope] = []
        self.result: PassResult | None = None
        # >0 while re-emitting what a rewriter produced: that is not matched again this pass.
        self.suspended = 0
        # Set once a rewritten var was re-typed: every later binding then goes through the
        # mutator, which substitutes the new var; before, an unchanged one is re-emitted as is.
        self.remapped = False
        self.retyped_by: tuple[str, Rule | None] = ("", None)
        """The latest binding whose var was re-typed, and the rule that rewrote it."""
        self.error: BaseException | None = None
        self._used: set[relax.Var] | None = None
        # A binding this pass did not match can match in the next only through what the pass
        # made: a new value a rule may match, a re-typed var, a kept binding (another rule may
        # take it), or any binding at all when a rule sees through bindings or matches any value.
        self.may_rematch = rules.sees_through or bool(rules.any_value)

    def run(self, func: relax.Function) -> PassResult:
        self.result = PassResult(func)
        self.top = func
        if not self.rules.function_may_match(func):
            return self.result
        try:
            new_func = self._visit_top(func)
        except BaseException:
            # An error raised in a callback came back through TVM's C++: raise the original.
            if self.error is not None:
                raise self.error from self.error.__cause__
            raise
        if self.result.changes:
            self.result.func = new_func
            self.result.may_rematch = self.may_rematch
        return self.result

    # -- traversal -------------------------------------------------------------------------

    def _visit_top(self, func: relax.Function) -> relax.Function:
        """The top-level function, put together here from its rebuilt blocks.

        TVM's mutator would end it by normalizing the rebuilt body three
        times over (the SeqExpr, the body in the function's scope, the
        Function), each a walk that emits every binding again into the
        builder's table: on a 100k-binding function that cost more than the
        rewrite of its unmatched bindings.  This does what the mutator's
        ``VisitExpr_(Function)`` and ``VisitWithNewScope`` do otherwise: the
        blocks rebuilt in an inner scope of the function's, empty ones
        dropped, the body's type kept unless the var it returns was re-typed
        (then TVM types it, and the return type is kept only if it covers the new one).
        If branches and local functions still go through TVM's mutator.
        """
        body = func.body
        if type(body) is not relax.SeqExpr:  # not in normal form: TVM's mutator normalizes it
            return self.visit_expr(func)
        builder = self.builder_
        params = _ir.elements(func.params)
        self.scopes.append(_Scope(self.top_name, _ir.checks_purity(func)))
        builder.begin_scope(params)
        try:
            builder.begin_scope(params)
            try:
                blocks = []
                for block in _ir.elements(body.blocks):
                    new_block = self._visit_block(block, type(block) is relax.DataflowBlock)
                    if len(new_block.bindings):
                        blocks.append(new_block)
            finally:
                builder.end_scope()
            if not self.result.changes:
                return func
            # (Always: an If whose branch was rewritten may have been re-bound to a new var by
            # TVM's mutator, in a block this pass left to it.)
            output = self.visit_expr(body.body)
            seq = relax.SeqExpr(blocks, output)
            returned = ret_ty(func)
            if output.same_as(body.body):
                set_type(seq, ty(body))
            else:
                seq = builder.normalize(seq)
                # The returned var was re-typed.  An annotation that no longer covers what the
                # body returns would be checked by the VM, and fail, at run time: the new type
                # is derived instead.  (TVM's mutator keeps one more specific than the body.)
                if not returned.is_base_of(ty(seq)):
                    returned = None
        finally:
            builder.end_scope()
            self.scopes.pop()
        return relax.Function(func.params, seq, returned, func.is_pure, func.attrs, func.span)

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        name = self.top_name if not self.scopes else f"{self.top_name} (local function)"
        self.scopes.append(_Scope(name, _ir.checks_purity(func)))
        try:
            return super().visit_function_(func)
        except BaseException as exc:
            self.error = self.error or exc
            remember(exc)
            raise
        finally:
            self.scopes.pop()

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        return self._visit_block(block, is_dataflow=False)

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        return self._visit_block(block, is_dataflow=True)

    def _visit_block(self, block: relax.BindingBlock, is_dataflow: bool) -> relax.BindingBlock:
        try:
            if self.suspended or not self.rules.block_has_candidate(block):
                if is_dataflow:
                    return super().visit_dataflow_block_(block)
                return super().visit_binding_block_(block)
            return self._rewrite_block(block, is_dataflow)
        except BaseException as exc:
            self.error = self.error or exc
            remember(exc)
            raise

    def _rewrite_block(self, bindings: relax.BindingBlock, is_dataflow: bool) -> relax.BindingBlock:
        builder = self.builder_
        block = _Block(bindings, is_dataflow, {} if self.rules.sees_through else None)
        lookup = block.lookup
        candidates = self.rules.candidates
        builder.begin_frame(is_dataflow)
        try:
            for binding in _ir.bindings_of(bindings):
                value = binding.value
                rules = candidates(value)
                visited = self.remapped and (bool(rules) or lookup is not None)
                if visited:
                    # A var re-typed earlier in this pass may be read here: rules are offered,
                    # and patterns see through, what the binding reads now, not its stale value.
                    value = self._remapped_value(binding, value)
                if rules:
                    if self._try_rules(binding, value, rules, block):
                        continue
                var = self._emit_unchanged(binding, value, visited)
                if lookup is not None:
                    if _ir.is_barrier(value):
                        lookup.clear()
                    elif type(binding) is relax.VarBinding:
                        lookup[hash(var)] = (var, value)
        except BaseException:
            builder.end_frame()  # leave the builder balanced for whoever unwinds it
            raise
        return builder.end_frame()

    def _emit_unchanged(self, binding: relax.Binding, value: relax.Expr, visited: bool = False) -> relax.Var:
        """Emit ``binding`` as it is, or ``value`` (already through the var remap) when ``visited``.

        Returns the var bound, re-typed where what it binds now has another type.
        """
        if visited:
            return self._emit_replacement(binding, value, ty(value), None, visited=True)
        if not self.remapped and not _ir.holds_blocks(value):
            _ir.emit_normalized(self.builder_, binding)
            return binding.var
        if not self.remapped:
            self.visit_binding(binding)
            return binding.var
        with self._typing_after_retype(binding):
            self.visit_binding(binding)
        return binding.var  # (only a block's lookup needs the var, and it takes the visited path)

    def _remapped_value(self, binding: relax.Binding, value: relax.Expr) -> relax.Expr:
        """``value`` with every var re-typed so far in this pass substituted, and typed anew."""
        with self._typing_after_retype(binding):
            return self.visit_expr(value)

    @contextlib.contextmanager
    def _typing_after_retype(self, binding: relax.Binding) -> Iterator[None]:
        """Report TVM's type errors in re-typing ``binding`` against the latest re-typed var."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - TVM's own type errors, raised while re-typing
            if isinstance(exc, RewriteError):
                raise
            retyped, rule = self.retyped_by
            self._fail(
                binding,
                rule,
                f"the rewrite of binding '{retyped}' changed its var's type, and TVM cannot type "
                f"this binding against it: {type(exc).__name__}: {_short(exc)}",
                exc,
            )

    # -- one match -------------------------------------------------------------------------

    def _try_rules(
        self,
        binding: relax.Binding,
        value: relax.Expr,
        rules: list[tuple[int, Rule]],
        block: _Block,
    ) -> bool:
        kept = self.kept
        key = hash(value) if kept else 0
        for index, rule in rules:
            if kept and (index, key) in kept:
                continue
            reachable = None
            if block.lookup and rule.lookup_depth != 0:
                reachable = _reachable(value, block.lookup, rule.lookup_depth)
            for alternative, enclosing in rule.alternatives:
                matched = _ir.extract_matched_expr(alternative, value, reachable)
                if matched is None:
                    continue
                if self._apply(index, rule, binding, value, matched, enclosing, reachable, block):
                    return True
        return False

    def _apply(
        self,
        index: int,
        rule: Rule,
        binding: relax.Binding,
        value: relax.Expr,
        matched: tvm.ir.container.Map,
        enclosing: tuple[DFPattern, ...],
        reachable: dict[relax.Var, relax.Expr] | None,
        block: _Block,
    ) -> bool:
        """Offer one match to ``rule``'s rewriter; True when the binding was rewritten or kept.

        Under the var remap, ``value`` is the binding's value already through it.
        """
        visited = self.remapped
        # TVM's own Map, as TVM's rewrite_call hands it over (converting it costs more than
        # most rewriters); a dict only when the Or nodes around the alternative are added.
        matchings = matched
        if enclosing:
            matchings = dict(matched.items())
            for pattern in enclosing:
                matchings[pattern] = value
        bound = {hash(val): var for var, val in reachable.items()} if reachable else None
        recorder = self.recorder
        if recorder is not None:
            recorder.offered(rule)
        emitted, landed, new_value, reason = self._call_rewriter(
            rule, binding, value, matchings, bound, block
        )
        keep = reason is None and (new_value is value or _equal_rebuild(new_value, value))
        if keep and not emitted:
            reason = "no change"
        if reason is not None:
            if recorder is not None:
                recorder.declined(rule, self._scope_name(), binding, reason)
            return False
        new = emitted + landed if landed else emitted
        if keep:
            new_value = new_ty = None
        else:
            new_ty = ty(new_value)
        self._check(rule, binding, emitted, landed, new_value, new_ty, block)
        self.check.record(self.scopes[-1].name, binding, rule.description, new, new_value)
        if not self.may_rematch:
            self.may_rematch = keep or self._may_match(new, new_value)
        self.suspended += 1
        try:
            for extra in emitted:
                if self.remapped or _ir.holds_blocks(extra.value):
                    self.visit_binding(extra)
                else:
                    _ir.emit_normalized(self.builder_, extra)
            if keep:
                self._emit_unchanged(binding, value, visited)
            else:
                self._emit_replacement(binding, new_value, new_ty, rule)
        finally:
            self.suspended -= 1
        if keep:
            self.kept.add((index, hash(value)))
        elif bound:
            self._note_interior(matched, value, bound)
        if recorder is not None:
            recorder.done(rule, self._scope_name(), binding, keep)
        if block.lookup is not None and (
            _ir.is_barrier(value) or any(_ir.is_barrier(extra.value) for extra in new)
        ):
            block.lookup.clear()
        result = self.result
        result.changes += 1
        if len(result.changed_names) < NAMES_SHOWN:
            result.changed_names.append(_ir.shown_name(binding.var))
            if not keep and any(extra.value.same_as(value) for extra in new):
                result.kept_the_match.append(_ir.shown_name(binding.var))
        return True

    def _call_rewriter(
        self,
        rule: Rule,
        binding: relax.Binding,
        value: relax.Expr,
        matchings: Mapping[DFPattern, relax.Expr],
        bound: dict[int, relax.Var] | None,
        block: _Block,
    ) -> tuple[list[relax.Binding], list[relax.Binding], relax.Expr | None, str | None]:
        """Run the rewriter: (emitted, landed, new value, reason if declined).

        What it emits goes to its own frame (``emitted``, to re-emit).  The
        value it returns is normalized in that frame if open, else straight
        into the block, where the parts of a nested value then land before
        the binding (``landed``, already emitted, only to check).
        """
        builder = self.builder_
        builder.lend(block.is_dataflow, bound)
        reason = None
        landed: list[relax.Binding] = []
        try:
            try:
                if rule.takes_builder:
                    new_value = rule.rewriter(value, matchings, builder)
                else:
                    new_value = rule.rewriter(value, matchings)
            except Decline as decline:
                new_value, reason = None, decline.reason or "declined"
            except BuilderMisuse as exc:
                self._fail(binding, rule, str(exc))
            except Exception as exc:  # noqa: BLE001 - any failure of user code is reported
                self._fail(binding, rule, f"the rewriter raised {type(exc).__name__}: {exc}", exc)
            if type(new_value) is relax.SeqExpr:
                self._fail(
                    binding,
                    rule,
                    "the rewriter returned a relax.SeqExpr, which may only be a function's body "
                    "or an If branch; emit its bindings with builder.emit(...) and return its body",
                )
            if not _ir.is_expr(new_value):
                pass
            elif new_value.same_as(value):
                new_value = value  # the very object: the caller tells "kept" by identity
            else:
                if bound:
                    new_value = _ir.replace_bound(new_value, bound)
                if self.remapped:
                    builder.open_frame()  # its parts must go through the var remap too
                in_frame = builder.opened
                try:
                    normalized = _ir.normalize(builder, new_value)
                except Exception as exc:  # noqa: BLE001 - TVM's type inference errors
                    self._fail(
                        binding, rule, f"the rewriter returned an expression TVM cannot normalize: {_short(exc)}", exc
                    )
                if not in_frame and not normalized.same_as(new_value):
                    landed = _ir.bindings_normalize_emitted(builder, new_value, normalized)
                new_value = normalized
        finally:
            emitted = builder.reclaim()
        if builder.raw_emits:
            names = ", ".join(f"'{_ir.shown_name(extra.var)}'" for extra in emitted)
            self.check.defer(
                f"the rewriter of binding '{_ir.shown_name(binding.var)}' called emit_normalized "
                f"(emitted: {names})"
            )
        if reason is not None:
            return [], [], None, reason  # what it emitted is dropped with the match
        if new_value is None:
            if emitted:
                self._fail(
                    binding,
                    rule,
                    f"the rewriter emitted {len(emitted)} binding(s) and then returned None; "
                    "return the replacement expression, return orig to keep the binding with "
                    "the emitted ones before it, or raise Decline to drop them",
                )
            return [], [], None, "returned None"
        if not _ir.is_expr(new_value):
            self._fail(
                binding,
                rule,
                f"the rewriter returned {_a(type(new_value).__name__)}, not a relax.Expr "
                "(return a relax expression, or None to decline)",
            )
        return emitted, landed, new_value, None

    # -- checks ----------------------------------------------------------------------------

    def _check(
        self,
        rule: Rule,
        binding: relax.Binding,
        emitted: list[relax.Binding],
        landed: list[relax.Binding],
        new_value: relax.Expr | None,
        new_ty: relax.Type | None,
        block: _Block,
    ) -> None:
        """Purity and void values.

        ``landed``: what normalizing the returned value bound of its nested parts;
        ``new_value``, ``new_ty``: the replacement and its type, None when the binding is kept.
        """
        if block.is_dataflow or self.scopes[-1].checks_purity:
            for extra in emitted:
                if _ir.is_impure(extra.value):
                    self._fail_impure(rule, binding, "emitted", extra.value, block.is_dataflow)
            for extra in landed:
                if _ir.is_impure(extra.value):
                    where = "returned (nested in the value it returned)"
                    self._fail_impure(rule, binding, where, extra.value, block.is_dataflow)
            if new_value is not None and _ir.is_impure(new_value):
                self._fail_impure(rule, binding, "returned", new_value, block.is_dataflow)
        if new_ty is not None and _ir.is_void(new_ty) and not _ir.is_void(ty(binding.var)):
            if binding.var in self._used_vars():
                self._fail(
                    binding,
                    rule,
                    "the rewriter returned a void value (type R.Tuple()) but the binding's var "
                    "is used later; only a binding whose var is unused may become void",
                )

    def _may_match(self, new: list[relax.Binding], new_value: relax.Expr | None) -> bool:
        """Whether a rule may match one of the values a match made."""
        if new_value is not None and self._may_hold_match(new_value):
            return True
        for extra in new:
            if self._may_hold_match(extra.value):
                return True
        return False

    def _may_hold_match(self, value: relax.Expr) -> bool:
        # Blocks of its own (an If, a local function) are not walked in the pass that made them.
        return bool(self.rules.candidates(value)) or _ir.holds_blocks(value)

    def _fail_impure(
        self, rule: Rule, binding: relax.Binding, what: str, expr: relax.Expr, is_dataflow: bool
    ) -> None:
        if is_dataflow:
            where = "a DataflowBlock"
            fix = (
                "rewrite after leaving dataflow (e.g. after relax.transform.ToNonDataflow, or on "
                "the lowered function)"
            )
        else:
            where = "a pure function"
            fix = (
                "mark the function impure with @R.function(pure=False), run "
                "relax.transform.RemovePurityChecking() on the module first, or rewrite it after "
                "TVM's lowering, which marks it relax.force_pure"
            )
        self._fail(binding, rule, f"the rewriter {what} the impure call `{expr}` into {where}; {fix}")

    def _used_vars(self) -> set[relax.Var]:
        if self._used is None:
            self._used = _ir.used_vars(self.top)
        return self._used

    # -- results ---------------------------------------------------------------------------

    def _emit_replacement(
        self,
        binding: relax.Binding,
        new_value: relax.Expr,
        new_ty: relax.Type,
        rule: Rule | None,
        visited: bool = False,
    ) -> relax.Var:
        """Bind the new value to the binding's var, re-typed if its type changed; return the var.

        Later uses of a re-typed var follow through the mutator's var remap.  A
        var nothing reads (a void call's ``_``, say) needs none: later bindings
        then stay on the quick path, re-emitted as they are.  ``rule`` None:
        the binding is unchanged but reads a var re-typed before it.
        """
        if self.remapped and not visited:
            with self._typing_after_retype(binding):
                new_value = self.visit_expr(new_value)
            new_ty = ty(new_value)
        var = binding.var
        if type(binding) is relax.MatchCast:
            new_binding = relax.MatchCast(var, new_value, ty(binding))
        elif new_value.same_as(binding.value):
            new_binding = binding
        else:
            new_var = with_type(self, var, new_ty)
            if not new_var.same_as(var):
                if var in self._used_vars():
                    set_var_remap(self, var, new_var)
                    self.remapped = self.may_rematch = True
                    if rule is not None:  # (else the latest rewrite that re-typed a var caused it)
                        self.retyped_by = (_ir.shown_name(var), rule)
                if len(relax.analysis.free_symbolic_vars(new_value)):
                    # A new type may name a symbolic var no binding defines: TVM's check decides.
                    self.check.defer(f"the var '{_ir.shown_name(var)}' was re-typed with symbolic shapes")
                var = new_var
            new_binding = _ir.make_binding(var, new_value, None)
        _ir.emit_normalized(self.builder_, new_binding)
        return var

    def _note_interior(self, matched: tvm.ir.container.Map, root: relax.Expr, bound: dict[int, relax.Var]) -> None:
        """Bindings a non-wildcard sub-pattern saw through, to drop later if nothing reads them."""
        for pattern, expr in matched.items():
            var = bound.get(hash(expr))
            if var is not None and not expr.same_as(root) and not isinstance(pattern, WildcardPattern):
                self.result.interior.append(var)

    # -- errors ----------------------------------------------------------------------------

    def _scope_name(self) -> str:
        return self.scopes[-1].name if self.scopes else self.top_name

    def _fail(
        self, binding: relax.Binding, rule: Rule | None, what: str, cause: BaseException | None = None
    ) -> None:
        pattern = f", pattern {rule.description}" if rule is not None else ""
        error = RewriteError(
            f"rewrite_ext: in function '{self._scope_name()}', binding '{_ir.binding_label(binding)}'"
            f"{pattern}: {what}"
        )
        error.__cause__ = cause
        self.error = error
        raise error


# TVM 0.26+ prints an op in its messages as its whole node, arguments' docs and all.
_OP_NODE = re.compile(r'ir\.Op\(span=[^"]*name="([^"]+)".*?support_level=\d+\)')


def _short(exc: BaseException) -> str:
    """TVM's message, each op named rather than printed whole."""
    return _OP_NODE.sub(r"\1", str(exc))


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "an int", "a str"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _equal_rebuild(new_value: relax.Expr, value: relax.Expr) -> bool:
    """Whether ``new_value`` is a structurally equal copy of ``value`` (TVM's "no change")."""
    if type(new_value) is not type(value):
        return False
    if type(value) is relax.Call and hash(new_value.op) != hash(value.op):
        return False  # the common case, told apart without a structural comparison
    return bool(tvm_ffi.structural_equal(new_value, value))


def _reachable(
    value: relax.Expr, lookup: dict[int, tuple[relax.Var, relax.Expr]], depth: int | None
) -> dict[relax.Var, relax.Expr]:
    """The bindings of ``lookup`` that matching ``value`` can see through.

    TVM converts the var-to-value map it is handed at every match, so
    handing it the whole block would make each match cost as much as the
    block so far.  A pattern ``depth`` levels deep reaches vars at most that
    many values down from ``value``; var-to-var chains are followed to their
    end, as the matcher does.  ``depth`` None: the whole lookup.
    """
    if depth is None:
        return dict(lookup.values())
    found: dict[int, tuple[relax.Var, relax.Expr]] = {}
    frontier: list[relax.Expr] = [value]
    for level in range(depth):
        deeper: list[relax.Expr] = []
        for expr in frontier:
            key = hash(expr)
            if key in found:
                continue
            while key in lookup and key not in found:
                found[key] = lookup[key]
                expr = lookup[key][1]
                key = hash(expr)
            if level + 1 < depth:
                deeper.extend(_ir.elements(relax.analysis.free_vars(expr)))
        frontier = deeper
    return dict(found.values())
