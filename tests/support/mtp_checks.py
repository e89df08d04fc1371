"""What the MTP drafter tests (tests/unit/test_speculative_mtp.py) share: decoding through the local
backend with a drafter, recording what it guessed; the guesses a drafter should make, computed
another way (one full forward pass of the model over the finished sequence, then the drafter over
every position at once); and drafters whose random weights are fitted, by least squares, to guess
the model's own output for part of it, so that drafts are accepted there and rejected elsewhere.
"""

from __future__ import annotations

import asyncio

import torch

from looptrace.backends.speculative import mtp_gemma4, mtp_qwen3_5
from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.speculative.config import SpeculativeConfig

import load_once

GREEDY = SamplingParams(temperature=0)


def collect(backend: LocalBackend, request: DecodeRequest) -> list[dict]:
    async def run():
        return [event async for event in backend.generate(request)]

    return asyncio.run(run())


def tokens(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "token"]


def marks(events: list[dict]) -> str:
    """Each token: `.` not drafted, `A` a draft that stood, `x` where a draft was rejected."""
    return "".join("." if not e["drafted"] else "A" if e["accepted"] else "x" for e in tokens(events))


def plain_ids(model, tokenizer, prompt: list[int], count: int) -> list[int]:
    backend = LocalBackend(model, load_once.vocabulary(tokenizer))
    ids = [e["id"] for e in tokens(collect(backend, DecodeRequest(prompt, count, GREEDY, frozenset())))]
    asyncio.run(backend.close())
    return ids


def speculate(model, tokenizer, drafting, prompt: list[int], count: int, drafts: int = 3,
              sampling: SamplingParams = GREEDY) -> list[dict]:
    config = SpeculativeConfig.parse(f'{{"method": "mtp", "num_speculative_tokens": {drafts}}}')
    backend = LocalBackend(model, load_once.vocabulary(tokenizer), speculative=config, mtp=drafting)
    events = collect(backend, DecodeRequest(prompt, count, sampling, frozenset()))
    asyncio.run(backend.close())
    return events


class FirstGuesses:
    """Records, for each proposal a drafter class makes, the sequence's length then and the logits of
    its first draft (patched in with monkeypatch)."""

    def __init__(self, monkeypatch, drafter_class) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []
        propose, choose = drafter_class.propose, drafter_class._choose
        guesses = self

        def recording_propose(drafter, count):
            drafter._first = True
            return propose(drafter, count)

        def recording_choose(drafter, logits, probs):
            if getattr(drafter, "_first", False):
                guesses.seen.append((len(drafter.ids), logits.clone()))
                drafter._first = False
            return choose(drafter, logits, probs)

        monkeypatch.setattr(drafter_class, "propose", recording_propose)
        monkeypatch.setattr(drafter_class, "_choose", recording_choose)


# -- Qwen3.5's MTP layer --

def qwen_reference(model, drafting: mtp_qwen3_5.Qwen3_5Drafting, ids: list[int]) -> torch.Tensor:
    """The MTP layer's logits at every position of `ids` but the last, from one forward pass of the
    model (its last hidden state, after the final norm) and one of the layer over all of them:
    row i guesses ids[i + 2]."""
    from transformers import DynamicCache

    mtp = drafting.mtp
    with torch.inference_mode():
        hidden = model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states[-1]
        embeds = model.get_input_embeddings()(torch.tensor([ids[1:]]))
        out = mtp(embeds, hidden, torch.arange(len(ids) - 1), DynamicCache(config=mtp.config),
                  model.get_decoder().rotary_emb)
        return model.get_output_embeddings()(out)[0].float()


def fit_qwen(model, drafting: mtp_qwen3_5.Qwen3_5Drafting, ids: list[int], upto: int) -> None:
    """Makes the layer guess ids[i + 2] at the first `upto` positions: its decoder layer made a
    pass-through (attention and MLP outputs zeroed), `fc` solved by least squares so that its output
    points along the guessed token's embedding (the LM head is the tied embedding)."""
    mtp = drafting.mtp
    layer = mtp.layers[0]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        hidden = model(input_ids=torch.tensor([ids[:upto]]), output_hidden_states=True).hidden_states[-1][0]
        embed = model.get_input_embeddings().weight
        inputs = torch.cat((mtp.pre_fc_norm_embedding(embed[ids[1:upto + 1]]), mtp.pre_fc_norm_hidden(hidden)), dim=-1)
        wanted = embed[ids[2:upto + 2]]
        mtp.fc.weight.copy_(torch.linalg.lstsq(inputs, wanted).solution.T)


# -- Gemma 4's assistant --

def gemma_reference(model, drafting: mtp_gemma4.AssistantDrafting, ids: list[int]) -> torch.Tensor:
    """The assistant's first guess after `ids`: the model run over ids[:-1] (fresh), its last hidden
    state and its shared keys and values (a sliding-window layer's: its window), the embedding of
    ids[-1], at ids[-1]'s position."""
    from looptrace.backends.speculative.taps import HiddenTap, SharedKVTap

    hidden_tap, kv_tap = HiddenTap(model), SharedKVTap(model)
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids[:-1]]))
            hidden = hidden_tap.take()[-1][-1:][None]
            embedded = model.get_input_embeddings()(torch.tensor([[ids[-1]]]))
            window = model.config.get_text_config().sliding_window
            shared = {kind: (keys[:, :, -window:], values[:, :, -window:]) if kind == "sliding_attention" else
                      (keys, values) for kind, (keys, values) in kv_tap.states.items()}
            out = drafting.assistant(inputs_embeds=torch.cat((embedded, hidden), dim=-1),
                                     position_ids=torch.tensor([[len(ids) - 1]]), shared_kv_states=shared)
            return out.logits[0, -1].float()
    finally:
        hidden_tap.close()
        kv_tap.close()


def fit_gemma(model, drafting: mtp_gemma4.AssistantDrafting, ids: list[int], start: int, upto: int,
              attention: float = 1e-4) -> None:
    """Makes the assistant guess ids[i + 2] from [embedding of ids[i + 1], the model's hidden state at
    i], for i from `start` to `upto`: its layers made nearly pass-throughs (MLPs off, attention
    scaled down to `attention`: what it reads of the model's keys and values still shows in the
    logits), `pre_projection` solved by least squares so that its state points along the guessed
    token's embedding, and each guessed token's cluster given that direction too, so that the
    clustered output scores it in full."""
    from looptrace.backends.speculative.taps import HiddenTap

    assistant = drafting.assistant
    tap = HiddenTap(model)
    try:
        with torch.no_grad():
            for layer in assistant.model.layers:
                layer.self_attn.o_proj.weight.mul_(attention)
                layer.mlp.down_proj.weight.zero_()
            model(input_ids=torch.tensor([ids[:upto + 1]]), logits_to_keep=0)
            hidden = tap.take()[-1][start:upto + 1]
            embedded = model.get_input_embeddings()(torch.tensor(ids[start + 1:upto + 2]))
            inputs = torch.cat((embedded, hidden), dim=-1)
            table = assistant.lm_head.weight
            guessed = torch.tensor(ids[start + 2:upto + 3])
            projection = torch.linalg.lstsq(inputs, table[guessed] * 8).solution.T
            assistant.pre_projection.weight.copy_(projection)
            embedder = assistant.masked_embedding
            clusters = embedder.token_ordering.view(embedder.num_centroids, -1)
            owner = {int(t): c for c, row in enumerate(clusters) for t in row}
            embedder.centroids.weight.zero_()
            for token in guessed.tolist():
                embedder.centroids.weight[owner[token]] += table[token]
    finally:
        tap.close()
