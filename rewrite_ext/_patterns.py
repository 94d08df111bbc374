"""Stateless facts about a DFPattern that the traversal uses to skip work."""

from __future__ import annotations

import re

from collections.abc import Iterator

from tvm import ir
from tvm.relax.dpl import pattern as P
from .compat import TypePattern

# Patterns that only constrain what they wrap: the wrapped pattern decides the root op.
_WRAPPERS = (TypePattern, P.DataTypePattern, P.ShapePattern, P.AttrPattern)
# Patterns that match a leaf without looking through a var's binding.
_LEAVES = (P.WildcardPattern, P.VarPattern, P.GlobalVarPattern, P.ExternFuncPattern)


ANY_GLOBAL_VAR = "a call of a GlobalVar"
"""Stands in ``root_ops`` for calls of any GlobalVar (a ``GlobalVarPattern`` callee)."""


def root_ops(pattern: P.DFPattern) -> frozenset[ir.Op | str] | None:
    """The operators a binding value must call for ``pattern`` to match it.

    Parameters
    ----------
    pattern : DFPattern
        The pattern whose root is examined.

    Returns
    -------
    ops : Optional[FrozenSet[Union[tvm.ir.Op, str]]]
        The possible root ops (``ANY_GLOBAL_VAR`` for a call of any
        GlobalVar), or None when the root is not restricted to calls of
        known ops (a wildcard, a tuple, a call of an arbitrary callee), in
        which case every binding is a candidate.
    """
    if isinstance(pattern, P.CallPattern):
        callee = pattern.op
        if isinstance(callee, P.ExprPattern) and isinstance(callee.expr, ir.Op):
            return frozenset([callee.expr])
        if isinstance(callee, P.GlobalVarPattern):
            return frozenset([ANY_GLOBAL_VAR])
        return None
    if isinstance(pattern, P.OrPattern):
        left, right = root_ops(pattern.left), root_ops(pattern.right)
        return None if left is None or right is None else left | right
    if isinstance(pattern, P.AndPattern):
        left, right = root_ops(pattern.left), root_ops(pattern.right)
        if left is None or right is None:
            return left if right is None else right
        return left & right
    if isinstance(pattern, _WRAPPERS):
        return root_ops(pattern.pattern)
    return None


def needs_bindings(pattern: P.DFPattern) -> bool:
    """Whether matching ``pattern`` may have to look through a var to its value.

    A call pattern whose arguments are all leaves (wildcards, var patterns)
    matches the vars themselves, so the matcher needs no var-to-value map.
    Anything deeper may see through bindings, as TVM's matcher does.
    """
    if isinstance(pattern, _WRAPPERS):
        return needs_bindings(pattern.pattern)
    if isinstance(pattern, (P.OrPattern, P.AndPattern)):
        return needs_bindings(pattern.left) or needs_bindings(pattern.right)
    if isinstance(pattern, P.CallPattern):
        if not isinstance(pattern.op, P.ExprPattern) and not _is_leaf(pattern.op):
            return True
        # args None (``varg_default_wildcard``) matches any arguments without looking at them
        args = pattern.args
        return args is not None and not all(_is_leaf(arg) for arg in args)
    return True


_DEPTH_ONE = (
    P.WildcardPattern,
    P.VarPattern,
    P.GlobalVarPattern,
    P.ExternFuncPattern,
    P.ConstantPattern,
    P.ExprPattern,
    P.PrimArrPattern,
)


def lookup_depth(pattern: P.DFPattern) -> int | None:
    """How many levels of var-to-value lookups matching ``pattern`` can take.

    TVM's matcher replaces a var by its bound value (following var-to-var
    chains) each time it visits a sub-pattern, then matches that
    sub-pattern's children against the value's children: a pattern nested
    ``d`` levels deep looks up vars at most ``d`` levels down from the
    matched expression.  None for a pattern this does not know (a
    ``FunctionPattern``, or a new kind): any binding may be looked up.
    """
    if isinstance(pattern, _WRAPPERS):
        return lookup_depth(pattern.pattern)
    if isinstance(pattern, (P.OrPattern, P.AndPattern)):
        return _deepest([pattern.left, pattern.right], 0)
    if isinstance(pattern, P.NotPattern):
        return lookup_depth(pattern.reject)
    if isinstance(pattern, P.CallPattern):
        return _deepest([pattern.op, *(pattern.args or [])], 1)
    if isinstance(pattern, (P.TuplePattern, P.UnorderedTuplePattern)):
        return _deepest(list(pattern.fields), 1)
    if isinstance(pattern, P.TupleGetItemPattern):
        return _deepest([pattern.tuple], 1)
    if isinstance(pattern, _DEPTH_ONE):
        return 1
    return None


def _deepest(children: list[P.DFPattern], extra: int) -> int | None:
    depth = 0
    for child in children:
        child_depth = lookup_depth(child)
        if child_depth is None:
            return None
        depth = max(depth, child_depth)
    return max(depth + extra, 1)


def _is_leaf(pattern: P.DFPattern) -> bool:
    if isinstance(pattern, _WRAPPERS):
        return _is_leaf(pattern.pattern)
    return isinstance(pattern, _LEAVES)


#: Levels of a pattern ``describe`` prints; deeper ones are "...".
_DESCRIBED_DEPTH = 6


def describe(pattern: P.DFPattern, depth: int = 0) -> str:
    """A short, readable rendering of a pattern for error messages.

    TVM's own ``repr`` prints every field of every Op; this prints
    ``relax.add(*, relax.exp(*))``, down to a few levels.
    """
    if depth > _DESCRIBED_DEPTH:
        return "..."
    deeper = depth + 1
    if isinstance(pattern, P.CallPattern):
        args = "..." if pattern.args is None else ", ".join(describe(a, deeper) for a in pattern.args)
        return f"{describe(pattern.op, deeper)}({args})"
    if isinstance(pattern, P.ExprPattern):
        expr = pattern.expr
        return expr.name if isinstance(expr, ir.Op) else type(expr).__name__
    if isinstance(pattern, P.WildcardPattern):
        return "*"
    if isinstance(pattern, P.OrPattern):
        return f"({describe(pattern.left, deeper)} | {describe(pattern.right, deeper)})"
    if isinstance(pattern, P.AndPattern):
        return f"({describe(pattern.left, deeper)} & {describe(pattern.right, deeper)})"
    if isinstance(pattern, _WRAPPERS):
        return describe(pattern.pattern, depth)
    if isinstance(pattern, P.TuplePattern):
        return "(" + ", ".join(describe(f, deeper) for f in pattern.fields) + ")"
    if isinstance(pattern, P.GlobalVarPattern):
        # The name is not a field TVM exposes; its printing shows it: GlobalVarPattern(add).
        named = re.fullmatch(r"GlobalVarPattern\((.*)\)", str(pattern))
        return "@" + ((named.group(1) if named else "") or "*")
    return type(pattern).__name__


def alternatives(
    pattern: P.DFPattern, enclosing: tuple[P.DFPattern, ...] = ()
) -> Iterator[tuple[P.DFPattern, tuple[P.DFPattern, ...]]]:
    """The alternatives of a top-level OrPattern, left to right, each with its enclosing Ors.

    TVM's rewriter splits ``a | b`` into two rewriters and still lets the
    rewriter look up ``matchings[a | b]``; the enclosing Or nodes are kept
    so that lookup keeps working.
    """
    # A stack, not recursion: an Or of many alternatives nests as deep as it has them.
    stack = [(pattern, enclosing)]
    while stack:
        pattern, enclosing = stack.pop()
        if isinstance(pattern, P.OrPattern):
            inner = (*enclosing, pattern)
            stack.append((pattern.right, inner))
            stack.append((pattern.left, inner))
        else:
            yield pattern, enclosing
