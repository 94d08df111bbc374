"""The examples the documentation shows do what it says."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_readme_example_prints_the_ir_the_readme_shows(capsys, tmp_path):
    blocks = _python_blocks((ROOT / "README.md").read_text())
    example, shown = blocks[0], blocks[1]
    # TVMScript reads the decorated function's source back from its file.
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    runpy.run_path(str(script))
    printed = capsys.readouterr().out
    # The README shows the function without the "# from tvm.script ..." header line.
    assert shown.strip() in printed
    assert "R.negative(b)" in printed and "R.subtract(a, lv)" in printed
