"""npurt.Gemma3 on the real model (skipped when it is not installed: `make model`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import npurt

MODEL = os.environ.get("NPURT_MODEL") or os.path.join(
    os.path.dirname(__file__), "..", "..", "models", "gemma-3-270m-q4_k_m.gguf")
needs_model = pytest.mark.skipif(not os.path.isfile(MODEL), reason="no model installed (make model)")

# llama.cpp's greedy tokens for "The capital of France is" on the same file (see
# docs/models.md): " the capital of the country of France."
LLAMA_CPP_FIRST_8 = [506, 5279, 529, 506, 2891, 529, 7001, 236761]


@pytest.fixture(scope="module")
def model() -> npurt.Gemma3:
    return npurt.Gemma3(MODEL, max_context=256)


@needs_model
def test_generate_streams_the_reference_continuation(model):
    pieces: list[str] = []
    text = model.generate("The capital of France is", max_tokens=8, on_text=pieces.append)
    assert model.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert text == model.decode(LLAMA_CPP_FIRST_8)
    assert "".join(pieces) == text and len(pieces) == 8
    stats = model.stats
    assert stats["prompt_tokens"] == 6 and stats["generated_tokens"] == 8 and stats["decoded_tokens"] == 7
    assert stats["decode_steps"] + stats["verify_steps"] + stats["accepted_tokens"] == 7
    assert stats["decode_seconds"] > 0


@needs_model
def test_device_and_host_oracle_agree(model):
    prompt = model.encode("Once upon a time")
    host = npurt.Gemma3(MODEL, device="host")
    assert model.generate_ids(prompt, 8) == host.generate_ids(prompt, 8)


@needs_model
def test_a_failing_callback_raises_and_the_model_stays_usable(model):
    def boom(_: str) -> None:
        raise RuntimeError("stop here")

    before = model.generate_ids([2, 818], 2)
    with pytest.raises(RuntimeError, match="stop here"):
        model.generate("The capital of France is", max_tokens=4, on_text=boom)
    assert model.generate_ids([2, 818], 2) == before
    with pytest.raises(npurt.InvalidArgumentError, match="token 999999"):
        model.generate_ids([2, 999999], 2)
    assert len(model.generate_ids([2, 818], 2)) == 2


def test_bad_paths_and_devices_raise_clear_errors(tmp_path):
    with pytest.raises(npurt.Error, match="no-such.gguf"):
        npurt.Gemma3(str(tmp_path / "no-such.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(npurt.Error):
        npurt.Gemma3(str(bad))
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        npurt.Gemma3(MODEL, device="tpu")


HINT = "pass a path or set NPURT_MODEL (`make model` installs the file)"
CHECKOUT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_npurt_model_naming_a_missing_file_is_named(tmp_path, monkeypatch):
    missing = tmp_path / "missing.gguf"
    monkeypatch.setenv("NPURT_MODEL", str(missing))
    with pytest.raises(npurt.NotFoundError) as e:
        npurt.Gemma3()
    assert str(e.value) == f"gemma3: no model file at {missing} (from NPURT_MODEL); {HINT}"


@needs_model
def test_a_path_given_wins_over_npurt_model(tmp_path, monkeypatch):
    monkeypatch.setenv("NPURT_MODEL", str(tmp_path / "missing.gguf"))
    assert npurt.Gemma3(MODEL, max_context=8).path == MODEL


def test_without_npurt_model_the_checkout_file_is_the_default(monkeypatch):
    if os.path.commonpath([os.path.realpath(npurt.__file__), CHECKOUT]) != CHECKOUT:
        pytest.skip("this package was not installed inside its checkout")
    monkeypatch.delenv("NPURT_MODEL", raising=False)
    checkout_model = os.path.join(CHECKOUT, "models", "gemma-3-270m-q4_k_m.gguf")
    if os.path.isfile(checkout_model):
        assert os.path.realpath(npurt.Gemma3(max_context=8).path) == checkout_model
    else:
        with pytest.raises(npurt.NotFoundError) as e:
            npurt.Gemma3()
        assert "NPURT_MODEL is not set" in str(e.value) and checkout_model in str(e.value)
        assert str(e.value).endswith(HINT)


OUTSIDE_SCRIPT = """
import npurt, sys
assert npurt.__file__.startswith(sys.argv[1]), npurt.__file__
try:
    npurt.Gemma3()
    print("loaded")
except npurt.NotFoundError as e:
    print(e)
"""


def test_a_package_installed_outside_its_checkout_has_no_default_but_npurt_model(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(os.path.dirname(npurt.__file__), site / "npurt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NPURT_MODEL"}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", OUTSIDE_SCRIPT, str(site)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    message = r.stdout.strip()
    assert message == (f"gemma3: no model file: NPURT_MODEL is not set (this package, at {site / 'npurt'}, "
                       f"runs outside the checkout it was built in, so it has no default file); {HINT}")


@needs_model
def test_batched_prefill_is_the_default_and_matches_token_by_token(model):
    prompt = model.encode("The river runs past the old mill, where the miller's children count the boats "
                          "that carry grain to the city every morning before the market opens.")
    top = model.prefill_chunk
    assert top == 256  # the default chunk (512) capped at the fixture's context
    batched = model.generate_ids(prompt, 8)
    # Two clocks: the first token comes after the whole prompt's prefill.
    assert model.stats["time_to_first_token"] >= model.stats["prefill_seconds"] > 0
    model.prefill_chunk = 0
    try:
        assert model.generate_ids(prompt, 8) == batched
        model.prefill_chunk = 7  # a smaller runtime chunk: several calls per prompt
        assert model.generate_ids(prompt, 8) == batched
        with pytest.raises(ValueError, match="prefill chunk 257 is above the compiled maximum 256"):
            model.prefill_chunk = 257
        assert model.prefill_chunk == 7
    finally:
        model.prefill_chunk = top
    with pytest.raises(npurt.Error, match="empty"):
        model.generate_ids([], 2)
    assert model.generate_ids(prompt, 8) == batched


@needs_model
def test_an_f16_kv_cache_keeps_the_reference_continuation():
    half = npurt.Gemma3(MODEL, max_context=64, kv_cache="f16")
    assert half.generate_ids(half.encode("The capital of France is"), 8) == LLAMA_CPP_FIRST_8
    with pytest.raises(ValueError, match="kv_cache 'q8_0': expected 'f32', 'f16' or 'bf16'"):
        npurt.Gemma3(MODEL, kv_cache="q8_0")


@needs_model
def test_speculation_gives_the_plain_greedy_tokens(model):
    for text in ("1, 2, 3, 4, 5, 6, 7, 8,", "Once upon a time"):
        prompt = model.encode(text)
        plain = model.generate_ids(prompt, 48, speculate=0)
        assert model.stats["verify_steps"] == 0 and model.stats["tokens_per_pass"] == 1.0
        assert model.generate_ids(prompt, 48, speculate=7) == plain
        assert model.generate_ids(prompt, 48) == plain  # on by default
        stats = model.stats
        assert stats["generated_tokens"] == 48
        assert stats["decoded_tokens"] == 47  # every token after the first came from a decoding pass
        assert stats["accepted_tokens"] <= stats["drafted_tokens"]
        assert stats["decode_steps"] + stats["verify_steps"] + stats["accepted_tokens"] == 47
    assert model.generate("Once upon a time", max_tokens=16, speculate=15) == model.generate(
        "Once upon a time", max_tokens=16, speculate=0)


@needs_model
def test_seeded_sampling_is_reproducible_and_speculation_keeps_it(model):
    prompt = model.encode("Once upon a time")
    options = dict(temperature=0.9, top_p=0.95, seed=5, logprobs=2)
    plain = model.generate_ids(prompt, 24, speculate=0, **options)
    logprobs = model.stats["logprobs"]
    assert len(logprobs) == 24 and [e["token"] for e in logprobs] == plain
    for e in logprobs:
        (best, best_lp), (_, second_lp) = e["top"]
        assert best_lp >= second_lp and e["logprob"] <= best_lp
        assert e["token"] != best or e["logprob"] == best_lp
    assert model.generate_ids(prompt, 24, speculate=7, **options) == plain
    assert model.generate_ids(prompt, 24, speculate=0, **{**options, "seed": 6}) != plain
    # Greedy through the sampler's path (logprobs read the logits) is plain greedy.
    greedy = model.generate_ids(prompt, 16, speculate=0)
    assert model.generate_ids(prompt, 16, speculate=0, logprobs=1) == greedy
    assert model.stats["finish_reason"] == "length"


@needs_model
def test_stop_strings_and_bad_sampling_options(model):
    full = model.generate("The capital of France is", 8, speculate=0)
    cut = full.index(" of") if " of" in full else len(full) // 2
    stop = full[cut:cut + 3]
    text = model.generate("The capital of France is", 8, speculate=0, stop=[stop])
    assert stop not in text and full.startswith(text)
    assert model.stats["finish_reason"] == "stop_string"
    for bad, name in ((dict(temperature=-1.0), "temperature"), (dict(top_p=1.5), "top_p"),
                      (dict(min_p=-0.5), "min_p"), (dict(logprobs=21), "top_logprobs")):
        with pytest.raises(ValueError, match=name):
            model.generate("The capital", 2, **bad)
    assert model.generate_ids(model.encode("The capital of France is"), 8) == LLAMA_CPP_FIRST_8


@needs_model
def test_speculation_rejects_what_it_cannot_run(model):
    with pytest.raises(ValueError, match="speculate 16 drafts need a verify step of 17 tokens"):
        model.generate_ids([2, 818], 4, speculate=16)
    with pytest.raises(ValueError, match="negative"):
        model.generate_ids([2, 818], 4, speculate=-1)
    host = npurt.Gemma3(MODEL, device="host")
    with pytest.raises(ValueError, match="one simulated NPU"):
        host.generate_ids([2, 818], 4, speculate=3)
    assert len(model.generate_ids([2, 818], 4, speculate=3)) == 4


@needs_model
@pytest.mark.parametrize("text", ["The capital of France is", "1, 2, 1, 2, 1, 2,"])
def test_default_options_work_wherever_plain_decoding_does(text):
    """A context barely longer than the prompt: shorter than the verify step, so the
    default drafts must shrink to fit instead of raising."""
    probe = npurt.Gemma3(MODEL, max_context=16)
    prompt = probe.encode(text)
    del probe
    for extra in (1, 2, 3):
        model = npurt.Gemma3(MODEL, max_context=len(prompt) + extra)
        for n in (1, 2, 3):
            if len(prompt) + n - 1 > len(prompt) + extra:
                continue  # the last fed-back token would not fit: plain decoding fails too
            where = f"context {len(prompt) + extra}, {n} tokens"
            plain_ids = model.generate_ids(prompt, n, speculate=0)
            assert len(plain_ids) == n, where
            assert model.generate_ids(prompt, n) == plain_ids, where
            plain_text = model.generate(text, max_tokens=n, speculate=0)
            assert model.generate(text, max_tokens=n) == plain_text == model.decode(plain_ids), where


@needs_model
def test_engine_requests_get_what_they_get_alone_and_the_reference_continuation():
    batched = npurt.Gemma3(MODEL, max_context=64, prefill_chunk=0, batch=3)
    engine = batched.engine()
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "The sky is"]
    seeded = {"temperature": 0.8, "top_k": 40, "seed": 7}
    ids = [engine.submit(p, max_tokens=8) for p in prompts[:3]]
    ids.append(engine.submit(prompts[3], max_tokens=8, **seeded))
    streamed: dict[int, list[int]] = {i: [] for i in ids}
    while engine.queued or engine.running:
        for request, token in engine.step():
            streamed[request].append(token)
    assert [engine.state(i) for i in ids] == ["finished"] * 4
    assert all(engine.output(i) == streamed[i] for i in ids)
    # The greedy continuation of the first prompt is llama.cpp's on the same file.
    assert engine.output(ids[0]) == LLAMA_CPP_FIRST_8
    # Each request alone gives the same tokens (greedy and seeded alike).
    for prompt, i in zip(prompts, ids):
        alone = batched.engine()
        j = alone.submit(prompt, max_tokens=8, **(seeded if i == ids[3] else {}))
        alone.run()
        assert alone.output(j) == engine.output(i), prompt
    # Cancelling frees the request's blocks; bad requests raise by name.
    free = engine.free_blocks
    k = engine.submit("The capital of France is", max_tokens=8)
    engine.step()
    engine.step()
    assert engine.state(k) == "running" and engine.free_blocks < free
    engine.cancel(k)
    assert engine.state(k) == "cancelled" and engine.free_blocks == free
    with pytest.raises(npurt.InvalidArgumentError, match="max_tokens 0"):
        engine.submit("x", max_tokens=0)
    with pytest.raises(npurt.FailedPreconditionError, match="batch=N"):
        npurt.Gemma3(MODEL, max_context=64).engine()


def test_engine_chunked_prompts_stop_strings_and_logprobs():
    model = npurt.Gemma3(MODEL, max_context=96, prefill_chunk=16, batch=2)
    long = "In the beginning" + " and then the next thing happened" * 5
    assert len(model.encode(long)) > 16  # two prefill chunks
    engine = model.engine()
    plain = engine.submit("The capital of France is", max_tokens=8)
    sampled = engine.submit(long, max_tokens=8, temperature=0.8, seed=3, logprobs=2)
    stopped = engine.submit("The capital of France is", max_tokens=8, stop=["country"])
    engine.run()
    assert engine.output(plain) == LLAMA_CPP_FIRST_8
    assert "country" in engine.text(plain)
    assert engine.text(plain).startswith(engine.text(stopped)) and "country" not in engine.text(stopped)
    assert len(engine.output(stopped)) == 4  # " the capital of the", then " country"
    assert engine.finish_reason(stopped) == "stop_string"
    logprobs = engine.logprobs(sampled)
    assert [e["token"] for e in logprobs] == engine.output(sampled)
    assert all(e["logprob"] <= 0 and len(e["top"]) == 2 for e in logprobs)
    alone = model.engine()
    again = alone.submit(long, max_tokens=8, temperature=0.8, seed=3)
    alone.run()
    assert alone.output(again) == engine.output(sampled)
