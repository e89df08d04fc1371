"""looptrace's own routes' bodies (proxy/api/native/protocol.py): each wrong type is a 400 naming its place."""

from __future__ import annotations

import pytest

from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.native.protocol import ForkRequest, GenerateRequest, ScoreRequest
from looptrace.proxy.api.protocol import parse


@pytest.mark.parametrize(("model", "body", "param", "code"), [
    (ForkRequest, {}, "index", "missing_required_parameter"),
    (ForkRequest, {"index": True}, "index", "invalid_type"),
    (ForkRequest, {"index": 0, "token_id": "1"}, "token_id", "invalid_type"),
    (ForkRequest, {"index": 0, "text": 1}, "text", "invalid_type"),
    (ForkRequest, {"index": 0, "max_tokens": 0}, "max_tokens", "invalid_value"),
    (ForkRequest, {"index": 0, "temperature": 9}, "temperature", "invalid_value"),
    (ForkRequest, {"index": 0, "top_p": 1.5}, "top_p", "invalid_value"),
    (ForkRequest, {"index": 0, "top_k": -3}, "top_k", "invalid_value"),
    (ForkRequest, {"index": 0, "seed": -(2**63) - 1}, "seed", "invalid_value"),
    (GenerateRequest, {}, "prompt_ids", "missing_required_parameter"),
    (GenerateRequest, {"prompt_ids": "1 2"}, "prompt_ids", "invalid_type"),
    (GenerateRequest, {"prompt_ids": [1, 2.5]}, "prompt_ids[1]", "invalid_type"),
    (GenerateRequest, {"prompt_ids": [1], "answer_prefix": [True]}, "answer_prefix[0]", "invalid_type"),
    (GenerateRequest, {"prompt_ids": [1], "thinking": "yes"}, "thinking", "invalid_type"),
    (GenerateRequest, {"prompt_ids": [1], "model": 3}, "model", "invalid_type"),
    (GenerateRequest, {"prompt_ids": [1], "tools": [{"type": "web_search"}]}, "tools[0].type", "invalid_value"),
    (GenerateRequest, {"prompt_ids": [1], "tools": [{"function": {"name": "a b"}}]}, "tools[0].function.name",
     "invalid_value"),
    (GenerateRequest, {"prompt_ids": [1], "tools": [{}] * 4097}, "tools", "too_many_items"),
    (ScoreRequest, {"prompt_ids": [1]}, "answer_ids", "missing_required_parameter"),
    (ScoreRequest, {"prompt_ids": [1], "answer_ids": [None]}, "answer_ids[0]", "invalid_type"),
])
def test_each_wrong_field_is_a_400_naming_it(model, body, param, code):
    with pytest.raises(APIError) as caught:
        parse(model, body)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code), caught.value.message


def test_nulls_are_absent_and_extras_kept():
    fork = parse(ForkRequest, {"index": 2, "token_id": None, "text": "x", "temperature": None, "note": 1})
    assert (fork.index, fork.token_id, fork.text, fork.temperature, fork.model_extra) == (2, None, "x", None, {"note": 1})
