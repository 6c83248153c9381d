"""Bridges to other evaluation harnesses: export a study's grid as their tasks, import their logs as result stores
(:mod:`mmfragile.harness.lmms_eval`; docs/harnesses.md)."""
