"""GPT-style decoder language models: backbone, causal LM with KV-cache generation, its preprocessor, named sizes."""

from zoo.models.gpt._generation import check_lengths
from zoo.models.gpt._probe import NonFiniteModelError, check_finite_logits, non_finite_error
from zoo.models.gpt.gpt_backbone import GPTBackbone
from zoo.models.gpt.gpt_causal_lm import GPTCausalLM
from zoo.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from zoo.models.gpt.gpt_configs import GPT_CONFIGS, count_parameters

__all__ = [
    "GPT_CONFIGS",
    "GPTBackbone",
    "GPTCausalLM",
    "GPTCausalLMPreprocessor",
    "NonFiniteModelError",
    "check_finite_logits",
    "non_finite_error",
    "check_lengths",
    "count_parameters",
]
