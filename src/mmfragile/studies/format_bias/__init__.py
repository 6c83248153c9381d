"""Study 1: prompt-format bias in multiple-choice VQA (seed ``format-bias-mcvqa``): prompts (the 48 formats),
items, metrics, mitigation, plots; the study-level API (run side and read side) is re-exported here."""
from mmfragile.studies.format_bias.items import *  # noqa: F401,F403
from mmfragile.studies.format_bias.analysis import *  # noqa: F401,F403
from mmfragile.studies.format_bias import analysis as _read, items as _run
from mmfragile.studies.format_bias.study import STUDY  # noqa: F401

__all__ = [*_run.__all__, *_read.__all__]
