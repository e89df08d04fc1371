"""`--sampling-defaults`: the sampling a request gets for what it does not set itself (clients such as codex send
no temperature), over the checkpoint's generation_config; the request's own always wins. Refused at the command
line in one line when it is not what a request could ask for."""

from __future__ import annotations

import json

import pytest

from looptrace.proxy import cli
from looptrace.proxy.settings import Settings

from traced_app import App, run


def test_the_flag_is_read_into_the_settings():
    args = cli.build_parser().parse_args(["serve", "--backend", "replay", "--sampling-defaults",
                                          '{"temperature": 0, "top_p": 0.9, "top_k": 5}'])
    assert cli.settings_from(args).sampling_defaults == {"temperature": 0, "top_p": 0.9, "top_k": 5}
    assert cli.settings_from(cli.build_parser().parse_args(["serve"])).sampling_defaults is None


@pytest.mark.parametrize("given, said", [
    ('{"temperature": NaN}', "NaN is not a number"),
    ('{"temperature": 3}', "temperature must be from 0 to 2, not 3"),
    ('{"top_p": 0}', "top_p must be above 0 and at most 1"),
    ('{"top_k": 2.5}', "top_k must be a whole number"),
    ('{"top_k": true}', "top_k must be a whole number"),
    ('{"seed": 1}', "'seed' is not one of temperature, top_p, top_k"),
    ('["temperature"]', "a JSON object is wanted"),
    ("temperature=0", "not a JSON object"),
])
def test_what_a_request_could_not_ask_for_is_refused_in_one_line(given, said, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["serve", "--sampling-defaults", given])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and err.count("\n") == 1, err


def test_a_request_that_sets_none_gets_the_servers_and_its_own_wins(qwen3_5_dir, tmp_path):
    replay = tmp_path / "steps.jsonl"
    replay.write_text((json.dumps({"text": "Paris.<|im_end|>"}) + "\n") * 2)
    settings = Settings(model=str(qwen3_5_dir), served_model_name="qwen", backend="replay", replay=str(replay),
                        trace_db=str(tmp_path / "traces.sqlite3"),
                        sampling_defaults={"temperature": 0, "top_k": 5})
    ask = [{"role": "user", "content": "The capital of France?"}]

    async def session():
        async with App(settings) as app:
            assert (await app.chat(messages=ask))[0] == 200
            assert (await app.chat(messages=ask, temperature=0.7, top_k=40))[0] == 200
            assert app.telemetry.flush()
            return [dict(s.attributes) for s in app.spans.get_finished_spans() if s.name == "chat qwen"]

    plain, own = run(session())
    assert (plain["gen_ai.request.temperature"], plain["gen_ai.request.top_k"]) == (0, 5)
    assert plain["gen_ai.request.top_p"] == 0.95  # Qwen3.5's own, which the server's defaults leave as it is
    assert (own["gen_ai.request.temperature"], own["gen_ai.request.top_k"]) == (0.7, 40)
