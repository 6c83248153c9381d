"""The nine perturbations of MM-JudgeBias (Table 1), in the paper's column order: the one catalogue the
perturbation functions, the metrics, the plots and the study read."""
from __future__ import annotations

#: name -> dimension, metric (BD: bias deviation, BC: bias conformity) and the column label of Tables 1-2.
PERTURBATION_INFO: dict[str, dict[str, str]] = {
    "text_dominance": {"dimension": "integrality", "metric": "BD", "label": "TextDom."},
    "image_dominance": {"dimension": "integrality", "metric": "BD", "label": "ImgDom."},
    "response_dominance": {"dimension": "integrality", "metric": "BD", "label": "RespDom."},
    "instruction_misalignment": {"dimension": "congruity", "metric": "BD", "label": "InstrMis."},
    "image_misalignment": {"dimension": "congruity", "metric": "BD", "label": "ImgMis."},
    "detail_description": {"dimension": "robustness", "metric": "BC", "label": "DetailDesc."},
    "unnecessary_image": {"dimension": "robustness", "metric": "BC", "label": "UnnecImg."},
    "visual_transformation": {"dimension": "robustness", "metric": "BC", "label": "VisualTrans."},
    "texture_insertion": {"dimension": "robustness", "metric": "BC", "label": "TextInsert."},
}
#: The nine bias types, in the paper's column order.
PERTURBATION_NAMES: tuple[str, ...] = tuple(PERTURBATION_INFO)
DIMENSIONS: tuple[str, ...] = ("integrality", "congruity", "robustness")
#: ``meta["perturbation"]`` / the condition of an unbiased judgment.
UNPERTURBED = "original"
