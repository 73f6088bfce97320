"""A tiny byte-level BPE (about 300 tokens) trained with the ``tokenizers`` library, and a
Hugging Face folder holding it: what the tokenizer and preprocessor tests read."""

import functools
import json
import os

# ids 0..3, in this order: the pad id is not 0, so padding with 0 by mistake shows
SPECIAL_TOKENS = ("<s>", "</s>", "<eot>", "<pad>")
START, END, EOT, PAD = range(4)

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "def add(x, y): return x + y",
    "for i in range(10): print(i)",
    "a language model predicts the next token from the tokens before it",
] * 20


@functools.lru_cache(maxsize=1)
def tiny_bpe_json():
    """The ``tokenizer.json`` text: ByteLevel BPE whose post-processor prepends ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", START)]
    )
    return tokenizer.to_str()


def write_hf_folder(folder, config=None, generation=None):
    """``tokenizer.json`` + ``tokenizer_config.json`` (+ ``generation_config.json``) in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write(tiny_bpe_json())
    if config is None:  # the shapes a real config uses: a plain string and an AddedToken dict
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": {"content": "</s>", "special": True},
        }
        config["pad_token"] = "<pad>"
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if generation is not None:
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump(generation, f)
    return folder
