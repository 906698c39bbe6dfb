"""npurt's chat templates against Python's jinja2 set up as Hugging Face renders chat
templates (the reference): the real templates in chat_templates/ over random
conversations, and small templates that exercise one construct each. Equal text, or
both refuse (a raise_exception's message the same on both sides)."""

import datetime
import json
import os
import pathlib
import random
import subprocess

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest

HERE = pathlib.Path(__file__).parent
TEMPLATES = sorted((HERE / "chat_templates").glob("*.jinja"))
TOOL = os.environ.get("NPURT_RENDER_TEMPLATE", str(HERE.parents[1] / "build/tests/serve/render_chat_template"))

# bos and eos of each template's model (chat_templates/SOURCES.md).
SPECIALS = {
    "gemma": ("<bos>", "<eos>"),
    "llama": ("<|begin_of_text|>", "<|eot_id|>"),
    "hermes": ("<|begin_of_text|>", "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
    "phi": ("<s>", "<|endoftext|>"),
    "qwen": ("<|im_start|>", "<|im_end|>"),
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def reference_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


ENV = reference_env()


def reference(template, variables):
    """("text", s), ("raised", message) or ("error", kind)."""
    try:
        return ("text", ENV.from_string(template).render(**variables))
    except Raised as e:
        return ("raised", str(e))
    except Exception as e:  # noqa: BLE001: any refusal of jinja2's
        return ("error", type(e).__name__)


def ours(cases):
    """The tool's results for [(template, variables)], in one process."""
    payload = json.dumps([{"template": t, "variables": v} for t, v in cases])
    out = subprocess.run([TOOL], input=payload, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def compare(cases):
    """Every case's text equal on both sides, or both refuse; returns how many rendered."""
    rendered = 0
    mismatches = []
    for (template, variables), got in zip(cases, ours(cases)):
        kind, want = reference(template, variables)
        if kind == "text":
            rendered += 1
            if got.get("text") != want:
                mismatches.append((template[:80], variables, want, got))
        elif "error" not in got:
            mismatches.append((template[:80], variables, f"jinja2 refused ({kind}: {want})", got))
        elif kind == "raised" and not got["error"].endswith(want):
            mismatches.append((template[:80], variables, f"raised {want!r}", got))
    assert not mismatches, "\n\n".join(repr(m) for m in mismatches[:5]) + f"\n\n{len(mismatches)} of {len(cases)} differ"
    return rendered


WORDS = ["Hi", "hello", "What is 2+2?", "  padded  ", "\nnew\nlines\n", "tab\there", "quotes ' and \"",
         "braces {{ x }} {% y %}", "<start_of_turn>", "unicode: héllo wörld 日本語 🙂", "\u00a0nbsp\u3000",
         "back\\slash", "", "end of turn <end_of_turn>", "x" * 40]


def text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def content(rng):
    if rng.random() < 0.15:
        return [{"type": "text", "text": text(rng)} for _ in range(rng.randint(1, 2))]
    return text(rng)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def conversation(rng, specials):
    """Random variables: mostly well-formed alternating turns, sometimes not."""
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": text(rng)})
    turns = rng.randint(1, 6)
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        if rng.random() < 0.05:
            role = rng.choice(["user", "assistant", "tool"])  # out of order
        messages.append({"role": role, "content": content(rng) if role == "user" else text(rng)})
    variables = {"messages": messages, "bos_token": specials[0], "eos_token": specials[1],
                 "add_generation_prompt": rng.random() < 0.8, "date_string": "07 Dec 2026"}
    if rng.random() < 0.2:
        variables["tools"] = TOOLS
    return variables


def specials_of(path):
    for prefix, specials in SPECIALS.items():
        if path.name.startswith(prefix):
            return specials
    return ("<s>", "</s>")


def test_the_real_templates_are_here():
    assert len(TEMPLATES) >= 6, TEMPLATES


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_real_template_over_random_conversations(path):
    rng = random.Random(path.stem)
    template = path.read_text()
    cases = [(template, conversation(rng, specials_of(path))) for _ in range(60)]
    # Most conversations render (the rest are refused alike on both sides).
    assert compare(cases) >= 25


# One construct each; every one rendered with each variable set below.
CONSTRUCTS = [
    "a {{ x }} b",
    "{{- x -}}  \n  {{ y }}",
    "  {% if x %}\n  yes\n  {% endif %}\n  after",
    "line\n    {%- if x %} t {% endif -%}  \nend",
    "{% for m in items %}{{ loop.index0 }}/{{ loop.index }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
    "{% for m in items if m is string %}[{{ m }}]{% else %}empty{% endfor %}",
    "{% for m in items %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m }}{% endfor %}",
    "{% for m in items %}{% if m is number %}{% continue %}{% endif %}{{ m }},{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }} {% endfor %}",
    "{% set a = 1 %}{% for m in items %}{% set a = a + 1 %}{{ a }}{% endfor %}:{{ a }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in items %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "{% if x %}{% set z = 'in if' %}{% endif %}{{ z }}",
    "{{ items[1:] }}|{{ items[:-1] }}|{{ items[::-1] }}|{{ items[-1] }}|{{ y[1:3] }}|{{ y[::-1] }}",
    "{{ items | length }} {{ y | length }} {{ d | length }} {{ items | first }} {{ items | last }}",
    "{{ y | trim }}|{{ y | upper }}|{{ y | lower }}|{{ y | capitalize }}|{{ y | title }}",
    "{{ d | tojson }}|{{ items | tojson }}|{{ y | tojson }}|{{ d | tojson(indent=2) }}",
    "{{ items | join(', ') }}|{{ items | reverse | list }}|{{ y | replace('a', 'A') }}",
    "{{ x | default('dflt') }}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}",
    "{{ rows | selectattr('role', 'equalto', 'user') | list | length }}|{{ rows | map(attribute='role') | join(',') }}",
    "{{ rows | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
    "{{ x is defined }} {{ missing is defined }} {{ none is none }} {{ y is string }} {{ 3 is number }} {{ d is mapping }} {{ items is iterable }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 2 }} {{ 3 * 'ab' }}",
    "{{ 1 < 2 and 'x' }} {{ 0 or 'y' }} {{ not x }} {{ 'a' in 'cat' }} {{ 2 in items }} {{ 'k' not in d }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'q' if x else 'r' }} {{ 'q' if not x }}",
    "{{ y.strip() }}|{{ y.lstrip() }}|{{ y.rstrip() }}|{{ y.startswith('a') }}|{{ y.endswith(('b', 'c')) }}",
    "{{ y.split() }}|{{ y.split('a') }}|{{ y.upper() }}|{{ y.replace(' ', '_') }}|{{ '-'.join(items | map('string')) }}",
    "{{ d.get('k') }}|{{ d.get('nope', 5) }}|{{ d.keys() | list }}|{{ d.values() | list }}",
    "{# a comment #}x\n  {# another #}\ny{#- strip -#}  z",
    "{{ 'esc\\n\\t\\'\\\"\\u00e9\\x41' }}",
    "{{ [1, 'two', none, true, 1.5, {'k': [2]}] }}",
    "{{ {'a': 1, 'b': 'two'} }}",
    "{{ raise_exception('stop here: ' ~ x) if not x }}ok",
    "{{ range(5) | list }} {% for i in range(2, 9, 3) %}{{ i }}{% endfor %}",
    "{% for m in rows %}{{ m['role'] }}:{{ m.content | trim }}{% if not loop.last %}\n{% endif %}{% endfor %}",
    "{% for a in items %}{% for b in items %}{{ loop.index }}{% endfor %}.{{ loop.index }} {% endfor %}",
    "{{ 3 > 2 > 1 }} {{ 1 < x < 3 }} {{ 1 == 1 in [1] }} {{ [1, 2] < [1, 3] }}",
    "{{ {'a': {'b': x}} | tojson }} {{ {'k': [1, {'z': 2}]} }}",
    "{{ 'user' is in ['user', 'system'] }} {{ x is in {'1': 1} }}",
    "{{ \"hello's world-wide (web)\" | title }} {{ 'a1b c' | title }} {{ '<b>&\"\'' | e }} {{ y | escape }}",
    "{{ true is number }} {{ true is integer }} {{ '123' is lower }} {{ 'ab1' is lower }} {{ '' is upper }}",
    "{{ '42.23' | int }} {{ ' 7 ' | int }} {{ '0x10' | float }} {{ '1_000.5' | float }} {{ 'x' | int(5) }}",
    "{{ 1.0 // 0.1 }} {{ 10 % 0.1 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }}",
    "{{ 0.5 is odd }} {{ -3 is odd }} {{ 2.0 is even }} {{ true is odd }}",
    "\u00a0{% if true %}x{% endif %} a \u00a0{%- if true %}y{% endif %}{% if true -%}\u00a0z{% endif %}",
    "{{ '\\101\\0'|length }} {{ x.0.1 if false }} {{ 1e3 }} {{ 1_000 }} {{ 2.5e-3 }}",
    "{% for a in [] %}{% else %}{% set q = 3 %}{{ q }}{% endfor %}[{{ q }}]",
    "{% for i in [1, 2] %}{% macro f() %}{{ i }}{% endmacro %}{{ f() }}{% endfor %}",
    "{% macro m() %}{% endmacro %}{{ m is defined }} {{ raise_exception is defined }} {{ nope is defined }}",
    "{% if rows | selectattr('role', 'equalto', 'nobody') %}gen{% endif %} {{ rows | map(attribute='role') | list }}",
    "{{ d | tojson(sort_keys=true) }} {{ items | tojson(separators=[',', ':']) }} {{ d | tojson(indent=0) }}",
    "{{+ 'x' }} {%+ if true %}y{% endif %}",
    "{{ () | length }} {{ (1, 2) | list }} {{ 'ab' * true }}",
    "{{ x + y }}",
    "{{ undefined_thing.attr }}",
    "{% macro tag(name, body='none') %}<{{ name }}>{{ body | trim }}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', y) }}{{ tag(body=x, name='c') }}",
    "{% macro depth(n) %}{% if n > 0 %}({{ depth(n - 1) }}){% endif %}{% endmacro %}{{ depth(3) }}",
    "{{ 1 / 0 }}",
]

VARIABLES = [
    {"x": 1, "y": " abc ", "items": ["a", 2, "c", 4.5], "d": {"k": "v", "n": 1},
     "rows": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]},
    {"x": 0, "y": "a\u00a0b c", "items": [], "d": {}, "rows": []},
    {"x": "text", "y": "", "items": ["only"], "d": {"k": None},
     "rows": [{"role": "system", "content": "s"}]},
]


def test_each_construct_renders_as_jinja2_does():
    cases = [(t, v) for t in CONSTRUCTS for v in VARIABLES]
    assert compare(cases) >= len(cases) // 2


BAD = [
    "{% if x %}never closed",
    "{% for %}{% endfor %}",
    "{{ x ",
    "{% endif %}",
    "{{ 'unterminated }}",
    "{% for x in y %}{% endif %}",
    "{{ x | }}",
    "{% frobnicate %}",
    "{{ (1 }}",
    "{% set %}",
]


def test_bad_templates_are_refused_by_line():
    results = ours([(t, {}) for t in BAD])
    for template, got in zip(BAD, results):
        assert reference(template, {})[0] == "error", template  # jinja2 refuses it too
        assert got.get("error", "").startswith("chat template, line "), (template, got)
