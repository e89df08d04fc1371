"""Credentials found in text, and the text with each replaced by a marker naming its kind and a short hash.

    [REDACTED:github_token:3f9a1c]

The hash is HMAC-SHA256 under a key that is not in the store (the server's secret, trace_store/api_keys.py),
cut to 6 hex digits: the same secret gives the same marker everywhere (two mentions still match), and a
reader of the store cannot test guesses of a short password against it, as they could a plain or salted
hash whose salt is beside it. 24 bits say nothing of a 160-bit token either way.

A table of our own rather than detect-secrets' plugins: those scan a line at a time and give the secret's
value, not where it is (a private key is found by its BEGIN line alone, its body left), and the full set
costs milliseconds per 10 KB. Here each pattern starts with a literal, all of them found in one
Aho-Corasick pass (ahocorasick-rs, as the names that say they hold a credential are), and a pattern is
tried only where its literal is: a third of the time of 24 scans by `re` (bench/redaction.py). The shapes are
those detect-secrets' and gitleaks' rules describe.

`keep_length` (prompts): the marker is padded, or shortened, to the secret's length, so every offset
the trace keeps into a prompt (its stored cut, the part new this turn) holds on the redacted text, and a
slice of the redacted text is the redacted slice: a turn's added part is redacted alone.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import string
from collections import Counter
from typing import Callable, Iterable, NamedTuple

from ahocorasick_rs import AhoCorasick

# A value in an assignment: stops at a quote, a space, an escaped newline (text inside JSON), a separator.
_VALUE = r"""[^\s"'`\\,;()\[\]{}<>]"""
# Values that are code, not a secret: a type annotation, a literal, a reference to elsewhere.
_NOT_A_VALUE = (r"""(?!(?:str|bytes|int|None|null|nil|true|false|True|False|undefined|string|Optional|required)\b)"""
                r"""(?![$%*]|\.\.\.)""")
_ASSIGN = r"""["']?\s*[=:]\s*["']?""" + _NOT_A_VALUE


class _Rule(NamedTuple):
    kind: str
    pattern: str
    group: int = 0  # the group that is the secret: 0 for the whole match
    word: bool = True  # the match starts a word (not after a letter or digit, unless the n of an escaped newline)
    lead: str | None = None  # a pattern the characters just before the match must end with: part of the secret
    starts: tuple[str, ...] = ()  # the literals every match begins with


# Each pattern starts with one of its literals (`starts`): one Aho-Corasick pass finds where any rule's
# literal is, and only there is that rule's pattern tried (24 scans of the text by `re` cost about 3
# times as much); a word's start is checked after the match. Order matters where two overlap: the first
# listed wins (sk-ant- before sk-).
_AWS = ("KIA", "SIA", "BIA", "CCA", "GPA", "IDA", "ROA", "NPA", "NVA", "IPA")
_RULES = [
    _Rule("private_key", r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----[\s\S]{0,20000}?"
                         r"-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----", word=False, starts=("-----BEGIN",)),
    # A block cut off before its END line (a truncated file, a message split): its base64 lines.
    _Rule("private_key", r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
                         r"(?:(?:\\[nr]|\s)+[A-Za-z0-9+/=:,-]{8,})*",
          word=False, starts=("-----BEGIN",)),
    _Rule("aws_access_key_id", r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|ROA|NPA|NVA|IPA)[A-Z0-9]{16}\b",
          starts=tuple("A" + p for p in _AWS)),
    _Rule("gcp_private_key_id", r"private_key_id\\?\"\s*:\s*\\?\"([0-9a-f]{40})\\?\"", 1, word=False,
          starts=("private_key_id",)),
    _Rule("azure_storage_key", r"AccountKey=([A-Za-z0-9+/]{86}==)", 1, word=False, starts=("AccountKey=",)),
    _Rule("azure_sas_signature", r"sig=([A-Za-z0-9%/+]{30,}(?:%3D|=){0,2})", 1, word=False, lead=r"[?&]",
          starts=("sig=",)),
    _Rule("azure_client_secret", r"Q~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])", lead=r"[A-Za-z0-9_~.]{3}\d",
          starts=("Q~",)),
    _Rule("anthropic_api_key", r"sk-ant-[A-Za-z0-9_-]{20,}", starts=("sk-ant-",)),
    _Rule("openai_api_key", r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}", starts=("sk-",)),
    _Rule("google_api_key", r"AIza[0-9A-Za-z_-]{35}", starts=("AIza",)),
    _Rule("huggingface_token", r"hf_[A-Za-z0-9]{30,}", starts=("hf_",)),
    _Rule("groq_api_key", r"gsk_[A-Za-z0-9]{40,}", starts=("gsk_",)),
    _Rule("stripe_key", r"_(?:live|test)_[0-9A-Za-z]{20,}", lead=r"[sr]k", starts=("_live_", "_test_")),
    _Rule("slack_token", r"xox[abposr]-[0-9A-Za-z-]{10,}", starts=tuple(f"xox{c}-" for c in "abposr")),
    _Rule("slack_webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}", word=False,
          starts=("https://hooks.slack.com/services/",)),
    _Rule("twilio_api_key", r"SK[0-9a-f]{32}\b", starts=("SK",)),
    _Rule("sendgrid_api_key", r"SG\.[A-Za-z0-9_-]{20,24}\.[A-Za-z0-9_-]{40,50}", starts=("SG.",)),
    _Rule("npm_token", r"npm_[A-Za-z0-9]{36}\b", starts=("npm_",)),
    _Rule("pypi_token", r"pypi-AgE[A-Za-z0-9_-]{50,}", starts=("pypi-AgE",)),
    _Rule("github_token", r"gh[pousr]_[A-Za-z0-9]{36,}", starts=tuple(f"gh{c}_" for c in "pousr")),
    _Rule("github_token", r"github_pat_[A-Za-z0-9_]{50,}", starts=("github_pat_",)),
    _Rule("gitlab_token", r"glpat-[A-Za-z0-9_-]{20,}", starts=("glpat-",)),
    _Rule("jwt", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", starts=("eyJ",)),
    # user:password@ in a URL: the password alone.
    _Rule("url_password", r"://[^\s:/@\"'\\]{1,100}:([^\s/@\"'\\]{1,200})@", 1, word=False, starts=("://",)),
]


class _Assignment(NamedTuple):
    """`NAME=value`, `NAME: value`, `"name": "value"`: a name that says it holds a credential."""

    kind: str
    holds: Callable[[str], bool]  # of the name, lower case
    value: re.Pattern  # what follows the name: the value is its group 1
    entropy: bool = False  # the value must look random


def _tail(value: str) -> re.Pattern:
    return re.compile(r"""["']?[ \t]*[=:][ \t]*["']?""" + _NOT_A_VALUE + "(" + value + r")(?![(\[])")


# Tried at each name holding one of their words (any case), found with str.find: a case-insensitive
# pattern tried at every position costs a millisecond per 10 KB.
_ASSIGNMENTS = [
    _Assignment("aws_secret_access_key", lambda name: "aws" in name and ("secret" in name or "private" in name),
                _tail(r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])")),
    _Assignment("password", lambda name: any(w in name for w in ("password", "passwd", "passphrase", "_pass", "pwd"))
                or name.startswith("pass"), _tail(_VALUE + "{3,}+")),
    _Assignment("secret_assignment",
                lambda name: any(w in name for w in ("key", "secret", "token", "credential", "auth")),
                _tail(r"[A-Za-z0-9+/=_.~-]{16,}+"), entropy=True),
]
_NAME_WORDS = ("aws", "pass", "pwd", "key", "secret", "token", "credential", "auth")
MIN_ENTROPY = 3.0  # bits a character: random base64 or hex has 4 to 6; `created_at_timestamp` 3.5, and no digit

_COMPILED = [(rule, re.compile(rule.pattern, re.MULTILINE), re.compile("(?:" + rule.lead + ")$") if rule.lead else None)
             for rule in _RULES]
_STARTS = [(index, literal) for index, rule in enumerate(_RULES) for literal in rule.starts]
_STARTS_FOUND = AhoCorasick([literal for _, literal in _STARTS])
_NAME_WORDS_FOUND = AhoCorasick(list(_NAME_WORDS))
_WORD = frozenset(string.ascii_letters + string.digits + "_")
PREFIX = "[REDACTED:"


class Found(NamedTuple):
    start: int
    end: int
    kind: str


_ESCAPES = frozenset(("\\n", "\\r", "\\t"))  # an escaped newline in JSON text: the next word starts after it


_NAME = frozenset(string.ascii_letters + string.digits + "_.-")
_BEFORE_NAME = frozenset(" \t\r\n{,;")  # what an env file's, a JSON or YAML key's, name follows (`export NAME`)


def _names(text: str, lower: str) -> list[tuple[int, int]]:
    """The (start, end) of each name holding one of _NAME_WORDS (any case) where a name may be assigned
    to: starting a line (or an escaped one: text inside JSON), after a brace, a comma or a space (`export
    NAME`), or a quote that does."""
    names = set()
    size = len(text)
    after = [0] * len(_NAME_WORDS)  # where each word's next name may start: past the last one's end
    for word, at, end in sorted(_NAME_WORDS_FOUND.find_matches_as_indexes(lower, overlapping=True), key=_by_start):
        if at < after[word]:
            continue
        start, bound = at, max(0, at - 40)
        while start > bound and text[start - 1] in _NAME and text[start - 2:start] not in _ESCAPES:
            start -= 1
        while end < size and end - at < 40 and text[end] in _NAME:
            end += 1
        first = start - 1 if start and text[start - 1] in "\"'" else start
        if not first or text[first - 1] in _BEFORE_NAME or text[first - 2:first] in _ESCAPES:
            names.add((start, end))
        after[word] = end
    return sorted(names)


def _by_start(hit: tuple[int, int, int]) -> int:
    return hit[1]


def _rule_starts(text: str) -> list[list[int]]:
    """For each rule, in order, where one of its literals starts in `text`, ascending."""
    starts: list[list[int]] = [[] for _ in _RULES]
    for literal, at, _ in _STARTS_FOUND.find_matches_as_indexes(text, overlapping=True):
        starts[_STARTS[literal][0]].append(at)
    for positions in starts:
        if len(positions) > 1:
            positions.sort()
    return starts


def _entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _random_looking(value: str) -> bool:
    """A value in a KEY= line that is a credential rather than a setting: letters and digits, spread."""
    return (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
            and _entropy(value) >= MIN_ENTROPY)


class Redactor:
    def __init__(self, key: bytes) -> None:
        self._key = key
        self._markers: dict[str, str] = {}  # secret → its hash: a secret mentioned every turn is hashed once

    def find(self, text: str) -> list[Found]:
        """Each credential in `text`, in order, none overlapping (where two patterns overlap, the first
        listed wins)."""
        if not text:
            return []
        found: list[Found] = []
        for (rule, pattern, lead), starts in zip(_COMPILED, _rule_starts(text)):
            after = 0  # as finditer: the next match starts past the last one
            for at in starts:
                if at < after or (match := pattern.match(text, at)) is None:
                    continue
                after = match.end()
                start, end = match.span(rule.group)
                if lead is not None:
                    before = lead.search(text, max(0, match.start() - 8), match.start())
                    if before is None:
                        continue
                    if rule.group == 0:
                        start = before.start()
                if rule.word and start and text[start - 1] in _WORD and text[start - 2:start] not in _ESCAPES:
                    continue
                if text.startswith(PREFIX, start) or any(f.start < end and start < f.end for f in found):
                    continue  # already a marker, or inside one found first
                found.append(Found(start, end, rule.kind))
        self._assignments(text, text.lower(), found)
        found.sort()
        return found

    @staticmethod
    def _assignments(text: str, lower: str, found: list[Found]) -> None:
        for start, end in _names(text, lower):
            name = lower[start:end]
            for rule in _ASSIGNMENTS:
                if not rule.holds(name):
                    continue
                match = rule.value.match(text, end)
                if match is None:
                    continue
                start, end = match.span(1)
                if text.startswith(PREFIX, start) or any(f.start < end and start < f.end for f in found):
                    break  # already a marker, or a rule's find (a KEY=ghp_… line): no entropy to count
                if rule.entropy and not _random_looking(match.group(1)):
                    continue
                found.append(Found(start, end, rule.kind))
                break

    def marker(self, secret: str, kind: str, length: int | None = None) -> str:
        """`[REDACTED:kind:hash]`; with `length`, padded with `*` (or shortened, dropping the kind, then the
        brackets) to exactly that many characters."""
        digest = self._markers.get(secret)
        if digest is None:
            digest = hmac.new(self._key, secret.encode(), hashlib.sha256).hexdigest()[:6]
            if len(self._markers) > 4096:
                self._markers.clear()
            self._markers[secret] = digest
        full = f"{PREFIX}{kind}:{digest}]"
        if length is None or length == len(full):
            return full
        if length > len(full):
            return full[:-1] + "*" * (length - len(full)) + "]"
        for short in (f"[REDACTED:{digest}]", f"[{kind}:{digest}]", f"[R:{digest}]", f"[{digest}]"):
            if len(short) <= length:
                return short[:-1] + "*" * (length - len(short)) + "]"
        return "*" * length

    def redact(self, text: str, keep_length: bool = False) -> tuple[str, list[Found]]:
        """`text` with each credential replaced by its marker, and what was found (empty: `text` itself)."""
        found = self.find(text)
        if not found:
            return text, found
        return self.replace(text, found, keep_length), found

    def replace(self, text: str, found: Iterable[Found], keep_length: bool = False) -> str:
        parts, at = [], 0
        for f in found:
            secret = text[f.start:f.end]
            parts += [text[at:f.start], self.marker(secret, f.kind, len(secret) if keep_length else None)]
            at = f.end
        parts.append(text[at:])
        return "".join(parts)

    def text(self, text: str | None) -> str | None:
        """`text` redacted (None stays None; `text` itself where nothing was found)."""
        return text if not text else self.redact(text)[0]


class _RedactingFilter(logging.Filter):
    """A log record's message (and its traceback's text) with credentials replaced, before any handler
    sees it: an error can quote what a client sent."""

    redactor: Redactor | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = self.redactor
        if redactor is None:
            return True
        message = record.getMessage()
        redacted = redactor.text(message)
        if redacted is not message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redactor.text(record.exc_text)
        return True


_FILTER = _RedactingFilter()
# Logger names (spelled so the attribute catalog's check does not read one as an attribute's name).
LOGGERS = ("looptrace", "looptrace" + ".trace", "aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.websocket")


def redacting_logs(redactor: Redactor | None) -> None:
    """Every record of looptrace's and aiohttp's loggers redacted by `redactor` from now on (None: none).
    One filter per logger, whatever the number of servers a process starts (tests start many)."""
    _FILTER.redactor = redactor
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
