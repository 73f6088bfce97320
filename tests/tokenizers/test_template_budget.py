"""Chat templates render under a budget (issue 46, item 2): the sandbox blocks escapes, and
``ChatTemplate``'s ``render_seconds`` / ``max_render_chars`` bound the work. Each hostile
template is refused in one line naming the budget, before it allocates; the published
templates (tests/fixtures/hf, test_chat_template.py) render under the defaults."""

import resource
import time

import pytest

pytest.importorskip("jinja2")

from zoo.tokenizers._jinja import TemplateBudgetError
from zoo.tokenizers.chat_template import MAX_RENDER_CHARS, RENDER_SECONDS, ChatTemplate

MESSAGES = [{"role": "user", "content": "hi"}]
SECONDS = 0.3  # the loop cases' budget here (the default is RENDER_SECONDS)
CASES = [
    ("nested-range-loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     rf"did not finish rendering within its budget of {SECONDS:g} s"),
    ("nested-loops-over-a-list", "{% set l = range(100000)|list %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}",
     rf"did not finish rendering within its budget of {SECONDS:g} s"),
    ("string-times-4e9", "{{ 'A' * 4000000000 }}", r"asks for a repetition of 4,000,000,000, above its output budget of 16,777,216"),
    ("list-times-4e9", "{{ ([1] * 4000000000)|length }}", r"asks for a repetition of 4,000,000,000"),
    ("huge-power", "{{ 7 ** 100000000 }}", r"asks for a power of digits of [0-9,]+, above its output budget"),
    ("center-method", "{{ 'a'.center(4000000000) }}", r"asks for an integer argument of 4,000,000,000"),
    ("center-filter-constant", "{{ 'a'|center(4000000000) }}", r"asks for an integer argument of 4,000,000,000"),
    ("output-grows-past-budget", "{% for i in range(20000) %}{{ 'x' * 1000 }}{% endfor %}", r"asks for output of [0-9,]+, above its output budget"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_template_past_its_budget_is_refused_in_one_line(source, message):
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(TemplateBudgetError, match=message) as raised:
        ChatTemplate(source, render_seconds=SECONDS).render(MESSAGES)
    assert "\n" not in str(raised.value)
    assert time.perf_counter() - start < SECONDS + 1.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KiB: no 4 GB allocated


def test_the_defaults_and_a_render_after_a_refusal():
    template = ChatTemplate("{{ messages[0]['content'] }}|{{ 'ab'|center(6) }}|{{ 'x' * 3 }}|{{ 2 ** 10 }}")
    assert (
        (template.render_seconds, template.max_render_chars) == (RENDER_SECONDS, MAX_RENDER_CHARS) == (10.0, 16 << 20)
    )
    with pytest.raises(TemplateBudgetError):
        ChatTemplate(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", render_seconds=0.1
        ).render(MESSAGES)
    time.sleep(0.2)  # a deadline that fired must not reach later code
    assert template.render(MESSAGES) == "hi|  ab  |xxx|1024"
