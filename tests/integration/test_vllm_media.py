"""Media through the vLLM backend (issue 14): the generate route's `content_parts`.

vLLM 0.33's /inference/v1/generate takes items beside token ids: `content_parts` of
{"type": "image_url" | "audio_url" | "video_url", "url": ...}, resolved by the server, whose
processor expands each item's placeholder in `token_ids`. So looptrace sends the prompt as the
template writes it (one placeholder per item) with the items as data URLs, asks for the expanded
prompt back (`return_token_ids`) and compares it with its own processor's. The double (tests/
vllm_double.py) expands as vLLM does: on ids, each item's replacement from the checkpoint's
processor. /v1/completions takes no media: a server on that route refuses them, saying why.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image
from transformers import AutoTokenizer

from server import Server, free_port
from tiny_media import mp4, with_images
from vllm_double import DoubleProcess

KEY = "double-key"


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def setup(qwen3_5_dir, tmp_path_factory):
    """A double serving the tiny Qwen3.5 with its image and video processors, and two looptrace
    servers in front: one that found the generate route, one that found only /v1/completions."""
    logs = tmp_path_factory.mktemp("vllm-media")
    folder = with_images(qwen3_5_dir, "qwen3_5")
    double = DoubleProcess(folder, port=free_port(), log_path=logs / "double.log", api_key=KEY)
    servers = []
    try:
        double.wait_ready()
        for scale_out in ("on", "off"):
            double.configure(scale_out=scale_out)
            server = Server("--backend", "vllm", "--vllm-url", double.url + "/v1", "--vllm-api-key", KEY,
                            log_dir=logs)
            servers.append(server)
            server.wait_ready()
        double.configure(scale_out="on")
        yield folder, double, servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()
        double.stop()


def generated(double: DoubleProcess) -> list[dict]:
    return [r for r in double.requests() if r["path"] == "/inference/v1/generate" and r["body"]]


def attached(text: str, *parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def test_items_go_as_content_parts_beside_the_templates_ids(setup):
    folder, double, server, _ = setup
    double.configure(media_delta=0)
    double.reset()
    image, video = data_url(png(), "image/png"), data_url(mp4(), "video/mp4")
    model = server.get("/health")[1]["model"]
    messages = attached("Compare these.", {"type": "image_url", "image_url": {"url": image}},
                        {"type": "video_url", "video_url": {"url": video}})
    before = server.newest_trace_id()
    status, answer = server.post("/v1/chat/completions", {
        "model": model, "messages": messages, "max_tokens": 8, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200, answer
    (sent,) = generated(double)
    body = sent["body"]
    # The prompt as the template writes it, each item one placeholder, as vLLM's own renderer would.
    tokenizer = AutoTokenizer.from_pretrained(folder)
    template = tokenizer.apply_chat_template(
        attached("Compare these.", {"type": "image"}, {"type": "video"}), add_generation_prompt=True,
        tokenize=True, return_dict=True, enable_thinking=False)["input_ids"]
    assert body["token_ids"] == template
    pads = [tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>")]
    assert [body["token_ids"].count(p) for p in pads] == [1, 1]
    assert body["content_parts"] == [{"type": "image_url", "url": image}, {"type": "video_url", "url": video}]
    assert body["return_token_ids"] is True
    # What the double expanded the items into is the prompt this server traced, token for token.
    trace = server.trace_after(before)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    prefill = next(s for s in trace["spans"] if s["name"] == "prefill")["attributes"]
    ids = render["looptrace.prompt.ids"]
    assert prefill["looptrace.prefill.upstream_prompt_tokens"] == len(ids) == prefill["looptrace.prefill.prompt_tokens"]
    assert "looptrace.prefill.upstream_differs_at" not in prefill
    items = json.loads(render["looptrace.prompt.media"])
    assert [i["kind"] for i in items] == ["image", "video"] and all(i["tokens"] > 0 for i in items)
    assert ids.count(pads[0]) == items[0]["tokens"] and ids.count(pads[1]) == items[1]["tokens"]
    # The answer is what the double generated from that prompt.
    text = tokenizer.decode(sent["token_ids"], skip_special_tokens=False)
    assert answer["choices"][0]["message"]["content"] in text


def test_responses_items_go_the_same_way(setup):
    _, double, server, _ = setup
    double.configure(media_delta=0)
    double.reset()
    image = data_url(png(), "image/png")
    model = server.get("/health")[1]["model"]
    status, answer = server.post("/v1/responses", {"model": model, "max_output_tokens": 4, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                     {"type": "input_image", "image_url": image}]}]})
    assert status == 200, answer
    (sent,) = generated(double)
    assert sent["body"]["content_parts"] == [{"type": "image_url", "url": image}]


def test_a_server_that_expands_otherwise_is_traced_and_said(setup):
    # The trace holds this server's expansion; where vLLM's differs, the prefill span says from where.
    _, double, server, _ = setup
    double.configure(media_delta=3)
    try:
        before = server.newest_trace_id()
        model = server.get("/health")[1]["model"]
        status, answer = server.post("/v1/chat/completions", {"model": model, "max_tokens": 2, "messages": attached(
            "What is it?", {"type": "image_url", "image_url": {"url": data_url(png(), "image/png")}})})
        assert status == 200, answer
        trace = server.trace_after(before)
    finally:
        double.configure(media_delta=0)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    prefill = next(s for s in trace["spans"] if s["name"] == "prefill")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert prefill["looptrace.prefill.upstream_prompt_tokens"] == render["looptrace.prompt.tokens"] + 3
    assert prefill["looptrace.prefill.upstream_differs_at"] == item["offset"] + item["tokens"]
    assert "expanded the media" in server.log()


def test_a_server_without_the_generate_route_refuses_media(setup):
    _, double, _, on_completions = setup
    model = on_completions.get("/health")[1]["model"]
    status, error = on_completions.post("/v1/chat/completions", {"model": model, "max_tokens": 2, "messages": attached(
        "What is it?", {"type": "image_url", "image_url": {"url": data_url(png(), "image/png")}})})
    assert status == 400, error
    assert error["error"]["code"] == "media_unsupported" and "--enable-scale-out" in error["error"]["message"]
    assert error["error"]["param"] == "messages[0].content[1].image_url.url"
    # Text still goes through it.
    status, answer = on_completions.post("/v1/chat/completions", {"model": model, "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}]})
    assert status == 200, answer
