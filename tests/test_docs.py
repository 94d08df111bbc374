"""Every example in docs/ runs and does what the page says.

Each ```python and ```bash block of docs/*.md is listed in ``BLOCKS`` by a snippet of its
text, with how it is checked:

- ``run``: executed, in page order, in one namespace per page (like a doctest session),
  from a file so that TVMScript can read decorated functions back; ``prelude`` supplies
  what the page takes as given (``mod``, ``func``, ...) and ``check`` asserts the result;
- ``listing``: IR or output the page shows; every line of it except ``...`` is found in
  what ``produce`` returns;
- ``shell``: a command run as a user runs it;
- ``static``: an install or pytest command whose names (extras, profiles, paths) are
  checked to exist, since running it would install packages or the whole suite.

``test_every_example_in_docs_is_checked`` fails for a block that is not listed, so a new
example cannot slip in untested.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
import textwrap
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm

from rewrite_ext.cli import load_module
from rewrite_ext.hexagon import DMAChunkWarning, copy_to_dma
from rewrite_ext.compat import VOID_TY_ARGS
from _helpers import for_this_tvm, spelled_as_026

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLE = ROOT / "examples" / "copy_to_vtcm.py"
FENCE = re.compile(r"^( *)```(python|bash)\n(.*?)^\1```", flags=re.S | re.M)


def doc_blocks(page: str) -> list[tuple[str, str]]:
    """(language, code) of each ```python / ```bash block of ``page``, dedented."""
    text = (DOCS / page).read_text()
    return [(lang, textwrap.dedent(code)) for _indent, lang, code in FENCE.findall(text)]


@dataclass
class Block:
    page: str
    snippet: str
    """Text found in exactly one block of the page."""
    kind: str
    """run, listing, shell or static."""
    prelude: Callable[[], dict[str, Any]] | None = None
    check: Callable[[dict[str, Any], str], None] | None = None
    """For run: (namespace after the block, its stdout); for listing: (unused, produced text)."""
    produce: Callable[[dict[str, Any]], str] | None = None
    edits: dict[str, str] = field(default_factory=dict)
    """Text replaced before running: what the page writes as a placeholder."""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.snippet[:40]}"


# -- what pages take as given ---------------------------------------------------------------------


def example_module() -> tvm.IRModule:
    return load_module(str(EXAMPLE))


def guide_prelude() -> dict[str, Any]:
    return {"func": example_module()["main"]}


def guide_pass_prelude() -> dict[str, Any]:
    from tvm import relax

    from rewrite_ext import RewriteCall
    from rewrite_ext.hexagon import copy_tensor_pattern

    def rewriter(orig, matchings, builder):
        src, dst = orig.args
        builder.emit(relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_copy", [src, dst, 0, True], **VOID_TY_ARGS))
        return relax.op.call_builtin_with_ctx("vm.builtin.hexagon.dma_wait", [0, 0, True, src, dst], **VOID_TY_ARGS)

    return {"mod": example_module(), "pattern": copy_tensor_pattern(), "rewriter": rewriter,
            "tvm": tvm, "RewriteCall": RewriteCall}


def hexagon_prelude() -> dict[str, Any]:
    mod = example_module()
    x = tvm.runtime.tensor(np.arange(32 * 64, dtype="int32").reshape(32, 64))
    from tvm import relax

    from rewrite_ext.hexagon import cpu_dma

    return {"mod": mod, "x": x, "relax": relax, "tvm": tvm, "cpu_dma": cpu_dma}


def mlp_example() -> Any:
    """examples/mlp_vtcm.py as a module (its main is not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mlp_vtcm", ROOT / "examples" / "mlp_vtcm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def staging_prelude() -> dict[str, Any]:
    from tvm import relax

    example = mlp_example()
    model, inputs = example.export()
    x, *weights = [tvm.runtime.tensor(a) for a in inputs]
    return {"mod": model, "x": x, "weights": weights, "relax": relax, "tvm": tvm}


TINY = """
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Tiny:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((8,), "float32"), z: R.Tensor((16, 8), "float32")):
        with R.dataflow():
            a = R.add(x, y)
            b = R.multiply(a, a)
            c = R.concat([b, z, b], axis=0)
            R.output(c)
        return c
"""


def staged_tiny(_namespace: dict[str, Any]) -> str:
    """The Tiny module of the staging section (tests/test_vtcm.py's), lowered and staged."""
    import tempfile

    from rewrite_ext.hexagon import stage_in_vtcm

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.py"
        path.write_text(TINY)
        tiny = load_module(str(path))
    return stage_in_vtcm(mlp_example().LOWER_TO_VM_IR(tiny))["main"].script()


def check_staged_and_dma(namespace: dict[str, Any], _out: str) -> None:
    text = namespace["mod"]["forward"].script()
    assert "global.vtcm" in text and "vm.builtin.hexagon.dma_copy" in text and "copy_tensor" not in text


def check_vtcm_run(namespace: dict[str, Any], out: str) -> None:
    assert namespace["vtcm"].allocations and "copies=" in out


def skip_pass_prelude() -> dict[str, Any]:
    from tvm import relax

    return {"mod": example_module(), "relax": relax, "tvm": tvm}


OVERLAP_INPUT = '''
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Module:
    @R.function(pure=False)
    def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")) -> R.Tensor((16,), "float32"):
        storage: R.Object = R.vm.alloc_storage(R.shape([128]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a: R.Tensor((16,), "float32") = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([16]), R.dtype("float32"))
        R.vm.copy_tensor(x, a)
        b: R.Tensor((16,), "float32") = R.vm.alloc_tensor(storage, R.prim_value(64), R.shape([16]), R.dtype("float32"))
        R.vm.copy_tensor(y, b)
        c: R.Tensor((16,), "float32") = R.add(x, y)
        d: R.Tensor((16,), "float32") = R.add(a, c)
        e: R.Tensor((16,), "float32") = R.add(b, d)
        return e
'''


def overlap_listing(_namespace: dict[str, Any]) -> str:
    """The sunk IR of OVERLAP_INPUT, with `var: type =` printed as `var =` as the page shows it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overlap.py"
        path.write_text(OVERLAP_INPUT)
        sunk = copy_to_dma(load_module(str(path)), overlap=True)
    text = sunk.script(show_meta=False)
    return re.sub(r"^(\s*\w+): .+? = ", r"\1 = ", text, flags=re.M)


CHUNKED_INPUT = """
from tvm.script import relax as R

@R.function(pure=False)
def main(x: R.Tensor((4456448,), "float32"), out: R.Tensor((4456448,), "float32")):
    R.vm.copy_tensor(x, out)
    return out
"""


def chunked_copy(_namespace: dict[str, Any]) -> str:
    """copy_to_dma of one 17 MiB float32 copy: more bytes than one DMA descriptor carries."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chunked.py"
        path.write_text(CHUNKED_INPUT)
        with warnings.catch_warnings():  # the DMAChunkWarning this example shows the IR of
            warnings.simplefilter("ignore", DMAChunkWarning)
            return copy_to_dma(load_module(str(path))).script(show_meta=False)


def rewritten_example(_namespace: dict[str, Any]) -> str:
    return copy_to_dma(example_module()).script(show_meta=False)


def check_rewritten(name: str) -> Callable[[dict[str, Any], str], None]:
    def check(namespace: dict[str, Any], _out: str) -> None:
        text = namespace[name].script()
        assert "vm.builtin.hexagon.dma_copy" in text and "copy_tensor" not in text

    return check


def check_before_is_the_example(namespace: dict[str, Any], _out: str) -> None:
    tvm.ir.assert_structural_equal(namespace["main"], example_module()["main"])


def check_cpu_dma_counters(namespace: dict[str, Any], out: str) -> None:
    np.testing.assert_array_equal(namespace["out"].numpy(), np.arange(32 * 64, dtype="int32").reshape(32, 64))
    assert out.split()[:2] == ["3", "3"]  # copies, waits


def check_pipeline(namespace: dict[str, Any], out: str) -> None:
    assert "4 DMA transfers, 4 waits; outputs equal" in out


def check_lowered(namespace: dict[str, Any], out: str) -> None:
    assert '"relax.force_pure": True' in out and "vm.builtin.hexagon.dma_wait" in out
    # "Lower, rewrite, build": plain relax.build of the lowered module computes the same.
    from tvm import relax

    from rewrite_ext.hexagon import cpu_dma

    executable = relax.build(namespace["lowered"], target="llvm")
    with cpu_dma() as dma:
        got = relax.VirtualMachine(executable, tvm.cpu())["forward"](*namespace["args"]).numpy()
    np.testing.assert_allclose(got, namespace["expected"], rtol=1e-5)
    assert dma.copies == dma.waits == 4
    listing = re.search(r"```text\n(.*?)```", (DOCS / "pipeline.md").read_text(), flags=re.S).group(1)
    for line in listing.splitlines():
        if line.strip() and "..." not in line:
            assert line.strip() in spelled_as_026(out), line


def check_extras(code: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r'"rewrite_ext\[(\w+)\]"', code):
        assert extra in extras, extra


def check_pytest_commands(code: str) -> None:
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    for profile in re.findall(r"--hypothesis-profile=(\w+)", code):
        assert f'register_profile(\n    "{profile}"' in conftest or f'register_profile("{profile}"' in conftest
    for path in re.findall(r"(tests/\S+\.py)", code):
        assert (ROOT / path).is_file(), path
    for selection in re.findall(r"-k (\w+)", code):
        assert re.search(rf"def test_\w*{selection}", (ROOT / "tests" / "test_properties.py").read_text())


def check_pins_are_what_ci_tests(code: str) -> None:
    """The versions a page tells users to pin are the ones .ci/run installs and tests."""
    ci = (ROOT / ".ci" / "run").read_text()
    pins = re.findall(r'"(apache-tvm(?:-ffi)?==[^"]+)"', code)
    assert pins and all(f'"{pin}"' in ci for pin in pins), (pins, ci)


def run_testing_example(code: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "test_my_rewrite.py").write_text(for_this_tvm(code))
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_rewrite.py"],
            cwd=tmp, capture_output=True, text=True, check=False,
        )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]


def run_example_scripts(code: str) -> None:
    """Each `python examples/...` line, from the repository root."""
    for line in code.strip().splitlines():
        command = line.split("#")[0].split()
        assert command[0] == "python" and command[1].startswith("examples/"), line
        done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "# outputs equal: True" in done.stdout, (line, done.stdout[-2000:], done.stderr[-2000:])


def run_in_subprocess(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def run_shell(code: str) -> None:
    """Each `rewrite-ext ...` line, in order, in a copy of examples/, as a user would type it."""
    import shutil
    import tempfile

    executable = Path(sys.executable).with_name("rewrite-ext")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "examples", Path(tmp) / "examples")
        for line in code.strip().splitlines():
            command = line.split("#")[0].split()
            assert command[0] == "rewrite-ext", line
            done = subprocess.run([executable, *command[1:]], cwd=tmp, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (line, done.stderr)
            if "--run" in command:
                assert "# outputs equal: True" in done.stdout, line
            if "--diff" in command:
                assert done.stdout.startswith("--- "), line
            for option, output in zip(command, command[1:]):
                if option == "-o":
                    assert "vm.builtin.hexagon.dma_copy" in (Path(tmp) / output).read_text(), line


BLOCKS = [
    # guide.md
    Block("guide.md", "new_func = rewrite_call(", "run", guide_prelude, check_rewritten("new_func")),
    Block("guide.md", 'name="MyLowering"', "run", guide_pass_prelude, check_rewritten("mod"), edits={", ...]": "]"}),
    # hexagon-dma.md
    Block("hexagon-dma.md", "def main(x: R.Tensor((32, 64)", "run", lambda: {}, check_before_is_the_example),
    Block("hexagon-dma.md", "mod = copy_to_dma(mod)", "run", hexagon_prelude, check_rewritten("mod")),
    Block("hexagon-dma.md", "vtcm_obj: R.Any = R.vm.alloc_storage", "listing", produce=rewritten_example),
    Block("hexagon-dma.md", "with cpu_dma() as dma:", "run", None, check_cpu_dma_counters),
    Block("hexagon-dma.md", "R.memory.view(x, R.shape([16777152])", "listing", produce=chunked_copy),
    Block("hexagon-dma.md", "# b may stay in flight", "listing", produce=overlap_listing),
    Block("hexagon-dma.md", "rewrite-ext dma examples/copy_to_vtcm.py --run", "shell"),
    Block("hexagon-dma.md", "mod = stage_in_vtcm(mod, capacity=", "run", staging_prelude, check_staged_and_dma),
    Block("hexagon-dma.md", "x_vtcm: R.Tensor((4, 8)", "listing", produce=staged_tiny),
    Block("hexagon-dma.md", "relax.transform.CallTIRRewrite(), relax.transform.StaticPlanBlockMemory()", "run"),
    Block("hexagon-dma.md", "with cpu_vtcm() as vtcm, cpu_dma() as dma:", "run", None, check_vtcm_run),
    Block("hexagon-dma.md", "python examples/mlp_vtcm.py --overlap", "shell"),
    # testing.md
    Block("testing.md", 'pip install "rewrite_ext[test]"', "static"),
    Block("testing.md", "def test_copy_to_dma_runs_like_the_copies", "shell"),
    Block("testing.md", "--hypothesis-profile=thorough", "static"),
    Block("testing.md", 'settings.load_profile("ci")', "shell"),
    Block("testing.md", "class SkipPass:", "run", skip_pass_prelude),
    # pipeline.md
    Block("pipeline.md", "class MLP(nn.Module):", "run", lambda: {}, check_pipeline),
    Block("pipeline.md", 'print(lowered["forward"].script())', "run", None, check_lowered),
    # cli.md
    Block("cli.md", "-o copy_to_vtcm.dma.json", "shell"),
    # tvm-versions.md: the 0.26/0.27 spelling is what this TVM prints (0.25's is checked by hand)
    Block("tvm-versions.md", "sinfo_args=(R.Tuple,))  # 0.25", "listing", produce=rewritten_example),
    Block("tvm-versions.md", '"apache-tvm==0.25.0.post1" "apache-tvm-ffi==0.1.12"', "static"),
]

SHELL_RUNNERS = {
    "python examples/mlp_vtcm.py --overlap": run_example_scripts,
    "rewrite-ext dma examples/copy_to_vtcm.py --run": run_shell,
    "-o copy_to_vtcm.dma.json": run_shell,
    "def test_copy_to_dma_runs_like_the_copies": run_testing_example,
    'settings.load_profile("ci")': run_in_subprocess,
}
STATIC_CHECKS = {
    'pip install "rewrite_ext[test]"': check_extras,
    "--hypothesis-profile=thorough": check_pytest_commands,
    '"apache-tvm==0.25.0.post1" "apache-tvm-ffi==0.1.12"': check_pins_are_what_ci_tests,
}


def find(block: Block) -> str:
    found = [code for _lang, code in doc_blocks(block.page) if block.snippet in code]
    assert len(found) == 1, f"{block.page}: {len(found)} blocks hold {block.snippet!r}"
    return found[0]


# Pages whose examples another test runs, session by session, comparing what they print.
RUN_ELSEWHERE = {
    "rules.md": ("test_rules.py", "def test_docs_examples_run_and_print_what_the_docs_show("),
    "testing.md": ("test_checks.py", '(ROOT / "docs" / "testing.md").read_text()'),
}


def test_pages_run_elsewhere_are_run_there():
    for page, (test_file, marker) in RUN_ELSEWHERE.items():
        assert marker in (ROOT / "tests" / test_file).read_text(), (page, test_file)


def test_every_example_in_docs_is_checked():
    for page in sorted(path.name for path in DOCS.glob("*.md") if path.name not in RUN_ELSEWHERE):
        listed = [block.snippet for block in BLOCKS if block.page == page]
        for lang, code in doc_blocks(page):
            covering = [snippet for snippet in listed if snippet in code]
            assert covering, f"docs/{page}: this ```{lang} block is not checked by tests/test_docs.py:\n{code[:300]}"


def _session(block: Block) -> list[Block]:
    """The run blocks of ``block``'s page from the last one with a prelude up to ``block``."""
    page = [b for b in BLOCKS if b.page == block.page and b.kind == "run" and _present(b)]
    end = page.index(block)
    start = max(i for i in range(end + 1) if page[i].prelude is not None)
    return page[start : end + 1]


def _run(block: Block, tmp_path: Path, capsys) -> None:
    namespace: dict[str, Any] = {}
    for step in _session(block):
        code = for_this_tvm(find(step))
        for old, new in step.edits.items():
            code = code.replace(old, new)
        if step.prelude is not None:
            namespace = step.prelude()
        if "from tvm.script import relax as R" not in code and "@R.function" in code:
            code = "from tvm.script import relax as R\nimport rewrite_ext\n\n" + code
        script = tmp_path / "example.py"  # TVMScript reads decorated functions back from a file
        script.write_text(code)
        capsys.readouterr()
        namespace.update(runpy.run_path(str(script), init_globals=namespace))
        out = capsys.readouterr().out
    if block.check is not None:
        block.check(namespace, out)


def _present(block: Block) -> bool:
    return (DOCS / block.page).is_file() and any(block.snippet in code for _lang, code in doc_blocks(block.page))


# A listed block that is not (or no longer) in the docs gives no test; the list above also
# covers examples other branches add (the staging section), checked against their code.
@pytest.mark.parametrize("block", [block for block in BLOCKS if _present(block)], ids=lambda block: block.id)
def test_doc_example(block, tmp_path, capsys):
    code = find(block)
    if block.kind == "run":
        _run(block, tmp_path, capsys)
    elif block.kind == "listing":
        produced = block.produce({})
        if block.page != "tvm-versions.md":  # that page shows each version's own printing
            produced = spelled_as_026(produced)
        lines = [line.split("#")[0].strip() for line in code.splitlines()]
        if block.page == "tvm-versions.md":  # only this TVM's line can be checked here
            lines = [line.split("#")[0].strip() for line in code.splitlines() if tvm.__version__[:4] in line]
        for line in lines:
            if line and line != "...":
                assert line in produced, f"{line!r} not in:\n{produced}"
    elif block.kind == "shell":
        SHELL_RUNNERS[block.snippet](code)
    else:
        STATIC_CHECKS[block.snippet](code)


def test_readme_example_prints_the_ir_the_readme_shows(capsys, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    example, shown = blocks[0], blocks[1]
    # TVMScript reads the decorated function's source back from its file.
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    runpy.run_path(str(script))
    printed = capsys.readouterr().out
    # The README shows the function without the "# from tvm.script ..." header line.
    assert shown.strip() in printed
    assert "R.negative(b)" in printed and "R.subtract(a, lv)" in printed


def test_readme_staging_snippet_lowers_stages_and_runs_an_exported_model():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (code,) = [b for b in blocks if "stage_in_vtcm(mod" in b]
    namespace = staging_prelude()  # mod: the example's MLP as export_tvm gives it
    model = namespace["mod"]
    exec(compile(code, "README.md", "exec"), namespace)
    check_staged_and_dma(namespace, "")
    assert namespace["mod"] is not model and "global.vtcm" not in model.script()
    from tvm import relax

    got = namespace["out"].numpy()
    expected = relax.VirtualMachine(relax.build(model, target="llvm"), tvm.cpu())["forward"](
        namespace["x"], *namespace["weights"]
    ).numpy()
    np.testing.assert_array_equal(got, expected)
