"""The calculator's prediction for the swept setup, at each level (and between them, for a smooth
curve): `exporter.model.predict` with the server's model, the GPU/TP given, vLLM's default engine
flags, and the sweep's mean prompt/output lengths; a priori, and calibrated on the sweep's own
levels (`calibrated`), with how well that calibration predicts levels it was not given."""
from __future__ import annotations

import math
from typing import Any, Sequence

from exporter.errors import InputError
from exporter.model import Setup, Traffic, predict
from exporter.model.calibrate import Row, describe, fit_setup


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


def _mape(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean |predicted - measured| / measured over (predicted, measured) pairs, None when empty."""
    errs = [abs(p - m) / m for p, m in pairs if m and p is not None and math.isfinite(p)]
    return round(sum(errs) / len(errs), 4) if errs else None


def calibrated(model: str, gpu: str | None, tp: int, levels: Sequence[dict[str, Any]], xs: Sequence[float], *,
               dtype: str = "auto", max_num_seqs: int | None = None,
               version: str | None = None) -> dict[str, Any] | None:
    """The model calibrated on this sweep's own concurrency levels (what `calc --calibrate` does
    with the rows `--out` writes), its curve at `xs`, and how well it predicts levels it was not
    given: each level between the lowest and the highest predicted by a calibration on all the
    others, scored beside the a-priori model. None without a GPU or two completed levels."""
    done = [lv for lv in levels if lv.get("completed") and lv.get("tpot_mean_s") and lv.get("ttft_mean_s")]
    if not gpu or len(done) < 2:
        return None
    try:
        setup = Setup.build(model, gpu, tp=tp, dtype=dtype, max_num_seqs=max_num_seqs)
    except (InputError, ValueError):
        return None
    rows = [Row(model=setup.model.name, gpu=setup.gpu.name, tp=tp, dtype="bf16",
                input_len=float(lv.get("prompt_tokens_mean") or 1), output_len=float(lv.get("output_tokens_mean") or 1),
                concurrency=float(lv["concurrency"]), tpot_s=lv["tpot_mean_s"], ttft_s=lv["ttft_mean_s"],
                line=i + 1, engine_version=version) for i, lv in enumerate(done)]
    level_of = {f"line {r.line}": f"c={r.concurrency:g}" for r in rows}

    def levels_named(labels: Sequence[str]) -> list[str]:
        return [level_of.get(x, x) for x in labels]

    fit, _ = fit_setup(setup, rows, quantization=None, vllm_version=version)
    prompt = sum(r.input_len for r in rows) / len(rows)
    output = sum(r.output_len for r in rows) / len(rows)
    traffic = Traffic(prompt_tokens_mean=prompt, output_tokens_mean=output)
    applied = bool(fit.rows_used) and not fit.rejected
    points = []
    for x in xs:
        d = predict(setup, traffic, concurrency=x, calibration=fit.calibration if applied else None).as_dict()
        points.append({"x": x, "output_tokens_per_s": d["output_tokens_per_s"], "ttft_s": d["ttft_s"],
                       "tpot_s": d["tpot_s"]})
    summary = fit.as_dict()
    for k in ("outliers", "ttft_set_aside", "below_floor"):
        summary[k] = levels_named(summary[k])
    out: dict[str, Any] = {"applied": applied, "fit": summary, "points": points, "held_out": None}
    if len(rows) >= 3:
        # leave one level out: each level between the ends predicted by a fit on all the others
        # (the ends stay in every fit: the curve is interpolated, never extrapolated)
        got: dict[str, list[tuple[float, float]]] = {"tpot": [], "ttft": [], "tpot_prior": [], "ttft_prior": []}
        folds = 0
        for r in rows[1:-1]:
            rest, _ = fit_setup(setup, [x for x in rows if x is not r], quantization=None, vllm_version=version)
            cal = rest.calibration if rest.rows_used and not rest.rejected else None
            folds += cal is not None
            t = Traffic(prompt_tokens_mean=r.input_len, output_tokens_mean=r.output_len)
            p1 = predict(setup, t, concurrency=r.concurrency, calibration=cal)
            p0 = predict(setup, t, concurrency=r.concurrency)
            got["tpot"].append((p1.tpot_s, r.tpot_s))
            got["ttft"].append((p1.ttft_s, r.ttft_s))
            got["tpot_prior"].append((p0.tpot_s, r.tpot_s))
            got["ttft_prior"].append((p0.ttft_s, r.ttft_s))
        out["held_out"] = None if not folds else {"scored": [f"c={r.concurrency:g}" for r in rows[1:-1]],
                           "tpot_mape": _mape(got["tpot"]), "ttft_mape": _mape(got["ttft"]),
                           "prior_tpot_mape": _mape(got["tpot_prior"]), "prior_ttft_mape": _mape(got["ttft_prior"])}
    return out


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v * 100:.1f} %"


def calibration_lines(pred: dict[str, Any]) -> list[str]:
    """The model against this sweep, in words: calibrated on its levels, and on its two ends with
    the levels between predicted (`loadgen.prediction.calibrated`)."""
    cal = pred.get("calibrated")
    if not cal:
        return []
    fit = cal["fit"]
    words = dict(describe(fit))
    if cal["applied"]:
        out = [f"model calibrated on this sweep: {fit['rows_used']} levels, mean error {words['mean error on them']}; "
               f"factors moved: {words['factors moved']}"]
    elif fit.get("rejected"):
        out = [f"model not calibrated: the fit left physics ({fit['rejected']}); the a-priori prediction stands"]
    elif fit.get("below_floor"):
        out = ["model not calibrated: every level ran faster than the GPU's datasheet allows at its load "
               "(is --gpu the GPU the server runs on?); the a-priori prediction stands"]
    else:
        out = ["model not calibrated: no level could be used; the a-priori prediction stands"]
    out += [f"  {k}: {v}" for k, v in words.items() if k in ("set aside", "TTFT not fitted", "faster than the datasheet")]
    h = cal.get("held_out")
    if h:
        out.append(f"held out: {', '.join(h['scored'])}, each predicted by a calibration on the other levels, "
                   f"within TPOT {_pct(h['tpot_mape'])} / TTFT {_pct(h['ttft_mape'])} (a priori "
                   f"{_pct(h['prior_tpot_mape'])} / {_pct(h['prior_ttft_mape'])})")
    return out
