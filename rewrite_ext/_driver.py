"""The fixed point: passes over each function until one changes nothing, then the verdict.

A pass that changed something is followed by another when what it
produced may match (the pass says so: ``PassResult.may_rematch``);
``max_iterations`` bounds the passes that may change something, and one
more pass must then change nothing.  Pure
bindings that matches saw through and that nothing reads any more are
dropped at the end.  Every changed result then goes through TVM's
well-formedness check (``_wellformed``).
"""

from __future__ import annotations

from collections.abc import Sequence
import tvm
import tvm_ffi
from tvm import relax

from . import _cleanup, _ir
from ._gc import cyclic_gc_paused
from ._builder import RewriterBuilder
from ._walker import NAMES_SHOWN, FunctionPass, RuleSet
from ._wellformed import Verdict, check_alone
from .compat import ret_ty
from .errors import RewriteError
from .report import Recorder, RewriteReport
from .rule import Rule


def apply(
    rules: Sequence[Rule],
    target: relax.Function | tvm.IRModule,
    max_iterations: int,
    report: RewriteReport | None = None,
    cleanup: bool = False,
) -> relax.Function | tvm.IRModule:
    """Rewrite ``target`` with ``rules`` to a fixed point and check the result.

    ``cleanup``: run TVM's cleanups (``_cleanup.cleanup``) after every pass that changed something.
    """
    if not isinstance(max_iterations, int) or isinstance(max_iterations, bool) or max_iterations < 1:
        raise ValueError(f"max_iterations must be a positive int, got {max_iterations!r}")
    if report is not None and not isinstance(report, RewriteReport):
        raise TypeError(f"report must be a rewrite_ext.RewriteReport, got {type(report).__name__}")
    ruleset = RuleSet(rules)
    recorder = Recorder.make(report)
    if report is not None:
        for rule in rules:
            report.rule(rule)  # every rule has a row, matched or not
    with cyclic_gc_paused():
        return _apply(ruleset, target, max_iterations, recorder, cleanup)


def _apply(
    ruleset: RuleSet,
    target: relax.Function | tvm.IRModule,
    max_iterations: int,
    recorder: Recorder | None,
    cleanup: bool,
) -> relax.Function | tvm.IRModule:
    if isinstance(target, relax.Function):
        check = Verdict()
        builder = RewriterBuilder()
        name = _ir.function_name(target)
        result = _rewrite_function(ruleset, target, name, builder, max_iterations, check, recorder, cleanup)
        if not result.same_as(target):
            added = _added_functions(builder, tvm.IRModule(), [result])
            if added:
                _refuse_added(added, name, ruleset, check)
            _verify(result, target, [name], ruleset, check)
        return result
    if isinstance(target, tvm.IRModule):
        check = Verdict()
        # One builder for every pass: its module is the target plus what rewriters added.
        builder = RewriterBuilder(target)
        functions = dict(target.functions_items())
        changed = []
        for gvar, func in target.functions_items():
            if isinstance(func, relax.Function):
                new_func = _rewrite_function(
                    ruleset, func, gvar.name_hint, builder, max_iterations, check, recorder, cleanup
                )
                if not new_func.same_as(func):
                    functions[gvar] = new_func
                    changed.append(gvar.name_hint)
        if not changed:
            return target  # as for a function: nothing rewritten, the very input
        functions.update(_added_functions(builder, target, list(functions.values())))
        new_mod = tvm.IRModule(functions, attrs=target.attrs, global_infos=target.global_infos)
        _check_signatures(target, new_mod, changed)
        _verify(new_mod, target, changed, ruleset, check)
        return new_mod
    raise TypeError(f"target must be a relax.Function or an IRModule, got {type(target).__name__}")


def _rewrite_function(
    rules: RuleSet,
    func: relax.Function,
    name: str,
    builder: RewriterBuilder,
    max_iterations: int,
    check: Verdict,
    recorder: Recorder | None,
    cleanup: bool,
) -> relax.Function:
    kept: set[tuple[int, int]] = set()
    interior: list[relax.Var] = []
    current = func
    for count in range(max_iterations + 1):
        result = FunctionPass(rules, name, builder, kept, check, recorder).run(current)
        if not result.changes:
            break
        if count == max_iterations:
            # A result that does not converge because it is not well formed is reported as such.
            _verify(result.func, func, [name], rules, check)
            shown = ", ".join(f"'{v}'" for v in result.changed_names)
            more = result.changes - len(result.changed_names)
            fix = (
                "Make the rewriter's output not match its own pattern"
                if len(rules.rules) == 1
                else "Make each rule's output match no rule's pattern (its own or another's)"
            )
            if result.kept_the_match:
                kept = ", ".join(f"'{v}'" for v in result.kept_the_match)
                fix = (
                    f"The rewrite of {kept} holds the very call that matched (as in "
                    "R.astype(orig, ...)), bound again before it, so it matches in every pass: build "
                    "the output from the parts in matchings instead. " + fix
                )
            raise RewriteError(
                f"rewrite_ext: in function '{name}', pattern {rules.description}: did not converge "
                f"after max_iterations={max_iterations} passes; bindings still matching: "
                f"{shown}{f' and {more} more' if more else ''}. {fix} (TVM's matcher also matches "
                "R.add and R.multiply with their operands swapped), or raise max_iterations. A "
                "rewriter that rebuilds the very computation it matched from new calls should "
                "return orig instead, or run with cleanup=True (TVM's rule: a pass whose cleaned "
                "result equals its input changed nothing)"
            )
        if cleanup:
            cleaned = _cleanup.cleanup(result.func)
            # TVM's rule: a pass whose cleaned result equals its input changed nothing (a
            # rewriter rebuilding an equal computation converges).
            if tvm_ffi.structural_equal(cleaned, current):
                break
            current = cleaned
        else:
            current = result.func
            interior.extend(result.interior)
            if not result.may_rematch:
                break  # nothing it made can match: a confirming pass would change nothing
    if recorder is not None:
        recorder.passes(name, count + 1)
    if interior:
        current = _ir.drop_unused_bindings(current, interior)
    return current


def _added_functions(
    builder: RewriterBuilder, known: tvm.IRModule, functions: Sequence[tvm.ir.BaseFunc]
) -> dict[tvm.ir.GlobalVar, tvm.ir.BaseFunc]:
    """The functions rewriters added to ``builder``'s module (``emit_te``, ``add_func``) that
    ``functions`` call, directly or through one another.

    A match declined after ``emit_te`` leaves its kernel in the builder's
    module, called by nothing: it is not added.
    """
    present = {hash(gvar) for gvar in known.get_global_vars()}
    added = {
        hash(gvar): (gvar, func)
        for gvar, func in builder.get().functions_items()
        if hash(gvar) not in present
    }
    found: dict[tvm.ir.GlobalVar, tvm.ir.BaseFunc] = {}
    pending = [f for f in functions if isinstance(f, relax.Function)]
    while added and pending:
        for callee in relax.analysis.all_global_vars(pending.pop()):
            entry = added.pop(hash(callee), None)
            if entry is not None:
                found[entry[0]] = entry[1]
                if isinstance(entry[1], relax.Function):
                    pending.append(entry[1])
    return found


def _refuse_added(
    added: dict[tvm.ir.GlobalVar, tvm.ir.BaseFunc], name: str, rules: RuleSet, check: Verdict
) -> None:
    """A rewritten relax.Function cannot carry the functions its rewriters added."""
    names = [gvar.name_hint for gvar in added]
    culprit = check.culprit_of(set(names))
    where = f"function '{name}', pattern {rules.description}"
    if culprit is not None:
        where = f"function '{culprit.function}', binding '{culprit.binding}', pattern {culprit.rule}"
    listed = ", ".join(f"'{n}'" for n in names)
    raise RewriteError(
        f"rewrite_ext: in {where}: the rewriter added the function(s) {listed} to the builder's "
        "module (builder.emit_te or builder.add_func), and a relax.Function has no module to hold "
        "them; rewrite the IRModule that holds the function, and they are added to it"
    )


def _check_signatures(old: tvm.IRModule, new: tvm.IRModule, changed: list[str]) -> None:
    """A rewritten function another function of the module calls must keep its return type.

    A rewrite may re-type the function's result (the var it returns); its callers' bindings
    keep the old type, which ``well_formed`` does not compare, and would get a value of another
    shape at run time.
    """
    callers: dict[str, list[str]] | None = None
    for name in changed:
        before, after = old[name], new[name]
        if tvm_ffi.structural_equal(ret_ty(before), ret_ty(after)):
            continue
        if callers is None:
            callers = {}
            for gvar, func in new.functions_items():
                if isinstance(func, relax.Function):
                    for callee in relax.analysis.all_global_vars(func):
                        # A recursive call counts: its binding keeps the old type too.
                        caller = gvar.name_hint
                        if callee.name_hint == caller:
                            caller = f"{caller} itself (a recursive call)"
                        callers.setdefault(callee.name_hint, []).append(caller)
        if name in callers:
            raise RewriteError(
                f"rewrite_ext: in function '{name}': the rewrite changed its return type from "
                f"{ret_ty(before)} to {ret_ty(after)}, but {', '.join(sorted(set(callers[name])))} "
                "call(s) it, and the bindings of those calls keep the old type; return a value "
                "of the old type (R.astype back to it, say)"
            )


def _verify(
    obj: relax.Function | tvm.IRModule,
    original: relax.Function | tvm.IRModule,
    names: list[str],
    rules: RuleSet,
    check: Verdict,
) -> None:
    """Raise RewriteError unless TVM finds ``obj`` well formed, naming the match at fault."""
    verdict = check.check(obj)
    if verdict is None:
        return
    said_by = "relax.analysis.well_formed says"
    input_verdict = check.check(original)
    if input_verdict is not None and isinstance(obj, tvm.IRModule):
        # A module ill formed before the rewrite (IRModule({"main": f}) with f's global_symbol
        # another name, say) says nothing of the rewrite: each rewritten function is judged
        # alone, and its GlobalVars against the module's.
        found = check_alone(obj, names, typed=bool(check.typed_reasons))
        if found is None:
            return
        name, verdict, said_by = found
        input_verdict = check.check(original[name])
    culprit = check.culprit(verdict)
    where = f"function '{', '.join(names)}', pattern {rules.description}"
    if culprit is not None:
        where = f"function '{culprit.function}', binding '{culprit.binding}', pattern {culprit.rule}"
    if input_verdict is not None:
        reading = f" (reading '{culprit.var}')" if culprit is not None else ""
        raise RewriteError(
            f"rewrite_ext: in {where}{reading}: the input is not well formed, so the rewrite cannot "
            f"be checked: {input_verdict}"
        )
    if culprit is not None and culprit.defines:
        what = (
            f"the rewriter emitted a binding of the var '{culprit.var}', which is already defined; "
            "builder.emit makes a fresh var"
        )
    elif culprit is not None and culprit.is_global:
        what = f"the rewriter called the GlobalVar '{culprit.var}', which the module does not define"
    elif culprit is not None:
        what = (
            f"the rewriter used the var '{culprit.var}', which is not defined where the binding "
            "stands; use the vars and values in matchings, or what builder.emit returned"
        )
    else:
        what = "; ".join(check.typed_reasons) or "TVM rejects it"
    raise RewriteError(
        f"rewrite_ext: in {where}: the result is not well formed: {what}. "
        f"{said_by}: {verdict}"
    )


__all__ = ["apply", "NAMES_SHOWN"]
