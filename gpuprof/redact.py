"""Redact values that look like secrets from what a run folder records (command line, rank records).

A manifest is often shared (the HTML page shows the command that was run), and training commands
carry credentials: ``--hf-token X``, ``--api-key=X``, ``env WANDB_API_KEY=X python ...``, a
``postgres://user:pass@host`` URL. Two rules, both applied everywhere in the document:

- by name: the value of an option, ``NAME=value`` assignment or mapping key whose name, split
  into words at ``-``/``_``/``.``, contains ``token``, ``secret``, ``password``/``passwd``/``pwd``,
  ``credential(s)``, ``auth``, ``apikey``, ``cookie``, ``bearer`` (or ends in ``token``, ``apikey``,
  ``password``, ``secret``), or ``key`` right after ``api``,
  ``access``, ``private``, ``secret``, ``signing``, ``encryption``, ``client`` or ``account`` (so ``--max-tokens`` and
  ``--key-dim`` stay, ``AWS_ACCESS_KEY_ID`` goes);
- by shape: strings that are credentials whatever they are called (Hugging Face ``hf_…``,
  OpenAI/Anthropic ``sk-…``, AWS ``AKIA…``/``ASIA…``, GitHub ``ghp_…``/``github_pat_…``,
  GitLab ``glpat-…``, Slack ``xox?-…``, JWTs, and the password part of ``scheme://user:pass@``).

Redaction can only over-hide, never reveal: what it replaces becomes ``<redacted>``, and the
document counts how many values it hid (``redacted``) so a report can say so.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "<redacted>"

_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "pwd", "passphrase", "credential",
                           "credentials", "auth", "apikey", "cookie", "bearer"})
#: The same words glued to another (``hftoken``, ``dbpassword``, ``OPENAIAPIKEY``).
_GLUED = ("token", "apikey", "password", "passwd", "secret")
_KEY_PREFIXES = frozenset({"api", "access", "private", "secret", "signing", "encryption", "client", "account"})
#: Keys whose values are the run folder's own file names (written by gpuprof, read back to analyse).
_PATH_KEYS = frozenset({"path", "trace", "traces"})
_WORD_SPLIT = re.compile(r"[-_.\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
#: Credentials recognisable by their shape alone.
_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}"
    r"|\bsk-(?:[A-Za-z0-9_-]{20,})"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
#: ``scheme://user:password@host``: the password goes, the rest says where it pointed.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<pw>[^\s@/]+)(?=@)")
#: ``NAME=value`` and ``--name=value`` inside one argument or string.
_ASSIGN = re.compile(r"^(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.DOTALL)


def secret_name(name: str) -> bool:
    """Whether an option, variable or key called ``name`` holds a secret (see the module doc)."""
    words = [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", name.lstrip("-"))) if w]
    for i, w in enumerate(words):
        if w in _SECRET_WORDS or w.endswith(_GLUED):
            return True
        if w == "key" and i > 0 and words[i - 1] in _KEY_PREFIXES:
            return True
    return False


def _shapes(text: str) -> tuple[str, int]:
    """``text`` with credential-shaped substrings and URL passwords replaced."""
    text, n = _SHAPES.subn(MARK, text)
    text, m = _URL_CREDENTIALS.subn(lambda mt: mt.group("head") + MARK, text)
    return text, n + m


def redact_arg(arg: str) -> tuple[str, int]:
    """One argument: ``NAME=secret`` / ``--name=secret`` by name, anything by shape."""
    m = _ASSIGN.match(arg)
    if m and secret_name(m.group("name")) and m.group("value"):
        return f"{m.group('name')}={MARK}", 1
    return _shapes(arg)


def redact_argv(argv: list[Any]) -> tuple[list[Any], int]:
    """An argument vector: ``--secret-name VALUE`` hides VALUE, and each argument as :func:`redact_arg`."""
    out: list[Any] = []
    count = 0
    hide_next = False
    for a in argv:
        if not isinstance(a, str):
            out.append(redact(a)[0] if isinstance(a, (dict, list)) else a)
            hide_next = False
            continue
        if hide_next and not a.startswith("-"):
            out.append(MARK)
            count += 1
            hide_next = False
            continue
        hide_next = a.startswith("-") and "=" not in a and secret_name(a)
        r, n = redact_arg(a)
        out.append(r)
        count += n
    return out, count


def _redact_str(text: str) -> tuple[str, int]:
    """A string that may be a whole command line: its words as an argument vector."""
    if not any(c.isspace() for c in text):
        return redact_arg(text)
    pieces = re.split(r"(\s+)", text)  # keep the spacing as it was
    words, n = redact_argv(pieces[::2])
    pieces[::2] = words
    return "".join(pieces), n


def redact(doc: Any) -> tuple[Any, int]:
    """``doc`` (JSON-like data) with secret values replaced, and how many were."""
    if isinstance(doc, dict):
        out: dict[Any, Any] = {}
        count = 0
        for k, v in doc.items():
            if k in _PATH_KEYS:  # the run folder's own file names: what analysis opens
                out[k] = v
                continue
            if isinstance(k, str) and secret_name(k) and isinstance(v, (str, int, float)) and v != "" \
                    and not isinstance(v, bool):
                out[k] = MARK
                count += 1
                continue
            out[k], n = redact(v)
            count += n
        return out, count
    if isinstance(doc, list):
        if all(isinstance(x, str) for x in doc):
            return redact_argv(doc)
        items = [redact(x) for x in doc]
        return [x for x, _ in items], sum(n for _, n in items)
    if isinstance(doc, str):
        return _redact_str(doc)
    return doc, 0


def redact_manifest(doc: dict[str, Any]) -> dict[str, Any]:
    """A run manifest with secrets redacted; ``redacted`` counts the values hidden, now and by
    whoever wrote it (a manifest recorded before redaction existed is redacted when read)."""
    body = {k: v for k, v in doc.items() if k != "redacted"}
    clean, n = redact(body)
    before = doc.get("redacted")
    total = n + (before if isinstance(before, int) and not isinstance(before, bool) and before > 0 else 0)
    if total:
        clean["redacted"] = total
    out: dict[str, Any] = clean
    return out
