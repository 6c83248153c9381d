"""Study 2: Promptception (seed ``promptception``): the 61-prompt catalog, items, two-stage scoring, metrics,
plots; the study-level API (run side and read side) is re-exported here."""
from mmfragile.studies.promptception.items import *  # noqa: F401,F403
from mmfragile.studies.promptception.analysis import *  # noqa: F401,F403
from mmfragile.studies.promptception import analysis as _read, items as _run
from mmfragile.studies.promptception.study import STUDY  # noqa: F401

__all__ = [*_run.__all__, *_read.__all__]
