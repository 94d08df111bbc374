"""Testing helpers for rewriters: property checks, running on the VM, hypothesis strategies.

``check_rewrite`` and ``check_pass`` (structural and semantic checks of one
rewrite), ``assert_same_results``, ``run`` and ``random_inputs`` (building and
running programs on the VM) are importable from here.  The hypothesis
strategies live in :mod:`rewrite_ext.testing.strategies` (``relax_functions``,
``relax_modules``, ``lowered_functions``, ``lowered_copy_functions``) and the op
specs they draw from in :mod:`rewrite_ext.testing.opspecs`; the strategies need
hypothesis (``pip install "rewrite_ext[testing]"``), so importing this package
does not.
"""

from __future__ import annotations

from .checks import CheckReport, PassReport, RewriteCheckFailure, check_pass, check_rewrite
from .running import Comparison, ResultMismatch, RunError, assert_same_results, random_inputs, run

__all__ = [
    "CheckReport",
    "Comparison",
    "PassReport",
    "ResultMismatch",
    "RewriteCheckFailure",
    "RunError",
    "assert_same_results",
    "check_pass",
    "check_rewrite",
    "random_inputs",
    "run",
]
