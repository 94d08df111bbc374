"""Testing helpers for rewriters: hypothesis strategies and property checks."""
