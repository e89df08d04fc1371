"""A replay's report for CI: JSON (every figure) and JUnit XML (a test case per step, failed where the
target diverged), which CI systems show without a plugin.

JUnit is written with the standard library's ElementTree, which escapes markup in every text and
attribute: a recorded token or a tool call's arguments are whatever a model wrote. What XML cannot
hold at all (control characters, lone surrogates) is shown as its code point, as the viewer shows
hidden characters.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

# Characters XML 1.0 has no place for, escaped or not.
NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    return NOT_XML.sub(lambda m: f"\u27e8U+{ord(m.group()):04X}\u27e9", text)


def write_json(report: dict, path: str) -> None:
    Path(path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def _failure(mode: str, step: dict) -> str | None:
    """Why a step failed, or None when it agreed."""
    if mode == "forced":
        if step["first_divergence"] is None:
            return None
        d = step["divergence"]
        return (f"token {step['first_divergence']}: the recording chose {d['recording_greedy_id']} "
                f"({d.get('recorded_piece')!r} was recorded), the target {d['target_greedy_id']} "
                f"({d.get('target_greedy_piece')!r}); {step['agreeing']} of {step['tokens']} tokens agree")
    if step["acted_alike"]:
        return None
    return (f"tool calls {'equal' if step['tool_calls_equal'] else 'differ'}: recorded "
            f"{json.dumps(step['tool_calls_recorded'], ensure_ascii=False)}, target "
            f"{json.dumps(step['tool_calls_target'], ensure_ascii=False)}; finish {step['finish_reason_recorded']} "
            f"against {step['finish_reason_target']}")


def write_junit(report: dict, path: str) -> None:
    steps, mode = report["steps"], report["mode"]
    suite = ET.Element("testsuite", name=xml_text(f"looptrace replay {report['session']}"), tests=str(len(steps)),
                       timestamp=report["started"], time=f"{report['seconds']:.3f}")
    failures = skipped = 0
    properties = ET.SubElement(suite, "properties")
    for name in ("mode", "target", "model", "agreement", "replay_session"):
        ET.SubElement(properties, "property", name=name, value=xml_text(str(report.get(name))))
    for step in steps:
        case = ET.SubElement(suite, "testcase", classname=f"replay.{mode}", name=f"step {step['step']} {step['trace_id']}",
                             time=f"{step.get('seconds', 0):.3f}")
        if step.get("skipped"):
            ET.SubElement(case, "skipped", message=xml_text(step["skipped"]))
            skipped += 1
            continue
        why = _failure(mode, step)
        if why is not None:
            failure = ET.SubElement(case, "failure", message=xml_text(why.split(";")[0]), type="divergence")
            failure.text = xml_text(why)
            failures += 1
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    root = ET.Element("testsuites", name="looptrace replay", tests=str(len(steps)), failures=str(failures))
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
