"""Testing helpers for rewriters: hypothesis strategies and property checks."""

from __future__ import annotations

from .checks import CheckReport, RewriteCheckFailure, check_rewrite

__all__ = ["CheckReport", "RewriteCheckFailure", "check_rewrite"]
