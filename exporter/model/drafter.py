"""The memory a speculative-decoding drafter takes: `--speculative-config` as vLLM reads it.

vLLM's V1 engine loads the drafter in the model runner's `load_model`, before the startup
profile, so its weights are part of "Model loading took"; its attention layers register in the
same forward context as the target's, so `get_kv_cache_spec` gives them pages in the one KV pool
and every block pays for them (v1/spec_decode/eagle.py `load_model`: the draft layers are the
Attention layers the target did not have). Read in vLLM's wheels 0.7.3, 0.11.0, 0.13.0, 0.14.0 and 0.15.0:

- `ngram` (prompt lookup, also `[ngram]`, `suffix`): no weights, no cache.
- `eagle`: `num_hidden_layers` (1) Llama decoder layers of the head's own width, an `fc` of
  2 x hidden -> hidden (torch.nn.Linear: whole on every rank); the embedding and the lm_head are
  the target's (llama_eagle.py; EagleProposer shares embed_tokens when the shapes match and takes
  the target's lm_head).
- `eagle3`: as eagle, but the layer's qkv_proj reads 2 x hidden, `fc` is 3 x hidden -> hidden,
  and the head keeps its own lm_head of `draft_vocab_size` rows unless it has the target's shape
  (llama_eagle3.py). The EAGLE-3 heads published for Llama 3.x and Qwen3 use a 32,000-token
  draft vocabulary: the default here when the head's config.json is not readable.
- `mtp` (deepseek_mtp, glm4_moe_mtp, mimo_mtp, ... all renamed `mtp`): the target checkpoint's
  own `num_nextn_predict_layers` extra layers, each a full decoder layer of the target (an MoE
  layer where the target's last layers are), in the target's weight scheme, plus `eh_proj`
  (2 x hidden -> hidden, whole on every rank) and, in DeepSeek's and GLM's layout, a
  `shared_head` lm_head of the target's vocabulary (deepseek_mtp.py, glm4_moe_mtp.py; MiMo's and
  Qwen3-Next's own lm_head is swapped for the target's); the embedding is shared.
- `draft_model` (a separate smaller model, V1 from 0.15.0; 0.11-0.14 refuse it with "not
  supported yet"): the draft model whole, its own embedding and lm_head, at the target's TP
  (vLLM 0.15 refuses another draft TP), its layers' pages beside the target's. Before 0.11 it ran
  on the V0 engine (0.8-0.10 fell back to it), whose SpecDecodeWorker profiled the target alone
  and split the target's blocks between the two caches by page size: the same pages per block,
  and from 0.6.5 without the draft weights coming out of the pool (`runs_on_v0`,
  setup.V0_MEMORY_PROFILING).

Not modelled: the drafter's own dummy run in the profile (one layer after the target's forward,
under the target's peak), its CUDA graphs, pipeline parallelism (the drafter runs on the last
stage only), and V0's EAGLE, MTP, Medusa and MLP-speculator workers. Pure: the draft model's
architecture is resolved by `Setup.build`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from exporter.errors import InputError
from exporter.model.architectures import FULL, ModelArch, normalize_quantization

if TYPE_CHECKING:   # setup imports this module
    from exporter.model.setup import Setup

METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
# vLLM's names that mean MTP (MTP_MODEL_TYPES, "deprecated and replaced with mtp")
MTP_ALIASES = ("deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp",
               "longcat_flash_mtp", "mtp")
NGRAM_ALIASES = ("ngram", "[ngram]", "suffix")
# a draft `model` whose config is one of these is read as its MTP head (SpeculativeConfig's
# hf_config_override: deepseek_v3/v32 -> deepseek_mtp, mimo, glm4_moe, ernie4_5_moe, qwen3_next, ...)
MTP_BASE_TYPES = ("deepseek_v3", "deepseek_v32", "mimo", "glm4_moe", "ernie4_5_moe", "qwen3_next",
                  "longcat_flash")
# MTP layers that carry their own lm_head (`shared_head.head`: deepseek_mtp.py, glm4_moe_mtp.py)
SHARED_HEAD_MTP_TYPES = ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm_moe_dsa")
# the draft vocabulary of the EAGLE-3 heads published for Llama 3.x / Qwen3 (their config.json's
# draft_vocab_size), when the head's own config is not readable
EAGLE3_DRAFT_VOCAB = 32000
DRAFT_MODEL_FROM = (0, 15, 0)     # v1/spec_decode/draft_model.py first ships in the 0.15.0 wheel
# vLLM 0.8-0.10 ran a separate draft model on the V0 engine (V1 did not support it and fell back;
# V0 was removed in 0.11, so 0.11-0.14 refuse it)
V0_REMOVED = (0, 11, 0)
# V0's SpecDecodeWorker sized the pool by profiling the target alone, then split the target's
# blocks between the two caches by page size (`split_num_cache_blocks_evenly`); from 0.6.5 that
# profile (`memory_profiling`) counts the target's weights only, so the draft model's do not come
# out of the pool (vllm PRs #13221 and #14067 to count them were closed unmerged); before, the free
# memory the worker lost since it started counted them (setup.V0_MEMORY_PROFILING). Read in the
# 0.7.3 wheel.


@dataclass(frozen=True)
class Speculative:
    """A parsed `--speculative-config`: the method, the tokens drafted per step, and the draft
    architecture where it has its own (`draft`: an EAGLE head's or a draft model's config.json,
    None when the head is derived from the target's dimensions)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft: ModelArch | None = None
    draft_vocab_size: int | None = None      # EAGLE-3: the head's lm_head rows
    draft_quantization: str | None = None
    draft_tp: int | None = None              # draft_tensor_parallel_size, as given
    notes: tuple[str, ...] = ()


def parse_flag(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """`--speculative-config` as vLLM takes it: a JSON object (its keys: method, model,
    num_speculative_tokens, draft_tensor_parallel_size, quantization, ...), read by
    `vllm_args.json_object` as every JSON flag is."""
    if isinstance(text, Mapping):
        return dict(text)
    # imported here: exporter.discovery's package imports the config, which imports the model
    from exporter.discovery.vllm_args import json_object
    try:
        return json_object(text)
    except ValueError as exc:
        raise InputError(f"--speculative-config: a JSON object expected ({exc}); e.g. '{{\"method\": \"eagle3\", \"model\": "
                         f"\"<head>\", \"num_speculative_tokens\": 3}}'") from None


def method_of(cfg: Mapping[str, Any], draft: ModelArch | None = None) -> str:
    """vLLM's detection (config/speculative.py `__post_init__`): a method given wins (MTP's
    model-type names become mtp, ngram's spellings ngram); else by the draft model's name
    ("eagle-" -> eagle, "eagle3" -> eagle3), an MTP model type, or a separate draft model."""
    method = str(cfg.get("method") or "").strip().lower() or None
    model = cfg.get("model")
    if method in MTP_ALIASES:
        return "mtp"
    if method in NGRAM_ALIASES or (method is None and str(model or "").lower() in NGRAM_ALIASES):
        return "ngram"
    if method in ("eagle", "eagle3", "draft_model"):
        return method
    if method is not None:
        raise InputError(f"--speculative-config: method {method!r} is not modelled; one of "
                         f"{', '.join(METHODS)} (and vLLM's MTP names: {', '.join(MTP_ALIASES[:-1])})")
    if model is None:
        raise InputError("--speculative-config: num_speculative_tokens was provided but without a "
                         "speculative model or method (vLLM refuses this too)")
    name = str(model).lower()
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    if draft is not None and draft.model_type in MTP_BASE_TYPES:
        return "mtp"
    return "draft_model"


def from_flag(flag: str | Mapping[str, Any],
              resolve: Callable[[str], ModelArch | None] | None = None) -> Speculative:
    """A `--speculative-config` read (`validate` checks it against the target).
    `resolve(name)` gives the draft's architecture where one is known (calc passes the model
    resolver: a local config.json, the HF cache, the Hub, the catalog); an EAGLE head's is taken
    only from its own config.json, never from a catalog model of a similar name."""
    cfg = parse_flag(flag)
    try:
        k = int(cfg.get("num_speculative_tokens") or 0)
        draft_tp = int(cfg["draft_tensor_parallel_size"]) if cfg.get("draft_tensor_parallel_size") else None
    except (TypeError, ValueError):
        raise InputError("--speculative-config: num_speculative_tokens and draft_tensor_parallel_size "
                         "must be integers") from None
    model = cfg.get("model")
    model = str(model) if model is not None else None
    notes: list[str] = []
    draft: ModelArch | None = None
    method = method_of(cfg)
    head_cfg: Mapping[str, Any] = {}
    if method == "draft_model" and model and resolve is not None:
        draft = resolve(model)
        method = method_of(cfg, draft)     # a checkpoint with MTP layers: its MTP head
        if method == "mtp":
            draft = None
    elif method in ("eagle", "eagle3") and model:
        draft, head_cfg = _own_config(model)
    vocab = None
    if method == "eagle3":
        vocab = int(cfg.get("draft_vocab_size") or head_cfg.get("draft_vocab_size") or 0) or None
        if draft is not None:
            vocab = vocab or draft.vocab_size    # vLLM: the base vocabulary when the head names none
        if vocab is None:
            notes.append(f"EAGLE-3 head {model or ''} read as one layer of the target's width with its "
                         f"own {EAGLE3_DRAFT_VOCAB:,}-token lm_head (the published heads' draft_vocab_size); "
                         "give its config.json path as model for its own")
    elif method == "eagle" and draft is None:
        notes.append(f"EAGLE head {model or ''} read as one layer of the target's width sharing its "
                     "embedding and lm_head; give its config.json path as model for its own")
    quant = normalize_quantization(cfg.get("quantization")) or (draft.quantization if draft is not None else None)
    return Speculative(method=method, num_speculative_tokens=k, model=model, draft=draft,
                       draft_vocab_size=vocab, draft_quantization=quant, draft_tp=draft_tp,
                       notes=tuple(notes))


def _own_config(name: str) -> tuple[ModelArch | None, Mapping[str, Any]]:
    """An EAGLE head's own config.json (its architecture and its raw keys), when `name` is a
    local directory or file holding one."""
    from pathlib import Path

    from exporter.model.architectures import arch_from_config, read_config_json

    path = Path(name).expanduser()
    if not (path / "config.json" if path.is_dir() else path).is_file():
        return None, {}
    raw, path = read_config_json(path)
    return arch_from_config(raw, name=str(raw.get("_name_or_path") or path.parent.name), where=str(path)), raw


def runs_on_v0(spec: Speculative | None, version: tuple[int, int, int]) -> bool:
    """A separate draft model on vLLM 0.8-0.10: the V1 engine fell back to V0 for it."""
    return spec is not None and spec.method == "draft_model" and version < V0_REMOVED


def validate(spec: Speculative, target: ModelArch, *, tp: int, pp: int, v0: bool,
             version: tuple[int, int, int]) -> None:
    """What vLLM refuses at startup, as an InputError naming the key."""
    if spec.num_speculative_tokens < 1:
        raise InputError(f"--speculative-config: num_speculative_tokens must be >= 1 "
                         f"(got {spec.num_speculative_tokens})")
    if spec.method == "ngram":
        return
    if v0 and spec.method != "draft_model":
        raise InputError(f"--speculative-config: a {spec.method} drafter on vLLM's V0 engine (its own "
                         f"proposer worker) is not modelled; a separate draft model and ngram are")
    if pp > 1:
        raise InputError("--speculative-config with pipeline parallelism is not modelled (the drafter "
                         "runs on the last stage only)")
    if spec.method == "mtp" and target.mtp_layers < 1:
        raise InputError(f"--speculative-config: method mtp needs the checkpoint's own MTP layers, and "
                         f"{target.name}'s config has no num_nextn_predict_layers")
    if spec.method in ("eagle", "eagle3") and spec.draft is None and target.attention == "mla":
        raise InputError(f"--speculative-config: an EAGLE head for {target.name} (MLA attention) is not "
                         "derived from the target's dimensions; give the head's config.json as `model` "
                         "(a local path) or use method mtp")
    if spec.method == "draft_model":
        if V0_REMOVED <= version < DRAFT_MODEL_FROM:
            raise InputError(f"--speculative-config: a separate draft model is not supported by vLLM "
                             f"{'.'.join(map(str, version))} (\"Speculative decoding with draft model is "
                             f"not supported yet\": V0 is gone from 0.11 and V1 runs it from 0.15.0)")
        if spec.draft is None:
            raise InputError(f"--speculative-config: draft model {spec.model!r} could not be resolved")
        if spec.draft_tp not in (None, tp):
            raise InputError(f"--speculative-config: draft_tensor_parallel_size {spec.draft_tp} != "
                             f"tensor_parallel_size {tp} ({'a smaller draft TP on V0 is not modelled' if v0 else 'vLLM 0.15 refuses a draft model at another TP'})")
        if spec.draft.vocab_size != target.vocab_size:
            raise InputError(f"--speculative-config: draft model {spec.model!r} has a vocabulary of "
                             f"{spec.draft.vocab_size}, the target {target.vocab_size} (vLLM requires them equal)")


def _layers_only(arch: ModelArch, n: int, *, moe: bool) -> ModelArch:
    """`n` decoder layers of `arch`'s shape (full attention; MoE when `moe`) and nothing beside
    them: no embedding, lm_head, rotary cache, tower or checkpoint byte count."""
    return replace(arch, num_layers=n, layer_types=(FULL,) * n if arch.layer_types else (),
                   moe_layers=tuple(range(n)) if moe else (), mlp_widths=(), mixer_only_layers=(),
                   kv_shared_layers=0, parallel_mixers=False, state=None, vocab_size=0,
                   tie_word_embeddings=True, rope_cache_elements=0, rotary_dim=0, extra_params=0,
                   vision=None, ple_width=0, ple_vocab=0, altup_inputs=0, laurel_rank=0,
                   weights=None, mtp_layers=0,
                   **({} if moe else dict(num_experts=0, experts_per_token=0)))


def _head_arch(setup: "Setup") -> ModelArch:
    """The EAGLE head's decoder layers: the head's own config, or one Llama layer of the target's
    width (dense: the target's intermediate_size)."""
    spec = setup.speculative
    if spec.draft is not None:
        return _layers_only(spec.draft, spec.draft.num_layers, moe=False)
    return _layers_only(setup.model, 1, moe=False)


def _draft_setup(setup: "Setup") -> "Setup":
    """The target's deployment with the draft model in its place (its own weight scheme, one
    pipeline stage, no drafter of its own)."""
    spec = setup.speculative
    return replace(setup, model=spec.draft, quantization=spec.draft_quantization, speculative=None, pp=1)


def weight_bytes(setup: "Setup") -> float:
    """Bytes the drafter adds to one rank's weights (0 without one, and for ngram)."""
    from exporter.model import kv_cache   # kv_cache imports setup, which imports this module
    from exporter.model.setup import V0_MEMORY_PROFILING

    spec = setup.speculative
    if spec is None or spec.method == "ngram":
        return 0.0
    m, tp, native = setup.model, setup.tp, setup.dtype_bytes
    h = m.hidden_size
    if spec.method == "draft_model":
        if setup.v0 and setup.vllm_version >= V0_MEMORY_PROFILING:
            return 0.0      # on the GPU all the same, but not in what V0's profile subtracts
        return kv_cache.weights_bytes(_draft_setup(setup))
    if spec.method == "mtp":
        layers = _layers_only(m, m.mtp_layers, moe=m.is_moe)
        body = kv_cache.weights_bytes(replace(setup, model=layers, speculative=None))
        # per MTP layer the projection of [embedding, hidden] (eh_proj / input_proj: nn.Linear,
        # whole on every rank; Qwen3-Next's fc is column-parallel), and in the DeepSeek layout its
        # own shared_head lm_head (ParallelLMHead, split); MiMo's and Qwen3-Next's model-level
        # lm_head is replaced by the target's in EagleProposer.load_model, so it is freed
        proj = 2 * h * h / (tp if m.model_type in ("qwen3_next",) else 1)
        head = kv_cache.padded_vocab(m.vocab_size, tp) * h / tp if m.model_type in SHARED_HEAD_MTP_TYPES else 0.0
        return body + m.mtp_layers * (proj + head) * native
    head = _head_arch(setup)
    body = kv_cache.weights_bytes(replace(setup, model=head, speculative=None, quantization=None))
    if spec.method == "eagle3":
        # qkv_proj reads 2 x hidden: the q, k, v rows of the input doubled, split over TP
        qkv = head.hidden_size * (head.num_heads + 2 * head.num_kv_heads) * head.head_dim
        body += head.num_layers * qkv * native / tp
        fc = 3 * head.hidden_size * head.hidden_size
        vocab = spec.draft_vocab_size or EAGLE3_DRAFT_VOCAB
        lm_head = 0.0 if vocab == m.vocab_size and head.hidden_size == h else \
            kv_cache.padded_vocab(vocab, tp) * head.hidden_size / tp
        return body + (fc + lm_head) * native
    return body + 2 * head.hidden_size * head.hidden_size * native


def kv_token_bytes(setup: "Setup") -> int:
    """KV bytes one token takes in the drafter's layers on one rank (their pages sit in every
    block beside the target's)."""
    from exporter.model import kv_cache

    spec = setup.speculative
    if spec is None or spec.method == "ngram":
        return 0
    if spec.method == "draft_model":
        return kv_cache.bytes_per_token(_draft_setup(setup))
    if spec.method == "mtp":
        return setup.model.mtp_layers * kv_cache.token_bytes_per_layer(replace(setup, speculative=None))
    head = _head_arch(setup)
    return head.num_layers * kv_cache.token_bytes_per_layer(replace(setup, model=head, speculative=None))


def same_page_as_target(setup: "Setup") -> bool:
    """The drafter's layers are full-attention layers of the target's page: they join the
    target's full-attention group (what a hybrid target needs to be modelled)."""
    from exporter.model import kv_cache

    layers = draft_layers(setup)
    if not layers or setup.speculative.method == "draft_model":
        return False
    return kv_token_bytes(setup) == layers * kv_cache.token_bytes_per_layer(replace(setup, speculative=None))


def draft_layers(setup: "Setup") -> int:
    """Attention layers the drafter adds to the KV pool."""
    spec = setup.speculative
    if spec is None or spec.method == "ngram":
        return 0
    if spec.method == "mtp":
        return setup.model.mtp_layers
    if spec.method == "draft_model":
        return spec.draft.attention_layers
    return _head_arch(setup).num_layers
