"""Jinja2 set up as ``transformers``' ``apply_chat_template`` sets it up.

Checked against transformers 4.57.6 (``transformers/utils/chat_template_utils.py``,
``_compile_jinja_template`` and ``render_jinja_template``), written to behave the same:

- ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)``
  with the ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``);
- a ``{% generation %} ... {% endgeneration %}`` block that renders its body unchanged and,
  while spans are being recorded, notes the body's character span in the output;
- the ``tojson`` filter replaced by ``json.dumps`` (no HTML escaping, ``ensure_ascii=False``;
  ``indent``, ``separators``, ``sort_keys`` accepted);
- the globals ``raise_exception(message)`` (raises ``jinja2.TemplateError``) and
  ``strftime_now(format)`` (the local time now, ``datetime.now().strftime``).

``jinja2`` (>= 3.1, as transformers requires) is imported when a template is first
compiled, not with this module: ``pip install 'keras-zoo[hf]'``.
"""

import datetime
import functools
import json
import re
import threading

INSTALL = "pip install 'keras-zoo[hf]'"
MIN_VERSION = (3, 1)
GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")  # transformers' test for {% generation %}

_recording = threading.local()  # .blocks: output so far, .spans: (start, end) of generation blocks


def jinja2_module():
    """``jinja2``, or an ImportError that says how to install it."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as error:
        raise ImportError(f"chat templates need the `jinja2` library (>= 3.1): {INSTALL}") from error
    version = tuple(int(part) for part in re.findall(r"\d+", jinja2.__version__)[:2])
    if version < MIN_VERSION:
        raise ImportError(
            f"chat templates need jinja2 >= 3.1 (as transformers does), found {jinja2.__version__}: {INSTALL}"
        )
    return jinja2


@functools.lru_cache(maxsize=64)
def compile_template(source):
    """The compiled ``jinja2.Template`` of a chat template's text (cached by text)."""
    jinja2 = jinja2_module()
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(jinja2), jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = functools.partial(_raise_exception, jinja2)
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(source)


def render_with_spans(template, variables):
    """``(text, spans)``: the template rendered with ``variables`` and the ``(start, end)``
    character span of each ``{% generation %}`` block's output in ``text``, in order.

    Rendered block by block (``Template.generate``), as transformers does: a block's start
    is the length of what was rendered before it."""
    blocks, spans = [], []
    _recording.blocks, _recording.spans = blocks, spans
    try:
        for block in template.generate(**variables):
            blocks.append(block)
    finally:
        _recording.blocks = _recording.spans = None
    return "".join(blocks), spans


def _generation_extension(jinja2):
    class GenerationBlocks(jinja2.ext.Extension):
        """``{% generation %}body{% endgeneration %}``: the body, its span recorded."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            text = caller()
            blocks, spans = getattr(_recording, "blocks", None), getattr(_recording, "spans", None)
            if spans is not None:
                start = sum(len(block) for block in blocks)
                spans.append((start, start + len(text)))
            return text

    return GenerationBlocks


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(jinja2, message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)
