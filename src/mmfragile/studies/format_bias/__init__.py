"""Study 1: prompt-format bias in multiple-choice VQA (seed ``format-bias-mcvqa``): prompts (the 48 formats),
items, metrics, mitigation, plots; the study-level API (run, read back, analyse) is re-exported here."""
from mmfragile.studies.format_bias.analysis import *  # noqa: F401,F403
from mmfragile.studies.format_bias.analysis import __all__  # noqa: F401
from mmfragile.studies.format_bias.study import STUDY, run_cp_ln, run_format_bias  # noqa: F401
