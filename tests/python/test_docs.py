"""docs/python.md against the module: every operator's keyword table, the Gemma3
signatures and its stats keys are read from the document and compared with what the
extension really takes (nanobind's __nb_signature__), both ways."""

from __future__ import annotations

import ast
import os
import re

import pytest

import npurt

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
MODEL = os.environ.get("NPURT_MODEL") or os.path.join(
    os.path.dirname(__file__), "..", "..", "models", "gemma-3-270m-q4_k_m.gguf")
MISSING = object()  # a parameter without a default


def doc_text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def section(text: str, heading: str) -> str:
    """The text under `## heading` up to the next `## ` heading."""
    start = text.index("\n## " + heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def parameters(fn) -> list[tuple[str, str, object, bool]]:
    """(name, annotation, default or MISSING, keyword-only) of a nanobind function's
    one overload, `self` left out."""
    sigs = fn.__nb_signature__
    assert len(sigs) == 1, f"{fn}: {len(sigs)} overloads"
    text, _, defaults = sigs[0]
    # Defaults nanobind could not spell are \0, \1, ... into the tuple.
    text = re.sub(r"\\(\d+)", lambda m: repr(defaults[int(m.group(1))]), text)
    tree = ast.parse(text + ": pass")
    args = tree.body[0].args
    out = []
    def annotation(a: ast.arg) -> str:
        return ast.unparse(a.annotation) if a.annotation is not None else ""
    positional = args.posonlyargs + args.args
    pos_defaults = [MISSING] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(positional, pos_defaults):
        out.append((a.arg, annotation(a), d if d is MISSING else ast.literal_eval(d), False))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append((a.arg, annotation(a), MISSING if d is None else ast.literal_eval(d), True))
    return [p for p in out if p[0] != "self"]


def doc_type(annotation: str) -> str:
    """How the document spells an annotation: dtypes are `object` to nanobind."""
    return annotation.replace("object", "dtype").replace(" | None", " or None")


def operator_tables(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """### `Name` -> its table's rows (keyword, type, default as written)."""
    ops = section(text, "Operators (`npurt.ops`)")
    tables: dict[str, list[tuple[str, str, str]]] = {}
    for block in re.split(r"\n### ", ops)[1:]:
        name = re.match(r"`(\w+)`\n", block)
        assert name, f"an operator heading is not ### `Name`: {block[:40]!r}"
        rows = []
        for line in block.splitlines():
            # A type may hold a union, its bar escaped for the table: `int \| tuple`.
            m = re.match(r"\| `(\w+)` \| ((?:[^|\\]|\\\|)+?), (required|`[^`]*`) \| [^|]+ \|$", line)
            if m:
                rows.append((m.group(1), m.group(2).replace("\\|", "|"), m.group(3)))
            else:
                assert not line.startswith("| `"), f"{name.group(1)}: a row not of the form " \
                                                   f"| `keyword` | type, default | meaning |: {line}"
        tables[name.group(1)] = rows
    return tables


def operator_classes() -> dict[str, type]:
    return {n: getattr(npurt.ops, n) for n in npurt.ops.__all__ if n != "Operator"}


def test_every_operator_class_has_a_keyword_table_and_no_other_does():
    tables = operator_tables(doc_text())
    assert sorted(tables) == sorted(operator_classes())


@pytest.mark.parametrize("name", sorted(operator_classes()))
def test_an_operators_documented_keywords_are_its_real_ones(name):
    real = parameters(operator_classes()[name].__init__)
    documented = operator_tables(doc_text())[name]
    real_names = [p[0] for p in real]
    doc_names = [row[0] for row in documented]
    assert set(real_names) - set(doc_names) == set(), f"{name}: keywords not documented"
    assert set(doc_names) - set(real_names) == set(), f"{name}: documented keywords it does not take"
    assert doc_names == real_names, f"{name}: the table's order is not the signature's"
    for (kw, annotation, default, _), (_, typ, doc_default) in zip(real, documented):
        assert typ == doc_type(annotation), f"{name}({kw}): documented as {typ}, is {annotation}"
        if default is MISSING:
            assert doc_default == "required", f"{name}({kw}) has no default"
        else:
            assert doc_default != "required", f"{name}({kw}) defaults to {default!r}"
            value = ast.literal_eval(doc_default.strip("`"))
            assert value == default and type(value) is type(default), \
                f"{name}({kw}): documented default {doc_default}, real {default!r}"
    # Constructed by the table's required keywords alone, by name.
    required = {kw: "add" if typ == "str" else 64 for kw, typ, d in documented if d == "required"}
    if name == "Custom":  # its required keywords are a kernel's image, grid and sizes
        kernel = npurt.ops.Elementwise(kind="add", n=64).compile()
        required = {"image": kernel.image, "grid": kernel.grid, "sizes": {a.name: a.elements for a in kernel.args}}
    assert operator_classes()[name](**required).name


def test_the_cpp_parameters_said_to_lack_a_keyword_lack_one():
    ops = section(doc_text(), "Operators (`npurt.ops`)")
    para = ops[ops.index("C++ parameters without a Python keyword"):]
    para = " ".join(para.split("\n\n")[0].split())
    listed = re.findall(r"`(\w+)`: ((?:`\w+`(?:, )?)+)", para)
    assert listed, "no `Operator`: `param`, ... list"
    classes = operator_classes()
    for op, names in listed:
        real = {p[0] for p in parameters(classes[op].__init__)}
        for kw in re.findall(r"`(\w+)`", names):
            assert kw not in real, f"{op}({kw}) is a keyword now: document it in its table"


def rendered(name: str, fn) -> str:
    """`name(a, b=1, *, c="x")` as the document writes a call signature."""
    parts, star = [], False
    for kw, _, default, kw_only in parameters(fn):
        if kw_only and not star:
            parts.append("*")
            star = True
        if default is MISSING:
            parts.append(kw)
        else:
            parts.append(f"{kw}=" + (f'"{default}"' if isinstance(default, str) else repr(default)))
    return f"`{name}({', '.join(parts)})`"


@pytest.mark.parametrize("name, fn", [("Gemma3", npurt.Gemma3.__init__), ("generate", npurt.Gemma3.generate),
                                      ("generate_ids", npurt.Gemma3.generate_ids)])
def test_the_gemma3_signatures_are_documented_as_they_are(name, fn):
    api = section(doc_text(), "API")
    want = rendered(name, fn)
    assert want in api.replace("\n", " "), f"docs/python.md does not show {want}"


def test_the_speculate_default_is_documented():
    api = " ".join(section(doc_text(), "API").split())
    assert "`speculate=None`, the default, is 7 drafts where the model is on one simulated NPU" in api


def stats_table(text: str) -> list[str]:
    api = section(text, "API")
    table = api[api.index("| stats key | meaning |"):]
    table = table[:table.index("\n\n")]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


@pytest.mark.skipif(not os.path.isfile(MODEL), reason="no model installed (make model)")
def test_the_documented_stats_keys_are_the_real_ones():
    model = npurt.Gemma3(MODEL, max_context=32)
    model.generate_ids([2, 818], 2)
    assert stats_table(doc_text()) == list(model.stats)
