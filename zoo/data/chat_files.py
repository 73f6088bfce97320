"""Chat data for fine-tuning: ``{"messages": [...]}`` JSONL as ``LMExamples`` with the loss
on the assistant turns only (TRL's ``assistant_only_loss``).

File format (UTF-8), one JSON object a line (blank lines skipped), the format SFT datasets use::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}

Each conversation goes through the tokenizer's chat template as transformers'
``apply_chat_template`` renders and tokenizes it (``zoo.tokenizers.chat.encode_chat``: no
start token added besides the one the template writes), and the loss mask is 1 exactly on
the assistant turns' tokens (content and end-of-turn token). A row is those ids cut to
``T + 1`` tokens and right-padded (``pad_token_id``, else 0): ``token_ids`` = row[:-1],
``labels`` = row[1:], ``sample_weight`` = the mask of each label, 0 on padding. A
conversation whose assistant tokens all lie past ``T + 1`` is left out.

Like ``zoo.data.text_files``, this takes the preprocessor (anything with ``tokenizer`` and
``sequence_length``) or the tokenizer as an argument and imports no model.
"""

import json

import numpy as np

from zoo.data.text_files import LMExamples, read_text
from zoo.tokenizers.chat import encode_chat

MESSAGES_KEY = "messages"


def is_messages_jsonl(path):
    """Whether a JSONL file's first non-blank line is an object with a ``"messages"`` key."""
    for line in read_text(path).splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return False
            return isinstance(record, dict) and MESSAGES_KEY in record
    return False


def read_messages_jsonl(path):
    """The conversations of a ``{"messages": [...]}`` JSONL file: a list of message lists.

    Every message is an object with a string ``"role"`` and a string ``"content"``; every
    conversation has an assistant turn (else nothing of it is trained on). Errors name
    the file, the line and the message."""
    conversations = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict) or MESSAGES_KEY not in record:
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}}, got {got}')
        conversations.append(_conversation(where, record[MESSAGES_KEY]))
    if not conversations:
        raise ValueError(f"{path}: no conversations (the file holds only blank lines)")
    return conversations


def chat_examples(conversations, tokenizer, sequence_length, where="conversations", **variables):
    """``LMExamples`` (N, T) of conversations (lists of messages): see the module doc.
    ``variables`` reach the chat template (``date_string=...``)."""
    rows, masks, lengths = [], [], []
    for conversation in conversations:
        ids, mask = encode_chat(tokenizer, conversation, **variables)
        lengths.append(len(ids))
        rows.append(ids[: sequence_length + 1])
        masks.append(mask[: sequence_length + 1])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    packed = np.full((len(rows), sequence_length + 1), pad, np.int32)  # (N, T + 1)
    weight = np.zeros((len(rows), sequence_length + 1), np.float32)
    for index, (row, mask) in enumerate(zip(rows, masks)):
        packed[index, : len(row)] = row
        weight[index, : len(mask)] = mask
    keep = weight[:, 1:].sum(axis=1) > 0
    if not keep.any():
        raise ValueError(
            f"{where}: no conversation has an assistant token within sequence length {sequence_length}; "
            "raise --sequence-length"
        )
    longest = max(lengths) - 1  # the --sequence-length that keeps every conversation whole
    dropped = []
    if not keep.all():
        dropped.append(
            f"left out {np.count_nonzero(~keep)} of {len(keep)} conversations (no assistant token within sequence "
            f"length {sequence_length}; --sequence-length {longest} keeps them)"
        )
    cut = sum(1 for length, kept in zip(lengths, keep) if kept and length > sequence_length + 1)
    if cut:
        dropped.append(
            f"cut {cut} of {len(keep)} conversations at sequence length {sequence_length}, losing their later tokens "
            f"(--sequence-length {longest} keeps them whole)"
        )
    examples = LMExamples(packed[:, :-1], packed[:, 1:], weight[:, 1:], dropped=tuple(dropped))
    return examples if keep.all() else examples[np.flatnonzero(keep)]


def load_chat_file(path, preprocessor, **variables):
    """``LMExamples`` of a ``{"messages": [...]}`` JSONL file, rows of
    ``preprocessor.sequence_length`` tokens, through ``preprocessor.tokenizer``'s chat template."""
    tokenizer, length = preprocessor.tokenizer, preprocessor.sequence_length
    return chat_examples(read_messages_jsonl(path), tokenizer, length, where=str(path), **variables)


def _conversation(where, messages):
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}: message {index} must be an object, got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(f"{where}: message {index} needs a string {key!r}, it has {sorted(message)}")
    if not any(message["role"] == "assistant" for message in messages):
        raise ValueError(f"{where}: no assistant message, so nothing to put the loss on")
    return messages
