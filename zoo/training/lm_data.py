"""The data of a causal-LM fine-tune (``zoo finetune``): the training and held-out
examples from a data file or a language-modelling dataset, packed or not, and a chat
template for ``{"messages"}`` data (docs/finetuning.md, "Data")."""

import os

from zoo.data import pack_examples, padding_fraction
from zoo.data.chat_files import is_messages_jsonl, load_chat_file
from zoo.data.text_files import JSONL_SUFFIXES, dataset_text, load_text_file, pack_texts, read_text, split_held_out
from zoo.tokenizers import HFTokenizer
from zoo.tokenizers.chat import template_of


def use_chat_template(tokenizer, path):
    """Make the Jinja template in the file ``path`` the tokenizer's chat template: read
    for ``{"messages"}`` data and saved with the tokenizer (``--chat-template``)."""
    if not isinstance(tokenizer, HFTokenizer):
        raise ValueError(
            f"--chat-template {path}: the model's tokenizer is a {type(tokenizer).__name__}; "
            "chat templates go with a Hugging Face tokenizer (tokenizer.json)"
        )
    tokenizer.chat_template = template_of(tokenizer, read_text(path))


def lm_data(settings, preprocessor, report=print):
    """``(train, held_out)`` ``LMExamples`` from ``settings.data_file`` (and
    ``validation_file``, else its last ``validation_fraction``) or from the
    language-modelling ``settings.dataset`` (its validation split); ``train_examples`` /
    ``test_examples`` keep the first N of each."""
    if settings.data_file:
        examples = load_lm_file(settings.data_file, preprocessor, packing=settings.packing)
        if settings.validation_file:
            train, held_out = examples, load_lm_file(settings.validation_file, preprocessor, packing=settings.packing)
        else:
            train, held_out = split_held_out(examples, settings.validation_fraction)
    else:
        text = dataset_text(settings.dataset, "train", data_dir=settings.data_dir)  # refuses a classification dataset
        train = pack_texts([text], preprocessor, segments=settings.packing)
        held_out = pack_texts(
            [dataset_text(settings.dataset, "validation", data_dir=settings.data_dir)],
            preprocessor,
            segments=settings.packing,
        )
    train, held_out = train[: settings.train_examples], held_out[: settings.test_examples]
    if settings.data_file:  # every example left out or cut, counted, in one line before training
        files = [(settings.data_file, examples)]
        if settings.validation_file:
            files.append((settings.validation_file, held_out))
        dropped = [f"{path}: {', '.join(part.dropped)}" for path, part in files if part.dropped]
        if dropped:
            report(f"data {'; '.join(dropped)}")
    if settings.packing:
        train, held_out = (
            packed(examples, name, report) for examples, name in ((train, "training"), (held_out, "held-out"))
        )
    report(
        f"data {data_source(settings)}: {len(train)} training examples ({train.loss_tokens:,} tokens in the loss), "
        f"{len(held_out)} held out ({held_out.loss_tokens:,})"
    )
    return train, (held_out if len(held_out) else None)


def packed(examples, name, report=print):
    """``examples`` packed (``zoo.data.pack_examples``; windows of text already in rows keep
    their rows), with a line saying the padding before and after."""
    if not len(examples) or examples.segment_ids is not None:
        return examples
    result = pack_examples(examples)
    report(
        f"packing {name}: {len(examples)} rows -> {len(result)}, padding {padding_fraction(examples):.1%} -> "
        f"{padding_fraction(result):.1%} of the tokens"
    )
    return result


def load_lm_file(path, preprocessor, *, packing=False):
    """``LMExamples`` of a data file: ``{"messages": [...]}`` JSONL through the tokenizer's
    chat template, the loss on the assistant turns (``zoo.data.chat_files``); any other
    JSONL or text as ``zoo.data.text_files`` reads it."""
    if os.fspath(path).lower().endswith(JSONL_SUFFIXES) and is_messages_jsonl(path):
        if getattr(preprocessor.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f'{path}: {{"messages"}} data goes through a chat template, and the model\'s tokenizer '
                f"({type(preprocessor.tokenizer).__name__}) has none; give --chat-template FILE (a Jinja template)"
            )
        return load_chat_file(path, preprocessor)
    return load_text_file(path, preprocessor, segments=packing)


def data_source(settings):
    """What ``settings`` trains on, in words: the data file, else the dataset's name."""
    return settings.data_file or settings.dataset
