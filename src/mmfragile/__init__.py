"""mmfragile: measure how fragile multimodal-model evaluations are.

Reproduces three studies: prompt-format bias in multiple-choice VQA, Promptception prompt
sensitivity, and MM-JudgeBias (MLLM-as-a-judge compositional bias).
"""
__version__ = "0.1.0"
