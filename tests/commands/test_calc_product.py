"""`vllm-drift calc` as people use it: presets, tails, trade-off tables, spec verdict, tiers and
one-line errors. In-process through `exporter.cli.main` (the real parser and command) except where
the exit status of the installed command is the point."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from exporter.cli import main
from exporter.model.gpus import GPUS
from exporter.model.optimizer import round_model_len
from exporter.model.profiles import get_profile, profiles
from exporter.model.traffic import TAIL_FACTOR

BASE = ["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB"]


def calc_json(capsys, *args: str) -> dict:
    assert main([*BASE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_profile_json_names_every_assumption_and_its_source(capsys):
    doc = calc_json(capsys, "--profile", "chatbot")
    prof, chat = doc["profile"], get_profile("chatbot")
    assert prof["name"] == "chatbot" and prof["objective"] == "cost" == doc["objective"]
    assert {"lengths", "slo", "arrival"} <= set(prof["sources"])
    assert prof["overridden_by_flags"] == []
    # the preset's numbers are what the calculation used
    assert doc["traffic"]["prompt_tokens"] == {"mean": chat.prompt_tokens_mean, "p99": chat.prompt_tokens_p99,
                                               "p99_source": "given"}
    assert doc["recommendation"]["max_model_len"] >= chat.prompt_tokens_p99 + chat.output_tokens_p99
    assert doc["predicted"]["meets_slo"] is not None        # the preset carries SLOs
    assert all(t["meets_slo"] is not None for t in doc["tiers"])


def test_a_flag_overrides_the_profile_and_is_reported(capsys):
    doc = calc_json(capsys, "--profile", "code-generation", "--output-tokens", "64", "--tpot-slo", "0.08")
    assert doc["profile"]["overridden_by_flags"] == ["--output-tokens", "--tpot-slo"]
    assert doc["traffic"]["output_tokens"]["mean"] == 64
    assert doc["traffic"]["prompt_tokens"]["mean"] == get_profile("code-generation").prompt_tokens_mean


@pytest.mark.parametrize("name", list(profiles()))
def test_every_profile_runs_and_is_computed_for_the_setup(capsys, name):
    doc = calc_json(capsys, "--profile", name)
    assert doc["profile"]["name"] == name
    assert doc["recommendation"]["max_num_seqs"] >= 1
    assert isinstance(doc["notes"], list)


def test_profile_recommendation_depends_on_the_gpu(capsys):
    """Computed for the model and GPU, not copied from a rule of thumb."""
    big = calc_json(capsys, "--profile", "chatbot")
    assert main(["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--profile", "chatbot",
                 "--json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["recommendation"]["max_num_seqs"] < big["recommendation"]["max_num_seqs"]


def test_default_traffic_means_get_the_documented_tail_margin(capsys):
    doc = calc_json(capsys, "--prompt-tokens", "1024", "--output-tokens", "256")
    want = round_model_len(math.ceil(1024 * TAIL_FACTOR) + math.ceil(256 * TAIL_FACTOR))
    assert doc["recommendation"]["max_model_len"] == want > 1280
    assert doc["traffic"]["prompt_tokens"]["p99_source"] == "margin"
    assert any("p99 = 3.37 x mean" in n for n in doc["notes"])


def test_stated_tails_are_never_truncated_and_no_margin_note(capsys):
    doc = calc_json(capsys, "--prompt-tokens", "1024", "--prompt-tokens-p99", "6000",
                    "--output-tokens", "256", "--output-tokens-p99", "1500", "--max-model-len", "8192")
    assert doc["recommendation"]["max_model_len"] >= 7500
    assert doc["notes"] == []   # a list, even when empty


def test_sweep_max_num_seqs_rows(capsys):
    doc = calc_json(capsys, "--sweep", "max_num_seqs")
    sw = doc["sweep"]
    assert sw["param"] == "max_num_seqs" and len(sw["rows"]) >= 5
    for row in sw["rows"]:
        assert {"value", "kv_tokens", "max_concurrency", "throughput_tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                "tpot_p50_s", "tpot_p99_s", "dollars_per_million_tokens", "recommended", "binding"} <= set(row)
        assert row["tpot_p99_s"] >= row["tpot_p50_s"] > 0
    marked = [r for r in sw["rows"] if r["recommended"]]
    assert [r["value"] for r in marked] == [doc["recommendation"]["max_num_seqs"]]
    by = {r["value"]: r for r in sw["rows"]}
    # more running requests: more throughput, slower tokens (until KV binds)
    assert by[8]["throughput_tokens_per_s"] < by[64]["throughput_tokens_per_s"]
    assert by[8]["tpot_p50_s"] < by[64]["tpot_p50_s"]


@pytest.mark.parametrize("param", ["gpu_memory_utilization", "max_model_len", "max_num_batched_tokens", "tp",
                                   "kv_cache_dtype", "quantization"])
def test_every_sweep_parameter(capsys, param):
    sw = calc_json(capsys, "--profile", "chatbot", "--sweep", param)["sweep"]
    assert sw["param"] == param and len(sw["rows"]) >= 2
    assert sum(r["recommended"] for r in sw["rows"]) <= 1
    if param == "kv_cache_dtype":
        by = {r["value"]: r for r in sw["rows"]}
        assert by["fp8"]["kv_tokens"] > 1.9 * by["auto"]["kv_tokens"]
    if param == "max_model_len":
        short = [r for r in sw["rows"] if r["value"] < 4096 + 512]
        assert short and all(r.get("truncates") and r["meets_slo"] is False for r in short)


def test_spec_decoding_verdict_across_acceptance_and_break_even(capsys):
    sd = calc_json(capsys)["speculative_decoding"]
    assert [r["acceptance"] for r in sd["by_acceptance"]] == [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert "acceptance unknown" in sd["assumption"]
    be = sd["break_even_acceptance"]
    assert be is not None and 0 < be < 1
    for r in sd["by_acceptance"]:   # speed-up crosses 1 at the break-even acceptance
        assert (r["speedup"] > 1) == (r["acceptance"] > be)
    given = calc_json(capsys, "--spec-tokens", "3", "--spec-acceptance", "0.8")["speculative_decoding"]
    assert [r["acceptance"] for r in given["by_acceptance"]] == [0.8]


def test_tiers_keep_the_current_gpu_and_say_dash_without_slo(capsys):
    doc = calc_json(capsys)
    tiers = doc["tiers"]
    assert [t for t in tiers if t["current"]] == [t for t in tiers if (t["gpu"], t["tp"]) == ("H100-SXM-80GB", 1)]
    assert any(t["current"] for t in tiers)
    assert all(t["meets_slo"] is None for t in tiers)
    costs = [t["dollars_per_million_tokens"] for t in tiers if t["dollars_per_million_tokens"] is not None]
    assert costs == sorted(costs)
    # an expensive current setup (8 x B200 for an 8B model) ranks past the top 12 and is still listed
    assert main(["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "B200", "--tp", "8", "--json"]) == 0
    tiers = json.loads(capsys.readouterr().out)["tiers"]
    assert len(tiers) == 13 and tiers[-1]["current"]
    assert [(t["gpu"], t["tp"]) for t in tiers if t["current"]] == [(GPUS["B200-180GB"].name, 8)]


def test_a_mapped_model_name_is_said(capsys):
    assert main(["calc", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--json"]) == 0
    cap = capsys.readouterr()
    notes = json.loads(cap.out)["notes"]
    assert any("'meta-llama/Llama-3.1-8B'" in n and "Llama-3.1-8B-Instruct" in n for n in notes)
    assert "note:" in cap.err


def test_human_output_has_tables_for_profile_sweep_and_tiers(capsys):
    assert main([*BASE, "--profile", "batch", "--sweep", "kv_cache_dtype"]) == 0
    out = capsys.readouterr().out
    for text in ("Profile: batch", "Recommended flags", "Trade-off: kv_cache_dtype", "Speculative decoding",
                 "GPU tiers", "(current)"):
        assert text in out
    assert "\x1b[" not in out   # piped: no colour codes
    assert "[assumption]" in out  # source text is printed as written, not read as rich markup


def test_list_profiles(capsys):
    assert main(["calc", "--list-profiles"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in profiles())
    assert main(["calc", "--list-profiles", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == list(profiles())


@pytest.mark.parametrize("args, words", [
    (["--model", "nonsense", "--gpu", "H100"], ["unknown model 'nonsense'", "closest catalog ids", "/"]),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--profile", "chatty"], ["unknown profile", "chatbot"]),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--prompt-tokens", "900",
      "--prompt-tokens-p99", "100"], ["--prompt-tokens-p99", "mean"]),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--sweep", "nope"], ["--sweep", "invalid choice"]),
    (["--gpu", "H100"], ["missing --model"]),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--html", "/nonexistent-dir/r.html"], ["--html"]),
])
def test_bad_input_is_one_line_exit_2(args, words):
    r = subprocess.run([sys.executable, "-m", "exporter", "calc", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "()" not in err and "Traceback" not in err
    for w in words:
        assert w in err


def test_bare_command_prints_the_command_list():
    r = subprocess.run([sys.executable, "-m", "exporter"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for name in ("serve", "scan", "calc", "catalog"):
        assert f"    {name}" in r.stdout


def test_lengths_from_a_request_log(capsys, tmp_path):
    import random
    import statistics
    rng = random.Random(7)
    rows = [(int(rng.lognormvariate(6.5, 0.7)) + 1, int(rng.lognormvariate(5.0, 0.6)) + 1) for _ in range(400)]
    csv_file = tmp_path / "requests.csv"
    csv_file.write_text("prompt_tokens,output_tokens\n" + "".join(f"{p},{o}\n" for p, o in rows))
    jsonl = tmp_path / "requests.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) + "\n" for p, o in rows))
    for path in (csv_file, jsonl):
        doc = calc_json(capsys, "--lengths-from", str(path))
        tr = doc["traffic"]
        assert tr["prompt_tokens"]["mean"] == pytest.approx(statistics.fmean(p for p, _ in rows))
        p99 = sorted(p for p, _ in rows)[int(0.99 * 399)]
        assert tr["prompt_tokens"]["p99"] == pytest.approx(p99, rel=0.05)
        assert tr["lengths_from"]["requests"] == 400 and doc["notes"] == []
        assert doc["recommendation"]["max_model_len"] >= tr["prompt_tokens"]["p99"] + tr["output_tokens"]["p99"]
    # a flag still wins over the file
    doc = calc_json(capsys, "--lengths-from", str(csv_file), "--output-tokens", "50", "--output-tokens-p99", "60")
    assert doc["traffic"]["output_tokens"]["mean"] == 50


def test_bad_lengths_file_names_the_line(tmp_path):
    bad = tmp_path / "r.csv"
    bad.write_text("prompt_tokens,output_tokens\n100,20\nabc,5\n")
    r = subprocess.run([sys.executable, "-m", "exporter", *BASE, "--lengths-from", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().endswith(f"{bad}:3: prompt_tokens/output_tokens missing or not numbers")


def test_a_recommended_length_that_does_not_fit_is_said(capsys):
    assert main(["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--profile", "long-document",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recommendation"]["max_model_len"] >= 126976 + 2048   # never truncates the stated traffic
    assert any("vLLM would not start" in n for n in doc["notes"])
    assert not any(t["current"] and t["meets_slo"] for t in doc["tiers"])
