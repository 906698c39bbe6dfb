"""npurt.Gemma3 on the real model (skipped when it is not installed: `make model`)."""

from __future__ import annotations

import os

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
def test_speculation_rejects_what_it_cannot_run(model):
    with pytest.raises(ValueError, match="speculate 16 drafts need a verify step of 17 tokens"):
        model.generate_ids([2, 818], 4, speculate=16)
    with pytest.raises(ValueError, match="negative"):
        model.generate_ids([2, 818], 4, speculate=-1)
    host = npurt.Gemma3(MODEL, device="host")
    with pytest.raises(ValueError, match="one simulated NPU"):
        host.generate_ids([2, 818], 4, speculate=3)
    assert len(model.generate_ids([2, 818], 4, speculate=3)) == 4
