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

The sandbox blocks escapes, not work; a template from elsewhere also renders under a budget
(``render_with_spans``' ``seconds`` and ``max_chars``, ``ChatTemplate``'s settings): the
output is counted block by block, a ``*`` or ``**`` whose result would pass ``max_chars``
(``'A' * 4000000000``) and a call or width filter given an integer above it
(``'a'.center(10**10)``) are refused before they allocate, and a render still running at
its deadline is stopped (an exception raised in its thread at the next bytecode: nested
``range(100000)`` loops). Each is ``TemplateBudgetError``, naming the budget.
"""

import ctypes
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


class TemplateBudgetError(ValueError):
    """A chat template that needs more time or output than its budget allows."""


class _Deadline(BaseException):  # noqa: N818 (raised into the rendering thread; BaseException: no template catches it)
    pass


_budget = threading.local()  # .max_chars of the render running in this thread


def _max_chars():
    return getattr(_budget, "max_chars", None)


def _check_size(size, what):
    limit = _max_chars()
    if limit is not None and size > limit:
        raise TemplateBudgetError(
            f"the chat template asks for {what} of {size:,}, above its output budget of {limit:,} characters"
        )


def _sized_binop(operation, left, right):
    """``left * right`` / ``left ** right`` refused when the result would pass the budget."""
    if operation == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                _check_size(len(sequence) * count, "a repetition")
        return left * right
    if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        _check_size(int(right * abs(left).bit_length() * 0.302) + 1, "a power of digits")  # log10(2) ~ 0.301
    return left**right


def _sized_arguments(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            _check_size(abs(value), "an integer argument")


def _sized_filter(jinja2, function):
    """``function`` (a filter taking a width: ``center``, ``indent``) with its integer arguments
    checked; marked ``pass_context`` so that the compiler never runs it on constants at
    compile time, outside the budget (``Filter.as_const`` refuses such filters)."""

    @jinja2.pass_context
    def checked(context, *args, **kwargs):
        _sized_arguments(args[1:], kwargs)
        return function(*args, **kwargs)

    return checked


def _environment_class(jinja2):
    class BudgetedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator_name, left, right):
            return _sized_binop(operator_name, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            _sized_arguments(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    return BudgetedEnvironment


@functools.lru_cache(maxsize=64)
def compile_template(source):
    """The compiled ``jinja2.Template`` of a chat template's text (cached by text)."""
    jinja2 = jinja2_module()
    environment = _environment_class(jinja2)(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_generation_extension(jinja2), jinja2.ext.loopcontrols],
    )
    for name in ("center", "indent"):
        environment.filters[name] = _sized_filter(jinja2, environment.filters[name])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = functools.partial(_raise_exception, jinja2)
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(source)


def render_with_spans(template, variables, *, seconds=None, max_chars=None):
    """``(text, spans)``: the template rendered with ``variables`` and the ``(start, end)``
    character span of each ``{% generation %}`` block's output in ``text``, in order.

    Rendered block by block (``Template.generate``), as transformers does: a block's start
    is the length of what was rendered before it. ``seconds`` / ``max_chars`` (None: no
    limit): the budget (module doc); ``TemplateBudgetError`` when it is passed."""
    blocks, spans, size = [], [], 0
    _recording.blocks, _recording.spans = blocks, spans
    _budget.max_chars = max_chars
    try:
        with _deadline(seconds):
            for block in template.generate(**variables):
                blocks.append(block)
                size += len(block)
                _check_size(size, "output")
    except _Deadline:
        raise TemplateBudgetError(
            f"the chat template did not finish rendering within its budget of {seconds:g} s (a loop without end?)"
        ) from None
    finally:
        _recording.blocks = _recording.spans = _budget.max_chars = None
    return "".join(blocks), spans


class _deadline:  # noqa: N801 (a context manager used as a function)
    """Within the block, ``_Deadline`` is raised in this thread once ``seconds`` have passed
    (CPython's ``PyThreadState_SetAsyncExc``: at the thread's next bytecode)."""

    def __init__(self, seconds):
        self.seconds, self.lock, self.done, self.fired = seconds, threading.Lock(), False, False

    def __enter__(self):
        if self.seconds is not None:
            self.thread = threading.get_ident()
            self.timer = threading.Timer(self.seconds, self._fire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def _fire(self):
        with self.lock:
            if not self.done:
                self.fired = True
                _set_async_exception(self.thread, _Deadline)

    def __exit__(self, *exc):
        if self.seconds is None:
            return False
        with self.lock:
            self.done = True
            self.timer.cancel()
            if self.fired:  # raised already, or still pending: clear a pending one
                _set_async_exception(self.thread, None)
        return False


def _set_async_exception(thread, exception):
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exception) if exception is not None else ctypes.c_void_p(0)
    )


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
