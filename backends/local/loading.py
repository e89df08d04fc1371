"""Loading the local backend: its Loader (registry.py), the weights, device and dtype chosen once, here."""

from __future__ import annotations

import logging
from functools import partial

import torch

from looptrace.common.checkpoint import Checkpoint, fetch, read_config
from looptrace.common.vocabulary import Vocabulary

from ..base import Loader, TextModel
from ..speculative.config import SpeculativeConfig
from ..speculative.drafters import mtp_loader
from .backend import LocalBackend

log = logging.getLogger("looptrace")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    # float32 on a CPU keeps greedy output identical to generate() in full precision; a GPU gets bfloat16.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(checkpoint: Checkpoint, *, dtype: str = "auto", device: str = "auto", media: bool = False):
    """`media`: the model must see images, so its vision tower is loaded too (the causal-LM class of
    some families, Qwen3.5's, is the language model alone)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    folder = fetch(checkpoint)
    log.info("loading weights from %s (%s, %s)", folder, torch_dtype, target)
    auto = AutoModelForImageTextToText if media else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=torch_dtype, **checkpoint.load_kwargs())
    return model.to(target).eval()


def load_local(checkpoint: Checkpoint, vocab: Vocabulary, settings, max_model_len: int, *,
               media: bool = False) -> LocalBackend:
    graph_length = 0 if settings.enforce_eager else max_model_len
    speculative = SpeculativeConfig.parse(settings.speculative_config) if settings.speculative_config else None
    drafter = mtp = None
    if speculative is not None and speculative.method == "draft_model":
        draft = read_config(speculative.model, None)
        same_tokenizer(draft, vocab.tokenizer)
        drafter = partial(load_model, draft, dtype=settings.dtype, device=settings.device)
    if speculative is not None and speculative.method == "mtp":
        mtp = mtp_loader(checkpoint, speculative)
    # Loaded by the backend on its decode thread, the one thread that will ever run it.
    return LocalBackend(lambda: load_model(checkpoint, dtype=settings.dtype, device=settings.device, media=media), vocab,
                        max_queue=settings.max_queue, graph_max_length=graph_length,
                        prefix_cache_tokens=settings.prefix_cache_tokens,
                        prefix_cache_bytes=int(settings.prefix_cache_mb * 1024**2),
                        speculative=speculative, drafter=drafter, mtp=mtp)


def same_tokenizer(draft: Checkpoint, tokenizer) -> None:
    """A draft model must read and write the target's token ids: its vocabulary must be the same."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(fetch(draft), **draft.load_kwargs()).get_vocab()
    ours = tokenizer.get_vocab()
    if theirs != ours:
        differ = len(set(theirs.items()) ^ set(ours.items()))
        raise ValueError(f"--speculative-config: the draft model {draft.source} has another tokenizer than the "
                         f"model's ({differ} entries differ): a draft model must share the model's tokenizer")


class LocalLoader(Loader):
    """MODEL is the checkpoint, weights and all; its context is the checkpoint's."""

    def load(self, model: TextModel) -> LocalBackend:
        # torch and the model classes are imported only when this process decodes.
        return load_local(model.checkpoint, model.vocab, self.settings, model.max_model_len, media=model.media)
