"""Gemma-3 prefill and decode tokens/s: npurt next to llama.cpp on the same GGUF file.

Run with the interpreter of .venv-peer/ (scripts/install-peer.sh builds llama-cpp-python
there); `make bench-peer` does both.

Each repetition runs the npurt side first, then llama.cpp, so both see the same state
of the machine over the run. Both sides measure the same three figures on the same
token ids:

  prefill 64 / 512  the prompt's first N tokens evaluated at once; N / seconds
  decode 128        after the 64-token prompt, 128 greedy tokens; 128 / seconds over
                    the decoding only (one token per step; npurt also with
                    speculation, drafts verified in one pass over the weights)
  repeating 128     the same after bench/repeat_prompt.txt, whose greedy continuation
                    repeats (a list), plain and (npurt) speculative
  decode at 4096    64 greedy tokens, one per step, after 4096 prompt tokens (the
                    prompt's tokens after BOS repeated to that length): attention
                    then reads 4096 cached positions in the global layers; npurt
                    with its f32 KV cache and with an f16 one (llama.cpp's default)

Then batched decoding, aggregate tokens/s of B = 1, 2, 4, 8, 16 sequences, each after
its own 64-token prompt, 32 tokens each, timed over the decoding: llama.cpp's
llama-batched-bench (built by scripts/install-peer.sh from the llama.cpp that
llama-cpp-python vendors: -npp 64 -ntg 32, its S_TG column) next to npurt's
BatchEngine (NPURT_BENCH --batched-json: requests with their own prompts, continuous
batching over the batched decode step; tokens/s once every request has its first
token).

The prompt is the text of bench/peer_prompt.txt with trailing whitespace removed,
tokenized with BOS (no other special tokens) and cut to exactly N tokens. The text is
long enough for every N used here, so it is never repeated.

The npurt side is one process per repetition:

  NPURT_BENCH --model MODEL --peer-json --prompt-file PROMPT_FILE

whose last line on stdout is one JSON object with the keys in NPURT_KEYS.

The table shows medians over the repetitions; --out gets the same, every sample, the
prompt's token ids and llama.cpp's greedy ids in the decode.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import llama_cpp

from bench_report import write_report

PREFILL_SIZES = (64, 512)
DECODE_PROMPT = 64
DECODE_STEPS = 128
DEPTH = 4096
DEPTH_STEPS = 64

# (figure, the npurt JSON key, the row label, the llama.cpp figure it is set against:
# llama.cpp always decodes one token per step)
FIGURES = (
    ("prefill_64", "prefill_64_tokens_per_s", "prefill 64 tokens", "prefill_64"),
    ("prefill_512", "prefill_512_tokens_per_s", "prefill 512 tokens", "prefill_512"),
    ("decode_128", "decode_128_tokens_per_s", "decode 128 tokens", "decode_128"),
    ("decode_128_spec", "decode_128_speculative_tokens_per_s", "  speculative", "decode_128"),
    ("repeat_128", "repeat_128_tokens_per_s", "repeating list 128", "repeat_128"),
    ("repeat_128_spec", "repeat_128_speculative_tokens_per_s", "  speculative", "repeat_128"),
    ("decode_64_at_4096", "decode_64_at_4096_tokens_per_s", "decode 64 at 4096", "decode_64_at_4096"),
    ("decode_64_at_4096_f16", "decode_64_at_4096_f16_kv_tokens_per_s", "  f16 KV cache", "decode_64_at_4096"),
)
NPURT_KEYS = tuple(key for _, key, _, _ in FIGURES) + (
    "host_threads", "prefill_chunk", "cores", "speculate", "repeat_tokens_per_pass", "prose_tokens_per_pass")
DEFAULT_REPEAT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repeat_prompt.txt")

BATCHES = (1, 2, 4, 8, 16)
BATCH_PROMPT = 64
BATCH_STEPS = 32
DEFAULT_BATCHED_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     ".venv-peer", "llama.cpp-build", "bin", "llama-batched-bench")

DEFAULT_PROMPT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_prompt.txt")


def fail(message):
    print(f"peer_bench: error: {message}", file=sys.stderr)
    sys.exit(1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--npurt-bench", required=True, help="npurt_model_bench binary")
    p.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    p.add_argument("--out", required=True, help="JSON output path")
    p.add_argument("--threads", type=int, default=None,
                   help="llama.cpp threads (default: the npurt side's host_threads, "
                        "else the CPU count)")
    p.add_argument("--batched-bench", default=DEFAULT_BATCHED_BENCH,
                   help="llama-batched-bench binary (default: where install-peer.sh builds it)")
    p.add_argument("--prompt-file", default=DEFAULT_PROMPT_FILE,
                   help="prompt text (default: bench/peer_prompt.txt)")
    p.add_argument("--repeat-prompt-file", default=DEFAULT_REPEAT_FILE,
                   help="a prompt whose continuation repeats (default: bench/repeat_prompt.txt)")
    args = p.parse_args()
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    for path, what in ((args.model, "model"), (args.npurt_bench, "npurt bench"),
                       (args.batched_bench, "llama-batched-bench (scripts/install-peer.sh builds it)"),
                       (args.prompt_file, "prompt file"), (args.repeat_prompt_file, "repeat prompt file")):
        if not os.path.isfile(path):
            fail(f"{what} not found: {path}")
    return args


def run_json(cmd):
    """Runs cmd; returns the JSON object on the last line of its stdout."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"{' '.join(cmd)} exited with status {proc.returncode}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"{' '.join(cmd)}: the last line of stdout is not a JSON object")
    if not isinstance(result, dict):
        fail(f"{' '.join(cmd)}: the last line of stdout is not a JSON object")
    return result


def run_npurt_batched(args):
    """npurt's aggregate decode tokens/s per B, one repetition."""
    result = run_json([args.npurt_bench, "--model", args.model, "--batched-json"])
    keys = {b: f"decode_{BATCH_STEPS}_b{b}_tokens_per_s" for b in BATCHES}
    missing = [k for k in keys.values() if k not in result]
    if missing:
        fail(f"npurt --batched-json lacks {', '.join(missing)}")
    return {b: float(result[k]) for b, k in keys.items()}


def run_llama_batched(args, threads):
    """llama-batched-bench's aggregate decode tokens/s (S_TG) per B, one repetition."""
    cmd = [args.batched_bench, "-m", args.model, "-c", "2048", "-b", "2048", "-ub", "512",
           "-npp", str(BATCH_PROMPT), "-ntg", str(BATCH_STEPS), "-npl", ",".join(map(str, BATCHES)),
           "-t", str(threads)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        fail(f"{' '.join(cmd)} exited with status {proc.returncode}")
    header, rows = None, {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
        elif header and len(cells) == len(header) and cells[0].isdigit():
            rows[int(cells[header.index("B")])] = float(cells[header.index("S_TG t/s")])
    if sorted(rows) != sorted(BATCHES):
        sys.stderr.write(proc.stdout[-4000:])
        fail(f"{' '.join(cmd)}: no S_TG for every B in its table")
    return rows


def run_npurt(args):
    """One npurt repetition; returns its JSON object."""
    cmd = [args.npurt_bench, "--model", args.model, "--peer-json",
           "--prompt-file", args.prompt_file, "--repeat-prompt-file", args.repeat_prompt_file]
    result = run_json(cmd)
    missing = [k for k in NPURT_KEYS if k not in result]
    if missing:
        fail(f"{' '.join(cmd)}: JSON lacks {', '.join(missing)}")
    return result


class LlamaSide:
    def __init__(self, model, threads, prompt_text, repeat_text):
        def context(n_ctx):
            return llama_cpp.Llama(
                model_path=model,
                n_ctx=n_ctx,
                n_batch=512,
                n_ubatch=512,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                verbose=False,
            )
        self.llm = context(1024)  # >= 512 for the long prefill and 64 + 128 for decode
        self.deep_llm = context(DEPTH + DEPTH_STEPS + 64)
        self.n_vocab = self.llm.n_vocab()
        tokens = self.llm.tokenize(prompt_text.encode("utf-8"), add_bos=True, special=False)
        bos = self.llm.token_bos()
        if not tokens or tokens[0] != bos:
            tokens = [bos] + tokens
        need = max(PREFILL_SIZES + (DECODE_PROMPT,))
        if len(tokens) < need:
            fail(f"the prompt gives {len(tokens)} tokens, fewer than {need}")
        self.tokens = tokens
        # As npurt's prompt_of: the ids after BOS repeated to DEPTH.
        self.deep = list(tokens)
        while len(self.deep) < DEPTH:
            self.deep += tokens[1:]
        self.deep = self.deep[:DEPTH]
        self.repeat = self.llm.tokenize(repeat_text.encode("utf-8"), add_bos=True, special=False)
        if not self.repeat or self.repeat[0] != bos:
            self.repeat = [bos] + self.repeat
        # The first evaluations allocate llama.cpp's compute buffers: keep them out of
        # the samples.
        for n in PREFILL_SIZES:
            self.prefill(n)
        self.decode()
        self.decode(self.deep[:DECODE_PROMPT], 1, self.deep_llm)

    def last_argmax(self, llm):
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def prefill(self, n):
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(self.tokens[:n])
        return n / (time.perf_counter() - start)

    def decode(self, prompt=None, steps=DECODE_STEPS, llm=None):
        """Greedy steps after `prompt` (the decode prompt); tokens/s and the generated ids."""
        llm = llm or self.llm
        llm.reset()
        llm.eval(self.tokens[:DECODE_PROMPT] if prompt is None else prompt)
        generated = []
        start = time.perf_counter()
        for _ in range(steps):
            tok = self.last_argmax(llm)
            generated.append(tok)
            llm.eval([tok])
        return steps / (time.perf_counter() - start), generated

    def measure(self):
        """One repetition: the figures, and the greedy ids of its decode."""
        sample = {f"prefill_{n}": self.prefill(n) for n in PREFILL_SIZES}
        sample["decode_128"], generated = self.decode()
        sample["repeat_128"], _ = self.decode(self.repeat)
        sample["decode_64_at_4096"], _ = self.decode(self.deep, DEPTH_STEPS, self.deep_llm)
        return sample, generated


def main():
    args = parse_args()
    with open(args.prompt_file, encoding="utf-8") as f:
        prompt_text = f.read().rstrip()
    with open(args.repeat_prompt_file, encoding="utf-8") as f:
        repeat_text = f.read().rstrip()

    npurt_samples, llama_samples = [], []
    llama = None
    threads = args.threads
    npurt_info = None
    generated = None
    for rep in range(args.reps):
        result = run_npurt(args)
        npurt_samples.append({name: float(result[key]) for name, key, _, _ in FIGURES})
        npurt_samples[-1]["repeat_tokens_per_pass"] = float(result["repeat_tokens_per_pass"])
        npurt_samples[-1]["prose_tokens_per_pass"] = float(result["prose_tokens_per_pass"])
        info = {k: result[k] for k in ("host_threads", "prefill_chunk", "cores", "speculate")}
        if npurt_info is None:
            npurt_info = info
        elif info != npurt_info:
            fail(f"the npurt side changed its configuration between repetitions: "
                 f"{npurt_info} then {info}")
        if llama is None:
            # Loaded after the first npurt run, which tells the default thread count.
            if threads is None:
                host = result.get("host_threads")
                threads = int(host) if isinstance(host, int) and host > 0 else os.cpu_count()
            llama = LlamaSide(args.model, threads, prompt_text, repeat_text)
        sample, generated = llama.measure()
        llama_samples.append(sample)
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    # Batched decoding, the two sides alternating, after the single-sequence figures.
    npurt_batched, llama_batched = [], []
    for rep in range(args.reps):
        npurt_batched.append(run_npurt_batched(args))
        llama_batched.append(run_llama_batched(args, threads))
        print(f"batched repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    batched_rows = {}
    for b in BATCHES:
        n = statistics.median(s[b] for s in npurt_batched)
        l = statistics.median(s[b] for s in llama_batched)
        batched_rows[str(b)] = {"npurt_tokens_per_s": n, "llama_cpp_tokens_per_s": l, "ratio": n / l if l > 0 else None,
                                "npurt_samples": [s[b] for s in npurt_batched],
                                "llama_cpp_samples": [s[b] for s in llama_batched]}

    version = llama_cpp.__version__
    system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()

    rows = {}
    for name, _, label, peer in FIGURES:
        npurt_med = statistics.median(s[name] for s in npurt_samples)
        llama_med = statistics.median(s[peer] for s in llama_samples)
        rows[name] = {
            "label": label,
            "npurt_tokens_per_s": npurt_med,
            "llama_cpp_tokens_per_s": llama_med,
            "ratio": npurt_med / llama_med if llama_med > 0 else None,
            "npurt_samples": [s[name] for s in npurt_samples],
            "llama_cpp_samples": [s[peer] for s in llama_samples],
        }

    print(f"Gemma-3 on {os.path.basename(args.model)}: npurt against llama.cpp "
          f"(medians of {args.reps}, alternating)")
    print(f"threads: {threads} (llama.cpp); npurt host_threads {npurt_info['host_threads']}, "
          f"cores {npurt_info['cores']}, prefill_chunk {npurt_info['prefill_chunk']}")
    print(f"llama.cpp: llama-cpp-python {version}")
    print(f"llama.cpp CPU features: {system_info}")
    print()
    print(f"speculative rows: up to {npurt_info['speculate']} prompt-lookup drafts per verify step; "
          f"tokens per pass over the weights: repeating list "
          f"{statistics.median(s['repeat_tokens_per_pass'] for s in npurt_samples):.2f}, prose "
          f"{statistics.median(s['prose_tokens_per_pass'] for s in npurt_samples):.2f}; "
          f"llama.cpp decodes one token per step in every row")
    print()
    print(f"{'figure':<20} {'npurt tok/s':>12} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for name, _, label, _ in FIGURES:
        r = rows[name]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        print(f"{label:<20} {r['npurt_tokens_per_s']:>12.1f} "
              f"{r['llama_cpp_tokens_per_s']:>16.1f} {ratio:>7}")

    print()
    print(f"batched decode: B sequences, {BATCH_PROMPT}-token prompts, {BATCH_STEPS} tokens each; aggregate "
          f"tokens/s (npurt: BatchEngine; llama.cpp: llama-batched-bench S_TG)")
    print(f"{'B':<20} {'npurt tok/s':>12} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for b in BATCHES:
        r = batched_rows[str(b)]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        print(f"{b:<20} {r['npurt_tokens_per_s']:>12.1f} {r['llama_cpp_tokens_per_s']:>16.1f} {ratio:>7}")

    report = {
        "model": args.model,
        "prompt_file": args.prompt_file,
        "reps": args.reps,
        "threads": threads,
        "llama_cpp_version": version,
        "llama_cpp_system_info": system_info,
        "npurt": npurt_info,
        "figures": rows,
        "batched": batched_rows,
        # For checking the npurt side's inputs and outputs against llama.cpp's: the
        # prompt ids (the longest prefill's; the shorter ones are its prefixes) and
        # llama.cpp's greedy ids in the last decode.
        "prompt_token_ids": llama.tokens[:max(PREFILL_SIZES)],
        "llama_cpp_decode_token_ids": generated,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
