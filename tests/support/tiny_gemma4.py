"""The tiny Gemma 4: a small byte-level BPE tokenizer with Gemma 4's control tokens at their real ids,
the real chat template, and a random-weight Gemma4ForConditionalGeneration at toy width."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from build_cache import cached, chat_template_path, sha256, write_json
from tiny_models import DEFAULT_SEED, GEMMA4_INIT_STD, build_model, copy_tokenizer

# Gemma 4 control tokens at their ids in the real 262,144-token vocabulary.
GEMMA4_CONTROL_TOKENS = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}


# Media markers sit near the top of the real vocabulary (255999 and up); here they close the small one,
# in the same order as the real ids (<|image> 255999, <|audio> 256000, <|image|> 258880, ...).
GEMMA4_MEDIA_TOKENS = ("<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>")


_GEMMA4_ENGLISH = """\
The agent opened the file, read the failing test and wrote a short plan before touching any code.
It is raining in Paris today; tomorrow the forecast says 18 degrees and a light wind from the west.
Please summarise the meeting notes in three bullet points, then list every open question with its owner.
Why did the build fail? The compiler could not find the header, so the linker never ran at all.
She said: "Don't worry, we'll ship it on Monday -- unless the reviewers ask for more tests."
Numbers such as 3.14159, 2,048 and 1e-6 appear in logs, tables, prices ($19.99) and dates (2026-04-01).
"""


def _gemma4_corpus() -> list[str]:
    """Varied English prose and Python code from the standard library, plus a little text of our own."""
    import pydoc_data.topics

    texts = [_GEMMA4_ENGLISH] * 20
    texts.extend(pydoc_data.topics.topics.values())  # the Python reference manual: English with code
    stdlib = Path(json.__file__).resolve().parent.parent
    for name in ("json/__init__.py", "json/decoder.py", "textwrap.py", "string.py", "argparse.py", "dataclasses.py"):
        path = stdlib / name
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8"))
    return texts


def _gemma4_base_vocab() -> list[str]:
    """Ids 0..106: the control tokens at their real ids, unused fillers in between."""
    last = max(GEMMA4_CONTROL_TOKENS)
    filler = iter(range(10_000))
    return [GEMMA4_CONTROL_TOKENS.get(i) or f"<unused{next(filler)}>" for i in range(last + 1)]


def _build_gemma4_tokenizer(out: Path, template: Path, vocab_size: int) -> dict[str, Any]:
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    base = _gemma4_base_vocab()
    tokenizer = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in base],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so any text round-trips
    )
    tokenizer.train_from_iterator(_gemma4_corpus(), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA4_MEDIA_TOKENS])
    for token_id, content in enumerate(base):
        assert tokenizer.token_to_id(content) == token_id, (content, token_id)
    # The real tokenizer adds <bos> when asked to add special tokens; rendered prompts already carry it.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
    )
    tokenizer.save(str(out / "tokenizer.json"))

    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in [*base, *GEMMA4_MEDIA_TOKENS]
    }
    write_json(
        out / "tokenizer_config.json",
        {
            # TokenizersBackend loads tokenizer.json as it is; GemmaTokenizer would rebuild a
            # SentencePiece-style pipeline around this byte-level vocabulary.
            "tokenizer_class": "TokenizersBackend",
            "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": added,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
            "clean_up_tokenization_spaces": False,
            "model_max_length": 131072,
            "extra_special_tokens": {
                "boi_token": "<|image>",
                "eoi_token": "<image|>",
                "image_token": "<|image|>",
                "boa_token": "<|audio>",
                "eoa_token": "<audio|>",
                "audio_token": "<|audio|>",
                "video_token": "<|video|>",
            },
        },
    )
    shutil.copyfile(template, out / "chat_template.jinja")
    return {"vocab": tokenizer.get_vocab_size(with_added_tokens=True)}


GEMMA4_TOKENIZER_VOCAB = 6144  # before the media markers


def gemma4_tokenizer_dir() -> Path:
    """A small byte-level BPE tokenizer with Gemma 4's control tokens at their real ids, and the real template."""
    template = chat_template_path("gemma4")
    corpus_sha = hashlib.sha256("\x00".join(_gemma4_corpus()).encode()).hexdigest()
    params = {
        "template_sha256": sha256(template),
        "corpus_sha256": corpus_sha,
        "vocab_size": GEMMA4_TOKENIZER_VOCAB,
    }
    return cached(
        "gemma4-tokenizer", params, lambda out: _build_gemma4_tokenizer(out, template, GEMMA4_TOKENIZER_VOCAB)
    )


def _round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


def gemma4_config_dict(tokenizer_size: int, token_ids: dict[str, int], **overrides: Any) -> dict[str, Any]:
    """Config of the tiny Gemma 4: E2B-style text model (per-layer inputs, KV sharing) at toy width.

    Overrides go into text_config, except `vision_config` (a dict merged into it), `audio_config`
    (the audio tower's, or None for none) and the build settings `seed` and `init_std`. Changing num_hidden_layers without layer_types alternates
    sliding and full attention, ending with full attention.
    """
    overrides = dict(overrides)
    vocab = _round_up(tokenizer_size)
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "position_embedding_size": 1024,
        **overrides.pop("vision_config", {}),
    }
    audio = overrides.pop("audio_config", None)  # None: no audio tower (tiny_media.py gives one)
    text = {
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": 30.0,
        # Small, so that a chat prompt plus a few dozen tokens already slides past the window.
        "sliding_window": 32,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        n = overrides["num_hidden_layers"]
        overrides["layer_types"] = [
            "full_attention" if (i % 2 == 1 or i == n - 1) else "sliding_attention" for i in range(n)
        ]
    text.update(overrides)
    text.setdefault("layer_types", ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "boi_token_id": token_ids["<|image>"],
        "eoi_token_id": token_ids["<image|>"],
        "image_token_id": token_ids["<|image|>"],
        "boa_token_id": token_ids["<|audio>"],
        "eoa_token_index": token_ids["<audio|>"],
        "audio_token_id": token_ids["<|audio|>"],
        "video_token_id": token_ids["<|video|>"],
        "tie_word_embeddings": True,
        "text_config": text,
        "vision_config": vision,
        "audio_config": audio,
    }


GEMMA4_GENERATION_CONFIG = {
    # As shipped with Gemma: stop on <eos> or <turn|>, sample by default.
    "bos_token_id": 2,
    "pad_token_id": 0,
    "eos_token_id": [1, 106],
    "do_sample": True,
    "top_k": 64,
    "top_p": 0.95,
    "temperature": 1.0,
}


def gemma4_checkpoint(**overrides: Any) -> Path:
    """A tiny random-weight Gemma4ForConditionalGeneration with Gemma 4's control tokens and template.

    Keyword overrides: text_config fields, `vision_config` (dict), `seed`, `init_std`.
    """
    seed = overrides.pop("seed", DEFAULT_SEED)
    init_std = overrides.pop("init_std", GEMMA4_INIT_STD)
    tokenizer_dir = gemma4_tokenizer_dir()
    tokenizer_json = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    token_ids = {t["content"]: t["id"] for t in tokenizer_json["added_tokens"]}
    size = max(token_ids.values()) + 1
    config_dict = gemma4_config_dict(size, token_ids, **overrides)
    params = {
        "config": config_dict,
        "generation_config": GEMMA4_GENERATION_CONFIG,
        "seed": seed,
        "init_std": init_std,
        "tokenizer": tokenizer_dir.name,
    }

    def build(out: Path) -> dict[str, Any]:
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration, GenerationConfig

        copy_tokenizer(tokenizer_dir, out)
        info = build_model(
            out,
            config_dict,
            Gemma4Config,
            Gemma4ForConditionalGeneration,
            seed=seed,
            init_std=init_std,
            stop_ids=GEMMA4_GENERATION_CONFIG["eos_token_id"],
        )
        GenerationConfig(**GEMMA4_GENERATION_CONFIG).save_pretrained(out)
        return info

    return cached("gemma4-tiny", params, build)


GEMMA4_ASSISTANT_TOKENS = 6  # num_assistant_tokens, as google/gemma-4-E2B-it-assistant ships it
GEMMA4_CLUSTER = 128  # tokens per cluster of the assistant's output, as the real one's (262,144 in 2,048)


def gemma4_assistant_config_dict(target_text: dict[str, Any], hidden_size: int = 32, top_clusters: int = 8) -> dict[str, Any]:
    """Config of a Gemma 4 assistant for the tiny Gemma 4: as google/gemma-4-E2B-it-assistant is for
    gemma-4-E2B-it (four layers, every one KV-shared, a hidden size a sixth of the model's, the
    model's hidden size as `backbone_hidden_size`, a clustered output of `GEMMA4_CLUSTER` tokens per
    cluster, the best `top_clusters` scored in full), at the tiny model's width. Its attention reads
    the model's keys and values, so heads, head sizes, window and rotary settings are the model's."""
    full = target_text["layer_types"].index("full_attention")
    text = {key: target_text[key] for key in (
        "vocab_size", "num_key_value_heads", "head_dim", "attention_k_eq_v", "sliding_window",
        "max_position_embeddings", "rms_norm_eps", "rope_parameters", "hidden_activation", "pad_token_id",
        "eos_token_id", "bos_token_id")}
    text.update({
        "model_type": "gemma4_text",
        "global_head_dim": target_text["per_layer_config"][str(full)]["head_dim"],  # as saved: per layer
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 4,
        "num_attention_heads": target_text["num_attention_heads"],
        "num_kv_shared_layers": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "use_double_wide_mlp": False,
        "enable_moe_block": False,
        "final_logit_softcapping": None,
        "tie_word_embeddings": True,
    })
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": target_text["hidden_size"],
        "use_ordered_embeddings": True,
        "num_centroids": target_text["vocab_size"] // GEMMA4_CLUSTER,
        "centroid_intermediate_top_k": top_clusters,
        "tie_word_embeddings": True,
        "text_config": text,
    }


def gemma4_assistant_checkpoint(std: float = 0.1, **overrides: Any) -> Path:
    """A random-weight Gemma4AssistantForCausalLM for the tiny Gemma 4 (gemma4_checkpoint with the same
    overrides), its clusters a random ordering of the vocabulary, with the model's tokenizer."""
    target = gemma4_checkpoint(**overrides)
    target_config = json.loads((target / "config.json").read_text())
    config_dict = gemma4_assistant_config_dict(target_config["text_config"])
    params = {"target": target.name, "config": config_dict, "std": std, "seed": DEFAULT_SEED,
              "tokens": GEMMA4_ASSISTANT_TOKENS}

    def build(out: Path) -> dict[str, Any]:
        import torch
        from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, GenerationConfig

        copy_tokenizer(target, out)
        torch.manual_seed(DEFAULT_SEED)
        config = Gemma4AssistantConfig(**{k: v for k, v in config_dict.items() if k not in ("architectures",
                                                                                                "model_type")})
        model = Gemma4AssistantForCausalLM(config).eval()
        generator = torch.Generator().manual_seed(DEFAULT_SEED)
        with torch.no_grad():
            for _, param in sorted(model.named_parameters()):
                if param.dim() >= 2:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)
            vocab = config.get_text_config().vocab_size
            model.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=generator))
        model.save_pretrained(out)
        GenerationConfig(num_assistant_tokens=GEMMA4_ASSISTANT_TOKENS).save_pretrained(out)
        return {"clusters": config.num_centroids}

    return cached("gemma4-tiny-assistant", params, build)
