"""Hypothesis profiles: ``ci`` (the default, what .ci/run uses) and ``thorough``."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Building IR and running the VM make single examples slow and variable, so no deadline;
# derandomize so a CI failure replays identically on a developer's machine.
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# pytest --hypothesis-profile=NAME overrides this default.
settings.load_profile("ci")
