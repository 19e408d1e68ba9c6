"""The vision encoder's share of vLLM's startup profile run, for multimodal models.

Why: before sizing the KV cache, vLLM's V1 worker (`GPUModelRunner.profile_run`) encodes a batch
of the largest dummy image (or video) the model accepts, keeps the encoder's outputs, and only then
runs the language model's dummy forward and sampler. Torch's peak over that run is what the pool
loses to "activation", so a tower that is small in weights can still take gigabytes: one dummy
Qwen2.5-VL image is 65,536 ViT patches, and from vLLM 0.11 a Qwen2.5-VL server at its default
max_model_len profiles a 14-frame video of 458,752 patches (about 15 GiB; an A100 at
gpu_memory_utilization 0.22 refused to start on it, vLLM 0.23).

What is modelled, read from vLLM's wheels 0.8.5-0.34 (`v1/worker/gpu_model_runner.py`
`profile_run`, `v1/worker/utils.py` / `multimodal/encoder_budget.py` `MultiModalBudget`,
`v1/core/encoder_cache_manager.py` `compute_encoder_budget`, each family's processing info):

- one modality is profiled, the one with the most placeholder tokens per item (T); the encoder
  budget is B = max(max_num_batched_tokens, T) (both encoder settings default to the batch size);
- items per batch: ceil(B / T) before 0.10.1, floor(B / T) from it (at least 1), capped by
  max_num_seqs x the per-prompt limit (`--limit-mm-per-prompt`, 999 by default under V1);
- T counts the placeholder span's break and start/end tokens from 0.10.1 until 0.13.0 (embeddings
  only before and after), and Gemma 3's in every release, as its public logs' item counts say;
- the peak is max(encoder forward, kept outputs + the language model's dummy run), not a sum:
  the encoder's activations are freed when it returns, its outputs stay in the encoder cache;
  0.11.x pads each kept output to the encoder budget, 0.12.x to T;
- the encoder forward's peak per patch: the float32 pixels and their model-dtype copy, and the
  MLP of one block (residual, norm, the intermediate activations, split over TP ranks as
  vLLM's column-parallel fc1 splits them). Checked against public startups: a Qwen2.5-VL-7B on
  an L4 at 0.9.0 (33,824 tokens logged) and the refused A100 at 0.23 (-14.28 GiB logged) both put
  the encoder at 35 KB per patch, where this count gives 35.3;
- Pixtral's vision tower (Mistral 3.x) without xformers builds a dense patches x patches mask
  over the batch (`generate_block_attention_mask`), the default from 0.13.0 (xformers no longer
  installed) until model runner V2's encoder attention replaced it (read absent in 0.34; the
  releases between 0.26 and 0.33 were not read);
- Qwen2/2.5-VL's dummy video is sized to max_model_len from 0.11.0 (frames in pairs of one
  image's tokens, at most 14 frames); before, it was built one frame long;
- Qwen3-VL's dummy video holds its video processor's pixel budget over all frames (12,288
  embeddings at the default 25,165,824), but in 0.11.x-0.12.x vLLM counted it as 12.5 tokens per
  embedding (the timestamp text around each), so it won the budget at 153,600 tokens; from 0.13.0
  the image wins. Its outputs carry the deepstack features beside the embeddings (1 + the
  deepstack levels times the width). A public Qwen3-VL-30B-A3B startup on 4 x RTX 3090 at 0.11.0
  logged the 153,600-token budget and "1 video items".

Not modelled: the V0 engine's profile (every modality's dummy inside one forward), tiled
families other than Llama 4 (LLaVA-NeXT, InternVL, Idefics), and --mm-encoder-tp-mode data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from exporter.model.setup import Setup

Version = tuple[int, int, int]

# items per batch by floor division from 0.10.1 (MultiModalBudget.get_max_items); ceil before
MM_ITEMS_FLOOR: Version = (0, 10, 1)
# T counts the placeholder span (break/start/end tokens) in [0.10.1, 0.13.0): get_mm_max_contiguous_tokens
MM_CONTIGUOUS_TOKENS: tuple[Version, Version] = ((0, 10, 1), (0, 13, 0))
# kept dummy outputs padded to the encoder budget in 0.11.x, to T in 0.12.x (gpu_model_runner.py)
MM_OUTPUTS_PADDED_TO_BUDGET: tuple[Version, Version] = ((0, 11, 0), (0, 12, 0))
MM_OUTPUTS_PADDED_TO_ITEM: tuple[Version, Version] = ((0, 12, 0), (0, 13, 0))
# Qwen2/2.5-VL's dummy video sized to max_model_len (seq_len of the dummy data) from 0.11.0
MM_VIDEO_AT_MAX_MODEL_LEN: Version = (0, 11, 0)
QWEN_MAX_FRAMES = 14            # qwen2_vl.py _MAX_FRAMES_PER_VIDEO from 0.11.0 (16 before, unused then)
# Qwen3-VL's video counted at 12.5 tokens per embedding in 0.11.x-0.12.x (qwen3_vl.py
# get_max_video_tokens: "<{timestamp} seconds>" + start + pad + end per video token)
QWEN3_VIDEO_FORMATTED: tuple[Version, Version] = ((0, 11, 0), (0, 13, 0))
QWEN3_VIDEO_TOKEN_FACTOR = 12.5
QWEN3_VIDEO_MAX_PIXELS = 25165824   # video_preprocessor_config.json size.longest_edge: t x h x w
# --skip-mm-profiling exists from 0.10.1
SKIP_MM_PROFILING_FROM: Version = (0, 10, 1)
# Pixtral's dense block mask when xformers is absent: the default from 0.13.0 (not installed any more)
PIXTRAL_DENSE_MASK: tuple[Version, Version] = ((0, 13, 0), (0, 26, 0))
DEFAULT_MM_LIMIT = 999          # MultiModalConfig.get_limit_per_prompt under V1

# the HF image processors' pixel budgets per image (preprocessor_config.json max_pixels /
# size.longest_edge): Qwen2-VL and Qwen2.5-VL 12,845,056 (16,384 x 28^2), Qwen3-VL 16,777,216
# (16,384 x 32^2)
QWEN_DEFAULT_MAX_PIXELS = {"qwen2_vl": 12845056, "qwen2_5_vl": 12845056,
                           "qwen3_vl": 16777216, "qwen3_vl_moe": 16777216}
PIXEL_BYTES = 4                 # the processors hand vLLM float32 pixels; the tower casts a copy


@dataclass(frozen=True)
class VisionTower:
    """The geometry of a multimodal model's vision encoder that its profile run depends on."""

    family: str              # the outer config's model_type (qwen2_5_vl, gemma3, mistral3, ...)
    hidden: int              # ViT width
    intermediate: int        # ViT MLP width
    gated: bool              # gate/up/down MLP (SiLU) rather than fc1/fc2
    patch_pixels: int        # input elements per patch: channels x temporal patch x patch^2
    item_patches: int        # ViT tokens of the largest dummy image (all tiles)
    item_embeds: int         # language-model embeddings it yields
    item_breaks: int = 0     # placeholder tokens beside the embeddings (row breaks, start/end)
    patch_size: int = 0      # Qwen-VL: patch and merge sizes, to resize by max_pixels
    merge: int = 1
    # the placeholder's break tokens count toward T in every release, not only 0.10.1-0.12 (Gemma
    # 3: 31 items at an 8,192 budget on 0.11.0rc2 and 7 at 2,048 on a 2026 build, public logs)
    breaks_always: bool = False
    # how the dummy video is sized, where the model takes video: "frames" (Qwen2/2.5-VL: pairs of
    # frames of the largest image, up to max_model_len from 0.11), "pixel_budget" (Qwen3-VL: the
    # video processor's pixels over all frames, counted at 12.5 tokens an embedding in 0.11-0.12)
    video: str = ""
    dense_mask: bool = False  # Pixtral: a dense patches^2 mask without xformers
    temporal: int = 1        # Qwen-VL: frames per patch
    out_widths: int = 1      # outputs per embedding (Qwen3-VL: the embedding and its deepstack levels)

    def qwen_item(self, max_pixels: int | None) -> tuple[int, int]:
        """(ViT patches, embeddings) of the largest image under `max_pixels` (Qwen-VL families)."""
        unit = self.patch_size * self.merge
        embeds = max(1, int(max_pixels or QWEN_DEFAULT_MAX_PIXELS[self.family]) // (unit * unit))
        return embeds * self.merge * self.merge, embeds


def _int(d: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = d.get(k)
        if v is not None:
            return int(v)
    return default


def vision_tower(outer: Mapping[str, Any]) -> VisionTower | None:
    """The vision tower of a config.json whose model_type vLLM profiles as modelled here, or None.
    Reads the config's own fields; the processor defaults (pixel budgets, tiles) are the
    families' HF preprocessor configs as vLLM's processing info reads them."""
    family = str(outer.get("model_type") or "")
    vc = outer.get("vision_config")
    if not isinstance(vc, Mapping):
        return None
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        # Qwen2-VL names the ViT width embed_dim (its hidden_size is the merger's output) and
        # sizes the MLP by mlp_ratio
        hidden = _int(vc, "embed_dim", "hidden_size") if family == "qwen2_vl" else _int(vc, "hidden_size")
        inter = _int(vc, "intermediate_size") or int(hidden * float(vc.get("mlp_ratio") or 4))
        patch = _int(vc, "patch_size", default=16 if family.startswith("qwen3") else 14)
        merge = _int(vc, "spatial_merge_size", default=2)
        temporal = _int(vc, "temporal_patch_size", default=2)
        channels = _int(vc, "in_channels", "in_chans", "num_channels", default=3)
        deepstack = vc.get("deepstack_visual_indexes") or ()
        tower = VisionTower(family, hidden, inter, gated=family == "qwen2_5_vl",
                            patch_pixels=channels * temporal * patch * patch, item_patches=0, item_embeds=0,
                            patch_size=patch, merge=merge, temporal=temporal,
                            video="pixel_budget" if family.startswith("qwen3") else "frames",
                            out_widths=1 + (len(deepstack) if isinstance(deepstack, (list, tuple)) else 0))
        patches, embeds = tower.qwen_item(None)
        return replace(tower, item_patches=patches, item_embeds=embeds)
    hidden, inter = _int(vc, "hidden_size"), _int(vc, "intermediate_size")
    image, patch = _int(vc, "image_size"), _int(vc, "patch_size", default=14)
    if not (hidden and inter and image and patch):
        return None
    side = image // patch
    pixels = _int(vc, "num_channels", default=3) * patch * patch
    if family == "gemma3":
        # SigLIP at 896 px, pan-and-scan off by default: 4,096 patches pooled to mm_tokens_per_image;
        # the placeholder span adds "\n\n<start_of_image>" and "<end_of_image>\n\n"
        return VisionTower(family, hidden, inter, gated=False, patch_pixels=pixels, item_patches=side * side,
                           item_embeds=_int(outer, "mm_tokens_per_image", default=256), item_breaks=4,
                           breaks_always=True)
    if family == "mistral3":
        # Pixtral at 1540 px: 110 x 110 patches merged 2 x 2, a break token ending each row
        merge = _int(outer, "spatial_merge_size", default=2)
        rows = side // merge
        return VisionTower(family, hidden, inter, gated=True, patch_pixels=pixels,
                           item_patches=side * side, item_embeds=rows * rows, item_breaks=rows,
                           merge=merge, dense_mask=True)
    if family == "llama4":
        # 16 tiles of 336 px and a global one (the processor's max_patches), a CLS token per tile,
        # pixel shuffle at pixel_shuffle_ratio (0.5: 576 -> 144 embeddings per tile)
        tiles = 17
        ratio = float(vc.get("pixel_shuffle_ratio") or 0.5)
        return VisionTower(family, hidden, inter, gated=False, patch_pixels=pixels,
                           item_patches=tiles * (side * side + 1),
                           item_embeds=tiles * int(side * side * ratio * ratio))
    if family == "llava":
        # one CLIP crop: its patches and a CLS token; every patch feature becomes an embedding
        return VisionTower(family, hidden, inter, gated=False, patch_pixels=pixels,
                           item_patches=side * side + 1, item_embeds=side * side)
    return None


@dataclass(frozen=True)
class EncoderProfile:
    """What the profile run encodes and what that costs on one GPU."""

    modality: str            # "image" or "video"
    items: int               # dummy items encoded in one batch
    item_tokens: int         # placeholder tokens per item (T, as the release counts them)
    patches: int             # ViT tokens of the whole batch
    forward_bytes: float     # peak of the encoder forward (pixels, one block's MLP, a dense mask)
    kept_bytes: float        # encoder outputs kept through the language model's dummy run

    def describe(self) -> str:
        return (f"{self.items} dummy {self.modality} item(s) of {self.item_tokens:,} tokens "
                f"({self.patches:,} ViT patches): encoder peak {self.forward_bytes / 2**30:.2f} GiB")


def _limit(setup: "Setup", modality: str) -> int:
    return dict(setup.mm_limits).get(modality, DEFAULT_MM_LIMIT)


def encoder_profile(setup: "Setup") -> EncoderProfile | None:
    """The vision encoder's part of `setup`'s profile run, or None where vLLM profiles none (a
    text-only model, the V0 engine [not modelled], every modality limited to 0,
    --skip-mm-profiling)."""
    tower = setup.model.vision
    if tower is None or setup.v0:
        return None
    v = setup.vllm_version
    if setup.skip_mm_profiling and v >= SKIP_MM_PROFILING_FROM:
        return None
    b = setup.dtype_bytes
    contiguous = MM_CONTIGUOUS_TOKENS[0] <= v < MM_CONTIGUOUS_TOKENS[1]
    patches, embeds = tower.item_patches, tower.item_embeds
    if tower.patch_size:
        patches, embeds = tower.qwen_item(setup.mm_max_pixels)
    candidates: list[tuple[int, str, int, int]] = []    # (T, modality, patches, embeds)
    if _limit(setup, "image") > 0:
        breaks = tower.item_breaks if contiguous or tower.breaks_always else 0
        candidates.append((embeds + breaks, "image", patches, embeds))
    if tower.video == "frames" and _limit(setup, "video") > 0:
        pairs = 1
        if v >= MM_VIDEO_AT_MAX_MODEL_LEN:
            pairs = max(1, min(QWEN_MAX_FRAMES // 2, setup.max_model_len // embeds))
        candidates.append((pairs * embeds, "video", pairs * patches, pairs * embeds))
    if (tower.video == "pixel_budget" and _limit(setup, "video") > 0
            and QWEN3_VIDEO_FORMATTED[0] <= v < QWEN3_VIDEO_FORMATTED[1]):
        unit = tower.patch_size * tower.merge
        video_embeds = QWEN3_VIDEO_MAX_PIXELS // (unit * unit * tower.temporal)
        candidates.append((int(video_embeds * QWEN3_VIDEO_TOKEN_FACTOR), "video",
                           video_embeds * tower.merge * tower.merge, video_embeds))
    if not candidates:
        return None
    # the modality with the most tokens per item; an image wins a tie (the same patches either way)
    t, modality, item_patches, item_embeds = max(candidates, key=lambda c: (c[0], c[1] == "image"))
    budget = max(setup.max_num_batched_tokens, t)
    limit = _limit(setup, modality)
    if v >= MM_ITEMS_FLOOR:
        per_prompt = max(1, min(limit, setup.max_model_len // t))
        reqs = setup.max_num_seqs if setup.enable_chunked_prefill else min(
            setup.max_num_seqs, setup.max_num_batched_tokens // t)
        items = max(1, min(budget // t, reqs * per_prompt))
    else:
        items = max(1, min(math.ceil(budget / t), setup.max_num_seqs * limit))
    s = items * item_patches
    # one block's MLP at its peak: residual and normed input, the intermediate (split over TP
    # ranks: fc1 / gate_up are column-parallel) and its activation (and the gate's, when gated)
    mlp = 3 * tower.hidden + (3 if tower.gated else 2) * tower.intermediate / setup.tp
    forward = s * (tower.patch_pixels * (PIXEL_BYTES + b) + mlp * b)
    if tower.dense_mask and PIXTRAL_DENSE_MASK[0] <= v < PIXTRAL_DENSE_MASK[1]:
        forward += s * s * b
    kept_rows = item_embeds
    if MM_OUTPUTS_PADDED_TO_BUDGET[0] <= v < MM_OUTPUTS_PADDED_TO_BUDGET[1]:
        kept_rows = max(item_embeds, budget)
    elif MM_OUTPUTS_PADDED_TO_ITEM[0] <= v < MM_OUTPUTS_PADDED_TO_ITEM[1]:
        kept_rows = max(item_embeds, t)
    kept = items * kept_rows * setup.model.hidden_size * tower.out_widths * b
    return EncoderProfile(modality, items, t, s, forward, kept)
