"""The rewrite-ext command line: output, --run, and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rewrite_ext.cli import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "copy_to_vtcm.py"


def test_dma_prints_the_rewritten_module(capsys):
    assert main(["dma", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.count("vm.builtin.hexagon.dma_copy") == 3 and out.count("vm.builtin.hexagon.dma_wait") == 3
    assert "copy_tensor" not in out


def test_dma_run_compares_outputs_and_prints_counters(capsys):
    assert main(["dma", str(EXAMPLE), "--run", "--queue-id", "2"]) == 0
    out = capsys.readouterr().out
    assert "# outputs equal: True" in out and "copies=3 waits=3" in out and "{2: 1}" in out


def test_dma_legacy_wait_and_overlap(capsys):
    assert main(["dma", str(EXAMPLE), "--legacy-wait", "--run"]) == 0
    assert "(0, 0), ty_args" in capsys.readouterr().out
    assert main(["dma", str(EXAMPLE), "--overlap", "--run"]) == 0
    out = capsys.readouterr().out
    assert "# DMA overlap: 3 transfers" in out and "# outputs equal: True" in out


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("x = 1\n", "defines no IRModule"),
        ("from tvm.script import ir as I\n@I.ir_module\nclass Module:\n    def main(:\n", "does not parse"),
    ],
    ids=["missing", "no-module", "syntax-error"],
)
def test_bad_input_gets_one_line_and_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "input.py"
    if content is not None:
        path.write_text(content)
    assert main(["dma", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_tvmscript_that_does_not_type_check_gets_exit_code_2(tmp_path, capsys):
    path = tmp_path / "bad.py"
    path.write_text(EXAMPLE.read_text().replace("R.vm.copy_tensor(x, a)", "R.vm.copy_tensor(x)"))
    assert main(["dma", str(path)]) == 2
    assert "does not parse" in capsys.readouterr().err


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run(
        [sys.executable, "-m", "rewrite_ext", "dma", str(EXAMPLE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "vm.builtin.hexagon.dma_wait" in done.stdout
