"""The rewrite-ext command line, run as a subprocess as a user runs it.

Exit codes: 0 done (with --run: outputs equal), 1 outputs differ, 2 an error in one line on
stderr.  Every case of issue 20 is here: reading without running, JSON in and out, -o, --diff,
--module, and --run on inputs it used to crash on.
"""

from __future__ import annotations

import os
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from rewrite_ext.cli import load_module
from rewrite_ext.hexagon import copy_to_dma
from rewrite_ext.compat import TensorType
from _helpers import for_this_tvm, spelled_as_026

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "copy_to_vtcm.py"

HEADER = "from tvm.script import ir as I\nfrom tvm.script import relax as R\nfrom tvm.script import tirx as T\n"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rewrite_ext", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def assert_one_error_line(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2, nothing but one `rewrite-ext: error: ...` line on stderr, holding each fragment."""
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rewrite-ext: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def module_file(tmp_path: Path, body: str, name: str = "input.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "\n\n" + textwrap.dedent(body))
    return path


def copy_module(main: str) -> str:
    """`@I.ir_module class Module` holding the given (indented-as-a-method) main."""
    return "@I.ir_module\nclass Module:\n" + textwrap.indent(textwrap.dedent(main), "    ")


# -- the rewrite and its output ------------------------------------------------------------


def test_dma_prints_the_rewritten_module():
    done = cli("dma", EXAMPLE)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.count("vm.builtin.hexagon.dma_copy") == 3
    assert done.stdout.count("vm.builtin.hexagon.dma_wait") == 3
    assert "copy_tensor" not in done.stdout


def test_run_compares_outputs_and_prints_the_stand_ins_counters():
    done = cli("dma", EXAMPLE, "--run", "--queue-id", "2")
    assert done.returncode == 0, done.stderr
    assert "# outputs equal: True" in done.stdout
    assert "copies=3 waits=3" in done.stdout and "{2: 1}" in done.stdout
    assert "nothing was rewritten" not in done.stdout


def test_run_allocates_vtcm_storage_on_the_cpu(tmp_path):
    # The forum thread's module allocates its tensor in "global.vtcm".
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((32, 64), dtype="int32")) -> R.Tensor((32, 64), dtype="int32"):
                vtcm = R.vm.alloc_storage(R.shape([8192]), R.prim_value(0), R.dtype("uint8"), R.str("global.vtcm"))
                a = R.vm.alloc_tensor(vtcm, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
                R.vm.copy_tensor(x, a)
                out = R.builtin.alloc_tensor(R.shape([32, 64]), R.dtype("int32"), R.prim_value(0))
                R.vm.copy_tensor(a, out)
                return out
            """
        ),
    )
    done = cli("dma", path, "--run")
    assert done.returncode == 0, done.stderr
    assert "# outputs equal: True" in done.stdout


def test_legacy_wait_and_overlap_still_work():
    legacy = cli("dma", EXAMPLE, "--legacy-wait", "--run")
    assert legacy.returncode == 0 and "(0, 0), ty_args" in spelled_as_026(legacy.stdout)
    overlap = cli("dma", EXAMPLE, "--overlap", "--run")
    assert overlap.returncode == 0
    assert "# DMA overlap: 3 dma_copy" in overlap.stdout and "# outputs equal: True" in overlap.stdout


def test_report_counts_the_copies_rewritten_and_says_why_one_was_kept(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((4,), "float32"), y: R.Tensor(("n",), "float32"), a: R.Tensor((4,), "float32"), b: R.Tensor(("n",), "float32")):
                R.vm.copy_tensor(x, a)
                R.vm.copy_tensor(y, b)
                return a
            """
        ),
    )
    done = cli("dma", str(path), "--report")
    assert done.returncode == 0, done.stderr
    report = done.stdout[done.stdout.index("# rewrite report") :]
    # one pass: the DMA builtins it made match no rule, so no second pass offers the kept copy
    assert "copy_to_dma_rewriter  2        1          0     1" in report, report
    assert "passes per function: main: 1" in report
    assert "not static" in report and "passes per function: main:" in report


def test_json_on_stdout_stays_json_and_a_rewritten_module_runs_again(tmp_path):
    first = tmp_path / "first.json"
    assert cli("dma", EXAMPLE, "-o", str(first)).returncode == 0
    # the input already holds the DMA builtins: the original runs under cpu_dma() too
    done = cli("dma", str(first), "--run", "--report", "--output-format", "json")
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # the notes went to stderr
    assert "# outputs equal: True" in done.stderr and "# rewrite report" in done.stderr
    # nothing was rewritten: equal outputs only say the module runs, and the note says so
    assert "# nothing was rewritten" in done.stderr


def test_python_dash_m_and_the_console_script_are_the_same_command():
    script = Path(sys.executable).with_name("rewrite-ext")
    by_script = subprocess.run([script, "dma", EXAMPLE], capture_output=True, text=True, check=False)
    assert by_script.returncode == 0
    assert by_script.stdout == cli("dma", EXAMPLE).stdout


# -- reading without running -----------------------------------------------------------------


def test_the_file_is_read_as_text_so_its_module_level_code_never_runs(tmp_path):
    sentinel = tmp_path / "ran"
    path = tmp_path / "input.py"
    path.write_text(
        f"import sys\nopen({str(sentinel)!r}, 'w').write('ran')\nsys.exit(0)\n\n" + EXAMPLE.read_text()
    )
    done = cli("dma", path)
    assert done.returncode == 0 and done.stdout.count("vm.builtin.hexagon.dma_copy") == 3
    assert not sentinel.exists()


def test_expressions_in_the_script_cannot_reach_pythons_builtins(tmp_path):
    sentinel = tmp_path / "ran"
    path = tmp_path / "input.py"
    path.write_text(
        EXAMPLE.read_text().replace(
            'R.shape([16384])', f'R.shape([16384 + len(open({str(sentinel)!r}, "w").name) * 0])'
        )
    )
    assert_one_error_line(cli("dma", path), f"{path}:", "does not parse as TVMScript", "name 'open' is not defined")
    assert not sentinel.exists()


@pytest.mark.parametrize(
    "content, fragments",
    [
        (None, ["no such file"]),
        ("x = 1\n", ["defines no IRModule in TVMScript", "tvm.ir.save_json"]),
        (HEADER + "@I.ir_module\nclass Module:\n    def main(:\n", ["input.py:6", "does not parse as TVMScript", "invalid syntax"]),
        (
            EXAMPLE.read_text().replace("R.vm.copy_tensor(x, a)", "R.vm.copy_tensor(x)"),
            ["input.py:20:9: does not parse as TVMScript", "missing 1 required positional argument: 'dst'"],
        ),
    ],
    ids=["missing", "no-module", "python-syntax-error", "tvmscript-error"],
)
def test_bad_input_gets_one_line_with_the_place_and_exit_code_2(tmp_path, content, fragments):
    path = tmp_path / "input.py"
    if content is not None:
        path.write_text(content)
    assert_one_error_line(cli("dma", path), *fragments)


def test_a_file_of_several_modules_needs_module_and_names_them(tmp_path):
    second = EXAMPLE.read_text().replace("class Module:", "class Other:").replace("(x, a)", "(x, a)  # other")
    path = tmp_path / "two.py"
    path.write_text(EXAMPLE.read_text() + "\n\n" + second.split("\n\n", 1)[1])
    assert_one_error_line(cli("dma", path), "holds 2 IRModules (Module, Other)", "--module NAME")
    assert_one_error_line(cli("dma", path, "--module", "Nope"), "no module named 'Nope'", "Module, Other")
    done = cli("dma", path, "--module", "Other", "--run")
    assert done.returncode == 0 and "class Module:" in done.stdout  # TVM prints every module as Module
    assert "# outputs equal: True" in done.stdout


def test_printed_tvmscript_with_symbolic_vars_and_constants_reads_back(tmp_path):
    """What IRModule.script(show_meta=True) prints (`n = TypeVar("n")`, `metadata = ...`) parses."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", TensorType([n, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        shifted = bb.emit(relax.op.add(x, relax.const(np.arange(4, dtype="float32"))))
        out = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([n, 4]), "float32", 0))
        from rewrite_ext import ops

        bb.emit(ops.copy_tensor(shifted, out))
        bb.emit_func_output(out)
    mod = bb.get()
    text = mod.script(show_meta=True)
    # TVM 0.27 prints `n = TypeVar("n")` at module level; 0.26 declares n inside the function.
    assert "metadata = tvm.ir.load_json(" in text
    path = tmp_path / "printed.py"
    path.write_text(text)
    out_path = tmp_path / "out.py"
    done = cli("dma", path, "-o", out_path, "--run", "--bind", "n=3")
    assert done.returncode == 0, done.stderr
    assert "# symbolic vars: n=3" in done.stdout and "# outputs equal: True" in done.stdout
    tvm.ir.assert_structural_equal(load_module(str(out_path)), copy_to_dma(mod))


# -- JSON ----------------------------------------------------------------------------------------


def test_a_relax_module_round_trips_through_json():
    """tvm.ir.save_json segfaults with apache-tvm-ffi 0.1.15.post2: run it where a crash is a failure."""
    program = textwrap.dedent(
        """
        import numpy as np, tvm
        from tvm import relax
        from rewrite_ext.cli import load_module
        from rewrite_ext.compat import TensorType
        mod = load_module(%r)
        x = relax.Var("x", TensorType([4], "float32"))
        bb = relax.BlockBuilder()
        with bb.function("f", [x]):
            bb.emit_func_output(bb.emit(relax.op.add(x, relax.const(np.ones(4, "float32")))))
        mod["f"] = bb.get()["f"]
        again = tvm.ir.load_json(tvm.ir.save_json(mod))
        tvm.ir.assert_structural_equal(again, mod)
        print("round trip ok")
        """
        % str(EXAMPLE)
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "round trip ok" in done.stdout, done.stderr[-2000:]


def test_json_in_and_out_by_extension_and_by_format(tmp_path):
    mod = load_module(str(EXAMPLE))
    source = tmp_path / "seed.json"
    source.write_text(tvm.ir.save_json(mod))
    out = tmp_path / "out.json"
    done = cli("dma", source, "-o", out, "--run")
    assert done.returncode == 0 and "# outputs equal: True" in done.stdout
    assert "dma_copy" not in done.stdout  # the module went to the file
    tvm.ir.assert_structural_equal(tvm.ir.load_json(out.read_text()), copy_to_dma(mod))

    renamed = tmp_path / "seed.txt"
    renamed.write_text(source.read_text())
    as_json = cli("dma", renamed, "--format", "json", "--output-format", "json")
    assert as_json.returncode == 0
    tvm.ir.assert_structural_equal(tvm.ir.load_json(as_json.stdout), copy_to_dma(mod))
    assert_one_error_line(cli("dma", renamed), "seed.txt defines no IRModule")


def test_json_written_by_another_tvm_version_goes_through_tvms_upgrade(tmp_path):
    mod = load_module(str(EXAMPLE))
    text = tvm.ir.save_json(mod)
    assert text.rstrip().endswith('"metadata":{"tvm_version":"%s"}}' % tvm.__version__)
    older = tmp_path / "older.json"
    older.write_text(text.replace('"tvm_version":"%s"' % tvm.__version__, '"tvm_version":"0.26.0"'))
    done = cli("dma", older, "--output-format", "json")
    assert done.returncode == 0, done.stderr
    tvm.ir.assert_structural_equal(tvm.ir.load_json(done.stdout), copy_to_dma(mod))


def test_json_that_is_not_tvm_json_gets_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"hello": 1}')
    assert_one_error_line(cli("dma", path), "bad.json is not TVM JSON")


def test_output_as_tvmscript_reads_back_to_the_rewritten_module(tmp_path):
    out = tmp_path / "out.py"
    done = cli("dma", EXAMPLE, "-o", out, "--queue-id", "4")
    assert done.returncode == 0 and done.stdout == ""
    tvm.ir.assert_structural_equal(load_module(str(out)), copy_to_dma(load_module(str(EXAMPLE)), queue_id=4))


def test_diff_shows_each_copy_replaced_by_a_copy_and_its_wait():
    done = cli("dma", EXAMPLE, "--diff")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ ")
    removed = [line for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert len(removed) == 3 and all("R.vm.copy_tensor" in line for line in removed)
    assert len(added) == 6 and sum("dma_copy" in line for line in added) == 3


# -- --run on what used to crash ----------------------------------------------------------------

TUPLE_SYMBOLIC_NAN = copy_module(
    """
    @R.function(pure=False)
    def main(x: R.Tensor(("n", 4), dtype="float32")) -> R.Tuple(R.Tensor(("n", 4), dtype="float32"), R.Tensor(("n", 4), dtype="float32")):
        n = T.int64()
        out: R.Tensor((n, 4), dtype="float32") = R.builtin.alloc_tensor(R.shape([n, 4]), R.dtype("float32"), R.prim_value(0))
        R.vm.copy_tensor(x, out)
        root: R.Tensor((n, 4), dtype="float32") = R.sqrt(out)
        return (out, root)
    """
)


def test_run_handles_a_tuple_output_a_symbolic_shape_and_equal_nans(tmp_path):
    path = module_file(tmp_path, TUPLE_SYMBOLIC_NAN)
    done = cli("dma", path, "--run")
    assert done.returncode == 0, done.stderr
    # sqrt of normal random data: about half NaN, in both runs, and NaN equals NaN.
    assert "# symbolic vars: n=8" in done.stdout and "# outputs equal: True" in done.stdout
    assert cli("dma", path, "--run", "--bind", "n=2", "--seed", "5").stdout.count("n=2") == 1


@pytest.mark.parametrize(
    "bind, fragments",
    [
        ("N=3", ["--bind N", "no symbolic var of that name", "theirs: n"]),
        ("n=-3", ["main's parameter 'x'", "[-3, 4]", "at least 0"]),
    ],
    ids=["unknown-name", "negative-dim"],
)
def test_a_bind_main_cannot_use_gets_one_line(tmp_path, bind, fragments):
    path = module_file(tmp_path, TUPLE_SYMBOLIC_NAN)
    assert_one_error_line(cli("dma", path, "--run", "--bind", bind), *fragments)


def test_a_negative_dim_of_a_shape_parameter_gets_one_line(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((4,), dtype="int32"), s: R.Shape(["k"])) -> R.Tensor((4,), dtype="int32"):
                out: R.Tensor((4,), dtype="int32") = R.builtin.alloc_tensor(R.shape([4]), R.dtype("int32"), R.prim_value(0))
                R.vm.copy_tensor(x, out)
                return out
            """
        ),
    )
    assert_one_error_line(cli("dma", path, "--run", "--bind", "k=-3"), "main's parameter 's'", "[-3]", "at least 0")


def test_run_handles_prim_and_shape_parameters(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((4,), dtype="int32"), k: R.Prim("int64"), s: R.Shape(["m", 2])) -> R.Tensor((4,), dtype="int32"):
                out: R.Tensor((4,), dtype="int32") = R.builtin.alloc_tensor(R.shape([4]), R.dtype("int32"), R.prim_value(0))
                R.vm.copy_tensor(x, out)
                return out
            """
        ),
    )
    done = cli("dma", path, "--run", "--bind", "m=3")
    assert done.returncode == 0, done.stderr
    assert "# symbolic vars: m=3" in done.stdout and "# outputs equal: True" in done.stdout


_COPY_FUNCTION = """
@R.function{private}
def {name}(x: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
    R.func_attr({{"relax.force_pure": True}})
    out: R.Tensor((4,), dtype="float32") = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
    R.vm.copy_tensor(x, out)
    return out
"""


def _functions_file(tmp_path: Path, public: list[str], private: list[str] = ()) -> Path:
    body = "".join(_COPY_FUNCTION.format(name=n, private="") for n in public)
    body += "".join(_COPY_FUNCTION.format(name=n, private="(private=True)") for n in private)
    return module_file(tmp_path, copy_module(body))


def test_run_without_main_runs_the_only_public_function(tmp_path):
    # nn.Module.export_tvm names it forward
    done = cli("dma", _functions_file(tmp_path, ["forward"], ["helper"]), "--run")
    assert done.returncode == 0, done.stderr
    assert "# outputs equal: True" in done.stdout and "copies=1" in done.stdout


def test_run_chooses_with_entry_and_says_how_when_it_cannot(tmp_path):
    path = _functions_file(tmp_path, ["f", "g"])
    assert_one_error_line(cli("dma", path, "--run"), "no function 'main'", "public Relax functions f, g", "--entry NAME")
    done = cli("dma", path, "--run", "--entry", "g")
    assert done.returncode == 0, done.stderr
    assert "# outputs equal: True" in done.stdout
    assert_one_error_line(cli("dma", path, "--run", "--entry", "h"), "no Relax function 'h'", "f, g")
    assert_one_error_line(cli("dma", path, "--entry", "g"), "--entry chooses the function --run runs")
    assert cli("dma", path).returncode == 0  # without --run, no function is needed


def test_run_with_an_object_parameter_says_what_it_can_make(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((4,), dtype="float32"), o: R.Object) -> R.Tensor((4,), dtype="float32"):
                out: R.Tensor((4,), dtype="float32") = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                R.vm.copy_tensor(x, out)
                return out
            """
        ),
    )
    assert_one_error_line(cli("dma", path, "--run"), "parameter 'o'", "tensors, shapes, prim values")


def test_run_takes_ir_lowered_by_tvms_pipeline_in_a_force_pure_function(tmp_path):
    """The IR between LowerAllocTensor and KillAfterLastUse (docs/pipeline.md), saved as JSON."""
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function
            def main(x: R.Tensor((4, 8), dtype="float32")) -> R.Tensor((4, 8), dtype="float32"):
                R.func_attr({"relax.force_pure": True})
                storage: R.Object = R.memory.alloc_storage(R.shape([128]), R.prim_value(0), R.str("global"), R.dtype("uint8"))
                a: R.Tensor((4, 8), dtype="float32") = R.memory.alloc_tensor(storage, R.prim_value(0), R.shape([4, 8]), R.dtype("float32"))
                R.vm.copy_tensor(x, a)
                b: R.Tensor((4, 8), dtype="float32") = R.add(a, a)
                return b
            """
        ),
    )
    lowered = tmp_path / "lowered.json"
    lowered.write_text(tvm.ir.save_json(load_module(str(path))))
    done = cli("dma", lowered, "--run", "--overlap")
    assert done.returncode == 0, done.stderr
    assert '"relax.force_pure": True' in done.stdout and "# outputs equal: True" in done.stdout
    assert "# DMA overlap: 1 dma_copy" in done.stdout


# `b` is `a` again, through a VM builtin the rewrite cannot see into: the copy is between
# the same bytes, which the engine does not define (copy_to_dma drops such a copy only where
# the IR shows it: aliases, allocations, views).
OVERLAPPING_COPY = for_this_tvm(copy_module(
    """
    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), dtype="int32")) -> R.Tensor((32, 64), dtype="int32"):
        storage: R.Object = R.vm.alloc_storage(R.shape([16384]), R.prim_value(0), R.dtype("uint8"), R.str("global"))
        a: R.Tensor((32, 64), dtype="int32") = R.vm.alloc_tensor(storage, R.prim_value(0), R.shape([32, 64]), R.dtype("int32"))
        R.vm.copy_tensor(x, a)
        b = R.call_pure_packed("vm.builtin.reshape", a, R.shape([32, 64]), ty_args=R.Tensor((32, 64), dtype="int32"))
        R.vm.copy_tensor(a, b)
        return b
    """
))


def test_a_rewrite_that_changes_the_result_exits_1(tmp_path):
    """A copy between overlapping buffers runs on the CPU; a DMA engine may not do it."""
    done = cli("dma", module_file(tmp_path, OVERLAPPING_COPY), "--run")
    assert done.returncode == 1, done.stderr
    assert "# outputs equal: False" in done.stdout and "DMAError" in done.stdout and "overlap" in done.stdout


@pytest.mark.parametrize("queue", ["9", "-1", "12"])
def test_a_queue_outside_the_users_queues_gets_one_line(queue):
    assert_one_error_line(cli("dma", EXAMPLE, "--queue-id", queue), f"--queue-id {queue}", "0 to 8")


def test_num_queues_spreads_the_copies_over_queues_and_a_range_past_8_gets_one_line(tmp_path):
    out = tmp_path / "out.py"
    done = cli("dma", EXAMPLE, "-o", out, "--queue-id", "3", "--num-queues", "2", "--overlap")
    assert done.returncode == 0, done.stderr
    expected = copy_to_dma(load_module(str(EXAMPLE)), queue_id=3, num_queues=2, overlap=True)
    tvm.ir.assert_structural_equal(load_module(str(out)), expected)
    assert "on queue 4" in done.stdout  # the overlap report: the second copy went to queue 4
    assert_one_error_line(cli("dma", EXAMPLE, "--queue-id", "8", "--num-queues", "2"), "up to 9, past 8", "lower --queue-id")
    assert_one_error_line(cli("dma", EXAMPLE, "--num-queues", "0"), "at least 1 queue")


def test_a_warning_is_one_line_on_stderr(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function(pure=False)
            def main(x: R.Tensor((4456448,), "float32")):
                out = R.builtin.alloc_tensor(R.shape([4456448]), R.dtype("float32"), R.prim_value(0))
                R.vm.copy_tensor(x, out)
                return out
            """
        ),
    )
    done = cli("dma", path)
    assert done.returncode == 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rewrite-ext: warning: DMAChunkWarning: copy_to_dma: 1 copy(ies)")
    assert "x -> out (17825792 bytes)" in lines[0]


def test_a_copy_in_a_pure_function_gets_the_rewrite_error_in_one_line(tmp_path):
    path = module_file(
        tmp_path,
        copy_module(
            """
            @R.function
            def main(x: R.Tensor((4,), dtype="float32"), out: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
                R.vm.copy_tensor(x, out)
                return out
            """
        ),
    )
    done = cli("dma", path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "rewrite-ext: error:" in done.stderr


def test_a_closed_stdout_ends_quietly_with_exit_code_2():
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewrite_ext", "dma", str(EXAMPLE), "--diff"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the first line, like `| head -0`
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 2
    assert stderr == ""


# -- help, progress ----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["dma", "--help"]], ids=["top", "dma"])
def test_help_is_plain_text_and_states_the_exit_codes(args):
    done = cli(*args)
    assert done.returncode == 0
    text = done.stdout
    assert "exit codes:" in text and "0  done" in text and "1  with --run" in text and "2  an error" in text
    for markup in ("``", ":func:", ":class:", ".. "):
        assert markup not in text


def test_dma_help_lists_every_option():
    text = cli("dma", "--help").stdout
    for option in ("--run", "--legacy-wait", "--queue-id", "--overlap", "-o OUT", "--diff", "--module", "--format"):
        assert option in text


def test_slow_steps_are_reported_on_stderr_and_the_output_is_unchanged():
    quiet = cli("dma", EXAMPLE)
    done = cli("dma", EXAMPLE, env={"REWRITE_EXT_PROGRESS_AFTER": "0"})
    assert done.returncode == 0 and done.stdout == quiet.stdout
    assert "rewrite-ext: reading" in done.stderr and "rewrite-ext: rewriting: done in" in done.stderr
    assert quiet.stderr == ""
