"""Property tests of rewrite_call and copy_to_dma over generated IR (rewrite_ext.testing.strategies).

1. Generated rewriters, two- and three-argument, on generated functions: the output is well
   formed, exactly the expected bindings changed (counted per op), the input is unchanged,
   and ``check_rewrite`` holds.  A rewriter whose output matches its own pattern fails with
   "did not converge" and leaves the input alone.
2. Two-argument rewriters agree with TVM's ``relax.dpl.rewrite_call``: structurally, on pure
   dataflow functions that TVM's cleanups leave as they are; on the VM, on any function.
3. ``copy_to_dma`` on generated lowered functions: one dma_copy and one dma_wait per copy,
   each wait before anything else touches the copy's tensors, and the same results as the
   original under ``cpu_dma()``.

4. The example module of docs/testing.md passes.

Example counts follow the loaded profile (tests/conftest.py: ``ci`` by default, 25;
``--hypothesis-profile=thorough``, 2,000): four times that for properties that only rewrite,
half of it for those that build and run a module on the VM.  A failure of rewrite_ext found
here belongs in tests/test_rewrite.py or tests/test_hexagon_dma.py as a plain regression test.
"""

from __future__ import annotations

import re
import runpy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tvm
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R

from _helpers import (
    Snapshot,
    all_bindings,
    assert_same_results,
    binding_kinds,
    dtype_of,
    for_this_tvm,
    equal,
    is_float,
    op_name,
    random_inputs,
    run_together,
    shape_of,
    tvm_cleanups,
)
from rewrite_ext import RewriteError, RewriteReport, rewrite_call
from rewrite_ext.hexagon import DMA_COPY, DMA_WAIT, copy_to_dma
from rewrite_ext.testing import check_rewrite
from rewrite_ext.testing.strategies import lowered_copy_functions, relax_functions
from rewrite_ext.compat import imm_value, ret_ty

# ---------------------------------------------------------------------------------------------
# Generated rewriters
# ---------------------------------------------------------------------------------------------

# The elementwise ops relax_functions generates, per dtype class (exp, sqrt... are float-only in
# Relax, bitwise ops integer-only).
FLOAT_UNARY = ("exp", "negative", "abs", "tanh", "sigmoid", "sin", "floor", "square", "sqrt")
INT_UNARY = ("negative", "abs", "square", "bitwise_not")
FLOAT_BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "divide")
INT_BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "bitwise_and", "bitwise_xor")
UNARY = tuple(dict.fromkeys(FLOAT_UNARY + INT_UNARY))
BINARY = tuple(dict.fromkeys(FLOAT_BINARY + INT_BINARY))


def _make(name: str, *args: relax.Expr) -> relax.Call:
    return getattr(relax.op, name)(*args)


@dataclass(frozen=True)
class Recipe:
    """A rewriter for ``is_op(target)(*wildcards)``, drawn by hypothesis (so it prints and shrinks).

    A match ``target(x, ...)`` becomes, for the matched call's dtype class:

    * (three-argument form) ``emit`` unary ops emitted through the builder, chained on ``x``:
      ``e1 = u1(x); e2 = u2(e1); ...``; the returned call reads the last one if
      ``use_emitted``;
    * the returned call: ``replacement(w2(w1(x')), ...)`` where ``w1, w2`` are the ``wrap``
      unary ops (nested calls, which normalization binds) and ``replacement`` is an op of the
      target's arity.

    Every op is drawn from the ops valid for the dtype, without ``target``, so the output
    never matches the pattern again.  ``decline`` makes the rewriter decline int matches or
    rank-1 matches (returning None or the matched call): a property of the binding's type,
    which a rewrite never changes, so a declined binding is declined in every pass.
    """

    target: str
    form: int  # 2: rewriter(orig, m); 3: rewriter(orig, m, builder)
    replacement: int
    wrap: tuple[int, ...]
    emit: tuple[int, ...]
    use_emitted: bool
    decline: str | None  # None, "int" or "rank1"
    decline_with_none: bool  # decline by returning None rather than the matched call

    @property
    def arity(self) -> int:
        return 2 if self.target in BINARY else 1

    def pattern_and_wildcards(self):
        args = [wildcard() for _ in range(self.arity)]
        return is_op(f"relax.{self.target}")(*args), args

    def declines(self, call: relax.Expr) -> bool:
        if self.decline == "int":
            return not is_float(dtype_of(call))
        if self.decline == "rank1":
            return len(shape_of(call)) == 1
        return False

    def _ops(self, dtype: str, arity: int) -> list[str]:
        if arity == 1:
            table = FLOAT_UNARY if is_float(dtype) else INT_UNARY
        else:
            table = FLOAT_BINARY if is_float(dtype) else INT_BINARY
        return [name for name in table if name != self.target]

    def plan(self, dtype: str) -> tuple[list[str], list[str], str]:
        """The ops emitted, the ops wrapped around the first argument, the replacement op."""
        unary = self._ops(dtype, 1)
        emitted = [unary[c % len(unary)] for c in self.emit] if self.form == 3 else []
        wrapped = [unary[c % len(unary)] for c in self.wrap]
        table = self._ops(dtype, self.arity)
        return emitted, wrapped, table[self.replacement % len(table)]

    def produced(self, dtype: str) -> list[str]:
        """Every op one accepted rewrite adds: each is one binding of the output."""
        emitted, wrapped, replacement = self.plan(dtype)
        return [*emitted, *wrapped, replacement]

    def rewriter(self, wildcards) -> Callable[..., relax.Expr | None]:
        def rewrite(orig, matchings, builder=None):
            if self.declines(orig):
                return None if self.decline_with_none else orig
            emitted, wrapped, replacement = self.plan(dtype_of(orig))
            args = [matchings[w] for w in wildcards]
            first = last = args[0]
            for name in emitted:
                last = builder.emit(_make(name, last))
            if self.use_emitted:
                first = last
            for name in wrapped:
                first = _make(name, first)
            return _make(replacement, first, *args[1:])

        if self.form == 3:
            return lambda orig, matchings, builder: rewrite(orig, matchings, builder)
        return lambda orig, matchings: rewrite(orig, matchings)


def elementwise_ops(func: relax.Function) -> list[str]:
    """The elementwise ops bound anywhere in ``func``, sorted (so a draw from it replays)."""
    return sorted({name for name in binding_kinds(func) if name in UNARY or name in BINARY})


@st.composite
def recipes(draw, func: relax.Function, forms=(2, 3)) -> Recipe:
    present = elementwise_ops(func)
    # An op the function binds; any op (matched nowhere) when it binds none.
    target = draw(st.sampled_from(present) if present else st.sampled_from(UNARY + BINARY))
    form = draw(st.sampled_from(forms))
    choice = st.integers(0, 15)
    return Recipe(
        target=target,
        form=form,
        replacement=draw(choice),
        wrap=tuple(draw(st.lists(choice, max_size=2))),
        emit=tuple(draw(st.lists(choice, max_size=3))) if form == 3 else (),
        use_emitted=draw(st.booleans()),
        decline=draw(st.sampled_from([None, None, "int", "rank1"])),  # mostly accept
        decline_with_none=draw(st.booleans()),
    )


def target_bindings(func: relax.Function, recipe: Recipe) -> list[relax.Binding]:
    return [b for b in all_bindings(func) if op_name(b.value) == recipe.target]


def expected_kinds(func: relax.Function, recipe: Recipe) -> tuple[Counter, int]:
    """The bindings per kind after the rewrite, and how many matches are accepted."""
    kinds = binding_kinds(func)
    accepted = 0
    for binding in target_bindings(func, recipe):
        if recipe.declines(binding.value):
            continue
        accepted += 1
        kinds[recipe.target] -= 1
        kinds.update(recipe.produced(dtype_of(binding.value)))
    return +kinds, accepted


# ---------------------------------------------------------------------------------------------
# 1. Generated rewriters keep every generated function well formed and change what they should
# ---------------------------------------------------------------------------------------------

# Settings relative to the profile (tests/conftest.py: ci 25 examples, thorough 2,000), read when
# this module is imported, after pytest has loaded the profile.  Rewriting without building
# takes milliseconds per example: four times the profile's examples.  Each VM example builds a
# module (0.03-0.2 s for these small functions, ~1 s for large ones): half of them.
PROFILE_EXAMPLES = settings().max_examples
MORE_EXAMPLES = settings(max_examples=4 * PROFILE_EXAMPLES)
VM_EXAMPLES = settings(max_examples=max(3, PROFILE_EXAMPLES // 2))

FUNCTIONS = relax_functions(max_bindings=20)


def size_event(func: relax.Function) -> None:
    n = len(all_bindings(func))
    event(f"bindings: {'1-4' if n < 5 else '5-14' if n < 15 else '15+'}")


@MORE_EXAMPLES
@given(FUNCTIONS, st.data())
def test_generated_rewriters_rewrite_exactly_their_matches(func, data):
    recipe = data.draw(recipes(func), label="recipe")
    as_module = data.draw(st.booleans(), label="as_module")
    pattern, wildcards = recipe.pattern_and_wildcards()
    target = tvm.IRModule({"main": func}) if as_module else func
    before = Snapshot.of(target)
    expected, accepted = expected_kinds(func, recipe)
    event(f"accepted matches: {min(accepted, 3)}{'+' if accepted >= 3 else ''}")
    size_event(func)

    passes = RewriteReport()
    result = rewrite_call(pattern, recipe.rewriter(wildcards), target, report=passes)

    before.assert_unchanged(target)
    relax.analysis.well_formed(result)
    out = result["main"] if as_module else result
    kinds = binding_kinds(out)
    # Declined matches stay, accepted ones are gone: the output never binds the target op.
    declined = len(target_bindings(func, recipe)) - accepted
    assert kinds[recipe.target] == declined
    # Each accepted match became exactly the bindings the rewriter produced; nothing else changed.
    assert kinds == expected, out.script()
    if accepted == 0:
        assert out.same_as(func)
    assert out.is_pure == func.is_pure and len(out.params) == len(func.params)
    assert equal(ret_ty(out), ret_ty(func))

    report = check_rewrite(pattern, recipe.rewriter(wildcards), target, run=False)  # ops are swapped on purpose
    assert report.rewrites == accepted
    # One pass offers every match. Nothing it makes can match (the ops it adds are not the
    # target, and keep the types), so no second pass offers the declined ones again.
    assert list(passes.passes.values()) == [1]
    assert report.calls == len(target_bindings(func, recipe))
    assert report.output_matches == (declined > 0)
    assert equal(report.output, result)


@MORE_EXAMPLES
@given(FUNCTIONS, st.data())
def test_a_rewriter_matching_its_own_output_does_not_converge_and_changes_nothing(func, data):
    recipe = data.draw(recipes(func), label="recipe")
    pattern, wildcards = recipe.pattern_and_wildcards()

    def again(orig, matchings, builder=None):
        # target(x, ...) -> target(target(x, ...), ...): every rewrite makes two new matches.
        if recipe.declines(orig):
            return None
        args = [matchings[w] for w in wildcards]
        inner = _make(recipe.target, *args)
        if builder is not None:
            inner = builder.emit(inner)
        return _make(recipe.target, inner, *args[1:])

    if recipe.form == 3:
        rewriter = lambda orig, matchings, builder: again(orig, matchings, builder)  # noqa: E731
    else:
        rewriter = lambda orig, matchings: again(orig, matchings)  # noqa: E731
    before = Snapshot.of(func)
    _, accepted = expected_kinds(func, recipe)
    if accepted == 0:
        assert rewrite_call(pattern, rewriter, func, max_iterations=3).same_as(func)
        return
    with pytest.raises(RewriteError, match="did not converge after max_iterations=3"):
        rewrite_call(pattern, rewriter, func, max_iterations=3)
    before.assert_unchanged(func)


# ---------------------------------------------------------------------------------------------
# 2. Two-argument rewriters agree with TVM's rewrite_call
# ---------------------------------------------------------------------------------------------

# Pure functions of one block, with no If, local function or tuple.
DATAFLOW_FUNCTIONS = relax_functions(
    max_bindings=10, allow_if=False, allow_nested=False, allow_tuples=False
)


def in_tvm_scope(func: relax.Function) -> relax.Function:
    """``func`` made into the case where TVM's rewrite_call is comparable, or rejected.

    TVM's rewrite_call runs CanonicalizeBindings, EliminateCommonSubexpr and RemoveAllUnused
    after every round, so its output equals ours only on input those leave alone: the generated
    function is made a dataflow function (``ConvertToDataflow``, when drawn without a
    DataflowBlock) and put through them once (which drops unused bindings and merges repeated
    ones), and kept if a second time changes nothing and it is one DataflowBlock.
    """
    if not any(isinstance(block, relax.DataflowBlock) for block in func.body.blocks):
        func = relax.transform.ConvertToDataflow(min_size=1)(tvm.IRModule({"main": func}))["main"]
    func = tvm_cleanups(func)
    assume(equal(tvm_cleanups(func), func))
    assume(len(func.body.blocks) == 1 and isinstance(func.body.blocks[0], relax.DataflowBlock))
    assume(func.is_pure)
    return func


@MORE_EXAMPLES
@given(DATAFLOW_FUNCTIONS, st.data())
def test_two_argument_rewriters_give_tvms_result_on_clean_dataflow_functions(func, data):
    func = in_tvm_scope(func)
    recipe = data.draw(recipes(func, forms=(2,)), label="recipe")
    pattern, wildcards = recipe.pattern_and_wildcards()
    _, accepted = expected_kinds(func, recipe)
    event(f"accepted matches: {min(accepted, 3)}{'+' if accepted >= 3 else ''}")

    ours = rewrite_call(pattern, recipe.rewriter(wildcards), func)
    theirs = relax.dpl.rewrite_call(pattern, recipe.rewriter(wildcards), func)

    if equal(tvm_cleanups(ours), ours):
        tvm.ir.assert_structural_equal(ours, theirs)
    else:
        # The rewrite itself made something TVM's cleanups act on (two bindings become equal
        # when add is swapped for a multiply that is already there): TVM merges them, rewrite_ext
        # keeps both (docs/guide.md, "Differences"), and the rest is the same.
        event("our output holds a common subexpression")
        tvm.ir.assert_structural_equal(tvm_cleanups(ours), theirs)


@VM_EXAMPLES
@given(relax_functions(max_bindings=12), st.data(), st.integers(0, 2**16))
def test_two_argument_rewriters_compute_what_tvms_computes(func, data, seed):
    recipe = data.draw(recipes(func, forms=(2,)), label="recipe")
    pattern, wildcards = recipe.pattern_and_wildcards()
    ours = rewrite_call(pattern, recipe.rewriter(wildcards), func)
    theirs = relax.dpl.rewrite_call(pattern, recipe.rewriter(wildcards), func)
    relax.analysis.well_formed(theirs)
    event("structurally equal" if equal(ours, theirs) else "structurally different")
    size_event(func)
    results = run_together({"ours": ours, "theirs": theirs}, random_inputs(func, seed))
    assert_same_results(results["ours"], results["theirs"])


# ---------------------------------------------------------------------------------------------
# 3. copy_to_dma on lowered functions
# ---------------------------------------------------------------------------------------------


def builtin_args(binding: relax.Binding) -> list[relax.Expr]:
    return list(binding.value.args[1].fields)


def dma_schedule_violations(func: relax.Function) -> list[str]:
    """Where a dma_copy's tensors are touched before its wait, in words (empty: none).

    The wait of a ``dma_copy(src, dst, queue, ...)`` is the first later
    ``dma_wait(queue, 0, ...)``: it leaves nothing in flight on the queue.  Until it, no other
    binding may read or write ``dst`` (the engine is writing it) or write ``src`` (the engine
    reads it asynchronously).  ``ensure_zero_offset(t)`` is a view of ``t``, so reading it
    reads ``t``.  The wait must also carry ``src`` and ``dst`` (keeping them alive).
    """
    bindings = [b for block in func.body.blocks for b in block.bindings]
    root: dict = {}

    def base(expr):
        return root.get(expr, expr)

    def reads_writes(binding) -> tuple[set, set]:
        name = op_name(binding.value)
        if name == "memory.ensure_zero_offset":
            root[binding.var] = base(binding.value.args[0])
        if name in (DMA_COPY, DMA_WAIT):
            args = [a for a in builtin_args(binding) if isinstance(a, relax.Var)]
        else:
            args = list(relax.analysis.free_vars(binding.value))
        if name == DMA_COPY:
            return {base(args[0])}, {base(args[1])}
        if name == "vm.copy_tensor":
            return {base(args[0])}, {base(args[1])}
        return {base(a) for a in args}, set()

    effects = [reads_writes(b) for b in bindings]
    problems = []
    for i, binding in enumerate(bindings):
        if op_name(binding.value) != DMA_COPY:
            continue
        src, dst, queue = builtin_args(binding)[:3]
        wait = next(
            (
                j
                for j in range(i + 1, len(bindings))
                if op_name(bindings[j].value) == DMA_WAIT
                and imm_value(builtin_args(bindings[j])[0]) == imm_value(queue)
                and imm_value(builtin_args(bindings[j])[1]) == 0
            ),
            None,
        )
        if wait is None:
            problems.append(f"binding {i}: dma_copy({src}, {dst}) is never waited for")
            continue
        if not {src, dst} <= set(builtin_args(bindings[wait])[3:]):
            problems.append(f"binding {wait}: the wait for dma_copy({src}, {dst}) does not carry them")
        for k in range(i + 1, wait):
            reads, writes = effects[k]
            if base(dst) in reads | writes or base(src) in writes:
                problems.append(f"binding {k} touches {src} or {dst} before their wait (binding {wait})")
    return problems


def count_ops(func: relax.Function, *names: str) -> list[int]:
    kinds = binding_kinds(func)
    return [kinds[name] for name in names]


@MORE_EXAMPLES
@given(lowered_copy_functions())
def test_copy_to_dma_waits_for_every_copy_before_its_tensors_are_touched(mod):
    before = Snapshot.of(mod)
    (copies,) = count_ops(mod["main"], "vm.copy_tensor")
    out = copy_to_dma(mod)
    before.assert_unchanged(mod)
    relax.analysis.well_formed(out)
    assert count_ops(out["main"], "vm.copy_tensor", DMA_COPY, DMA_WAIT) == [0, copies, copies]
    assert dma_schedule_violations(out["main"]) == []
    # Nothing but the copies changed.
    kinds = binding_kinds(out["main"])
    expected = binding_kinds(mod["main"])
    del expected["vm.copy_tensor"]
    del kinds[DMA_COPY], kinds[DMA_WAIT]
    assert kinds == expected


@I.ir_module
class TwoCopies:
    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        storage = R.vm.alloc_storage(R.shape([64]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([4]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        b = R.vm.alloc_tensor(storage, R.prim_value(16), R.shape([4]), R.dtype("float32"))
        R.vm.copy_tensor(a, b)
        return b


def test_the_schedule_check_sees_a_read_of_dst_before_the_wait():
    # The checker itself: the same rewrite with each wait moved to the end of the function.
    mod = copy_to_dma(TwoCopies)
    func = mod["main"]
    block = func.body.blocks[0]
    waits = [b for b in block.bindings if op_name(b.value) == DMA_WAIT]
    others = [b for b in block.bindings if op_name(b.value) != DMA_WAIT]
    late = relax.Function(
        func.params, relax.SeqExpr([relax.BindingBlock(others + waits)], func.body.body), ret_ty(func), False
    )
    problems = dma_schedule_violations(late)
    assert any("touches x or a" in p for p in problems), problems
    assert dma_schedule_violations(func) == []


@VM_EXAMPLES
@given(lowered_copy_functions(max_copies=10), st.integers(0, 2**16))
def test_copy_to_dma_computes_what_the_copies_computed_under_cpu_dma(mod, seed):
    (copies,) = count_ops(mod["main"], "vm.copy_tensor")
    out = copy_to_dma(mod)
    inputs = random_inputs(mod["main"], seed)
    results, engine = run_together({"orig": mod["main"], "dma": out["main"]}, inputs, dma=True)
    assert_same_results(results["dma"], results["orig"])
    assert engine.copies == engine.waits == engine.completed == copies
    assert engine.in_flight == {}


# ---------------------------------------------------------------------------------------------
# docs/testing.md: the example test module passes as printed
# ---------------------------------------------------------------------------------------------


def test_the_testing_guide_example_module_passes(tmp_path):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "def test_" in b)
    path = tmp_path / "test_my_rewrite.py"
    path.write_text(for_this_tvm(example))
    namespace = runpy.run_path(str(path))
    tests = {name: value for name, value in namespace.items() if name.startswith("test_")}
    assert sorted(tests) == ["test_copy_to_dma_runs_like_the_copies", "test_subtract_to_add"]
    for test in tests.values():
        test()  # with the module's own @settings
