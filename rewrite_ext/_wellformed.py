"""Is the rewritten IR well formed?  TVM's check decides; the matches recorded name the culprit.

Every changed result goes through ``relax.analysis.well_formed``.  Without
its type checks it costs 0.2-0.8 us a binding on chains and VM-level IR
(its type checks cost 4-30: they infer the type of every call again), so
the types are checked only when a rewrite made something TVM's normalizer
did not type itself (a binding emitted with ``emit_normalized``, a var
re-typed with symbolic shapes): scoping, single definition, dataflow vars
and GlobalVars are what a rewriter can get wrong, and the untyped check
covers them.

TVM's message names a var, not a rewrite.  Each match is recorded (a tuple
append), and a failed verdict is put against the first match that read or
defined a var of the name TVM gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm
from tvm import relax

from . import _ir

# TVM names the offending var as "Var a is not defined.", "DataflowVar a ...",
# 'GlobalVar I.GlobalVar("g") ...'.
_NAMED_VAR = re.compile(r"\b(?:Var|DataflowVar|GlobalVar)(?:\(\")?\s*([^\s,.;:'\"()\[\]]+)")

# Values that may read vars below them; anything else without a var in it is a plain leaf
# (constants, prim values, strings, shapes, extern funcs, ops: their classes move between
# TVM versions, these do not).
_NESTED = {relax.Call, relax.If, relax.SeqExpr, relax.Function, relax.TupleGetItem}
_VAR_CLASSES = {relax.Var, relax.DataflowVar}


@dataclass
class Culprit:
    """The match a failed verdict is put against."""

    function: str
    binding: str
    rule: str
    var: str
    defines: bool
    """True when the match emitted a binding of the var, False when it read it."""
    is_global: bool
    """True when the var is a GlobalVar."""


@dataclass
class Verdict:
    """What the well-formedness verdict of one rewrite needs, gathered match by match."""

    matches: list[tuple[str, relax.Binding, str, list[relax.Binding], relax.Expr | None]] = field(
        default_factory=list
    )
    """(function, matched binding, rule description, emitted bindings, new value) of each match."""
    typed_reasons: list[str] = field(default_factory=list)
    """Why TVM's type checks must run too (at most 10 kept)."""

    def record(
        self,
        function: str,
        binding: relax.Binding,
        rule: str,
        emitted: list[relax.Binding],
        new_value: relax.Expr | None,
    ) -> None:
        """Note a match, should the verdict need to name it."""
        self.matches.append((function, binding, rule, emitted, new_value))

    def defer(self, reason: str) -> None:
        """Make TVM check the types of the result too."""
        if len(self.typed_reasons) < 10:
            self.typed_reasons.append(reason)

    def check(self, obj: relax.Function | tvm.IRModule) -> str | None:
        """TVM's verdict on ``obj``: None when it is well formed, else TVM's message."""
        return full_check(obj, typed=bool(self.typed_reasons))

    def culprit(self, verdict: str) -> Culprit | None:
        """The first match that defined (for a var "defined more than once") or read a var the
        message ``verdict`` names; a name several vars share goes to the first match using one.
        """
        return self.culprit_of(set(_NAMED_VAR.findall(verdict)), "more than once" in verdict)

    def culprit_of(self, names: set[str], defined: bool = False) -> Culprit | None:
        """The first match that defined (``defined``) or else read a var of one of ``names``."""
        if not names:
            return None
        if defined:
            for function, binding, rule, emitted, _ in self.matches:
                for extra in emitted:
                    name = _ir.var_name(extra.var)
                    if name in names:
                        return Culprit(function, _ir.binding_label(binding), rule, name, True, False)
        for function, binding, rule, emitted, new_value in self.matches:
            for value in [*(extra.value for extra in emitted), new_value]:
                for var in reads(value) if value is not None else ():
                    name = _ir.var_name(var)
                    if name in names:
                        is_global = type(var) is relax.GlobalVar
                        return Culprit(function, _ir.binding_label(binding), rule, name, False, is_global)
        return None


def check_alone(mod: tvm.IRModule, names: list[str], typed: bool = True) -> tuple[str, str, str] | None:
    """The first function of ``names`` TVM rejects on its own, or that calls a GlobalVar ``mod``
    does not define: (its name, the verdict, who says it); None when there is none.

    For a module TVM rejects as a whole already (``IRModule({"main": f})``
    with ``f``'s ``global_symbol`` another name): its functions can still be judged.
    """
    defined = {hash(gvar) for gvar in mod.get_global_vars()}
    for name in names:
        func = mod[name]
        verdict = full_check(func, typed)
        if verdict is not None:
            return name, verdict, "relax.analysis.well_formed of the function alone says"
        missing = [g.name_hint for g in relax.analysis.all_global_vars(func) if hash(g) not in defined]
        if missing:
            return name, f"GlobalVar {missing[0]} is not defined.", "checked against the module's GlobalVars"
    return None


def reads(value: relax.Expr) -> list[relax.Var | relax.GlobalVar]:
    """The vars and GlobalVars ``value`` reads."""
    found = [v for v in relax.analysis.free_vars(value) if type(v) in _VAR_CLASSES]
    found.extend(relax.analysis.all_global_vars(value))
    return found


def full_check(obj: relax.Function | tvm.IRModule, typed: bool = True) -> str | None:
    """TVM's verdict: None when ``obj`` is well formed, else TVM's message.

    ``typed`` False skips TVM's type checks (passed by position: the keyword
    is ``check_struct_info`` in TVM 0.25, ``check_ty`` later).
    """
    try:
        verdict = relax.analysis.well_formed(obj, typed)
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        return str(exc)
    # TVM 0.27 returns None and raises; earlier versions may return a bool.
    return "relax.analysis.well_formed returned False" if verdict is False else None
