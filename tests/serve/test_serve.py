"""`npurt serve` with real clients on 127.0.0.1: the `openai` package, raw HTTP and
curl-style requests; answers checked against `npurt generate` and `npurt batch`.

Run by CTest (tests/serve/CMakeLists.txt) with NPURT_BIN (the npurt command) and
NPURT_MODEL (the Gemma-3 file) set; every server it starts listens on a free port of
127.0.0.1 and is stopped with SIGTERM at the end.
"""

import concurrent.futures
import http.client
import json
import os
import pathlib
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request

import jinja2.sandbox
import openai
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

HERE = pathlib.Path(__file__).parent
NPURT = os.environ.get("NPURT_BIN", "")
MODEL = os.environ.get("NPURT_MODEL", "")
# Debian's browser and its driver (scripts/install-deps.sh installs both).
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (os.path.isfile(NPURT) and os.path.isfile(MODEL)),
                                reason="set NPURT_BIN and NPURT_MODEL")

PROMPTS = [
    "The capital of France is", "Once upon a time", "1, 2, 3, 4,", "The quick brown fox",
    "Water boils at", "In the beginning", "My favourite food is", "The sun rises in the",
    "def fibonacci(n):", "Dear Sir or Madam,", "The three primary colours are", "To make tea, first",
    "Paris is a city in", "The largest planet is", "A haiku about the sea:", "import numpy as np\n",
]


class Server:
    """`npurt serve` on a free port; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([NPURT, "serve", "--model", MODEL, "--port", "0", "--context", "512", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, f"no listening line: {line!r}"
        self.port = int(match.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, body = self.get("/health")
            if status == 200:
                assert json.loads(body) == {"status": "ready"}
                break
            assert json.loads(body) == {"status": "loading"}
            time.sleep(0.2)
        else:
            raise AssertionError("the server did not become ready in 120 s")
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)
        self.model_id = self.client.models.list().data[0].id

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def metric(self, name, device=None):
        """A metric's value: summed over its series (every device's), or one device's."""
        _, text = self.get("/metrics")
        want = name + (f'{{device="{device}"}}' if device is not None else "")
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(want + " ") or (device is None and line.startswith(name + "{device="))]
        assert values, f"no metric {want}"
        return sum(values)

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def server():
    s = Server("--parallel", "8")
    yield s
    assert s.stop() == 0


def complete(server, prompt, **kw):
    r = server.client.completions.create(model=server.model_id, prompt=prompt, **kw)
    return r.choices[0].text


def test_greedy_completion_is_npurt_generates_text(server):
    text = complete(server, "The capital of France is", max_tokens=12, temperature=0)
    out = subprocess.run([NPURT, "generate", "--model", MODEL, "--prompt", "The capital of France is",
                          "--max-tokens", "12", "--speculate", "0"], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == "The capital of France is" + text
    assert text.startswith(" the")


def test_seeded_sampled_completion_is_the_engines(server, tmp_path):
    text = complete(server, "Once upon a time", max_tokens=12, temperature=0.8, top_p=0.95, seed=5)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n")
    out = subprocess.run([NPURT, "batch", "--model", MODEL, "--prompts", str(prompts), "--max-tokens", "12",
                          "--temperature", "0.8", "--top-p", "0.95", "--seed", "5"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[0])["text"] == text
    assert text != complete(server, "Once upon a time", max_tokens=12, temperature=0.8, top_p=0.95, seed=6)


def test_chat_streamed_and_not_give_the_same_text(server):
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What is the capital of France?"}]
    whole = server.client.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages, max_tokens=16,
                                                  temperature=0)
    pieces, reasons = [], []
    for chunk in server.client.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=messages,
                                                       max_tokens=16, temperature=0, stream=True):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert whole.choices[0].message.role == "assistant"
    assert "".join(pieces) == whole.choices[0].message.content
    assert reasons[-1] == whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 16


def test_completion_stream_ends_with_done_and_usage(server):
    status, headers, body = server.post("/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 6, "temperature": 0,
                                                             "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == complete(server, "1, 2, 3,", max_tokens=6, temperature=0)


def test_logprobs_n_and_stop(server):
    r = server.client.completions.create(model="gemma-3-270m-q4_k_m", prompt="The capital of France is",
                                         max_tokens=5, temperature=0, logprobs=3, n=2)
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and all(v <= 0 for v in lp.token_logprobs) and all(len(t) == 3 for t in lp.top_logprobs)
    stopped = server.client.completions.create(model="gemma-3-270m-q4_k_m", prompt="The capital of France is",
                                               max_tokens=12, temperature=0, stop=["country"])
    assert stopped.choices[0].finish_reason == "stop" and "country" not in stopped.choices[0].text


def test_sixteen_clients_at_once_get_what_each_gets_alone(server):
    alone = [complete(server, p, max_tokens=10, temperature=0) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: complete(server, p, max_tokens=10, temperature=0), PROMPTS))
    differences = sum(a != t for a, t in zip(alone, together))
    assert differences == 0, list(zip(alone, together))


def test_replicas_on_two_devices_answer_as_one_device_does(server):
    """--devices 2: a replica of the model on each device, requests spread over them;
    each prompt's greedy text equals the one-device server's, both devices took work,
    and every block and stream is back afterwards."""
    prompts = PROMPTS[:8]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        one_device = list(pool.map(lambda p: complete(server, p, max_tokens=8, temperature=0), prompts))
    two = Server("--parallel", "4", "--devices", "2", "--cores", "4")
    try:
        assert two.metric("npurt_devices") == 2
        streams = None
        for _ in range(2):  # the second round reuses what the first one made
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda p: complete(two, p, max_tokens=8, temperature=0), prompts))
            assert answers == one_device
            assert all(two.metric("npurt_engine_steps_total", d) > 0 for d in (0, 1)), "a device took no request"
            streams = streams or [two.metric("npurt_device_streams_created_total", d) for d in (0, 1)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and two.metric("npurt_running_sequences") > 0:
            time.sleep(0.1)
        for d in (0, 1):
            assert two.metric("npurt_running_sequences", d) == 0
            assert two.metric("npurt_kv_blocks_used", d) == 0
            assert two.metric("npurt_device_streams_created_total", d) == streams[d]
    finally:
        assert two.stop() == 0


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b'{"prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    (b'{"prompt": "x", "temperature": 3}', "temperature"),
    (b'{"prompt": "x", "top_p": 0}', "top_p"),
    (b'{"prompt": 7}', "prompt"),
    (b'{"prompt": [1, -4]}', "prompt"),
    (b'{"prompt": "x", "max_tokens": 100000}', "max_tokens"),
    (b'{"prompt": "x", "stop": ["a", 1]}', "stop"),
    (b'{"prompt": "\xff\xfe bad utf-8"}', None),
    (b'[1, 2]', None),
    (b'{"prompt": "x", "n": 100}', "n"),
])
def test_bad_requests_get_400_naming_the_field(server, body, param):
    status, headers, text = server.post("/v1/completions", body)
    err = json.loads(text)["error"]
    assert status == 400 and headers["Content-Type"] == "application/json", text
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param
    assert complete(server, "1, 2,", max_tokens=2, temperature=0)  # still serving


def test_unknown_model_and_messages_are_named(server):
    status, _, text = server.post("/v1/completions", {"prompt": "x", "model": "gpt-9"})
    assert status == 404 and json.loads(text)["error"]["param"] == "model"
    status, _, text = server.post("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]})
    assert status == 400 and json.loads(text)["error"]["param"] == "messages[0].role"
    status, _, text = server.post("/v1/completions", b"{" + b" " * (2 << 20) + b"}")
    assert status == 413


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_frees_its_blocks(server, stream):
    # A request of 480 tokens needs about 480 engine steps to run to its end (479: its
    # first token comes with its prompt), so one that ends after fewer than half of them
    # was cancelled when its client left. The server is idle first, so the blocks held
    # before are nobody's that could still be let go. The client is a plain socket that
    # goes away with a reset: nothing on the client's side can keep it open.
    wait_until_idle(server)
    used_before = server.metric("npurt_kv_blocks_used")
    steps_before = server.metric("npurt_engine_steps_total")
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                       "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if stream:
        seen = b""
        while seen.count(b"data: ") < 2:  # a few chunks, then gone
            part = sock.recv(4096)
            assert part, f"the server closed the stream early: {seen!r}"
            seen += part
        assert seen.startswith(b"HTTP/1.1 200"), seen
    else:
        deadline = time.monotonic() + 10
        while server.metric("npurt_running_sequences") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.metric("npurt_running_sequences") == 1  # running, its answer not yet sent
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    wait_until_idle(server, blocks=used_before, seconds=120)
    figures = {name: server.metric(name) for name in ("npurt_running_sequences", "npurt_queue_depth",
                                                      "npurt_kv_blocks_used", "npurt_engine_steps_total")}
    assert figures["npurt_running_sequences"] == 0, figures
    assert figures["npurt_kv_blocks_used"] == used_before, figures
    assert figures["npurt_engine_steps_total"] - steps_before < 240, ("the request ran on after its client left",
                                                                      steps_before, figures)


def wait_until_idle(server, blocks=None, seconds=60):
    """Until nothing runs or waits (and `blocks` KV blocks are held, when given), or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = server.metric("npurt_running_sequences") + server.metric("npurt_queue_depth")
        if busy == 0 and (blocks is None or server.metric("npurt_kv_blocks_used") == blocks):
            return
        time.sleep(0.1)


# Bad bodies of every kind the load test sends, each with the status it must get.
MALFORMED = [
    (b'{"prompt": ', 400),
    (b'{"prompt": "x", "max_tokens": -1}', 400),
    (b'{"prompt": "\xff\xfe"}', 400),
    (b'{"prompt": "x", "model": "gpt-9"}', 404),
    (b'{"prompt": "x", "n": 100}', 400),
]


def test_metrics_and_no_device_leaks_under_load(server):
    """A few thousand requests from 12 clients at once: a third malformed, some going away mid-stream
    (streaming) or before their answer (not streaming), the rest checked against their answer alone."""
    complete(server, PROMPTS[0], max_tokens=3, temperature=0)  # warm
    streams = server.metric("npurt_device_streams_created_total")
    uploads = server.metric("npurt_device_code_uploads_total")
    expected = {p: complete(server, p, max_tokens=3, temperature=0) for p in PROMPTS}
    rss = server.rss_mib()

    def goes_away(p, stream):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": p, "max_tokens": 40, "stream": stream}),
                     {"Content-Type": "application/json"})
        if stream:
            conn.getresponse().read(100)
        conn.close()
        return "gone"

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        if i % 3 == 1:
            body, status = MALFORMED[i % len(MALFORMED)]
            return "malformed" if server.post("/v1/completions", body)[0] == status else "wrong status"
        if i % 50 == 5:
            return goes_away(p, stream=True)
        if i % 50 == 30:
            return goes_away(p, stream=False)
        return "right" if complete(server, p, max_tokens=3, temperature=0) == expected[p] else "wrong"

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(2400)))
    seconds = time.monotonic() - start
    counts = {k: results.count(k) for k in set(results)}
    print(f"2400 requests in {seconds:.1f} s: {counts}")
    assert set(counts) == {"right", "malformed", "gone"}, counts
    assert counts["malformed"] == 800 and counts["gone"] == sum(i % 3 != 1 and i % 50 in (5, 30) for i in range(2400))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.metric("npurt_running_sequences") > 0:
        time.sleep(0.2)
    assert server.metric("npurt_running_sequences") == 0
    assert server.metric("npurt_kv_blocks_used") == 0
    assert server.metric("npurt_device_streams_created_total") == streams
    assert server.metric("npurt_device_code_uploads_total") == uploads
    # Memory flat: thousands of requests leave no more than allocator slack behind.
    assert server.rss_mib() - rss < 64, (rss, server.rss_mib())
    status, text = server.get("/metrics")
    assert status == 200 and 'npurt_requests_total{endpoint="/v1/completions",status="400"}' in text
    assert 'npurt_requests_total{endpoint="/v1/completions",status="404"}' in text
    assert server.metric("npurt_time_to_first_token_seconds_count") > 0


def jinja2_prompt(template, messages, tools=None):
    """The prompt text Python's jinja2 renders, set up as Hugging Face renders chat templates."""
    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token="<bos>", eos_token="<eos>",
                                            add_generation_prompt=True, **({"tools": tools} if tools else {}))


def test_a_chat_template_writes_the_prompt_jinja2_writes(server):
    """--chat-template FILE: a chat's greedy answer and prompt tokens are a completion's whose
    prompt is jinja2's rendering of the same template, messages and tools. Gemma 3's own
    template gives the built-in turn format's prompt; Qwen 2.5's (ChatML, with the
    request's tools) another; a template's raise_exception is a 400 with its message, and
    the server goes on serving."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    tools = [{"type": "function", "function": {"name": "pick", "description": "Pick a colour",
                                               "parameters": {"type": "object", "properties": {}}}}]
    builtin = server.client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=8,
                                                    temperature=0)
    for name in ("gemma-3-it.jinja", "qwen2.5-instruct.jinja"):
        path = HERE / "chat_templates" / name
        with_tools = tools if name.startswith("qwen") else None
        s = Server("--parallel", "2", "--chat-template", str(path))
        try:
            chat = s.client.chat.completions.create(model=s.model_id, messages=messages, max_tokens=8,
                                                    temperature=0, **({"tools": with_tools} if with_tools else {}))
            prompt = jinja2_prompt(path.read_text(), messages, with_tools)
            assert ("pick" in prompt) == bool(with_tools)
            plain = s.client.completions.create(model=s.model_id, prompt=prompt, max_tokens=8, temperature=0)
            assert chat.choices[0].message.content == plain.choices[0].text
            assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
            same_as_builtin = chat.usage.prompt_tokens == builtin.usage.prompt_tokens
            assert same_as_builtin == name.startswith("gemma"), (name, chat.usage, builtin.usage)
            if name.startswith("gemma"):
                assert chat.choices[0].message.content == builtin.choices[0].message.content
                two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
                status, _, text = s.post("/v1/chat/completions", {"messages": two_users})
                err = json.loads(text)["error"]
                assert status == 400 and err["param"] == "messages", text
                assert "Conversation roles must alternate" in err["message"]
                assert s.client.chat.completions.create(model=s.model_id, messages=messages, max_tokens=1)
            else:
                status, _, text = s.post("/v1/chat/completions", {"messages": messages, "tools": "pick"})
                assert status == 400 and json.loads(text)["error"]["param"] == "tools", text
        finally:
            assert s.stop() == 0


def test_a_full_queue_answers_503_with_retry_after():
    s = Server("--parallel", "1", "--max-queue", "1")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: s.post("/v1/completions", body), range(6)))
        statuses = sorted(a[0] for a in answers)
        assert 200 in statuses and 503 in statuses, statuses
        full = next(a for a in answers if a[0] == 503)
        assert full[1]["Retry-After"] == "1" and json.loads(full[2])["error"]["type"] == "server_error"
        assert set(statuses) <= {200, 503}
    finally:
        assert s.stop() == 0


def test_curl_streams_a_chat_answer(server):
    body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0,
                       "stream": True})
    out = subprocess.run(["curl", "-sS", "-N", "--max-time", "60", server.url + "/v1/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, check=True).stdout
    events = [e for e in out.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) == 4 + 2  # 4 tokens, the finish, [DONE]
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_chat_page_and_health(server):
    status, page = server.get("/")
    assert status == 200 and "/v1/chat/completions" in page and "<textarea" in page
    assert server.get("/health") == (200, '{"status":"ready"}')


def test_chat_page_streams_an_answer_in_a_real_browser(server):
    """Headless chromium types a question into the page at GET /, presses Send and sees the
    answer grow token by token into the server's own answer to the same chat."""
    question = "Write a short story about a cat."
    expected = server.client.chat.completions.create(
        model="gemma-3-270m-q4_k_m", messages=[{"role": "user", "content": question}], max_tokens=256,
        temperature=0).choices[0].message.content
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_script_timeout(10)
        driver.get(server.url + "/")
        driver.find_element(By.ID, "prompt").send_keys(question)
        driver.find_element(By.ID, "send").click()
        script = ("const log = document.getElementById('log'); const last = log.lastElementChild;"
                  "return [log.dataset.state || '', log.children.length > 1 && last ? last.textContent : ''];")
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state, text = driver.execute_script(script)
            if not seen or seen[-1] != text:
                seen.append(text)
            if state == "done":
                break
            time.sleep(0.05)
        assert state == "done", f"no answer after 120 s: {seen[-1]!r}"
        assert seen[-1] == expected
        partial = [t for t in seen if t and t != expected]
        assert len(partial) >= 2 and all(expected.startswith(t) for t in partial), partial
        assert driver.find_element(By.CSS_SELECTOR, "#log .user").text == "> " + question
        assert "tokens/s" in driver.find_element(By.ID, "figures").text
    finally:
        driver.quit()
