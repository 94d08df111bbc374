"""Testing helpers for rewriters: hypothesis strategies and property checks.

``check_rewrite`` is importable from here.  The hypothesis strategies live in
:mod:`rewrite_ext.testing.strategies` (``relax_functions``,
``lowered_copy_functions``) and need hypothesis (``pip install "rewrite_ext[testing]"``),
so importing this package does not.
"""

from __future__ import annotations

from .checks import CheckReport, RewriteCheckFailure, check_rewrite

__all__ = ["CheckReport", "RewriteCheckFailure", "check_rewrite"]
