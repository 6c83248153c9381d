"""Study 3: MM-JudgeBias (seed ``mm-judgebias``): judge prompts and parsers, the nine perturbations, the judge
data, metrics, plots; the study-level API is re-exported here."""
from mmfragile.studies.judgebias.analysis import *  # noqa: F401,F403
from mmfragile.studies.judgebias.analysis import __all__  # noqa: F401
from mmfragile.studies.judgebias.study import (STUDY, JudgeData, generate_responses, pair_items, run_judge,  # noqa: F401
                                               run_pairwise, score_items)
