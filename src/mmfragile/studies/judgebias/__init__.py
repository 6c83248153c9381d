"""Study 3: MM-JudgeBias (seed ``mm-judgebias``): judge prompts and parsers, the nine perturbations, the judge
data, metrics, plots; the study-level API is re-exported here."""
from mmfragile.studies.judgebias.items import *  # noqa: F401,F403
from mmfragile.studies.judgebias.analysis import *  # noqa: F401,F403
from mmfragile.studies.judgebias import analysis as _read, items as _run

__all__ = [*_run.__all__, *_read.__all__]
from mmfragile.studies.judgebias.study import STUDY, JudgeData, pair_items, score_items  # noqa: F401
