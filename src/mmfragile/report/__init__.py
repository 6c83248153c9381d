"""A fragility report a reviewer can read: ``mmfragile report STORE [STORE ...] --out DIR``.

:func:`build_report` reads result stores of any study (format bias, Promptception, MM-JudgeBias; a folder
holding several stores counts as all of them), computes the numbers with the metric functions of
the studies' metrics modules (bootstrap intervals over questions with a fixed seed, so a report is deterministic)
and writes, beside each other:

* ``report.html`` - self-contained: figures inline as base64 PNG, no script or style from the network, opens
  from disk. Every number sits in an element with ``data-metric="<key>"`` and ``data-value="<full precision>"``
  so a browser test (or a reviewer's script) can read the page back;
* ``report.md`` - the same tables in Markdown (figures as PNG files in ``figures/``), for papers and CI logs;
* ``report.json`` - ``{"metrics": {key: value}, "provenance": [...], ...}`` with the same keys.

:mod:`mmfragile.report.browser` drives a headless Chromium (Debian's ``chromium``; ``scripts/install_browser.sh``)
to screenshot the page and read its DOM back.
"""
from __future__ import annotations

from mmfragile.report.build import (DEFAULT_N_BOOT, DEFAULT_SEED, Report, build_report, collect_stores, metric_key,  # noqa: F401
                    report_for_profile, variant_statistics)

__all__ = ["build_report", "Report", "collect_stores", "metric_key", "variant_statistics", "report_for_profile",
           "DEFAULT_N_BOOT", "DEFAULT_SEED"]
