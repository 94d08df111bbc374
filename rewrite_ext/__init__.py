"""rewrite_ext: TVM Relax ``rewrite_call`` whose rewriter may emit bindings.

``rewrite_call(pattern, rewriter, target)`` extends
``tvm.relax.dpl.rewrite_call``: a rewriter written
``rewriter(orig, matchings, builder)`` also receives the
``relax.BlockBuilder`` that emits the matched binding's block, so one
match can become several bindings, void ones included.
"""

from __future__ import annotations

from . import ops
from .declarative import rule_from_module
from .errors import RewriteError
from .report import RewriteReport, RuleReport
from .rewrite import RewriteCall, RewriteRules, apply_rules, rewrite_call
from .rule import Decline, Rewriter, Rule

__all__ = [
    "Decline",
    "RewriteCall",
    "RewriteError",
    "RewriteReport",
    "RewriteRules",
    "Rewriter",
    "Rule",
    "RuleReport",
    "apply_rules",
    "ops",
    "rewrite_call",
    "rule_from_module",
]
