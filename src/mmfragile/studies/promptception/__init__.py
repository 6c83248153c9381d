"""Study 2: Promptception (seed ``promptception``): the 61-prompt catalog, items, two-stage scoring, metrics,
plots; the study-level API is re-exported here."""
from mmfragile.studies.promptception.analysis import *  # noqa: F401,F403
from mmfragile.studies.promptception.analysis import __all__  # noqa: F401
from mmfragile.studies.promptception.study import STUDY  # noqa: F401
