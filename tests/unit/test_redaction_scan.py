"""The detector's one-pass search for where each rule may match (common/redaction.py: an Aho-Corasick
pass over every rule's literals, then the rule's pattern tried there) finds exactly what trying every
pattern over the whole text finds, as the detector did before: the corpus of every kind, the near
misses, and texts dense with literals that overlap, repeat and nest."""

from __future__ import annotations

import random
import string

import pytest

from looptrace.common import redaction
from looptrace.common.redaction import Found, Redactor

from .test_redaction import NEAR_MISSES, corpus


def reference_find(text: str) -> list[Found]:
    """The detector as it was: each rule's pattern over the whole text, names found with str.find."""
    found: list[Found] = []
    for rule, pattern, lead in redaction._COMPILED:
        for match in pattern.finditer(text):
            start, end = match.span(rule.group)
            if lead is not None:
                before = lead.search(text, max(0, match.start() - 8), match.start())
                if before is None:
                    continue
                if rule.group == 0:
                    start = before.start()
            if rule.word and start and text[start - 1] in redaction._WORD and \
                    text[start - 2:start] not in redaction._ESCAPES:
                continue
            if text.startswith(redaction.PREFIX, start) or any(f.start < end and start < f.end for f in found):
                continue
            found.append(Found(start, end, rule.kind))
    lower = text.lower()
    for start, end in reference_names(text, lower):
        name = lower[start:end]
        for rule in redaction._ASSIGNMENTS:
            if not rule.holds(name):
                continue
            match = rule.value.match(text, end)
            if match is None:
                continue
            start, end = match.span(1)
            if rule.entropy and not redaction._random_looking(match.group(1)):
                continue
            if not text.startswith(redaction.PREFIX, start) and not any(f.start < end and start < f.end for f in found):
                found.append(Found(start, end, rule.kind))
            break
    return sorted(found)


def reference_names(text: str, lower: str) -> list[tuple[int, int]]:
    names = set()
    size = len(text)
    for word in redaction._NAME_WORDS:
        at = lower.find(word)
        while at >= 0:
            start, end, bound = at, at + len(word), max(0, at - 40)
            while start > bound and text[start - 1] in redaction._NAME and text[start - 2:start] not in redaction._ESCAPES:
                start -= 1
            while end < size and end - at < 40 and text[end] in redaction._NAME:
                end += 1
            first = start - 1 if start and text[start - 1] in "\"'" else start
            if not first or text[first - 1] in redaction._BEFORE_NAME or text[first - 2:first] in redaction._ESCAPES:
                names.add((start, end))
            at = lower.find(word, end)
    return sorted(names)


# Every way a rule's pattern can begin, read off the patterns by hand (not from the rules' own
# `starts`: a literal left out there must show here as a credential missed).
PREFIXES = ("-----BEGIN", "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA",
            "private_key_id", 'private_key_id\\"', "AccountKey=", "sig=", "Q~", "sk-ant-", "sk-", "sk-proj-",
            "AIza", "hf_", "gsk_", "_live_", "_test_", "sk_live_", "rk_test_", "xoxa-", "xoxb-", "xoxp-", "xoxo-",
            "xoxs-", "xoxr-", "https://hooks.slack.com/services/", "SK", "SG.", "npm_", "pypi-AgE", "ghp_",
            "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "eyJ", ".eyJ", "://", "https://user:")
HEX_BODIES = ("0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef01234567")


def dense_texts(seed: int, count: int) -> list[str]:
    """Texts made of every rule's literals, secret-shaped bodies and the characters that end them."""
    rnd = random.Random(seed)
    literals = list(PREFIXES) + ["password=", "API_KEY: ", '"token": "', "aws_secret_access_key=", "\\n", "\n", " ", "&", "?",
                 "@", ":", "sk", "-----END RSA PRIVATE KEY-----", " PRIVATE KEY-----", "RSA", "==", "."]
    alphabet = string.ascii_letters + string.digits + "_-+/"
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rnd.randint(5, 60)):
            if rnd.random() < 0.5:
                parts.append(rnd.choice(literals))
            elif rnd.random() < 0.1:
                parts.append(rnd.choice(HEX_BODIES))
            else:
                parts.append("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 60))))
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(b"k" * 32)


@pytest.mark.parametrize("seed", range(4))
def test_the_one_pass_search_finds_what_every_pattern_over_the_text_finds(redactor, seed):
    texts = [text for text, _ in corpus(seed).values()] + list(NEAR_MISSES) + dense_texts(seed, 400)
    texts.append("\n".join(texts[:40]))  # all of it in one text: matches beside matches
    for text in texts:
        assert redactor.find(text) == reference_find(text), text[:200]


def test_each_match_starts_at_a_literal_of_its_rule(redactor):
    for text in dense_texts(99, 300) + [text for text, _ in corpus(99).values()]:
        for rule, pattern, _ in redaction._COMPILED:
            for match in pattern.finditer(text):
                assert text.startswith(rule.starts, match.start()), (rule.kind, text[match.start():match.end()])
