"""`npurt serve` next to llama.cpp's llama-server: one load generator, the same file.

Both servers run on 127.0.0.1 with 16 slots (npurt: --parallel 16; llama-server:
--parallel 16, continuous batching, the same context per slot) and the host's threads.
For each number of concurrent clients C in 1, 4, 8, 16, every client sends requests
one after another (streamed /v1/completions, greedy, MAX_TOKENS tokens, each client its
own prompts from bench/peer_prompt.txt) for a fixed number of rounds. Figures per side
and C:

  tokens/s   all generated tokens / the wall time of the round
  TTFT       from sending a request to its first token: median and 99th percentile
  differ     responses whose text differs from the same request sent alone (each
             prompt is first sent alone, one at a time)

The sides alternate per repetition; the table shows medians over repetitions. Runs
with the .venv-peer interpreter (scripts/install-peer.sh builds llama-server there);
`make bench-serve` does both. Load is bounded: ROUNDS requests per client, each at most
MAX_TOKENS tokens, every request with a 120 s timeout.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from bench_report import write_report

CLIENTS = (1, 4, 8, 16)
ROUNDS = 3
MAX_TOKENS = 32
PROMPT_WORDS = 48
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def fail(message):
    print(f"serve_bench: {message}", file=sys.stderr)
    sys.exit(1)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Side:
    """A server process and its port."""

    def __init__(self, name, cmd, port):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"{name} exited with status {self.proc.returncode}: {' '.join(cmd)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        fail(f"{name} did not become ready in 300 s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def complete(self, prompt):
        """One streamed greedy completion: (text, tokens, seconds to the first token)."""
        body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                           "cache_prompt": False})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        start = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            fail(f"{self.name}: status {resp.status}: {resp.read()[:300]!r}")
        text, tokens, first = "", 0, None
        buffer = b""
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
            if not chunk:
                break
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                line = event.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                for c in data.get("choices", []):
                    piece = c.get("text") or ""
                    if piece:
                        if first is None:
                            first = time.monotonic() - start
                        text += piece
                        tokens += 1
        conn.close()
        return text, tokens, first if first is not None else time.monotonic() - start


def prompts(n):
    with open(os.path.join(HERE, "peer_prompt.txt"), encoding="utf-8") as f:
        words = f.read().split()
    out = []
    for i in range(n):
        start = (i * 17) % max(1, len(words) - PROMPT_WORDS)
        out.append(" ".join(words[start:start + PROMPT_WORDS]))
    return out


def load(side, clients, texts, alone):
    """C clients, ROUNDS requests each: (tokens/s, TTFTs, differences)."""
    results, errors = [], []
    lock = threading.Lock()

    def client(c):
        try:
            for r in range(ROUNDS):
                prompt = texts[(c * ROUNDS + r) % len(texts)]
                got = side.complete(prompt)
                with lock:
                    results.append((prompt, got))
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.monotonic() - start
    if errors or any(t.is_alive() for t in threads):
        fail(f"{side.name}: clients failed: {errors[:3]}")
    tokens = sum(g[1] for _, g in results)
    differ = sum(g[0] != alone[p] for p, g in results)
    return tokens / wall, [g[2] for _, g in results], differ


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", required=True)
    p.add_argument("--npurt", required=True, help="the npurt command")
    p.add_argument("--llama-server", default=os.path.join(ROOT, ".venv-peer", "llama.cpp-build", "bin",
                                                          "llama-server"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args()
    for path in (args.model, args.npurt, args.llama_server):
        if not os.path.isfile(path):
            fail(f"no file at {path} (make model; make build; scripts/install-peer.sh builds llama-server)")
    texts = prompts(max(CLIENTS) * ROUNDS)
    context = 512
    sides = {
        "npurt": lambda port: [args.npurt, "serve", "--model", args.model, "--port", str(port), "--parallel", "16",
                               "--context", str(context)],
        "llama.cpp": lambda port: [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                                   "--parallel", "16", "-c", str(16 * context), "-t", str(args.threads),
                                   "--cont-batching", "--no-webui"],
    }
    samples = {name: {c: [] for c in CLIENTS} for name in sides}
    for rep in range(args.reps):
        for name, cmd in sides.items():
            port = free_port()
            side = Side(name, cmd(port), port)
            try:
                alone = {t: side.complete(t)[0] for t in texts}
                for c in CLIENTS:
                    samples[name][c].append(load(side, c, texts, alone))
            finally:
                side.stop()
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    print(f"serving {os.path.basename(args.model)}: {ROUNDS} streamed greedy requests of {MAX_TOKENS} tokens per "
          f"client, {PROMPT_WORDS}-word prompts; medians of {args.reps} (TTFT percentiles over all requests)")
    print(f"{'clients':<8} {'npurt tok/s':>12} {'llama tok/s':>12} {'ratio':>6} {'npurt TTFT p50/p99 ms':>22} "
          f"{'llama TTFT p50/p99 ms':>22} {'differ npurt/llama':>19}")
    report = {}
    for c in CLIENTS:
        row = {}
        for name in sides:
            runs = samples[name][c]
            ttfts = [t for r in runs for t in r[1]]
            row[name] = {"tokens_per_s": statistics.median(r[0] for r in runs),
                         "ttft_p50_ms": 1e3 * percentile(ttfts, 0.5), "ttft_p99_ms": 1e3 * percentile(ttfts, 0.99),
                         "differences": sum(r[2] for r in runs), "requests": len(ttfts),
                         "samples_tokens_per_s": [r[0] for r in runs]}
        n, l = row["npurt"], row["llama.cpp"]
        print(f"{c:<8} {n['tokens_per_s']:>12.1f} {l['tokens_per_s']:>12.1f} {n['tokens_per_s'] / l['tokens_per_s']:>6.2f} "
              f"{n['ttft_p50_ms']:>10.0f} / {n['ttft_p99_ms']:<9.0f} {l['ttft_p50_ms']:>10.0f} / {l['ttft_p99_ms']:<9.0f} "
              f"{n['differences']:>8} / {l['differences']:<8}")
        report[str(c)] = row
    if args.out:
        write_report(args.out, {"model": args.model, "reps": args.reps, "clients": report})


if __name__ == "__main__":
    main()
