"""Models on the device.

    model = npurt.Gemma3()          # $NPURT_MODEL, else the file `make model` installs
    text = model.generate("The capital of France is", max_tokens=8, on_text=print)

:class:`Gemma3` loads a Gemma-3 GGUF file onto a simulated NPU of its own (or the f32
host oracle with ``device="host"``, or tensor parallel over ``devices=N`` simulated
NPUs in this process) and decodes greedily; see docs/models.md. Loaded with
``batch=N``, ``model.engine()`` gives an :class:`Engine`: requests continuously batched,
N per pass over the weights.

    engine = npurt.Gemma3(batch=4).engine()
    ids = [engine.submit(p, max_tokens=16) for p in prompts]
    engine.run()
    texts = [engine.text(i) for i in ids]"""

from __future__ import annotations

from ._npurt import Engine, Gemma3

__all__: list[str] = ["Engine", "Gemma3"]
