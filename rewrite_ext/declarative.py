"""Rewrite rules written in TVMScript: :func:`rule_from_module`.

A module with two Relax functions, ``pattern`` and ``replacement``, of the
same parameters, is a rewrite rule, as for TVM's
``PatternMatchingRewriter.from_module``::

    @rule_from_module
    @I.ir_module
    class CopyToDMA:
        @R.function(pure=False)
        def pattern(src: R.Tensor, dst: R.Tensor):
            R.vm.copy_tensor(src, dst)
            return R.tuple()

        @R.function(pure=False)
        def replacement(src: R.Tensor, dst: R.Tensor):
            R.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, dst, 0, True],
                                    ty_args=[R.Tuple()])
            R.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, src, dst],
                                    ty_args=[R.Tuple()])
            return R.tuple()

Unlike TVM's, the replacement may hold several bindings, void and impure
ones included: each is emitted through the builder just before the matched
binding, which gets the replacement's result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, overload

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, ExternFuncPattern, is_expr, is_op, is_tuple, is_tuple_get_item, wildcard
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import _ir
from .rule import Decline, Rule
from .compat import LITERALS, has_ty, ty, ty_args

__all__ = ["rule_from_module"]


@overload
def rule_from_module(mod: tvm.IRModule, *, name: str | None = None) -> Rule: ...


@overload
def rule_from_module(mod: None = None, *, name: str | None = None) -> Callable[[Any], Rule]: ...


def rule_from_module(mod: tvm.IRModule | None = None, *, name: str | None = None) -> Any:
    """Make a :class:`~rewrite_ext.Rule` from a ``pattern`` and a ``replacement`` Relax function.

    Usable on an IRModule, or as a decorator over ``@I.ir_module``
    (``@rule_from_module`` or ``@rule_from_module(name=...)``): TVMScript
    parses a class's functions only under a decorator line that names
    ``ir_module``, so that one stays.

    The ``pattern`` function is turned into a DFPattern as TVM's
    ``PatternMatchingRewriter.from_module`` does:

    * each parameter becomes a wildcard constrained by the parameter's
      annotated type (``wildcard().has_ty(ty)``); a parameter used twice
      must match the same expression twice;
    * each binding becomes the pattern of its value, a ``match_cast``
      adds its type; calls of ops and of extern functions, extern
      functions (``"name"`` in ``R.call_pure_packed("name", ...)``), tuples
      and tuple items are matched node by node; constants, ``R.prim_value``,
      ``R.str``, ``R.dtype`` and ``R.shape`` literals by equality;
    * what the function returns is the pattern's root.  A void pattern,
      one that returns ``R.tuple()`` after a void binding (such as
      ``R.vm.copy_tensor(x, a)``), matches that last binding;
    * unlike TVM's, a call's attributes (``axes=...``) and its ``ty_args``
      must equal the pattern's too; a match where they differ is declined
      with that reason.

    On each match the ``replacement`` is instantiated with its parameters
    bound to what the pattern's parameters matched (symbolic shape vars
    included): its bindings, in order, are emitted through the builder
    before the matched binding, with fresh vars, and the matched binding
    gets the replacement's result.  When that result is the var of the
    replacement's last binding, or ``R.tuple()`` after a void last binding,
    the matched binding gets that binding's value instead, so no trivial
    binding is added.

    Parameters
    ----------
    mod : tvm.IRModule
        A module holding exactly the Relax functions ``pattern`` and
        ``replacement``.
    name : Optional[str]
        The rule's name in reports and messages: by default the name of the
        class ``@I.ir_module`` parsed, else ``"pattern->replacement"``.

    Returns
    -------
    rule : Rule
        The rule, for :func:`~rewrite_ext.apply_rules` and friends.

    Raises
    ------
    ValueError
        When the module is not a rule: ``pattern`` or ``replacement``
        missing or not a Relax function, other functions present, different
        parameter counts or types, different result types, a replacement
        that is not well formed, a pattern binding that its result does not
        use, or a pattern that would match any value.
    """
    if mod is None:
        return lambda target: rule_from_module(target, name=name)
    if isinstance(mod, type):
        raise TypeError(
            f"rule_from_module got the class {mod.__name__}; parse it first: put @I.ir_module "
            "under @rule_from_module (TVMScript parses the functions of a class only under a "
            "decorator line naming ir_module)"
        )
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"rule_from_module expects an IRModule, got {type(mod).__name__}")
    # @I.ir_module keeps the class name on the module it returns.
    name = name or getattr(mod, "__name__", None)
    pattern_func, replacement = _functions(mod)
    _check_signatures(pattern_func, replacement)
    _check_well_formed(replacement)
    params, root, checks = _PatternMaker(pattern_func).make()
    return Rule(root, _Instantiate(replacement, params, checks), name=name or "pattern->replacement")


# -- checks at creation ----------------------------------------------------------------------


def _functions(mod: tvm.IRModule) -> tuple[relax.Function, relax.Function]:
    found: dict[str, Any] = {gvar.name_hint: func for gvar, func in mod.functions_items()}
    for needed in ("pattern", "replacement"):
        if needed not in found:
            raise ValueError(
                f"rule_from_module: the module has no '{needed}' function; it needs a Relax "
                f"function 'pattern' (what to match) and 'replacement' (what replaces it), "
                f"found {sorted(found) or 'none'}"
            )
        if not isinstance(found[needed], relax.Function):
            raise ValueError(
                f"rule_from_module: '{needed}' must be a Relax function (@R.function), "
                f"got {type(found[needed]).__name__}"
            )
    others = sorted(set(found) - {"pattern", "replacement"})
    if others:
        raise ValueError(
            f"rule_from_module: the module holds functions other than 'pattern' and "
            f"'replacement' ({', '.join(others)}); a rule cannot add functions to the module it "
            "rewrites, so write their bodies into the replacement"
        )
    return found["pattern"], found["replacement"]


def _check_signatures(pattern: relax.Function, replacement: relax.Function) -> None:
    p_params, r_params = list(pattern.params), list(replacement.params)
    if len(p_params) != len(r_params):
        raise ValueError(
            f"rule_from_module: 'pattern' takes {len(p_params)} parameter(s) and 'replacement' "
            f"{len(r_params)}; give both the same parameters, in the same order"
        )
    # One comparison over all types, so a symbolic var (n in R.Tensor(("n",))) must stand
    # for the same thing in both signatures; free vars map since each function has its own.
    p_types = [ty(p) for p in p_params] + [ty(pattern).ret]
    r_types = [ty(r) for r in r_params] + [ty(replacement).ret]
    if tvm_ffi.structural_equal(p_types, r_types, map_free_vars=True):
        return
    for i, (p, r) in enumerate(zip(p_params, r_params)):
        if not tvm_ffi.structural_equal(ty(p), ty(r), map_free_vars=True):
            raise ValueError(
                f"rule_from_module: parameter {i} has type {ty(p)} in 'pattern' ('{_ir.var_name(p)}') "
                f"but {ty(r)} in 'replacement' ('{_ir.var_name(r)}'); annotate both alike"
            )
    if not tvm_ffi.structural_equal(ty(pattern).ret, ty(replacement).ret, map_free_vars=True):
        raise ValueError(
            f"rule_from_module: 'pattern' returns {ty(pattern).ret} but 'replacement' returns "
            f"{ty(replacement).ret}; the replacement's result takes the matched value's place, so "
            "both must have the same type"
        )
    raise ValueError(
        "rule_from_module: the symbolic shape vars of 'pattern' and 'replacement' do not "
        f"correspond: {[str(t) for t in p_types]} vs {[str(t) for t in r_types]}"
    )


def _check_well_formed(replacement: relax.Function) -> None:
    try:
        ok = relax.analysis.well_formed(replacement)
    except Exception as exc:  # noqa: BLE001 - TVM 0.27 raises; the message is what matters
        raise ValueError(
            f"rule_from_module: 'replacement' is not well formed for its parameters: {exc}"
        ) from exc
    if ok is False:  # TVM releases before 0.27 return a bool
        raise ValueError("rule_from_module: 'replacement' is not well formed for its parameters")


# -- the pattern -----------------------------------------------------------------------------


class _PatternMaker:
    """The DFPattern of a ``pattern`` function, built from its result down."""

    def __init__(self, func: relax.Function) -> None:
        self.func = func
        self.params = [has_ty(wildcard(), ty(p)) for p in func.params]
        self.by_var: dict[relax.Var, DFPattern] = dict(zip(func.params, self.params))
        self.bindings: dict[relax.Var, relax.Binding] = {
            b.var: b for block in func.body.blocks for b in _ir.elements(block.bindings)
        }
        self.used: set[relax.Var] = set()
        self.checks: list[tuple[DFPattern, relax.Call]] = []
        """Calls whose attributes or ty_args the rewriter checks: (pattern, call written)."""

    def make(self) -> tuple[list[DFPattern], DFPattern, list[tuple[DFPattern, relax.Call]]]:
        body = self.func.body
        result = body.body
        ordered = [b for block in body.blocks for b in _ir.elements(block.bindings)]
        if (
            isinstance(result, relax.Tuple)
            and len(result.fields) == 0
            and ordered
            and _ir.is_void(ty(ordered[-1].var))
        ):
            result = ordered[-1].var  # a void pattern: its last binding is what it matches
        root = self.of(result)
        if any(root.same_as(p) for p in self.params):
            raise ValueError(
                "rule_from_module: 'pattern' returns one of its parameters, which would match "
                "any value; return the expression to match"
            )
        unmatched = [_ir.var_name(p) for p in self.func.params if p not in self.used]
        if unmatched:
            raise ValueError(
                f"rule_from_module: parameter(s) {', '.join(repr(n) for n in unmatched)} of "
                "'pattern' are not part of what it returns, so a match gives them no value; "
                "use them in the pattern or remove them from both functions"
            )
        unused = [_ir.var_name(b.var) for b in ordered if b.var not in self.used]
        if unused:
            raise ValueError(
                f"rule_from_module: binding(s) {', '.join(repr(n) for n in unused)} of 'pattern' "
                "are not part of what it returns; a pattern is the expression its function "
                "returns, so use them in it or remove them"
            )
        return self.params, root, self.checks

    def of(self, expr: relax.Expr) -> DFPattern:
        if isinstance(expr, relax.Var):
            self.used.add(expr)
            found = self.by_var.get(expr)
            if found is None:
                binding = self.bindings[expr]  # well formed: every var is a param or bound
                found = self.of(binding.value)
                if isinstance(binding, relax.MatchCast):
                    found = has_ty(found, ty(binding))
                self.by_var[expr] = found
            return found
        if isinstance(expr, relax.Call):
            op = expr.op
            if isinstance(op, tvm.ir.Op):
                callee: DFPattern = is_op(op.name)
            elif isinstance(op, relax.ExternFunc):
                callee = ExternFuncPattern(op.global_symbol)
            elif isinstance(op, relax.Var):
                callee = self.of(op)
            else:
                raise ValueError(
                    f"rule_from_module: 'pattern' calls {op}, a {type(op).__name__}; a pattern "
                    "may call ops, extern functions and its parameters only"
                )
            found = callee(*[self.of(arg) for arg in expr.args])
            if expr.attrs is not None or len(ty_args(expr)):
                self.checks.append((found, expr))
            return found
        if isinstance(expr, relax.ExternFunc):  # R.call_pure_packed("name", ...) holds one
            return ExternFuncPattern(expr.global_symbol)
        if isinstance(expr, relax.Tuple):
            return is_tuple([self.of(field) for field in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return is_tuple_get_item(self.of(expr.tuple_value), expr.index)
        if isinstance(expr, LITERALS):  # matched by structural equality
            return is_expr(expr)
        raise ValueError(
            f"rule_from_module: 'pattern' holds a {type(expr).__name__} ({expr}), which a pattern "
            "cannot match; use calls, extern functions, tuples, tuple items, constants and literals"
        )


# -- the rewriter ----------------------------------------------------------------------------


@mutator
class _Substitute(PyExprMutator):
    """Replace vars by what the map gives (the vars the builder emitted)."""

    def __init__(self, mapping: Mapping[relax.Var, relax.Expr]) -> None:
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.mapping.get(var, var)


class _Instantiate:
    """The rewriter of a rule made by :func:`rule_from_module`: emits the replacement's bindings."""

    def __init__(
        self,
        replacement: relax.Function,
        params: list[DFPattern],
        checks: list[tuple[DFPattern, relax.Call]],
    ) -> None:
        self.replacement = replacement
        self.params = params
        self.checks = checks
        self.__name__ = "replacement"

    def __call__(self, orig: relax.Expr, matchings: Mapping[DFPattern, relax.Expr], builder: relax.BlockBuilder):
        for pattern, written in self.checks:
            matched = matchings[pattern]
            op = getattr(written.op, "name", None) or str(written.op)
            if not tvm_ffi.structural_equal(matched.attrs, written.attrs):
                raise Decline(f"{op}: attributes {matched.attrs} differ from the pattern's {written.attrs}")
            if not tvm_ffi.structural_equal(ty_args(matched), ty_args(written), map_free_vars=True):
                raise Decline(
                    f"{op}: ty_args {list(ty_args(matched))} differ from the pattern's {list(ty_args(written))}"
                )
        # Fresh vars at every match: a var is defined once per function, and the replacement's
        # nested scopes (If branches, local functions) are copied whole.
        func = relax.utils.copy_with_new_vars(self.replacement)
        func = func.bind_params({param: matchings[p] for param, p in zip(func.params, self.params)})
        body = func.body
        bindings = [b for block in body.blocks for b in _ir.elements(block.bindings)]
        result = body.body
        last = bindings[-1] if bindings else None
        if (
            isinstance(last, relax.VarBinding)
            and (
                result.same_as(last.var)
                or (isinstance(result, relax.Tuple) and len(result.fields) == 0 and _ir.is_void(ty(last.var)))
            )
        ):
            bindings.pop()
            result = last.value  # the matched binding takes the last value: no `orig = w` binding
        emitted: dict[relax.Var, relax.Expr] = {}
        substitute = _Substitute(emitted)
        for binding in bindings:
            value = substitute.visit_expr(binding.value) if emitted else binding.value
            name = _ir.var_name(binding.var)
            name = "" if name == "_" else name  # TVMScript's name for a bare statement
            if isinstance(binding, relax.MatchCast):
                emitted[binding.var] = builder.match_cast(value, ty(binding), name)
            else:
                emitted[binding.var] = builder.emit(value, name)
        return substitute.visit_expr(result) if emitted else result
