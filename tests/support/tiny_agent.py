"""A tiny Qwen3.5 that acts as an agent in a real codex session: asked to "Run echo looptrace-ok", it
calls codex's exec_command with that command, and once the tool's result is back it answers. Its
tokens and their probabilities are a real model's (the tiny Qwen3.5's architecture, vocabulary and
template, decoded by the local backend), which is what replaying a session needs: a recording whose
logprobs a second server must reproduce, and tool calls a step replay must make again.

How it is made (seconds on a CPU, not a training run): the tiny Qwen3.5's random body, changed so that
what it computes at a position depends only on the last few dozen tokens (the linear-attention
layers forget at a fixed rate, 0.8 a token; the full-attention layer's output is zeroed), so codex's
8,000-token prompt reads, near its end, as the short contexts it is fitted on. Then only the output
head's rows for the answers' tokens are fitted (untied from the embeddings, every other row scaled
down), by gradient descent on the body's hidden states at the answers' positions. The build checks
that greedy decoding writes both answers exactly after long random prefixes, every token with
p > 0.999, and keeps the margins it measured. `generation_config.json` asks for greedy decoding
(do_sample false), so the server decodes it greedily whatever the client sends.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any

from build_cache import cached, write_json
from tiny_qwen3_5 import qwen3_5_config_dict, qwen3_5_tokenizer_dir

AGENT_VERSION = 1
SEED = 4321
INIT_STD = 0.5  # the tiny Qwen3.5's
DECAY = 0.8  # what each linear-attention layer keeps of its state per token
OTHER_ROWS = 0.02  # the scale the head's rows for tokens no answer uses keep
IM_END = 248046

PROMPT = "Run echo looptrace-ok"  # what the test asks codex
COMMAND = "echo looptrace-ok"
ANSWER = "The command printed looptrace-ok."


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


FIRST = "I will run it.\n</think>\n\n" + call("exec_command", cmd=COMMAND) + "<|im_end|>"
SECOND = "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>"
ASKED = f"<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n"
RESULT = "<|im_end|>\n<|im_start|>user\n<tool_response>\n{output}</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"


class Contexts:
    """Prompts ending as codex's do: random text, an environment context, the user's request (then,
    for the second answer, the first answer and the tool's result as codex reports it)."""

    def __init__(self, encode, seed: int) -> None:
        self.encode, self.rng = encode, random.Random(seed)
        self.first, self.second = encode(FIRST), encode(SECOND)

    def filler(self, n: int) -> list[int]:
        return [self.rng.randrange(300, 60000) for _ in range(n)]

    def _environment(self) -> list[int]:
        folder = "/tmp/" + "".join(self.rng.choice("abcdefghij0123456789-_/") for _ in range(self.rng.randrange(5, 40)))
        return self.encode(f"<|im_start|>user\n<environment_context>\n  <cwd>{folder}</cwd>\n  <shell>bash</shell>\n"
                           f"  <current_date>2026-12-0{self.rng.randrange(1, 10)}</current_date>\n</environment_context>")

    def _output(self) -> str:
        r = self.rng
        return (f"Chunk ID: {r.randrange(16 ** 6):06x}\nWall time: {r.random() * 0.01:.4f} seconds\n"
                f"Process exited with code 0\nOriginal token count: 4\nOutput:\nlooptrace-ok\n")

    def example(self, second: bool, length: int | None = None) -> tuple[list[int], list[int]]:
        n = self.rng.randrange(8, 120) if length is None else length
        asked = self.filler(n) + self._environment() + self.encode(ASKED)
        if not second:
            return asked, self.first
        return asked + self.first[:-1] + self.encode(RESULT.format(output=self._output())), self.second


def _body(config_dict: dict):
    """The tiny Qwen3.5's seeded random weights, made to forget: a function of the recent tokens."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(SEED)
    config = Qwen3_5Config(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
    model = Qwen3_5ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
        for layer in model.model.language_model.layers:
            if hasattr(layer, "linear_attn"):  # g = -exp(A_log) * softplus(a + dt_bias): fixed, so the decay is
                attn = layer.linear_attn
                attn.in_proj_a.weight.zero_()
                attn.dt_bias.fill_(1.0)
                attn.A_log.fill_(math.log(-math.log(DECAY) / math.log1p(math.e)))
            else:  # the full-attention layer reads the whole prompt: it adds nothing
                layer.self_attn.o_proj.weight.zero_()
        model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight * OTHER_ROWS)
    return model


def _fit_head(model, contexts: Contexts, examples: int, steps: int) -> dict:
    """Fits the head's rows for the answers' tokens to the body's hidden states at the answers'
    positions; the other rows' share of each softmax is a constant, computed once."""
    import torch

    states, targets = [], []
    with torch.no_grad():
        for k in range(examples):
            context, answer = contexts.example(second=bool(k % 2))
            hidden = model.model(input_ids=torch.tensor([context + answer[:-1]])).last_hidden_state[0]
            states.append(hidden[len(context) - 1:])
            targets += answer
    states = torch.cat(states)
    head = model.get_output_embeddings().weight
    rows = sorted(set(targets))
    index = {token: n for n, token in enumerate(rows)}
    labels = torch.tensor([index[t] for t in targets])
    with torch.no_grad():  # the softmax's share of every other row: they are not fitted, so it stays
        parts = []
        for start in range(0, len(states), 256):
            logits = states[start:start + 256] @ head.T
            logits[:, rows] = float("-inf")
            parts.append(torch.logsumexp(logits, dim=-1))
        rest = torch.cat(parts)
    fitted = head[rows].detach().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([fitted], lr=0.05)
    for _ in range(steps):
        logits = torch.cat([states @ fitted.T, rest[:, None]], dim=1)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        head[rows] = fitted
        logits = torch.cat([states @ fitted.T, rest[:, None]], dim=1)
        least = torch.softmax(logits, dim=-1).gather(1, labels[:, None]).min().item()
    return {"rows": len(rows), "positions": len(targets), "loss": round(loss.item(), 8), "least_p": least}


def _check(model, contexts: Contexts) -> list[dict]:
    """Greedy decoding after long random prefixes writes each answer exactly, every token likely."""
    import torch

    checks = []
    for second in (False, True):
        for length in (20, 2000):
            context, answer = contexts.example(second, length)
            with torch.no_grad():
                out = model.generate(torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                                     max_new_tokens=len(answer) + 4, do_sample=False, eos_token_id=[IM_END],
                                     pad_token_id=IM_END, output_scores=True, return_dict_in_generate=True)
            written = out.sequences[0, len(context):].tolist()
            least = min(torch.softmax(s[0].float(), -1).max().item() for s in out.scores)
            checks.append({"second": second, "prefix": length, "exact": written == answer, "least_p": round(least, 6)})
    bad = [c for c in checks if not c["exact"] or c["least_p"] < 0.999]
    if bad:
        raise RuntimeError(f"the tiny agent does not write its answers: {bad}")
    return checks


def _build(out: Path, tokenizer_dir: Path, config_dict: dict) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from tiny_models import copy_tokenizer

    copy_tokenizer(tokenizer_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    contexts = Contexts(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], SEED)
    torch.set_num_threads(2)
    model = _body(config_dict)
    fit = _fit_head(model, contexts, examples=48, steps=600)
    checks = _check(model, contexts)
    model.save_pretrained(out, safe_serialization=True)
    # Greedy decoding, as the checkpoint's own choice (the family's sampling defaults give way to it).
    write_json(out / "generation_config.json", {"do_sample": False, "eos_token_id": [IM_END, 248044],
                                                "pad_token_id": 248044})
    return {"fit": fit, "checks": checks}


def agent_checkpoint() -> Path:
    tokenizer_dir = qwen3_5_tokenizer_dir()
    config_dict = qwen3_5_config_dict(tie_word_embeddings=False)
    params = {"config": config_dict, "seed": SEED, "decay": DECAY, "other_rows": OTHER_ROWS, "first": FIRST,
              "second": SECOND, "asked": ASKED, "version": AGENT_VERSION, "tokenizer": tokenizer_dir.name}
    return cached("qwen3_5-agent", params, lambda out: _build(out, tokenizer_dir, config_dict))


def nudged(checkpoint: Path, out: Path, scale: float, seed: int = 7) -> Path:
    """A copy of `checkpoint` with every weight matrix moved by noise of `scale` times its own spread."""
    import torch
    from safetensors.torch import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(checkpoint, out)
    weights = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    for name in sorted(weights):
        tensor = weights[name]
        if tensor.dim() >= 2 and tensor.is_floating_point() and tensor.std() > 0:
            weights[name] = tensor + torch.randn(tensor.shape, generator=generator) * tensor.std() * scale
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out
