"""The calculator's prediction for the swept setup, at each level (and between them, for a smooth
curve): `exporter.model.predict` with the server's model, the GPU/TP given, vLLM's default engine
flags, and the sweep's mean prompt/output lengths."""
from __future__ import annotations

from typing import Any, Sequence

from exporter.errors import InputError
from exporter.model import Setup, Traffic, predict


def predictions(model: str, gpu: str | None, tp: int, prompt: float, output: float,
                xs: Sequence[float], *, key: str = "concurrency",
                dtype: str = "auto", max_num_seqs: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """([{x, output_tokens_per_s, ttft_s, tpot_s}], note); an empty list and the reason when the
    model or GPU is not resolvable."""
    if not gpu:
        return [], "no prediction: the GPU is unknown (give --gpu)"
    try:
        setup = Setup.build(model, gpu, tp=tp, dtype=dtype, max_num_seqs=max_num_seqs)
        traffic = Traffic(prompt_tokens_mean=max(1.0, prompt), output_tokens_mean=max(1.0, output))
        out = []
        for x in xs:
            p = predict(setup, traffic, **({"concurrency": x} if key == "concurrency" else {"rate": x}))
            d = p.as_dict()
            out.append({"x": x, "output_tokens_per_s": d["output_tokens_per_s"], "ttft_s": d["ttft_s"],
                        "tpot_s": d["tpot_s"]})
    except (InputError, ValueError) as exc:
        return [], f"no prediction: {exc}"
    return out, (f"model prediction: {setup.model.name} on {tp} x {setup.gpu.name}, max_num_seqs "
                 f"{setup.max_num_seqs}, other flags vLLM's defaults, prompt {prompt:.0f} / output {output:.0f} tokens")
