"""rewrite_ext: TVM Relax ``rewrite_call`` whose rewriter may emit bindings.

``rewrite_call(pattern, rewriter, target)`` extends
``tvm.relax.dpl.rewrite_call``: a rewriter written
``rewriter(orig, matchings, builder)`` also receives the
``relax.BlockBuilder`` that emits the matched binding's block, so one
match can become several bindings, void ones included.
"""

from __future__ import annotations

from . import ops
from .errors import RewriteError
from .rewrite import RewriteCall, Rewriter, rewrite_call

__all__ = ["RewriteCall", "RewriteError", "Rewriter", "ops", "rewrite_call"]
