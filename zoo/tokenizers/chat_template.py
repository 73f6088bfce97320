"""``ChatTemplate``: a model's chat template rendered as ``transformers``' ``apply_chat_template``.

Instruction-tuned checkpoints carry a Jinja template that turns a list of messages
(``{"role": ..., "content": ...}``) into the text the model was trained on. Hugging Face
folders hold it in ``chat_template.jinja`` or under ``"chat_template"`` in
``tokenizer_config.json``; ``ChatTemplate.from_directory`` reads either (the file first,
as transformers does).

Rendering matches transformers (4.57.6 checked): the same Jinja environment
(``zoo/tokenizers/_jinja.py``), the variables ``messages``, ``add_generation_prompt``,
``tools=None``, ``documents=None`` and the tokenizer's special tokens (``bos_token``,
``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``,
``additional_special_tokens``, the ``extra_special_tokens``; those it has), then the
caller's keyword arguments (``date_string="26 Jul 2024"`` for Llama 3's), which win.

Assistant spans (``assistant_spans``): the characters of the rendered conversation that
the model is to produce, where an assistant-only loss goes (TRL's ``assistant_only_loss``).

- A template with ``{% generation %}`` blocks marks them itself: the spans are the blocks'
  output, as transformers' ``return_assistant_tokens_mask`` takes them.
- Published templates mostly have none. Then the span of assistant message ``i`` is found
  by rendering prefixes: it is the text that ``render(messages[:i + 1])`` adds to
  ``render(messages[:i], add_generation_prompt=True)``, i.e. the message's content and
  whatever the template writes after it (its end-of-turn token, and a newline in ChatML).
  Each ``render(messages[:i + 1])`` must begin the rendering of the whole conversation, and
  the generation prompt must begin ``render(messages[:i + 1])``; a template that rewrites
  earlier turns (one that drops past reasoning, say) is refused with the turn named.
  ``zoo.tokenizers.chat.encode_chat`` then ends each such span at its last stop token, so
  the mask holds the content and the end-of-turn token, as a ``{% generation %}`` block
  around ``content + end token`` would.

``jinja2`` is needed to render (``pip install 'keras-zoo[hf]'``), not to read a template.
"""

import os

from zoo.file_kinds import read_json_file, regular_file
from zoo.tokenizers._jinja import GENERATION_TAG, compile_template, jinja2_module, render_with_spans

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATES_DIR = "additional_chat_templates"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
RENDER_SECONDS = 10.0  # a chat template's budget per rendering (a published one takes milliseconds)
MAX_RENDER_CHARS = 16 << 20  # ... and its output: 16M characters, a conversation of ~4M tokens
MAX_TEMPLATE_BYTES = 1 << 20  # published templates are a few KiB (the largest in the fixtures under 20 KiB)
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)  # transformers' SPECIAL_TOKENS_ATTRIBUTES
DEFAULT_NAME = "default"


class ChatTemplate:
    """A chat template and the special tokens it is rendered with.

    Args:
        template: the Jinja text of the template.
        special_tokens: ``{name: token}`` given to the template as variables
            (``{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}``); a list for
            ``additional_special_tokens``. Empty values are dropped, as transformers does.
        render_seconds: the most one rendering may take (``RENDER_SECONDS``; the published
            templates in tests/fixtures take milliseconds); None: no limit.
        max_render_chars: the most characters one rendering may produce, or one ``*``,
            ``**`` or width argument ask for (``MAX_RENDER_CHARS``); None: no limit.
        Past either, ``TemplateBudgetError`` (a ``ValueError``) names the budget.
    """

    def __init__(self, template, special_tokens=None, render_seconds=None, max_render_chars=None):
        if not isinstance(template, str) or not template.strip():
            raise ValueError(f"template must be the non-empty text of a Jinja chat template, got {template!r:.80}")
        self.template = template
        self.render_seconds = RENDER_SECONDS if render_seconds is None else render_seconds
        self.max_render_chars = MAX_RENDER_CHARS if max_render_chars is None else max_render_chars
        tokens = {key: _token_value(value) for key, value in dict(special_tokens or {}).items()}
        self.special_tokens = {key: value for key, value in tokens.items() if value}

    @classmethod
    def from_directory(cls, path, name=None, required=True):
        """The chat template of a Hugging Face folder: ``chat_template.jinja`` (or
        ``additional_chat_templates/<name>.jinja``), else ``tokenizer_config.json``'s
        ``"chat_template"`` (a string, or a list of ``{"name", "template"}``). ``name``
        picks one of several templates (default: the one named ``"default"``). The special
        tokens come from ``tokenizer_config.json``, then ``special_tokens_map.json`` for
        those it lacks. With ``required=False``, a folder without a template gives None."""
        path = os.fspath(path)
        config = _read_json(path, CONFIG_FILE)
        templates = _templates(path, config)
        if not templates:
            if required:
                raise ValueError(
                    f'{path!r} has no chat template: neither {TEMPLATE_FILE} nor a "chat_template" in {CONFIG_FILE}'
                )
            return None
        key = DEFAULT_NAME if name is None else name
        if key not in templates:
            if name is None and len(templates) == 1:
                key = next(iter(templates))
            else:
                raise ValueError(f"{path!r}: no chat template named {key!r}; it has {sorted(templates)}: pass name=")
        return cls(templates[key], special_tokens=_special_tokens(path, config))

    @property
    def has_generation_blocks(self):
        """Whether the template marks assistant text with ``{% generation %}``."""
        return bool(GENERATION_TAG.search(self.template))

    def render(self, messages, add_generation_prompt=False, **variables):
        """The conversation as text, as ``apply_chat_template(messages, tokenize=False, ...)``
        gives it. ``variables`` reach the template too and override the special tokens."""
        return self.render_with_spans(messages, add_generation_prompt, **variables)[0]

    def render_with_spans(self, messages, add_generation_prompt=False, **variables):
        """``(text, spans)``: ``render``'s text and the ``(start, end)`` character spans of
        the template's ``{% generation %}`` blocks in it (none when it has no such block)."""
        check_messages(messages)
        template = compile_template(self.template)
        context = {**self.special_tokens, **variables}
        context.update(messages=list(messages), add_generation_prompt=bool(add_generation_prompt))
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        return render_with_spans(template, context, seconds=self.render_seconds, max_chars=self.max_render_chars)

    def assistant_spans(self, messages, add_generation_prompt=False, **variables):
        """``(text, spans)``: the rendered conversation and the ``(start, end)`` character
        span of each assistant turn in it (the module doc says how they are found)."""
        text, spans = self.render_with_spans(messages, add_generation_prompt, **variables)
        if self.has_generation_blocks:
            return text, spans
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self._prefix(messages[:index], True, index, variables)
            through = self._prefix(messages[: index + 1], False, index, variables)
            if not through.startswith(prompt):
                raise ValueError(
                    f"chat template: the generation prompt before assistant message {index} is not how the "
                    f"template renders that turn ({_differ(prompt, through)}), so its span cannot be found "
                    "by rendering prefixes; give the template {% generation %} blocks"
                )
            if not text.startswith(through):
                raise ValueError(
                    f"chat template: messages[:{index + 1}] render differently inside the whole conversation "
                    f"({_differ(through, text)}): the template rewrites earlier turns, so assistant spans "
                    "cannot be found by rendering prefixes; give the template {% generation %} blocks"
                )
            spans.append((len(prompt), len(through)))
        return text, spans

    def get_config(self):
        return {"template": self.template, "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return isinstance(other, ChatTemplate) and self.get_config() == other.get_config()

    def __repr__(self):
        return f"ChatTemplate({len(self.template)} characters, special_tokens={sorted(self.special_tokens)})"

    def _prefix(self, messages, add_generation_prompt, index, variables):
        jinja2 = jinja2_module()
        try:
            return self.render(messages, add_generation_prompt, **variables)
        except (ValueError, TypeError, jinja2.TemplateError) as error:
            raise ValueError(
                f"chat template: rendering messages[:{len(messages)}] to find assistant message {index}'s "
                f"span failed: {type(error).__name__}: {error}"
            ) from error


def check_messages(messages):
    """A list of message dicts, each with a string ``"role"``: else a ValueError naming the message."""
    if isinstance(messages, (str, bytes, dict)) or not hasattr(messages, "__len__"):
        raise ValueError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got a {type(messages).__name__}"
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(
                f"message {index} must be a dict with 'role' and 'content', got a {type(message).__name__}"
            )
        if not isinstance(message.get("role"), str):
            raise ValueError(
                f"message {index} needs a string 'role' ('system', 'user', 'assistant', ...), got {sorted(message)}"
            )


def _templates(path, config):
    """``{name: text}`` of a folder's templates, the files over the config's."""
    templates = {}
    value = config.get("chat_template")
    if isinstance(value, str):
        templates[DEFAULT_NAME] = value
    elif isinstance(value, list):
        templates.update({entry["name"]: entry["template"] for entry in value})
    elif isinstance(value, dict):
        templates.update(value)
    file = os.path.join(path, TEMPLATE_FILE)
    if os.path.lexists(file):  # a FIFO or a directory by that name is refused, not skipped
        templates[DEFAULT_NAME] = _read_text(file)
    folder = os.path.join(path, TEMPLATES_DIR)
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".jinja"):
                templates[name[: -len(".jinja")]] = _read_text(os.path.join(folder, name))
    return templates


def _special_tokens(path, config):
    """The folder's special tokens by name: tokenizer_config.json's over special_tokens_map.json's."""
    extra = config.get("extra_special_tokens") or {}
    keys = list(SPECIAL_TOKEN_KEYS) + list(extra)
    merged = {
        **_read_json(path, SPECIAL_TOKENS_FILE),
        **{key: value for key, value in config.items() if value is not None},
    }
    merged.update(extra)
    return {key: merged[key] for key in keys if key in merged}


def _token_value(value):
    """A special token as tokenizer_config.json holds it (a string, ``{"content": ...}``,
    or a list of those) -> a string or a list of strings."""
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, (list, tuple)):
        return [_token_value(item) for item in value]
    return value


def _differ(first, second):
    """Where two renderings part, for an error message."""
    at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    return f"they part at character {at}: {first[at : at + 30]!r} vs {second[at : at + 30]!r}"


def _read_text(file):
    """A template file's text; ``ValueError`` naming it when it is a special file, above
    ``MAX_TEMPLATE_BYTES`` or not UTF-8."""
    regular_file(file, what="a chat template file")
    if os.path.getsize(file) > MAX_TEMPLATE_BYTES:
        raise ValueError(
            f"{file} is {os.path.getsize(file):,} bytes, above the {MAX_TEMPLATE_BYTES:,} a chat template may have"
        )
    with open(file, encoding="utf-8") as f:
        try:
            return f.read()
        except UnicodeDecodeError as error:
            raise ValueError(f"{file} is not UTF-8 text: {error}") from None


def _read_json(path, name):
    file = os.path.join(path, name)
    if not os.path.lexists(file):
        return {}
    value = read_json_file(file, max_bytes=64 << 20)  # tokenizer_config.json: a few MiB with 256k added tokens
    if not isinstance(value, dict):
        raise ValueError(f"{file} holds a JSON {type(value).__name__}, not an object of keys")
    return value
