"""Rank-independent text: the rules that let graphs of different ranks be compared.

Ranks legitimately differ in device index, process-group names, addresses, temp paths and
their own rank number; everything else in a graph or generated code must match. The rules are
versioned (`protocol.NORM_VERSION`) because a changed rule changes every normalized hash.
"""

from __future__ import annotations

import os
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


# --- frame identity ----------------------------------------------------------------------
# A frame key is 'path:line:name'. The path must read the same on every rank, host, install and
# torch version: library files by their path inside the installation (`torch/nn/modules/linear.py`,
# `contextlib.py`), the user's files relative to the directory of the script that runs (or by
# their file name when they live elsewhere). Old keys stored with absolute paths are brought to
# this form when read (`canonical_frame`), so runs recorded before keep aligning.

_LIBRARY = re.compile(r"(?:^|[/\\])(?:site|dist)-packages[/\\](.+)$")
_STDLIB = re.compile(r"(?:^|[/\\])lib(?:64)?[/\\](?:python|pypy)\d+(?:\.\d+)*t?[/\\](.+)$")
# Code Dynamo compiles on the user's behalf: the frame is named by the user's call site instead.
WRAPPER_PREFIXES = ("torch/_dynamo/", "torch/nn/modules/module.py", "torch/_compile.py")


_AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def is_agent_file(filename: str) -> bool:
    """A file of this package: its frames are never the user's code."""
    return filename.startswith(_AGENT_DIR)


def library_path(filename: str) -> str | None:
    """The path inside the installation for a file of an installed package or of the standard
    library (site-packages, dist-packages, /usr/lib/pythonX.Y, venvs, conda), else None."""
    for pattern in (_LIBRARY, _STDLIB):
        m = pattern.search(filename)
        if m:
            return m.group(1).replace("\\", "/")
    if filename.startswith("<"):  # <frozen runpy>, <string>
        return filename
    return None


def user_path(filename: str, root: str | None) -> str:
    """A user file relative to `root` (the running script's directory) when under it, else its name."""
    path = filename.replace("\\", "/")
    if root:
        base = root.replace("\\", "/").rstrip("/") + "/"
        if path.startswith(base):
            return path[len(base) :]
    return path.rsplit("/", 1)[-1] or "?"


def frame_path(filename: str, root: str | None = None) -> str:
    return library_path(filename) or user_path(filename, root)


def is_wrapper(path: str) -> bool:
    """Dynamo's own wrapper code (what `torch.compile(module)` compiles in torch >= 2.5)."""
    return path.startswith(WRAPPER_PREFIXES)


def is_library_wrapper(path: str) -> bool:
    """Code of torch or contextlib that Dynamo compiles on the way into the user's model (DDP's
    forward, the context managers it enters): a frame named by the user's line that entered it."""
    return path.startswith("torch/") or path == "contextlib.py"


def via(path: str, name: str) -> str:
    """'contextlib.__init__' for a wrapper frame's code: what a user-named key adds to stay that code's key."""
    return (path[:-3] if path.endswith(".py") else path).replace("/", ".") + "." + name


def frame_key(filename: str, line: int | None, name: str, root: str | None = None) -> str:
    return f"{frame_path(filename or '?', root)}:{line if line is not None else 0}:{name or '?'}"


def split_frame(frame: str) -> tuple[str, int | None, str]:
    """'path:line:name' -> (path, line, name); keys without a line give None."""
    parts = frame.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    path, _, name = frame.rpartition(":")
    return (path, None, name) if path else (frame, None, "")


def canonical_frame(frame: str) -> str:
    """A stored key in today's form: absolute library paths made relative to their installation,
    other absolute paths cut to the file name (keys the agent sends now pass unchanged)."""
    path, line, name = split_frame(frame)
    lib = library_path(path)
    if lib is None and path.startswith("/"):
        lib = path.rsplit("/", 1)[-1]
    path = lib or path
    return f"{path}:{line}:{name}" if line is not None else f"{path}:{name}"


def frame_label(frame: str) -> str:
    """How pages and alerts show a frame: 'model.py:88 Block.forward'."""
    path, line, name = split_frame(canonical_frame(frame))
    return f"{path}:{line} {name}" if line is not None else f"{path} {name}"
