"""Train qwen3-tiny-vl: a small Qwen3-VL that says what it sees (the VL twin of qwen3-tiny-poem).

The model is transformers' own ``Qwen3VLForConditionalGeneration`` (a 6-block vision tower with
DeepStack taps, the poem model's 4-layer text tower as the starting point, the real 151,936-row
vocabulary), trained on CPU with torch on the synthetic pictures of ``kestrel_lab.vision.synthetic``
to answer 「图里有什么？」 with one exact sentence such as 「左上角有一个红色的圆。」. Pixels go through
transformers' ``Qwen2VLImageProcessorPil`` with Qwen3-VL's settings; ``input_ids`` and
``mm_token_type_ids`` are built by hand in Qwen3-VL-Instruct's chat template (no system message, no
think block), because ``AutoProcessor`` needs torchvision, which does not install beside the pinned
torch.

Why the loss is cheap although the vocabulary is real: only the K token rows the task uses are
trained (the others are zero, as in the poem model, and stay zero), so the full-vocabulary softmax's
normaliser is ``logsumexp([h·E_used, log(V − K)])`` — exactly the cross-entropy transformers computes
over all 151,936 logits (the script checks this on one batch against ``model(labels=…).loss`` and writes
both into training.json).

Writes into ``--out`` (default data/models/qwen3-tiny-vl): config.json, generation_config.json and
model.safetensors (bf16, written by ``save_pretrained``), training.json (loss curve, seconds,
versions, the check above), training.log, heldout.json (greedy ``generate`` on every held-out item of
the bf16 checkpoint loaded back in float32) and greedy.json (ten held-out items: prompt ids, greedy
ids and text, for the engine to reproduce).

    nice -n 10 python scripts/train_tiny_vl.py --out STAGE1 --no-eval    # stage 1: 1,200 steps
    nice -n 10 python scripts/train_tiny_vl.py --init-from STAGE1        # stage 2: 700 steps, evaluation
                                                                         # (the two are `make tiny-vl`)
    python scripts/train_tiny_vl.py --quick --out /tmp/x  # one-minute smoke run

``--init-from DIR --first-seed N`` starts a further stage from a checkpoint this script wrote (a fresh
optimiser, new seeds); README and training.json then describe both stages.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

from kestrel_lab import training_record  # noqa: E402
from kestrel_lab.atomic import atomic_write, write_json  # noqa: E402
from kestrel_lab.paths import tiny_poem_dir  # noqa: E402
from kestrel_lab.vision import synthetic  # noqa: E402
from kestrel_lab.vocab.tokenizer import Tokenizer  # noqa: E402

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643
VISION_START, VISION_END, IMAGE_PAD = 151652, 151653, 151655
VOCAB = 151936
MIN_PIXELS, MAX_PIXELS = 65536, 16777216   # Qwen3-VL's preprocessor_config "size"
PATCH, TEMPORAL, MERGE = 16, 2, 2
N_IMAGE_TOKENS = (synthetic.SIZE // PATCH // MERGE) ** 2   # 8 × 8 = 64
STAGE1_STEPS, STAGE2_STEPS = 1200, 700   # make tiny-vl: stage 1, then a stage 2 on fresh seeds


def build_config(width: int, depth: int, heads: int, deepstack: list[int]) -> dict:
    """config.json fields (transformers 5 style) of the tiny VL model."""
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": IMAGE_PAD,
        "video_token_id": 151656,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": ENDOFTEXT,
            "eos_token_id": IM_END,
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 256,
            "initializer_range": 0.02,
            "intermediate_size": 768,
            "max_position_embeddings": 1024,
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            # Qwen3-VL's theta and interleaved MRoPE, the [24, 20, 20] split scaled to head_dim/2 = 32
            "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default",
                                "mrope_section": [12, 10, 10], "mrope_interleaved": True},
            "tie_word_embeddings": True,
            "use_cache": True,
            "vocab_size": VOCAB,
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision",
            "depth": depth,
            "hidden_size": width,
            "intermediate_size": 4 * width,
            "num_heads": heads,
            "in_channels": 3,
            "patch_size": PATCH,
            "temporal_patch_size": TEMPORAL,
            "spatial_merge_size": MERGE,
            "out_hidden_size": 256,
            # a 48 × 48 table like Qwen3-VL's, bilinearly resampled to each grid (16 × 16 here), so
            # the interpolation is exercised rather than the identity a 16 × 16 table would give
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": deepstack,
            "hidden_act": "gelu_pytorch_tanh",
            "initializer_range": 0.02,
        },
    }


# ----------------------------------------------------------------------------- data
class Prompts:
    """Token ids of the chat (built by hand, Qwen3-VL-Instruct's template) and the used rows."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.prompt = self.prompt_for(N_IMAGE_TOKENS)   # the 256×256 pictures of synthetic.sample
        self.answers = {}
        for c in synthetic.COLOURS:
            for s in synthetic.SHAPES:
                for p in synthetic.POSITIONS:
                    a = synthetic.answer_for(c, s, p)
                    self.answers[a] = tok.encode(a, allow_special=False) + [IM_END]
        self.max_len = len(self.prompt) + max(map(len, self.answers.values()))
        used = set(self.prompt) | {t for ids in self.answers.values() for t in ids}
        used.discard(IMAGE_PAD)   # overwritten by the merger output: its row is never read
        self.used = sorted(used)

    def prompt_for(self, n_pads: int) -> list[int]:
        """The prompt of a picture that becomes ``n_pads`` LLM tokens (grid t·h·w / merge²)."""
        text = ("<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * n_pads
                + f"<|vision_end|>{synthetic.QUESTION}<|im_end|>\n<|im_start|>assistant\n")
        ids = self.tok.encode(text)
        assert ids.count(IMAGE_PAD) == n_pads and ids[0] == IM_START
        return ids


def n_pads(grid_row) -> int:
    """LLM tokens of one picture: its (t, h, w) patch grid over the 2×2 merge."""
    t, h, w = (int(v) for v in grid_row)
    return t * h * w // (MERGE * MERGE)


class Batcher:
    """Pictures → pixel_values / image_grid_thw (transformers' PIL processor) and token batches."""

    def __init__(self, prompts: Prompts, drawer: str = "default", default_every: int = 0, small_share: float = 0.0,
                 outline_share: float = synthetic.WIDE_OUTLINE_SHARE):
        self.p = prompts
        self.drawer = drawer
        self.default_every = default_every   # wide drawer: every N-th seed from the default drawer (0: none)
        self.small_share = small_share       # wide drawer: share of shapes drawn under WIDE_SMALL_WIDTH
        self.outline_share = outline_share   # wide drawer: share of outlines instead of fills
        self.proc = Qwen2VLImageProcessorPil(
            size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, patch_size=PATCH,
            temporal_patch_size=TEMPORAL, merge_size=MERGE, image_mean=[0.5] * 3, image_std=[0.5] * 3)

    def pixels(self, images):
        out = self.proc(images=images, return_tensors="pt")
        return out["pixel_values"].float(), out["image_grid_thw"]

    def draw(self, seed: int):
        """(picture, answer) of a training seed from this batcher's drawer."""
        if self.drawer == "wide" and not (self.default_every and seed % self.default_every == 0):
            smp = synthetic.sample_wide(seed, self.small_share, self.outline_share)
            return smp.image, smp.answer
        return synthetic.draw(seed)

    def batch(self, seeds: list[int]) -> dict:
        return self.batch_of([self.draw(s) for s in seeds])

    def batch_of(self, pairs) -> dict:
        """A training batch of (picture, answer) pairs; right-padded to the longest sequence (at least
        the 256×256 length, so the default drawer's batches all have one shape)."""
        pv, grid = self.pixels([im for im, _ in pairs])
        prompts = [self.p.prompt_for(n_pads(g)) for g in grid]
        seqs = [pr + self.p.answers[a] for pr, (_, a) in zip(prompts, pairs)]
        n = max([self.p.max_len] + [len(sq) for sq in seqs])
        ids = torch.full((len(seqs), n), ENDOFTEXT, dtype=torch.long)
        labels = torch.full((len(seqs), n), -100, dtype=torch.long)
        for i, (pr, sq) in enumerate(zip(prompts, seqs)):
            ids[i, :len(sq)] = torch.tensor(sq)
            labels[i, len(pr):len(sq)] = torch.tensor(sq[len(pr):])
        # right padding after the answer: causal attention never lets a real token see it
        return {"input_ids": ids, "labels": labels, "pixel_values": pv, "image_grid_thw": grid,
                "mm_token_type_ids": (ids == IMAGE_PAD).int()}


# ----------------------------------------------------------------------------- model
class UsedRows(nn.Module):
    """The embedding during training: K trainable rows, every other id reads a zero row."""

    def __init__(self, weight: torch.Tensor, used: list[int]):
        super().__init__()
        self.rows = nn.Parameter(weight[used].clone())
        index = torch.full((weight.shape[0],), len(used), dtype=torch.long)
        index[torch.tensor(used)] = torch.arange(len(used))
        self.register_buffer("index", index, persistent=False)
        self.n_zero = weight.shape[0] - len(used)

    def forward(self, ids):
        table = torch.cat([self.rows, self.rows.new_zeros(1, self.rows.shape[1])])
        return table[self.index[ids]]


def full_vocab_ce(hidden, rows, targets, n_zero: int):
    """Mean cross-entropy over the whole vocabulary when all rows but ``rows`` are zero: the zero
    rows' logits are exactly 0, so they add ``n_zero`` to the softmax's denominator. ``targets``
    index ``rows`` (every target token is a used row)."""
    logits = hidden @ rows.T
    const = torch.full((logits.shape[0], 1), math.log(n_zero), dtype=logits.dtype, device=logits.device)
    lse = torch.logsumexp(torch.cat([logits, const], dim=1), dim=1)
    return (lse - logits.gather(1, targets[:, None])[:, 0]).mean()


def init_model(cfg: dict, prompts: Prompts, poem_dir: Path, seed: int):
    """transformers' own init (seeded) for the vision tower; the poem model's text layers, final
    norm and used embedding rows (rows it never trained: N(0, its row std²)); every other row zero."""
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**cfg)).float()
    poem = AutoModelForCausalLM.from_pretrained(poem_dir, dtype=torch.float32).state_dict()
    lm = model.model.language_model
    own = lm.state_dict()
    copied = 0
    for name, t in poem.items():
        if not name.startswith("model.") or "embed_tokens" in name:
            continue
        key = name[len("model."):]
        if key in own:
            assert own[key].shape == t.shape, (key, own[key].shape, t.shape)
            own[key].copy_(t)
            copied += 1
    emb = poem["model.embed_tokens.weight"]
    nonzero = emb.abs().sum(1) > 0
    std = float(emb[nonzero].std())
    g = torch.Generator().manual_seed(seed)
    weight = torch.zeros_like(lm.embed_tokens.weight)
    fresh = 0
    for t in prompts.used:
        if nonzero[t]:
            weight[t] = emb[t]
        else:
            weight[t] = torch.randn(emb.shape[1], generator=g) * std
            fresh += 1
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(weight)
    assert model.lm_head.weight.data_ptr() == lm.embed_tokens.weight.data_ptr(), "lm_head not tied"
    return model, {"poem_tensors_copied": copied, "used_rows": len(prompts.used),
                   "used_rows_new": fresh, "used_rows_from_poem": len(prompts.used) - fresh}


def checkpoint_evaluation(folder: Path) -> dict | None:
    """The starting checkpoint's own scores, from the independent.json beside it (scripts/eval_tiny_vl.py), so a
    later stage can say what it changed: both sets' overall scores, the independent set by size band and
    picture, and where they were computed. None when the folder has no such file."""
    path = folder / "independent.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    t = doc["independent"]["tables"]
    return {"file": _rel(path), "provenance": doc["provenance"],
            "heldout": doc["heldout"]["transformers"]["overall"], "independent": t["overall"],
            "independent_by": {k: t["by"][k] for k in ("band", "picture") if k in t["by"]}}


def init_from_checkpoint(folder: Path, prompts: Prompts):
    """A later training stage: start from a checkpoint this script wrote (same used rows)."""
    model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    emb = model.model.language_model.embed_tokens.weight
    nonzero = sorted(int(i) for i in torch.nonzero(emb.abs().sum(1)).flatten())
    if nonzero != prompts.used:
        raise SystemExit(f"{folder}/model.safetensors: embedding rows {nonzero[:8]}… are not the used rows "
                         f"{prompts.used[:8]}… of this task")
    prev = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    return model, {"from_checkpoint": _rel(folder), "used_rows": len(prompts.used),
                   "evaluation": checkpoint_evaluation(folder),
                   "previous_stage": {k: prev[k] for k in ("command", "steps", "batch", "train_images",
                                                            "first_train_seed", "last_train_seed", "train_seconds",
                                                            "train_cpu_seconds", "loss_log", "loss_first",
                                                            "loss_last", "init", "seed", "args")
                                      if k in prev}}


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()} if device != "cpu" else batch


def loss_of(model, rows_mod: UsedRows, b: dict):
    out = model.model(input_ids=b["input_ids"], pixel_values=b["pixel_values"],
                      image_grid_thw=b["image_grid_thw"], mm_token_type_ids=b["mm_token_type_ids"])
    h = out.last_hidden_state[:, :-1]
    y = b["labels"][:, 1:]
    keep = y != -100
    return full_vocab_ce(h[keep], rows_mod.rows, rows_mod.index[y[keep]], rows_mod.n_zero)


def param_counts(model) -> dict:
    vis = sum(p.numel() for p in model.model.visual.parameters())
    lm = model.model.language_model
    emb = lm.embed_tokens.weight
    text = sum(p.numel() for p in lm.parameters()) - emb.numel()
    return {"total": sum(p.numel() for p in model.parameters()), "vision": vis, "text_layers_and_norm": text,
            "embedding": emb.numel(), "embedding_nonzero_rows": int((emb.abs().sum(1) > 0).sum())}


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def greedy(model, batcher: Batcher, image, max_new: int = 24) -> list[int]:
    """transformers' greedy continuation (ids) for one picture (a seed of synthetic.sample or a PIL image)."""
    if not hasattr(image, "size"):
        image = synthetic.sample(image).image
    pv, grid = batcher.pixels([image])
    ids = torch.tensor([batcher.p.prompt_for(n_pads(grid[0]))])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pv,
                         image_grid_thw=grid, mm_token_type_ids=(ids == IMAGE_PAD).int(),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=[IM_END, ENDOFTEXT],
                         pad_token_id=ENDOFTEXT)
    return out[0, ids.shape[1]:].tolist()


def evaluate(model, batcher: Batcher, seeds: list[int], log) -> dict:
    items, t0 = [], time.time()
    for k, seed in enumerate(seeds):
        smp = synthetic.sample(seed)
        got_ids = greedy(model, batcher, seed)
        text = batcher.p.tok.decode([t for t in got_ids if t != IM_END])
        items.append({"seed": seed, "combo": list(smp.combo),
                      "unseen_combo": smp.combo in synthetic.HELDOUT_COMBOS,
                      "expected": smp.answer, "got": text, "ok": text == smp.answer and got_ids[-1:] == [IM_END],
                      "got_ids": got_ids})
        if (k + 1) % 50 == 0:
            log(f"eval {k + 1}/{len(seeds)}: {sum(i['ok'] for i in items)} right, {time.time() - t0:.0f} s")

    def acc(sel):
        sel = list(sel)
        return {"n": len(sel), "right": sum(i["ok"] for i in sel),
                "accuracy": sum(i["ok"] for i in sel) / len(sel) if sel else None}

    per_field = {}
    for f, idx in (("colour", 0), ("shape", 1), ("position", 2)):
        right = 0
        for i in items:
            try:
                right += synthetic.parse_answer(i["got"])[idx] == i["combo"][idx]
            except ValueError:
                pass
        per_field[f] = right / len(items)
    return {"overall": acc(items), "seen_combos": acc(i for i in items if not i["unseen_combo"]),
            "unseen_combos": acc(i for i in items if i["unseen_combo"]), "per_field_accuracy": per_field,
            "seconds": round(time.time() - t0, 1), "items": items}


# ----------------------------------------------------------------------------- main
def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def git_dirty(out: Path | None = None) -> bool | None:
    """Whether the checkout has uncommitted changes, not counting ``out``: the files this run writes."""
    cmd = ["git", "-C", str(REPO), "status", "--porcelain", "--", "."]
    if out is not None and out.resolve().is_relative_to(REPO):
        cmd.append(":(exclude)" + str(out.resolve().relative_to(REPO)))
    try:
        return bool(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return None


def lr_at(step: int, steps: int, lr: float, warmup: int, final: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final + 0.5 * (lr - final) * (1 + math.cos(math.pi * t))


def save_checkpoint(model, out: Path) -> None:
    """save_pretrained in bf16 into a temporary folder beside ``out``, then rename the files in."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".save-", dir=out.parent))
    try:
        model.to(torch.bfloat16).save_pretrained(tmp)
        model.float()
        for f in sorted(tmp.iterdir()):
            os.chmod(f, 0o644)   # the safetensors writer creates 0600 files
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _start_lines(tr: dict) -> list[str]:
    """README bullets on where training started (the poem model) and each stage before the last."""
    stages = training_record.stages(tr)
    first = stages[0]["init"]
    out = ["- Start: transformers' own initialisation (seeded) for the vision tower; the poem model's 4 text "
           f"layers and final norm; {first['used_rows_from_poem']} of the {first['used_rows']} used embedding "
           f"rows from the poem model, the {first['used_rows_new']} it never saw (e.g. 红色, 正方形) drawn "
           "N(0, σ²) with σ its rows' std. Everything is trained (vision tower, mergers, text layers, the used "
           "rows); nothing is frozen except the zero rows, which stay zero."]
    if len(stages) > 1:
        words = []
        for k, st in enumerate(stages[:-1], 1):
            a = st["args"]
            drawer = " on the wide drawer" if a.get("drawer") == "wide" else ""
            if a.get("small_share"):
                drawer += f" ({a['small_share'] * 100:.0f} % of the shapes under {synthetic.WIDE_SMALL_WIDTH} px)"
            if a.get("outline_share", synthetic.WIDE_OUTLINE_SHARE) != synthetic.WIDE_OUTLINE_SHARE:
                drawer += f" ({a['outline_share'] * 100:.0f} % outlines)"
            words.append(f"Stage {k}: `{st['command'].strip()}` — {st['steps']} steps of {st['batch']}{drawer} "
                         f"(seeds {st['first_train_seed']}…{st['last_train_seed']}), lr {a['lr']:g} → "
                         f"{a['final_lr']:g}, loss {st['loss_first']:.3f} → {st['loss_last']:.4f}, "
                         f"{st['train_seconds']:.0f} s wall / {st['train_cpu_seconds']:.0f} s CPU.")
        out.append(f"- {len(stages)} stages. " + " ".join(words) + f" Stage {len(stages)} (the command above) starts "
                   f"from stage {len(stages) - 1}'s bf16 checkpoint with a fresh optimiser and new seeds. "
                   "`make tiny-vl` runs the first two stages (the second by default "
                   f"{STAGE2_STEPS} steps on the seeds after the first's); `make tiny-vl-wide` adds the wide one.")
    return out


def _is_make_recipe(command: str) -> bool:
    """Whether a recorded command is a stage of ``make tiny-vl`` (defaults only; stage 2 names its start)."""
    args = command.split()[2:]
    return args in ([], ["--no-eval"]) or (len(args) == 2 and args[0] == "--init-from") or \
        (len(args) == 3 and args[0] == "--out" and args[2] == "--no-eval")


def _device_words(ver: dict) -> str:
    return "CPU" if ver.get("device", "cpu") == "cpu" else ver["device"]


_FIRST_WIDE_DRAWER = ("224–640 px pictures, square or not, shapes from 24 px to 45 % of the short side, palette "
                      "and named-colour shades, white/grey/tinted backgrounds, fills and outlines, supersampled or "
                      "hard edges, some JPEG")


def wide_drawer_text(small_share: float = 0.0, outline_share: float = synthetic.WIDE_OUTLINE_SHARE) -> str:
    """What synthetic.sample_wide draws, from its constants: training.json keeps it with the stage."""
    lo, hi = synthetic.WIDE_STAR_INNER
    small = (f" ({small_share * 100:.0f} % of them drawn from {synthetic.WIDE_MIN_WIDTH} to "
             f"{synthetic.WIDE_SMALL_WIDTH} px)" if small_share else "")
    outlines = ("fills and outlines" if outline_share == synthetic.WIDE_OUTLINE_SHARE else
                f"fills and outlines ({outline_share * 100:.0f} % outlines)")
    return (f"{synthetic.WIDE_SIDE[0]}–{synthetic.WIDE_SIDE[1]} px pictures, square or not, shapes from "
            f"{synthetic.WIDE_MIN_WIDTH} px to {synthetic.WIDE_MAX_SHARE * 100:.0f} % of the short side{small}, "
            f"palette and named-colour shades, white/grey/tinted backgrounds, {outlines}, supersampled or "
            f"hard edges, some JPEG, stars with an inner radius of {lo:.2f}–{hi:.2f} of the outer")


def _drawer_words(tr: dict) -> str:
    """' from the wide drawer (…)' and the schedule when the run stopped early; '' for the default run."""
    out = ""
    if tr.get("drawer") == "wide":
        # a stage records the drawer it trained on; the first wide stage predates that (its stars were fixed)
        out += f" from the wide drawer (`synthetic.sample_wide`: {tr.get('drawer_text', _FIRST_WIDE_DRAWER)})"
        if tr.get("args", {}).get("default_every"):
            out += f", every {tr['args']['default_every']}th seed from the default drawer"
    if tr.get("schedule_steps", tr["steps"]) != tr["steps"]:
        out += f", stopped after {tr['steps']} of a {tr['schedule_steps']}-step schedule"
    if tr.get("seconds_per_step"):
        out += f", {tr['seconds_per_step']:.1f} s per step"
    return out


def _is_make_command(tr: dict) -> bool:
    return _explicit_command(tr) == tr["command"].strip() and _is_make_recipe(tr["command"])


def _shape_confusion(items: list[dict]) -> list[str]:
    """A markdown table: rows the shape drawn, columns the shape answered (unparsable: '?')."""
    cols = list(synthetic.SHAPES) + ["?"]
    count = {(a, b): 0 for a in synthetic.SHAPES for b in cols}
    for i in items:
        try:
            got = synthetic.parse_answer(i["got"])[1]
        except ValueError:
            got = "?"
        count[(i["combo"][1], got)] += 1
    out = ["| drawn \\ answered | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    out += [f"| {a} | " + " | ".join(str(count[(a, b)]) for b in cols) + " |" for a in synthetic.SHAPES]
    return out + [""]


ENGINE_HEADING = "## The engine on the same pictures"
ENGINE_BEGIN = "<!-- engine-agreement:begin (written by scripts/tiny_vl_agreement.py) -->"
ENGINE_END = "<!-- engine-agreement:end -->"


INDEPENDENT_HEADING = "## A second, independent drawer"


def _independent_section(out: Path, tr: dict) -> list[str]:
    """The README's section on the independent drawer, from independent.json (scripts/eval_tiny_vl.py)."""
    from eval_tiny_vl import BEGIN, END, OUT_NAME, readme_section

    from kestrel_lab.vision import independent

    path = out / OUT_NAME
    body = [readme_section(json.loads(path.read_text(encoding="utf-8")))] if path.is_file() else []
    return [INDEPENDENT_HEADING, "",
            "Pictures from a drawer the model never saw, `kestrel_lab.vision.independent` "
            f"({independent.N_ITEMS} items, "
            "`independent.evaluation_set()`): other code (PIL `ImageDraw` primitives at output resolution, no "
            "supersampling), pure and CSS/X11 named colours, shapes from 24 px to 45 % of the picture's short side "
            "in four size bands, pictures from 256×256 to 640×480 (square and not), white or light named "
            "backgrounds, some outlines, some JPEG; every (colour, shape, position) twice, each time in another size "
            "band. Beside it, today's held-out set through the same code. Scored per field by parsing the answer "
            "back.", "", *_before_words(tr), BEGIN, *body, END, ""]


def _before_words(tr: dict) -> list[str]:
    """What the starting checkpoint scored (training.json's init.evaluation), for a stage that started from one."""
    ev = (tr.get("init") or {}).get("evaluation")
    if not ev:
        return []
    ind, ho, p = ev["independent"], ev["heldout"], ev["provenance"]
    by_band = ev.get("independent_by", {}).get("band", {})
    bands = ", ".join(f"{k} {100 * v['accuracy']:.1f} %" for k, v in by_band.items())
    return [f"Before the last stage, the checkpoint it started from answered {ind['exact']}/{ind['n']} "
            f"({100 * ind['accuracy']:.1f} %) of the independent set exactly (colour {100 * ind['colour']:.1f} %, "
            f"shape {100 * ind['shape']:.1f} %, position {100 * ind['position']:.1f} %; by size band: {bands}) and "
            f"{ho['exact']}/{ho['n']} of today's held-out set (`{p['script']}` at commit {p['commit']}, kept in "
            "training.json as `init.evaluation`). After it:", ""]


def _engine_section(old_readme: str | None) -> list[str]:
    """The README's engine section: kept as it is (``--readme-only``: same checkpoint), else its text with
    the markers that scripts/tiny_vl_agreement.py fills in (a new checkpoint has no agreement yet)."""
    if old_readme and ENGINE_HEADING in old_readme and ENGINE_BEGIN in old_readme:
        kept = old_readme.split(ENGINE_HEADING, 1)[1].split(INDEPENDENT_HEADING, 1)[0]
        return [ENGINE_HEADING + kept.rstrip("\n"), ""]
    return [
        ENGINE_HEADING, "",
        "The numba engine (`kestrel_lab.engine.vl`) on the VQF files `models.vqf(\"qwen3-tiny-vl\", quant=…)` "
        "converts from `model.safetensors`: every held-out picture is drawn again, preprocessed by "
        "`vision.preprocess.load_image`, put in the prompt by `vision.prompt.encode_vl_chat` and decoded greedily (at "
        "most 24 tokens). \"Same ids\" compares the engine's continuation with transformers' `got_ids` in "
        "`heldout.json` token for token; \"right\" is the exact sentence followed by `<|im_end|>`. In the Q8_0 and "
        "Q4_0 files only the text tower's matrices take that quant (the embedding stays F16, the vision matrices "
        "Q8_0). `tests/test_tiny_vl.py` checks the ten cases "
        "of `greedy.json` at F32 token for token, prompt ids included; lesson day21_3 runs the pipeline step by step.",
        "", ENGINE_BEGIN, "Not computed for this checkpoint yet: run `scripts/tiny_vl_agreement.py`.", ENGINE_END, ""]


def write_readme(out: Path, keep_engine_section: bool = False) -> Path:
    """README.md of the model folder, every figure read from the files the run wrote. The engine section
    is kept from the old README with ``keep_engine_section`` (the same checkpoint), else left for
    scripts/tiny_vl_agreement.py to fill in."""
    old_path = out / "README.md"
    old_readme = old_path.read_text(encoding="utf-8") if keep_engine_section and old_path.is_file() else None
    tr = json.loads((out / "training.json").read_text(encoding="utf-8"))
    ho = json.loads((out / "heldout.json").read_text(encoding="utf-8"))
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    v, t = cfg["vision_config"], cfg["text_config"]
    st = out / "model.safetensors"
    digest = hashlib.sha256(st.read_bytes()).hexdigest()
    pc, a, ver = tr["parameters"], tr["args"], tr["versions"]
    ov, se, un = ho["overall"], ho["seen_combos"], ho["unseen_combos"]
    pf = ho["per_field_accuracy"]
    wrong = [i for i in ho["items"] if not i["ok"]]
    combos = "、".join(f"{p}的{c}色{s}" for c, s, p in ho["heldout_combos"])
    stages = training_record.stages(tr)
    wall = sum(st_["train_seconds"] for st_ in stages)
    n_random = sum(1 for i in ho["items"] if i["seed"] < synthetic.UNSEEN_SEED_START)
    n_extra = len(ho["items"]) - n_random
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    lines = [
        "# qwen3-tiny-vl — a small trained Qwen3-VL that says what it sees",
        "",
        f"A {pc['total'] / 1e6:.1f} M-parameter model with the real Qwen3-VL architecture "
        "(`Qwen3VLForConditionalGeneration`), the VL twin of `qwen3-tiny-poem`: shown a synthetic picture and "
        f"asked 「{ho['question']}」, it answers with one exact sentence such as 「左上角有一个红色的圆。」. "
        "It exists so that the vision lessons and tests run a real trained model offline: a wrong vision kernel, "
        "a wrong patch order or a wrong image position shows up as a wrong sentence.",
        "",
        f"- Vision tower ({pc['vision'] / 1e6:.2f} M parameters): {v['depth']} blocks of width {v['hidden_size']}, "
        f"{v['num_heads']} heads of dim {v['hidden_size'] // v['num_heads']}, MLP {v['intermediate_size']} "
        f"(tanh-GELU), LayerNorm; patch {v['patch_size']}, temporal patch {v['temporal_patch_size']}, "
        f"{v['spatial_merge_size']}×{v['spatial_merge_size']} merge; a learned position table of "
        f"{v['num_position_embeddings']} = {int(v['num_position_embeddings'] ** 0.5)}² rows like Qwen3-VL's "
        "(bilinearly resampled to the 16×16 grid, so the interpolation is exercised); DeepStack taps after blocks "
        f"{v['deepstack_visual_indexes']}, out width {v['out_hidden_size']}.",
        f"- Text tower: the poem model's shape — {t['num_hidden_layers']} layers, hidden {t['hidden_size']}, "
        f"{t['num_attention_heads']} query / {t['num_key_value_heads']} KV heads of dim {t['head_dim']}, SwiGLU "
        f"{t['intermediate_size']}, q/k RMSNorm — with Qwen3-VL's interleaved MRoPE (θ "
        f"{t['rope_parameters']['rope_theta']:g}, sections {t['rope_parameters']['mrope_section']} = head_dim/2), "
        f"tied embeddings, the real {t['vocab_size']:,}-row vocabulary. "
        f"{pc['embedding_nonzero_rows']} embedding rows are non-zero (the ids of the chat template, the question "
        "and the 120 answers, `<|image_pad|>` excepted: its input is overwritten by the merger); all other rows "
        "are exactly zero, as in the poem model.",
        f"- Files: `config.json`, `generation_config.json` and `model.safetensors` written by transformers' "
        f"`save_pretrained` in bf16 ({st.stat().st_size:,} bytes, sha256 `{digest}`); `training.json` (arguments, "
        "loss curve, seconds, versions, the loss check below), `training.log`, `heldout.json` (every held-out item: "
        "seed, combination, expected, got, token ids) and `greedy.json` (ten held-out items with the prompt ids and "
        "transformers' greedy continuation, ids and text, for the engine to reproduce).",
        "",
        "## The pictures and the prompt",
        "",
        "`kestrel_lab.vision.synthetic` (numpy + Pillow only, so lessons and tests draw the same pixels without "
        "torch): 256×256 RGB — the smallest size Qwen3-VL's `min_pixels` leaves unresized, 16×16 patches, "
        "64 LLM tokens — one shape on a plain light background: 6 colours (红 橙 黄 绿 蓝 紫) × 4 shapes (圆 正方形 "
        "三角形 星形) × 5 positions (左上角 右上角 左下角 右下角 中间), with a random size (radius "
        f"{synthetic.RADIUS[0]}–{synthetic.RADIUS[1]} px), ±{synthetic.JITTER} px jitter, ±{synthetic.ROTATION_DEG:g}° "
        "rotation, background shade and colour tint from the seed (drawn at 4× and box-reduced). "
        "`synthetic.draw(seed)` gives the picture and the answer; the same seed gives the same bytes (a test pins "
        "one sha256).",
        "",
        "Pixels: transformers' `Qwen2VLImageProcessorPil` with Qwen3-VL's settings (min 65,536 / max 16,777,216 "
        "pixels, patch 16, temporal patch 2, merge 2, mean = std = 0.5). Tokens, built by hand in Qwen3-VL-Instruct's "
        "chat template (no system message, no think block), `<|im_start|>user\\n<|vision_start|>` + 64 × "
        f"`<|image_pad|>` + `<|vision_end|>{ho['question']}<|im_end|>\\n<|im_start|>assistant\\n`, then the answer "
        "and `<|im_end|>` (151645); `mm_token_type_ids` is 1 on the pads.",
        "",
        "## Training",
        "",
        f"{'The last stage, ' if len(stages) > 1 else ''}`{_explicit_command(tr)}`"
        f"{' (`make tiny-vl`)' if _is_make_command(tr) else ''}: "
        f"{tr['steps']} steps of {tr['batch']} pictures{_drawer_words(tr)} "
        f"({tr['train_images']:,} distinct training seeds, {tr['first_train_seed']}…{tr['last_train_seed']}, skipping "
        f"the held-out combinations), AdamW (lr {a['lr']:g}, {a['warmup']} warm-up steps, cosine to {a['final_lr']:g}, "
        f"β = (0.9, 0.98), weight decay {a['weight_decay']:g} on matrices, gradient clip 1.0), float32, torch on "
        f"{_device_words(ver)} "
        f"with {a['threads']} threads, `torch.use_deterministic_algorithms(True)`, seed {tr['seed']}. The loss is "
        "the cross-entropy on the answer tokens and the closing `<|im_end|>` only.",
        "",
        *_start_lines(tr),
        "- Full-vocabulary loss, cheaply: with all other rows zero their logits are exactly 0, so the softmax "
        "normaliser is logsumexp([h·E_used, log(V − K)]). Checked after training on "
        f"{tr['loss_check']['items']} items against transformers' own `model(labels=…).loss` over all 151,936 logits: "
        f"{tr['loss_check']['used_rows']:.6f} vs {tr['loss_check']['transformers']:.6f}.",
        f"- Loss: {tr['loss_first']:.3f} (first step) → {tr['loss_last']:.4f} (mean of the last "
        f"{a['log_every']} steps).",
        f"- Time: {tr['train_seconds']:.0f} s wall ({tr['train_seconds'] / 60:.1f} min), "
        f"{tr['train_cpu_seconds']:.0f} s CPU for this stage's training loop"
        + (f" ({wall:.0f} s wall for the training loops of all {len(stages)} stages; each earlier stage's seconds, "
           "above, were measured on the machine of its own run)" if len(stages) > 1 else "")
        + f"; {tr['total_seconds']:.0f} s for the last command with the evaluation. "
        f"Machine (this stage): {ver['cpu']}, "
        f"{ver['machine']}; it was shared with other jobs and the run was under `nice -n 10`, so the wall time is "
        "an upper bound.",
        f"- Versions: torch {ver['torch']}, transformers {ver['transformers']}, numpy {ver['numpy']}, Pillow "
        f"{ver['pillow']}, Python {ver['python']}; git commit {tr['git_commit'] or 'unknown'}"
        f"{' (with uncommitted changes)' if tr.get('git_dirty') else ''}.",
        "",
        "## Held-out accuracy (transformers, greedy)",
        "",
        f"{ov['n']} pictures never used in training, `synthetic.heldout_seeds()`: the first "
        f"{n_random} seeds from {synthetic.HELDOUT_SEED_START:,} (training only uses seeds below "
        f"{synthetic.HELDOUT_SEED_START:,}; these fall on any combination, the unseen ones included) and, for each "
        f"of the {len(ho['heldout_combos'])} combinations never drawn for training ({combos}), the first "
        f"{n_extra // len(ho['heldout_combos'])} seeds from {synthetic.UNSEEN_SEED_START:,} that draw it. "
        "The bf16 file is loaded back with `from_pretrained` in float32 and `generate` runs greedily; an item is "
        "right when the continuation is exactly the answer followed by `<|im_end|>`.",
        "",
        "| set | items | right | accuracy |",
        "|---|---|---|---|",
        f"| all held-out | {ov['n']} | {ov['right']} | {pct(ov['accuracy'])} |",
        f"| combinations seen in training | {se['n']} | {se['right']} | {pct(se['accuracy'])} |",
        f"| combinations never seen | {un['n']} | {un['right']} | {pct(un['accuracy'])} |",
        "",
        *([f"Below the 95 % goal the course set for this model ({pct(ov['accuracy'])}); the table shows "
           "which shapes it still confuses.", ""] if ov["accuracy"] < 0.95 else []),
        *_shape_confusion(ho["items"]),
        f"Per field (answers parsed back): colour {pct(pf['colour'])}, shape {pct(pf['shape'])}, position "
        f"{pct(pf['position'])}." + (" Wrong answers: " + "; ".join(
            f"seed {i['seed']} 「{i['expected']}」 → 「{i['got']}」" for i in wrong[:8])
            + (" …" if len(wrong) > 8 else "") + "." if wrong else " No item is wrong."),
        "",
        *_engine_section(old_readme),
        *_independent_section(out, tr),
    ]
    path = out / "README.md"
    with atomic_write(path, "w") as fh:
        fh.write("\n".join(lines))
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "data" / "models" / "qwen3-tiny-vl")
    ap.add_argument("--quick", action="store_true", help="smoke run: 12 steps of 4, 12 held-out items")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimiser steps (default 1200 for stage 1, 700 for a stage started by --init-from)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--final-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--width", type=int, default=128, help="vision tower width")
    ap.add_argument("--depth", type=int, default=6, help="vision tower blocks")
    ap.add_argument("--heads", type=int, default=2, help="vision attention heads")
    ap.add_argument("--deepstack", type=str, default="1,3", help="vision blocks feeding DeepStack")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu",
                    help="torch device for the training loop (cpu, cuda); the evaluation runs on CPU")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--n-heldout", type=int, default=None, help="evaluate on the first N held-out items")
    ap.add_argument("--poem", type=Path, default=tiny_poem_dir())
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from a checkpoint this script wrote (a second stage) instead of the poem model")
    ap.add_argument("--first-seed", type=int, default=None,
                    help="first training seed (default 0; with --init-from, the seed after the previous stage's last)")
    ap.add_argument("--drawer", choices=("default", "wide"), default="default",
                    help="training pictures: synthetic.sample (256×256, one palette) or synthetic.sample_wide "
                    "(224–640 px, 24 px to 45 %% shapes, named-colour shades, outlines, hard edges, JPEG)")
    ap.add_argument("--default-every", type=int, default=0,
                    help="with --drawer wide, draw every N-th training seed with the default drawer instead, so "
                    "the training drawer's own pictures stay in the mix (0: never)")
    ap.add_argument("--small-share", type=float, default=0.0,
                    help="with --drawer wide, the share of shapes drawn from 24 px to synthetic.WIDE_SMALL_WIDTH "
                    "(the sizes the model misses most) instead of over the whole range (0: none)")
    ap.add_argument("--outline-share", type=float, default=synthetic.WIDE_OUTLINE_SHARE,
                    help="with --drawer wide, the share of outlines instead of fills (default "
                    f"synthetic.WIDE_OUTLINE_SHARE = {synthetic.WIDE_OUTLINE_SHARE:g})")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after N of the --steps steps (the learning-rate schedule stays that of --steps; "
                    "a reproducible part of a longer run)")
    ap.add_argument("--no-eval", action="store_true", help="save the checkpoint and training.json only")
    ap.add_argument("--readme-only", action="store_true", help="rewrite README.md from the run's files in --out")
    return ap


# the options that shape the model or the run; a recorded run whose values differ from today's defaults
# names them in the README (the defaults changed when the two-stage recipe became `make tiny-vl`)
RECIPE_OPTIONS = ("steps", "batch", "lr", "final_lr", "warmup", "weight_decay", "width", "depth", "heads",
                  "deepstack", "seed", "threads", "first_seed")


def _explicit_command(tr: dict) -> str:
    """The recorded command with every recipe option whose value differs from today's default spelled out."""
    a, defaults, stage2 = tr["args"], vars(build_parser().parse_args([])), bool(tr["args"].get("init_from"))
    defaults["steps"] = STAGE2_STEPS if stage2 else STAGE1_STEPS
    defaults["first_seed"] = None if stage2 else 0
    extra = []
    for k in RECIPE_OPTIONS:
        if k in a and a[k] != defaults[k] and not (k == "first_seed" and stage2) and f"--{k.replace('_', '-')}" \
                not in tr["command"]:
            extra.append(f"--{k.replace('_', '-')} {a[k]}")
    return tr["command"].strip() + "".join(" " + e for e in extra)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.readme_only:
        print(write_readme(args.out, keep_engine_section=True))
        return 0
    if args.steps is None:
        args.steps = STAGE2_STEPS if args.init_from else STAGE1_STEPS
    if args.first_seed is None:
        args.first_seed = 0
        if args.init_from:
            prev = json.loads((args.init_from / "training.json").read_text(encoding="utf-8"))
            args.first_seed = int(prev["last_train_seed"]) + 1
    if args.quick:
        args.steps, args.batch, args.warmup, args.log_every = 12, 4, 3, 3
        args.n_heldout = args.n_heldout or 12

    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):   # cuBLAS is deterministic only with a fixed workspace
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []
    t_start = time.time()
    commit, dirty = git_commit(), git_dirty(out)   # what the run starts from

    def log(msg: str) -> None:
        line = f"[{time.time() - t_start:7.1f} s] {msg}"
        print(line, flush=True)
        log_lines.append(line)

    tok = Tokenizer.default()
    prompts = Prompts(tok)
    # only the wide drawer reads default_every, small_share and outline_share
    batcher = Batcher(prompts, args.drawer, args.default_every, args.small_share, args.outline_share)
    cfg = build_config(args.width, args.depth, args.heads, [int(x) for x in args.deepstack.split(",")])
    if args.init_from:
        torch.manual_seed(args.seed)
        model, init_info = init_from_checkpoint(args.init_from, prompts)
    else:
        model, init_info = init_model(cfg, prompts, args.poem, args.seed)
    lm = model.model.language_model
    rows_mod = UsedRows(lm.embed_tokens.weight.detach(), prompts.used)
    embed = lm.embed_tokens
    embed.weight.requires_grad_(False)
    lm.embed_tokens = rows_mod
    model.to(args.device).train()
    log(f"init: {init_info}; prompt {len(prompts.prompt)} tokens; {len(prompts.answers)} answers")

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "rows" not in name and "pos_embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98))

    run_steps = min(args.stop_after or args.steps, args.steps)
    seeds = synthetic.train_seeds(run_steps * args.batch, start=args.first_seed)
    loss_log, window, t_train, cpu_train = [], [], time.time(), time.process_time()
    for step in range(run_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup, args.final_lr)
        b = to_device(batcher.batch(seeds[step * args.batch:(step + 1) * args.batch]), args.device)
        loss = loss_of(model, rows_mod, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        window.append(float(loss.detach()))
        if (step + 1) % args.log_every == 0 or step == 0 or step + 1 == run_steps:
            mean = sum(window) / len(window)
            loss_log.append([step + 1, round(mean, 5), round(time.time() - t_train, 1),
                             round(time.process_time() - cpu_train, 1)])
            log(f"step {step + 1}/{args.steps} loss {mean:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"cpu {time.process_time() - cpu_train:.0f} s")
            window = []
    train_seconds, train_cpu = time.time() - t_train, time.process_time() - cpu_train
    log(f"trained {run_steps} of {args.steps} steps ({args.drawer} drawer) in {train_seconds:.0f} s wall, "
        f"{train_cpu:.0f} s CPU, {train_seconds / run_steps:.1f} s per step")

    # the full-vocabulary loss of transformers equals the used-rows loss (one batch, no grad)
    model.eval()
    check = to_device(batcher.batch(seeds[:min(8, len(seeds))]), args.device)
    with torch.no_grad():
        ours = float(loss_of(model, rows_mod, check))
        lm.embed_tokens = embed
        embed.weight.zero_()
        embed.weight[torch.tensor(prompts.used)] = rows_mod.rows.detach()
        assert model.lm_head.weight.data_ptr() == embed.weight.data_ptr()
        theirs = float(model(**check).loss)
    log(f"loss check on {check['input_ids'].shape[0]} training items: used-rows {ours:.6f}, "
        f"transformers full vocabulary {theirs:.6f}")
    if not math.isclose(ours, theirs, rel_tol=1e-4, abs_tol=1e-5):
        raise SystemExit(f"the used-rows loss {ours} differs from transformers' {theirs}")

    model.generation_config.eos_token_id = [IM_END, ENDOFTEXT]
    model.generation_config.bos_token_id = ENDOFTEXT
    model.generation_config.pad_token_id = ENDOFTEXT
    model.generation_config.do_sample = False
    model.cpu()
    save_checkpoint(model, out)
    log(f"saved {out}/model.safetensors ({(out / 'model.safetensors').stat().st_size:,} bytes)")

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
           "pillow": __import__("PIL").__version__, "python": platform.python_version(),
           "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, torch threads {args.threads}",
           "cpu": _cpu_name(),
           "device": args.device}
    record = {
        "command": "python scripts/train_tiny_vl.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: (_rel(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "steps": run_steps, "schedule_steps": args.steps, "drawer": args.drawer,
        **({"drawer_text": wide_drawer_text(args.small_share, args.outline_share)} if args.drawer == "wide" else {}),
        "batch": args.batch,
        "train_images": len(seeds), "seconds_per_step": round(train_seconds / run_steps, 2),
        "first_train_seed": seeds[0], "last_train_seed": seeds[-1],
        "train_seconds": round(train_seconds, 1), "train_cpu_seconds": round(train_cpu, 1),
        "loss_log_columns": ["step", "mean loss since the previous entry", "wall seconds", "CPU seconds"],
        "loss_log": loss_log, "loss_first": loss_log[0][1], "loss_last": loss_log[-1][1],
        "loss_check": {"items": int(check["input_ids"].shape[0]), "used_rows": ours, "transformers": theirs},
        "init": init_info, "parameters": param_counts(model),
        "seed": args.seed, "versions": env, "git_commit": commit, "git_dirty": dirty,
        "deterministic": "torch.use_deterministic_algorithms(True), torch.manual_seed(seed), numpy seeds per picture"}
    if args.no_eval:
        record["total_seconds"] = round(time.time() - t_start, 1)
        write_json(out / "training.json", record)
        with atomic_write(out / "training.log", "w") as fh:
            fh.write("\n".join(log_lines) + "\n")
        return 0

    # evaluate what is on disk: the bf16 file loaded back in float32, greedy generate
    saved = Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    held = synthetic.heldout_seeds()
    if args.n_heldout:
        held = held[:args.n_heldout // 2] + held[-(args.n_heldout - args.n_heldout // 2):]
    result = evaluate(saved, batcher, held, log)
    log(f"held-out accuracy {result['overall']['right']}/{result['overall']['n']} "
        f"(unseen combos {result['unseen_combos']['right']}/{result['unseen_combos']['n']})")

    greedy_cases = []
    picks = [i for i in result["items"] if not i["unseen_combo"]][:6] + \
        [i for i in result["items"] if i["unseen_combo"]][:4]
    for it in picks:
        greedy_cases.append({"seed": it["seed"], "combo": it["combo"], "unseen_combo": it["unseen_combo"],
                             "expected": it["expected"], "prompt_ids": prompts.prompt,
                             "greedy_ids": it["got_ids"], "greedy_text": tok.decode(it["got_ids"])})

    write_json(out / "heldout.json", {
        "question": synthetic.QUESTION, "how": "greedy generate by transformers on the bf16 checkpoint loaded "
        "in float32; exact answer string followed by <|im_end|>",
        **{k: result[k] for k in ("overall", "seen_combos", "unseen_combos", "per_field_accuracy", "seconds")},
        "heldout_combos": [list(c) for c in synthetic.HELDOUT_COMBOS],
        "items": result["items"]})
    write_json(out / "greedy.json", {"max_new_tokens": 24, "question": synthetic.QUESTION,
                                     "image": {"size": [synthetic.SIZE, synthetic.SIZE], "grid_thw": [1, 16, 16]},
                                     "eos_token_ids": [IM_END, ENDOFTEXT], "cases": greedy_cases})
    record.update({"total_seconds": round(time.time() - t_start, 1),
                   "heldout_accuracy": result["overall"]["accuracy"],
                   "heldout_unseen_combo_accuracy": result["unseen_combos"]["accuracy"]})
    # both held-out sets, the independent drawer's included, through transformers (the engine columns
    # come from scripts/eval_tiny_vl.py once the VQF files exist)
    from eval_tiny_vl import OUT_NAME
    from eval_tiny_vl import evaluate as evaluate_both

    both = evaluate_both(out, [], args.n_heldout, log=log)
    write_json(out / OUT_NAME, both)
    record["independent_accuracy"] = both["independent"]["transformers"]["overall"]["accuracy"]
    log(f"independent set: {both['independent']['transformers']['overall']['exact']}/"
        f"{both['independent']['transformers']['overall']['n']} exact")
    write_json(out / "training.json", record)
    with atomic_write(out / "training.log", "w") as fh:
        fh.write("\n".join(log_lines) + "\n")
    print(write_readme(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
