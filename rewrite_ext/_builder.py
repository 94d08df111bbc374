"""The BlockBuilder a rewriter receives: TVM's own, with two guards.

While a rewriter runs, what it emits goes to a frame of its own, opened
at its first emit, so everything emitted can be checked (and dropped with
a declined match) before it lands.  A rewriter that emits nothing, the
common 1:1 case, costs no frame.
Opening or closing frames or scopes would tear the traversal's frames
apart (an ``end_scope`` there ends in a segmentation fault), so those
calls raise instead.  And an expression the rewriter emits or returns that
*is* a value bound earlier in the block (TVM's matcher hands out bound
values) is replaced by that binding's var, so nothing is computed twice.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from . import _ir
from ._wellformed import full_check

_FRAME_METHODS = (
    "_begin_dataflow_block",
    "_begin_binding_block",
    "_end_block",
    "begin_scope",
    "end_scope",
    "function",
    "dataflow",
    "testing_scope",
    "emit_func_output",
    "finalize",
)


class BuilderMisuse(Exception):  # noqa: N818
    """A rewriter called a builder method that opens or closes a frame or scope."""


class RewriterBuilder(relax.BlockBuilder):
    """TVM's BlockBuilder, guarded while a rewriter holds it (see the module docstring)."""

    def __init__(self, mod: Any = None) -> None:
        super().__init__(mod)
        self.bound: dict[int, relax.Var] | None = None
        """While a rewriter runs: hash of each value bound earlier -> its var; else None."""
        self.lent = False
        """True while a rewriter runs."""
        self.raw_emits = False
        """Set when the rewriter called ``emit_normalized`` (reset for each rewriter call)."""
        self.opened = False
        """True once the rewriter's frame is open."""
        self._dataflow = False

    # The traversal's side: lend the builder to one rewriter call, then take it back.
    def lend(self, is_dataflow: bool, bound: dict[int, relax.Var] | None) -> None:
        """Hand the builder to a rewriter; its frame opens at its first emit."""
        self.lent, self.bound, self.raw_emits = True, bound, False
        self.opened, self._dataflow = False, is_dataflow

    def open_frame(self) -> None:
        """Open the rewriter's frame, if not yet open."""
        if not self.opened:
            self.opened = True
            self.begin_frame(self._dataflow)

    def reclaim(self) -> list[relax.Binding]:
        """Take the builder back: the bindings emitted in the rewriter's frame."""
        self.lent, self.bound = False, None
        if not self.opened:
            return []
        self.opened = False
        return _ir.elements(self.end_frame().bindings)

    # The traversal's own frame handling: the guarded methods, unguarded.
    def begin_frame(self, is_dataflow: bool) -> None:
        if is_dataflow:
            _ir.begin_dataflow_block(self)
        else:
            _ir.begin_binding_block(self)

    def end_frame(self) -> relax.BindingBlock:
        return _ir.end_block(self)

    def use_vars(self, expr: relax.Expr) -> relax.Expr:
        """``expr`` with every value bound earlier (the very object) replaced by its var."""
        return expr if not self.bound else _ir.replace_bound(expr, self.bound)

    def emit(self, expr: relax.Expr, name_hint: str = "") -> relax.Var:  # noqa: D102
        if self.lent:
            self.open_frame()
        return super().emit(self.use_vars(expr), name_hint)

    def match_cast(self, value: relax.Expr, ty: Any, name_hint: str = "") -> relax.Var:  # noqa: D102
        if self.lent:
            self.open_frame()
        return super().match_cast(self.use_vars(value), ty, name_hint)

    def emit_output(self, output: Any, name_hint: str = "") -> relax.Var:  # noqa: D102
        if self.lent:
            self.open_frame()
        if isinstance(output, relax.Expr):
            output = self.use_vars(output)
        return super().emit_output(output, name_hint)

    def normalize(self, expr: relax.Expr) -> relax.Expr:  # noqa: D102
        if self.lent:
            self.open_frame()  # normalizing a nested value emits its parts
        return super().normalize(self.use_vars(expr))

    def add_func(self, func: Any, func_name: str) -> Any:  # noqa: D102
        if self.lent and isinstance(func, relax.Function):
            # Checked here, where the rewriter that added it can still be named: the whole
            # result's check would blame the function being rewritten.
            verdict = full_check(func)
            if verdict is not None:
                raise BuilderMisuse(
                    f"the rewriter added a function as '{func_name}' (builder.add_func) that is "
                    f"not well formed: {verdict}"
                )
        return super().add_func(func, func_name)

    def update_func(self, gv: Any, updated_func: Any) -> None:  # noqa: D102
        if self.lent:
            raise BuilderMisuse(
                "the rewriter called builder.update_func(), which would replace a function of the "
                "module being rewritten behind the traversal's back; rewrite that function with a "
                "rule of its own, or add a new one with builder.add_func"
            )
        super().update_func(gv, updated_func)

    def emit_normalized(self, binding: relax.Binding) -> None:  # noqa: D102
        # A binding built by hand may re-bind a var defined elsewhere: only the full
        # well-formedness check can tell, so the traversal is told to run it.
        if self.lent:
            self.open_frame()
            self.raw_emits = True
        super().emit_normalized(binding)


def _guarded(name: str):
    method = getattr(relax.BlockBuilder, name)

    def guarded(self: RewriterBuilder, *args: Any, **kwargs: Any) -> Any:
        if self.lent:
            raise BuilderMisuse(
                f"the rewriter called builder.{name}(), which opens or closes a block or scope "
                "of the builder the traversal is emitting into; emit bindings with "
                "builder.emit(...) (or emit_te, match_cast, emit_normalized) only"
            )
        return method(self, *args, **kwargs)

    guarded.__name__ = name
    guarded.__doc__ = method.__doc__
    return guarded


for _name in _FRAME_METHODS:
    setattr(RewriterBuilder, _name, _guarded(_name))

