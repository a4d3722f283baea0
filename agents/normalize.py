"""Rank-independent text: the rules that let graphs of different ranks be compared.

Ranks legitimately differ in device index, process-group names, addresses, temp paths and
their own rank number; everything else in a graph or generated code must match. The rules are
versioned (`protocol.NORM_VERSION`) because a changed rule changes every normalized hash.
"""
from __future__ import annotations

import re

from agents import protocol

NORM_VERSION = protocol.NORM_VERSION

_DEV = r"(?:cuda|xpu|hpu|npu|mtia|privateuseone)"

# (pattern, replacement), applied in order. Paths first so later rules don't see their digits.
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?:/[^\s'\"]*)?/torchinductor_[^\s'\"/]+(?:/[^\s'\"]*)?"), "<inductor_cache>"),
    (re.compile(r"(?:/[^\s'\"]*)?/triton/cache(?:/[^\s'\"]*)?"), "<triton_cache>"),
    (re.compile(r"/tmp/tmp[A-Za-z0-9_]+(?:/[^\s'\"]*)?"), "<tmp>"),
    (re.compile(r"\b0x[0-9a-fA-F]{4,}\b"), "0x?"),
    (re.compile(rf"\b({_DEV}):\d+\b"), r"\1:?"),
    (re.compile(rf"device\(type='({_DEV})', index=\d+"), r"device(type='\1', index=?"),
    (re.compile(r"\bindex=\d+(?=, multi_processor_count)"), "index=?"),
    (re.compile(r"\b(_DeviceGuard|set_device|get_raw_stream|device_guard|current_device)\(\d+\)"), r"\1(?)"),
    (re.compile(r"\bstream\d+\b"), "stream?"),
    (re.compile(r"\b(group_name|group|pg_name|tag)=(['\"])[^'\"]*\2"), r"\1=\2?\2"),
    (re.compile(r"(_c10d_functional\.[a-z_]+(?:\.default)?\((?:[^()]|\([^()]*\))*?, )'[^']*'\)"), r"\1'?')"),
    (re.compile(r"\b(rank|local_rank|RANK|LOCAL_RANK)([_ =:]+)\d+\b"), r"\1\2?"),
]


def normalize(text: str, literals: tuple[str, ...] = ()) -> str:
    """Replace rank-specific text; `literals` are extra exact strings (e.g. a cache dir) to blank."""
    for lit in literals:
        if lit:
            text = text.replace(lit, "<lit>")
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


def hash_text(text: str, literals: tuple[str, ...] = ()) -> protocol.GraphHash:
    """Raw and normalized 128-bit hashes (32 hex chars) of one artifact text."""
    return normalized(text, literals)[0]


def normalized(text: str, literals: tuple[str, ...] = ()) -> tuple[protocol.GraphHash, str]:
    """The hashes of one artifact text and its normalized text (what the server keeps for diffs,
    content-addressed by `protocol.blob_hash`, the same digest)."""
    norm = normalize(text, literals)
    return protocol.GraphHash(raw=protocol.blob_hash(text), norm=protocol.blob_hash(norm)), norm
