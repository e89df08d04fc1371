"""Images reach the model (issue 14, its first part): both APIs, the local backend, the tiny Qwen3.5
and Gemma 4 with their real processors' image settings (tests/support/tiny_media.py).

An image request puts the processor's image tokens into the prompt and its pixels into prefill: the
greedy answer equals `model.generate()` on the same processor inputs. Every bad item is a 400 that
names the part; a model without image preprocessing says it takes text only. The render span
describes each item.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from PIL import Image

from looptrace.proxy.settings import Settings

import load_once
from app_thread import AppThread
from tiny_media import mp4, with_images

NEW_TOKENS = 6


def png(width=64, height=48, color=(200, 30, 30), mode="RGB", fmt="PNG") -> bytes:
    out = io.BytesIO()
    image = Image.new(mode, (width, height), color)
    for x in range(0, width, 8):  # not a flat colour: the pixels must matter
        image.putpixel((x, x * height // width), (0, 0, 255) if mode == "RGB" else 0)
    image.save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module", params=["qwen3_5", "gemma4"])
def served(request, tmp_path_factory):
    folder = with_images(request.getfixturevalue(f"{request.param}_dir"), request.param)
    app = AppThread(Settings(model=str(folder), served_model_name="m", media_max_items=3, media_max_pixels=1_000_000,
                             media_max_video_frames=32, trace_db=str(tmp_path_factory.mktemp("media") / "traces.sqlite3"))).start()
    yield request.param, folder, app
    app.stop()


def chat_body(parts: list, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": NEW_TOKENS,
            "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}, **extra}


def post(app, path: str, body: dict) -> tuple[int, dict, dict | None]:
    """(status, answer, the request's stored trace when it reached the model). The request carries a
    traceparent of its own, so its trace is found by id (not as "the newest", which an earlier
    refused request's trace, written late, could be)."""
    import secrets

    trace_id = secrets.token_hex(16)
    headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    status, answer = app.call("POST", path, body, headers=headers)
    if status != 200:
        return status, answer, None
    return status, answer, app.stored(f"/v1/traces/{trace_id}", timeout=30)


def generated_for(folder, messages: list[dict], **processor_kwargs) -> tuple[list[int], list[float], list[int]]:
    """What transformers itself generates for a conversation (PIL images, audio samples and video
    frames in its parts), from the checkpoint's processor: the greedy tokens, their logprobs, and the
    prompt ids."""
    from transformers import AutoModelForImageTextToText

    from looptrace.families import family_for_config
    from looptrace.families.media.processor import load_processor

    family = family_for_config(json.loads((folder / "config.json").read_text()))
    tokenizer = load_once.tokenizer(folder)
    processor = load_processor(folder, family.processor_class, tokenizer, {})
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt", enable_thinking=False,
                                           processor_kwargs=processor_kwargs or None)
    inputs.pop("video_metadata", None)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    prompt = inputs["input_ids"][0].tolist()
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(score[0].float(), -1)[t].item() for score, t in zip(out.scores, tokens)]
    return tokens, logprobs, prompt


def decoded_as(trace: dict, tokens: list[int], logprobs: list[float], how_many: int = 1) -> None:
    """The trace's decode span holds transformers' tokens, and its first `how_many` logprobs."""
    decode = next(s for s in trace["spans"] if s["name"] == "decode")
    assert [t["id"] for t in decode["tokens"]] == tokens
    got = [t["logprob"] for t in decode["tokens"]][:how_many]
    assert got == pytest.approx(logprobs[:how_many], abs=1e-3)


def media_tokens(folder, prompt: list[int], kind: str) -> int:
    from looptrace.families import family_for_config

    family = family_for_config(json.loads((folder / "config.json").read_text()))
    tokenizer = load_once.tokenizer(folder)
    ids = {tokenizer.convert_tokens_to_ids(t) for t, k in family.media_tokens.items() if k == kind}
    return sum(1 for i in prompt if i in ids)


def asking(text: str, kind: str, item) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, {"type": kind, kind: item}]}]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_image_reaches_the_model_as_generate_reads_it(served, api):
    _, folder, app = served
    data = png()
    image = Image.open(io.BytesIO(data)).convert("RGB")
    expected, logprobs, prompt = generated_for(folder, asking("What is this?", "image", image))
    image_tokens = media_tokens(folder, prompt, "image")
    assert image_tokens > 16 and len(set(expected)) > 1
    # The pixels matter to the model: another image, another distribution (so equality below means
    # the image reached prefill, not only its placeholder tokens).
    _, other, _ = generated_for(folder, asking("What is this?", "image", Image.new("RGB", (64, 48), (0, 255, 0))))
    assert abs(other[0] - logprobs[0]) > 1e-4
    if api == "chat":
        status, answer, trace = post(app, "/v1/chat/completions", chat_body(
            [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": data_url(data)}}]))
    else:
        status, answer, trace = post(app, "/v1/responses", {
            "model": "m", "max_output_tokens": NEW_TOKENS, "temperature": 0, "reasoning": {"effort": "none"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                    {"type": "input_image", "image_url": data_url(data)}]}]})
    assert status == 200, answer
    decoded_as(trace, expected, logprobs)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert (item["kind"], item["mime"], item["width"], item["height"], item["bytes"]) == ("image", "image/png", 64, 48,
                                                                                         len(data))
    assert item["tokens"] == image_tokens and item["offset"] > 0
    assert item["thumbnail"].startswith("data:image/jpeg;base64,") and len(item["thumbnail"]) < 8000
    assert render["looptrace.prompt.media.image_tokens"] == image_tokens
    # A fork would give the model the image's tokens without its pixels: refused, saying so.
    status, error = app.call("POST", f"/v1/traces/{trace['trace_id']}/fork", {"index": 0, "token_id": expected[0]})
    assert status == 400 and error["error"]["code"] == "trace_with_media", error
    root = next(s for s in trace["spans"] if "looptrace.endpoint" in s["attributes"])["attributes"]
    assert '"modality":"image"' in root["gen_ai.input.messages"].replace(" ", "")
    assert 'looptrace_media_items_total{kind="image",model="m"}' in _metrics(app) or \
        'looptrace_media_items_total{model="m",kind="image"}' in _metrics(app)


def _metrics(app) -> str:
    import urllib.request

    with urllib.request.urlopen(app.url + "/metrics", timeout=30) as response:
        return response.read().decode()


def test_an_image_typed_token_stays_text_and_the_count_holds(served):
    # A user who types the image placeholder gets text, not a second image slot.
    family, _, app = served
    typed = "<|image_pad|>" if family == "qwen3_5" else "<|image|>"
    status, answer, trace = post(app, "/v1/chat/completions", chat_body(
        [{"type": "text", "text": f"see {typed}"}, {"type": "image_url", "image_url": {"url": data_url(png())}}]))
    assert status == 200, answer
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert render["looptrace.prompt.media.image_tokens"] == item["tokens"]


def rgba_gif_and_exif() -> list[tuple[str, bytes, tuple[int, int]]]:
    """Palette, alpha and an EXIF rotation all come out as RGB of the right shape."""
    out = io.BytesIO()
    Image.new("RGBA", (40, 20), (10, 20, 30, 0)).save(out, "PNG")
    rgba = out.getvalue()
    out = io.BytesIO()
    frames = [Image.new("P", (30, 30), i) for i in range(3)]
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    gif = out.getvalue()
    out = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°: width and height swap
    Image.new("RGB", (50, 20), (1, 2, 3)).save(out, "JPEG", exif=exif)
    return [("image/png", rgba, (40, 20)), ("image/gif", gif, (30, 30)), ("image/jpeg", out.getvalue(), (20, 50))]


def test_alpha_palette_animation_and_orientation_are_read(served):
    _, _, app = served
    for mime, data, (width, height) in rgba_gif_and_exif():
        status, answer, trace = post(app, "/v1/chat/completions", chat_body(
            [{"type": "image_url", "image_url": {"url": data_url(data, mime)}}]))
        assert status == 200, (mime, answer)
        render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
        (item,) = json.loads(render["looptrace.prompt.media"])
        assert (item["width"], item["height"]) == (width, height), mime


BAD = {
    "not base64": ({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}, "invalid_media"),
    "not an image": ({"type": "image_url", "image_url": {"url": data_url(b"hello", "image/png")}}, "invalid_media"),
    "truncated": ({"type": "image_url", "image_url": {"url": data_url(png()[:60])}}, "invalid_media"),
    "too many pixels": ({"type": "image_url", "image_url": {"url": data_url(png(1100, 1000))}}, "media_too_large"),
    "a URL": ({"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}, "media_unsupported"),
    "a file URL": ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "media_unsupported"),
    "not base64 data URL": ({"type": "image_url", "image_url": {"url": "data:image/png,abc"}}, "invalid_media"),
    # A PDF is read as its pages' text (test_pdf_input.py); one that is only a header is broken.
    "a broken PDF": ({"type": "file", "file": {"file_data": data_url(b"%PDF-1.4", "application/pdf")}}, "invalid_file"),
    "audio": ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "media_unsupported"),
    "a corrupt video": ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "invalid_media"),
    "an image as video": ({"type": "video_url", "video_url": {"url": data_url(png())}}, "media_unsupported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_item_is_a_400_naming_its_part(served, case):
    _, _, app = served
    part, code = BAD[case]
    status, error = app.call("POST", "/v1/chat/completions", chat_body([{"type": "text", "text": "hi"}, part]))
    assert status == 400, error
    assert error["error"]["code"] == code and error["error"]["param"].startswith("messages[0].content[1]"), error
    assert app.call("GET", "/health")[0] == 200


def test_responses_refusals_name_their_part(served):
    _, _, app = served
    for part, code in (({"type": "input_image", "file_id": "file-1"}, "media_unsupported"),
                       ({"type": "input_image", "image_url": data_url(b"junk")}, "invalid_media")):
        status, error = app.call("POST", "/v1/responses", {"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}, part]}]})
        assert status == 400 and error["error"]["code"] == code, error
        assert error["error"]["param"].startswith("input[0].content[1]"), error


def test_too_many_items_is_a_400(served):
    _, _, app = served
    image = {"type": "image_url", "image_url": {"url": data_url(png())}}
    status, error = app.call("POST", "/v1/chat/completions", chat_body([image] * 4))
    assert status == 400 and error["error"]["code"] == "media_too_large" and "--media-max-items" in \
        error["error"]["message"], error


def test_a_text_only_model_says_so(replay_app):
    # The tiny Qwen3.5 without its image preprocessing: a text-only checkpoint.
    status, error = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png())}}]}]})
    assert status == 400 and error["error"]["code"] == "media_unsupported", error
    assert "text only" in error["error"]["message"]


def test_an_image_a_tool_returned_reaches_the_model(served):
    # codex's view_image, pi's read of a PNG: the image comes back in the tool's output. Qwen3.5's
    # template renders it there; Gemma 4's keeps only a tool output's text, so it moves into a user
    # message right after the tool results (as pi itself does on Chat Completions).
    family, _, app = served
    status, answer, trace = post(app, "/v1/chat/completions", {**chat_body([]), "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "the file:"},
                                                          {"type": "image_url", "image_url": {"url": data_url(png())}}]}]})
    assert status == 200, answer
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert item["param"] == "messages[2].content[1].image_url.url" and item["tokens"] > 16
    prompt = render["looptrace.prompt.text"]
    if family == "qwen3_5":
        assert prompt.index("<tool_response>") < prompt.index("<|vision_start|>") < prompt.index("</tool_response>")
    else:
        assert prompt.index("<tool_response|>") < prompt.index("<|turn>user\n<|image>")


def test_the_next_turn_reuses_the_image_s_state_and_another_image_does_not(served):
    # An agent's screenshot stays in every later turn: the prefix cache keeps the state after it, keyed
    # by the image's digest as well as the ids (the same text with another image is not a hit).
    _, folder, app = served
    red, green = png(), png(color=(20, 200, 40))
    first = [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                          {"type": "image_url", "image_url": {"url": data_url(red)}}]}]
    status, answer, _ = post(app, "/v1/chat/completions", {**chat_body([]), "messages": first})
    assert status == 200, answer
    # The next step of a tool loop: this prompt starts with the last one (test_prefix_cache.py).
    call = {"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}
    second = [*first, {"role": "assistant", "content": "", "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "c1", "content": "zoomed"}]
    status, answer, trace = post(app, "/v1/chat/completions", {**chat_body([]), "messages": second})
    assert status == 200, answer
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= item["offset"] + item["tokens"], (cached, item)
    image = Image.open(io.BytesIO(red)).convert("RGB")
    as_hf = [{"role": "user", "content": [{"type": "text", "text": "Describe it."}, {"type": "image", "image": image}]},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": {}}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "zoomed"}]
    tokens, logprobs, _ = generated_for(folder, as_hf)
    decoded_as(trace, tokens, logprobs, how_many=len(logprobs))

    other = json.loads(json.dumps(second).replace(data_url(red), data_url(green)))
    status, answer, _ = post(app, "/v1/chat/completions", {**chat_body([]), "messages": other})
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] < item["offset"] + 1


# -- audio: Gemma 4 with an audio tower (tiny_media.gemma4_with_audio) --

def wav(seconds=1.5, rate=16000, hz=440.0) -> bytes:
    """A mono 16-bit WAV: at the feature extractor's rate, so its samples are known exactly."""
    import wave

    import numpy as np

    t = np.arange(int(rate * seconds)) / rate
    samples = (0.4 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()


def samples_of(data: bytes):
    import wave

    import numpy as np

    with wave.open(io.BytesIO(data)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


@pytest.fixture(scope="module")
def with_audio(tmp_path_factory):
    from tiny_media import gemma4_with_audio

    folder = gemma4_with_audio()
    app = AppThread(Settings(model=str(folder), served_model_name="m", media_max_audio_seconds=2,
                             trace_db=str(tmp_path_factory.mktemp("audio") / "traces.sqlite3"))).start()
    yield folder, app
    app.stop()


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_audio_reaches_the_model_as_generate_reads_it(with_audio, api):
    folder, app = with_audio
    data = wav()
    expected, logprobs, prompt = generated_for(folder, asking("Transcribe.", "audio", samples_of(data)))
    assert media_tokens(folder, prompt, "audio") == 38  # ceil(1,500 ms / 40 ms), as the processor counts
    _, other, _ = generated_for(folder, asking("Transcribe.", "audio", samples_of(wav(hz=880.0))))
    assert abs(other[0] - logprobs[0]) > 1e-4  # the sound matters to the model
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    if api == "chat":
        body = chat_body([{"type": "text", "text": "Transcribe."}, part])
        status, answer, trace = post(app, "/v1/chat/completions", body)
    else:
        status, answer, trace = post(app, "/v1/responses", {
            "model": "m", "max_output_tokens": NEW_TOKENS, "temperature": 0, "reasoning": {"effort": "none"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Transcribe."}, part]}]})
    assert status == 200, answer
    decoded_as(trace, expected, logprobs)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert (item["kind"], item["mime"], item["seconds"], item["sampling_rate"], item["tokens"]) == (
        "audio", "audio/wav", 1.5, 16000, 38)
    assert render["looptrace.prompt.media.audio_tokens"] == 38


def test_compressed_audio_is_decoded_and_resampled(with_audio):
    import av
    import numpy as np

    _, app = with_audio
    # Stereo at the encoders' own rates, in the sample layouts they take (planar or interleaved).
    for fmt, codec, rate, layout in (("flac", "flac", 44100, "s16"), ("ogg", "libopus", 48000, "flt"),
                                     ("mp3", "libmp3lame", 44100, "fltp")):
        tone = np.stack([0.3 * np.sin(2 * np.pi * 330 * np.arange(int(rate * 1.2)) / rate)] * 2)
        samples = tone.T.reshape(1, -1) if layout in ("s16", "flt") else tone  # interleaved: one row
        samples = (samples * 32767).astype("<i2") if layout == "s16" else samples.astype(np.float32)
        out = io.BytesIO()
        with av.open(out, "w", format=fmt) as container:
            stream = container.add_stream(codec, rate=rate, layout="stereo")
            frame = av.AudioFrame.from_ndarray(samples, format=layout, layout="stereo")
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                container.mux(packet)
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(out.getvalue()).decode(), "format": fmt}}
        status, answer, trace = post(app, "/v1/chat/completions", chat_body([part]))
        assert status == 200, (fmt, answer)
        (item,) = json.loads(next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
                             ["looptrace.prompt.media"])
        assert item["seconds"] == pytest.approx(1.2, abs=0.06) and item["sampling_rate"] == 16000, (fmt, item)


def test_bad_audio_is_a_400_naming_its_part(with_audio):
    _, app = with_audio
    for audio, code in (({"data": base64.b64encode(b"not audio at all").decode(), "format": "wav"}, "invalid_media"),
                        ({"data": base64.b64encode(wav(seconds=3)).decode(), "format": "wav"}, "media_too_large"),
                        ({"data": base64.b64encode(wav()).decode()}, "missing_required_parameter")):
        status, error = app.call("POST", "/v1/chat/completions",
                                 chat_body([{"type": "input_audio", "input_audio": audio}]))
        assert status == 400 and error["error"]["code"] == code, error
        assert error["error"]["param"].startswith("messages[0].content[0].input_audio"), error


# -- URLs: fetched only from the hosts --allowed-media-domains lists --

@pytest.fixture(scope="module")
def files():
    """A plain HTTP server on 127.0.0.1 serving an image, a redirect, a text file and a large body."""
    import http.server
    import threading

    body = png()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            routes = {"/red.png": (200, "image/png", body), "/moved": (302, "text/plain", b""),
                      "/page.txt": (200, "text/plain", b"hello"), "/big.png": (200, "image/png", b"x" * 2_000_000),
                      "/missing.png": (404, "text/plain", b"")}
            status, mime, data = routes.get(self.path, (404, "text/plain", b""))
            self.send_response(status)
            self.send_header("Content-Type", mime)
            if status == 302:
                self.send_header("Location", "/red.png")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", body
    server.shutdown()


@pytest.fixture(scope="module")
def fetching(qwen3_5_dir, tmp_path_factory):
    folder = with_images(qwen3_5_dir, "qwen3_5")
    app = AppThread(Settings(model=str(folder), served_model_name="m", allowed_media_domains=["127.0.0.1"],
                             media_max_mb=1, trace_db=str(tmp_path_factory.mktemp("fetch") / "traces.sqlite3"))).start()
    yield app
    app.stop()


def test_an_image_url_from_a_listed_host_is_fetched(fetching, files):
    import hashlib

    base, body = files
    for part in ({"type": "image_url", "image_url": {"url": f"{base}/red.png"}},):
        status, answer, trace = post(fetching, "/v1/chat/completions", chat_body([part]))
        assert status == 200, answer
        (item,) = json.loads(next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
                             ["looptrace.prompt.media"])
        assert (item["sha256"], item["mime"], item["url"]) == (hashlib.sha256(body).hexdigest(), "image/png",
                                                               f"{base}/red.png")
    status, answer, _ = post(fetching, "/v1/responses", {"model": "m", "max_output_tokens": 2, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": f"{base}/red.png"}]}]})
    assert status == 200, answer


@pytest.mark.parametrize(("path", "code", "says"), [
    ("/moved", "media_fetch_failed", "redirects are not followed"), ("/missing.png", "media_fetch_failed", "404"),
    ("/page.txt", "invalid_media", "text/plain"), ("/big.png", "media_too_large", "--media-max-mb")])
def test_a_fetch_that_fails_is_a_400_naming_the_part(fetching, files, path, code, says):
    base, _ = files
    status, error = fetching.call("POST", "/v1/chat/completions", chat_body(
        [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": base + path}}]))
    assert status == 400 and error["error"]["code"] == code and says in error["error"]["message"], error
    assert error["error"]["param"] == "messages[0].content[1].image_url.url"


def test_hosts_not_listed_are_never_fetched(fetching, files, served):
    base, _ = files
    port = base.rsplit(":", 1)[1]
    for url in (f"http://localhost:{port}/red.png", f"http://127.0.0.2:{port}/red.png", "http://example.com/x.png"):
        status, error = fetching.call("POST", "/v1/chat/completions", chat_body(
            [{"type": "image_url", "image_url": {"url": url}}]))
        assert status == 400 and error["error"]["code"] == "media_unsupported", error
        assert "--allowed-media-domains" in error["error"]["message"]
    _, _, app = served  # a server that lists none fetches nothing, not even from this machine
    status, error = app.call("POST", "/v1/chat/completions", chat_body(
        [{"type": "image_url", "image_url": {"url": f"{base}/red.png"}}]))
    assert status == 400 and "(none)" in error["error"]["message"], error


def test_a_listed_name_that_resolves_to_a_private_address_is_refused():
    # DNS rebinding: a listed public name pointed at this machine. Only a host listed as itself (an
    # IP, or localhost) may reach a loopback or private address.
    import asyncio

    from looptrace.proxy.api.media_fetch import _CheckedResolver

    class Fixed(_CheckedResolver):
        def __init__(self, allowed, addresses):
            super().__init__(allowed)
            self._addresses = addresses

        async def resolve(self, host, port=0, family=0):
            self._inner.resolve = self._fake
            return await super().resolve(host, port, family)

        async def _fake(self, host, port, family):
            return [{"host": a, "port": port, "hostname": host} for a in self._addresses]

    async def resolved(allowed, host, addresses):
        try:
            return [a["host"] for a in await Fixed(frozenset(allowed), addresses).resolve(host, 80)]
        except OSError:
            return None

    run = asyncio.run
    assert run(resolved({"media.example"}, "media.example", ["127.0.0.1"])) is None
    assert run(resolved({"media.example"}, "media.example", ["10.1.2.3", "93.184.216.34"])) == ["93.184.216.34"]
    assert run(resolved({"media.example"}, "media.example", ["169.254.169.254"])) is None  # cloud metadata
    assert run(resolved({"127.0.0.1"}, "127.0.0.1", ["127.0.0.1"])) == ["127.0.0.1"]
    assert run(resolved({"localhost"}, "localhost", ["127.0.0.1"])) == ["127.0.0.1"]


# -- video: both families; frames decoded with av, only those the processor samples --

def every_frame(data: bytes):
    """All of a clip's frames and its metadata, for the processor to sample from itself."""
    import av
    import numpy as np
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        fps = float(stream.average_rate)
    return frames, VideoMetadata(total_num_frames=len(frames), fps=fps, width=frames.shape[2], height=frames.shape[1])


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_video_reaches_the_model_as_generate_reads_it(served, api):
    family, folder, app = served
    data = mp4()
    frames, metadata = every_frame(data)
    # transformers samples the frames itself here (Gemma 4: 32 of the 40; Qwen3.5: 2 a second, 8);
    # the server decodes only those it will sample: the prompts must be the same ids.
    expected, logprobs, prompt = generated_for(folder, asking("Describe.", "video", frames), video_metadata=[metadata])
    video_tokens = media_tokens(folder, prompt, "video")
    sampled = 32 if family == "gemma4" else 8
    per_frame = video_tokens // (sampled if family == "gemma4" else sampled // 2)
    assert video_tokens == per_frame * (sampled if family == "gemma4" else sampled // 2) and per_frame > 1
    reversed_frames, _ = every_frame(data)
    _, other, _ = generated_for(folder, asking("Describe.", "video", reversed_frames[::-1].copy()),
                                video_metadata=[metadata])
    assert abs(other[0] - logprobs[0]) > 1e-5  # the frames matter to the model, and their order
    if api == "chat":
        status, answer, trace = post(app, "/v1/chat/completions", chat_body(
            [{"type": "text", "text": "Describe."},
             {"type": "video_url", "video_url": {"url": data_url(data, "video/mp4")}}]))
    else:
        status, answer, trace = post(app, "/v1/responses", {
            "model": "m", "max_output_tokens": NEW_TOKENS, "temperature": 0, "reasoning": {"effort": "none"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Describe."},
                                                    {"type": "input_file", "file_data": data_url(data, "video/mp4")}]}]})
    assert status == 200, answer
    decoded_as(trace, expected, logprobs)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert (item["kind"], item["mime"], item["frames"], item["total_frames"], item["fps"], item["seconds"],
            item["width"], item["height"]) == ("video", "video/mp4", sampled, 40, 10.0, 4.0, 64, 48)
    assert item["tokens"] == video_tokens and item["span"] > video_tokens  # timestamps between the frames
    assert item["thumbnail"].startswith("data:image/jpeg;base64,")
    assert render["looptrace.prompt.media.video_tokens"] == video_tokens


def test_a_short_clip_gives_every_frame(served):
    # Gemma 4 samples 32 frames: a clip of 6 gives its 6 (transformers would refuse it); Qwen3.5
    # samples 2 a second, at least 4.
    family, _, app = served
    status, answer, trace = post(app, "/v1/chat/completions", chat_body(
        [{"type": "video_url", "video_url": {"url": data_url(mp4(frames=6, fps=3), "video/mp4")}}]))
    assert status == 200, answer
    (item,) = json.loads(next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
                         ["looptrace.prompt.media"])
    assert (item["frames"], item["total_frames"]) == ((6, 6) if family == "gemma4" else (4, 6))


def test_bad_video_is_a_400_naming_its_part(served):
    family, _, app = served
    cases = [
        (data_url(mp4()[:300], "video/mp4"), "invalid_media", "could not be decoded"),
        (data_url(wav(), "video/mp4"), "invalid_media", "no video stream"),
        (data_url(mp4(width=1100, height=1000, frames=2), "video/mp4"), "media_too_large", "--media-max-pixels"),
    ]
    if family == "qwen3_5":  # 2 frames a second of 30 s is 60, past this server's 32 (Gemma 4 takes 32 of any)
        cases.append((data_url(mp4(frames=300, fps=10), "video/mp4"), "media_too_large", "--media-max-video-frames"))
    for url, code, says in cases:
        for api in ("chat", "responses"):
            if api == "chat":
                status, error = app.call("POST", "/v1/chat/completions", chat_body(
                    [{"type": "text", "text": "hi"}, {"type": "video_url", "video_url": {"url": url}}]))
                param = "messages[0].content[1].video_url.url"
            else:
                status, error = app.call("POST", "/v1/responses", {"model": "m", "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                 {"type": "input_file", "file_data": url}]}]})
                param = "input[0].content[1].file_data"
            assert status == 400 and error["error"]["code"] == code and says in error["error"]["message"], (says, error)
            assert error["error"]["param"] == param, error
