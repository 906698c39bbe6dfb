"""scripts/check-docs.py (make test-docs) catches what it promises to: a snippet that
fails, a command that fails, code hidden in an untagged block, a make target or an
npurt option that does not exist; and passes a document whose snippets all work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHECKER = os.path.join(ROOT, "scripts", "check-docs.py")
NPURT = os.path.join(ROOT, "build", "npurt")
FENCE = "```"


def check(tmp_path, text: str) -> tuple[int, str]:
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    r = subprocess.run([sys.executable, CHECKER, "--files", str(doc)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr


GOOD = f"""# A document

{FENCE}python
import npurt
assert npurt.Device(cores=2).info["num_cores"] == 2
{FENCE}

{FENCE}sh
test -f README.md
make test   # a dry run
{FENCE}

{FENCE}
a diagram ─┐
           └ with no code in it
{FENCE}

Run `make test-python` or `make fuzz FUZZ_SECONDS=60`.
"""


def test_a_document_whose_snippets_work_passes(tmp_path):
    rc, out = check(tmp_path, GOOD)
    assert rc == 0, out
    assert "0 failed" in out, out


@pytest.mark.parametrize("broken, named", [
    (f"{FENCE}python\nimport npurt\nnpurt.Device(cores=2).no_such_method()\n{FENCE}\n",
     "doc.md:1 python"),
    (f"{FENCE}sh\ntest -f README.md\ntest -f no-such-file\n{FENCE}\n",
     "doc.md:3 sh: test -f no-such-file"),
    (f"{FENCE}\n./build/npurt generate --prompt hi\n{FENCE}\n",
     "doc.md:1 block without a language looks like code"),
    (f"{FENCE}rust\nfn main() {{}}\n{FENCE}\n", "doc.md:1 unknown language 'rust'"),
    ("Then `make no-such-target` runs.\n", "doc.md:1 inline `make no-such-target`"),
])
def test_a_broken_snippet_fails_and_is_named(tmp_path, broken, named):
    rc, out = check(tmp_path, broken)
    assert rc == 1, out
    assert f"FAIL {tmp_path / named}" in out, out


@pytest.mark.skipif(not os.access(NPURT, os.X_OK), reason="no build/npurt (make build)")
def test_an_npurt_option_that_does_not_exist_fails(tmp_path):
    rc, out = check(tmp_path, "Try `npurt generate --max-tokens 4 --no-such-option`.\n")
    assert rc == 1, out
    assert "unknown option(s) --no-such-option of `npurt generate`" in out, out
    rc, out = check(tmp_path, "Try `npurt generate --max-tokens 4`.\n")
    assert rc == 0, out
