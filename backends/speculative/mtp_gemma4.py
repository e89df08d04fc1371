"""Gemma 4's drafter: its assistant checkpoint (`google/gemma-4-E2B-it-assistant`,
`Gemma4AssistantForCausalLM` in transformers), run in a drafting loop of looptrace's own.

What the assistant is (transformers' Gemma4AssistantForCausalLM and its candidate generator): four
decoder layers at hidden size 256 beside the model's 1536, all of them KV-shared, so it has no keys
and values of its own and no cache: its queries attend to the model's, those of the model's last
full-attention and last sliding-window layer that keep theirs (`shared_kv_states`; taps.SharedKVTap
takes them from the model's forward pass). Each step is fed [the model's input embedding of the
newest token, the model's last hidden state before it] (taps.HiddenTap), projected down
(`pre_projection`), and returns its guess of the next token and a state projected back up
(`post_projection`) that stands for the model's hidden state at the next step; its position stays
that of the newest token. Its output is clustered (`use_ordered_embeddings`): 262,144 tokens in
2,048 clusters of 128; the 32 clusters its centroids score highest are scored in full, every other
token gets the lowest score. `num_assistant_tokens: 6` in its generation config is the draft length
when --speculative-config gives none.

After a verification pass the model's hidden state at the last token that stood, and its keys and
values without the positions of the rejected drafts, are what the next draft reads; of a sliding-
window layer's, always the last `sliding_window` positions. (transformers' candidate generator
differs there: its bidirectional window is inclusive, so it reads `sliding_window` + 1 positions
where a pass returned more, after prefill and after a pass of several tokens, and `sliding_window`
after a one-token step; and it keeps rejected drafts' keys of the sliding layer. Which one the
assistant was trained with is not known here: it changes what is drafted, never the output.) Gemma
4's cache rolls back as for any draft (speculative.Rollback); the assistant keeps nothing to roll
back.
"""

from __future__ import annotations

import torch

from ..sampling import draft_choice
from .taps import HiddenTap, SharedKVTap


def load_gemma4_assistant(folder, model) -> AssistantDrafting:
    """The assistant checkpoint in `folder`, beside the loaded Gemma 4 `model` (its dtype and device);
    a ValueError says why it cannot draft for it."""
    try:
        from transformers import Gemma4AssistantForCausalLM
    except ImportError as exc:  # transformers before 5.24
        raise ValueError("--speculative-config: method mtp on Gemma 4 needs transformers' "
                         "Gemma4AssistantForCausalLM, which this transformers lacks") from exc
    parameter = next(model.parameters())
    assistant = Gemma4AssistantForCausalLM.from_pretrained(folder, dtype=parameter.dtype)
    text = model.config.get_text_config()
    if assistant.config.backbone_hidden_size != text.hidden_size:
        raise ValueError(f"--speculative-config: the assistant {folder} was trained beside a model of hidden size "
                         f"{assistant.config.backbone_hidden_size}; this one's is {text.hidden_size}")
    if assistant.config.get_text_config().vocab_size != text.vocab_size:
        raise ValueError(f"--speculative-config: the assistant {folder} writes another vocabulary than the model's")
    SharedKVTap(model).close()  # refuses a model whose layers keep no keys and values to share
    tokens = getattr(assistant.generation_config, "num_assistant_tokens", None) or 6
    return AssistantDrafting(assistant.to(parameter.device).eval(), int(tokens))


class AssistantDrafting:
    """The loaded assistant, as the local backend holds it: a drafter for each request."""

    def __init__(self, assistant, tokens: int) -> None:
        self.assistant = assistant
        self.tokens = tokens  # drafts a pass when --speculative-config gives no num_speculative_tokens

    def drafter(self, model, prompt_ids: list[int], sampling, generator) -> AssistantDrafter:
        return AssistantDrafter(self.assistant, model, prompt_ids, sampling, generator)


class AssistantDrafter:
    """One request's drafts from the assistant (see the module's docstring). Made before the prompt
    is prefilled, so that its taps see the prefill."""

    def __init__(self, assistant, model, prompt_ids: list[int], sampling, generator) -> None:
        self.assistant, self.sampling, self.generator = assistant, sampling, generator
        self.embed = model.get_input_embeddings()
        self.device = next(assistant.parameters()).device
        self.hidden_tap, self.kv_tap = HiddenTap(model), SharedKVTap(model)
        self.ids: list[int] = list(prompt_ids)
        self.window = model.config.get_text_config().sliding_window
        self.hidden: torch.Tensor | None = None  # the model's last hidden state, (1, 1, hidden)
        self.shared: dict = {}  # its keys and values, as the assistant reads them
        self.probs: list[torch.Tensor] | None = None

    def prefilled(self, cached: int) -> None:
        """Nothing to do: the model's cache holds every position, however it got there."""

    def append(self, token: int) -> None:
        self.ids.append(token)

    def _latest(self) -> None:
        """The state after the model's latest plain pass (prefill or a one-token step), if one ran."""
        chunks = self.hidden_tap.take()
        if chunks:
            self.hidden = chunks[-1][-1:][None]
            self.shared = windowed(self.kv_tap.states, 0, self.window)

    def propose(self, count: int) -> list[int]:
        self._latest()
        if self.hidden is None or count < 1:  # nothing computed yet: the prefix cache held the whole prompt
            return []
        token, hidden = self.ids[-1], self.hidden
        position = torch.tensor([[len(self.ids) - 1]], device=self.device)  # the newest token's, for every step
        drafts, probs = [], []
        for _ in range(count):
            embedded = self.embed(torch.tensor([[token]], device=self.device))
            out = self.assistant(inputs_embeds=torch.cat((embedded, hidden), dim=-1), position_ids=position,
                                 shared_kv_states=self.shared)
            hidden = out.last_hidden_state
            token = self._choose(out.logits[0, -1].float(), probs)
            drafts.append(token)
        self.probs = probs or None
        return drafts

    def _choose(self, logits: torch.Tensor, probs: list) -> int:  # one draft (the tests record each first)
        return draft_choice(logits, self.sampling, self.generator, probs)

    def verified(self, accepted: int) -> None:
        """After the model's pass over the newest token and `accepted` drafts that stood (and the rest):
        its hidden state at the last that stood, its keys and values without the rejected ones."""
        chunk = self.hidden_tap.take()[-1]
        self.hidden = chunk[accepted:accepted + 1][None]
        self.shared = windowed(self.kv_tap.states, chunk.shape[0] - accepted - 1, self.window)

    def finish(self) -> None:
        self.hidden_tap.close()
        self.kv_tap.close()


def windowed(states: dict, drop: int, window: int) -> dict:
    """The model's shared keys and values as the assistant reads them: the last `drop` positions (rejected
    drafts) left out, and a sliding-window layer's cut to its window."""
    out = {}
    for kind, (keys, values) in states.items():
        end = keys.shape[2] - drop
        start = max(end - window, 0) if kind == "sliding_attention" else 0
        out[kind] = (keys[:, :, start:end], values[:, :, start:end])
    return out
