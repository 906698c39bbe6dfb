#!/usr/bin/env python3
"""Runs every fenced code block of README.md and docs/*.md, and checks the npurt and
make commands quoted inline in their prose (`make test-docs`).

Rules (README.md, "Checked snippets", says the same in short):

- The first word of a block's info string is its language; `python`, `cpp`, `cmake`
  and `sh` blocks run, `text` blocks and blocks without a language are diagrams or
  text and do not. A block without a language whose lines look like commands or code
  (`./build/...`, `make ...`, `cmake ...`, `import ...`, `#include ...`, ...) fails:
  code cannot hide untagged. Any other language fails as unknown.
- `python`: a complete program, run by the project's interpreter (.venv/bin/python)
  in a fresh temporary directory, with NPURT_MODEL set (the model file `make model`
  installs, unless the environment names another); exit status 0.
- `cpp`: a complete program, compiled with `c++ -std=c++20 -Wall -Werror` and
  `pkg-config --cflags --libs npurt` against the checker's install prefix (below),
  then run in a temporary directory; exit status 0.
- `cmake`: a fragment of an application's CMakeLists.txt. It is placed in a small
  project (cmake_minimum_required, project(app CXX), add_executable(app app.cc), the
  fragment; app.cc makes a simulated NPU through a public header and prints ok),
  configured with CMAKE_PREFIX_PATH set to the install prefix only (npurt_DIR must
  come from it), built and run; it must print ok.
- `sh`: each command line (`\\`-continued lines joined, comment lines skipped) runs in
  one bash per block, from the repository root, in order; the first non-zero status
  fails the block. Substitutions, and nothing else:
    * `/opt/npurt` becomes the install prefix, build-docs/prefix (emptied, then filled
      with `cmake --install build` at the start of a run);
    * .venv/bin comes first on PATH, so `pip` and `python` are the project's
      environment; PIP_NO_BUILD_ISOLATION=0 (pip reads the "no-" variable inverted:
      0 turns isolation off, as --no-build-isolation does), PIP_NO_INDEX=1 and
      PIP_DISABLE_PIP_VERSION_CHECK=1, so `pip install .` builds with the
      environment's scikit-build-core and nanobind and nothing is fetched;
    * a line whose command is `make X` runs as `make -n X`: a dry run showing that the
      target and its prerequisites exist and expand. The make targets are the
      README's own jobs (`make test` is what CI runs; the benchmarks take many
      minutes), each checked where it runs, not here.
  A block marked `sh long` holds commands that run for minutes or hours by design (a
  100000-run soak, an hour of fuzzing): each of its lines runs under `timeout -s KILL
  20s` and passes if it exits 0 or is still running when the timeout kills it (status
  137 after 20 s: KILL, because a program's own SIGTERM handling, such as libFuzzer's,
  may take its time or never end, which this check is not about; a KILL from elsewhere,
  the OOM killer's, comes before 20 s and fails).
  Build commands (cmake -S/-B, --build, --install) run for real; the documents use
  the build directories and flags the test suite already builds (build-rel as
  scripts/test-install.sh configures it, build-fuzz as `make fuzz` does), so they
  are no-ops after `make test`. CMAKE_BUILD_PARALLEL_LEVEL, when set (the Makefile
  sets it to JOBS), bounds their jobs.
- Inline code spans in the prose: a span that starts with `npurt `, `./build/npurt `
  or `mpirun ` must name a real subcommand of ./build/npurt and only options its
  `--help` lists; a span that starts with `make ` must name targets that exist
  (`make -n X` succeeds).

Output: `ok FILE:LINE what` or `FAIL FILE:LINE what` (with the output's tail) per
block, command and inline span, then a count; exit status 1 if anything failed.
`--files A.md B.md` checks those files only.
"""
import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build-docs"
PREFIX = WORK / "prefix"
VENV_BIN = ROOT / ".venv" / "bin"
NPURT = ROOT / "build" / "npurt"
LONG_SECONDS = 20
TAIL_LINES = 25

RUN_LANGS = {"python", "cpp", "cmake", "sh"}
# Lines that make a block without a language look like code or commands.
CODE_LIKE = re.compile(
    r"^\s*(\$ |\./|make\s|cmake\s|c\+\+\s|g\+\+\s|clang\+\+\s|pip3?\s|python3?\s|bash\s|mpirun\s|npurt\s|"
    r"export\s|import\s|from\s+\S+\s+import\s|#include|int main|def\s|auto\s|std::|namespace\s|find_package\(|"
    r"target_link_libraries\()"
)

APP_CC = """#include <cstdio>

#include "npurt/runtime/runtime.h"

int main() {
  auto runtime = npurt::Runtime::create("sim", {.cores = 2});
  if (!runtime.ok()) {
    std::printf("%s\\n", runtime.status().to_string().c_str());
    return 1;
  }
  std::printf("ok\\n");
  return 0;
}
"""

APP_PREAMBLE = """cmake_minimum_required(VERSION 3.20)
project(app CXX)
add_executable(app app.cc)
# ---- the document's fragment ----
"""


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence
    info: str
    body: list  # (line number, text)

    @property
    def lang(self):
        return self.info.split()[0] if self.info.split() else ""

    @property
    def attrs(self):
        return self.info.split()[1:]


@dataclass
class Span:
    path: Path
    line: int
    text: str


@dataclass
class Results:
    ok: int = 0
    failed: list = field(default_factory=list)

    def report(self, where, what, good, output=""):
        if good:
            self.ok += 1
            print(f"ok {where} {what}", flush=True)
            return
        self.failed.append(f"{where} {what}")
        print(f"FAIL {where} {what}", flush=True)
        lines = output.rstrip("\n").splitlines()[-TAIL_LINES:]
        for text in lines:
            print(f"    {text}", flush=True)


def rel(path):
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ---- parsing ------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def parse(path):
    """Fenced blocks and inline code spans of one Markdown file."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, prose = [], []  # prose: (line number, text) outside fences
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                break
            text = lines[i]
            cut = len(text) - len(text.lstrip(" "))
            body.append((i + 1, text[min(cut, indent):]))
            i += 1
        else:
            raise SystemExit(f"{rel(path)}:{start}: unclosed code fence")
        blocks.append(Block(path, start, info, body))
        i += 1
    return blocks, inline_spans(path, prose)


def inline_spans(path, prose):
    # Paragraphs (runs of non-blank lines), so a span may continue on the next line.
    spans, para = [], []
    for number, text in prose + [(0, "")]:
        if text.strip():
            para.append((number, text))
            continue
        if para:
            joined = "\n".join(t for _, t in para)
            for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", joined, re.S):
                line = para[0][0] + joined.count("\n", 0, m.start())
                content = m.group(2).replace("\n", " ")
                if content.startswith(" ") and content.endswith(" ") and content.strip():
                    content = content[1:-1]
                spans.append(Span(path, line, content))
        para = []
    return spans


def commands(block):
    """The block's command lines: (line number, text), continuations joined."""
    out, pending, first = [], "", 0
    for number, text in block.body:
        if not pending and (not text.strip() or text.lstrip().startswith("#")):
            continue
        if not pending:
            first = number
        piece = text.strip() if pending else text.rstrip()
        if piece.endswith("\\"):
            pending += piece[:-1].rstrip() + " "
            continue
        out.append((first, (pending + piece).strip()))
        pending = ""
    if pending:
        out.append((first, pending.strip()))
    return out


# ---- the environment ----------------------------------------------------------------


def child_env():
    env = dict(os.environ)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(name, None)
    env.setdefault("NPURT_MODEL", str(ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"))
    return env


def run(cmd, cwd, env=None, timeout=1800, shell=False):
    try:
        p = subprocess.run(
            cmd, cwd=cwd, env=env or child_env(), shell=shell, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout,
            executable="/bin/bash" if shell else None)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return 124, out + f"\n(timed out after {timeout} s)"


class Prefix:
    """build-docs/prefix: `cmake --install build` into an emptied folder, made once."""

    def __init__(self):
        self.error = None
        self.made = False

    def get(self):
        if not self.made:
            self.made = True
            if not (ROOT / "build" / "cmake_install.cmake").exists():
                self.error = "no build/cmake_install.cmake: run `make build` first"
            else:
                shutil.rmtree(PREFIX, ignore_errors=True)
                rc, out = run(["cmake", "--install", "build", "--prefix", str(PREFIX)], ROOT)
                if rc != 0:
                    self.error = "cmake --install build failed:\n" + out
        return self.error


class Help:
    """Subcommands and options of ./build/npurt, from its --help."""

    def __init__(self):
        self.cache = {}

    @staticmethod
    def _parse(text):
        options, subs, section = set(), set(), None
        for line in text.splitlines():
            if re.match(r"^\S.*:$", line):
                section = line[:-1]
                continue
            m = re.match(r"^  (\S+)", line)
            if not m:
                continue
            if section == "Options":
                for name in m.group(1).split(","):
                    if name.startswith("-"):
                        options.add(name)
            elif section == "Subcommands":
                subs.add(m.group(1))
        return options, subs

    def get(self, sub):
        if sub not in self.cache:
            cmd = [str(NPURT)] + ([sub] if sub else []) + ["--help"]
            rc, out = run(cmd, ROOT, timeout=60)
            self.cache[sub] = self._parse(out) if rc == 0 else None
        return self.cache[sub]


# ---- checks -------------------------------------------------------------------------


def check_untagged(block, results):
    where = f"{rel(block.path)}:{block.line}"
    for number, text in block.body:
        if CODE_LIKE.match(text):
            results.report(where, "block without a language looks like code", False,
                           f"line {number}: {text.strip()}\n(give the block its language: ```sh, ```python, ...)")
            return
    results.report(where, "(no language: not run)", True)


def tail(text):
    return "\n".join(text.rstrip("\n").splitlines()[-TAIL_LINES:])


def block_text(block):
    """The block's lines as one text, each ending in a newline."""
    return "\n".join(t for _, t in block.body) + "\n"


def prefix_missing(prefix, results, where, kind):
    """Whether the install prefix a check needs could not be made; if so, the check
    (`kind` at `where`) is reported failed with the reason."""
    err = prefix.get()
    if err:
        results.report(where, kind, False, err)
    return bool(err)


def work_dir(kind, block, used):
    digest = hashlib.sha1("\n".join(t for _, t in block.body).encode()).hexdigest()[:10]
    d = WORK / kind / f"{block.path.stem}-{digest}"
    d.mkdir(parents=True, exist_ok=True)
    used.add(d)
    return d


def run_program(kind, where, t0, results, cmd, env=None, source=None):
    """Runs `cmd` (plus the block's text as a file, when `source` is given) in a fresh
    temporary directory and reports its exit status."""
    with tempfile.TemporaryDirectory(prefix="npurt-doc-") as tmp:
        if source is not None:
            src = Path(tmp) / "snippet.py"
            src.write_text(source)
            cmd = cmd + [str(src)]
        rc, out = run(cmd, tmp, env=env, timeout=600)
    results.report(where, f"{kind} ({time.monotonic() - t0:.1f} s)", rc == 0, out + f"\n(exit status {rc})")


def check_python(block, results):
    where, t0 = f"{rel(block.path)}:{block.line}", time.monotonic()
    run_program("python", where, t0, results, [str(VENV_BIN / "python")],
                source=block_text(block))


def check_cpp(block, results, prefix, used):
    where, t0 = f"{rel(block.path)}:{block.line}", time.monotonic()
    if prefix_missing(prefix, results, where, "cpp"):
        return
    d = work_dir("cpp", block, used)
    (d / "main.cc").write_text(block_text(block))
    env = child_env()
    env["PKG_CONFIG_PATH"] = str(PREFIX / "lib" / "pkgconfig")
    cxx = env.get("CXX", "c++")
    compile_cmd = f'{cxx} -std=c++20 -O1 -Wall -Werror main.cc -o main $(pkg-config --cflags --libs npurt)'
    rc, out = run(compile_cmd, d, env=env, shell=True, timeout=600)
    if rc != 0:
        results.report(where, "cpp (compile)", False, f"$ {compile_cmd}\n{out}")
        return
    run_program("cpp", where, t0, results, [str(d / "main")], env=env)


def check_cmake(block, results, prefix, used):
    where, t0 = f"{rel(block.path)}:{block.line}", time.monotonic()
    if prefix_missing(prefix, results, where, "cmake"):
        return
    d = work_dir("cmake", block, used)
    (d / "CMakeLists.txt").write_text(APP_PREAMBLE + block_text(block))
    (d / "app.cc").write_text(APP_CC)
    steps = [
        ["cmake", "-S", str(d), "-B", str(d / "build"), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={PREFIX}", "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"],
        ["cmake", "--build", str(d / "build")],
    ]
    for cmd in steps:
        rc, out = run(cmd, d)
        if rc != 0:
            results.report(where, "cmake", False, f"$ {' '.join(cmd)}\n{out}")
            return
    cache = (d / "build" / "CMakeCache.txt").read_text()
    m = re.search(r"^npurt_DIR:PATH=(.*)$", cache, re.M)
    want = str(PREFIX / "lib" / "cmake" / "npurt")
    if not m or m.group(1) != want:
        results.report(where, "cmake", False, f"npurt_DIR is {m.group(1) if m else 'unset'}, want {want}")
        return
    rc, out = run([str(d / "build" / "app")], d)
    results.report(where, f"cmake ({time.monotonic() - t0:.1f} s)", rc == 0 and "ok" in out.split(),
                   out + f"\n(exit status {rc})")


MAKE_LINE = re.compile(r"^((?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*)make(\s|$)")


def transform(command, long):
    """A document's command as the checker runs it (the substitutions above)."""
    command = command.replace("/opt/npurt", str(PREFIX))
    m = MAKE_LINE.match(command)
    if m:
        command = command[: m.end(1)] + "make -n" + command[m.end(1) + 4:]
    if long:
        command = f"timeout -s KILL {LONG_SECONDS}s bash -c {shlex.quote(command)}"
    return command


MARK = "@@check-docs"


def check_sh(block, results, prefix):
    where = f"{rel(block.path)}:{block.line}"
    long = "long" in block.attrs
    cmds = commands(block)
    if not cmds:
        results.report(where, "sh: no commands", False)
        return
    if any("/opt/npurt" in c for _, c in cmds) and prefix_missing(prefix, results, where, "sh"):
        return
    script = [f"cd {shlex.quote(str(ROOT))}"]
    for i, (_, c) in enumerate(cmds):
        script.append(f"printf '\\n{MARK} start {i} %s\\n' $EPOCHREALTIME")
        script.append(transform(c, long))
        script.append(f"__rc=$?; printf '\\n{MARK} rc {i} %d %s\\n' $__rc $EPOCHREALTIME")
        if long:
            script.append('[ $__rc -eq 0 ] || [ $__rc -eq 137 ] || exit 1')
        else:
            script.append("[ $__rc -eq 0 ] || exit 1")
    env = child_env()
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_NO_BUILD_ISOLATION"] = "0"
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("VIRTUAL_ENV", None)
    rc, out = run("\n".join(script) + "\n", ROOT, env=env, shell=True, timeout=3600)
    outputs, statuses, began, took, current = {}, {}, {}, {}, None
    for line in out.splitlines():
        m = re.match(rf"^{MARK} start (\d+) (\S+)$", line)
        if m:
            current = int(m.group(1))
            began[current] = float(m.group(2))
            continue
        m = re.match(rf"^{MARK} rc (\d+) (\d+) (\S+)$", line)
        if m:
            statuses[int(m.group(1))] = int(m.group(2))
            took[int(m.group(1))] = float(m.group(3)) - began.get(int(m.group(1)), float(m.group(3)))
            current = None
            continue
        if current is not None:
            outputs.setdefault(current, []).append(line)
    for i, (number, c) in enumerate(cmds):
        shown = transform(c, False) if not long else c
        what = f"sh{' long' if long else ''}: {shown}"
        if i not in statuses:  # the shell itself ended (a command ran `exit`, or the block timed out)
            results.report(f"{rel(block.path)}:{number}", what, False,
                           ("\n".join(outputs[i]) if i in outputs else out)
                           + f"\n(no exit status: the block's shell ended with {rc})")
            break
        status = statuses[i]
        stopped = long and status == 137 and took[i] >= LONG_SECONDS
        good = status == 0 or stopped
        note = f" (still running after {LONG_SECONDS} s: stopped)" if stopped else ""
        results.report(f"{rel(block.path)}:{number}", what + note + f" ({took[i]:.1f} s)", good,
                       "\n".join(outputs.get(i, [])) + f"\n(exit status {status})")
        if not good:
            break


def span_words(span):
    """An inline command's words, split as the shell would (on spaces when its quotes
    do not pair)."""
    try:
        return shlex.split(span.text)
    except ValueError:
        return span.text.split()


def check_npurt_span(span, results, helps):
    where = f"{rel(span.path)}:{span.line}"
    words = span_words(span)
    if words and words[0] == "mpirun":
        starts = [i for i, w in enumerate(words) if w in ("npurt", "./build/npurt")]
        if not starts:
            return
        words = words[starts[0]:]
    top = helps.get(None)
    if top is None:
        results.report(where, f"inline `{span.text}`", False, f"{NPURT} --help failed (run `make build`)")
        return
    top_options, subs = top
    rest = words[1:]
    if not rest:
        return
    if rest[0].startswith("-"):
        known, sub, args = top_options, None, rest
    else:
        sub, args = rest[0], rest[1:]
        if sub not in subs:
            results.report(where, f"inline `{span.text}`", False,
                           f"unknown subcommand '{sub}' (npurt has: {', '.join(sorted(subs))})")
            return
        known = helps.get(sub)[0]
    unknown = [a.split("=")[0] for a in args if re.match(r"^--?[A-Za-z]", a) and a.split("=")[0] not in known]
    label = f"npurt {sub}" if sub else "npurt"
    results.report(where, f"inline `{span.text}`", not unknown,
                   f"unknown option(s) {', '.join(unknown)} of `{label}` (its --help lists: {', '.join(sorted(known))})")


def check_make_span(span, results, cache):
    where = f"{rel(span.path)}:{span.line}"
    key = tuple(span_words(span)[1:])
    if key not in cache:
        cache[key] = run(["make", "-n", *key], ROOT, timeout=120)
    rc, out = cache[key]
    results.report(where, f"inline `{span.text}` (make -n)", rc == 0, out)


def main():
    ap = argparse.ArgumentParser(description="Run the code blocks of README.md and docs/*.md.")
    ap.add_argument("--files", nargs="+", help="Markdown files to check (default: README.md docs/*.md)")
    args = ap.parse_args()
    files = [Path(f).resolve() for f in args.files] if args.files else [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    start = time.monotonic()
    results, prefix, helps, make_cache, used = Results(), Prefix(), Help(), {}, set()
    for path in files:
        if not path.is_file():
            results.report(rel(path), "no such file", False)
            continue
        blocks, spans = parse(path)
        for block in blocks:
            where = f"{rel(block.path)}:{block.line}"
            lang = block.lang
            if lang == "" or lang == "text":
                check_untagged(block, results)
            elif lang not in RUN_LANGS:
                results.report(where, f"unknown language '{lang}'", False,
                               "known: python, cpp, cmake, sh, sh long, text, or none for diagrams")
            elif block.attrs and not (lang == "sh" and block.attrs == ["long"]):
                results.report(where, f"unknown info string '{block.info}'", False,
                               "only `sh long` takes an attribute")
            elif lang == "python":
                check_python(block, results)
            elif lang == "cpp":
                check_cpp(block, results, prefix, used)
            elif lang == "cmake":
                check_cmake(block, results, prefix, used)
            else:
                check_sh(block, results, prefix)
        for span in spans:
            if re.match(r"^(\./build/npurt|npurt|mpirun)\s", span.text):
                check_npurt_span(span, results, helps)
            elif re.match(r"^make\s+\S", span.text):
                check_make_span(span, results, make_cache)
    if not args.files:
        # Work folders of blocks that no longer exist.
        for kind in ("cpp", "cmake"):
            for d in (WORK / kind).glob("*") if (WORK / kind).is_dir() else []:
                if d not in used:
                    shutil.rmtree(d, ignore_errors=True)
    total = results.ok + len(results.failed)
    print(f"check-docs: {total} checks in {len(files)} files, {results.ok} ok, {len(results.failed)} failed "
          f"({time.monotonic() - start:.0f} s)")
    for f in results.failed:
        print(f"  FAILED {f}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
