"""rewrite_ext: TVM Relax ``rewrite_call`` whose rewriter may emit bindings."""

from __future__ import annotations

from .errors import RewriteError

__all__ = ["RewriteError"]
