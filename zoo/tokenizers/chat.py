"""Chat conversations -> token ids, and the assistant-only loss mask for training.

- ``apply_chat_template(tokenizer, messages, ...)``: the text, or its token ids, as
  ``transformers``' ``tokenizer.apply_chat_template(messages, tokenize=..., ...)`` gives
  them. The text is tokenized whole with ``add_special_tokens=False``, as transformers
  does: a template that writes ``bos_token`` itself gets one start token, not two.
- ``encode_chat(tokenizer, messages)``: ``(token_ids, loss_mask)``, int32 ``(L,)`` each;
  ``loss_mask`` is 1 exactly on the tokens of the assistant turns (TRL's
  ``assistant_only_loss``): their content and the end-of-turn token.

The mask: the assistant turns' character spans (``ChatTemplate.assistant_spans``: the
template's ``{% generation %}`` blocks, else found by rendering prefixes) mapped to
tokens as transformers' ``return_assistant_tokens_mask`` maps them (from the token that
holds the span's first character to the one that holds its last). A span found by
prefixes also holds what the template writes after the turn's end token (ChatML's
newline): it is cut after its last stop token (``tokenizer.stop_token_ids``: the end
token and generation_config's ``eos_token_id``), which the model is to produce, and
nothing after it. A span with no stop token is kept whole.

The tokenizer is an ``HFTokenizer`` (its ``tokenizers`` encoding gives the character
offsets); the template is ``chat_template=`` (a ``ChatTemplate`` or its text) or the
tokenizer's own ``chat_template``.
"""

import numpy as np

from zoo.tokenizers.chat_template import ChatTemplate


def apply_chat_template(
    tokenizer, messages, add_generation_prompt=False, tokenize=True, chat_template=None, **variables
):
    """The rendered conversation (``tokenize=False``) or its int32 token ids ``(L,)``;
    ``variables`` reach the template (``date_string=...``)."""
    template = template_of(tokenizer, chat_template)
    text = template.render(messages, add_generation_prompt, **variables)
    if not tokenize:
        return text
    return np.asarray(_encoding(tokenizer, text).ids, np.int32)


def encode_chat(tokenizer, messages, add_generation_prompt=False, chat_template=None, **variables):
    """``(token_ids, loss_mask)``, int32 ``(L,)`` each: the conversation's ids (as
    ``apply_chat_template``) and 1 on the tokens of its assistant turns (module doc)."""
    template = template_of(tokenizer, chat_template)
    text, spans = template.assistant_spans(messages, add_generation_prompt, **variables)
    encoding = _encoding(tokenizer, text)
    ids = np.asarray(encoding.ids, np.int32)
    mask = np.zeros(len(ids), np.int32)
    stops = np.asarray(tokenizer.stop_token_ids, np.int64)
    trim = not template.has_generation_blocks
    for start, end in spans:
        if start >= end:
            continue
        first = encoding.char_to_token(start)
        if first is None:  # as transformers: the span lies past the tokens
            break
        last = encoding.char_to_token(end - 1)
        last = len(ids) - 1 if last is None else last
        if trim:
            in_span = np.flatnonzero(np.isin(ids[first : last + 1], stops))
            last = first + int(in_span[-1]) if in_span.size else last
        mask[first : last + 1] = 1
    return ids, mask


def template_of(tokenizer, chat_template=None):
    """The ``ChatTemplate`` to use: ``chat_template`` (a ``ChatTemplate``, or its text with
    the tokenizer's start / end / pad tokens), else the tokenizer's."""
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    if isinstance(chat_template, str):
        return ChatTemplate(chat_template, special_tokens=default_special_tokens(tokenizer))
    if chat_template is not None:
        raise TypeError(
            f"chat_template must be a ChatTemplate or the text of one, got a {type(chat_template).__name__}"
        )
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ValueError(
            f"the {type(tokenizer).__name__} has no chat template (its Hugging Face folder has neither "
            'chat_template.jinja nor a "chat_template" in tokenizer_config.json): pass chat_template='
        )
    return template


def default_special_tokens(tokenizer):
    """``bos_token`` / ``eos_token`` / ``pad_token``: a zoo tokenizer's start, end and pad tokens."""
    names = (("bos_token", "start_token"), ("eos_token", "end_token"), ("pad_token", "pad_token"))
    return {key: getattr(tokenizer, attribute, None) for key, attribute in names if getattr(tokenizer, attribute, None)}


def _encoding(tokenizer, text):
    library = getattr(tokenizer, "library", None)
    if library is None or not hasattr(library, "encode"):
        raise TypeError(f"chat token ids need an HFTokenizer (a tokenizer.json), got a {type(tokenizer).__name__}")
    return library.encode(text, add_special_tokens=False)
